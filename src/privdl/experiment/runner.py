"""Run every point of an experiment's sweep, skipping finished runs, with a progress bar."""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

import privdl
from privdl.experiment.build import build
from privdl.experiment.config import RunSpec, expand
from privdl.experiment.store import ResultStore
from privdl.simulator import simulate


@dataclass
class ExperimentSummary:
    out: Path
    runs: int
    executed: int
    skipped: int
    results: Path
    seconds: float


def run_one(spec: RunSpec, on_step=None) -> tuple[list[tuple[int, str, float]], dict]:
    cfg = spec.config
    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    c = build(cfg)
    result = simulate(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism,
                      schedule=c.schedule, iterations=cfg["iterations"], seed=cfg["seed"],
                      eval_every=cfg["eval_every"], gradient=cfg["gradient"], sparse=c.sparse, on_step=on_step,
                      device=cfg.get("device", "cpu"))
    final = {m: v for t, m, v in result.records if t == cfg["iterations"]}
    manifest = {
        "run_id": spec.run_id,
        "status": "complete",
        "config": cfg,
        "sweep": spec.sweep,
        "privdl_version": privdl.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "seeds": {"run": cfg["seed"], "network": cfg["network"].get("seed", 0), "data": cfg["task"].get("seed", 0),
                  "streams": "keyed (run seed, purpose, iteration): purposes init, batch, noise"},
        "network": c.network.facts(),
        "W_fingerprint": c.network.fingerprint,
        "task": c.task.describe(),
        "mechanism": c.mechanism.describe(),
        "privacy_ledger": [e.to_dict() for e in c.mechanism.ledger()],
        "seconds": result.seconds,
        "iterations_per_second": cfg["iterations"] / result.seconds if result.seconds > 0 else math.inf,
        "final_metrics": final,
    }
    return result.records, manifest


def run_experiment(cfg: dict, out: str | Path, *, progress: bool = True) -> ExperimentSummary:
    """Run (or resume) the experiment ``cfg`` into directory ``out``."""
    start = time.perf_counter()
    runs, axes = expand(cfg)
    store = ResultStore(out)
    store.claim(cfg)
    unique = list({r.run_id: r for r in runs}.values())
    todo = [r for r in unique if not store.is_done(r.run_id)]
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  disable=not progress, transient=False) as bar:
        overall = bar.add_task(f"{cfg.get('name', 'experiment')}: runs", total=len(unique),
                               completed=len(unique) - len(todo))
        for spec in todo:
            iters = spec.config["iterations"]
            label = ", ".join(f"{k}={v}" for k, v in spec.sweep.items() if v is not None) or spec.run_id
            current = bar.add_task(f"  {label}", total=iters)
            every = max(1, iters // 100)

            def tick(t: int, _task=current, _every=every) -> None:
                if t % _every == 0:
                    bar.update(_task, completed=t)

            rows, manifest = run_one(spec, on_step=tick)
            store.save_run(spec.run_id, rows, manifest)
            bar.update(current, completed=iters, visible=False)
            bar.advance(overall)
    results = store.write_results(axes, [(r.run_id, r.sweep) for r in runs])
    return ExperimentSummary(Path(out), len(unique), len(todo), len(unique) - len(todo), results,
                             time.perf_counter() - start)
