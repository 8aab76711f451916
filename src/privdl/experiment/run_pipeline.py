"""One run, or one batch of runs stacked on the replica axis: the pipeline from a run's built components to its rows
and manifest — the intra-op threads, the backend's run (or the stacked simulation), the privacy ledger over the
accesses made, the manifest; a run with ``train = false`` is built, calibrated and accounted without training.

Separate from the experiment loop (:mod:`privdl.experiment.runner`), which decides which runs to take and saves
them: :func:`privdl.train` runs exactly this pipeline without any loop or results folder.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from privdl.agreement import keys_facts
from privdl.errors import ValidationError
from privdl.experiment.backends import backend_of, observers
from privdl.experiment.build import Components, build
from privdl.experiment.config import RunSpec
from privdl.experiment.run_manifest import finished_run, manifest, run_ledger
from privdl.experiment.run_state import run_checkpoints, secrets_identity
from privdl.experiment.threads import intra_op_threads
from privdl.keys import drawn
from privdl.privacy.ledger import Ledger
from privdl.runtime_spec import RuntimeSpec
from privdl.simulator import Replica, simulate_replicas
from privdl.simulator.checkpoint import Checkpoints

def _numeric(facts: dict) -> dict[str, float]:
    return {k: float(v) for k, v in facts.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


@dataclass
class Finished:
    """One finished run: its rows (iteration, metric, value), its manifest, the agents' final models (n, d; None
    for a run not trained), the noisy accesses made to every owner's data (None: not trained) and its privacy ledger
    — the object whose ``to_dict()`` the manifest holds."""

    records: list[tuple[int, str, float]]
    manifest: dict
    models: torch.Tensor | None
    accesses: torch.Tensor | None
    ledger: Ledger


def run_one(spec: RunSpec, on_step: Callable[[int], None] | None = None, *,
            components: Components | None = None, checkpoints: Path | None = None,
            resume: bool = False, secrets: Path | None = None) -> tuple[list[tuple[int, str, float]], dict]:
    """One run, alone: its rows (iteration, metric, value) and its manifest (:func:`run_components`)."""
    done = run_components(spec, components, on_step, checkpoints=checkpoints, resume=resume, secrets=secrets)
    return done.records, done.manifest


def run_components(spec: RunSpec, components: Components | None = None,
                   on_step: Callable[[int], None] | None = None, *, checkpoints: Path | None = None,
                   resume: bool = False, secrets: Path | None = None) -> Finished:
    """One run, alone, of ``spec`` with its built ``components`` (None: built from its config) — the one pipeline
    of a run, for ``privdl run`` (the runner's unstacked runs) and :func:`privdl.train` alike: the intra-op threads,
    the backend's run, the ledger and the manifest. ``checkpoints``: the run's checkpoint folder (written every
    ``runtime.checkpoint_every`` rounds); ``resume`` continues from the last one there. ``secrets``: the folder of an
    agreed-key run's agent secrets (:mod:`privdl.agreement.keystore`: a run started again replays what it
    released)."""
    c = components or build(spec.config)
    with intra_op_threads(spec.config, c.task, c.network.n, c.mechanism.need):
        ck = run_checkpoints([spec], c.network.n, None if checkpoints is None else [checkpoints], resume)
        return _run_one(spec, c, on_step, ck, resume, secrets)


def _run_one(spec: RunSpec, c: Components, on_step: Callable[[int], None] | None,
             ck: Checkpoints | None = None, resume: bool = False,
             secrets: Path | None = None) -> Finished:
    cfg = spec.config
    if not cfg.get("train", True):
        start = time.perf_counter()
        ledger = run_ledger(spec, c, None)
        facts = {**_numeric(c.mechanism.describe()), **({"epsilon": ledger.epsilon} if ledger.epsilon is not None
                                                         and math.isfinite(ledger.epsilon) else {})}
        rows = [(0, k, v) for k, v in facts.items()]
        return Finished(rows, manifest(spec, c, seconds=time.perf_counter() - start, rows=rows, accesses=None,
                                       ledger=ledger), None, None, ledger)
    agreed = RuntimeSpec.of(cfg).agreed
    resumed = ck.latest() if (ck is not None and resume) else None
    before = drawn()
    ran = backend_of(cfg).run(spec, c, on_step=on_step, checkpoints=ck, resume=resume, secrets=secrets,
                              store_identity=secrets_identity(spec) if agreed else None)
    result, placement, restored = ran.result, ran.placement, ran.restored
    after = drawn()
    ledger = run_ledger(spec, c, result.accesses)
    records, out = finished_run(spec, c, result.records, seconds=result.seconds, accesses=result.accesses,
                                keys=keys_facts(cfg, restored=restored,
                                                draws={k: after[k] - before[k] for k in after},
                                                gathered="the simulator's process"), ledger=ledger)
    out["bytes_per_tag"] = result.extra.get("bytes", {})
    if placement is not None:
        out["placement"] = placement
    if ck is not None:
        out["checkpoints"] = {"every": ck.every, "resumed_from_round": resumed}
    return Finished(records, out, result.final, result.accesses, ledger)


def run_batch(specs: Sequence[RunSpec], parts: Sequence[Components],
              on_step: Callable[[int], None] | None = None, *, checkpoints: Sequence[Path] | None = None,
              resume: bool = False) -> list[tuple[list[tuple[int, str, float]], dict]]:
    """Runs that share task, algorithm and length, stacked on the replica axis (``checkpoints``: one folder per
    run, as :func:`run_one`)."""
    with intra_op_threads(specs[0].config, parts[0].task, len(specs) * parts[0].network.n,
                          parts[0].mechanism.need):
        ck = run_checkpoints(specs, parts[0].network.n, checkpoints, resume)
        return _run_batch(specs, parts, on_step, ck, resume)


def _run_batch(specs: Sequence[RunSpec], parts: Sequence[Components], on_step: Callable[[int], None] | None,
               ck: Checkpoints | None = None,
               resume: bool = False) -> list[tuple[list[tuple[int, str, float]], dict]]:
    cfg = specs[0].config
    if any(RuntimeSpec.of(s.config).agreed for s in specs):
        raise ValidationError("runs with agreed keys are not stacked: each agrees its own keys (run_one)")
    resumed = ck.latest() if (ck is not None and resume) else None
    before = drawn()
    res = simulate_replicas(task=parts[0].task, algorithm=parts[0].algorithm,
                            replicas=[Replica(c.network, c.mechanism, c.schedule, s.config["seed"])
                                      for s, c in zip(specs, parts)],
                            iterations=cfg["iterations"], eval_every=cfg["eval_every"], gradient=cfg["gradient"],
                            on_step=on_step, device=cfg.get("device", "cpu"),
                            observers=observers(cfg, parts[0], len(specs) * parts[0].network.n), checkpoints=ck,
                            resume=resume)
    after = drawn()
    draws = {k: after[k] - before[k] for k in after}  # the batch's, all replicas together
    out = []
    for r, (spec, c) in enumerate(zip(specs, parts)):
        batch = {"replicas": len(specs), "position": r, "seconds": res.seconds}
        records, man = finished_run(spec, c, res.records[r], seconds=res.seconds, accesses=res.accesses[r],
                                    batch=batch, keys=keys_facts(spec.config, restored=False, draws=draws))
        man["bytes_per_tag"] = res.bytes[r]
        if ck is not None:
            man["checkpoints"] = {"every": ck.every, "resumed_from_round": resumed}
        out.append((records, man))
    return out
