"""A straightforward per-agent Python loop of private D-SGD: the baseline the simulator is checked and timed against.

It consumes the same keyed random streams as :func:`privdl.simulator.engine.simulate` (the same uniform draws pick
each agent's batch, the same normal draws give its noise), so for the same seed both give the same final models.
"""

from __future__ import annotations

import time

import torch

from privdl.network.network import Network
from privdl.rng import Streams
from privdl.schedules import Schedule
from privdl.tasks.supervised import SupervisedTask


def loop_private_dsgd(task: SupervisedTask, network: Network, schedule: Schedule, *, iterations: int, seed: int,
                      clip: float | None, sigma: float) -> tuple[torch.Tensor, float]:
    """Per-agent loop: for each agent, autograd gradient of its own batch, clip, add noise; then mix by
    Σ_j W_ij (x_j − η g_j) agent by agent. Returns (final models (n, d), seconds)."""
    streams = Streams(seed)
    n, B = task.n, task.batch_size
    x = [task.init_params(streams.torch("init")).clone() for _ in range(n)]
    W = network.W
    neigh = [[j for j in range(n) if W[i, j] != 0] for i in range(n)]
    start = time.perf_counter()
    for t in range(1, iterations + 1):
        batch_gen, noise_gen = streams.torch("batch", t), streams.torch("noise", t)
        u = torch.rand(n, B, generator=batch_gen, dtype=torch.float64)
        noise = torch.randn((n, task.dim), generator=noise_gen, dtype=task.dtype) if sigma > 0 else None
        eta = schedule(t)
        sent = []
        for i in range(n):
            idx = (u[i] * int(task.counts[i])).long()
            theta = x[i].clone().requires_grad_(True)
            loss = task.loss(theta, task.X[i, idx], task.y[i, idx])
            (g,) = torch.autograd.grad(loss, theta)
            if clip is not None:
                norm = float(g.norm())
                if norm > clip:
                    g = g * (clip / norm)
            if noise is not None:
                g = g + sigma * noise[i]
            sent.append(x[i] - eta * g)
        x = [sum(W[i, j] * sent[j] for j in neigh[i]) for i in range(n)]
    seconds = time.perf_counter() - start
    return torch.stack(x), seconds


__all__ = ["loop_private_dsgd"]
