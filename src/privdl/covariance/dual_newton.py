"""The Newton step of the dual solver (:mod:`privdl.covariance.dual`, whose docstring derives it): the Daleckii–Krein
Jacobian N of log p in B's eigenbasis, applied as products N·v with a diagonal-plus-rank-one preconditioner, and the
preconditioned conjugate gradients that solve N Δx = h ∘ log p.

Separate from the iteration that takes the steps: it is the one part whose arithmetic (float32 from
``FLOAT32_MIN_N``, a quadrature for diag(N)) affects only the step's accuracy, never the certificate, and both the
eigh-based Newton iteration and the singular-W tie-break (:mod:`privdl.covariance.dual_tiebreak`) call it.
"""

from __future__ import annotations

import numpy as np

from privdl.covariance.dual_linalg import _gram

#: From this n on, the Newton step's matrix products run in float32 (the step only, never the certificate).
FLOAT32_MIN_N = 256
#: At most this many conjugate-gradient products N·v per Newton step.
MAX_CG = 10
#: CG stops when the predicted spread of log p after the step is below TARGET_C·spread² (or 0.2·tol).
TARGET_C = 0.02


class _Hessian:
    """N = Σ_kl (Q_ik Q_jk)(Q_il Q_jl)·K_kl, K_kl = r_k r_l/(r_k + r_l), in B's eigenbasis (see
    :mod:`privdl.covariance.dual`): products N·v and the preconditioner (diag(N) + c cᵀ/Σc)⁻¹, c = h/2 − diag(N)
    the off-diagonal row sums.

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
