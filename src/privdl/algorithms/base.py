"""Algorithms as (init, step) pairs over explicit state (optax style), written once against the agent axis.

``step(state, ctx)`` gets a :class:`StepContext`: the step index and size, ``ctx.gradient(x)`` (the privatised
per-agent stochastic gradients at x (n, d), a fresh mini-batch and fresh noise each call) and ``ctx.mix(x)`` (one
gossip round). Algorithms never see W, the mechanism or the data directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from privdl.registry import Registry


@dataclass
class StepContext:
    t: int
    eta: float
    gradient: Callable[[torch.Tensor], torch.Tensor]
    mix: Callable[[torch.Tensor], torch.Tensor]


class Algorithm(NamedTuple):
    name: str
    init: Callable[[torch.Tensor], Any]
    step: Callable[[Any, StepContext], Any]
    params: Callable[[Any], torch.Tensor]  # the agents' models (n, d) to evaluate


ALGORITHMS: Registry[Callable[..., Algorithm]] = Registry("algorithm")
