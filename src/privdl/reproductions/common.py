"""What every reproduction shares: packaged configs, running them through the ordinary runner, reading the finished
runs back, CSV output, and the registry behind ``privdl reproduce NAME``.

A reproduction is (1) one or more experiment configs shipped in ``privdl/reproductions/configs/`` — the same TOML a
user would write, run by the same runner into the same store, with manifests and privacy ledgers — (2) the paper's
numbers (:mod:`privdl.reproductions.papers`) and (3) a thin comparison that summarises the finished runs into the
tables and figures of REPRODUCTION.md.
"""

from __future__ import annotations

import copy
import csv
import tomllib
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

from privdl.experiment.config import expand
from privdl.experiment.config_sweep import set_dotted
from privdl.experiment.runner import check_jobs, run_experiment
from privdl.experiment.store import ResultStore, device_counts, read_experiment, run_device
from privdl.registry import Registry

REPRODUCTIONS: Registry[Callable[..., list[dict]]] = Registry("reproduction")


def packaged_config(name: str) -> dict:
    """The reproduction config ``name`` shipped with privdl (``privdl/reproductions/configs/NAME.toml``)."""
    text = resources.files("privdl.reproductions").joinpath("configs", f"{name}.toml").read_text()
    return tomllib.loads(text)


def with_overrides(cfg: dict, overrides: dict[str, object]) -> dict:
    """A copy of ``cfg`` with dotted keys set (``"sweep.mechanism.epsilon"`` replaces that sweep axis)."""
    cfg = copy.deepcopy(cfg)
    for key, value in overrides.items():
        if key.startswith("sweep."):
            cfg.setdefault("sweep", {})[key[len("sweep."):]] = value
        else:
            set_dotted(cfg, key, value)
    return cfg


_JOBS: ContextVar[int] = ContextVar("privdl_reproduction_jobs", default=1)


@contextmanager
def parallel(jobs: int) -> Iterator[None]:
    """Every sweep a reproduction runs inside this block uses ``jobs`` processes (``privdl reproduce --jobs``)::

        with parallel(2):
            REPRODUCTIONS.get("rms_filtering")(Path("out"))
    """
    token = _JOBS.set(check_jobs(jobs))
    try:
        yield
    finally:
        _JOBS.reset(token)


_COLLECT: ContextVar[bool] = ContextVar("privdl_reproduction_collect", default=False)


@contextmanager
def collecting(on: bool = True) -> Iterator[None]:
    """Inside this block :func:`run` starts nothing: it points ``out`` at the grid and the reproduction writes its
    tables from the runs already finished there (a long grid's progress; shard folders gathered from machines)."""
    token = _COLLECT.set(bool(on))
    try:
        yield
    finally:
        _COLLECT.reset(token)


def collecting_only() -> bool:
    """Whether :func:`run` starts nothing here (inside :func:`collecting`)."""
    return _COLLECT.get()


def run(cfg: dict, out: Path, *, progress: bool | Callable[[str], None] = False,
        shard: tuple[int, int] | None = None) -> Path:
    """Run (or resume) ``cfg`` into ``out`` through the ordinary runner (in the processes :func:`parallel` set);
    under :func:`collecting`, only bind ``out`` to this grid (its finished runs are what the tables then read)."""
    if _COLLECT.get():
        ResultStore(out).claim(cfg)
        if callable(progress):
            progress(grid_status(out))
        return out
    run_experiment(cfg, out, progress=progress, shard=shard, jobs=_JOBS.get())
    return out


@dataclass
class FinishedRun:
    run_id: str
    sweep: dict
    config: dict
    manifest: dict
    final: dict[str, float]

    @property
    def ledger(self) -> dict:
        return self.manifest["privacy_ledger"][0]

    @property
    def device(self) -> str:
        """Where the run ran (``"cpu"``, ``"cuda (NVIDIA H100 80GB HBM3)"``): not part of its id or its grid's."""
        return run_device(self.manifest)


def finished_runs(out: Path) -> list[FinishedRun]:
    """The finished runs of the grid ``out`` (an experiment directory) now holds, in run-id order. A folder may have
    held larger or other grids of the same experiment before (it grows in place): their other runs stay on disk but
    are not this grid's, so a table never mixes, e.g., tuned and untuned or two gossip modes' runs as seeds."""
    from privdl.experiment.run_identity import predating_run_id

    out = Path(out)
    grid = None
    on_disk = {p.parent.name for p in (out / "runs").glob("*/manifest.json")}
    if (out / "experiment.json").is_file():
        specs = expand(read_experiment(out))[0]
        grid = {r.run_id for r in specs}
        # a grid stored before a default changed (no accountant key: RDP then) names today's default: its runs have
        # their predating ids, taken only where the point has no run under today's id (never both of one point)
        grid |= {old for old in (predating_run_id(r.config) for r in specs if r.run_id not in on_disk)}
    runs = []
    store = ResultStore(out)
    for path in sorted((out / "runs").glob("*/manifest.json")):
        if grid is not None and path.parent.name not in grid:
            continue
        if not store.is_done(path.parent.name):  # damaged: warned about here, and run again by the next run
            continue
        man = store.manifest(path.parent.name)
        runs.append(FinishedRun(man["run_id"], man["sweep"], man["config"], man, man.get("final_metrics", {})))
    return runs


def grid_status(out: Path) -> str:
    """One line on how far the grid ``out`` holds has come: its finished runs of all — and, where they ran on more
    than one device (a grid filled on a GPU and on CPUs, merged), how many ran on each — and what the rest would
    take one core at the pace of the finished runs (their seconds per round × agent, :func:`run_cost`; a run stacked
    with k others counts a k-th of its batch's time), or, with none finished, that no pace is known yet."""
    from privdl.experiment.runner import format_duration, run_cost

    out = Path(out)
    cfg = read_experiment(out)
    grid = {r.run_id: r for r in expand(cfg)[0]}
    done = finished_runs(out)
    name = cfg.get("name", "experiment")
    line = f"{name}: {len(done)} of {len(grid)} runs of this grid finished in {out}"
    devices = device_counts(d.manifest for d in done)
    if len(devices) > 1:
        line += f" ({', '.join(f'{k} on {where}' for where, k in devices.items())})"
    finished = {d.run_id for d in done}
    left = [r for rid, r in grid.items() if rid not in finished]
    if not left:
        return line
    paced = [(float(d.manifest["seconds"]) / max(1, int(d.manifest.get("batch", {}).get("replicas", 1))),
              run_cost(d.config)) for d in done  # a stacked run's seconds are its batch's: its share is a part
             if isinstance(d.manifest.get("seconds"), (int, float))]
    if not paced:
        return line + f"; {len(left)} to run (no finished run gives a pace yet)"
    pace = sum(s for s, _ in paced) / sum(c for _, c in paced)
    return line + (f"; the {len(left)} left ≈ {format_duration(pace * sum(run_cost(r.config) for r in left))} of one "
                   "core at the finished runs' pace")


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


__all__ = ["FinishedRun", "REPRODUCTIONS", "collecting", "collecting_only", "finished_runs", "grid_status",
           "packaged_config", "read_csv", "run", "with_overrides", "write_csv"]
