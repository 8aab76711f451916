"""Which runs of a sweep are stacked on one replica axis, and in which order the groups run: runs that share task,
algorithm and length stack unless their config rules it out (not trained, ``batch_replicas = 1``, a mechanism or
algorithm that never stacks, agreed keys, a backend that does not stack, DPDL on the CPU); the costliest groups
first.

Separate from running the groups (:mod:`privdl.experiment.runner`): the plan is decided from configs alone, before
any run is built, and its benchmark (benchmarks/bench_grid_stack.py) and tests read it without running.
"""

from __future__ import annotations

import json
from typing import Sequence

from privdl.errors import PrivdlError
from privdl.experiment.backends import BACKENDS
from privdl.experiment.build import build_algorithm
from privdl.experiment.capacity import runs_on_cpu
from privdl.experiment.config import RunSpec
from privdl.experiment.progress import run_cost
from privdl.mechanisms.stack import may_stack
from privdl.runtime_spec import RuntimeSpec

#: sections that may differ between runs of one stacked batch
PER_REPLICA = ("seed", "network", "mechanism", "schedule", "name", "description", "threads")


def _batch_key(spec: RunSpec) -> str:
    cfg = {k: v for k, v in spec.config.items() if k not in PER_REPLICA}
    if spec.config["task"].get("seed") == "run":  # the data follow the run seed: a task per seed
        cfg["task_seed"] = spec.config["seed"]
    cfg["network_n"] = spec.config["network"].get("n") if not spec.config["network"].get("file") else spec.run_id
    return json.dumps(cfg, sort_keys=True, default=str)


def _alone(cfg: dict, algorithms: dict[str, tuple[bool, bool]]) -> bool:
    """A run that never shares a replica axis, known from its config: not trained, ``batch_replicas = 1``, a mechanism
    that never stacks (``clip``, message mechanisms) or an algorithm that does not (CGA) — and, on the CPU with the
    automatic ``batch_replicas``, an algorithm with cross-gradients (DPDL): measured, its stacked rounds are no faster
    there (0.88–0.92×: the R·E-row lot draws and sorts leave the caches; BENCHMARKS.md, "Example-level grids
    stacked"), while one run per process keeps ``--jobs`` balanced; ``batch_replicas`` > 1 or a GPU stacks it.
    ``algorithms`` caches (stackable, cross) by config."""
    runtime = RuntimeSpec.of(cfg)
    if (not cfg.get("train", True) or cfg.get("batch_replicas") == 1 or not may_stack(cfg["mechanism"].get("name"))
            or not BACKENDS.get(runtime.backend).stacks
            or runtime.keys != "root"):
        return True
    key = json.dumps(cfg["algorithm"], sort_keys=True, default=str)
    if key not in algorithms:
        try:
            alg = build_algorithm(cfg)
            algorithms[key] = (alg.stackable, alg.cross)
        except PrivdlError:  # a bad algorithm is reported where the run is built
            algorithms[key] = (True, False)
    stackable, cross = algorithms[key]
    return not stackable or (cross and runs_on_cpu(cfg) and not cfg.get("batch_replicas"))


def plan(todo: Sequence[RunSpec]) -> list[list[RunSpec]]:
    """Groups of runs that may be stacked (same task, algorithm, length; training runs only). A run that cannot be
    stacked is a group of its own, so processes sharing a folder (``--jobs``) take such runs one by one. The costliest
    groups come first (:func:`run_cost` summed: a stacked DPDL batch before a lone non-private run), so processes
    taking them in turn end together instead of one waiting on a large batch started last."""
    groups: dict[str, list[RunSpec]] = {}
    singles: list[list[RunSpec]] = []
    algorithms: dict[str, tuple[bool, bool]] = {}
    for spec in todo:
        cfg = spec.config
        if _alone(cfg, algorithms):
            singles.append([spec])
        else:
            groups.setdefault(_batch_key(spec), []).append(spec)
    out = [g for g in groups.values()] + singles
    cost = {id(g): sum(run_cost(s.config) for s in g) for g in out}
    return sorted(out, key=lambda g: -cost[id(g)])  # stable: equal costs keep the grid's order
