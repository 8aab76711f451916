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
fingerprint of W. A singular W (complete graph, some rings, many dense ER graphs) has no minimiser: noise in
null(W) is free, so the infimum is approached only as those variances grow without bound. The dual needs no change
(its supremum is the infimum); the primal is recovered with a small floor τ on the precision, which bounds the
variance on null(W), and the result says so (``singular``, ``ridge`` = τ) with its certified gap. The Newton path's
recovery first raises the precision of agents with slack (P_ii below the bound, e.g. λ_i → 0) to the bound: the
precision only grows, so R and its objective only shrink and stay feasible, and a null direction that such an agent
covers gets a moderate variance instead of ~1/τ.

``device`` (None: LAPACK through SciPy on the CPU) names a torch device ("cuda", "cuda:1", "cpu") on which the
eigendecompositions run (torch.linalg.eigh, float64, every one of them); everything else stays on the CPU. A CUDA device
that torch does not see is refused. A run with ``device = "cuda"`` builds its Whisper design inside
:func:`eigh_device`, so its Newton eigendecompositions (from 1000 agents) go to that GPU without the mechanism naming
one; below 1000 agents the fixed point keeps LAPACK everywhere (the same R on every machine).
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
from scipy.linalg.lapack import dpotrf, dpotri

from privdl.covariance.problem import check_square
from privdl.errors import ValidationError
from privdl.network.edges import fingerprint

#: Singular-value test: W is treated as singular when λ_min(WᵀW) ≤ this × λ_max(WᵀW).
SINGULAR_RTOL = 1e-10
#: Default precision floor τ for singular W (relative to max_i P_ii): objective within ~τ of the infimum.
DEFAULT_RIDGE = 1e-6
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
    ridge: float  # absolute ridge ρ used (0 when W is nonsingular)
    method: str = "fixed_point"

    @property
    def gap(self) -> float:
        return max(0.0, self.primal - self.dual)


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
    from privdl.simulator.engine import resolve_device  # (here: the simulator's mechanisms import this module)

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

    Only M = WᵀW enters, so W need not be symmetric. For singular W the dual iteration is unchanged (it needs only
    B^{1/2}), and the primal is recovered from the precision P(λ) + τ·max_i P_ii·I, τ = ``ridge`` (default
    ``DEFAULT_RIDGE``; Newton's recovery first raises slack agents' precision to the bound): the variance on
    null(W) is then at most about 1/τ times the LDP variance and the objective lies within about τ (relative) of the
    infimum; the duality gap reported is against the true problem's dual.
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
    """The original solver, unchanged: λ ← λ·p^power, one np.linalg.eigh per iteration."""
    start = time.perf_counter()
    w = check_square(w)
    n = w.shape[0]
    m = w.T @ w
    r, q = _eig(m)  # λ = 1: B = M; its spectrum also tells whether W is singular
    singular, tau = _singularity(r, ridge)

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
        return DualSolution(r_mat, lam, primal, best_dual, it, time.perf_counter() - start, False, 0.0,
                            "fixed_point")
    prec = ((q * r) @ q.T) / s[:, None] / s[None, :]
    prec = 0.5 * (prec + prec.T)
    prec += tau * float(np.max(np.diag(prec))) * np.eye(n)
    prec /= float(np.max(np.diag(prec)))  # diag(P) ≤ 1 = b
    r_mat = np.linalg.inv(prec)
    r_mat = 0.5 * (r_mat + r_mat.T)
    true_primal = float(np.sum((w @ r_mat) * w))
    return DualSolution(r_mat, lam, true_primal, best_dual, it, time.perf_counter() - start, True, tau,
                        "fixed_point")


class _Hessian:
    """N = Σ_kl (Q_ik Q_jk)(Q_il Q_jl)·K_kl, K_kl = r_k r_l/(r_k + r_l), in B's eigenbasis (see the module docstring):
    products N·v and the preconditioner (diag(N) + c cᵀ/Σc)⁻¹, c = h/2 − diag(N) the off-diagonal row sums.

    diag(N) comes without an n³ product: K_kl = r_k r_l ∫ e^{−t(r_k + r_l)} dt, so diag(N)_i is
    ∫ ([Q∘Q]·(r e^{−tr}))_i² dt, an integral over log t that the trapezoid rule (step 1/2) gets to ~1e-7 with a few
    dozen nodes."""

    def __init__(self, r: np.ndarray, q: np.ndarray, h: np.ndarray, active: np.ndarray) -> None:
        n = r.size
        self.dtype = np.float32 if n >= FLOAT32_MIN_N else np.float64
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
                 spread: float, tol: float) -> np.ndarray:
    """Δ log λ: N Δx = h ∘ log p by preconditioned conjugate gradients.

    After a step Δx, log p is h⁻¹ ∘ (h ∘ log p − N Δx) to first order: the residual over h predicts the next
    point's spread of log p (max − min, an upper bound on its relative gap to first order). CG stops once that
    prediction is below what Newton's own second-order error leaves anyway (~ spread²), or below ``tol``."""
    hess = _Hessian(r, q, h, active)
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
    for _ in range(min(MAX_CG, int(active.sum()) + 1)):
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
    start = time.perf_counter()
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
    if not singular:
        p_max = float((((q * q) @ r) / lam).max())
        r_mat = (q / r) @ q.T
        r_mat *= s[:, None]
        r_mat *= s[None, :] * p_max  # feasible at b = 1
        r_mat = _symmetrised(r_mat)
        return DualSolution(r_mat, lam, primal, best_dual, it, time.perf_counter() - start, False, 0.0, method)
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
    return DualSolution(r_mat, lam, true_primal, best_dual, it, time.perf_counter() - start, True, tau, method)


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
    method = resolve_method(method, np.shape(w)[0] if np.ndim(w) == 2 else 0)
    device = check_device(_device_for(method, device))
    key = (fingerprint(w), float(tol), ridge, method, device)  # (another eigensolver: other rounding)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        hit = _CACHE[key] = solve_dual(w, tol=tol, ridge=ridge, method=method, device=device)
    return hit
