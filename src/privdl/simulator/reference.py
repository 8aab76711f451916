"""A straightforward per-agent Python loop of private D-SGD: the baseline the simulator is checked and timed against.

Each agent draws its own mini-batch and its own noise from its own keys — (``batch``, round, agent, agent) and
(``noise``, round, agent, agent) of the run's root seed — computes the gradient of its own batch at its own model (the
task's gradient function on one row), clips it, adds the noise, and combines its neighbours' messages in the
canonical order (own term first, then neighbours by increasing index). Nothing in one agent's computation reads
another agent's key or data: it is what one process per agent would do. Its draws and its combination order are
exactly the simulator's with the sparse (canonical-order) Comm, so the two agree bit for bit wherever the gradient
kernel rounds a one-row call as it rounds the batched call (tested in float64 on breast_cancer); on larger shapes
(a9a) batched BLAS kernels round differently and the runs agree to ~1e-15.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from privdl.gradients import batch_gradient_fn
from privdl.keys import RootKeys, fold, normal, uniform
from privdl.mechanisms.base import clip_rows
from privdl.network.network import Network
from privdl.schedules import Schedule
from privdl.tasks.supervised import SupervisedTask


def loop_private_dsgd(task: SupervisedTask, network: Network, schedule: Schedule, *, iterations: int, seed: int,
                      clip: float | None, sigma: float, gradient: str = "auto") -> tuple[torch.Tensor, float]:
    """Per-agent loop of x_i ← Σ_j W_ij (x_j − η (clip(g_j) + σ ξ_j)). Returns (final models (n, d), seconds)."""
    grad = batch_gradient_fn(task, gradient)
    source = RootKeys(int(seed))
    n, B = task.n, task.batch_size
    g0 = torch.Generator()
    g0.manual_seed(source.public("init") >> 1)
    x0 = task.init_params(g0).to(task.dtype)
    x = [x0.clone() for _ in range(n)]
    W = network.W
    neigh = [[j for j in range(n) if j != i and W[i, j] != 0] for i in range(n)]
    counts = task.counts.tolist()
    start = time.perf_counter()
    for t in range(1, iterations + 1):
        eta = schedule(t)
        sent = []
        for i in range(n):
            me = np.array([i])
            u = uniform(fold(source.own("batch", me, me), t), B)[0]
            idx = (u * counts[i]).long()
            g = grad(x[i][None], task.gather(torch.tensor([i]), idx[None]))[0]
            if clip is not None:
                g = clip_rows(g[None], clip)[0]
            if sigma > 0:
                g = g + sigma * normal(fold(source.own("noise", me, me), t), task.dim, task.dtype)[0]
            sent.append(x[i] - eta * g)
        new = []
        for i in range(n):
            acc = float(W[i, i]) * sent[i]
            for j in neigh[i]:
                acc = acc + float(W[i, j]) * sent[j]
            new.append(acc)
        x = new
    seconds = time.perf_counter() - start
    return torch.stack(x), seconds


__all__ = ["loop_private_dsgd"]
