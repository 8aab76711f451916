"""Run every point of an experiment's sweep, skipping finished runs, with a progress bar.

Runs that share their task, algorithm and length (and differ in network, mechanism, step size or seed) are stacked on
the replica axis and stepped together (:func:`privdl.simulator.simulate_replicas`) when their mechanisms can be
stacked; each still gets its own metrics, manifest and privacy ledger, exactly as if it had run alone (it draws the
same numbers; its results agree to rounding). ``batch_replicas = 1`` turns this off. ``train = false`` builds,
calibrates and accounts every run without training (design sweeps: the mechanism's facts become the metrics).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from privdl.errors import ValidationError
from privdl.experiment.build import build, build_network, build_task
from privdl.experiment.capacity import capacity
from privdl.experiment.config import RunSpec, expand
from privdl.experiment.loop_steps import (
    WAIT_POLL,
    check_inputs_unchanged,
    distinct_runs,
    run_label,
    save_finished,
    take_runs,
    waiting_note,
)
from privdl.experiment.outcome import ExperimentSummary  # noqa: F401 (re-exported: its home before)
from privdl.experiment.progress import Lines, Tally, format_duration, run_cost  # noqa: F401 (re-exported)
from privdl.experiment.run_pipeline import run_batch, run_one
from privdl.experiment.run_plan import plan
from privdl.experiment.run_state import secrets_folder
from privdl.experiment.store import ResultStore
from privdl.mechanisms.stack import need_signature
from privdl.process_defaults import for_children
from privdl.simulator import stackable

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


def check_jobs(jobs: object) -> int:
    """``jobs`` if it is a number of processes (an integer >= 1), else a clear error."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValidationError(f"jobs must be an integer >= 1, got {jobs!r}")
    return jobs


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
