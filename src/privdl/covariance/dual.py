"""The fast solver of problem (P): a fixed point on the dual, with a duality-gap certificate (SPEC §3, route (b)).

With M = WᵀW and Λ = diag(λ), the Lagrange dual of (P) is

    max_{λ ≥ 0}  g(λ) = 2·Tr((Λ^{1/2} M Λ^{1/2})^{1/2}) − b·Σ_i λ_i            (= 2‖W diag(√λ)‖_* − b‖√λ‖²)

and for a given λ the minimising precision is P(λ) = Λ^{-1/2} B^{1/2} Λ^{-1/2} with B = Λ^{1/2} M Λ^{1/2}, i.e.
R(λ) = Λ^{1/2} B^{-1/2} Λ^{1/2}, whose precision diagonal is p_i(λ) = [B^{1/2}]_ii / λ_i. Stationarity of g is
p_i(λ) = b for every active agent, and the iteration λ_i ← λ_i (p_i/b)² reaches it in tens of steps (each one
eigen-decomposition of B, O(n³)). Scaling R(λ) by max_i p_i / b makes it feasible, and since Tr(M R(λ)) =
Tr(B^{1/2}), its objective max_i(p_i)/b · Tr(B^{1/2}) against g(λ) is a duality gap computed for free.

(P) is homogeneous — R*(b) = R*(1)/b — so one solve per W serves every (ε, δ, C, T); solutions are cached by a
fingerprint of W. A singular W (complete graph, some rings, many dense ER graphs) has no minimiser: noise in
null(W) is free, so the infimum is approached only as those variances grow without bound. The dual needs no change
(its supremum is the infimum); the primal is recovered with a small floor τ on the precision, which bounds the
variance on null(W), and the result says so (``singular``, ``ridge`` = τ) with its certified gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from privdl.covariance.problem import check_square
from privdl.errors import ValidationError
from privdl.network.edges import fingerprint

#: Singular-value test: W is treated as singular when λ_min(WᵀW) ≤ this × λ_max(WᵀW).
SINGULAR_RTOL = 1e-10
#: Default precision floor τ for singular W (relative to max_i P_ii): objective within ~τ of the infimum.
DEFAULT_RIDGE = 1e-6


@dataclass(frozen=True)
class DualSolution:
    """The solution of (P) at b = 1 (divide ``R`` by b for any other bound)."""

    R: np.ndarray
    lam: np.ndarray
    primal: float  # Tr(W R Wᵀ) at b = 1
    dual: float  # a lower bound on the optimum of (P) at b = 1
    iterations: int
    seconds: float
    singular: bool
    ridge: float  # absolute ridge ρ used (0 when W is nonsingular)

    @property
    def gap(self) -> float:
        return max(0.0, self.primal - self.dual)


def _eig(b_mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, q = np.linalg.eigh(b_mat)
    return np.sqrt(np.clip(mu, 0.0, None)), q


def solve_dual(w: np.ndarray, *, tol: float = 1e-10, max_iter: int = 2000,
               ridge: float | None = None) -> DualSolution:
    """Solve (P) at b = 1 for mixing matrix ``w``; stop when the relative duality gap is ≤ ``tol``.

    Only M = WᵀW enters, so W need not be symmetric. For singular W the dual iteration is unchanged (it needs only
    B^{1/2}), and the primal is recovered from the precision P(λ) + τ·max_i P_ii·I, τ = ``ridge`` (default
    ``DEFAULT_RIDGE``): the variance on null(W) is then about 1/τ times the LDP variance and the objective lies
    within about τ (relative) of the infimum; the duality gap reported is against the true problem's dual.
    """
    start = time.perf_counter()
    w = check_square(w)
    n = w.shape[0]
    m = w.T @ w
    r, q = _eig(m)  # λ = 1: B = M; its spectrum also tells whether W is singular
    top = float(r[-1] ** 2)
    if top <= 0:
        raise ValidationError("W is zero")
    singular = float(r[0] ** 2) <= SINGULAR_RTOL * top
    tau = (DEFAULT_RIDGE if ridge is None else float(ridge)) if singular else 0.0
    if tau < 0:
        raise ValidationError(f"ridge must be >= 0, got {ridge}")
    if singular and tau == 0:
        raise ValidationError("W is singular: (P) has no minimiser; pass ridge > 0 to bound the variance on null(W)")

    lam = np.ones(n)
    best = (np.inf, lam, r, q)  # (primal, λ, r, Q) of the best point seen
    best_dual = -np.inf
    power, it = 2.0, 0
    for it in range(1, max_iter + 1):
        p = ((q * q) @ r) / lam  # diag of the precision P(λ) = Λ^{-1/2} B^{1/2} Λ^{-1/2}
        trace_sqrt = float(r.sum())
        dual = trace_sqrt**2 / float(lam.sum())  # max_t g(tλ) ≥ g(λ): a lower bound on (P)
        primal = float(p.max()) * trace_sqrt
        if dual < best_dual - 1e-12 * abs(best_dual) and power > 1.0:
            power = 1.0  # the accelerated step overshot: fall back to the plain multiplicative update
        best_dual = max(best_dual, dual)
        if primal < best[0]:
            best = (primal, lam, r, q)
        if best[0] - best_dual <= tol * best[0]:
            break
        lam = np.maximum(lam * p**power, 1e-300)
        s = np.sqrt(lam)
        r, q = _eig(s[:, None] * m * s[None, :])

    primal, lam, r, q = best
    s = np.sqrt(lam)
    if not singular:
        p_max = float((((q * q) @ r) / lam).max())
        r_mat = (s[:, None] * ((q / r) @ q.T) * s[None, :]) * p_max  # feasible at b = 1
        r_mat = 0.5 * (r_mat + r_mat.T)
        return DualSolution(r_mat, lam, primal, best_dual, it, time.perf_counter() - start, False, 0.0)
    prec = ((q * r) @ q.T) / s[:, None] / s[None, :]
    prec = 0.5 * (prec + prec.T)
    prec += tau * float(np.max(np.diag(prec))) * np.eye(n)
    prec /= float(np.max(np.diag(prec)))  # diag(P) ≤ 1 = b
    r_mat = np.linalg.inv(prec)
    r_mat = 0.5 * (r_mat + r_mat.T)
    true_primal = float(np.sum((w @ r_mat) * w))
    return DualSolution(r_mat, lam, true_primal, best_dual, it, time.perf_counter() - start, True, tau)


_CACHE: dict[tuple[str, float, float | None], DualSolution] = {}
_CACHE_LIMIT = 64


def solve_dual_cached(w: np.ndarray, *, tol: float = 1e-10, ridge: float | None = None) -> DualSolution:
    """:func:`solve_dual`, solved once per (W, tol, ridge) in this process (homogeneity makes b irrelevant)."""
    key = (fingerprint(w), float(tol), ridge)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        hit = _CACHE[key] = solve_dual(w, tol=tol, ridge=ridge)
    return hit
