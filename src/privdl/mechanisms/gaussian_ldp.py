"""Agent-level Gaussian LDP (SPEC §2–3, the "LDP" design of seeds 000/001): clip each agent's mini-batch gradient to
C and add independent N(0, σ²I) noise with σ² = 1/b, b the per-agent precision bound of the chosen accountant."""

from __future__ import annotations

import math

import torch

from privdl.errors import ValidationError
from privdl.mechanisms.base import MECHANISMS, Mechanism, clip_rows
from privdl.privacy.agent_accountant import check_budget, get_accountant
from privdl.privacy.ledger import LedgerEntry


@MECHANISMS.register("gaussian_ldp")
class GaussianLDP(Mechanism):
    """Clip to C, add N(0, σ²) per coordinate. Give either (epsilon, delta) — σ is calibrated with ``accountant``
    over ``steps`` steps — or ``sigma`` directly (the ledger then reports the ε it achieves at ``delta``)."""

    name = "gaussian_ldp"

    def __init__(self, *, steps: int, clip: float = 1.0, epsilon: float | None = None, delta: float = 1e-5,
                 accountant: str = "tight", sigma: float | None = None) -> None:
        check_budget(clip=clip, steps=steps, delta=delta)
        self.accountant = get_accountant(accountant)
        self.clip, self.delta, self.steps = float(clip), float(delta), int(steps)
        if (epsilon is None) == (sigma is None):
            raise ValidationError("gaussian_ldp needs exactly one of epsilon (calibrate the noise) or sigma")
        if epsilon is not None:
            check_budget(epsilon=epsilon)
            self.bound = self.accountant.bound(epsilon, delta, clip, steps)
        else:
            if not (sigma > 0 and math.isfinite(sigma)):
                raise ValidationError(f"sigma must be > 0, got {sigma}")
            self.bound = 1.0 / sigma**2
        self.target_epsilon = epsilon
        self.sigma = 1.0 / math.sqrt(self.bound)
        self.achieved_epsilon = self.accountant.epsilon(self.bound, delta, clip, steps)

    def privatize(self, g: torch.Tensor, t: int, generator: torch.Generator) -> torch.Tensor:
        noise = torch.randn(g.shape, generator=generator, dtype=g.dtype).to(g.device)
        return clip_rows(g, self.clip) + self.sigma * noise

    def ledger(self) -> list[LedgerEntry]:
        return [LedgerEntry(
            unit="agent", mechanism=self.name, accountant=self.accountant.name, epsilon=self.achieved_epsilon,
            delta=self.delta, steps=self.steps,
            noise={"clip": self.clip, "sigma": self.sigma, "variance": self.sigma**2, "precision_bound": self.bound,
                   "sensitivity": 2 * self.clip, "target_epsilon": self.target_epsilon},
            note=f"independent Gaussian noise; {self.accountant.reference}",
        )]

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "clip": self.clip, "sigma": self.sigma, "precision_bound": self.bound,
                "accountant": self.accountant.name}
