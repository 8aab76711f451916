"""The singular-W tie-break of the dual solver: the unique minimiser R_ρ of (P_ρ) = (P) + ρ·Tr(R) (the least-trace
optimum of (P) where it has optima), solved by Newton's method on its dual with accurate column-scaled SVDs of the
stacked [W; √ρ·I]·Λ^{1/2}; with ρ = 0 the accurate re-solve of an ill-conditioned non-singular W.

Separate from the eigh-based iterations (:mod:`privdl.covariance.dual`, whose docstring states (P_ρ), its costs and
its measured uniqueness) because it has its own arithmetic (float64 SVDs, never on a GPU), its own Newton variant
(exact and damped up to ``TIE_DENSE_MAX_N`` agents) and its own stopping rules (stationarity at rounding, not a gap).
"""

from __future__ import annotations

import time

import numpy as np
import scipy.linalg
from scipy.linalg.lapack import dgejsv

from privdl.covariance.dual_linalg import _symmetrised
from privdl.covariance.dual_newton import _newton_step
from privdl.covariance.dual_solution import DualSolution

#: The tie-break's Newton iteration stops once the spread of log p (its backward error δ in the bounds) is below this,
#: or when ``3·TIE_STALL`` steps in a row have not lowered it (rounding reached).
TIE_STATIONARITY = 1e-14
TIE_STALL = 4
#: Below this n every SVD of the tie-break is the Jacobi one (dgejsv; milliseconds there); from it on the iteration
#: starts with divide-and-conquer SVDs (3–4× faster) and polishes with Jacobi once those stop improving.
JACOBI_ONLY_MAX_N = 300
#: The divide-and-conquer phase hands over to Jacobi once the spread of log p is below this.
TIE_FAST_SPREAD = 1e-6
#: Up to this n the tie-break's Newton step is exact: N formed densely (one O(n⁴) product) and solved with
#: Levenberg–Marquardt damping μ·diag(N) (μ = 0 while steps succeed). Above it, conjugate gradients (at most
#: ``TIE_MAX_CG`` products) with step halving. N is nearly singular where agents are nearly interchangeable, and there
#: only the exact step converges fast.
TIE_DENSE_MAX_N = 256
TIE_MAX_CG = 64
#: At most this change of any log λ_i relative to the others in one step (λ spans ~ρ to 1: a factor e^{±34} at most),
#: and at most this many SVDs in all (each stalls-or-stops rule above usually ends it within 5–30).
TIE_MAX_STEP = 8.0
TIE_MAX_EVAL = 300


def _stacked_sqrt(w: np.ndarray, c: float, lam: np.ndarray, accurate: bool) -> tuple[np.ndarray, np.ndarray]:
    """√eigenvalues (ascending) and eigenvectors of B = Λ^{1/2}(WᵀW + c²I)Λ^{1/2}, from the SVD of the stacked
    [W; c·I]·Λ^{1/2} (B itself is never formed: its small eigenvalues would carry an absolute error of eps·‖B‖).
    ``accurate``: LAPACK's preconditioned Jacobi SVD (dgejsv, JOBA = 'C'), accurate to each singular value's own
    relative precision whatever the column scaling Λ^{1/2}; else divide and conquer (faster, absolute accuracy)."""
    n = w.shape[0]
    sq = np.sqrt(lam)
    a = np.zeros((2 * n, n), order="F")
    a[:n] = w * sq[None, :]
    a[np.arange(n, 2 * n), np.arange(n)] = c * sq
    if accurate:
        sva, _, v, work, _, info = dgejsv(a, joba=0, jobu=3, jobv=0, jobr=0, jobt=0, jobp=0, overwrite_a=1)
        if info == 0:
            sig = sva * (work[0] / work[1])  # (the singular values are WORK(1)/WORK(2)·SVA: LAPACK, SVA)
            order = np.argsort(sig, kind="stable")
            return sig[order], np.ascontiguousarray(v[:, order])
        a = np.zeros((2 * n, n))  # (Jacobi did not converge: divide and conquer; ``stationarity`` then shows it)
        a[:n] = w * sq[None, :]
        a[np.arange(n, 2 * n), np.arange(n)] = c * sq
    _, sig, vt = np.linalg.svd(a, full_matrices=False)
    return sig[::-1].copy(), np.ascontiguousarray(vt[::-1].T)


def _tie_point(w: np.ndarray, c: float, lam: np.ndarray, accurate: bool) -> tuple:
    """(spread of log p, dual of (P_ρ) at the best scaling of λ, λ, r, Q, h, log p) at λ."""
    r, q = _stacked_sqrt(w, c, lam, accurate)
    h = (q * q) @ r  # diag(B^{1/2})
    log_p = np.log(h / lam)
    return float(np.ptp(log_p)), float(r.sum()) ** 2 / float(lam.sum()), lam, r, q, h, log_p


def _tie_hessian(r: np.ndarray, q: np.ndarray) -> np.ndarray:
    """N of :mod:`privdl.covariance.dual`'s docstring as a dense matrix, Σ_kl K_kl (q_k∘q_l)(q_k∘q_l)ᵀ with
    K_kl = r_k r_l/(r_k + r_l): one product over the n² pairs of eigenvectors (O(n⁴): for the tie-break's small n
    only)."""
    n = r.size
    k = np.add.outer(r, r)
    np.divide(np.multiply.outer(r, r), k, out=k, where=k > 0)
    k[~(np.add.outer(r, r) > 0)] = 0.0
    z = (q[:, :, None] * q[:, None, :]).reshape(n, n * n)
    return (z * k.reshape(-1)) @ z.T


def _solve_tiebreak(w: np.ndarray, m: np.ndarray, tau: float, *, max_iter: int, method: str,
                    seconds: float = 0.0, start: np.ndarray | None = None) -> DualSolution:
    """The design of a singular W: the minimiser R_ρ of (P_ρ), ρ = (τ/n)²·λ_max(M) (:mod:`privdl.covariance.dual`), at
    b = 1. ``tau`` = 0: ρ = 0, the accurate solve of a non-singular but ill-conditioned W's (P) itself
    (:func:`privdl.covariance.dual._ill_conditioned`).

    Newton's method on log p(λ) = 0 in x = log λ, N Δx = h ∘ log p, in float64: up to ``TIE_DENSE_MAX_N`` agents
    with N formed densely and Levenberg–Marquardt damping, above by conjugate gradients with step halving (after two
    halvings the fixed point's step λ ← λ·p). A step is kept when it lowers the spread of log p or raises the dual of
    (P_ρ). Divide-and-conquer SVDs until the spread is below ``TIE_FAST_SPREAD`` (from ``JACOBI_ONLY_MAX_N`` agents
    on), Jacobi SVDs after; stops when the spread is below ``TIE_STATIONARITY``, when no step has helped
    ``3·TIE_STALL`` times in a row (rounding reached), or after ``TIE_MAX_EVAL`` SVDs. ``start``: the starting λ
    (default 1; the tests perturb it: the solution does not depend on it)."""
    t0 = time.perf_counter()
    n = w.shape[0]
    top = float(scipy.linalg.eigh(m, eigvals_only=True, subset_by_index=[n - 1, n - 1], check_finite=False)[0])
    rho = (tau / n) ** 2 * top
    c = float(np.sqrt(rho))
    lam = np.ones(n) if start is None else np.asarray(start, dtype=np.float64).copy()
    accurate = n < JACOBI_ONLY_MAX_N
    dense = n <= TIE_DENSE_MAX_N
    cur = _tie_point(w, c, lam, accurate)
    evaluations = 1
    best_dual = cur[1]
    step, hessian, scale, damping, failures = None, None, 1.0, 0.0, 0
    while evaluations < min(max_iter, TIE_MAX_EVAL):
        spread, dual, lam, r, q, h, log_p = cur
        if spread <= TIE_STATIONARITY or (accurate and failures >= 3 * TIE_STALL):
            break
        if not accurate and (spread <= TIE_FAST_SPREAD or failures >= 3 * TIE_STALL):
            accurate, failures, step, hessian = True, 0, None, None  # polish with Jacobi SVDs from here
            cur = _tie_point(w, c, lam, True)
            evaluations += 1
            best_dual = max(best_dual, cur[1])
            continue
        rhs = h * log_p
        if dense:  # the exact (damped) Newton step from the current point, on the unit-diagonal D N D (D =
            # diag(N)^{-1/2}): a slack agent's row of N is O(λ_i) ~ ρ, which an unscaled solve would cut off as rank
            # deficiency
            if hessian is None:
                hessian = _tie_hessian(r, q)
                diagonal = np.diag(hessian).copy()
                unit = 1.0 / np.sqrt(np.where(diagonal > 0, diagonal, 1.0))
                hessian = hessian * unit[:, None] * unit[None, :]
            system = hessian + damping * np.eye(n)
            step = unit * np.linalg.lstsq(system, unit * rhs, rcond=None)[0]
        elif step is None:  # a fresh CG step (run to the end: its long steps are the right ones; halving guards)
            scale = 1.0
            step = _newton_step(r, q, h, log_p, np.ones(n, dtype=bool), spread, TIE_STATIONARITY, np.float64,
                                max_cg=TIE_MAX_CG)
        if not np.all(np.isfinite(step)):
            step = 2.0 * log_p  # (the fixed point's step)
        reach = float(np.max(np.abs(step - float(np.average(step, weights=h)))))
        if reach > TIE_MAX_STEP:  # (λ's scale is free: only the step's spread about its mean matters)
            step = step * (TIE_MAX_STEP / reach)
        trial = _tie_point(w, c, np.clip(lam * np.exp(scale * step), 1e-300, 1e300), accurate)
        evaluations += 1
        if np.isfinite(trial[0]) and np.isfinite(trial[1]):
            best_dual = max(best_dual, trial[1])
            if trial[0] < spread or trial[1] > dual * (1 + 1e-12):
                cur, step, hessian, failures = trial, None, None, 0
                damping = damping / 10 if damping > 1e-6 else 0.0
                continue
        failures += 1
        if dense:
            damping = max(1e-4, 10 * damping)
        elif failures % 3 == 0:  # two halvings did not help: the fixed point's plain step from here
            step, scale = log_p.copy(), 1.0
        else:
            scale *= 0.5
    spread, _, lam, r, q, h, _ = cur
    s = np.sqrt(lam)
    p_max = float((h / lam).max())
    r_mat = (q / r) @ q.T
    r_mat *= s[:, None]
    r_mat *= s[None, :] * p_max  # feasible at b = 1
    r_mat = _symmetrised(r_mat)
    primal_rho = p_max * float(r.sum())  # Tr((M + ρI) R) = max p · Tr(B^{1/2})
    primal = primal_rho - rho * float(np.trace(r_mat))  # Tr(W R Wᵀ), without the cancellation of Σ_ij R_ij M_ij
    # a lower bound on (P) itself: its dual at the final λ, best scaling. Tr((Λ^{1/2}MΛ^{1/2})^{1/2}) is the sum of
    # W·Λ^{1/2}'s singular values, from an SVD (absolute error eps·σ_max), not from √eigenvalues (M's zero eigenvalues,
    # rounded to ±1e-17, would add ~3e-9 each and make the "bound" exceed the optimum)
    sig = np.linalg.svd(w * s[None, :], compute_uv=False)
    dual = float(sig.sum()) ** 2 / float(lam.sum())
    return DualSolution(r_mat, lam, primal, dual, evaluations + 2, seconds + time.perf_counter() - t0, tau > 0, tau,
                        method, trace_weight=rho, stationarity=spread, tie_gap=max(0.0, primal_rho - best_dual))
