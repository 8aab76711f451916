"""DSGT, distributed stochastic gradient tracking (Pu & Nedić; seed 004's DP-DSGT, SPEC §4):

    θ_i ← Σ_j w_ij (θ_j − η y_j)
    y_i ← G̃_i(θ_i^new) + Σ_j w_ij y_j − G̃_i(θ_i^old),     y_i⁰ = G̃_i(θ_i⁰).

Agents exchange θ and y (twice the message size of D-SGD). With a zero-mean noise mechanism the tracking variable
keeps (1/n) Σ_i y_i = (1/n) Σ_i G̃_i (the average of the latest noisy gradients) at every round. The initial y⁰
is one more noisy access: a run of T rounds makes T + 1.
"""

from __future__ import annotations

from typing import Any

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext


@ALGORITHMS.register("dsgt")
def dsgt() -> Algorithm:
    def init(x0: torch.Tensor) -> dict[str, Any]:
        return {"x": x0.clone(), "y": None, "g": None}

    def step(state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        x, y, g_old = state["x"], state["y"], state["g"]
        if y is None:  # y⁰ = G̃(θ⁰), drawn lazily so that init needs no data
            g_old = ctx.gradient(x)
            y = g_old
        x_new = ctx.mix(x - ctx.eta * y)
        g_new = ctx.gradient(x_new)
        return {"x": x_new, "y": g_new + ctx.mix(y) - g_old, "g": g_new}

    return Algorithm("dsgt", init, step, lambda s: s["x"], lambda iterations: iterations + 1)
