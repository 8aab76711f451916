"""PSGT: gradient tracking with decaying Laplace perturbations of both the state and the direction (Ding, Zhu, He,
Chen & Guan, TAC 2022, "DiaDSP"; seed 002 calls it PSGT; BASELINES.md §2.1 [R]):

    x̃_i(n) = x_i(n) + η_i(n),   ỹ_i(n) = y_i(n) + ζ_i(n)                    (two broadcasts: tags ``x``, ``y``)
    x_i(n+1) = Σ_j w_ij x̃_j(n) − γ ỹ_i(n)
    y_i(n+1) = Σ_j w_ij ỹ_j(n) + ∇̂f_i(x_i(n+1)) − ∇̂f_i(x_i(n)),          y_i(0) = ∇̂f_i(x_i(0))

η, ζ i.i.d. Laplace per coordinate with variance v(n) = (variance·decayⁿ)^½ (``root = true``, seed 002 §5.1's
√(0.1·0.8ⁿ), the default) or variance·decayⁿ. [R] choices, named and made parameters: the same schedule for η and
ζ; the agent's own perturbed x̃_i, ỹ_i in its self-weight terms (``self_perturbed = true``; false uses its exact
x_i, y_i there). One gradient access per round plus the initial one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, frame_of, per_round
from privdl.errors import ValidationError
from privdl.mechanisms.perturbation import laplace, psgt_variance
from privdl.privacy.events import LaplaceEvent


class PSGTState(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor
    g: torch.Tensor  # ∇̂f(x(n))


@ALGORITHMS.register("psgt")
def psgt(*, variance: float = 0.1, decay: float = 0.8, root: bool = True, self_perturbed: bool = True) -> Algorithm:
    if not variance >= 0:
        raise ValidationError(f"psgt variance must be >= 0, got {variance}")
    if not 0 < decay <= 1:
        raise ValidationError(f"psgt decay must be in (0, 1], got {decay}")

    def perturbed(v: torch.Tensor, what: str, ctx: StepContext) -> torch.Tensor:
        var = psgt_variance(ctx.t, variance=variance, decay=decay, root=root)
        agents = frame_of(ctx.comm).agents  # each row's own key: the engine's rows only (the held frame)
        u = ctx.keys.uniform(f"psgt/{what}", ctx.t, v.shape[1], rows=None if agents is None else agents.numpy())
        return v + laplace(u, var).to(dtype=v.dtype, device=v.device)

    def combine(clean: torch.Tensor, noisy: torch.Tensor, tag: str, ctx: StepContext) -> torch.Tensor:
        out = ctx.comm.mix(noisy, tag=tag)
        if self_perturbed:
            return out
        a = frame_of(ctx.comm).rows(ctx.comm.edges.self_weight).to(dtype=clean.dtype, device=clean.device)[:, None]
        return out + a * (clean - noisy)

    def init(x0: torch.Tensor, ctx: StepContext) -> PSGTState:
        g0 = ctx.gradient(x0)
        return PSGTState(x0.clone(), g0, g0)

    def step(s: PSGTState, ctx: StepContext) -> PSGTState:
        xt, yt = perturbed(s.x, "x", ctx), perturbed(s.y, "y", ctx)
        x_new = combine(s.x, xt, "x", ctx) - ctx.eta * yt
        g_new = ctx.gradient(x_new)
        return PSGTState(x_new, combine(s.y, yt, "y", ctx) + g_new - s.g, g_new)

    # one event per access: the state and the direction of a round are perturbed with the same schedule
    privacy = (LaplaceEvent("psgt(state and direction)", variance, decay, root),) if variance > 0 else ()
    return Algorithm("psgt", init, step, lambda s: s.x, per_round(1, extra=1), privacy=privacy,
                     facts={"variance": variance, "decay": decay, "root": root, "self_perturbed": self_perturbed},
                     transmits={"x": "other", "y": "other"}, held_reason=None)  # its rows' keys and self-weights
