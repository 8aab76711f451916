"""DSGT, distributed stochastic gradient tracking (Pu & Nedić; seed 004's DP-DSGT, SPEC §4):

    θ_i ← Σ_j w_ij (θ_j − η y_j)
    y_i ← G̃_i(θ_i^new) + Σ_j w_ij y_j − G̃_i(θ_i^old),     y_i⁰ = G̃_i(θ_i⁰) (drawn in ``init``).

Agents exchange θ and y (two tagged ``mix`` calls per round, ``theta`` and ``y``: twice the message size of D-SGD).
With a zero-mean noise mechanism the tracking variable keeps (1/n) Σ_i y_i = (1/n) Σ_i G̃_i (the average of the
latest noisy gradients) at every round. The initial y⁰ is one more noisy access: a run of T rounds makes T + 1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, per_round


class DSGTState(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor  # tracking variable
    g: torch.Tensor  # the latest privatised gradient


@ALGORITHMS.register("dsgt")
def dsgt() -> Algorithm:
    def init(x0: torch.Tensor, ctx: StepContext) -> DSGTState:
        g0 = ctx.gradient(x0)
        return DSGTState(x0.clone(), g0, g0)

    def step(s: DSGTState, ctx: StepContext) -> DSGTState:
        x_new = ctx.comm.mix(s.x - ctx.eta * s.y, tag="theta")
        g_new = ctx.gradient(x_new)
        return DSGTState(x_new, g_new + ctx.comm.mix(s.y, tag="y") - s.g, g_new)

    return Algorithm("dsgt", init, step, lambda s: s.x, per_round(1, extra=1))
