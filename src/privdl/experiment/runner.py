"""Run every point of an experiment's sweep, skipping finished runs, with a progress bar.

Runs that share their task, algorithm and length (and differ in network, mechanism, step size or seed) are stacked on
the replica axis and stepped together (:func:`privdl.simulator.simulate_replicas`) when their mechanisms can be
stacked; each still gets its own metrics, manifest and privacy ledger, exactly as if it had run alone (it draws the
same numbers; its results agree to rounding). ``batch_replicas = 1`` turns this off. ``train = false`` builds,
calibrates and accounts every run without training (design sweeps: the mechanism's facts become the metrics).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

import privdl
from privdl.agreement import keys_facts
from privdl.errors import ConfigError, PrivdlError, ValidationError
from privdl.experiment.backends import BACKENDS, backend_of, observers
from privdl.experiment.build import Components, build, build_algorithm, build_network, build_task, input_files
from privdl.experiment.capacity import batch_inputs, capacity, runs_on_cpu
from privdl.experiment.config import RunSpec, expand
from privdl.experiment.outcome import ExperimentSummary  # noqa: F401 (re-exported: its home before)
from privdl.experiment.progress import Lines, Tally, format_duration, run_cost  # noqa: F401 (re-exported)
from privdl.experiment.store import ResultStore
from privdl.mechanisms.stack import may_stack, need_signature
from privdl.process_defaults import for_children
from privdl.keys import drawn
from privdl.privacy.ledger import Ledger, statement
from privdl.runtime_spec import RuntimeSpec
from privdl.simulator import Replica, simulate_replicas, stackable
from privdl.simulator.checkpoint import Checkpoints


#: seconds between two looks at the runs other processes hold, while this process waits for them
WAIT_POLL = 0.5
#: ATen splits a kernel among its intra-op threads only above this many elements (``at::internal::GRAIN_SIZE``)
GRAIN = 32768
#: OpenMP / BLAS thread counts a user may set; any of them set, the process's thread count is the user's choice
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: sections that may differ between runs of one stacked batch
PER_REPLICA = ("seed", "network", "mechanism", "schedule", "name", "description", "threads")


def nonfinite_metrics(rows: Iterable[tuple[int, str, float]]) -> list[str]:
    """The metrics whose last recorded value is nan or ±inf: a run that diverged or overflowed."""
    last: dict[str, float] = {}
    for _, name, value in rows:
        last[name] = value
    return sorted(k for k, v in last.items() if isinstance(v, float) and not math.isfinite(v))


def _numeric(facts: dict) -> dict[str, float]:
    return {k: float(v) for k, v in facts.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def _utc(stamp: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat(timespec="seconds")


@functools.cache  # reading the packages' metadata costs ≈ 8 ms; a sweep writes one manifest per run
def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("numpy", "scipy", "dp-accounting", "torch", "networkx"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:  # pragma: no cover - all are dependencies
            out[pkg] = "absent"
    return out


#: the manifest's statement of agreed keys (runtime.keys = "agreed"); the threat model is in its ``keys`` section
KEYS_AGREED = ("agreed: X25519 between the agents that share a draw (bound to both public keys and the run), "
               "256-bit HKDF-SHA256 keys per (purpose, holders), requester and counter folded one way (BLAKE2b-256), "
               "ChaCha20 keystreams; group secrets wrapped with ChaCha20-Poly1305; own draws from a per-agent 256-bit "
               "secret; the initial model from the root seed (public). Threat model: see keys.threat_model")


def run_ledger(spec: RunSpec, c: Components, accesses: torch.Tensor | None) -> Ledger:
    """A run's privacy statement (:func:`privdl.privacy.ledger.statement`) over the noisy accesses it made
    (``accesses``: per owner; None: the ones its mechanism covers) — the ledger its manifest holds."""
    return statement(c.mechanism, c.algorithm, iterations=spec.config["iterations"], edges=c.network.edges,
                     accesses=accesses)


def manifest(spec: RunSpec, c: Components, *, seconds: float, rows: list[tuple[int, str, float]],
             accesses: torch.Tensor | None, batch: dict | None = None, keys: dict | None = None,
             ledger: Ledger | None = None) -> dict:
    """A finished run's manifest: its config, code, seeds, components' facts, privacy ledger (``ledger``, else
    :func:`run_ledger`), process and final metrics."""
    cfg = spec.config
    last = max((r[0] for r in rows), default=0)
    final = {m: v for t, m, v in rows if t == last}
    ledger = ledger if ledger is not None else run_ledger(spec, c, accesses)
    agreed = RuntimeSpec.of(cfg).agreed
    return {
        "run_id": spec.run_id,
        "status": "complete",
        "config": cfg,
        "sweep": spec.sweep,
        "privdl_version": privdl.__version__,
        "privdl_source_sha256": privdl.source_hash(),
        "torch_version": torch.__version__,
        "versions": dict(_versions()),
        "python": platform.python_version(),
        "seeds": {"run": cfg["seed"], "network": cfg["network"].get("seed", 0), "data": cfg["task"].get("seed", 0),
                  "keys": (KEYS_AGREED if agreed else
                           "root seed → (purpose, access, agent[, neighbour]) and shared keys per holder set")},
        "network": c.network.facts(),
        "W_fingerprint": c.network.fingerprint,
        **({"dynamics": c.network.dynamics.law()} if c.network.dynamics is not None else {}),
        "input_files": input_files(cfg),
        "task": c.task.describe(),
        "mechanism": c.mechanism.describe(),
        **({"algorithm": {"name": c.algorithm.name, **c.algorithm.facts}} if c.algorithm.facts else {}),
        "privacy_ledger": [{**ledger.to_dict(), "keys": "agreed" if agreed else "root"}],
        **({"keys": keys} if keys is not None else {}),
        "trained": cfg.get("train", True),
        "batch": batch or {"replicas": 1},
        "seconds": seconds,
        "finished_at": _utc(time.time()),
        "started_at": _utc(time.time() - seconds),
        # which process of a sharded / --jobs run, and what decides its last bits besides the code and the seed: the
        # kernels ATen picked for this CPU and the intra-op threads (docs/ARCHITECTURE.md, "What is bit-exact")
        "process": {"host": platform.node(), "pid": os.getpid(), "threads": torch.get_num_threads(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine()},
        "device_info": device_info(c.task.device),
        "iterations_per_second": cfg["iterations"] / seconds if seconds > 0 and cfg.get("train", True) else None,
        "final_metrics": final,
    }


def device_info(device: torch.device) -> dict:
    """Where a run computed: the device, and for a GPU its name and CUDA version (for merged grids: the device is
    where a run ran, not what it is)."""
    dev = torch.device(device)
    out: dict = {"type": dev.type, "device": str(dev)}
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        out.update(name=torch.cuda.get_device_name(index), cuda=torch.version.cuda)
    else:
        out["name"] = platform.processor() or platform.machine()
    return out


def finished_run(spec: RunSpec, c: Components, rows: list[tuple[int, str, float]], **facts
                 ) -> tuple[list[tuple[int, str, float]], dict]:
    """A finished run's rows and manifest (:func:`manifest` with ``facts``): a DSG-RMS / EDSG-RMS run's rows gain
    seed 002's error bounds and its manifest their account (:func:`privdl.algorithms.rms_bounds.with_error_bounds`)."""
    from privdl.algorithms.rms_bounds import with_error_bounds

    rows, theory = with_error_bounds(spec.config, c, rows)
    out = manifest(spec, c, rows=rows, **facts)
    if theory is not None:
        out["error_bounds"] = theory
    return rows, out


def checkpoint_identity(spec: RunSpec) -> dict:
    """What a run's checkpoints are compared against on resume: the run, its configuration (what its numbers depend
    on: not where or how it runs — [runtime], threads, device —, so a run checkpointed by 2 slices resumes with 3 or
    in the simulator), the code."""
    from privdl.experiment.run_identity import identity

    what = identity(spec.config)
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"run_id": spec.run_id, "config_digest": digest, "source": privdl.source_hash()}


def run_checkpoints(specs: Sequence[RunSpec], n: int, folders: Sequence[Path] | None,
                    resume: bool) -> Checkpoints | None:
    """The checkpoints of a run (or of the runs of a stacked batch) when its config asks for them
    (``runtime.checkpoint_every``) and the runner gives their folders; without ``resume`` old ones are removed."""
    every = RuntimeSpec.of(specs[0].config).checkpoint_every
    if not every or folders is None:
        return None
    ck = Checkpoints(folders, [checkpoint_identity(s) for s in specs], n=n, every=int(every))
    if not resume:
        ck.clear()
    return ck


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


def secrets_folder(run_dir: Path) -> Path:
    """Where an agreed-key run keeps its agents' secrets until its results are saved."""
    return run_dir / "keys"


def secrets_identity(spec: RunSpec) -> dict:
    """What an agreed-key run's stored secrets are bound to besides its salt: a replay is safe only under the same
    configuration, privdl source and input files (:mod:`privdl.agreement.keystore`)."""
    return {**checkpoint_identity(spec), "inputs": input_files(spec.config)}


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


def _batch_key(spec: RunSpec) -> str:
    cfg = {k: v for k, v in spec.config.items() if k not in PER_REPLICA}
    if spec.config["task"].get("seed") == "run":  # the data follow the run seed: a task per seed
        cfg["task_seed"] = spec.config["seed"]
    cfg["network_n"] = spec.config["network"].get("n") if not spec.config["network"].get("file") else spec.run_id
    return json.dumps(cfg, sort_keys=True, default=str)


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


def check_inputs_unchanged(store: ResultStore, finished: Iterable[RunSpec]) -> None:
    """Refuse to reuse a finished run whose input file (``network.file``, ``mechanism.file``: named in its id by path)
    now holds other bytes than when it ran: its results would silently stand for another W or covariance."""
    unchecked = 0
    for spec in finished:
        now = input_files(spec.config)
        if not now:
            continue
        then = store.manifest(spec.run_id).get("input_files")
        if then is None:
            unchecked += 1
            continue
        changed = [k for k, digest in now.items() if k in then and then[k] != digest]
        if changed:
            raise ConfigError(
                f"{', '.join(changed)} of finished run {spec.run_id} in {store.root} changed since the run (sha256 "
                f"{then[changed[0]][:12]}… then, {now[changed[0]][:12]}… now): its results would stand for another "
                f"file. Restore the file, or give the experiment with the new file another output folder")
    if unchecked:
        warnings.warn(f"{unchecked} finished run(s) in {store.root} read input files but predate privdl's record of "
                      "their content (manifest key input_files): they are reused unchecked", stacklevel=2)


def run_experiment(cfg: dict, out: str | Path, *, progress: bool | Callable[[str], None] = True,
                   shard: tuple[int, int] | None = None,
                   on_done: Callable[[str, list, dict], None] | None = None, jobs: int = 1,
                   others_running: Callable[[], bool] | None = None, wait: bool = True,
                   resume: bool = False) -> ExperimentSummary:
    """Run (or resume) the experiment ``cfg`` into directory ``out``. ``shard = (i, k)`` runs only every k-th
    distinct run starting at i (k processes can share one directory). ``progress``: a live bar (True), nothing
    (False), or a function that receives plain lines with the count and an estimate of the time left (logs).
    ``jobs`` > 1 runs the stacked groups in that many processes on this machine (:func:`run_parallel`);
    ``others_running`` (its helpers' liveness) keeps the progress counting their runs after this process's last.
    Runs another process holds (a second ``privdl run`` on the same ``out``) are left to it; with ``wait``, this
    process then waits until they are finished — running any whose holder is gone
    (:meth:`~privdl.experiment.store.ResultStore.lock`) — so that its results.csv holds every run."""
    if check_jobs(jobs) > 1:
        return run_parallel(cfg, out, jobs=jobs, progress=progress, shard=shard, on_done=on_done, resume=resume)
    start = time.perf_counter()
    runs, axes = expand(cfg)
    store = ResultStore(out)
    store.claim(cfg)
    store.check_writable()
    unique = distinct_runs(runs, shard)
    todo = [r for r in unique if not store.is_done(r.run_id)]
    finished = {r.run_id for r in unique} - {r.run_id for r in todo}
    check_inputs_unchanged(store, (r for r in unique if r.run_id in finished))
    nonfinite: dict[str, list[str]] = {}  # run id → its nan/inf metrics, filled as runs are saved
    costs = {r.run_id: run_cost(r.config) for r in unique}
    lines = Lines(cfg.get("name", "experiment"), costs, finished, progress) if callable(progress) else None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  disable=progress is not True, transient=False) as bar:
        overall = bar.add_task(f"{cfg.get('name', 'experiment')}: runs", total=len(unique),
                               completed=len(unique) - len(todo))

        def show(done: set[str]) -> None:
            bar.update(overall, completed=len(done))
            if lines is not None:
                lines.update(done)

        tally = Tally(store, [r.run_id for r in unique], finished, show)

        def save(spec: RunSpec, rows: list, man: dict) -> None:
            save_all([(spec, rows, man)])

        def save_all(items: list[tuple[RunSpec, list, dict]]) -> None:
            save_finished(store, items, nonfinite)
            tally.add([spec.run_id for spec, _, _ in items])
            if on_done is not None:
                for spec, rows, man in items:
                    on_done(spec.run_id, rows, man)

        def _execute(group: list[RunSpec]) -> None:
            iters = group[0].config["iterations"]
            label = f"  {len(group)} stacked runs" if len(group) > 1 else "  " + run_label(group[0])
            current = bar.add_task(label, total=iters)
            every = max(1, iters // 100)
            ids = [s.run_id for s in group]  # the runs under way: the group, or the stacked chunk that runs

            def tick(t: int, _task=current, _every=every) -> None:
                if t % _every == 0:
                    bar.update(_task, completed=t)
                    if lines is not None:  # the estimate counts the rounds measured, stacked runs together
                        lines.advance(ids, t / iters)
                    tally.look()

            def folder(spec: RunSpec) -> Path:
                return store.run_dir(spec.run_id) / "checkpoints"

            if len(group) == 1:
                rows, man = run_one(group[0], on_step=tick, checkpoints=folder(group[0]), resume=resume,
                                    secrets=secrets_folder(store.run_dir(group[0].run_id)))
                save(group[0], rows, man)
            else:
                first = group[0].config
                task = build_task(first, build_network(first["network"], first["seed"], first.get("base_dir")).n)
                parts = [build(s.config, task=task) for s in group]
                by_n: dict[tuple, list[int]] = {}  # stacked together: same n, same data access
                for k, c in enumerate(parts):
                    by_n.setdefault((c.network.n, need_signature(c.mechanism.need)), []).append(k)
                for members in by_n.values():
                    cap = capacity(group[0].config, parts[members[0]])
                    for lo in range(0, len(members), cap):
                        chunk = members[lo:lo + cap]
                        specs, comps = [group[k] for k in chunk], [parts[k] for k in chunk]
                        ids[:] = [s.run_id for s in specs]
                        if (len(chunk) > 1 and comps[0].algorithm.stackable
                                and all(c.network.dynamics is None for c in comps)  # (W(t): run one by one)
                                and stackable([c.mechanism for c in comps], comps[0].network.n,
                                              cross=comps[0].algorithm.cross)):
                            save_all([(spec, rows, man) for spec, (rows, man)
                                      in zip(specs, run_batch(specs, comps, on_step=tick,
                                                              checkpoints=[folder(s) for s in specs],
                                                              resume=resume))])
                        else:
                            for spec, c in zip(specs, comps):
                                ids[:] = [spec.run_id]
                                rows, man = run_one(spec, on_step=tick, components=c, checkpoints=folder(spec),
                                                    resume=resume, secrets=secrets_folder(store.run_dir(spec.run_id)))
                                save(spec, rows, man)
            bar.update(current, completed=iters, visible=False)

        ran: set[str] = set()
        last_results, every = time.perf_counter(), 30.0

        def execute(group: list[RunSpec]) -> None:
            nonlocal last_results, every
            ran.update(s.run_id for s in group)
            try:
                _execute(group)
            finally:
                for s in group:
                    store.unlock(s.run_id)
            if time.perf_counter() - last_results > every:  # results.csv grows while a long sweep runs
                t0 = time.perf_counter()
                store.write_results(axes, [(r.run_id, r.sweep) for r in runs])
                last_results = time.perf_counter()
                every = max(30.0, 20 * (last_results - t0))  # rewriting never takes more than 5 % of the sweep

        def say(held: list[str]) -> None:
            note = waiting_note(cfg, store, held)
            if callable(progress):
                progress(note)
            elif progress:
                bar.console.print(note, markup=False, highlight=False)

        taken = take_runs(store, plan(todo), wait=wait, elsewhere=lambda _: tally.look(force=True),
                         say=say if others_running is None else None)  # (its own helpers' runs: counted)
        for group in taken:
            if group:
                execute(group)
            else:  # runs other processes hold: wait for them (those whose holder is gone are taken over)
                time.sleep(WAIT_POLL)
                tally.look()
        held = [s for s in todo if s.run_id not in ran and not store.is_done(s.run_id)]
        busy = len(held)
        while others_running is not None and others_running():
            time.sleep(0.2)
            tally.look()
        if others_running is not None:
            tally.look(force=True)
    results = store.write_results(axes, [(r.run_id, r.sweep) for r in runs])
    others = sum(1 for r in todo if r.run_id not in ran and store.is_done(r.run_id))
    return ExperimentSummary(Path(out), len(unique), len(ran), len(unique) - len(todo), results,
                             time.perf_counter() - start, busy, nonfinite, others)


def take_run(store: ResultStore, run_id: str) -> bool:
    """Take a run for this process (its lock, :meth:`ResultStore.lock`): False while another process holds it or
    once it is finished (a finished run is never run again). The runner and the distributed runtime's process 0
    take their runs through it."""
    if not store.lock(run_id):
        return False
    if store.is_done(run_id):  # another process finished it meanwhile
        store.unlock(run_id)
        return False
    return True


def take_runs(store: ResultStore, groups: Iterable[list[RunSpec]], *, wait: bool = True,
              say: Callable[[list[str]], None] | None = None, elsewhere: Callable[[str], None] | None = None):
    """The experiment loop's choice of runs, shared by the runner and the distributed runtime's process 0: each
    group's runs this process takes (:func:`take_run`; a group of none is skipped, ``elsewhere(run id)`` hears of a
    run another process finished), in order; then, with ``wait``, the runs other processes still hold, one by one as
    their holder finishes or is gone (taken over: yielded), an empty list whenever none could be taken (the caller
    waits a moment, or tells its peers to) and ``say`` the held runs' ids the first time (:func:`waiting_note`). The caller runs a yielded group and
    unlocks its runs."""
    groups = [list(g) for g in groups]
    ran: set[str] = set()

    def claim(group: list[RunSpec]) -> list[RunSpec]:
        mine = []
        for s in group:
            if take_run(store, s.run_id):
                mine.append(s)
            elif elsewhere is not None and store.is_done(s.run_id):  # another process finished it
                elsewhere(s.run_id)
        ran.update(s.run_id for s in mine)
        return mine

    for group in groups:
        mine = claim(group)
        if mine:
            yield mine
    todo = [s for g in groups for s in g]
    held = [s for s in todo if s.run_id not in ran and not store.is_done(s.run_id)]
    told = False
    while wait and held:
        for s in held:
            mine = claim([s])
            if mine:
                yield mine
        held = [s for s in held if s.run_id not in ran and not store.is_done(s.run_id)]
        if held:
            if not told and say is not None:
                told = True
                say([s.run_id for s in held])
            yield []


def save_finished(store: ResultStore, items: Sequence[tuple[RunSpec, list, dict]], nonfinite: dict,
                  *, secrets: bool = True) -> None:
    """Save finished runs (spec, rows, manifest) — the experiment loop's step after a run, shared by the runner and
    the distributed runtime's process 0: a run whose last metrics are nan/inf is named in its manifest and in
    ``nonfinite``; then its checkpoints go and, with ``secrets``, its agents' secrets (a saved run needs neither; the
    distributed runtime's processes forget their own agents' instead)."""
    for spec, rows, man in items:
        bad = nonfinite_metrics(rows)
        if bad:
            nonfinite[spec.run_id] = man["nonfinite_metrics"] = bad
    store.save_runs([(spec.run_id, rows, man) for spec, rows, man in items])
    for spec, _, _ in items:
        if RuntimeSpec.of(spec.config).checkpoint_every:
            shutil.rmtree(store.run_dir(spec.run_id) / "checkpoints", ignore_errors=True)
        if secrets:
            shutil.rmtree(secrets_folder(store.run_dir(spec.run_id)), ignore_errors=True)


def run_label(spec: RunSpec) -> str:
    """A run in a progress line: its sweep's values, or its id."""
    return ", ".join(f"{k}={v}" for k, v in spec.sweep.items() if v is not None) or spec.run_id


def waiting_note(cfg: dict, store: ResultStore, held: Sequence[str]) -> str:
    """What a process says while it waits for runs other processes sharing its folder hold."""
    holder = store.holder(held[0]) or "just released"
    return (f"{cfg.get('name', 'experiment')}: waiting for {len(held)} run(s) held by other processes sharing "
            f"{store.root} (e.g. run {held[0]}: {holder}); a run whose process is gone is taken over and run here")


def check_jobs(jobs: object) -> int:
    """``jobs`` if it is a number of processes (an integer >= 1), else a clear error."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValidationError(f"jobs must be an integer >= 1, got {jobs!r}")
    return jobs


def distinct_runs(runs: list[RunSpec], shard: tuple[int, int] | None) -> list[RunSpec]:
    """The distinct runs of a sweep (first occurrence of each run id), every k-th from i for ``shard = (i, k)``."""
    unique = list({r.run_id: r for r in runs}.values())
    if shard is None:
        return unique
    i, k = shard
    if not 0 <= i < k:
        raise ValidationError(f"shard I/K needs 0 <= I < K, got {i}/{k}")
    return unique[i::k]


def _exit_with(parent: int, every: float = 1.0) -> None:
    """Leave this process as soon as ``parent`` is no longer its parent (killed: the helper would run on alone, holding
    cores and runs; its unfinished run is simply run again later, as after any interruption)."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(every)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="privdl-parent-watch", daemon=True).start()


def _helper(cfg: dict, out: str, shard: tuple[int, int] | None, threads: int, show_warning: Callable,
            parent: int | None = None, resume: bool = False) -> None:
    if parent is not None:
        _exit_with(parent)
    warnings.showwarning = show_warning  # the parent's warning format (the CLI's one line per warning)
    torch.set_num_threads(threads)
    run_experiment(cfg, out, progress=False, shard=shard, wait=False, resume=resume)  # the main process collects


def run_parallel(cfg: dict, out: str | Path, *, jobs: int, progress: bool | Callable[[str], None] = True,
                 shard: tuple[int, int] | None = None,
                 on_done: Callable[[str, list, dict], None] | None = None,
                 resume: bool = False) -> ExperimentSummary:
    """:func:`run_experiment` in ``jobs`` processes on one directory: ``jobs − 1`` helpers (spawned, quiet) and this
    one (with the progress) take the stacked groups in turn — the runner's per-run locks keep every run to one
    process — each with ``threads / jobs`` torch threads (a stacked step of a small problem is bound by one core's
    Python overhead, so processes, not threads, use the machine; BENCHMARKS.md, seed 002). When all have stopped, a
    last pass runs whatever a failed helper left and writes results.csv with every run."""
    import multiprocessing

    if on_done is not None:
        raise ValidationError("on_done sees only this process's runs: use jobs = 1 with it")
    start = time.perf_counter()
    store = ResultStore(out)
    store.claim(cfg)  # the directory and its config, once, before the helpers look at it
    runs, _ = expand(cfg)
    unique = distinct_runs(runs, shard)
    before = {r.run_id for r in unique if store.is_done(r.run_id)}
    check_inputs_unchanged(store, (r for r in unique if r.run_id in before))
    threads = torch.get_num_threads()
    share = max(1, threads // jobs)
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's threads
    helpers = [context.Process(target=_helper, daemon=True,
                               args=(cfg, str(out), shard, share, warnings.showwarning, os.getpid(), resume))
               for _ in range(jobs - 1)]
    with for_children():  # the helpers start with the privdl command's settings; this process keeps its own
        for h in helpers:
            h.start()
    torch.set_num_threads(share)
    try:
        run_experiment(cfg, out, progress=progress, shard=shard, resume=resume,
                       others_running=lambda: any(h.is_alive() for h in helpers))
    except BaseException:
        for h in helpers:
            h.terminate()
        raise
    finally:
        for h in helpers:
            h.join()
        torch.set_num_threads(threads)
    failed = [h.exitcode for h in helpers if h.exitcode]
    if failed:
        warnings.warn(f"{len(failed)} of {jobs - 1} helper processes failed (exit codes {failed}); this process "
                      "runs what they left. Run with jobs = 1 to see why (a script read from standard input cannot "
                      "be spawned)", stacklevel=2)
    final = run_experiment(cfg, out, progress=False, shard=shard, resume=resume)  # a failed helper's runs
    nonfinite = {}
    for r in unique:
        if r.run_id not in before and store.is_done(r.run_id):
            bad = store.manifest(r.run_id).get("nonfinite_metrics")
            if bad:
                nonfinite[r.run_id] = bad
    return ExperimentSummary(Path(out), final.runs, final.runs - len(before) - final.busy, len(before),
                             final.results, time.perf_counter() - start, final.busy, nonfinite)
