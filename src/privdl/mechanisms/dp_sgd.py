"""Example-level DP-SGD on the agent axis (SPEC §2 and §4; seed 004's sampled Gaussian mechanism).

At every noisy access the owner j of the data draws a Poisson lot (each of its m_j examples joins with probability
q_j = L/m_j), clips every per-example gradient to C, sums them, adds N(0, σ_j²C²I) and divides by the expected lot
size L:

    G̃ = (Σ_{b ∈ lot_j} clip_C(∇l(θ; b)) + σ_j C ξ) / L.

This mechanism declares that need (:class:`ClippedSum`); the engine draws the lot from the owner's keys and computes
the clipped sum (ghost clipping per layer, or torch.func per-example gradients), at any model — agent j's data at
agent i's model is a cross-gradient. σ_j is calibrated per owner to the target (ε, δ) from its own q_j and its
number of noisy accesses (every call, inner iterations and cross-gradients included), with the ``accountant``
named (``"pld"``, privacy loss distributions, the default of new configs; ``"rdp"``, Rényi DP, which every
reproduction names: :mod:`privdl.privacy.example_accountant`); the ledger names that accountant and re-accounts the
σ_j actually used with it. The noise ξ is keyed by (access, owner, requester).
"""

from __future__ import annotations

import math
from typing import Annotated, Sequence

import torch

from privdl.errors import ValidationError
from privdl.mechanisms.base import MECHANISMS, Access, ClippedSum, GradientMechanism, Sensitivity, obfuscation
from privdl.privacy.events import PrivacyEvent, SubsampledGaussianEvent
from privdl.privacy.example_accountant import (
    DEFAULT_EXAMPLE_ACCOUNTANT, EXAMPLE_ACCOUNTANTS, calibrate_noise_multiplier, check_example_accountant,
    check_example_params,
)
from privdl.registry import Recorded, one_of

PER_EXAMPLE = ("auto", "closed_form", "ghost", "vmap")
#: ``accountant``: one of the example-level accountants; written into every run's config (runs made before the key
#: existed used "rdp", which run ids leave out: :class:`privdl.registry.Recorded`)
ExampleAccountant = Annotated[str, one_of(*EXAMPLE_ACCOUNTANTS), Recorded(legacy="rdp")]


@MECHANISMS.register("dp_sgd")
class DPSGD(GradientMechanism):
    """Example-level DP-SGD: Poisson lots of expected size ``lot_size`` (q_j = L/m_j, or ``sample_rate`` for all
    agents), per-example clipping to ``clip``, noise calibrated to (``epsilon``, ``delta``) per owner with
    ``accountant`` (``"pld"`` by default, or ``"rdp"``) — or a fixed ``noise_multiplier`` (then ``accountant`` only
    accounts it).

    ``unsafe_noise_scale`` (< 1) and ``unsafe_no_clip`` deliberately break the mechanism (for audits): the ledger
    then accounts the noise actually added (or states no guarantee without clipping) and says it is broken."""

    name = "dp_sgd"
    accountant_name = DEFAULT_EXAMPLE_ACCOUNTANT

    def __init__(self, *, steps: int | Sequence[int] | torch.Tensor, task: object, clip: float = 1.0,
                 lot_size: int = 256, epsilon: float | None = None, delta: float = 1e-5,
                 noise_multiplier: float | None = None, sample_rate: float | None = None,
                 per_example: Annotated[str, one_of(*PER_EXAMPLE)] = "auto", chunk: int | None = None, unsafe_noise_scale: float = 1.0,
                 unsafe_no_clip: bool = False, accountant: ExampleAccountant = DEFAULT_EXAMPLE_ACCOUNTANT) -> None:
        counts = getattr(task, "counts", None)
        if counts is None or not getattr(task, "examples", True):
            raise ValidationError(f"task {getattr(task, 'name', task)!r} cannot draw Poisson lots (example-level DP "
                                  "needs a dataset)")
        super().__init__(steps=steps, n=int(counts.numel()))
        if not (clip > 0 and math.isfinite(clip)):
            raise ValidationError(f"clip must be > 0, got {clip}")
        if not (isinstance(lot_size, int) and lot_size >= 1):
            raise ValidationError(f"lot_size must be an integer >= 1, got {lot_size!r}")
        if (epsilon is None) == (noise_multiplier is None):
            raise ValidationError("dp_sgd needs exactly one of epsilon (calibrate the noise) or noise_multiplier")
        if not unsafe_noise_scale >= 0:
            raise ValidationError(f"unsafe_noise_scale must be >= 0, got {unsafe_noise_scale}")
        if per_example not in PER_EXAMPLE:
            raise ValidationError(f"per_example must be one of {PER_EXAMPLE}, got {per_example!r}")
        self.accountant_name = check_example_accountant(accountant, key="accountant", owner="dp_sgd")
        m = counts.to(torch.float64)
        small = [i for i, c in enumerate(m.tolist()) if c < lot_size]
        if sample_rate is not None:
            if not 0 < sample_rate <= 1:
                raise ValidationError(f"sample_rate must be in (0, 1], got {sample_rate}")
        elif small:
            raise ValidationError(
                f"lot_size {lot_size} is larger than the data of agent(s) {small} "
                f"({int(m[small[0]])} examples at agent {small[0]}); lower lot_size")
        self.task, self.clip, self.lot_size = task, float(clip), int(lot_size)
        self.delta, self.target_epsilon, self.chunk = float(delta), epsilon, chunk
        # q_j = L/m_j, or one public rate for every agent (then L only normalises: audits keep q fixed whether or
        # not the canary is in the data, as the add/remove neighbouring relation requires)
        self.rates = lot_size / m if sample_rate is None else torch.full_like(m, float(sample_rate))
        sigmas: dict[tuple[float, int], float] = {}
        for q, t in zip(self.rates.tolist(), self.steps.tolist()):
            if (q, t) not in sigmas and t > 0:
                check_example_params(sample_rate=q, steps=t, delta=delta, epsilon=epsilon,
                                     noise_multiplier=noise_multiplier)
                sigmas[(q, t)] = (noise_multiplier if noise_multiplier is not None
                                  else calibrate_noise_multiplier(epsilon=epsilon, sample_rate=q, steps=t,
                                                                  delta=delta, accountant=accountant))
        self.sigmas = torch.tensor([sigmas.get((q, t), math.inf) for q, t in
                                    zip(self.rates.tolist(), self.steps.tolist())], dtype=torch.float64)
        self.noise_scale, self.no_clip = float(unsafe_noise_scale), bool(unsafe_no_clip)
        self.need = ClippedSum(None if self.no_clip else self.clip, self.rates, per_example, chunk)
        self._scales: dict[tuple, torch.Tensor] = {}  # σ_j·C per (dtype, device), built once

    @property
    def broken(self) -> bool:
        return self.noise_scale != 1.0 or self.no_clip

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        key = (value.dtype, value.device)
        if key not in self._scales:
            self._scales[key] = (self.sigmas * self.clip * self.noise_scale).to(dtype=value.dtype,
                                                                                device=value.device)
        flat = value.reshape(value.shape[0], -1)
        owners = access.owners.cpu()
        everyone = owners.numel() == self.env.rows and access.all_rows
        noise = (self.env.keys.normal(self.env.scope, access.call, flat.shape[1], dtype=flat.dtype) if everyone else
                 self.env.keys.normal(self.env.scope, access.call, flat.shape[1], rows=owners,
                                      requesters=access.requesters.cpu(), dtype=flat.dtype)).to(flat.device)
        scale = self._scales[key].index_select(0, (owners % self.sigmas.numel()).to(flat.device))[:, None]
        return ((flat + scale * noise) / self.lot_size).reshape(value.shape)

    def unprotected(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        """The clipped lot sum divided by the expected lot size, without noise."""
        return value / self.lot_size

    def step_events(self, before: Sensitivity | None) -> tuple[list[PrivacyEvent], Sensitivity | None]:
        if before is None:
            return obfuscation(self.name, "per-example clipping disabled (unsafe_no_clip): no sensitivity bound")
        if self.noise_scale == 0:
            return obfuscation(self.name, "noise disabled (unsafe_noise_scale = 0)")
        return [SubsampledGaussianEvent(noise_multiplier=float(s) * self.noise_scale, sample_rate=float(q))
                for s, q in zip(self.sigmas.tolist(), self.rates.tolist())], before

    def noise_facts(self) -> dict:
        sig = sorted(set(self.sigmas.tolist()))
        return {"clip": self.clip, "lot_size": self.lot_size, "noise_multiplier": sig[0] if len(sig) == 1 else sig,
                "per_example": self.need.method, "target_epsilon": self.target_epsilon,
                **({"unsafe_noise_scale": self.noise_scale} if self.noise_scale != 1 else {}),
                **({"unsafe_no_clip": True} if self.no_clip else {})}

    def note(self) -> str:
        if not self.broken:
            return "per-example clipping, Poisson lots, Gaussian noise on the lot sum"
        what = ("noise scaled by %g " % self.noise_scale if self.noise_scale != 1 else "") + \
               ("clipping disabled " if self.no_clip else "")
        return (f"BROKEN ON PURPOSE (audit): {what}— the target ε = {self.target_epsilon} does NOT hold; the events "
                "state the noise actually added")

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "clip": self.clip, "lot_size": self.lot_size,
                "noise_multiplier": [float(s) for s in self.sigmas], "sample_rate": [float(q) for q in self.rates],
                "broken": self.broken}
