"""DiNNO, consensus ADMM for neural networks (Yu et al.; seed 004's DP-DiNNO, SPEC §4):

    dual:   y_i ← y_i + ρ Σ_{j ∈ N(i)} (θ_i − θ_j)
    primal: P optimizer steps from ψ = θ_i downhill on  l(ψ; D_i) + ψᵀ y_i + ρ Σ_{j ∈ N(i)} ‖ψ − (θ_i + θ_j)/2‖²,
            with ∇l privatised by the mechanism (only the data term touches D_i) and the penalty's gradient exact:
            y_i + 2ρ (deg_i ψ − (deg_i θ_i + Σ_{j ∈ N(i)} θ_j)/2).

N(i) excludes i (the authors' code). The agents exchange θ once per round (``comm.neighbour_sum``, tag ``theta``);
deg_i is the agent's own number of incoming edges. ρ grows as ρ₀·ρ_scale^k (k = 1, 2, ...), updated before the dual
step as in their code. The optimizer state persists across rounds (SPEC); ``reset_optimizer = true`` re-creates it
every round as the authors' code does (with Adam and P = 1 that makes each primal step ≈ η·sign(G)). P noisy
accesses per round.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, per_round
from privdl.algorithms.optimizers import OptState, make_optimizer
from privdl.errors import ValidationError
from privdl.registry import one_of


class DiNNOState(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor  # dual variable
    opt: OptState
    rho: float


@ALGORITHMS.register("dinno")
def dinno(*, rho: float = 0.5, rho_scale: float = 1.0, primal_steps: int = 1,
          optimizer: Annotated[Any, one_of("sgd", "adam")] = "adam",
          reset_optimizer: bool = False) -> Algorithm:
    if not rho > 0:
        raise ValidationError(f"rho must be > 0, got {rho}")
    if not rho_scale >= 1:
        raise ValidationError(f"rho_scale must be >= 1 (ρ is non-decreasing), got {rho_scale}")
    if not (isinstance(primal_steps, int) and primal_steps >= 1):
        raise ValidationError(f"primal_steps must be an integer >= 1, got {primal_steps!r}")
    opt = make_optimizer(optimizer)

    def init(x0: torch.Tensor, ctx: StepContext) -> DiNNOState:
        return DiNNOState(x0.clone(), torch.zeros_like(x0), opt.init(x0), float(rho))

    def step(s: DiNNOState, ctx: StepContext) -> DiNNOState:
        theta, r = s.x, s.rho * rho_scale
        deg = ctx.comm.degree.to(theta.dtype).reshape(-1, *([1] * (theta.ndim - 1)))
        others = ctx.comm.neighbour_sum(theta, tag="theta")  # Σ_{j ∈ N(i)} θ_j
        y = s.y + r * (deg * theta - others)
        anchor = 0.5 * (deg * theta + others)  # Σ_j (θ_i + θ_j)/2
        psi, opt_state = theta, opt.init(theta) if reset_optimizer else s.opt
        for _ in range(primal_steps):
            direction = ctx.gradient(psi) + y + 2 * r * (deg * psi - anchor)
            u, opt_state = opt.update(opt_state, direction, ctx.eta, psi)
            psi = psi + u
        return DiNNOState(psi, y, opt_state, r)

    return Algorithm("dinno", init, step, lambda s: s.x, per_round(primal_steps),
                     transmits={"theta": "other"}, held_reason=None,  # neighbour_sum and its own degree only
                     requires=("fixed_mixing: DiNNO's dual variable y_i accumulates ρ Σ_{j ∈ N(i)} (θ_i − θ_j) over "
                               "the consensus constraints θ_i = θ_j of a fixed edge set (consensus ADMM); with edges "
                               "that change each round the duals price constraints that no longer exist",))
