"""The heterogeneous rotated quadratic of seed 001 (§VI-A, Eq. 11), with its exact optimum."""

from __future__ import annotations

import math
from typing import Annotated

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.registry import one_of
from privdl.tasks.base import TASKS, Batch, Task, consensus_distance


def quadratic_problem(n: int, *, curvature: float = 15.0, angle_deg: float = 15.0) -> tuple[np.ndarray, np.ndarray]:
    """Matrices A_i (n, 2, 2) and minimisers c_i (n, 2) with f_i(x) = (x − c_i)ᵀ A_i (x − c_i).

    Agents i = 1..n: for i ≤ n/2, f_i = 15(x₁ + i)² + x₂² (c_i = (−i, 0)); for i > n/2, f_i = 15(x₁ − i)² + x₂²
    rotated by θ about its minimiser (i, 0), i.e. A_i = R_θ diag(15, 1) R_θᵀ.
    """
    if not curvature > 0:
        raise ValidationError(f"quadratic curvature must be > 0 (each f_i is then strongly convex and the objective "
                              f"has one minimiser), got {curvature}")
    base = np.diag([curvature, 1.0])
    th = math.radians(angle_deg)
    rot = np.array([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]])
    i = np.arange(1, n + 1, dtype=float)
    first = i <= n / 2
    A = np.where(first[:, None, None], base, rot @ base @ rot.T)
    c = np.zeros((n, 2))
    c[:, 0] = np.where(first, -i, i)
    return A, c


def quadratic_optimum(A: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, float]:
    """Exact minimiser x* = (Σ A_i)⁻¹ Σ A_i c_i of F = (1/n) Σ f_i, and F* = F(x*)."""
    x_star = np.linalg.solve(A.sum(axis=0), np.einsum("kij,kj->i", A, c))
    diff = x_star[None, :] - c
    f_star = float(np.einsum("ki,kij,kj->k", diff, A, diff).mean())
    return x_star, f_star


class Quadratic(Task):
    """Every agent holds one deterministic "example" (A_i, c_i): a batch is always that example (no draw), and there
    is nothing to sample lots from (``examples = False``)."""

    name = "quadratic"
    examples = False

    def __init__(self, n: int, *, curvature: float = 15.0, angle_deg: float = 15.0, init_scale: float = 0.0,
                 start: str = "zero", dtype: torch.dtype = torch.float64) -> None:
        if n < 2:
            raise ValidationError(f"quadratic task needs n >= 2 agents, got {n}")
        self.n, self.dim, self.dtype = n, 2, dtype
        A, c = quadratic_problem(n, curvature=curvature, angle_deg=angle_deg)
        self.x_star, self.f_star = quadratic_optimum(A, c)
        self.A = torch.as_tensor(A, dtype=dtype)
        self.c = torch.as_tensor(c, dtype=dtype)
        self._counts = torch.ones(n, dtype=torch.int64)
        self.init_scale = init_scale
        if start not in ("zero", "optimum"):
            raise ValidationError(f"quadratic start must be 'zero' or 'optimum', got {start!r}")
        self.start = start

    def init_params(self, generator: torch.Generator) -> torch.Tensor:
        """x₀ = init_scale·N(0, I), shifted to x* when ``start = "optimum"`` (then the gap measures noise only)."""
        x0 = self.init_scale * torch.randn(2, generator=generator, dtype=self.dtype)
        return x0 + torch.as_tensor(self.x_star, dtype=self.dtype) if self.start == "optimum" else x0

    def loss(self, theta: torch.Tensor, A: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        diff = theta - c  # (B, 2)
        return torch.einsum("bi,bij,bj->b", diff, A, diff).mean()

    @property
    def counts(self) -> torch.Tensor:
        return self._counts

    def gather(self, agents: torch.Tensor, index: torch.Tensor) -> Batch:
        return self.A[agents][:, None].expand(-1, index.shape[1], -1, -1), self.c[agents][:, None].expand(
            -1, index.shape[1], -1)

    def sample(self, draws: object, agents: torch.Tensor) -> Batch:
        """Agent i's only example, with no draw."""
        cached = getattr(self, "_last", None)
        if cached is not None and cached[0].shape == agents.shape and torch.equal(cached[0], agents):
            return cached[1]
        batch = (self.A[agents][:, None], self.c[agents][:, None])
        self._last = (agents.clone(), batch)
        return batch

    def has_closed_form_gradient(self) -> bool:
        return True

    def batched_grad(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        A, c = batch
        return 2.0 * torch.einsum("nbij,nbj->ni", A, x[:, None, :] - c) / A.shape[1]

    def objective(self, x: torch.Tensor) -> torch.Tensor:
        """F(x_i) = (1/n) Σ_k f_k(x_i) for each row x_i of x (m, 2). Above 2²⁴ (row, agent) pairs, by the exact
        identity F(x) = F* + (x − x*)ᵀ Ā (x − x*), Ā = (1/n) Σ_k A_k (an (m, n, 2) array of 10⁶ agents' models would
        not fit)."""
        if x.shape[0] * self.n > 2**24:
            d = x - torch.as_tensor(self.x_star, dtype=x.dtype, device=x.device)
            return self.f_star + torch.einsum("mi,ij,mj->m", d, self.A.mean(dim=0).to(x.device), d)
        diff = x[:, None, :] - self.c[None]  # (m, n, 2)
        return torch.einsum("mki,kij,mkj->mk", diff, self.A, diff).mean(dim=1)

    def local_objective(self, x: torch.Tensor) -> torch.Tensor:
        """f_i(x_i) for each agent i (x is (n, 2)): every agent on its own function."""
        diff = x - self.c
        return torch.einsum("ki,kij,kj->k", diff, self.A, diff)

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        """``optimality_gap`` (1/n) Σ_i F(x_i) − F* (≥ 0: every agent's model on the whole objective) and
        ``local_optimality_gap`` (1/n) Σ_i f_i(x_i) − F*, the seed's printed metric (each agent on its own f_i; it can
        be negative when the agents disagree, since each f_i is minimised away from x*)."""
        x = x.to(self.dtype)
        f = self.objective(x)
        return {
            "optimality_gap": float(f.mean()) - self.f_star,
            "local_optimality_gap": float(self.local_objective(x).mean()) - self.f_star,
            "consensus_distance": consensus_distance(x),
        }

    def agent_terms(self, x: torch.Tensor, agents: torch.Tensor) -> dict[str, torch.Tensor]:
        x = x.to(self.dtype)
        diff = x - self.c[agents]
        local = torch.einsum("ki,kij,kj->k", diff, self.A[agents], diff)
        return {"optimality_gap": self.objective(x).to(torch.float64), "local_optimality_gap": local.to(torch.float64)}

    def join_metrics(self, means: dict[str, float], consensus: float, at_mean: dict[str, float]) -> dict[str, float]:
        return {"optimality_gap": means["optimality_gap"] - self.f_star,
                "local_optimality_gap": means["local_optimality_gap"] - self.f_star, "consensus_distance": consensus}

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "x_star": self.x_star.tolist(), "f_star": self.f_star}


@TASKS.register("quadratic")
def make_quadratic(n: int, *, curvature: float = 15.0, angle_deg: float = 15.0, init_scale: float = 0.0,
                   start: Annotated[str, one_of("zero", "optimum")] = "zero", dtype: torch.dtype = torch.float64,
                   seed: int = 0) -> Quadratic:
    return Quadratic(n, curvature=curvature, angle_deg=angle_deg, init_scale=init_scale, start=start, dtype=dtype)
