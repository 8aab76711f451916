"""The fast solver of problem (P): Newton's method on the dual's stationarity condition, with a duality-gap certificate
(SPEC §3, route (b)).

With M = WᵀW and Λ = diag(λ), the Lagrange dual of (P) is

    max_{λ ≥ 0}  g(λ) = 2·Tr((Λ^{1/2} M Λ^{1/2})^{1/2}) − b·Σ_i λ_i            (= 2‖W diag(√λ)‖_* − b‖√λ‖²)

and for a given λ the minimising precision is P(λ) = Λ^{-1/2} B^{1/2} Λ^{-1/2} with B = Λ^{1/2} M Λ^{1/2}, i.e.
R(λ) = Λ^{1/2} B^{-1/2} Λ^{1/2}, whose precision diagonal is p_i(λ) = [B^{1/2}]_ii / λ_i. Stationarity of g is
p_i(λ) = b for every active agent. Scaling R(λ) by max_i p_i / b makes it feasible, and since Tr(M R(λ)) =
Tr(B^{1/2}), its objective max_i(p_i)/b · Tr(B^{1/2}) against g(λ) is a duality gap computed for free.

Each evaluation of p(λ) is one symmetric eigendecomposition of B (O(n³)); the solver's cost is their number.

- ``method="auto"`` (the default) is Newton from ``NEWTON_MIN_N`` = 1000 agents on and the fixed point below (where
  it takes at most about a second, and where every committed reproduction was computed with it).
- ``method="newton"`` solves log p(x) = 0 in x = log λ by Newton's method. In B's eigenbasis
  (B = Q diag(r²) Qᵀ, h = diag(B^{1/2})) the Daleckii–Krein formula for the derivative of the square root gives the
  Jacobian exactly: ∂ log p_i / ∂x_j = −N_ij / h_i with N_ij = Σ_kl Q_ik Q_jk Q_il Q_jl · r_k r_l / (r_k + r_l), a
  positive semi-definite matrix whose rows sum to h/2 (so uniform scaling of λ is exact). The Newton step solves
  N Δx = h ∘ log p by preconditioned conjugate gradients: a product N v costs a symmetric rank-k update and a matrix
  product in the eigenbasis (float32 from n = 256: only the step's accuracy depends on it, never the certificate);
  the preconditioner is diag(N) (from an exponential-sum quadrature, O(n²)) plus the rank-one matrix that restores
  N's row sums. CG stops once the linearised residual predicts a spread of log p below ~spread² (what Newton's own
  second-order error leaves) or below tol. For n ≥ 3000 the first eigendecomposition (λ = 1, only a starting point)
  is float32; whether W is singular is then decided by a Cholesky factorisation of M − SINGULAR_RTOL·λ_max(M)·I.
  From λ = 1 it certifies a relative gap of 1e-10 in 4 eigendecompositions on ER(0.5) graphs of 300–5000 agents,
  where the fixed point needs 16–21. A Newton step that neither lowers the gap nor raises the dual is replaced by the
  fixed point's step from the same point (Newton is retried after 2, 4, 8, ... fixed-point steps), as is a step far
  longer than the fixed point's (N nearly singular, e.g. p flat up to rounding).
- ``method="fixed_point"`` is the original iteration λ_i ← λ_i (p_i/b)² (power 1 after an overshoot), kept for
  comparison (benchmarks/bench_covariance.py) and as a reference in the tests.

The certificate is the same for both: the primal is the feasibility-scaled R(λ) of the best iterate, the dual the
best lower bound g(tλ*) seen, and both are computed from a full eigendecomposition at the points visited.

(P) is homogeneous — R*(b) = R*(1)/b — so one solve per W serves every (ε, δ, C, T); solutions are cached by a
fingerprint of W.

**Singular W: the tie-break (one design per problem, on every machine).** A singular W (complete graph, some rings,
many dense ER graphs: 15 of the first 40 ER(20, 0.8) draws) makes (P) ill posed: noise in null(W) costs nothing, so
the optimal set is unbounded (with an optimum R, every R + t·uuᵀ, Wu = 0, t ≥ 0, is optimal) or empty (the infimum
is approached only as the variance on null(W) grows without bound, e.g. the complete graph). The former recovery
(a precision floor τ added to the dual's P(λ)) returned whichever point the iteration's rounding led to: on
ER(6, 0.6, seed 3), whose agent 4 has a slack constraint (λ_4 → 0, P_44 = h_4/λ_4 computed from rounding), OpenBLAS's
SkylakeX kernels gave an R with λ_max = 10⁶ and its Haswell kernels one with λ_max = 8.0, at the same objective
(on another AVX-512 Xeon, the other way round). For a singular W of fewer than ``TIE_MAX_N`` = 2000 agents the
design is therefore, by definition, the unique minimiser of the regularised problem

    minimise Tr(W R Wᵀ) + ρ·Tr(R)  subject to  R ≻ 0,  [R⁻¹]_ii ≤ b,   ρ = (τ/n)²·λ_max(WᵀW),  τ = ``ridge``  (P_ρ)

which is (P) with M + ρI in place of M = WᵀW: M + ρI ≻ 0, so its objective is strictly convex in P = R⁻¹, its
minimiser R_ρ is unique, every constraint is tight, and R_ρ is a function of W alone. It is the least-trace choice:
for every feasible R′, Tr(W R_ρ Wᵀ) + ρ·Tr(R_ρ) ≤ Tr(W R′ Wᵀ) + ρ·Tr(R′) + G (G = ``tie_gap``, the certified gap of
(P_ρ), ~1e-15 relative), so where (P) has optima R_ρ has the least trace among them up to G/ρ (and → that optimum as
ρ → 0: on ER(6, 0.6, seed 3) λ_max(R) = 6.730, Tr(R) = 14.726 at b = 1; cvxpy's least-trace R among the 1e-8-optimal
has 14.720). What it costs:

- the privacy constraint: nothing — (P_ρ) has (P)'s constraints, and R_ρ is verified against them like any design.
- the objective: Tr(W R_ρ Wᵀ) − OPT(P) ≤ ρ·(Tr(R̂) − Tr(R_ρ)) for every optimum R̂ of (P) — ~1e-13 relative on the
  ER graphs above, 0 in the certified digits. Where (P) has no optimum it is about τ: on the complete graph
  τ·(n−1)/n relative (n = 12: 0.92τ, with variance 1/(τb) on null(W): the former floor's trade-off, now unique). The
  reported ``dual`` is a lower bound on (P) itself (its dual at the final λ, from singular values), so ``gap``
  certifies the whole cost of the tie-break, not only the solver's.
- the largest variance: λ_max(R_ρ) ≤ √(e^δ·Tr((WᵀW + ρI)R_ρ)/(ρ·b)) = (n/τ)·√(e^δ·Tr((WᵀW + ρI)R_ρ)/(λ_max(WᵀW)·b))
  (from P Λ P = M + ρI at the dual point λ; δ below): at most (n/τ)·√(Tr(WWᵀ) + nρ)/b, and √n/(τb) on the complete
  graph (whose λ_max(R_ρ) ≈ 1/(τb)); and
  λ_max(R_ρ) ≤ Tr(R_ρ) ≤ Tr(R′) + (Tr(W R′ Wᵀ) − Tr(W R_ρ Wᵀ) + G)/ρ for every feasible R′.

(P_ρ) is solved on its dual by Newton's method (:func:`_solve_tiebreak`, float64, the exact Newton step with
Levenberg–Marquardt damping up to ``TIE_DENSE_MAX_N`` agents), whatever ``method`` and ``device`` say: stationarity
p_i(λ) = b pins R_ρ far more tightly than a duality gap can (the objective is flat to O(ρ) in the tie-break's
direction). B = Λ^{1/2}(M + ρI)Λ^{1/2} is never formed: its square root comes from the SVD of the stacked
[W; √ρ·I]·Λ^{1/2}, by LAPACK's preconditioned Jacobi SVD (dgejsv; divide and conquer first from
``JACOBI_ONLY_MAX_N`` agents on), accurate to each singular value's own relative precision for a column-scaled matrix
like this one — where a slack agent's λ_i is O(ρ) and eigh(B) would give its P_ii from rounding alone. The iteration
stops when the spread of log p_i over the agents, ``stationarity`` = δ, is at rounding (≈ 1e-15): R_ρ is then the
exact minimiser of (P_ρ) for bounds in [b·e^{−δ}, b] (a backward error; the R reported is scaled to be feasible for b
itself). To first order a relative change ε of W moves R_ρ by at most κ·ε, κ = √(1 + (n/τ)²) the condition number of
[W; √ρ·I] (:attr:`DualSolution.tie_condition`), so two solves agree to ‖ΔR‖_F ≤ κ·(δ₁ + δ₂ + 2ε)·‖R‖_F. Measured
(tests/test_covariance_unique.py, benchmarks/exactness.py): under every OPENBLAS_CORETYPE an AVX-512 Xeon runs
(Prescott … SapphireRapids) the designs agree to ≤ 1.3e-14; a start perturbed by 1e-12 moves R by ≤ 1e-12; W
perturbed by 1e-12 moves it by ≤ 7e-11 where (P) has optima and ≤ 8.5e-7 where it has none (ER(6, 0.8, seed 1), whose
null(W) is shared by three interchangeable agents: a genuine sensitivity, linear in ε, within κ·2ε = 1.2e-5).
From ``TIE_MAX_N`` agents on a singular W keeps the former recovery, bit for bit (a precision floor τ on P(λ), after
the Newton path raises slack agents' precision to the bound): the tie-break's SVDs of the stacked 2n×n matrix would
cost 10–30× the whole solve there (one divide-and-conquer SVD took 300 s at n = 5000 on 2 cores; the Newton solve,
91 s, BENCHMARKS.md). Its R is then not guaranteed to be the same on every BLAS (an open limitation; at n = 1000 the
tie-break takes 2–18 s, bench_covariance.py --singular).
A non-singular W is solved exactly as before (its R bit for bit), unless its solution is beyond the eigh-based
iteration's arithmetic — min λ_i < ``ILL_LAMBDA_RTOL``·max λ_i = 1e-6, or R(λ) not finite (λ_min(M) = 2.6e-10·λ_max
with a nearly slack agent: before, the fixed point and Newton returned λ_max(R) = 6.73 and 7.52 there under one
OpenBLAS, and a non-finite R under another) — when it is re-solved by the same accurate Newton with ρ = 0: (P) is well
posed there, only its arithmetic was not (``singular`` stays False). No committed reproduction's W is affected (the
non-singular ER(20, p) graphs of the reproductions have min λ_i/max λ_i ≥ 1.9e-5).

``device`` (None: LAPACK through SciPy on the CPU) names a torch device ("cuda", "cuda:1", "cpu") on which the
eigendecompositions run (torch.linalg.eigh, float64, every one of them); everything else stays on the CPU. A CUDA device
that torch does not see is refused. A run with ``device = "cuda"`` builds its Whisper design inside
:func:`eigh_device`, so its Newton eigendecompositions (from 1000 agents) go to that GPU without the mechanism naming
one; below 1000 agents the fixed point keeps LAPACK everywhere (the same R on every machine). A singular W's
tie-break always runs on the CPU (LAPACK's Jacobi SVD has no GPU counterpart): the same R whatever the device.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.linalg.lapack import dpotrf

from privdl.covariance.dual_device import _device_for, check_device
from privdl.covariance.dual_linalg import SCIPY_MIN_N, _eig, _eigh, _scaled, _spd_inverse, _symmetrised
from privdl.covariance.dual_newton import _newton_step
from privdl.covariance.dual_solution import DualSolution
from privdl.covariance.dual_tiebreak import _solve_tiebreak
from privdl.covariance.problem import check_square
from privdl.errors import ValidationError

#: Singular-value test: W is treated as singular when λ_min(WᵀW) ≤ this × λ_max(WᵀW).
SINGULAR_RTOL = 1e-10
#: Default τ of the singular-W tie-break (P_ρ), ρ = (τ/n)²·λ_max(WᵀW): where (P) has no minimiser the objective is
#: within about τ of the infimum (see the module docstring).
DEFAULT_RIDGE = 1e-6
#: The tie-break runs below this n. From it on its SVDs of the stacked 2n×n matrix cost 10–30× the whole Newton solve
#: (one divide-and-conquer SVD took 300 s at n = 5000 on 2 cores, the Newton solve 91 s), and a singular W keeps the
#: former recovery there: a precision floor τ on the dual's P(λ), after raising slack agents' precision to the bound.
TIE_MAX_N = 2000
#: A non-singular W whose solution has min λ_i below this × max λ_i (or a non-finite R) is re-solved by the
#: tie-break's accurate Newton without regulariser. The committed reproductions' non-singular W have ≥ 1.9e-5.
ILL_LAMBDA_RTOL = 1e-6
#: The solver methods: "auto" (the default: Newton from NEWTON_MIN_N agents on, the fixed point below), Newton on the
#: dual's stationarity condition, and the original fixed point.
METHODS = ("auto", "newton", "fixed_point")
#: "auto" takes Newton from this n on. Below it the fixed point costs milliseconds to a second, and keeping it there
#: keeps every committed reproduction (all at n ≤ 300) on the exact covariance it was computed with: the two methods
#: certify the same gap, but their R differ at the 1e-7 level (the optimum is flat), enough to move a chaotic
#: trajectory's last printed digit.
NEWTON_MIN_N = 1000
#: From this n on, Newton's first eigendecomposition (λ = 1, a starting point only) runs in float32.
FLOAT32_EIGH_MIN_N = SCIPY_MIN_N
#: ... unless log p is flatter than this there (λ = 1 nearly optimal): then it is redone in float64 to certify it.
ROUGH_SPREAD = 1e-2
#: A Newton step whose deviation from its mean is larger than this many times the fixed point's (2 log p, from its
#: mean) is not trusted: N is then (nearly) singular, and the fixed point's step is taken instead.
MAX_STEP_RATIO = 20.0


def resolve_method(method: str, n: int) -> str:
    """The method that runs: "auto" is Newton from ``NEWTON_MIN_N`` agents on, the fixed point below."""
    if method not in METHODS:
        raise ValidationError(f"unknown dual method {method!r}: choose one of {', '.join(METHODS)}")
    if method == "auto":
        return "newton" if n >= NEWTON_MIN_N else "fixed_point"
    return method


def solve_dual(w: np.ndarray, *, tol: float = 1e-10, max_iter: int = 2000, ridge: float | None = None,
               method: str = "auto", device: str | None = None) -> DualSolution:
    """Solve (P) at b = 1 for mixing matrix ``w``; stop when the relative duality gap is ≤ ``tol``.

    Only M = WᵀW enters, so W need not be symmetric. For a singular W (λ_min(M) ≤ ``SINGULAR_RTOL``·λ_max(M)) of
    fewer than ``TIE_MAX_N`` agents the solution is the tie-break's: the unique minimiser of (P_ρ), Tr(W R Wᵀ) + ρ·Tr(R) under (P)'s constraints,
    ρ = (τ/n)²·λ_max(M), τ = ``ridge`` (default ``DEFAULT_RIDGE``), whatever ``method`` and ``device`` (module
    docstring): the least-trace optimum where (P) has optima, within about τ of the infimum where it has none; the
    duality gap reported is against (P)'s own dual, ``stationarity``, ``tie_gap`` and ``trace_weight`` (= ρ) say how
    tightly R_ρ is pinned, and :attr:`DualSolution.tie_condition` how far it may move.
    ``method``: "auto" (default: Newton from ``NEWTON_MIN_N`` agents on), "newton" or "fixed_point" (the original
    iteration); ``device``: see the module docstring.
    """
    method = resolve_method(method, np.shape(w)[0] if np.ndim(w) == 2 else 0)
    device = check_device(_device_for(method, device))
    if method == "fixed_point" and device is None:
        return _solve_fixed_point(w, tol=tol, max_iter=max_iter, ridge=ridge)
    return _solve(w, tol=tol, max_iter=max_iter, ridge=ridge, method=method, device=device)


def _singularity(r: np.ndarray, ridge: float | None, m: np.ndarray | None = None) -> tuple[bool, float]:
    """Whether W is singular (λ_min(M) ≤ SINGULAR_RTOL·λ_max(M), from M's spectrum r², or, given ``m``, by a Cholesky
    factorisation of M − SINGULAR_RTOL·λ_max·I when r is only a float32 spectrum), and the ridge τ to use."""
    top = float(r[-1] ** 2)
    if top <= 0:
        raise ValidationError("W is zero")
    if m is None:
        singular = float(r[0] ** 2) <= SINGULAR_RTOL * top
    else:
        shifted = m.copy()
        shifted[np.diag_indices(m.shape[0])] -= SINGULAR_RTOL * top
        singular = dpotrf(shifted.T, lower=0, clean=0, overwrite_a=1)[1] != 0
        del shifted
    tau = (DEFAULT_RIDGE if ridge is None else float(ridge)) if singular else 0.0
    if tau < 0:
        raise ValidationError(f"ridge must be >= 0, got {ridge}")
    if singular and tau == 0:
        raise ValidationError("W is singular: (P) has no minimiser; pass ridge > 0 to bound the variance on null(W)")
    return singular, tau


def _solve_fixed_point(w: np.ndarray, *, tol: float, max_iter: int, ridge: float | None) -> DualSolution:
    """The original solver, unchanged for non-singular W: λ ← λ·p^power, one np.linalg.eigh per iteration. A
    singular W goes to the tie-break (:func:`_solve_tiebreak`)."""
    start_time = time.perf_counter()
    w = check_square(w)
    n = w.shape[0]
    m = w.T @ w
    r, q = _eig(m)  # λ = 1: B = M; its spectrum also tells whether W is singular
    singular, tau = _singularity(r, ridge)
    if singular and n < TIE_MAX_N:  # (P) is ill posed: the tie-break (P_ρ) defines the design (module docstring)
        return _solve_tiebreak(w, m, tau, max_iter=max_iter, method="fixed_point",
                               seconds=time.perf_counter() - start_time)

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
    if singular:  # (from TIE_MAX_N agents on) the former recovery, unchanged
        prec = ((q * r) @ q.T) / s[:, None] / s[None, :]
        prec = 0.5 * (prec + prec.T)
        prec += tau * float(np.max(np.diag(prec))) * np.eye(n)
        prec /= float(np.max(np.diag(prec)))  # diag(P) ≤ 1 = b
        r_mat = np.linalg.inv(prec)
        r_mat = 0.5 * (r_mat + r_mat.T)
        true_primal = float(np.sum((w @ r_mat) * w))
        return DualSolution(r_mat, lam, true_primal, best_dual, it, time.perf_counter() - start_time, True, tau,
                            "fixed_point")
    p_max = float((((q * q) @ r) / lam).max())
    with np.errstate(divide="ignore", invalid="ignore"):
        r_mat = (s[:, None] * ((q / r) @ q.T) * s[None, :]) * p_max  # feasible at b = 1
    if _ill_conditioned(lam, r_mat):
        return _solve_tiebreak(w, m, 0.0, max_iter=max_iter, method="fixed_point",
                               seconds=time.perf_counter() - start_time)
    r_mat = 0.5 * (r_mat + r_mat.T)
    return DualSolution(r_mat, lam, primal, best_dual, it, time.perf_counter() - start_time, False, 0.0,
                        "fixed_point")


def _ill_conditioned(lam: np.ndarray, r_mat: np.ndarray) -> bool:
    """Whether a non-singular W's solution is beyond the eigh-based iteration: R(λ) not finite (B singular to working
    precision), or min λ_i < ``ILL_LAMBDA_RTOL``·max λ_i (an agent whose P_ii = h_i/λ_i comes from rounding). Such a
    W is re-solved accurately (:func:`_solve_tiebreak` with ρ = 0: its (P) is well posed, only the arithmetic was
    not)."""
    return not np.all(np.isfinite(r_mat)) or float(lam.min()) < ILL_LAMBDA_RTOL * float(lam.max())


def _solve(w: np.ndarray, *, tol: float, max_iter: int, ridge: float | None, method: str,
           device: str | None) -> DualSolution:
    start_time = time.perf_counter()
    w = check_square(w)
    n = w.shape[0]
    m = w.T @ w
    # λ = 1: B = M. Its spectrum also tells whether W is singular. For large n and Newton, this first one is only a
    # starting point, so it is computed in float32 (about half the time; p to ~1e-3, never used for the certificate)
    rough = method == "newton" and device is None and n >= FLOAT32_EIGH_MIN_N
    if rough:
        r, q = _eigh(m.astype(np.float32), None)
        singular, tau = _singularity(r, ridge, m)
    else:
        r, q = _eigh(m.copy(), device)
        singular, tau = _singularity(r, ridge)
    if singular and n < TIE_MAX_N:  # (P) is ill posed: the tie-break (P_ρ) defines the design (module docstring)
        return _solve_tiebreak(w, m, tau, max_iter=max_iter, method=method, seconds=time.perf_counter() - start_time)

    lam = np.ones(n)
    best = (np.inf, lam, r, q)  # (primal, λ, r, Q) of the best point seen
    best_dual = -np.inf
    power = 2.0  # the fixed point's exponent (1 after an overshoot)
    newton_from = 1 if method == "newton" else max_iter + 1  # Newton steps are tried from this iteration on
    failures = 0
    last: tuple | None = None  # (gap, dual, λ, p) where the last Newton step started
    it = 0
    for it in range(1, max_iter + 1):
        h = (q * q) @ r  # diag(B^{1/2})
        p = h / lam  # diag of the precision P(λ) = Λ^{-1/2} B^{1/2} Λ^{-1/2}
        trace_sqrt = float(r.sum())
        dual = trace_sqrt**2 / float(lam.sum())  # max_t g(tλ) ≥ g(λ): a lower bound on (P)
        primal = float(p.max()) * trace_sqrt
        if rough:  # (float32, λ = 1): a starting point only, not part of the certificate
            rough = False
            if np.ptp(np.log(p[p > 0])) < ROUGH_SPREAD:  # (nearly) optimal already: certify it in float64
                r, q = _eigh(m.copy(), None)
                continue
            q = q.astype(np.float64)
            h = (q * q) @ r
            p = h / lam
        else:
            if last is None and dual < best_dual - 1e-12 * abs(best_dual) and power > 1.0:
                power = 1.0  # the fixed point's accelerated step overshot: the plain multiplicative update from now on
            best_dual = max(best_dual, dual)
            if primal < best[0]:
                best = (primal, lam, r, q)
            if best[0] - best_dual <= tol * best[0]:
                break
        active = p > 0  # (p_i = 0: agent i's column of W is zero, no noise reaches it; λ_i → 0 as below)
        log_p = np.log(np.where(active, p, 1.0))
        gap = 1.0 - dual / primal
        if last is not None and not (gap < last[0] or dual > last[1] + 1e-13 * abs(last[1])):
            # the Newton step neither lowered the gap nor raised the dual: take the fixed point's step from where it
            # started instead, and try Newton again only after 2, 4, 8, ... fixed-point steps
            failures += 1
            newton_from = it + 2**failures
            lam = np.maximum(last[2] * last[3] ** power, 1e-300)
            last = None
        elif it >= newton_from:
            spread = float(np.ptp(log_p[active]))
            step = _newton_step(r, q, h, log_p, active, spread, tol)
            mean_step = float(np.average(step[active], weights=h[active]))
            mean_log_p = float(np.average(log_p[active], weights=h[active]))
            if np.all(np.isfinite(step)) and np.max(np.abs(step[active] - mean_step)) <= MAX_STEP_RATIO * 2.0 * float(
                    np.max(np.abs(log_p[active] - mean_log_p))):
                step[~active] = -np.inf
                last = (gap, dual, lam, p)
                lam = np.maximum(lam * np.exp(step), 1e-300)
            else:  # N is (nearly) singular here (e.g. p flat up to rounding): the fixed point's step
                failures += 1
                newton_from = it + 2**failures
                last = None
                lam = np.maximum(lam * p**power, 1e-300)
        else:
            last = None
            lam = np.maximum(lam * p**power, 1e-300)
        r, q = _eigh(_scaled(m, np.sqrt(lam)), device)

    primal, lam, r, q = best
    best = None
    s = np.sqrt(lam)
    if singular:  # (from TIE_MAX_N agents on) the former recovery, unchanged
        prec = (q * r) @ q.T
        del q
        prec /= s[:, None]
        prec /= s[None, :]
        prec = _symmetrised(prec)
        diagonal = np.diag_indices(n)
        prec /= float(np.max(prec[diagonal]))  # diag(P) ≤ 1 = b
        # Agents with slack (P_ii < 1: their constraint is not tight, e.g. λ_i → 0) take precision up to the bound: the
        # precision only grows (so R and Tr(W R Wᵀ) only shrink) and stays feasible; where such an agent covers a
        # direction of null(W), that direction gets a moderate variance instead of the floor's ~1/τ
        prec[diagonal] = np.maximum(prec[diagonal], 1.0)
        prec[diagonal] += tau
        prec /= 1.0 + tau
        r_mat = _spd_inverse(prec)
        del prec
        true_primal = float(np.einsum("ij,ij->", r_mat, m))  # Tr(W R Wᵀ) = Σ_ij R_ij M_ij
        return DualSolution(r_mat, lam, true_primal, best_dual, it, time.perf_counter() - start_time, True, tau,
                            method)
    p_max = float((((q * q) @ r) / lam).max())
    with np.errstate(divide="ignore", invalid="ignore"):
        r_mat = (q / r) @ q.T
    if _ill_conditioned(lam, r_mat):
        return _solve_tiebreak(w, m, 0.0, max_iter=max_iter, method=method, seconds=time.perf_counter() - start_time)
    r_mat *= s[:, None]
    r_mat *= s[None, :] * p_max  # feasible at b = 1
    r_mat = _symmetrised(r_mat)
    return DualSolution(r_mat, lam, primal, best_dual, it, time.perf_counter() - start_time, False, 0.0, method)


_CACHE: dict[tuple[str, float, float | None, str, str | None], DualSolution] = {}
_CACHE_LIMIT = 64


def solve_dual_cached(w: np.ndarray, *, tol: float = 1e-10, ridge: float | None = None, method: str = "auto",
                      device: str | None = None) -> DualSolution:
    """:func:`solve_dual`, solved once per (W, tol, ridge, method) in this process (homogeneity makes b irrelevant;
    the device changes where the work runs, not the solution)."""
    from privdl.network.edges import fingerprint  # (here: the solver itself needs NumPy and SciPy only, no torch)

    method = resolve_method(method, np.shape(w)[0] if np.ndim(w) == 2 else 0)
    device = check_device(_device_for(method, device))
    key = (fingerprint(w), float(tol), ridge, method, device)  # (another eigensolver: other rounding)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        hit = _CACHE[key] = solve_dual(w, tol=tol, ridge=ridge, method=method, device=device)
    return hit
