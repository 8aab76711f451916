"""A straightforward per-agent Python loop of private D-SGD: the baseline the simulator is checked and timed against.

Each agent draws its own mini-batch and its own noise from its own keys — (``batch``, round, agent, agent) and
(``noise``, round, agent, agent) of the run's root seed — computes the gradient of its own batch at its own model (the
task's gradient function), clips it, adds the noise, and combines its neighbours' messages in the canonical order
(own term first, then neighbours by increasing index). Nothing in one agent's computation reads another agent's key
or data: it is what one process per agent would do. Its draws and its combination order are exactly the
simulator's with the sparse (canonical-order) Comm.

Which gradient kernel call an agent makes is ``shape``:

* ``"agent"`` (default; the timing baseline): one row, the agent's model on its batch — what a process holding one
  agent computes. It equals the simulator's row only to rounding: ATen processes a tensor's elements in vector
  blocks and the remainder one by one (a vectorised ``sigmoid`` and the scalar one differ in the last bit), and which
  elements fall in the remainder depends on the tensor's size and the CPU's vector width — one row of 8 logits is a
  whole AVX2 block but a remainder under AVX-512, 6 rows of 8 are whole blocks under both.
* ``"network"``: the same kernel at the simulator's shape — the agent's model and batch copied into all n rows, its
  own row read back (the gradient and its clipping; adding the noise and mixing are elementwise, correctly rounded
  at any position). The kernels then do, on the agent's row, the same operations in the same order as on the
  simulator's row i, whatever the CPU, its vector width or its thread count (same shape, same position; no kernel
  mixes rows). This is what makes the bit-for-bit test exact by construction (tests/test_simulator.py).
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
                      clip: float | None, sigma: float, gradient: str = "auto",
                      shape: str = "agent") -> tuple[torch.Tensor, float]:
    """Per-agent loop of x_i ← Σ_j W_ij (x_j − η (clip(g_j) + σ ξ_j)), each gradient through the kernel call
    ``shape`` names (module docstring). Returns (final models (n, d), seconds)."""
    if shape not in ("agent", "network"):
        raise ValueError(f"shape must be 'agent' or 'network', got {shape!r}")
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
            own = (x[i][None], task.gather(torch.tensor([i]), idx[None]))
            if shape == "network":  # the simulator's shape: this agent in every row, its own row (row i) read back
                own, row = _rows(own, n), i
            else:
                row = 0
            g = grad(*own)
            if clip is not None:
                g = clip_rows(g, clip)
            g = g[row]
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


def _rows(value, n: int):
    """Every tensor of ``value`` (nested tuples) with its one row repeated to n rows, contiguous."""
    if isinstance(value, torch.Tensor):
        return value.expand(n, *value.shape[1:]).contiguous()
    return tuple(_rows(v, n) for v in value)


__all__ = ["loop_private_dsgd"]
