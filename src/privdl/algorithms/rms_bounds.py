"""Admissible step sizes γ and protection parameters τ of seed 002's Theorems 1 and 2 (DSG-RMS, EDSG-RMS).

From the combination matrix A (symmetric, doubly stochastic) with eigenvalues 1 = λ₁ > λ₂ ≥ … ≥ λ_K:
‖D‖ = max_{ℓ≥2} |λ_ℓ| (the largest non-unit eigenvalue modulus), ‖D − I‖ = max_{ℓ≥2} |λ_ℓ − 1| and
σ_b = min_{ℓ≥2} λ_ℓ (EDSG-RMS needs 0 < λ_ℓ < 1: a positive-definite A). From the random matrix (Assumption 3):
σ_μ² = σ_{μ,k}² + (L − 1)σ_z² and θ_μ² = μ² + σ_μ². δ is the smoothness of every J_k (Assumption 4) and ν its
strong convexity (Assumption 5; ν = 0 for the convex case). The bounds, as printed in the seed:

* (12) DSG-RMS, convex:            γ ≤ μ(1 − ‖D‖) / (14 δ θ_μ²)
* (13) DSG-RMS:                    |τ| < (1 − ‖D‖) / (√8 ‖D − I‖)
* (15) DSG-RMS, strongly convex:   γ ≤ μν(1 − ‖D‖) / (64 θ_μ² δ²) · √(ν/δ)
* (17) EDSG-RMS, convex:           γ ≤ min{(1 − ‖D‖)σ_b^½ / (28 δ (σ_μ + μ)), μ / (2δ(2μ² + σ_μ²))}
* (18) EDSG-RMS:                   |τ| ≤ (1 − ‖D‖)σ_b^½ / √(32(1 − σ_b))
* (20) EDSG-RMS, strongly convex:  γ ≤ min{(1 − ‖D‖)σ_b^½ / (40(σ_μ + μ)δ) · √(ν/δ), μν(1 − ‖D‖) / (64(σ_μ² + μ²)δ²)}

They are sufficient conditions (the seed's proofs are omitted), usually far below the step sizes its experiments use;
a run outside them gets a warning naming the bound, never an error.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from privdl.errors import ValidationError
from privdl.mechanisms.rms import RandomMatrixStepSize


def spectrum_facts(W: np.ndarray) -> dict[str, float]:
    """‖D‖, ‖D − I‖ and σ_b of a symmetric combination matrix."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 2:
        raise ValidationError("the combination matrix must be square with at least 2 agents")
    if not np.allclose(W, W.T, atol=1e-12):
        raise ValidationError("seed 002's bounds need a symmetric combination matrix")
    ev = np.sort(np.linalg.eigvalsh(W))[::-1]
    rest = ev[1:]
    return {"norm_D": float(np.abs(rest).max()), "norm_D_minus_I": float(np.abs(rest - 1).max()),
            "sigma_b": float(rest.min())}


def rms_bounds(W: np.ndarray, *, dim: int, mu: float = 1.0, sigma_mu: float | None = None, sigma_z: float = 0.01,
               smoothness: float, strong_convexity: float = 0.0) -> dict[str, float | None]:
    """Theorems 1–2's admissible γ and τ (None where a bound does not apply, e.g. EDSG-RMS with an A that is not
    positive definite, or the strongly convex bounds at ν = 0)."""
    if not (0 < smoothness < math.inf and 0 <= strong_convexity <= smoothness and dim >= 1):
        raise ValidationError(f"rms bounds need a finite smoothness δ > 0, a strong convexity 0 <= ν <= δ (a "
                              f"function cannot curve more than it is smooth) and L >= 1; got δ = {smoothness}, "
                              f"ν = {strong_convexity}, L = {dim}")
    matrix = RandomMatrixStepSize(mu=mu, sigma_mu=sigma_z if sigma_mu is None else sigma_mu, sigma_z=sigma_z)
    f = spectrum_facts(W)
    gap = 1.0 - f["norm_D"]
    s2, th2 = matrix.sigma_mu_sq_total(dim), matrix.theta_mu_sq(dim)
    d, nu, sb = smoothness, strong_convexity, f["sigma_b"]
    out: dict[str, float | None] = {**f, "sigma_mu_sq": s2, "theta_mu_sq": th2}
    out["dsg_rms_gamma_convex_eq12"] = mu * gap / (14 * d * th2)
    out["dsg_rms_tau_eq13"] = gap / (math.sqrt(8) * f["norm_D_minus_I"])
    out["dsg_rms_gamma_strongly_convex_eq15"] = (mu * nu * gap / (64 * th2 * d * d) * math.sqrt(nu / d)
                                                 if nu > 0 else None)
    pd = 0 < sb < 1
    s = math.sqrt(s2)
    out["edsg_rms_gamma_convex_eq17"] = (min(gap * math.sqrt(sb) / (28 * d * (s + mu)), mu / (2 * d * (2 * mu**2 + s2)))
                                         if pd else None)
    out["edsg_rms_tau_eq18"] = gap * math.sqrt(sb) / math.sqrt(32 * (1 - sb)) if pd else None
    out["edsg_rms_gamma_strongly_convex_eq20"] = (
        min(gap * math.sqrt(sb) / (40 * (s + mu) * d) * math.sqrt(nu / d), mu * nu * gap / (64 * (s2 + mu**2) * d * d))
        if pd and nu > 0 else None)
    return out


def warn_outside(name: str, bounds: dict[str, float | None], *, gamma: float, tau: float) -> list[str]:
    """Warnings (also issued with :func:`warnings.warn`) for a run of ``name`` whose γ or τ lies outside the seed's
    sufficient conditions."""
    prefix = "dsg_rms" if name in ("dsg_rms", "dsgt_rms") else "edsg_rms" if name == "edsg_rms" else None
    if prefix is None:
        return []
    tau_key = f"{prefix}_tau_eq13" if prefix == "dsg_rms" else f"{prefix}_tau_eq18"
    gamma_keys = [k for k in bounds if k.startswith(f"{prefix}_gamma")]
    msgs = []
    for key in gamma_keys:
        bound = bounds[key]
        if bound is not None and gamma > bound:
            msgs.append(f"γ = {gamma:g} > {key.rsplit('_', 1)[-1]}'s {bound:.3g}")
    bound = bounds.get(tau_key)
    if bound is not None and abs(tau) > bound:
        msgs.append(f"|τ| = {abs(tau):g} > {tau_key.rsplit('_', 1)[-1]}'s {bound:.3g}")
    if msgs:
        warnings.warn(f"{name} runs outside seed 002's sufficient conditions ({'; '.join(msgs)}): convergence is "
                      "not guaranteed by Theorems 1–2 (privdl rms-bounds)", stacklevel=3)
    return msgs


__all__ = ["rms_bounds", "spectrum_facts", "warn_outside"]
