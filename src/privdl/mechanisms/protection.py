"""Protection vectors (seed 002 eq. (5b), (6c), Remark 1): the message side of DSG-RMS / EDSG-RMS.

Agent k adds a non-zero vector p_k to what it transmits and removes its own after combining:

    sent = ψ_k + p_k,      w_k = Σ_ℓ a_ℓk sent_ℓ − sent_k + ψ_k       (eq. (5c); with SPEC's fix of (6d))

so Σ_k w_k = Σ_k ψ_k for a doubly stochastic A: the network average is unchanged. Laws of p_k, from a reference
vector r_k (the agent's model w_k(n−1) for DSG-RMS, w'_k(n−2) for EDSG-RMS):

* ``norm``  (τ/√L)·‖r_k‖·1_L                      (eq. (5b): c_k(n−1) = ‖w_k(n−1)‖·1_L)
* ``erf``   τ·erf(0.1·r_k)                        (Remark 1)
* ``tanh``  τ·tanh(r_k)                           (Remark 1)
* ``none``  no protection (τ must then be 0).

Protection is an obfuscation with no DP guarantee. The law and τ are public (Kerckhoffs): :meth:`Protection.recover`
is what an adaptive eavesdropper computes — the value v with v + p(v) = sent, i.e. the transmitted vector with its
protection undone under the assumption that the reference equals the transmitted value (ψ ≈ w near consensus).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from privdl.comm.base import Comm
from privdl.errors import ValidationError
from privdl.mechanisms.message import Obfuscating, ProtectedComm

LAWS = ("norm", "erf", "tanh", "none")
PROTECTION_REASON = "protection vector added to transmitted values (seed 002): obfuscation, no DP guarantee"


@dataclass(frozen=True)
class Protection:
    """A protection law with parameter τ (``tau``)."""

    law: str = "norm"
    tau: float = 1.0

    def __post_init__(self) -> None:
        if self.law not in LAWS:
            raise ValidationError(f"protection must be one of {LAWS}, got {self.law!r}")
        if not math.isfinite(self.tau):
            raise ValidationError(f"tau must be finite, got {self.tau}")
        if self.law == "none" and self.tau != 0:
            raise ValidationError(f"protection 'none' takes no tau (got tau = {self.tau}); set tau = 0 or choose a "
                                  f"law among {LAWS[:-1]}")

    @property
    def active(self) -> bool:
        """Whether anything is added (a law other than ``none`` and τ ≠ 0)."""
        return self.law != "none" and self.tau != 0

    def vector(self, reference: torch.Tensor) -> torch.Tensor:
        """p_k for every row k of ``reference`` (rows, L)."""
        if self.law == "norm":
            dim = reference.shape[1]
            norm = torch.linalg.vector_norm(reference, dim=1, keepdim=True)
            return (self.tau / math.sqrt(dim)) * norm.expand_as(reference)
        if self.law == "erf":
            return self.tau * torch.erf(0.1 * reference)
        if self.law == "tanh":
            return self.tau * torch.tanh(reference)
        return torch.zeros_like(reference)

    def protect(self, comm: Comm, vector: torch.Tensor) -> Comm:
        """``comm`` with ``vector`` added to every row's transmissions and removed from its own combination."""
        return ProtectedComm(comm, _Added(self.law, vector))

    def recover(self, sent: torch.Tensor) -> torch.Tensor:
        """The adaptive eavesdropper's inversion: v with v + p(v) = sent, row by row (rows, L)."""
        if not self.active:
            return sent.clone()
        if self.law == "norm":
            return _recover_norm(sent, self.tau)
        return _recover_monotone(sent, self.vector, abs(self.tau))

    def describe(self) -> dict[str, object]:
        return {"protection": self.law, "tau": self.tau}


class _Added(Obfuscating):
    """Adds a fixed vector per row to what is sent; the sender's correction removes it again."""

    reason = PROTECTION_REASON
    translation = True  # (x + v, −v): the authors' in-place gossip may carry it (ProtectedComm.average_in_place)

    def __init__(self, law: str, vector: torch.Tensor) -> None:
        self.name = f"protection({law})"
        self.vector = vector

    def encode(self, x: torch.Tensor, *, tag: str, t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x + self.vector, -self.vector


def _recover_norm(sent: torch.Tensor, tau: float) -> torch.Tensor:
    """Solve v + (τ/√L)‖v‖·1 = y for v: with a = τ/√L, s = ‖v‖, S = 1ᵀy, P = ‖y‖²,
    (1 − τ²) s² + 2aS s − P = 0; the smallest non-negative root (the linear case at |τ| = 1)."""
    dim = sent.shape[1]
    a = tau / math.sqrt(dim)
    S = sent.sum(dim=1)
    P = (sent * sent).sum(dim=1)
    c2 = 1.0 - tau * tau
    if abs(c2) < 1e-12:
        s = P / (2 * a * S).where(S != 0, torch.full_like(S, math.inf))
    else:
        disc = ((a * S) ** 2 + c2 * P).clamp(min=0).sqrt()
        roots = torch.stack([(-a * S + disc) / c2, (-a * S - disc) / c2], dim=1)
        roots = roots.where(roots >= 0, torch.full_like(roots, math.inf))
        s = roots.min(dim=1).values
    s = torch.nan_to_num(s, posinf=0.0).clamp(min=0)
    return sent - a * s[:, None]


def _recover_monotone(sent: torch.Tensor, law, bound: float, iterations: int = 60) -> torch.Tensor:
    """Bisection for v + p(v) = y elementwise, with |p| ≤ ``bound`` (erf and tanh laws)."""
    lo, hi = sent - bound, sent + bound
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        above = mid + law(mid) > sent
        hi = torch.where(above, mid, hi)
        lo = torch.where(above, lo, mid)
    return 0.5 * (lo + hi)


__all__ = ["LAWS", "PROTECTION_REASON", "Protection"]
