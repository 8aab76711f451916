"""Noise covariance design across agents (seeds 000/001, SPEC §3): problem (P), its fast dual solver, the LDP /
DECOR / Whisper designs, the honest-but-curious problem (10) and a cvxpy reference for cross-checks."""

from privdl.covariance.designs import DESIGNS, decor_design, design_covariance, ldp_design, whisper_design
from privdl.covariance.dual import solve_dual, solve_dual_cached
from privdl.covariance.dual_solution import DualSolution
from privdl.covariance.problem import CovarianceDesign, noise_trace, precision_diagonal, verify_covariance

__all__ = [
    "DESIGNS", "CovarianceDesign", "DualSolution", "decor_design", "design_covariance", "ldp_design",
    "noise_trace", "precision_diagonal", "solve_dual", "solve_dual_cached", "verify_covariance", "whisper_design",
]
