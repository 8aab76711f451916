"""The environment privdl's own processes start with: the ``privdl`` command (:func:`privdl.cli.main`), a worker
started as ``python -m privdl.runtime`` (torchrun), and the processes they spawn (``--jobs`` helpers,
:func:`privdl.experiment.runner.run_parallel`; ``--procs`` workers, :func:`privdl.runtime.launch`). ``import
privdl`` sets nothing: a user's own process keeps its environment, and calls :func:`apply` itself, before torch is
imported, for the command's behaviour.

Two variables, each read by a library when torch loads or allocates, so they must be set before that; a value the
user has set is kept, and any of the wait-policy variables set leaves the policy alone. Nothing else changes: no
value, no result.

* ``THP_MEM_ALLOC_ENABLE=1`` — large tensors on transparent huge pages: PyTorch's own switch, read at its first
  allocation of 2 MiB or more. Fresh activations otherwise cost one page fault per 4 KiB; a seed-004 CPU run takes
  12–16× fewer faults and runs 1.14× faster at one thread where the kernel offers huge pages on request
  (BENCHMARKS.md). ``THP_MEM_ALLOC_ENABLE=0`` set by the user is kept.
* ``GOMP_SPINCOUNT=3000`` — idle intra-op threads spin briefly, then sleep: torch's CPU wheel runs its thread pool
  on libgomp, whose idle threads spin 300 000 times before they sleep. Alone on the machine that costs nothing;
  beside other busy processes (several sweeps at once) a thread that spins holds a core that the pool's other
  thread needs, and every parallel region waits for a thread the system has descheduled: a CNN run took 3.1× longer
  beside two busy processes than alone, 2.2× with 3000 spins (tens of µs: still enough to catch a step's next
  parallel region, so no cost alone); passive waiting (no spin) costs 1.4× alone. Measured in BENCHMARKS.md, "A run
  beside busy processes". libgomp reads the variable when torch loads it. ``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or
  ``KMP_BLOCKTIME`` set by the user wins. (Small runs take one thread and no pool at all:
  :func:`privdl.experiment.threads.auto_threads`.)

This module imports nothing but the standard library, so that its callers can run it before torch loads.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping, MutableMapping

#: the variables by which a user chooses how idle OpenMP threads wait (any one set: privdl sets no spin count)
WAIT_POLICY = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables privdl's processes would set in an environment ``environ`` (the user's choices kept: only
    those not yet decided)."""
    out = {}
    if "THP_MEM_ALLOC_ENABLE" not in environ:
        out["THP_MEM_ALLOC_ENABLE"] = "1"
    if not any(k in environ for k in WAIT_POLICY):
        out["GOMP_SPINCOUNT"] = "3000"
    return out


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :func:`defaults` in ``environ`` (default ``os.environ``, this process's: call it before torch is
    imported); returns what it set. What privdl's entry points call first."""
    environ = os.environ if environ is None else environ
    added = defaults(environ)
    environ.update(added)
    return added


@contextmanager
def for_children() -> Iterator[dict[str, str]]:
    """Within the block, ``os.environ`` holds :func:`defaults`, so processes started there (spawned helpers and
    workers) begin with them; on leaving, the variables it added are removed again, so the calling process — a
    user's, importing privdl — keeps its own environment. Inside the ``privdl`` command they are already set and
    nothing changes."""
    added = apply()
    try:
        yield added
    finally:
        for key, value in added.items():
            if os.environ.get(key) == value:
                del os.environ[key]


def before_exit() -> None:
    """What privdl's own processes do last, once their work is written: move every object to the garbage
    collector's permanent generation (``gc.freeze``), which the interpreter's collections at exit skip. With torch
    loaded those collections walk millions of objects: 1.2–1.5 s of CPU per process on a busy core, serial at the
    end of every ``--procs`` worker and then of the launcher that waits for them (BENCHMARKS.md, "Start-up (issue
    44)"); frozen, the exit takes 0.2 s. Nothing else changes: objects are still freed by their reference counts
    and atexit handlers run; garbage left in reference cycles is returned to the system with the process."""
    import gc

    gc.freeze()


__all__ = ["WAIT_POLICY", "apply", "before_exit", "defaults", "for_children"]
