"""The steps of the experiment loop that the runner and the distributed runtime's process 0 share: the distinct runs
of a sweep (and a shard of them), the check that finished runs' input files are unchanged, taking runs through the
results folder's per-run locks (and waiting for those other processes hold), saving finished runs (naming nan/inf
metrics, removing checkpoints and secrets), and the labels and notes progress shows.

Separate from :func:`privdl.experiment.runner.run_experiment` so that both loops take, save and report runs by the
same rules without the distributed runtime depending on the runner's own loop.
"""

from __future__ import annotations

import math
import shutil
import warnings
from typing import Callable, Iterable, Sequence

from privdl.errors import ConfigError, ValidationError
from privdl.experiment.build import input_files
from privdl.experiment.config import RunSpec
from privdl.experiment.run_state import secrets_folder
from privdl.experiment.store import ResultStore
from privdl.runtime_spec import RuntimeSpec

#: seconds between two looks at the runs other processes hold, while this process waits for them
WAIT_POLL = 0.5


def nonfinite_metrics(rows: Iterable[tuple[int, str, float]]) -> list[str]:
    """The metrics whose last recorded value is nan or ±inf: a run that diverged or overflowed."""
    last: dict[str, float] = {}
    for _, name, value in rows:
        last[name] = value
    return sorted(k for k, v in last.items() if isinstance(v, float) and not math.isfinite(v))


def distinct_runs(runs: list[RunSpec], shard: tuple[int, int] | None) -> list[RunSpec]:
    """The distinct runs of a sweep (first occurrence of each run id), every k-th from i for ``shard = (i, k)``."""
    unique = list({r.run_id: r for r in runs}.values())
    if shard is None:
        return unique
    i, k = shard
    if not 0 <= i < k:
        raise ValidationError(f"shard I/K needs 0 <= I < K, got {i}/{k}")
    return unique[i::k]


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
