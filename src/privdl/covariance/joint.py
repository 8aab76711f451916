"""Mixing weights and noise covariance designed together (issue 46, item 3; seed 000's conclusion).

Problem (P) fixes W and chooses R. Here W is chosen too, among the symmetric doubly stochastic matrices on the
graph's edges,

    W(w) = I − Σ_e w_e (e_i − e_j)(e_i − e_j)ᵀ,   w_e ≥ 0,   W_ii = 1 − Σ_{j~i} w_ij ≥ 0,

with the spectral gap 1 − SLEM(W) = 1 − ‖W − 11ᵀ/n‖₂ (privdl's :attr:`Network.spectral_gap`) at least γ, by default
the gap of the Metropolis–Hastings weights on the same graph:

    minimise_{w, R}  Tr(W(w) R W(w))   subject to   R ≻ 0,  [R⁻¹]_ii ≤ b,  w in the set above.          (J)

**Why alternating works.** For a fixed W, (P)'s optimum is OPT(W) = max_λ (Σ σ(W Λ^{1/2}))²/(b·Σλ) (the dual of
:mod:`privdl.covariance.dual` at its best scaling): a maximum of convex functions of W, so OPT is convex in w and (J)
is the convex problem min_w OPT(W(w)) over a convex set (the spectral constraint ‖W − 11ᵀ/n‖₂ ≤ 1 − γ is a norm
bound, and ±(W − 11ᵀ/n) ≼ (1 − γ)I are linear matrix inequalities in w). The bilinear form is solved by alternating:

- **R-step:** the existing dual solver at the current W (:func:`privdl.covariance.designs.whisper_design`), with its
  duality-gap certificate. R is feasible for every W (the privacy constraint does not involve W).
- **W-step:** at fixed R, Tr(W R W) is a convex quadratic in w (gradient −2·(e_i − e_j)ᵀ R W (e_i − e_j) per edge);
  it is minimised by a log-barrier method: Newton's method on t·Tr(W R W) − log det((1−γ)I − (W − J)) −
  log det((1−γ)I + (W − J)) − Σ log w_e − Σ log W_ii (J = 11ᵀ/n), the Newton system solved densely up to
  ``DENSE_MAX_EDGES`` edges and by preconditioned conjugate gradients above (Hessian-vector products from two n×n
  matrix products), t raised ×``BARRIER_FACTOR`` until the barrier's bound (number of constraints)/t on the W-step's
  suboptimality is below ``W_STEP_RTOL`` of the objective. Every iterate is strictly feasible (checked by an
  eigendecomposition and the signs of w and W_ii).

Each step can only lower the objective: the W-step lowers Tr(W R W) at the R in hand (a W-step that does not is
rejected), and R stays feasible, so the next R-step's optimum is at most that. Since the start is the
Metropolis–Hastings W (after the phase-I move below, which is only a start for the barrier: the objective is compared
with MH's own), the result is never worse than MH + optimal R; :func:`design_joint` checks it and falls back to MH
otherwise. Fixed points of the alternation satisfy the first-order condition of the convex min_w OPT(W(w)) (by
Danskin's theorem, ∇OPT = ∇_w Tr(W R* W) at the R-step's R*), so where R* is unique they are global optima; the
alternation stops when an outer iteration lowers the objective by less than ``OUTER_RTOL`` relative, or when the
next one would end after ``TIME_LIMIT`` seconds (then the best W so far, with a ``joint_note`` saying so).

**Phase I.** The barrier needs a start strictly inside the spectral constraint; with the default γ = MH's own gap,
MH lies on its boundary. A few gradient steps on a smooth upper bound of the SLEM (log-sum-exp of ±W's eigenvalues)
from MH find a W with a strictly larger gap; if none is found (MH is already the fastest-mixing chain on the graph, up
to the search), the design is MH itself.

The optimal W does not depend on b ((P) is homogeneous: R*(b) = R*(1)/b), so (J) is solved at b = 1 and cached per
graph and γ.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import scipy.sparse as sps

from privdl.covariance.designs import whisper_design
from privdl.covariance.problem import CovarianceDesign, check_bound, check_square, noise_trace, require_symmetric
from privdl.errors import ValidationError

#: Up to this many edges the W-step's Newton system is formed and solved densely; above, conjugate gradients.
DENSE_MAX_EDGES = 600
#: The barrier parameter's factor per stage.
BARRIER_FACTOR = 8.0
#: The W-step stops when (number of constraints)/t, a bound on its suboptimality, is below this fraction of f.
W_STEP_RTOL = 1e-7
#: ... and this for the first W-step (later ones: 1% of the last outer improvement, down to ``W_STEP_RTOL``: an
#: inexact W-step still lowers the objective, and the early ones need not be exact).
W_STEP_RTOL_FIRST = 1e-3
#: The alternation stops when an outer iteration lowers the objective by less than this, relatively.
OUTER_RTOL = 1e-3
#: At most this many alternations.
MAX_OUTER = 30
#: No new alternation starts once the next one would end after this many seconds (the result is the best so far:
#: every alternation lowers the objective); at n = 200 on dense graphs each alternation takes several seconds.
TIME_LIMIT = 40.0
#: Newton iterations per barrier stage, at most.
MAX_NEWTON = 60
#: Newton's method stops when the Newton decrement λ²/2 (an affine-invariant bound on the distance to the centre)
#: is below this.
NEWTON_TOL = 1e-7
#: Phase I: gradient steps on the smooth SLEM bound, at most.
PHASE1_STEPS = 200


@dataclass
class JointDesign:
    """W and R designed together: ``W`` the mixing matrix, ``design`` the Whisper covariance at that W (the R-step's
    certificate holds there), and the facts the CLI reports."""

    W: np.ndarray
    design: CovarianceDesign
    objective: float
    objective_fixed_mixing: float
    spectral_gap: float
    spectral_gap_fixed_mixing: float
    min_spectral_gap: float
    fixed_design: CovarianceDesign
    outer_iterations: int = 0
    history: list = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""

    def summary(self) -> dict[str, object]:
        out = self.design.summary()
        out.update({
            "design": "whisper, optimized mixing", "objective": self.objective,
            "objective_fixed_mixing": self.objective_fixed_mixing,
            "objective_ratio": self.objective / self.objective_fixed_mixing,
            "spectral_gap": self.spectral_gap, "spectral_gap_fixed_mixing": self.spectral_gap_fixed_mixing,
            "min_spectral_gap": self.min_spectral_gap, "spectral_gap_definition": "1 - SLEM(W)",
            "fixed_mixing": "metropolis_hastings", "joint_iterations": self.outer_iterations,
            "joint_seconds": self.seconds, "trace_ldp_fixed_mixing": self.fixed_design.trace_ldp,
        })
        if self.note:
            out["joint_note"] = self.note
        return out


class EdgeWeights:
    """The graph's undirected edges e = (i, j), i < j, and the maps between edge weights w and W(w)."""

    def __init__(self, support: np.ndarray) -> None:
        a = np.asarray(support) != 0
        np.fill_diagonal(a, False)
        self.n = a.shape[0]
        self.i, self.j = np.nonzero(np.triu(a, 1))
        self.m = self.i.size
        rows = np.concatenate([np.arange(self.m), np.arange(self.m)])
        self.incidence = sps.csr_array((np.ones(2 * self.m), (np.concatenate([self.i, self.j]), rows)),
                                       shape=(self.n, self.m))  # S: node × edge, unsigned

    def laplacian(self, w: np.ndarray) -> np.ndarray:
        lap = np.zeros((self.n, self.n))
        lap[self.i, self.j] = -w
        lap[self.j, self.i] = -w
        lap[np.diag_indices(self.n)] = self.degrees(w)
        return lap

    def sparse_laplacian(self, v: np.ndarray) -> sps.csr_array:
        i, j, n = self.i, self.j, self.n
        deg = self.degrees(v)
        return sps.csr_array((np.concatenate([-v, -v, deg]),
                              (np.concatenate([i, j, np.arange(n)]), np.concatenate([j, i, np.arange(n)]))),
                             shape=(n, n))

    def mixing(self, w: np.ndarray) -> np.ndarray:
        out = -self.laplacian(w)
        out[np.diag_indices(self.n)] += 1.0
        return out

    def degrees(self, w: np.ndarray) -> np.ndarray:
        return self.incidence @ w

    def weights_of(self, w_mat: np.ndarray) -> np.ndarray:
        return np.asarray(w_mat)[self.i, self.j].astype(np.float64)

    def quad(self, z: np.ndarray) -> np.ndarray:
        """(e_i − e_j)ᵀ Z (e_i − e_j) for every edge."""
        i, j = self.i, self.j
        return z[i, i] + z[j, j] - z[i, j] - z[j, i]

    def gram(self, z: np.ndarray) -> np.ndarray:
        """The m×m matrix [(e_i − e_j)ᵀ Z (e_k − e_l)] over pairs of edges (symmetric Z)."""
        i, j = self.i, self.j
        zi, zj = z[i], z[j]
        return zi[:, i] + zj[:, j] - zi[:, j] - zj[:, i]


def spectral_gap(w: np.ndarray) -> float:
    """1 − SLEM(W), the definition of :attr:`privdl.network.Network.spectral_gap`."""
    from privdl.network.validation import slem

    return 1.0 - slem(np.asarray(w, dtype=np.float64))


def metropolis_hastings_on(support: np.ndarray) -> np.ndarray:
    """The Metropolis–Hastings weights on the support graph of ``support`` (the fixed-mixing reference)."""
    a = (np.asarray(support) != 0).astype(np.float64)
    np.fill_diagonal(a, 0.0)
    deg = a.sum(axis=1)
    w = a / (1.0 + np.maximum(deg[:, None], deg[None, :]))
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


# ---------------------------------------------------------------------------------------------------------------
# the W-step: min_w Tr(W R W) under the spectral and sign constraints, by a log-barrier method


class _Barrier:
    """t·f(w) + φ(w) at one point: f = Tr(W R W), φ the log barrier of the feasible set (module docstring)."""

    def __init__(self, edges: EdgeWeights, r: np.ndarray, gamma: float) -> None:
        self.e, self.r, self.gamma = edges, r, gamma
        self.count = 2 * edges.n + edges.m + edges.n  # constraints: the barrier's suboptimality bound is count/t

    def spectrum(self, w: np.ndarray, vectors: bool = True) -> tuple[np.ndarray, np.ndarray | None] | None:
        """Eigenvalues (and eigenvectors) of L(w) + J, or None outside the feasible set's interior."""
        if np.any(w <= 0) or np.any(self.e.degrees(w) >= 1.0):
            return None
        m = self.e.laplacian(w) + 1.0 / self.e.n
        if vectors:
            nu, v = scipy.linalg.eigh(m, overwrite_a=True, check_finite=False, driver="evd")
        else:
            nu, v = scipy.linalg.eigh(m, eigvals_only=True, overwrite_a=True, check_finite=False, driver="evd"), None
        if nu[0] <= self.gamma or nu[-1] >= 2.0 - self.gamma:
            return None
        return nu, v

    def objective(self, w: np.ndarray) -> float:
        wm = self.e.mixing(w)
        return noise_trace(wm, self.r)

    def value(self, w: np.ndarray, t: float) -> float:
        spec = self.spectrum(w, vectors=False)
        if spec is None:
            return math.inf
        nu = spec[0]
        d = self.e.degrees(w)
        phi = -np.sum(np.log(nu - self.gamma)) - np.sum(np.log(2.0 - self.gamma - nu)) - np.sum(np.log(w)) \
            - np.sum(np.log(1.0 - d))
        return t * self.objective(w) + float(phi)

    def derivatives(self, w: np.ndarray, t: float, dense: bool):
        """Gradient, and the Hessian (dense) or a Hessian-vector product with its diagonal (CG)."""
        e, r, g = self.e, self.r, self.gamma
        nu, v = self.spectrum(w)
        k1 = (v / (nu - g)) @ v.T
        k2 = (v / (2.0 - g - nu)) @ v.T
        wm = e.mixing(w)
        d = e.degrees(w)
        slack = 1.0 - d
        grad = t * (-2.0 * e.quad(r @ wm)) - e.quad(k1) + e.quad(k2) - 1.0 / w + e.incidence.T @ (1.0 / slack)
        s_weight = 1.0 / slack**2
        if dense:
            hess = 2.0 * t * e.gram(r) * e.gram(np.eye(e.n)) + e.gram(k1) ** 2 + e.gram(k2) ** 2
            hess[np.diag_indices(e.m)] += 1.0 / w**2
            s = e.incidence.toarray()
            hess += (s.T * s_weight) @ s
            return grad, hess
        diag = t * 4.0 * e.quad(r) + e.quad(k1) ** 2 + e.quad(k2) ** 2 + 1.0 / w**2 \
            + s_weight[e.i] + s_weight[e.j]

        def product(x: np.ndarray) -> np.ndarray:
            lx = e.sparse_laplacian(x)
            out = t * 2.0 * e.quad((lx @ r).T)  # R L_x (R, L_x symmetric)
            out += e.quad(k1 @ (lx @ k1)) + e.quad(k2 @ (lx @ k2))
            out += x / w**2 + e.incidence.T @ (s_weight * (e.incidence @ x))
            return out

        return grad, (product, diag)


def _pcg(product, diag: np.ndarray, rhs: np.ndarray, rtol: float, max_iter: int) -> np.ndarray:
    x = np.zeros_like(rhs)
    res = rhs.copy()
    z = res / diag
    p = z.copy()
    rz = float(res @ z)
    stop = rtol * float(np.linalg.norm(rhs))
    for _ in range(max_iter):
        hp = product(p)
        curv = float(p @ hp)
        if curv <= 0:
            break
        alpha = rz / curv
        x += alpha * p
        res -= alpha * hp
        if float(np.linalg.norm(res)) <= stop:
            break
        z = res / diag
        rz_new = float(res @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


def _center(bar: _Barrier, w: np.ndarray, t: float, dense: bool) -> tuple[np.ndarray, int]:
    """Newton's method on t·f + φ from the strictly feasible ``w``; returns the (approximate) minimiser."""
    value = bar.value(w, t)
    steps = 0
    for steps in range(1, MAX_NEWTON + 1):
        grad, hess = bar.derivatives(w, t, dense)
        if dense:
            try:
                step = -np.linalg.solve(hess, grad)
            except np.linalg.LinAlgError:
                step = -grad / np.maximum(np.diag(hess), 1e-300)
        else:
            product, diag = hess
            gnorm = float(np.linalg.norm(grad))
            step = _pcg(product, diag, -grad, min(0.1, math.sqrt(gnorm)), 200)
        slope = float(grad @ step)
        if slope >= 0:
            step, slope = -grad, -float(grad @ grad)
        if -slope / 2 <= NEWTON_TOL:  # Newton decrement² / 2: centred
            break
        # the longest step that keeps w > 0 and W_ii > 0, then backtracking (feasibility + Armijo)
        alpha = 1.0
        neg = step < 0
        if neg.any():
            alpha = min(alpha, 0.99 * float(np.min(w[neg] / -step[neg])))
        ds = bar.e.degrees(step)
        pos = ds > 0
        if pos.any():
            alpha = min(alpha, 0.99 * float(np.min((1.0 - bar.e.degrees(w))[pos] / ds[pos])))
        while alpha > 1e-8:
            trial = w + alpha * step
            new = bar.value(trial, t)
            # (t·f is large at the last stages: a decrease below its rounding cannot be verified)
            if new <= value + 0.25 * alpha * slope + 1e-14 * abs(value):
                break
            alpha *= 0.5
        else:
            break
        w, value = trial, new
    return w, steps


def mixing_step(edges: EdgeWeights, r: np.ndarray, w: np.ndarray, gamma: float, *, t: float | None = None,
                rtol: float = W_STEP_RTOL, dense: bool | None = None) -> tuple[np.ndarray, float, dict]:
    """The W-step: minimise Tr(W R W) over edge weights with 1 − SLEM(W) ≥ γ (barrier method) from the strictly
    feasible ``w``. Returns (w, the final barrier parameter t, facts)."""
    bar = _Barrier(edges, r, gamma)
    if bar.spectrum(w) is None:
        raise ValidationError("the W-step needs a strictly feasible start")
    dense = edges.m <= DENSE_MAX_EDGES if dense is None else dense
    f0 = bar.objective(w)
    if t is None:
        t = bar.count / max(f0, 1e-300)
    newton = 0
    while True:
        w, steps = _center(bar, w, t, dense)
        newton += steps
        if bar.count / t <= rtol * bar.objective(w):
            break
        t *= BARRIER_FACTOR
    return w, t, {"newton": newton, "objective_before": f0, "objective_after": bar.objective(w)}


# ---------------------------------------------------------------------------------------------------------------
# phase I: a strictly feasible start (spectral gap > γ)


def _phase_one(edges: EdgeWeights, w: np.ndarray, gamma: float) -> np.ndarray | None:
    """Gradient steps on a smooth upper bound of SLEM(W(w)) from ``w`` (w > 0, W_ii > 0) until the gap exceeds γ by
    a margin (or stops improving); the best point with gap > γ, or None."""
    n = edges.n
    target = gamma + 0.02 * (1.0 - gamma)
    beta = 2.0 * math.log(2 * n) / (0.005 * max(1.0 - gamma, 1e-3))
    j = np.full((n, n), 1.0 / n)

    def bound(x: np.ndarray) -> tuple[float, np.ndarray, float]:
        lam, v = np.linalg.eigh(edges.mixing(x) - j)
        z = np.concatenate([lam, -lam]) * beta
        top = float(z.max())
        weights = np.exp(z - top)
        total = float(weights.sum())
        value = (top + math.log(total)) / beta
        p = (weights[:n] - weights[n:]) / total  # d value / d λ_k
        grad = -edges.quad((v * p) @ v.T)  # ∂λ_k/∂w_e = −(v_ki − v_kj)²
        return value, grad, 1.0 - float(np.max(np.abs(lam)))

    value, grad, gap = bound(w)
    low_w, low_s = 0.1 * w, 0.1 * (1.0 - edges.degrees(w))
    best, best_gap = None, gamma + 1e-9  # (strictly inside, beyond the rounding of two eigensolvers)
    step = 1.0 / max(float(np.linalg.norm(grad)), 1e-12) * 0.01
    for _ in range(PHASE1_STEPS):
        if gap > best_gap:
            best, best_gap = w, gap
        if best_gap >= target:
            break
        direction = -grad
        limit = math.inf
        neg = direction < 0
        if neg.any():  # (w and W_ii stay above a tenth of the start's: the barrier starts well inside)
            limit = min(limit, float(np.min((w - low_w)[neg] / -direction[neg])))
        ds = edges.degrees(direction)
        pos = ds > 0
        if pos.any():
            limit = min(limit, float(np.min((1.0 - edges.degrees(w) - low_s)[pos] / ds[pos])))
        alpha = min(2.0 * step, limit)
        while alpha > 1e-16:
            trial = w + alpha * direction
            if np.any(trial < low_w) or np.any(1.0 - edges.degrees(trial) < low_s):
                alpha *= 0.5
                continue
            new = bound(trial)
            if new[0] <= value - 0.25 * alpha * float(grad @ grad):
                break
            alpha *= 0.5
        else:
            break
        step = alpha
        w, (value, grad, gap) = trial, new
    if gap > best_gap:
        best, best_gap = w, gap
    return best


# ---------------------------------------------------------------------------------------------------------------

_CACHE: dict[tuple, tuple] = {}


def _joint_at_unit_bound(support: np.ndarray, gamma: float | None) -> tuple:
    """(W, γ, history, outer iterations, note) of (J) at b = 1 (cached per graph and γ)."""
    from privdl.network.edges import fingerprint

    w_mh = metropolis_hastings_on(support)
    gap_mh = spectral_gap(w_mh)
    gamma = gap_mh if gamma is None else float(gamma)
    key = (fingerprint(w_mh), gamma)
    if key in _CACHE:
        return _CACHE[key]
    edges = EdgeWeights(support)
    fixed = whisper_design(w_mh, 1.0)
    history = [fixed.trace]
    if edges.m == 0:
        result = (w_mh, gamma, history, 0, "no edges: W = I")
        _CACHE[key] = result
        return result
    start = edges.weights_of(w_mh)
    note = ""
    if gamma >= gap_mh:
        interior = _phase_one(edges, start, gamma)
        if interior is None:
            if gamma > gap_mh * (1 + 1e-12) + 1e-15:
                raise ValidationError(
                    f"--min-spectral-gap {gamma:.6g} is above what this graph reached: the Metropolis–Hastings gap "
                    f"is {gap_mh:.6g} and a search for a faster-mixing W found no gap above {gamma:.6g}; give a "
                    f"smaller bound (at most the fastest-mixing chain's gap)")
            result = (w_mh, gamma, history, 0, "no W with a larger spectral gap was found: Metropolis–Hastings kept")
            _CACHE[key] = result
            return result
    else:
        interior = start
    w_cur, objective, r = start, fixed.trace, fixed.R  # the incumbent (MH until a step improves on it)
    if gamma > gap_mh:  # MH is not feasible: the phase-I point is the incumbent
        first = whisper_design(edges.mixing(interior), 1.0)
        w_cur, objective, r = interior, first.trace, first.R
        history.append(objective)
    w_iter, t = interior, None
    rtol = W_STEP_RTOL_FIRST  # the W-steps' accuracy follows the alternation's progress
    outer = 0
    started, last_step = time.perf_counter(), 0.0
    for outer in range(1, MAX_OUTER + 1):
        spent = time.perf_counter() - started
        if outer > 1 and spent + 2.0 * last_step > TIME_LIMIT:  # (later W-steps are tighter, so longer)
            note = f"stopped at the time limit ({TIME_LIMIT:g} s) after {outer - 1} alternations"
            if len(history) >= 2:
                note += f"; the last one lowered the objective by {100 * (1 - history[-1] / history[-2]):.2g} %"
            break
        w_new, t, _ = mixing_step(edges, r, w_iter, gamma, t=t, rtol=rtol)
        wm_new = edges.mixing(w_new)
        design = None
        if noise_trace(wm_new, r) < noise_trace(edges.mixing(w_cur), r):
            design = whisper_design(wm_new, 1.0)
        if design is None or design.trace >= objective:
            if rtol > W_STEP_RTOL:  # an inexact W-step: retry it exactly
                rtol, w_iter = W_STEP_RTOL, w_new
                continue
            note = "stopped: the last W-step did not lower the objective"
            break
        last_step = time.perf_counter() - started - spent
        improvement = (objective - design.trace) / objective
        w_cur, objective, r = w_new, design.trace, design.R
        history.append(objective)
        w_iter, t = w_new, t / BARRIER_FACTOR  # warm start: back off the barrier one stage for the new R
        if improvement < OUTER_RTOL:  # (the W-step was solved to 1% of the previous improvement or better)
            break
        rtol = max(W_STEP_RTOL, min(rtol, 0.01 * improvement))
    result = (edges.mixing(w_cur), gamma, history, outer, note)
    if len(_CACHE) >= 32:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = result
    return result


#: Below this n the joint design runs its linear algebra on one BLAS thread : its
#: matrices are small, and on a shared machine two spinning OpenBLAS threads made the n = 20 design 15× slower
#: (188 s against 12.6 s for ER(20, 0.8), load ≈ 7 on 2 cores).
ONE_THREAD_MAX_N = 400


def _one_blas_thread(n: int):
    import contextlib

    if n >= ONE_THREAD_MAX_N:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits  # (a declared dependency: 15× slower under load without it)

    return threadpool_limits(1)


def design_joint(w: np.ndarray, b: float, *, min_spectral_gap: float | None = None) -> JointDesign:
    """Choose the mixing weights on ``w``'s graph and the Whisper covariance R together (problem (J), module
    docstring). ``w``: a symmetric matrix whose off-diagonal support is the graph (its weights are not used: the
    fixed-mixing reference and the start are the Metropolis–Hastings weights); ``min_spectral_gap``: γ, by default
    MH's 1 − SLEM."""
    start_time = time.perf_counter()
    w, b = check_square(w), check_bound(b)
    require_symmetric(w, "optimizing the mixing weights (they are symmetric, on undirected edges)")
    if min_spectral_gap is not None:
        g = min_spectral_gap
        if not (isinstance(g, (int, float)) and not isinstance(g, bool) and math.isfinite(g) and 0 <= g < 1):
            raise ValidationError(f"--min-spectral-gap must be a number in [0, 1) (1 − SLEM of W), got {g!r}")
    with _one_blas_thread(w.shape[0]):
        w_opt, gamma, history, outer, note = _joint_at_unit_bound(w, min_spectral_gap)
    w_mh = metropolis_hastings_on(w)
    fixed = whisper_design(w_mh, b)
    design = whisper_design(w_opt, b)
    gap_mh = spectral_gap(w_mh)
    if gamma <= gap_mh:  # MH is feasible and the start: never worse than it
        if design.trace > fixed.trace:  # (never: every accepted step lowered the objective; a guard for rounding)
            w_opt, design, note = w_mh, fixed, "Metropolis–Hastings kept (no lower objective found)"
        if not design.trace <= fixed.trace:
            raise AssertionError("the joint design is worse than the fixed-mixing one")
    gap = spectral_gap(w_opt)
    if gap < gamma - 1e-9:
        raise AssertionError(f"the joint design's spectral gap {gap} is below the bound {gamma}")
    return JointDesign(W=w_opt, design=design, objective=design.trace, objective_fixed_mixing=fixed.trace,
                       spectral_gap=gap, spectral_gap_fixed_mixing=gap_mh, min_spectral_gap=gamma,
                       fixed_design=fixed, outer_iterations=outer, history=[h / b for h in history],
                       seconds=time.perf_counter() - start_time, note=note)


def save_mixing_matrix(path, w: np.ndarray) -> None:
    """Write W where ``[network] file`` (file_kind = "mixing") reads it back: .npy as is, any other name as a
    comma-separated text table with every digit of each float64 (17 significant digits)."""
    from pathlib import Path

    path = Path(path)
    if path.suffix.lower() == ".npy":
        with open(path, "wb") as handle:  # (np.save would append .npy to another name)
            np.save(handle, np.asarray(w, dtype=np.float64))
    else:
        np.savetxt(path, np.asarray(w, dtype=np.float64), fmt="%.17g", delimiter=",")
