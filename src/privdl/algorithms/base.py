"""Algorithms as (init, step) pairs over explicit state (optax style), written once against the agent axis.

``step(state, ctx)`` gets a :class:`StepContext`: the step index and size, ``ctx.gradient(x)`` (the privatised
per-agent stochastic gradients at x (n, d), a fresh mini-batch and fresh noise each call), ``ctx.mix(x)`` (one
gossip round) and ``ctx.neighbours`` (neighbour sums and degrees, for ADMM). Algorithms never see W, the mechanism or
the data directly. ``gradient_calls(T)`` says how many times a run of T rounds calls ``ctx.gradient``: every call is
a noisy access to the data, and the privacy accounting covers exactly that many.
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
    neighbours: Any = None  # privdl.network.network.Neighbours


class Algorithm(NamedTuple):
    name: str
    init: Callable[[torch.Tensor], Any]
    step: Callable[[Any, StepContext], Any]
    params: Callable[[Any], torch.Tensor]  # the agents' models (n, d) to evaluate
    gradient_calls: Callable[[int], int] = lambda iterations: iterations  # noisy data accesses in T rounds


ALGORITHMS: Registry[Callable[..., Algorithm]] = Registry("algorithm")
