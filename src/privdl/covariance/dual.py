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

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from scipy.linalg.blas import get_blas_funcs
from scipy.linalg.lapack import dgejsv, dpotrf, dpotri

from privdl.covariance.problem import check_square
from privdl.errors import ValidationError

#: Singular-value test: W is treated as singular when λ_min(WᵀW) ≤ this × λ_max(WᵀW).
SINGULAR_RTOL = 1e-10
#: Default τ of the singular-W tie-break (P_ρ), ρ = (τ/n)²·λ_max(WᵀW): where (P) has no minimiser the objective is
#: within about τ of the infimum (see the module docstring).
DEFAULT_RIDGE = 1e-6
#: The tie-break's Newton iteration stops once the spread of log p (its backward error δ in the bounds) is below this,
#: or when ``3·TIE_STALL`` steps in a row have not lowered it (rounding reached).
TIE_STATIONARITY = 1e-14
TIE_STALL = 4
#: Below this n every SVD of the tie-break is the Jacobi one (dgejsv; milliseconds there); from it on the iteration
#: starts with divide-and-conquer SVDs (3–4× faster) and polishes with Jacobi once those stop improving.
JACOBI_ONLY_MAX_N = 300
#: The divide-and-conquer phase hands over to Jacobi once the spread of log p is below this.
TIE_FAST_SPREAD = 1e-6
#: The tie-break runs below this n. From it on its SVDs of the stacked 2n×n matrix cost 10–30× the whole Newton solve
#: (one divide-and-conquer SVD took 300 s at n = 5000 on 2 cores, the Newton solve 91 s), and a singular W keeps the
#: former recovery there: a precision floor τ on the dual's P(λ), after raising slack agents' precision to the bound.
TIE_MAX_N = 2000
#: A non-singular W whose solution has min λ_i below this × max λ_i (or a non-finite R) is re-solved by the
#: tie-break's accurate Newton without regulariser. The committed reproductions' non-singular W have ≥ 1.9e-5.
ILL_LAMBDA_RTOL = 1e-6
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
#: The solver methods: "auto" (the default: Newton from NEWTON_MIN_N agents on, the fixed point below), Newton on the
#: dual's stationarity condition, and the original fixed point.
METHODS = ("auto", "newton", "fixed_point")
#: "auto" takes Newton from this n on. Below it the fixed point costs milliseconds to a second, and keeping it there
#: keeps every committed reproduction (all at n ≤ 300) on the exact covariance it was computed with: the two methods
#: certify the same gap, but their R differ at the 1e-7 level (the optimum is flat), enough to move a chaotic
#: trajectory's last printed digit.
NEWTON_MIN_N = 1000
#: From this n on, LAPACK and BLAS calls go through SciPy (in-place eigendecomposition, symmetric rank-k updates,
#: Cholesky inverse); below it through NumPy only: the two ship separate OpenBLAS builds, whose thread pools slow
#: each other down badly on small matrices when calls alternate.
SCIPY_MIN_N = 3000
#: From this n on, the Newton step's matrix products run in float32 (the step only, never the certificate).
FLOAT32_MIN_N = 256
#: From this n on, Newton's first eigendecomposition (λ = 1, a starting point only) runs in float32.
FLOAT32_EIGH_MIN_N = SCIPY_MIN_N
#: ... unless log p is flatter than this there (λ = 1 nearly optimal): then it is redone in float64 to certify it.
ROUGH_SPREAD = 1e-2
#: At most this many conjugate-gradient products N·v per Newton step.
MAX_CG = 10
#: A Newton step whose deviation from its mean is larger than this many times the fixed point's (2 log p, from its
#: mean) is not trusted: N is then (nearly) singular, and the fixed point's step is taken instead.
MAX_STEP_RATIO = 20.0
#: CG stops when the predicted spread of log p after the step is below TARGET_C·spread² (or 0.2·tol).
TARGET_C = 0.02


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


#: The device a run asked for (``device = "cuda"``): the eigendecompositions of the designs it builds go there when
#: the caller names none (set by :func:`eigh_device` around a run's mechanism; None: LAPACK on the CPU).
_RUN_DEVICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("privdl_eigh_device", default=None)


@contextlib.contextmanager
def eigh_device(run_device: str | None) -> Iterator[None]:
    """Inside this block, designs solved without a ``device`` put their eigendecompositions on the run's GPU when
    ``run_device`` is one ("cuda", "cuda:1", or "auto" where torch sees one); on the CPU they stay with LAPACK."""
    token = _RUN_DEVICE.set(gpu_of(run_device))
    try:
        yield
    finally:
        _RUN_DEVICE.reset(token)


def _device_for(method: str, device: str | None) -> str | None:
    """The device the eigendecompositions use: the one named, else — for Newton only — the run's GPU. The fixed
    point (below NEWTON_MIN_N agents) keeps its original LAPACK path on every machine, so a run's design, and with
    it its noise, is the same on a GPU as on the CPU (a singular W's recovery differs between the two paths)."""
    if device is not None:
        return device
    return _RUN_DEVICE.get() if method == "newton" else None


def gpu_of(run_device: str | None) -> str | None:
    """The CUDA device a run's ``device`` names (``"auto"``: cuda where torch sees one), or None."""
    if run_device is None:
        return None
    run_device = str(run_device)
    if run_device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else None
    return run_device if run_device.startswith("cuda") else None


def check_device(device: str | None) -> str | None:
    """None (NumPy/SciPy LAPACK) or a torch device string, resolved as a run's ``device`` is ("auto": cuda where torch
    sees one; a CUDA device torch does not see is refused)."""
    if device is None:
        return None
    from privdl.device import resolve_device  # (torch only once a device is named)

    try:
        dev = resolve_device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValidationError(f"device {device!r} is not a torch device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValidationError(f"device {device!r}: the eigendecompositions run on 'cpu' or 'cuda' only")
    return str(dev)


def _eig(b_mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The original solver's eigendecomposition (kept verbatim for ``method="fixed_point"``)."""
    mu, q = np.linalg.eigh(b_mat)
    return np.sqrt(np.clip(mu, 0.0, None)), q


def _scaled(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """B = diag(s) M diag(s), in one new array."""
    b_mat = np.multiply(m, s[:, None])
    b_mat *= s[None, :]
    return b_mat


def _eigh(b_mat: np.ndarray, device: str | None) -> tuple[np.ndarray, np.ndarray]:
    """√eigenvalues (ascending, clipped at 0) and eigenvectors of the symmetric ``b_mat``, which may be overwritten."""
    if device is None and b_mat.shape[0] < SCIPY_MIN_N:
        mu, q = np.linalg.eigh(b_mat)
    elif device is None:  # (b_mat.T: the same symmetric matrix in Fortran order, so LAPACK works in place, no copy)
        mu, q = scipy.linalg.eigh(b_mat.T, overwrite_a=True, check_finite=False, driver="evd")
    else:
        import torch

        mu_t, q_t = torch.linalg.eigh(torch.from_numpy(b_mat).to(device))
        mu, q = mu_t.cpu().numpy(), q_t.cpu().numpy()
    return np.sqrt(np.clip(mu, 0.0, None)), q


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


class _Hessian:
    """N = Σ_kl (Q_ik Q_jk)(Q_il Q_jl)·K_kl, K_kl = r_k r_l/(r_k + r_l), in B's eigenbasis (see the module docstring):
    products N·v and the preconditioner (diag(N) + c cᵀ/Σc)⁻¹, c = h/2 − diag(N) the off-diagonal row sums.

    diag(N) comes without an n³ product: K_kl = r_k r_l ∫ e^{−t(r_k + r_l)} dt, so diag(N)_i is
    ∫ ([Q∘Q]·(r e^{−tr}))_i² dt, an integral over log t that the trapezoid rule (step 1/2) gets to ~1e-7 with a few
    dozen nodes."""

    def __init__(self, r: np.ndarray, q: np.ndarray, h: np.ndarray, active: np.ndarray,
                 dtype: type | None = None) -> None:
        n = r.size
        self.dtype = dtype or (np.float32 if n >= FLOAT32_MIN_N else np.float64)
        self.r = np.asarray(r, dtype=np.float64)
        self.q = np.ascontiguousarray(q, dtype=self.dtype)
        self._k: np.ndarray | None = None
        d = self._diagonal()
        self.active = active
        self.d = np.where(active & (d > 0), d, 1.0)
        self.c = np.where(active, np.clip(0.5 * h - d, 0.0, None), 0.0)
        self.c_sum = float(self.c.sum())
        self.z = self.c / self.d
        self.denominator = self.c_sum + float(self.c @ self.z)

    def _diagonal(self) -> np.ndarray:
        r = self.r
        positive = r[r > 0]
        if positive.size == 0:
            return np.zeros(r.size)
        top = float(positive.max())
        floor = max(float(positive.min()), 1e-8 * top)  # (pairs below add < 1e-8 of a diagonal entry)
        step = 0.5
        log_t = np.arange(np.log(1e-6 / (2 * top)), np.log(40.0 / (2 * floor)) + step, step)
        t = np.exp(log_t)
        nodes = (r[:, None] * np.exp(-np.outer(r, t))).astype(self.dtype)  # r e^{−t r}, one column per node
        g = ((self.q * self.q) @ nodes).astype(np.float64)
        return (g * g) @ (step * t)

    @property
    def k(self) -> np.ndarray:
        if self._k is None:
            rs = self.r.astype(self.dtype)
            k = np.add.outer(rs, rs)
            np.divide(np.multiply.outer(rs, rs), k, out=k, where=k > 0)  # r_k r_l/(r_k + r_l); 0 where both are 0
            self._k = k
        return self._k

    def matvec(self, v: np.ndarray) -> np.ndarray:
        x = _gram(self.q, v.astype(self.dtype))  # Qᵀ diag(v) Q
        x *= self.k
        y = self.q @ x
        y *= self.q
        out = y.sum(axis=1, dtype=np.float64)  # diag(Q (K ∘ Qᵀ diag(v) Q) Qᵀ)
        out[~self.active] = 0.0
        return out

    def precondition(self, v: np.ndarray) -> np.ndarray:
        y = np.where(self.active, v / self.d, 0.0)
        if self.c_sum > 0:
            y -= self.z * (float(self.c @ y) / self.denominator)
        return y


def _gram(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Qᵀ diag(v) Q = A₊ᵀA₊ − A₋ᵀA₋ (A± the rows of Q where ±v > 0, scaled by √|v|): two symmetric rank-k updates,
    half the work of a general product, one triangle then mirrored."""
    n = q.shape[1]
    if n < SCIPY_MIN_N:
        return (q * v[:, None]).T @ q
    syrk = get_blas_funcs("syrk", dtype=q.dtype)
    out = None
    for sign, rows in ((1.0, v > 0), (-1.0, v < 0)):
        if not rows.any():
            continue
        a = q[rows] * np.sqrt(np.abs(v[rows]))[:, None]  # C order: a.T is the Fortran matrix syrk wants
        if out is None:
            out = syrk(sign, a.T, trans=0, lower=1)  # Fortran n×n, lower triangle of AᵀA
        else:
            out = syrk(sign, a.T, beta=1.0, c=out, trans=0, lower=1, overwrite_c=1)
    if out is None:
        return np.zeros((n, n), dtype=q.dtype)
    return _mirror_upper(out.T, 512)  # (C order: the valid triangle is now the upper one)


def _mirror_upper(a: np.ndarray, block: int) -> np.ndarray:
    """Copy the upper triangle of square ``a`` onto its lower one, in place, tile by tile (no n×n temporary)."""
    n = a.shape[0]
    for i in range(0, n, block):
        for j in range(i, n, block):
            if i == j:
                tile = a[i:i + block, i:i + block]
                tile[...] = np.triu(tile) + np.triu(tile, 1).T
            else:
                a[j:j + block, i:i + block] = a[i:i + block, j:j + block].T
    return a


def _newton_step(r: np.ndarray, q: np.ndarray, h: np.ndarray, log_p: np.ndarray, active: np.ndarray,
                 spread: float, tol: float, dtype: type | None = None, max_cg: int = MAX_CG) -> np.ndarray:
    """Δ log λ: N Δx = h ∘ log p by preconditioned conjugate gradients.

    After a step Δx, log p is h⁻¹ ∘ (h ∘ log p − N Δx) to first order: the residual over h predicts the next
    point's spread of log p (max − min, an upper bound on its relative gap to first order). CG stops once that
    prediction is below what Newton's own second-order error leaves anyway (~ spread²), or below ``tol``."""
    hess = _Hessian(r, q, h, active, dtype)
    target = max(0.2 * tol, TARGET_C * spread * spread)

    def predicted_spread(res: np.ndarray) -> float:
        u = res[active] / h[active]
        return float(np.max(u) - np.min(u))

    rhs = np.where(active, h * log_p, 0.0)
    x = np.zeros_like(rhs)
    res = rhs.copy()
    z = hess.precondition(res)
    direction = z.copy()
    rz = float(res @ z)
    for _ in range(min(max_cg, int(active.sum()) + 1)):
        if not rz > 0:
            break
        a_dir = hess.matvec(direction)
        curvature = float(direction @ a_dir)
        if not curvature > 0:
            break
        alpha = rz / curvature
        x += alpha * direction
        res -= alpha * a_dir
        if predicted_spread(res) <= target:
            break
        z = hess.precondition(res)
        rz_new = float(res @ z)
        direction = z + (rz_new / rz) * direction
        rz = rz_new
    if not np.any(x):
        x = hess.precondition(rhs)
    return x


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
    """N of the module docstring as a dense matrix, Σ_kl K_kl (q_k∘q_l)(q_k∘q_l)ᵀ with K_kl = r_k r_l/(r_k + r_l): one
    product over the n² pairs of eigenvectors (O(n⁴): for the tie-break's small n only)."""
    n = r.size
    k = np.add.outer(r, r)
    np.divide(np.multiply.outer(r, r), k, out=k, where=k > 0)
    k[~(np.add.outer(r, r) > 0)] = 0.0
    z = (q[:, :, None] * q[:, None, :]).reshape(n, n * n)
    return (z * k.reshape(-1)) @ z.T


def _solve_tiebreak(w: np.ndarray, m: np.ndarray, tau: float, *, max_iter: int, method: str,
                    seconds: float = 0.0, start: np.ndarray | None = None) -> DualSolution:
    """The design of a singular W: the minimiser R_ρ of (P_ρ), ρ = (τ/n)²·λ_max(M) (module docstring), at b = 1.
    ``tau`` = 0: ρ = 0, the accurate solve of a non-singular but ill-conditioned W's (P) itself (:func:`_ill_conditioned`).

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


def _symmetrised(a: np.ndarray) -> np.ndarray:
    """(A + Aᵀ)/2, in place (block by block: no n×n temporary)."""
    n, step = a.shape[0], 256
    for i in range(0, n, step):
        for j in range(i, n, step):
            upper = a[i:i + step, j:j + step]
            lower = a[j:j + step, i:i + step]
            mean = 0.5 * (upper + lower.T)
            upper[...] = mean
            lower[...] = mean.T
    return a


def _spd_inverse(a: np.ndarray) -> np.ndarray:
    """A⁻¹ for symmetric positive definite A (Cholesky: half the work of an LU inverse), overwriting A."""
    if a.shape[0] < SCIPY_MIN_N:
        return _symmetrised(np.linalg.inv(a))
    chol, info = dpotrf(a.T, lower=0, clean=1, overwrite_a=1)  # (a.T: Fortran order, in place)
    if info == 0:
        inv, info = dpotri(chol, lower=0, overwrite_c=1)
    if info != 0:  # (``a`` is overwritten by now: no fallback on it. A precision that is not positive definite
        # would give an R that is not a covariance: say so rather than invert what is left)
        raise ValidationError(f"the recovered precision matrix (n = {a.shape[0]}) is not positive definite to "
                              f"working precision (LAPACK info {info}); try a larger ridge")
    inv = _mirror_upper(inv, 256)  # dpotri fills one triangle: mirror it
    return inv.T if not inv.flags.c_contiguous else inv  # (symmetric: the transpose is the same matrix)


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
