"""Problem (P) of seed 001 and the facts every covariance design reports (SPEC §3).

    minimise Tr(W R Wᵀ)  subject to  R ≻ 0,  [R⁻¹]_ii ≤ b  for every agent i.        (P)

Tr(W R Wᵀ) is the privacy-noise variance one D-SGD step adds (seed 001, Theorem 1); [R⁻¹]_ii ≤ b is agent i's
privacy constraint (SPEC §2, b from an accountant). Every design returns a :class:`CovarianceDesign` that has been
*verified* after construction: R is positive definite and max_i [R⁻¹]_ii ≤ b·(1 + 1e-9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
from scipy.linalg.lapack import dtrtri

from privdl.errors import ValidationError

#: Relative slack allowed on the privacy constraint after verification (floating-point rounding only).
CONSTRAINT_TOLERANCE = 1e-9


def check_bound(b: float) -> float:
    if not (isinstance(b, (int, float)) and math.isfinite(b) and b > 0):
        raise ValidationError(f"the precision bound b must be a finite number > 0, got {b!r}")
    return float(b)


def check_square(w: np.ndarray, what: str = "W") -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValidationError(f"{what} must be a square matrix, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValidationError(f"{what} has non-finite entries")
    return w


def require_symmetric(w: np.ndarray, method: str, what: str = "W") -> None:
    """Raise if ``w`` is not symmetric: ``method`` is named in the message (it is the part that needs symmetry)."""
    asym = float(np.max(np.abs(w - w.T))) if w.size else 0.0
    if asym > 1e-10 * max(1.0, float(np.max(np.abs(w)))):
        raise ValidationError(f"{method} needs a symmetric {what}; max |{what} - {what}ᵀ| = {asym:.3g}")


def noise_trace(w: np.ndarray, r: np.ndarray) -> float:
    """Tr(W R Wᵀ): the variance the noise adds to one mixing step (per coordinate)."""
    return float(np.sum((w @ r) * w))


def precision_diagonal(r: np.ndarray) -> np.ndarray:
    """diag(R⁻¹) via a Cholesky factor; raises ValidationError if R is not positive definite."""
    r = np.asarray(r, dtype=np.float64)
    try:
        chol = np.linalg.cholesky(0.5 * (r + r.T))
    except np.linalg.LinAlgError:
        lo = float(np.linalg.eigvalsh(0.5 * (r + r.T))[0])
        raise ValidationError(f"the covariance is not positive definite (smallest eigenvalue {lo:.3g})") from None
    inv_chol, info = dtrtri(chol, lower=1)  # R⁻¹ = L⁻ᵀ L⁻¹, so [R⁻¹]_ii = Σ_k (L⁻¹)_ki²
    if info != 0:
        raise ValidationError("the covariance is numerically singular")
    return np.einsum("ki,ki->i", inv_chol, inv_chol)


def verify_covariance(r: np.ndarray, *, bound: float, what: str = "covariance") -> float:
    """Check R ≻ 0 and max_i [R⁻¹]_ii ≤ b·(1 + tol); return the worst ratio max_i [R⁻¹]_ii / b.

    The error names the worst agent and its ratio, so a bad covariance file can be fixed.
    """
    return _verified(r, check_bound(bound), what)[0]


def _verified(r: np.ndarray, b: float, what: str) -> tuple[float, np.ndarray]:
    diag = precision_diagonal(check_square(r, what))
    worst = int(np.argmax(diag))
    ratio = float(diag[worst] / b)
    if ratio > 1 + CONSTRAINT_TOLERANCE:
        raise ValidationError(
            f"{what} violates the privacy constraint: agent {worst} has [R⁻¹]_ii / b = {ratio:.6g} > 1 "
            f"(it needs {ratio:.6g}× more noise)")
    return ratio, diag


@dataclass(frozen=True)
class SeedComponent:
    """Correlated noise driven by one shared seed: ``cov`` (|H|×|H|, PSD) over the agents ``members`` = H (the
    shared-seed parts of a design; what coalitions know of them is in :mod:`privdl.covariance.seeds`, which
    re-exports this class)."""

    members: tuple[int, ...]
    cov: np.ndarray
    label: str

    def embedded(self, n: int) -> np.ndarray:
        full = np.zeros((n, n))
        idx = np.asarray(self.members)
        full[np.ix_(idx, idx)] = self.cov
        return full


@dataclass
class CovarianceDesign:
    """A noise covariance R for n agents, with the facts SPEC §3 asks every design to report.

    ``trace`` = Tr(W R Wᵀ); ``trace_ldp`` = Tr(W Wᵀ)/b (independent noise at the same b); ``cdp_lower_bound`` =
    1/(n b) (what a trusted curator would add). ``sigma_mix2`` is the variance of the independent component each
    agent draws from its own private seed; the rest (R − σ_mix² I) is correlated and drawn from shared seeds.
    """

    design: str
    R: np.ndarray
    bound: float
    trace: float
    trace_ldp: float
    cdp_lower_bound: float
    max_precision_ratio: float
    sigma_mix2: float
    duality_gap: float = 0.0
    iterations: int = 0
    seconds: float = 0.0
    singular: bool = False
    ridge: float = 0.0
    extra: dict = field(default_factory=dict)
    #: The shared-seed parts of R − σ_mix² I (a list of :class:`SeedComponent`); None
    #: means one global seed drives all of it.
    components: list | None = None
    #: diag(R⁻¹) as verified (kept for large designs, so accounting need not factor R again)
    precisions: np.ndarray | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return int(self.R.shape[0])

    def summary(self) -> dict[str, object]:
        """JSON-ready facts (without R itself)."""
        out: dict[str, object] = {
            "design": self.design, "n": self.n, "trace": self.trace, "trace_ldp": self.trace_ldp,
            "ratio_to_ldp": self.trace / self.trace_ldp, "cdp_lower_bound": self.cdp_lower_bound,
            "bound": self.bound, "max_precision_ratio": self.max_precision_ratio, "sigma_mix2": self.sigma_mix2,
            "duality_gap": self.duality_gap, "iterations": self.iterations, "seconds": self.seconds,
            "singular_W": self.singular, "ridge": self.ridge,
        }
        out.update(self.extra)
        return out


def finish_design(design: str, w: np.ndarray, r: np.ndarray, b: float, *, sigma_mix2: float | None = None,
                  components: list | None = None, eigenvalues_only: bool = False,
                  **facts: object) -> CovarianceDesign:
    """Verify R against b (rescaling away rounding-level violations, together with its parts) and fill in the
    reported facts. Without ``sigma_mix2``, the independent part is the largest possible, λ_min(R), and the rest
    R − λ_min(R)·I is one component driven by a global seed. ``eigenvalues_only``: compute R's spectrum without
    eigenvectors (about half the work of a full eigendecomposition, for large n) and form that component as
    R − λ_min(R)·I directly instead of from the eigenvectors (the same matrix up to rounding)."""
    r = 0.5 * (r + r.T)
    # The computed precision diagonal carries a relative error of about cond(R)·eps; rescale with that margin so
    # that the verification below (an independent recomputation) passes for ill-conditioned R too.
    if eigenvalues_only:
        mu, q = scipy.linalg.eigh(r, eigvals_only=True, check_finite=False, driver="evd"), None
    else:
        mu, q = np.linalg.eigh(r)
    margin = 1e-12 + 50 * np.finfo(float).eps * float(mu[-1] / max(mu[0], np.finfo(float).tiny))
    step = float(np.max(precision_diagonal(r))) / b
    scale = step * (1 + margin) if step > 1.0 else 1.0
    r, mu = r * scale, mu * scale
    ratio, precisions = _verified(r, check_bound(b), f"the {design} covariance")
    n = r.shape[0]
    if sigma_mix2 is None:
        sigma_mix2 = float(mu[0])
        if q is None:
            rest = r.copy()
            rest[np.diag_indices(n)] -= sigma_mix2
        else:
            rest = (q * np.clip(mu - mu[0], 0.0, None)) @ q.T
        components = [SeedComponent(tuple(range(n)), rest, "global")]
    else:
        sigma_mix2 *= scale
        if components is not None and scale != 1.0:
            components = [SeedComponent(c.members, c.cov * scale, c.label) for c in components]
    extra = facts.pop("extra", {}) or {}
    return CovarianceDesign(
        design=design, R=r, bound=b, trace=noise_trace(w, r), trace_ldp=float(np.sum(w * w)) / b,
        cdp_lower_bound=1.0 / (n * b), max_precision_ratio=ratio, sigma_mix2=float(sigma_mix2), extra=dict(extra),
        components=components, precisions=precisions, **facts)  # type: ignore[arg-type]
