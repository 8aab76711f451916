"""Streaming linear regression tasks of seed 002 §5.1 and §5.3: adaptive filtering and target localization.

Agent k observes one fresh pair (x_k(n), d_k(n)) per gradient access (its own keyed draws) and minimises
J_k(w) = ½ E(d_k − x_kᵀw)², whose gradient is R_k (w − w°_k) with R_k = E{x_k x_kᵀ}; the network optimum is

    w* = (Σ_k R_k)⁻¹ Σ_k R_k w°_k.

``exact_gradient = true`` hands the algorithms ∇J_k itself instead of the one-sample estimate −x_k(d_k − x_kᵀw).
The engine tells the task the round (:meth:`at_round`), so the model can change with time: ``switch_at`` = s makes
every w°_k change sign for rounds n > s (tracking; w* changes with it), 0 = never.

Metrics per recorded round: ``msd`` = (1/K) Σ_k ‖w_k − w*(n)‖² and ``msd_db`` (10 log₁₀), ``grad_norm_sq`` =
‖∇J(w̄)‖² at the network average w̄ (J = (1/K) Σ J_k), and its running average ``grad_norm_sq_avg`` =
(1/n) Σ_{ℓ=1}^{n} ‖∇J(w̄(ℓ−1))‖² (seed 002 §5; exact when ``eval_every = 1``, over the recorded rounds otherwise);
the left sides of seed 002's error bounds: ``centroid_msd`` = ‖w̄ − w*‖² (eqs. 16, 21), ``gap`` = J(w̄) − J(w*) =
½(w̄ − w*)ᵀR̄(w̄ − w*) (R̄ = (1/K) Σ_k R_k: J is quadratic) and its running average ``avg_gap`` = (1/N) Σ_{n=1}^{N}
(J(w̄_{n−1}) − J(w*)) (eqs. 14, 19; exact when ``eval_every = 1``).
"""

from __future__ import annotations

import math
import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.keys import Draws
from privdl.tasks.base import TASKS, Batch, Task


def decibels(v: float) -> float:
    """10·log₁₀ v (−∞ at 0; NaN stays NaN, a diverged run is not a perfect one)."""
    return 10 * math.log10(v) if v > 0 else (-math.inf if v == 0 else math.nan)


class StreamingRegression(Task):
    """J_k(w) = ½E(d_k − x_kᵀw)² with R_k (K, L, L) and w°_k (K, L); subclasses say how a sample is drawn."""

    examples = False  # a stream: no finite data set to sample lots from
    running = ("grad_norm_sq", "gap")
    running_names = {"gap": "avg_gap"}

    def __init__(self, n: int, R: np.ndarray, w_o: np.ndarray, *, switch_at: int, exact_gradient: bool,
                 init_range: float, dtype: torch.dtype) -> None:
        if switch_at < 0:
            raise ValidationError(f"switch_at must be >= 0 (0: never), got {switch_at}")
        if not init_range >= 0:
            raise ValidationError(f"init_range must be >= 0, got {init_range}")
        self.n, self.dim, self.dtype = n, int(w_o.shape[1]), dtype
        self.switch_at, self.exact_gradient, self.init_range = int(switch_at), bool(exact_gradient), float(init_range)
        self.R = torch.as_tensor(R, dtype=torch.float64)
        self.w_o = torch.as_tensor(w_o, dtype=torch.float64)
        self.w_star = np.linalg.solve(R.sum(axis=0), np.einsum("kij,kj->i", R, w_o))
        self.t = 0
        self._counts = torch.ones(n, dtype=torch.int64)

    # ---- time ------------------------------------------------------------------------------------------------------
    def at_round(self, t: int) -> None:
        self.t = int(t)

    def sign(self, t: int | None = None) -> float:
        t = self.t if t is None else t
        return -1.0 if self.switch_at and t > self.switch_at else 1.0

    def optimum(self, t: int | None = None) -> torch.Tensor:
        """w*(t) (L,)."""
        return self.sign(t) * torch.as_tensor(self.w_star, dtype=torch.float64)

    # ---- data ------------------------------------------------------------------------------------------------------
    @property
    def counts(self) -> torch.Tensor:
        return self._counts

    def init_params(self, generator: torch.Generator) -> torch.Tensor:
        """Initial estimates uniform on [−init_range, init_range] (seed 002 §5: U[−1, 1]), common to the agents."""
        u = torch.rand(self.dim, generator=generator, dtype=torch.float64)
        return ((2 * u - 1) * self.init_range).to(self.dtype)

    def gather(self, agents: torch.Tensor, index: torch.Tensor) -> Batch:
        raise ValidationError(f"task {self.name!r} is a stream: it has no stored examples to gather")

    def draw(self, draws: Draws, agents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One sample per row: regressors (m, 1, L) and observations (m, 1)."""
        raise NotImplementedError

    def sample(self, draws: Draws, agents: torch.Tensor) -> Batch:
        agents = agents.cpu()
        if self.exact_gradient:  # the "batch" is agent k's (R_k, w°_k(n)): its exact gradient, no draw
            return (self.R[agents].to(self.dtype)[:, None], (self.sign() * self.w_o[agents]).to(self.dtype)[:, None])
        x, d = self.draw(draws, agents)
        return x.to(self.dtype), d.to(self.dtype)

    def loss(self, theta: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.exact_gradient:  # ½(θ − w°)ᵀR(θ − w°) (+ a constant): gradient R(θ − w°)
            diff = theta - b
            return 0.5 * torch.einsum("bi,bij,bj->b", diff, a, diff).mean()
        return 0.5 * ((b - a @ theta) ** 2).mean()

    def has_closed_form_gradient(self) -> bool:
        return True

    def batched_grad(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        a, b = batch
        if self.exact_gradient:
            return torch.einsum("mbij,mbj->mi", a, x[:, None, :] - b) / a.shape[1]
        err = b - torch.einsum("mbi,mi->mb", a, x)
        return -torch.einsum("mbi,mb->mi", a, err) / a.shape[1]

    @property
    def smoothness(self) -> float:
        """δ of seed 002 Assumption 4: max_k λ_max(R_k)."""
        return float(np.linalg.eigvalsh(self.R.numpy()).max())

    @property
    def strong_convexity(self) -> float:
        """ν of seed 002 Assumption 5: min_k λ_min(R_k)."""
        return float(np.linalg.eigvalsh(self.R.numpy()).min())

    @property
    def gradient_noise_bound(self) -> float | None:
        """σ_s² of seed 002 Assumption 2 (E‖s_k(w)‖² ≤ σ_s² for every w): 0 with exact gradients; None for one-sample
        gradients, whose noise grows without bound with ‖w − w°_k‖ (for adaptive filtering E‖s_k(w)‖² =
        σ_x⁴(L + 1)‖w − w°_k‖² + Lσ_x²σ_v²), so that no finite constant satisfies the assumption."""
        return 0.0 if self.exact_gradient else None

    def stacked_gradient_sq(self, w: torch.Tensor) -> float:
        """‖∇𝒥(𝟙 ⊗ w)‖² = Σ_k ‖∇J_k(w)‖² = Σ_k ‖R_k(w − w°_k(n))‖² at a common model w (L,)."""
        diff = w.to(torch.float64)[None, :] - self.sign() * self.w_o
        return float((torch.einsum("kij,kj->ki", self.R, diff) ** 2).sum())

    @property
    def heterogeneity(self) -> float:
        """H = ‖∇𝒥(𝒲*)‖² = Σ_k ‖∇J_k(w*)‖² (seed 002's heterogeneity; the same before and after a switch)."""
        return self.stacked_gradient_sq(self.optimum(0))

    # ---- metrics ---------------------------------------------------------------------------------------------------
    def full_gradient(self, w: torch.Tensor) -> torch.Tensor:
        """∇J(w) = (1/K) Σ_k R_k (w − w°_k(n)) for models w (R, L) → (R, L)."""
        diff = w.to(torch.float64)[:, None, :] - self.sign() * self.w_o[None]
        return torch.einsum("kij,rkj->ri", self.R, diff) / self.n

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        return self.metrics_many(x[None])[0]

    def metrics_many(self, x: torch.Tensor) -> list[dict[str, float]]:
        """:meth:`metrics` of R systems at once, x (R, K, L) (stacked replicas)."""
        x = x.to(torch.float64)
        msd = ((x - self.optimum()[None, None]) ** 2).sum(dim=2).mean(dim=1)
        mean = x.mean(dim=1)
        g = self.full_gradient(mean)
        spread = ((x - mean[:, None]) ** 2).sum(dim=2).mean(dim=1)
        err = mean - self.optimum()[None]
        centroid = (err * err).sum(dim=1)
        gap = 0.5 * torch.einsum("ri,ij,rj->r", err, self.R.mean(dim=0), err)
        rows = zip(msd.tolist(), (g * g).sum(dim=1).tolist(), spread.tolist(), centroid.tolist(), gap.tolist())
        return [{"msd": m, "msd_db": decibels(m), "grad_norm_sq": gn, "consensus_distance": c, "centroid_msd": cm,
                 "gap": gp} for m, gn, c, cm, gp in rows]

    def agent_terms(self, x: torch.Tensor, agents: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"msd": ((x.to(torch.float64) - self.optimum()[None]) ** 2).sum(dim=1)}

    def mean_term_names(self) -> tuple[str, ...]:
        return ("grad_norm_sq", "centroid_msd", "gap")

    def mean_terms(self, mean: torch.Tensor) -> dict[str, float]:
        mean = mean.to(torch.float64)[None]
        g = self.full_gradient(mean)
        err = mean - self.optimum()[None]
        gap = 0.5 * torch.einsum("ri,ij,rj->r", err, self.R.mean(dim=0), err)
        return {"grad_norm_sq": float((g * g).sum()), "centroid_msd": float((err * err).sum()), "gap": float(gap[0])}

    def join_metrics(self, means: dict[str, float], consensus: float, at_mean: dict[str, float]) -> dict[str, float]:
        m = means["msd"]
        return {"msd": m, "msd_db": decibels(m), "grad_norm_sq": at_mean["grad_norm_sq"],
                "consensus_distance": consensus, "centroid_msd": at_mean["centroid_msd"], "gap": at_mean["gap"]}

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "w_star": self.w_star.tolist(), "switch_at": self.switch_at,
                "exact_gradient": self.exact_gradient}


class AdaptiveFiltering(StreamingRegression):
    """Seed 002 §5.1: d_k(n) = x_k(n)ᵀw°_k + v_k(n), x_k ~ N(0, σ²_{x,k} I_L), v_k ~ N(0, σ²_{v,k}),
    σ²_{x,k}, σ²_{v,k} ~ U(0, 1), w°_k ~ N(0, I_L) — one w° for every agent (homogeneous) or one per agent
    (heterogeneous). R_k = σ²_{x,k} I, so w* = Σ_k σ²_{x,k} w°_k / Σ_k σ²_{x,k}. The problem (σ's, w°) is drawn
    from the task's ``seed``; the streams from the agents' keys. ``regressor_power`` = p (ours, not seed 002's)
    sets every σ²_{x,k} = p instead (the other draws unchanged): then δ = ν = p, a well-conditioned problem on which
    the step sizes Theorems 1–2 admit converge in thousands of rounds, not millions."""

    name = "adaptive_filtering"

    def __init__(self, n: int, *, dim: int = 5, heterogeneous: bool = True, exact_gradient: bool = False,
                 switch_at: int = 0, seed: int = 0, init_range: float = 1.0, regressor_power: float | None = None,
                 dtype: torch.dtype = torch.float64) -> None:
        if n < 1 or dim < 1:
            raise ValidationError(f"adaptive_filtering needs n >= 1 agents and dim >= 1, got n = {n}, dim = {dim}")
        if regressor_power is not None and not (isinstance(regressor_power, (int, float))
                                                and 0 < regressor_power < math.inf):
            raise ValidationError(f"adaptive_filtering regressor_power must be a finite number > 0, got "
                                  f"{regressor_power!r}")
        rng = np.random.default_rng([2002, int(seed)])
        self.sigma_x2 = rng.uniform(0.0, 1.0, n)
        if regressor_power is not None:
            self.sigma_x2 = np.full(n, float(regressor_power))
        self.sigma_v2 = rng.uniform(0.0, 1.0, n)
        w_o = rng.standard_normal((n, dim)) if heterogeneous else np.tile(rng.standard_normal(dim), (n, 1))
        self.heterogeneous = bool(heterogeneous)
        R = self.sigma_x2[:, None, None] * np.eye(dim)[None]
        super().__init__(n, R, w_o, switch_at=switch_at, exact_gradient=exact_gradient, init_range=init_range,
                         dtype=dtype)
        self._sx = torch.as_tensor(np.sqrt(self.sigma_x2))
        self._sv = torch.as_tensor(np.sqrt(self.sigma_v2))

    def draw(self, draws: Draws, agents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        L = self.dim
        z = draws.normal(L + 1)
        x = self._sx[agents][:, None] * z[:, :L]
        d = (x * (self.sign() * self.w_o[agents])).sum(dim=1) + self._sv[agents] * z[:, L]
        return x[:, None, :], d[:, None]

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "heterogeneous": self.heterogeneous, "sigma_x2": self.sigma_x2.tolist(),
                "sigma_v2": self.sigma_v2.tolist()}


#: default anchors (corners of a 10 × 10 field) and target of the localization task (our choice; seed 002 §5.3 gives
#: no coordinates)
ANCHORS = ((0.0, 0.0), (10.0, 0.0), (0.0, 10.0), (10.0, 10.0))
TARGET = (3.0, 7.0)


class Localization(StreamingRegression):
    """Seed 002 §5.3 (Sayed 2014's model): anchor k at p_k measures a noisy distance r_k(n) = ‖w° − p_k‖ + v_k(n) and a
    noisy unit direction z_k(n) = u_k + n_k(n) (u_k = (w° − p_k)/‖w° − p_k‖, n_k ~ N(0, σ_u² I)), and forms
    d_k(n) = r_k(n) + z_k(n)ᵀp_k ≈ z_k(n)ᵀw°. Then R_k = u_k u_kᵀ + σ_u² I and E{z_k d_k} = u_k u_kᵀ w° + σ_u² p_k,
    so the network optimum w* = (Σ R_k)⁻¹ Σ_k (u_k u_kᵀ w° + σ_u² p_k) is w° up to an O(σ_u²) bias (``w_star`` in the
    manifest; ``target`` is w°). Defaults (ours): anchors at the corners of a 10 × 10 field, target (3, 7),
    σ_v² = 0.01, σ_u² = 1e-4. The target does not move (no ``switch_at``)."""

    name = "localization"

    def __init__(self, n: int, *, anchors: list | None = None, target: list | None = None,
                 distance_noise: float = 0.01, direction_noise: float = 1e-4, exact_gradient: bool = False,
                 init_range: float = 1.0, dtype: torch.dtype = torch.float64, seed: int = 0) -> None:
        p = np.asarray(ANCHORS if anchors is None else anchors, dtype=np.float64)
        w0 = np.asarray(TARGET if target is None else target, dtype=np.float64)
        if p.ndim != 2 or p.shape[1] != 2 or w0.shape != (2,):
            raise ValidationError("localization anchors must be a list of [x, y] pairs and target one [x, y]")
        if p.shape[0] != n:
            raise ValidationError(f"localization has {p.shape[0]} anchors for {n} agents: one anchor per agent")
        if len({tuple(a) for a in p.tolist()}) != len(p):
            raise ValidationError("localization anchors must be distinct (two coincide)")
        if not (distance_noise >= 0 and direction_noise >= 0):
            raise ValidationError("localization noise variances must be >= 0")
        diff = w0[None] - p
        dist = np.linalg.norm(diff, axis=1)
        if (dist == 0).any():
            raise ValidationError("the target must not sit on an anchor (its direction is undefined)")
        u = diff / dist[:, None]
        R = np.einsum("ki,kj->kij", u, u) + direction_noise * np.eye(2)[None]
        b = np.einsum("kij,j->ki", np.einsum("ki,kj->kij", u, u), w0) + direction_noise * p
        w_o = np.linalg.solve(R, b[..., None])[..., 0]
        self.anchors, self.target, self.u, self.distance = p, w0, u, dist
        self.distance_noise, self.direction_noise = float(distance_noise), float(direction_noise)
        super().__init__(n, R, w_o, switch_at=0, exact_gradient=exact_gradient, init_range=init_range, dtype=dtype)

    def draw(self, draws: Draws, agents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = draws.normal(3)
        a = agents.numpy()
        reg = torch.as_tensor(self.u[a]) + math.sqrt(self.direction_noise) * z[:, :2]
        dist = torch.as_tensor(self.distance[a]) + math.sqrt(self.distance_noise) * z[:, 2]
        return reg[:, None, :], (dist + (reg * torch.as_tensor(self.anchors[a])).sum(dim=1))[:, None]

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "anchors": self.anchors.tolist(), "target": self.target.tolist(),
                "distance_noise": self.distance_noise, "direction_noise": self.direction_noise}


@TASKS.register("adaptive_filtering")
def make_adaptive_filtering(n: int, *, dim: int = 5, heterogeneous: bool = True, exact_gradient: bool = False,
                            switch_at: int = 0, seed: int = 0, init_range: float = 1.0,
                            regressor_power: float | None = None,
                            dtype: torch.dtype = torch.float64) -> AdaptiveFiltering:
    return AdaptiveFiltering(n, dim=dim, heterogeneous=heterogeneous, exact_gradient=exact_gradient,
                             switch_at=switch_at, seed=seed, init_range=init_range,
                             regressor_power=regressor_power, dtype=dtype)


@TASKS.register("localization")
def make_localization(n: int, *, anchors: list | None = None, target: list | None = None,
                      distance_noise: float = 0.01, direction_noise: float = 1e-4, exact_gradient: bool = False,
                      init_range: float = 1.0, seed: int = 0, dtype: torch.dtype = torch.float64) -> Localization:
    return Localization(n, anchors=anchors, target=target, distance_noise=distance_noise,
                        direction_noise=direction_noise, exact_gradient=exact_gradient, init_range=init_range,
                        dtype=dtype, seed=seed)


__all__ = ["ANCHORS", "AdaptiveFiltering", "Localization", "StreamingRegression", "TARGET", "decibels"]
