"""Centralized (pooled) SGD baseline: one model, updated with the average of all agents' mini-batch gradients
(batch n·B over the pooled data), through a trusted aggregator (``comm.average``, tag ``gradient``). With a
mechanism, each agent's gradient is privatised before it is sent. Every agent row holds the same model.
In a split run the aggregator is hosted by slice 0 (in the held frame too: its tensor of every agent's gradient is
the messages it receives)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext


class CentralState(NamedTuple):
    x: torch.Tensor


@ALGORITHMS.register("central_sgd")
def central_sgd() -> Algorithm:
    def step(s: CentralState, ctx: StepContext) -> CentralState:
        return CentralState(s.x - ctx.eta * ctx.comm.average(ctx.gradient(s.x), tag="gradient"))

    return Algorithm("central_sgd", lambda x0, ctx: CentralState(x0.clone()), step, lambda s: s.x,
                     transmits={"gradient": "other"}, directed_ok=True,
                     held_reason=None)  # the held frame's average: slice 0's aggregator receives every row
