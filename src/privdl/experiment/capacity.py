"""How many runs one stacked batch holds (the automatic ``batch_replicas``): a memory budget on the CPU, a share of
the free memory on a GPU, and on the CPU a cap on a per-example access's inputs (measured: stacking gains only while
they stay near the caches)."""

from __future__ import annotations

import math

import numpy as np
import torch

from privdl.device import resolve_device
from privdl.mechanisms.base import ClippedSum

#: numbers (model state plus one step's batch) a stacked batch may hold on the CPU, for the automatic
#: ``batch_replicas`` (≈ 256 MB in float64)
BATCH_BUDGET = 2**25
#: on a GPU: the share of its free memory a stacked batch's state and batch may take (the per-example work is done
#: in row groups bounded by ``privdl.gradients.ghost.GROUP_BUDGET`` / ``simulator.access.CHUNK_BUDGET`` on top)
GPU_SHARE = 0.25


def runs_on_cpu(cfg: dict) -> bool:
    """Whether a run of ``cfg`` computes on the CPU (``device`` "cpu", or "auto" where torch sees no GPU)."""
    device = str(cfg.get("device", "cpu"))
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def batch_inputs(task, need=None) -> int:
    """Numbers in one row's inputs of one access: examples × features (a task without examples: its dimension). The
    examples are the mini-batch, or for a per-example ``need`` its uniform batch or the largest expected Poisson lot."""
    features = int(np.prod(task.X.shape[2:])) if hasattr(task, "X") else task.dim
    examples = max(1, task.batch_size)
    if isinstance(need, ClippedSum):
        if need.batch is not None:
            examples = need.batch
        elif hasattr(task, "counts"):
            rates, counts = need.rates.reshape(-1).to(torch.float64), task.counts.to(torch.float64)
            examples = math.ceil(float((rates * counts).max() if rates.numel() in (1, counts.numel())
                                       else rates.max() * counts.max()))
    return max(1, examples) * features


def batch_budget(device: str = "cpu") -> int:
    """Numbers a stacked batch may hold on ``device``: :data:`BATCH_BUDGET` on the CPU; on a GPU
    :data:`GPU_SHARE` of the memory it has free now (in float64 numbers; a GPU that others fill gets fewer)."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return BATCH_BUDGET
    free, _ = torch.cuda.mem_get_info(dev)
    return int(GPU_SHARE * free) // 8


def replica_numbers(parts) -> int:
    """Numbers one replica of a stacked batch holds: its rows' model state (4 copies: parameters, the algorithm's
    state, the step's values) and one access's inputs — for an algorithm with cross-gradients (DPDL) also one
    batch per edge; for a per-example mechanism the lot's examples (the largest expected Poisson lot)."""
    n, need = parts.network.n, parts.mechanism.need
    accessed = n + (len(parts.network.edges) if parts.algorithm.cross else 0)
    return n * 4 * parts.task.dim + accessed * batch_inputs(parts.task, need)


#: on the CPU, the inputs (examples × features) one per-example access of a stacked batch may read: measured, a
#: stacked DP-SGD access gains only while its working set stays near the caches (a9a logistic regression, 12
#: replicas of 20 agents × lots of 64: 1.7×; seed 004's CNN, 6 replicas of 10 × 64 MNIST digits: 1.04×; lots of
#: 256: 0.87×; BENCHMARKS.md, "Example-level grids stacked")
CPU_ACCESS_BUDGET = 2**21


def capacity(cfg: dict, parts) -> int:
    """Replicas per stacked batch: the config's ``batch_replicas``, else as many as fit in :func:`batch_budget` —
    and on the CPU, for a per-example (DP-SGD) access, as many whose inputs stay within :data:`CPU_ACCESS_BUDGET`."""
    if cfg.get("batch_replicas"):
        return int(cfg["batch_replicas"])
    cap = batch_budget(str(cfg.get("device", "cpu"))) // max(replica_numbers(parts), 1)
    need = parts.mechanism.need
    if isinstance(need, ClippedSum) and runs_on_cpu(cfg):
        cap = min(cap, CPU_ACCESS_BUDGET // max(1, parts.network.n * batch_inputs(parts.task, need)))
    return max(1, cap)


__all__ = ["BATCH_BUDGET", "CPU_ACCESS_BUDGET", "GPU_SHARE", "batch_budget", "batch_inputs", "capacity",
           "replica_numbers", "runs_on_cpu"]
