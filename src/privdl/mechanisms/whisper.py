"""Whisper D-SGD / CorN-DSGD (seed 001): R solves problem (P) for W (or problem (10) for seed groups and coalitions);
one design per distinct W(t) of a periodic time-varying graph; optionally W designed together with R."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import numpy as np
import torch

from privdl.comm.base import LINEAR_MIXING
from privdl.errors import ValidationError
from privdl.mechanisms.base import MECHANISMS, Access, GradientMechanism, MechanismEnv
from privdl.mechanisms.correlated import W_MIXING_REASON, CorrelatedGaussian
from privdl.network.network import Network
from privdl.registry import OneOf

if TYPE_CHECKING:
    from privdl.covariance.problem import CovarianceDesign

Seeds_ = Annotated[str, OneOf(("global", "edges", "neighbourhoods", "neighborhoods"),
                              lambda v: v.startswith("groups:") and v[7:].isdigit(), "groups:M")]


class RoundW:
    """One round's W(t) of a time-varying graph, as a design reads a network (its n and dense W): unlike
    :class:`Network`, it may be disconnected (a matching), as a single W(t) of a law may."""

    directed = False
    dynamics = None

    def __init__(self, w: np.ndarray, description: str) -> None:
        self.W, self.description = np.asarray(w, dtype=np.float64), description

    @property
    def n(self) -> int:
        return self.W.shape[0]

    def dense(self, what: str = "", *, copies: int = 1) -> np.ndarray:
        return self.W



@MECHANISMS.register("whisper")
class WhisperNoise(CorrelatedGaussian):
    """Whisper D-SGD / CorN-DSGD: R solves problem (P) (seed 001). With ``seeds`` other than ``global`` or
    ``coalition_size`` > 0 it solves problem (10) for those seed groups instead (needs ``privdl[reference]``)."""

    name = design_name = "whisper"
    needs_combination = LINEAR_MIXING
    combination_reason = W_MIXING_REASON
    #: problem (P) is defined for any W and its dual solver reads W only through WᵀW (privdl.covariance.dual): on a
    #: directed network R minimises Tr(A R Aᵀ) for the push-sum A, what one SGP step adds (tests/test_directed.py
    #: checks it against cvxpy); the seed-group and coalition constructions (problem (10)) are undirected only
    directed_ok = True

    def __init__(self, *, steps: int | torch.Tensor, network: Network, seeds: Seeds_ = "global",
                 optimize_mixing: bool = False, min_spectral_gap: float | None = None,
                 **kwargs: object) -> None:
        if getattr(network, "directed", False) and (seeds != "global" or kwargs.get("coalition_size", 0)):
            raise ValidationError(f"whisper on a directed network solves problem (P) with one global seed only: "
                                  f"seeds = {seeds!r}, coalition_size = {kwargs.get('coalition_size', 0)!r} build "
                                  "seed groups on undirected edges and neighbourhoods (use seeds = \"global\", "
                                  "coalition_size = 0)")
        self.seeds = seeds
        #: the law of W(t) this mechanism designs for (None: one W); a periodic law gets one design per distinct W(t)
        self.dynamics_ = getattr(network, "dynamics", None)
        if self.dynamics_ is not None:
            from privdl.network.dynamics import whisper_refusal

            why = whisper_refusal(self.dynamics_)
            if why is not None:
                raise ValidationError(f"mechanism 'whisper' cannot run on a time-varying graph ([network] dynamics = "
                                      f"{self.dynamics_.name!r}): {why}")
            self._round_kwargs = {k: v for k, v in kwargs.items() if k not in ("epsilon", "precision_bound")}
        if optimize_mixing and getattr(network, "directed", False):
            raise ValidationError("whisper: optimize_mixing designs symmetric doubly stochastic weights; a directed "
                                  "network mixes with its push-sum A (use optimize_mixing = false)")
        if optimize_mixing and self.dynamics_ is not None:
            raise ValidationError("whisper: optimize_mixing designs one W together with R; a time-varying graph "
                                  f"([network] dynamics = {self.dynamics_.name!r}) mixes with its own W(t)")
        self.optimize_mixing = bool(optimize_mixing)
        #: with ``optimize_mixing``: the network whose W was designed together with R (the run mixes with it)
        self.mixing_network: Network | None = None
        if not optimize_mixing and min_spectral_gap is not None:
            raise ValidationError("whisper: min_spectral_gap applies with optimize_mixing = true only")
        if optimize_mixing:
            if seeds != "global" or kwargs.get("coalition_size", 0):
                raise ValidationError("whisper: optimize_mixing designs problem (P) with one global seed; it does "
                                      f"not combine with seeds = {seeds!r} or coalition_size > 0")
            from privdl.covariance.joint import design_joint

            # (the optimal W does not depend on b: problem (P) is homogeneous in it)
            joint = design_joint(network.dense("the joint mixing and covariance design", copies=8), 1.0,
                                 min_spectral_gap=min_spectral_gap)
            network = Network.from_matrix(joint.W, description=f"{network.description}, weights optimized with "
                                                               f"R (whisper optimize_mixing; spectral gap "
                                                               f"{joint.spectral_gap:.6g} ≥ {joint.min_spectral_gap:.6g})")
            self.mixing_network = network
            self.joint_facts = {k: v for k, v in joint.summary().items() if k in (
                "objective", "objective_fixed_mixing", "spectral_gap", "spectral_gap_fixed_mixing",
                "min_spectral_gap")}
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    # ---- a periodic time-varying graph: one design per distinct W(t) --------------------------------------------
    def round_mechanism(self, t: int) -> "WhisperNoise":
        """The design (a whisper mechanism for that one W) whose noise round t adds: R designed for W(t)."""
        return self.round_designs[self.round_fingerprints[int(t) % len(self.round_fingerprints)]]

    def _design_rounds(self, b: float) -> CovarianceDesign:
        """Solve problem (P) once per distinct W(t) of one period (cached by the matrix's fingerprint), every design
        calibrated to the same per-round bound b: each round's release then satisfies [R(t)⁻¹]_ii ≤ b, as one W's
        does, so the composition over the run — and the ε it is calibrated to — is unchanged."""
        dyn = self.dynamics_
        self.round_designs: dict[str, WhisperNoise] = {}
        self.round_fingerprints: list[str] = []
        for k in range(dyn.period):
            fp = dyn.fingerprint(k)
            if fp not in self.round_designs:
                w = RoundW(dyn.matrix(k).toarray(), f"W({k}) of dynamics {dyn.name!r}")
                self.round_designs[fp] = WhisperNoise(steps=self.steps, network=w, seeds=self.seeds,  # type: ignore
                                                      precision_bound=b, **self._round_kwargs)
            self.round_fingerprints.append(fp)
        return self.round_mechanism(0).design

    def _precisions(self) -> np.ndarray:
        if self.dynamics_ is None:
            return super()._precisions()
        # each agent's worst precision over the designs: every round's release is dominated by a Gaussian release
        # of that precision (post-processing), so accounting every access at it bounds the run's ε
        return np.max([m.precisions for m in self.round_designs.values()], axis=0)

    def bind(self, env: MechanismEnv) -> None:
        if self.dynamics_ is None:
            return super().bind(env)
        GradientMechanism.bind(self, env)
        if env.rows != self.network_.n:
            raise ValidationError(f"{self.name} was built for {self.network_.n} agents, the run has {env.rows} rows")
        for m in self.round_designs.values():  # same keys and scope: the draws of access c are keyed by c
            m.bind(env)

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        if self.dynamics_ is None:
            return super().privatize(value, access)
        return self.round_mechanism(access.t).privatize(value, access)

    def noise_facts(self) -> dict:
        out = super().noise_facts()
        if self.dynamics_ is not None:
            out["round_designs"] = self.round_facts()
        if self.optimize_mixing:  # (objective: Tr(W R Wᵀ) at b = 1, the joint design's and MH + optimal R's)
            out.update({"optimize_mixing": True, **{f"joint_{k}": v for k, v in self.joint_facts.items()}})
        return out

    def round_facts(self) -> dict:
        """What each distinct W(t)'s design is (a periodic time-varying graph)."""
        return {"period": len(self.round_fingerprints), "distinct": len(self.round_designs),
                "fingerprints": self.round_fingerprints,
                "trace": {fp: m.design.trace for fp, m in self.round_designs.items()},
                "accounting": "every design meets the same per-round bound b; each agent's ε composes its largest "
                              "[R(t)⁻¹]_ii over the designs"}

    def note(self) -> str:
        text = super().note()
        if self.dynamics_ is None:
            return text
        return (f"{text}; R designed for each of the {len(self.round_designs)} distinct W(t) of dynamics "
                f"{self.dynamics_.name!r}, all to the same bound b, each agent accounted at its largest "
                "[R(t)⁻¹]_ii over them")

    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        from privdl.covariance.designs import design_covariance
        from privdl.covariance.hbc import solve_hbc
        from privdl.covariance.seeds import seed_groups

        if self.dynamics_ is not None:
            return self._design_rounds(b)
        if self.seeds == "global" and self.coalition_size == 0:
            return design_covariance("whisper", w, bound=b)
        return solve_hbc(w, bound=b, groups=seed_groups(self.seeds, w), coalition_size=self.coalition_size,
                         label=self.seeds)


MECHANISMS.add("corn", WhisperNoise)
