"""D-SGD in its two orders.

- ``form = "atc"`` (adapt then combine; seeds 000/001, Algorithm 1): x ← W (x − η_t (ĝ + v)).
- ``form = "cta"`` (combine then adapt; seed 004's DP-DSGD, SPEC §4): θ_i ← Σ_j w_ij θ_j − η_k G̃_i(θ_i); the
  gradient step may go through an optimizer (momentum) whose state persists across rounds.

With the "none" mechanism this is non-private D-SGD; with "gaussian_ldp", LDP D-SGD; with correlated-noise mechanisms
(DECOR, Whisper) CorN-DSGD; with "dp_sgd", DP-DSGD — all unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext
from privdl.algorithms.optimizers import make_optimizer
from privdl.errors import ValidationError


@ALGORITHMS.register("dsgd")
def dsgd(*, form: str = "atc", optimizer: Any = None) -> Algorithm:
    if form not in ("atc", "cta"):
        raise ValidationError(f"dsgd form must be 'atc' (adapt then combine) or 'cta' (combine then adapt), got {form!r}")
    opt = make_optimizer(optimizer)
    if form == "atc":
        if opt.name != "sgd" or opt.momentum or opt.weight_decay:
            raise ValidationError("dsgd form 'atc' is plain SGD; use form = 'cta' for an optimizer")

        def step(x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
            return ctx.mix(x - ctx.eta * ctx.gradient(x))

        return Algorithm("dsgd", lambda x0: x0.clone(), step, lambda x: x)

    def init(x0: torch.Tensor) -> dict[str, Any]:
        return {"x": x0.clone(), "opt": opt.init(x0)}

    def step_cta(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        x = state["x"]
        u, opt_state = opt.update(state["opt"], ctx.gradient(x), ctx.eta, x)
        return {"x": ctx.mix(x) + u, "opt": opt_state}

    return Algorithm("dsgd", init, step_cta, lambda s: s["x"])
