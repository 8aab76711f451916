"""Centralized (pooled) SGD baseline: one model, updated with the average of all agents' mini-batch gradients
(batch n·B over the pooled data), through a trusted aggregator (``comm.average``, tag ``gradient``). With a
mechanism, each agent's gradient is privatised before it is sent. Every agent row holds the same model."""

from __future__ import annotations

from typing import NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext


#: why the held frame refuses it: the frame's point is that no engine builds a tensor of the network's rows
CENTRAL_HELD = ("it is the centralized baseline: every round a trusted aggregator receives every agent's gradient and "
                "returns their mean (comm.average), so the aggregator's engine would hold a row per agent of the "
                "network (the simulator's mean of the n rows, for its bits) — the network-sized tensor the held frame "
                "exists to avoid; its agents have no neighbours to exchange rows with")


class CentralState(NamedTuple):
    x: torch.Tensor


@ALGORITHMS.register("central_sgd")
def central_sgd() -> Algorithm:
    def step(s: CentralState, ctx: StepContext) -> CentralState:
        return CentralState(s.x - ctx.eta * ctx.comm.average(ctx.gradient(s.x), tag="gradient"))

    return Algorithm("central_sgd", lambda x0, ctx: CentralState(x0.clone()), step, lambda s: s.x,
                     transmits={"gradient": "other"}, directed_ok=True,
                     held_reason=CENTRAL_HELD)
