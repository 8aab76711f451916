"""DiNNO, consensus ADMM for neural networks (Yu et al.; seed 004's DP-DiNNO, SPEC §4):

    dual:   y_i ← y_i + ρ Σ_{j ∈ N(i)} (θ_i − θ_j)
    primal: P optimizer steps from ψ = θ_i downhill on  l(ψ; D_i) + ψᵀ y_i + ρ Σ_{j ∈ N(i)} ‖ψ − (θ_i + θ_j)/2‖²,
            with ∇l privatised by the mechanism (only the data term touches D_i) and the penalty's gradient exact:
            y_i + 2ρ (deg_i ψ − (deg_i θ_i + Σ_{j ∈ N(i)} θ_j)/2).

N(i) excludes i (the authors' code). ρ grows as ρ₀·ρ_scale^k (k = 1, 2, ...), updated before the dual step as in
their code. The optimizer state persists across rounds (SPEC); ``reset_optimizer = true`` re-creates it every round
as the authors' code does (with Adam and P = 1 that makes each primal step ≈ η·sign(G)). P noisy accesses per round.
"""

from __future__ import annotations

from typing import Any

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext
from privdl.algorithms.optimizers import make_optimizer
from privdl.errors import ValidationError


@ALGORITHMS.register("dinno")
def dinno(*, rho: float = 0.5, rho_scale: float = 1.0, primal_steps: int = 1, optimizer: Any = "adam",
          reset_optimizer: bool = False) -> Algorithm:
    if not rho > 0:
        raise ValidationError(f"rho must be > 0, got {rho}")
    if not rho_scale >= 1:
        raise ValidationError(f"rho_scale must be >= 1 (ρ is non-decreasing), got {rho_scale}")
    if not (isinstance(primal_steps, int) and primal_steps >= 1):
        raise ValidationError(f"primal_steps must be an integer >= 1, got {primal_steps!r}")
    opt = make_optimizer(optimizer)

    def init(x0: torch.Tensor) -> dict[str, Any]:
        return {"x": x0.clone(), "y": torch.zeros_like(x0), "opt": opt.init(x0), "rho": float(rho)}

    def step(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        if ctx.neighbours is None:
            raise ValidationError("dinno needs the neighbour structure (ctx.neighbours)")
        theta = state["x"]
        r = state["rho"] * rho_scale
        nb = ctx.neighbours
        y = state["y"] + r * nb.disagreement(theta)
        anchor = 0.5 * (nb.degree * theta + nb.sum(theta))  # Σ_j (θ_i + θ_j)/2
        psi, opt_state = theta, opt.init(theta) if reset_optimizer else state["opt"]
        for _ in range(primal_steps):
            direction = ctx.gradient(psi) + y + 2 * r * (nb.degree * psi - anchor)
            u, opt_state = opt.update(opt_state, direction, ctx.eta, psi)
            psi = psi + u
        return {"x": psi, "y": y, "opt": opt_state, "rho": r}

    return Algorithm("dinno", init, step, lambda s: s["x"], lambda iterations: iterations * primal_steps)
