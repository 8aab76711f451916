"""DSGT, distributed stochastic gradient tracking (Pu & Nedić; seed 004's DP-DSGT, SPEC §4):

    θ_i ← Σ_j w_ij (θ_j − η y_j)
    y_i ← G̃_i(θ_i^new) + Σ_j w_ij y_j − G̃_i(θ_i^old),     y_i⁰ = G̃_i(θ_i⁰) (drawn in ``init``).

Agents exchange θ and y (two tagged ``mix`` calls per round, ``theta`` and ``y``: twice the message size of D-SGD).
With a zero-mean noise mechanism the tracking variable keeps (1/n) Σ_i y_i = (1/n) Σ_i G̃_i (the average of the
latest noisy gradients) at every round. The initial y⁰ is one more noisy access: a run of T rounds makes T + 1.

``gossip = "authors"`` is what seed 004's code runs instead: y⁰ = 0 (T accesses in T rounds), and both updates are
in-place sweeps of neighbour averaging (:meth:`privdl.comm.Comm.average_in_place`, weights 1/(deg + 1)): agent by
agent, θ_i ← avg of its own and its neighbours' *current* θ − η Σ_j w_ij y_j, then, after every agent's gradient
at its new θ, y_i ← avg of the current y + G̃_i(θ_i^new) − G̃_i(θ_i^old). Not doubly stochastic, not synchronous: the
tracking property above does not hold; for comparison with the published numbers only.
"""

from __future__ import annotations

from typing import Annotated, NamedTuple

import torch

from privdl.algorithms.base import (ALGORITHMS, GOSSIPS, HELD_AUTHORS, Algorithm, StepContext, check_gossip,
                                   per_round)
from privdl.comm.base import LINEAR_MIXING
from privdl.registry import one_of


class DSGTState(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor  # tracking variable
    g: torch.Tensor  # the latest privatised gradient


@ALGORITHMS.register("dsgt")
def dsgt(*, gossip: Annotated[str, one_of(*GOSSIPS)] = "synchronous") -> Algorithm:
    check_gossip("dsgt", gossip)
    if gossip == "authors":
        return _dsgt_authors()

    def init(x0: torch.Tensor, ctx: StepContext) -> DSGTState:
        g0 = ctx.gradient(x0)
        return DSGTState(x0.clone(), g0, g0)

    def step(s: DSGTState, ctx: StepContext) -> DSGTState:
        x_new = ctx.comm.mix(s.x - ctx.eta * s.y, tag="theta")
        g_new = ctx.gradient(x_new)
        return DSGTState(x_new, g_new + ctx.comm.mix(s.y, tag="y") - s.g, g_new)

    return Algorithm("dsgt", init, step, lambda s: s.x, per_round(1, extra=1), combines=LINEAR_MIXING,
                     transmits={"theta": "tracking_model", "y": "tracker"}, held_reason=None)


def _dsgt_authors() -> Algorithm:
    def init(x0: torch.Tensor, ctx: StepContext) -> DSGTState:
        zero = torch.zeros_like(x0)
        return DSGTState(x0.clone(), zero, zero.clone())

    def step(s: DSGTState, ctx: StepContext) -> DSGTState:
        pushed = (s.y + ctx.comm.neighbour_sum(s.y, tag="y")) / (ctx.comm.degree.to(s.y.dtype) + 1.0)
        x_new = ctx.comm.average_in_place(s.x, tag="theta", offset=-ctx.eta * pushed)
        g_new = ctx.gradient(x_new)
        return DSGTState(x_new, ctx.comm.average_in_place(s.y, tag="y", offset=g_new - s.g), g_new)

    return Algorithm("dsgt", init, step, lambda s: s.x, per_round(1), transmits={"theta": "other", "y": "other"},
                     held_reason=HELD_AUTHORS)
