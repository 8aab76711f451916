"""What the dual solver of problem (P) returns: the design R at b = 1 with its certificate (primal, dual, gap) and,
for a singular W, the tie-break's facts (ρ, stationarity, its own gap, the condition number that bounds how far R may
move).

Separate from the solver (:mod:`privdl.covariance.dual`) because both solution paths build it — the eigh-based
iterations there and the singular-W tie-break (:mod:`privdl.covariance.dual_tiebreak`) — and the designs read it
without needing either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

@dataclass(frozen=True)
class DualSolution:
    """The solution of (P) at b = 1 (divide ``R`` by b for any other bound)."""

    R: np.ndarray
    lam: np.ndarray
    primal: float  # Tr(W R Wᵀ) at b = 1
    dual: float  # a lower bound on the optimum of (P) at b = 1
    iterations: int  # eigendecompositions of B (the first, at λ = 1, included)
    seconds: float
    singular: bool
    ridge: float  # τ of the singular-W tie-break (0 when W is nonsingular)
    method: str = "fixed_point"
    trace_weight: float = 0.0  # ρ = (τ/n)²·λ_max(WᵀW): the tie-break's weight on Tr(R) (0 when W is nonsingular)
    stationarity: float = 0.0  # spread δ of log p where the accurate Newton solved it (singular or ill-conditioned W;
    # R_ρ is then exact for bounds in [b·e^{−δ}, b]); 0 for the eigh-based paths
    tie_gap: float = 0.0  # the accurate Newton's certified gap G of (P_ρ) at b = 1 (its primal minus its dual)

    @property
    def gap(self) -> float:
        return max(0.0, self.primal - self.dual)

    @property
    def tie_condition(self) -> float:
        """Singular W: κ = √(1 + λ_max(M)/ρ) = √(1 + (n/τ)²), the condition number of the stacked [W; √ρ·I] whose
        column-scaled SVDs define R_ρ. To first order a relative change ε of W, or a backward error δ, moves R_ρ by at
        most about κ·ε (κ·δ) relative: two solves (any start, any BLAS) agree to ‖ΔR‖_F ≤ κ·(δ₁ + δ₂)·‖R‖_F, and
        W + ΔW gives one within κ·(δ₁ + δ₂ + 2‖ΔW‖/‖W‖)·‖R‖_F. 1 for a non-singular W (not used there; an
        ill-conditioned one re-solved with ρ = 0 has κ = cond(W) instead)."""
        if not self.singular:
            return 1.0
        return float(np.sqrt(1.0 + (self.R.shape[0] / self.ridge) ** 2))
