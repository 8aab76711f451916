"""torch's intra-op threads while a run computes: the config's ``threads``, else one thread where no kernel of a
round would be split among threads (ATen's grain), else the process's count — set around one run or one stacked
batch and restored after.

Separate from the runs themselves (:mod:`privdl.experiment.run_pipeline`): the rule is about the process (the
environment, the machine's other load: BENCHMARKS.md, "A run beside busy processes"), and the distributed runtime's
workers apply it around their own runs.
"""

from __future__ import annotations

import contextlib
import os

import torch

from privdl.experiment.capacity import batch_inputs

#: ATen splits a kernel among its intra-op threads only above this many elements (``at::internal::GRAIN_SIZE``)
GRAIN = 32768
#: OpenMP / BLAS thread counts a user may set; any of them set, the process's thread count is the user's choice
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def auto_threads(task, rows: int, need=None) -> int | None:
    """The intra-op threads privdl picks for ``rows`` rows of ``task`` when neither the config (``threads``) nor the
    environment (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``) says: one thread when the largest tensor of a round — the
    rows' parameters or their batch of inputs — stays below ATen's grain, so that no kernel would be split among
    threads and the pool could only cost (every call that still enters it waits for its threads, milliseconds each
    when other processes hold the cores); None (the process's count) otherwise. BENCHMARKS.md, "A run beside busy
    processes": the issue's logistic D-SGD + DECOR run is 1.2× faster alone and 22× faster beside two busy processes
    than at torch's default."""
    if any(v in os.environ for v in THREAD_VARIABLES):
        return None
    return 1 if rows * max(task.dim, batch_inputs(task, need)) < GRAIN else None


@contextlib.contextmanager
def intra_op_threads(cfg: dict, task, rows: int, need=None):
    """torch's intra-op threads while one run or one stacked batch computes: the config's ``threads`` when set, else
    :func:`auto_threads`, else the process's count (torch's default, or a ``--jobs`` process's share); restored
    after. The manifest records the count the run used (``process.threads``): above ATen's grain it decides the
    last bits of a reduction (docs/ARCHITECTURE.md, "What is bit-exact")."""
    before = torch.get_num_threads()
    want = int(cfg.get("threads") or auto_threads(task, rows, need) or before)
    if want != before:
        torch.set_num_threads(want)
    try:
        yield want
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
