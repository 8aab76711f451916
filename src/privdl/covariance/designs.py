"""The three noise designs of seeds 000/001 as covariances R over agents (SPEC §3).

- ``ldp``:     R = I/b (independent noise).
- ``decor``:   R = σ_pair² I + σ_cor² L (pairwise-canceling noise, L the unweighted graph Laplacian), with the two
               variances chosen to minimise Tr(W R Wᵀ) under [R⁻¹]_ii ≤ b (a one-dimensional search).
- ``whisper``: the solution of problem (P) (Whisper D-SGD / CorN-DSGD), by the dual solver of
               :mod:`privdl.covariance.dual` (Newton's method on the dual's stationarity condition from 1000 agents on, its fixed point below).
               For a singular W (below 2000 agents), where (P) has no unique solution, it is the least-trace
               tie-break (P_ρ) of that module: the unique minimiser of Tr(W R Wᵀ) + ρ·Tr(R) under the same
               constraints, ρ = (τ/n)²·λ_max(WᵀW), the same R on every machine; ``extra`` then reports ρ
               (``tie_break_trace_weight``), the stationarity δ and the gap of (P_ρ), and ``duality_gap`` is against
               (P)'s own dual (the tie-break's whole cost).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
from scipy.optimize import minimize_scalar

from privdl.covariance.dual import solve_dual_cached
from privdl.covariance.problem import (
    CovarianceDesign, check_bound, check_square, finish_design, require_symmetric,
)
from privdl.covariance.seeds import SeedComponent
from privdl.network.edges import fingerprint, laplacian, undirected_edges
from privdl.registry import Registry

DESIGNS: Registry[Callable[..., CovarianceDesign]] = Registry("covariance design")

#: Largest ratio σ_cor²/σ_pair² DECOR's search considers (reached only when WL = 0, e.g. the complete graph,
#: where it leaves the trace within ~1e-6 of the infimum while keeping R well conditioned).
DECOR_MAX_RATIO = 1e6
#: From this n on, the Whisper design's verification skips R's eigenvectors (:func:`finish_design`'s
#: ``eigenvalues_only``; not with ``method="fixed_point"``, which keeps the original pipeline for comparison): the
#: global component R − λ_min(R)·I is formed directly.
LARGE_N = 1000


@DESIGNS.register("ldp")
def ldp_design(w: np.ndarray, b: float) -> CovarianceDesign:
    w, b = check_square(w), check_bound(b)
    n = w.shape[0]
    return finish_design("ldp", w, np.eye(n) / b, b, sigma_mix2=1.0 / b, components=[])


@DESIGNS.register("decor")
def decor_design(w: np.ndarray, b: float) -> CovarianceDesign:
    """Best DECOR covariance: minimise over c = σ_cor²/σ_pair² ≥ 0 the trace h(c)(Tr(WWᵀ) + c·Tr(WLWᵀ))/b, where
    h(c) = max_i [(I + cL)⁻¹]_ii sets σ_pair² = h(c)/b (the constraint, tight at the worst agent)."""
    start = time.perf_counter()
    w, b = check_square(w), check_bound(b)
    require_symmetric(w, "DECOR (its canceling terms live on undirected edges)")
    lap = laplacian(w)
    c_best, h_best = _decor_ratio(w, lap)
    sigma_pair2 = h_best / b
    r = sigma_pair2 * (np.eye(w.shape[0]) + c_best * lap)
    sigma_cor2 = c_best * sigma_pair2
    pair = sigma_cor2 * np.array([[1.0, -1.0], [-1.0, 1.0]])  # v_ij = −v_ji: one canceling term per edge
    components = [SeedComponent((i, j), pair, f"edge:{i}-{j}") for i, j in undirected_edges(w)] if sigma_cor2 > 0 else []
    return finish_design(
        "decor", w, r, b, sigma_mix2=sigma_pair2, seconds=time.perf_counter() - start, components=components,
        extra={"sigma_pair2": sigma_pair2, "sigma_cor2": sigma_cor2,
               "at_ratio_cap": bool(c_best >= DECOR_MAX_RATIO * (1 - 1e-9))})


_DECOR_CACHE: dict[str, tuple[float, float]] = {}


def _decor_ratio(w: np.ndarray, lap: np.ndarray) -> tuple[float, float]:
    """The best c = σ_cor²/σ_pair² and h(c) for W: independent of b (the objective scales as 1/b), so solved once
    per W (cached by its fingerprint)."""
    key = fingerprint(w)
    if key in _DECOR_CACHE:
        return _DECOR_CACHE[key]
    ell, v = np.linalg.eigh(lap)
    ell = np.clip(ell, 0.0, None)
    v2 = v * v
    a, bb = float(np.sum(w * w)), float(np.sum((w @ lap) * w))

    def h(c: np.ndarray) -> np.ndarray:
        return np.max(v2 @ (1.0 / (1.0 + np.outer(ell, c))), axis=0)

    def objective(c: np.ndarray) -> np.ndarray:
        return h(c) * (a + c * bb)

    grid = np.concatenate([[0.0], np.logspace(-6, math.log10(DECOR_MAX_RATIO), 281)])
    values = objective(grid)
    k = int(np.argmin(values))
    c_best, f_best = float(grid[k]), float(values[k])
    if 0 < k < len(grid) - 1:  # refine in log c between the neighbouring grid points
        lo, hi = math.log(max(grid[k - 1], 1e-7)), math.log(grid[k + 1])
        res = minimize_scalar(lambda z: float(objective(np.array([math.exp(z)]))[0]), bounds=(lo, hi),
                              method="bounded", options={"xatol": 1e-10})
        if res.fun < f_best:
            c_best, f_best = math.exp(res.x), float(res.fun)
    if len(_DECOR_CACHE) > 256:
        _DECOR_CACHE.pop(next(iter(_DECOR_CACHE)))
    _DECOR_CACHE[key] = (c_best, float(h(np.array([c_best]))[0]))
    return _DECOR_CACHE[key]


def _decor_components(w) -> tuple[bool, bool, list]:
    """What h(c) = max_i [(I + c·L)⁻¹]_ii needs of W's graph (L its unweighted Laplacian), one connected component at
    a time: whether an agent is isolated (h ≥ 1), whether a component is a pair (h ≥ (1 + c)/(1 + 2c)), and each
    larger component's Laplacian eigenvalues ℓ with its eigenvectors squared (h ≥ max_i Σ_k v_ik²/(1 + cℓ_k))."""
    import scipy.sparse as sps
    from scipy.sparse.csgraph import connected_components

    w = sps.csr_array(w)
    adj = (w - sps.diags_array(w.diagonal())).astype(bool).astype(np.float64)
    lap = sps.diags_array(np.asarray(adj.sum(axis=1)).ravel()) - adj
    count, label = connected_components(adj, directed=False)
    sizes = np.bincount(label, minlength=count)
    big = []
    for k in np.flatnonzero(sizes > 2):
        members = np.flatnonzero(label == k)
        ell, v = np.linalg.eigh(lap[members][:, members].toarray())
        big.append((np.clip(ell, 0.0, None), v * v))
    return bool((sizes == 1).any()), bool((sizes == 2).any()), big


def _decor_h_of(parts: tuple[bool, bool, list], c: np.ndarray) -> np.ndarray:
    single, pair, big = parts
    h = np.where(single, 1.0, 0.0) * np.ones_like(c)
    if pair:
        h = np.maximum(h, (1.0 + c) / (1.0 + 2.0 * c))
    for ell, v2 in big:
        h = np.maximum(h, np.max(v2 @ (1.0 / (1.0 + np.outer(ell, c))), axis=0))
    return h


def decor_h(w, c: float) -> float:
    """h(c) = max_i [(I + c·L)⁻¹]_ii for the unweighted Laplacian L of W's graph (dense or sparse; an agent in no
    edge: 1; a matched pair: (1 + c)/(1 + 2c), in closed form) — σ_pair² = h(c)/b puts the worst agent's precision
    at b (DECOR on a round's graph, :class:`privdl.mechanisms.decor.DecorNoise`)."""
    if c == 0:
        return 1.0
    return float(_decor_h_of(_decor_components(w), np.array([float(c)]))[0])


def decor_common_ratio(ws: list) -> float:
    """The one c = σ_cor²/σ_pair² for a sequence of W(t) (a time-varying graph's rounds; dense or sparse), each round
    scaled to its own h_t(c) = max_i [(I + c·L(t))⁻¹]_ii: minimises the mean over ``ws`` of h_t(c)(Tr(W(t)W(t)ᵀ) +
    c·Tr(W(t)L(t)W(t)ᵀ)), the same grid-and-refine search as one W's (:func:`decor_design`). h_t is taken one
    connected component at a time (:func:`decor_h`), so a matching costs no eigendecomposition of the whole
    network."""
    import scipy.sparse as sps

    rounds = []
    for w in ws:
        w = sps.csr_array(w)
        adj = (w - sps.diags_array(w.diagonal())).astype(bool).astype(np.float64)
        lap = sps.diags_array(np.asarray(adj.sum(axis=1)).ravel()) - adj
        wl = (w @ lap).multiply(w)
        rounds.append((_decor_components(w), float(w.multiply(w).sum()), float(wl.sum())))

    def objective(c: np.ndarray) -> np.ndarray:
        total = np.zeros_like(c)
        for parts, a, bb in rounds:
            total += _decor_h_of(parts, c) * (a + c * bb)
        return total / len(rounds)

    grid = np.concatenate([[0.0], np.logspace(-6, math.log10(DECOR_MAX_RATIO), 281)])
    values = objective(grid)
    k = int(np.argmin(values))
    c_best, f_best = float(grid[k]), float(values[k])
    if 0 < k < len(grid) - 1:
        lo, hi = math.log(max(grid[k - 1], 1e-7)), math.log(grid[k + 1])
        res = minimize_scalar(lambda z: float(objective(np.array([math.exp(z)]))[0]), bounds=(lo, hi),
                              method="bounded", options={"xatol": 1e-10})
        if res.fun < f_best:
            c_best = math.exp(res.x)
    return c_best


@DESIGNS.register("whisper")
def whisper_design(w: np.ndarray, b: float, *, tol: float = 1e-10, ridge: float | None = None,
                   method: str = "auto", device: str | None = None) -> CovarianceDesign:
    """Problem (P) solved on its dual (cached per W; R*(b) = R*(1)/b): ``method`` "auto" (default: Newton from
    1000 agents on, the fixed point below), "newton" or "fixed_point"; ``device`` a torch device for the eigendecompositions (None: LAPACK on the CPU)."""
    start = time.perf_counter()
    w, b = check_square(w), check_bound(b)
    sol = solve_dual_cached(w, tol=tol, ridge=ridge, method=method, device=device)
    extra = {"relative_duality_gap": sol.gap / sol.primal, "solver": "dual " + sol.method.replace("_", " "),
             "dual_method": sol.method, "solve_seconds_uncached": sol.seconds}
    if sol.singular and sol.trace_weight > 0:  # the tie-break (P_ρ) defined the design (privdl.covariance.dual)
        extra.update({"solver": "dual newton, least-trace tie-break (singular W)",
                      "tie_break": "min Tr(W R Wᵀ) + ρ·Tr(R), same constraints", "tie_break_trace_weight":
                      sol.trace_weight, "tie_break_stationarity": sol.stationarity, "tie_break_gap": sol.tie_gap / b})
    elif sol.stationarity > 0:  # a non-singular W beyond the eigh-based iteration, re-solved accurately (ρ = 0)
        extra.update({"solver": "dual newton, accurate (ill-conditioned W)", "stationarity": sol.stationarity})
    design = finish_design(
        "whisper", w, sol.R / b, b, eigenvalues_only=sol.method == "newton" and w.shape[0] >= LARGE_N,
        duality_gap=sol.gap / b, iterations=sol.iterations, seconds=time.perf_counter() - start,
        singular=sol.singular, ridge=sol.ridge, extra=extra)
    return design


DESIGNS.add("corn", whisper_design)  # CorN-DSGD is the same design under seed 001's later name


def design_covariance(name: str, w: np.ndarray, *, bound: float, **options: object) -> CovarianceDesign:
    """The registered design ``name`` for mixing matrix ``w`` and precision bound b = ``bound``."""
    return DESIGNS.build(name, w, bound, **options)  # type: ignore[return-value]
