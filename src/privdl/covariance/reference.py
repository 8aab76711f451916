"""Reference solvers of problem (P) with cvxpy and open conic solvers (optional extra ``privdl[reference]``).

For cross-checks on small n only — they are orders of magnitude slower than :mod:`privdl.covariance.dual`:

- :func:`solve_official`: the authors' formulation (seed 001, §V): R = σ_mix² I + R_cor, R_cor ⪰ 0, and one
  Schur-complement LMI [[R, e_i], [e_iᵀ, b]] ⪰ 0 of size n+1 per agent.
- :func:`solve_precision`: route (a) of SPEC §3: the precision P = R⁻¹ as variable, diag(P) ≤ b, and one LMI
  [[X, W], [Wᵀ, P]] ⪰ 0 of size 2n for the objective Tr(X) ≥ Tr(W P⁻¹ Wᵀ).

Both return a verified :class:`CovarianceDesign` (solvers can report "optimal" while violating the constraint;
the result is rescaled to feasibility and the rescaling is reported as ``solver_violation``).
"""

from __future__ import annotations

import time

import numpy as np

from privdl.covariance.problem import CovarianceDesign, check_bound, check_square, finish_design, precision_diagonal
from privdl.errors import ConfigError


def require_cvxpy():
    try:
        import cvxpy as cp
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("the reference solvers need cvxpy: pip install 'privdl[reference]'") from None
    return cp


def solve_problem(problem, solver: str | None) -> str:
    """Solve a cvxpy problem with ``solver`` (default Clarabel, else SCS); return the solver used."""
    cp = require_cvxpy()
    names = [solver] if solver else [s for s in ("CLARABEL", "SCS") if s in cp.installed_solvers()]
    last: Exception | None = None
    for name in names:
        try:
            problem.solve(solver=name)
            if problem.status in ("optimal", "optimal_inaccurate"):
                return name
        except cp.error.SolverError as exc:  # try the next solver
            last = exc
    raise ConfigError(f"reference solver failed (status {problem.status!r}, {last})")


def _finish(name: str, w: np.ndarray, r: np.ndarray, b: float, start: float, solver: str) -> CovarianceDesign:
    violation = float(np.max(precision_diagonal(0.5 * (r + r.T)))) / b
    return finish_design(name, w, r, b, seconds=time.perf_counter() - start,
                         extra={"solver": solver, "solver_violation": violation})


def solve_official(w: np.ndarray, *, bound: float, solver: str | None = None) -> CovarianceDesign:
    cp = require_cvxpy()
    start = time.perf_counter()
    w, b = check_square(w), check_bound(bound)
    n = w.shape[0]
    sigma2 = cp.Variable(nonneg=True)
    r_cor = cp.Variable((n, n), PSD=True)
    r = sigma2 * np.eye(n) + r_cor
    constraints = []
    for i in range(n):
        e = np.zeros((n, 1))
        e[i] = 1.0
        constraints.append(cp.bmat([[r, e], [e.T, np.array([[b]])]]) >> 0)
    problem = cp.Problem(cp.Minimize(cp.trace(w @ r @ w.T)), constraints)
    used = solve_problem(problem, solver)
    return _finish("official_lmi", w, np.asarray(r.value), b, start, used)


def solve_precision(w: np.ndarray, *, bound: float, solver: str | None = None) -> CovarianceDesign:
    cp = require_cvxpy()
    start = time.perf_counter()
    w, b = check_square(w), check_bound(bound)
    n = w.shape[0]
    p = cp.Variable((n, n), symmetric=True)
    x = cp.Variable((n, n), symmetric=True)
    problem = cp.Problem(cp.Minimize(cp.trace(x)), [cp.bmat([[x, w], [w.T, p]]) >> 0, cp.diag(p) <= b])
    used = solve_problem(problem, solver)
    return _finish("precision_lmi", w, np.linalg.inv(np.asarray(p.value)), b, start, used)
