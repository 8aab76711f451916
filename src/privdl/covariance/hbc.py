"""Problem (10) of seed 001: noise design against honest-but-curious coalitions of up to q agents (SPEC §3).

    minimise Tr(W R Wᵀ),  R = σ_mix² I + Σ_k R_cor^(k),  R_cor^(k) ⪰ 0 supported on H_k × H_k,
    subject to [(R^(I))⁻¹]_ii ≤ b for every coalition |I| ≤ q and every agent i ∉ I.

Solved with cvxpy (optional extra ``privdl[reference]``): for every distinct set of unknown seeds U one LMI
[[R^(U), E_A], [E_Aᵀ, X_U]] ⪰ 0 with diag(X_U) ≤ b (X_U ⪰ E_Aᵀ (R^(U))⁻¹ E_A, A the agents protected against
it). The result is verified by :func:`privdl.covariance.seeds.coalition_worst_ratio`, independently of the solver,
and rescaled to feasibility. Special cases (tested): q = 0 with one global seed is problem (P); q = n−1 with one
seed per agent is LDP.
"""

from __future__ import annotations

import time

import numpy as np

from privdl.covariance.problem import CovarianceDesign, check_bound, check_square, noise_trace, precision_diagonal
from privdl.covariance.reference import require_cvxpy, solve_problem
from privdl.covariance.seeds import SeedComponent, check_groups, coalition_views, coalition_worst_ratio


def _psd_part(a: np.ndarray) -> np.ndarray:
    mu, q = np.linalg.eigh(0.5 * (a + a.T))
    return (q * np.clip(mu, 0.0, None)) @ q.T


def solve_hbc(w: np.ndarray, *, bound: float, groups: list[tuple[int, ...]], coalition_size: int,
              solver: str | None = None,
              label: str = "custom") -> CovarianceDesign:
    b, q = bound, coalition_size
    cp = require_cvxpy()
    start = time.perf_counter()
    w, b = check_square(w), check_bound(b)
    n = w.shape[0]
    groups = check_groups([tuple(sorted(set(h))) for h in groups], n)
    views = coalition_views(groups, n, q)
    sigma2 = cp.Variable(nonneg=True)
    blocks = [cp.Variable((len(h), len(h)), PSD=True) for h in groups]
    select = []
    for h in groups:
        e = np.zeros((n, len(h)))
        e[list(h), range(len(h))] = 1.0
        select.append(e)
    embedded = [e @ blk @ e.T for e, blk in zip(select, blocks)]

    def covariance(unknown) -> object:
        total = sigma2 * np.eye(n)
        for k in unknown:
            total = total + embedded[k]
        return total

    constraints = []
    for unknown, agents in views.items():
        idx = sorted(agents)
        e_a = np.eye(n)[:, idx]
        x = cp.Variable((len(idx), len(idx)), symmetric=True)
        constraints += [cp.bmat([[covariance(unknown), e_a], [e_a.T, x]]) >> 0, cp.diag(x) <= b]
    full = covariance(range(len(groups)))
    problem = cp.Problem(cp.Minimize(cp.trace(w @ full @ w.T)), constraints)
    used = solve_problem(problem, solver)

    s2 = max(float(sigma2.value), 0.0)
    comps = [SeedComponent(h, _psd_part(np.asarray(blk.value)), f"seed{k}") for k, (h, blk) in
             enumerate(zip(groups, blocks))]
    worst, where = coalition_worst_ratio(s2, comps, n, coalition_size=q, bound=b)
    scale = max(1.0, worst)  # scaling every part by the same factor scales every R^(I): feasibility restored
    comps = [SeedComponent(c.members, c.cov * scale, c.label) for c in comps]
    s2 *= scale
    r = s2 * np.eye(n) + sum((c.embedded(n) for c in comps), np.zeros((n, n)))
    worst_after, where = coalition_worst_ratio(s2, comps, n, coalition_size=q, bound=b)
    return CovarianceDesign(
        design="hbc", R=r, bound=b, trace=noise_trace(w, r), trace_ldp=float(np.sum(w * w)) / b,
        cdp_lower_bound=1.0 / (n * b), max_precision_ratio=float(np.max(precision_diagonal(r)) / b), sigma_mix2=s2,
        seconds=time.perf_counter() - start, components=comps,
        extra={"solver": used, "seeds": label, "m": len(groups), "coalition_size": q, "coalitions": len(views),
               "worst_coalition_ratio": worst_after, "worst_coalition": where, "solver_violation": worst})

