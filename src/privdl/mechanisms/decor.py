"""DECOR (seed 000): R = σ_pair² I + σ_cor² L, one canceling term per edge drawn by both of its endpoints, on one W
or on each round's W(t) of a time-varying graph."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from privdl.comm.base import LINEAR_MIXING
from privdl.errors import ValidationError
from privdl.mechanisms.base import MECHANISMS, Access, GradientMechanism, MechanismEnv
from privdl.mechanisms.correlated import W_MIXING_REASON, CorrelatedGaussian
from privdl.mechanisms.correlated_noise import CorrelatedNoise
from privdl.network.network import Network

if TYPE_CHECKING:
    from privdl.covariance.problem import CovarianceDesign


@MECHANISMS.register("decor")
class DecorNoise(CorrelatedGaussian):
    """DECOR: σ_pair² I + σ_cor² L, one canceling term per edge drawn by both endpoints (seed 000)."""

    name = design_name = "decor"
    needs_combination = LINEAR_MIXING
    combination_reason = W_MIXING_REASON
    directed_ok = False
    directed_reason = ("its canceling terms are drawn by both endpoints of every undirected edge (σ_cor² L, the "
                       "Laplacian of a symmetric graph), and a directed graph's edges have no reverse")

    def __init__(self, *, steps: int | torch.Tensor, network: Network, **kwargs: object) -> None:
        #: the law of W(t) whose rounds' edges carry the canceling terms (None: one W)
        self.dynamics_ = getattr(network, "dynamics", None)
        self._rounds: dict[str, CorrelatedNoise] = {}
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    # ---- a time-varying graph: the canceling terms of round t live on W(t)'s edges -------------------------------
    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        from privdl.covariance.designs import design_covariance

        if self.dynamics_ is None:
            return design_covariance("decor", w, bound=b)
        from privdl.covariance.designs import decor_common_ratio

        # one ratio c = σ_cor²/σ_pair² for every round: the best for the mean trace over one period (a random law:
        # its first 8 rounds, a sample of the law); the design recorded is W(0)'s at its own best ratio
        dyn = self.dynamics_
        self.ratio = decor_common_ratio([dyn.matrix(t) for t in range(dyn.period or 8)])
        return design_covariance("decor", dyn.matrix(0).toarray(), bound=b)

    def round_noise(self, t: int) -> CorrelatedNoise:
        """Round t's noise: R(t) = σ_pair²(t)(I + c·L(t)), L(t) the unweighted Laplacian of W(t)'s edges, one
        canceling term ±σ_cor(t) per edge of the round drawn by its two ends from their shared key (folded with the
        access: a fresh draw every round), σ_pair²(t) = h_t(c)/b with h_t(c) = max_i [(I + c·L(t))⁻¹]_ii, so that
        max_i [R(t)⁻¹]_ii = b in every round. Cached by W(t)'s fingerprint (a periodic law's period)."""
        from privdl.covariance.designs import decor_h
        from privdl.covariance.seeds import SeedComponent

        dyn = self.dynamics_
        fp = dyn.fingerprint(t)
        noise = self._rounds.get(fp)
        if noise is not None:
            return noise
        e = dyn.edges(t)
        src, dst = e.src.long().numpy(), e.dst.long().numpy()
        keep = src < dst
        pairs = list(zip(src[keep].tolist(), dst[keep].tolist()))
        h = decor_h(dyn.matrix(t), self.ratio)
        pair2 = h / self.bound
        cor2 = self.ratio * pair2
        cov = cor2 * np.array([[1.0, -1.0], [-1.0, 1.0]])
        comps = [SeedComponent((i, j), cov, f"edge:{i}-{j}") for i, j in pairs] if cor2 > 0 else []
        noise = CorrelatedNoise(pair2, comps, self.network_.n, self.generation)
        noise.bind(self.env.keys, self.env.scope)
        if len(self._rounds) >= 64:  # a random law: the last rounds' (slices may be a round apart)
            self._rounds.clear()
        self._rounds[fp] = noise
        return noise

    def _precisions(self) -> np.ndarray:
        if self.dynamics_ is None:
            return super()._precisions()
        # every round's R(t) is scaled so that its worst agent's precision is b: each agent is accounted at b
        return np.full(self.network_.n, self.bound)

    def bind(self, env: MechanismEnv) -> None:
        if self.dynamics_ is None:
            return super().bind(env)
        GradientMechanism.bind(self, env)
        if env.rows != self.network_.n:
            raise ValidationError(f"{self.name} was built for {self.network_.n} agents, the run has {env.rows} rows")
        self._rounds = {}
        if self.dynamics_.period is not None:  # a periodic law: every round's shared keys asked now (agreement)
            for k in range(self.dynamics_.period):
                self.round_noise(k)

    def noise_at(self, access: Access) -> CorrelatedNoise:
        return super().noise_at(access) if self.dynamics_ is None else self.round_noise(access.t)

    def noise_facts(self) -> dict:
        out = super().noise_facts()
        if self.dynamics_ is not None:
            out["round_terms"] = {"ratio": self.ratio, "accounting": "σ_pair²(t) = h_t(c)/b per round: "
                                  "max_i [R(t)⁻¹]_ii = b every round; each agent accounted at b"}
        return out

    def note(self) -> str:
        text = super().note()
        if self.dynamics_ is None:
            return text
        return (f"{text}; canceling terms drawn on each round's edges of dynamics {self.dynamics_.name!r} "
                f"(σ_cor²/σ_pair² = {self.ratio:.4g}), σ_pair²(t) set from round t's graph so that "
                "max_i [R(t)⁻¹]_ii = b every round; each agent accounted at b")
