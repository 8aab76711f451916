"""Example-level DP-SGD on the agent axis (SPEC §2 and §4; seed 004's sampled Gaussian mechanism).

At every noisy access agent i draws a Poisson lot (each of its m_i examples joins with probability q_i = L/m_i),
clips every per-example gradient to C, sums them, adds N(0, σ_i²C²I) and divides by the expected lot size L:

    G̃_i = (Σ_{b ∈ lot_i} clip_C(∇l(θ_i; b)) + σ_i C ξ_i) / L.

σ_i is calibrated per agent to the target (ε, δ) from its own q_i and its true number of noisy accesses (every call,
inner iterations included), with the RDP accountant of :mod:`privdl.privacy.example_accountant`; the ledger
re-accounts the σ_i actually used. All agents' lots are drawn at once (padded, masked): no loop over agents.
Clipped sums come from ghost clipping where the model allows it (:mod:`privdl.simulator.ghost`), else from
per-example gradients through torch.func (:func:`privdl.simulator.gradients.clipped_example_sum`).
"""

from __future__ import annotations

import math

import torch

from privdl.errors import ValidationError
from privdl.mechanisms.base import MECHANISMS, Mechanism
from privdl.privacy.example_accountant import calibrate_noise_multiplier, check_example_params, rdp_epsilon
from privdl.privacy.ledger import LedgerEntry
from privdl.simulator.ghost import ghost_clipped_sum, supports_ghost
from privdl.simulator.gradients import clipped_example_sum
from privdl.tasks.base import Task

ACCOUNTANT = "rdp (dp_accounting, Poisson-subsampled Gaussian)"
#: numbers per parameter block processed at once by default (n · chunk · d ≤ this)
CHUNK_BUDGET = 2**22


@MECHANISMS.register("dp_sgd")
class DPSGD(Mechanism):
    """Example-level DP-SGD: Poisson lots of expected size ``lot_size`` (q_i = L/m_i, or ``sample_rate`` for all
    agents), per-example clipping to ``clip``, noise calibrated to (``epsilon``, ``delta``) per agent — or a fixed
    ``noise_multiplier``.

    ``unsafe_noise_scale`` (< 1) and ``unsafe_no_clip`` deliberately break the mechanism (for audits): the ledger then
    still states the claimed ε but marks the guarantee void."""

    name = "dp_sgd"

    def __init__(self, *, steps: int, task: Task, clip: float = 1.0, lot_size: int = 256,
                 epsilon: float | None = None, delta: float = 1e-5, noise_multiplier: float | None = None,
                 sample_rate: float | None = None, per_example: str = "auto", chunk: int | None = None,
                 unsafe_noise_scale: float = 1.0, unsafe_no_clip: bool = False) -> None:
        if not (clip > 0 and math.isfinite(clip)):
            raise ValidationError(f"clip must be > 0, got {clip}")
        if not (isinstance(lot_size, int) and lot_size >= 1):
            raise ValidationError(f"lot_size must be an integer >= 1, got {lot_size!r}")
        if (epsilon is None) == (noise_multiplier is None):
            raise ValidationError("dp_sgd needs exactly one of epsilon (calibrate the noise) or noise_multiplier")
        if not hasattr(task, "sample_lot"):
            raise ValidationError(f"task {task.name!r} cannot draw Poisson lots (example-level DP needs a dataset)")
        if not unsafe_noise_scale >= 0:
            raise ValidationError(f"unsafe_noise_scale must be >= 0, got {unsafe_noise_scale}")
        counts = task.counts.to(torch.float64)
        small = [i for i, m in enumerate(counts.tolist()) if m < lot_size]
        if sample_rate is not None:
            if not 0 < sample_rate <= 1:
                raise ValidationError(f"sample_rate must be in (0, 1], got {sample_rate}")
        elif small:
            raise ValidationError(
                f"lot_size {lot_size} is larger than the data of agent(s) {small} "
                f"({int(counts[small[0]])} examples at agent {small[0]}); lower lot_size")
        self.task, self.steps, self.clip, self.lot_size = task, int(steps), float(clip), int(lot_size)
        self.delta, self.target_epsilon, self.chunk = float(delta), epsilon, chunk
        # q_i = L/m_i, or one public rate for every agent (then L only normalises: audits keep q fixed whether or
        # not the canary is in the data, as the add/remove neighbouring relation requires)
        self.rates = lot_size / counts if sample_rate is None else torch.full_like(counts, float(sample_rate))
        sigmas: dict[float, float] = {}
        for q in self.rates.tolist():
            if q not in sigmas:
                check_example_params(sample_rate=q, steps=self.steps, delta=delta, epsilon=epsilon,
                                     noise_multiplier=noise_multiplier)
                sigmas[q] = (noise_multiplier if noise_multiplier is not None
                             else calibrate_noise_multiplier(epsilon, q, self.steps, delta))
        self.sigmas = torch.tensor([sigmas[q] for q in self.rates.tolist()], dtype=torch.float64)
        self._epsilons = {q: rdp_epsilon(s, q, self.steps, delta) for q, s in sigmas.items()}
        self.noise_scale, self.no_clip = float(unsafe_noise_scale), bool(unsafe_no_clip)
        if per_example not in ("auto", "ghost", "vmap"):
            raise ValidationError(f"per_example must be auto, ghost or vmap, got {per_example!r}")
        if per_example == "ghost" and not supports_ghost(task):
            raise ValidationError(f"ghost clipping does not support task {task.name!r} (model or L2 term); use vmap")
        if per_example == "auto":
            per_example = "ghost" if supports_ghost(task) else "vmap"
        self.per_example = per_example
        self._scales: dict[tuple, torch.Tensor] = {}  # σ_i·C per (dtype, device), built once

    @property
    def broken(self) -> bool:
        return self.noise_scale != 1.0 or self.no_clip

    def privatize(self, g: torch.Tensor, t: int, generator: torch.Generator) -> torch.Tensor:
        raise ValidationError("dp_sgd privatises per-example gradients; it is driven through noisy_gradient()")

    def noisy_gradient(self, task: Task, x: torch.Tensor, t: int, batch_gen: torch.Generator,
                       noise_gen: torch.Generator, oracle: object = None) -> torch.Tensor:
        self.next_access()
        batch, mask = task.sample_lot(batch_gen, self.rates)
        n, d = x.shape
        clip, mask = None if self.no_clip else self.clip, mask.to(x.dtype)
        if self.per_example == "ghost":
            total = ghost_clipped_sum(task, x, batch, mask, clip)
        else:
            chunk = self.chunk or max(1, CHUNK_BUDGET // (n * d))
            total = clipped_example_sum(task, x, batch, mask, clip, chunk)
        key = (x.dtype, x.device)
        if key not in self._scales:
            self._scales[key] = (self.sigmas * self.clip * self.noise_scale).to(dtype=x.dtype, device=x.device)[:, None]
        noise = torch.randn(x.shape, generator=noise_gen, dtype=x.dtype).to(x.device)  # drawn on the CPU stream
        return (total + self._scales[key] * noise) / self.lot_size

    def ledger(self) -> list[LedgerEntry]:
        entries = []
        groups: dict[float, list[int]] = {}
        for i, q in enumerate(self.rates.tolist()):
            groups.setdefault(q, []).append(i)
        for q, agents in groups.items():
            eps, order = self._epsilons[q]
            note = ("BROKEN ON PURPOSE (audit): "
                    + ("noise scaled by %g " % self.noise_scale if self.noise_scale != 1 else "")
                    + ("clipping disabled " if self.no_clip else "") + "— the stated ε does NOT hold"
                    ) if self.broken else "per-example clipping, Poisson lots, Gaussian noise on the lot sum"
            entries.append(LedgerEntry(
                unit="example", mechanism=self.name, accountant=ACCOUNTANT, epsilon=eps, delta=self.delta,
                steps=self.steps,
                noise={"clip": self.clip, "noise_multiplier": float(self.sigmas[agents[0]]), "sample_rate": q,
                       "lot_size": self.lot_size, "rdp_order": order, "agents": agents,
                       "target_epsilon": self.target_epsilon},
                note=note))
        return entries

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "clip": self.clip, "lot_size": self.lot_size,
                "noise_multiplier": [float(s) for s in self.sigmas], "sample_rate": [float(q) for q in self.rates],
                "broken": self.broken}
