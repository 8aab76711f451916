"""Centralized (pooled) SGD baseline: one model, updated with the average of all agents' mini-batch gradients
(batch n·B over the pooled data). With a mechanism, each agent's gradient is privatised before averaging
(a trusted-aggregator baseline). Every agent row holds the same model."""

from __future__ import annotations

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext


@ALGORITHMS.register("central_sgd")
def central_sgd() -> Algorithm:
    def init(x0: torch.Tensor) -> torch.Tensor:
        return x0.clone()

    def step(x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        g = ctx.gradient(x).mean(dim=0, keepdim=True)
        return (x[:1] - ctx.eta * g).expand_as(x).clone()

    return Algorithm("central_sgd", init, step, lambda x: x)
