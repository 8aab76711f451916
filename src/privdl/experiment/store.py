"""The results store of one experiment directory, written atomically so an interrupted sweep loses nothing.

    DIR/experiment.json            the experiment's config (a different config is refused; the same one over
                                   another grid of seeds / [sweep] values re-points the folder and keeps its runs)
    DIR/runs/<run_id>/metrics.csv  one run's rows
    DIR/runs/<run_id>/manifest.json  written last: its presence marks the run finished
    DIR/results.csv                long format: run_id, <sweep axes...>, iteration, metric, value

Each run's files are written atomically and its manifest last, so a run interrupted at any point is simply run again;
several processes (shards) may share one directory (they run disjoint runs).
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from privdl.errors import ConfigError, ValidationError


def _stage(path: Path, text: str, *, sync: bool) -> str:
    """Write ``text`` to a temporary file beside ``path`` (fsync'd if ``sync``); returns its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.tmp")  # one writer per run: a fixed name is safe
    try:
        with open(tmp, "w") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically and durably (fsync, then rename)."""
    tmp = _stage(path, text, sync=True)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if a == b else [prefix or "(root)"]


#: the top-level keys that only choose which runs an experiment holds: a run's id hashes its own resolved config,
#: never its place in the grid, so a folder may be re-pointed to a larger (or other) grid and keeps its finished runs
GRID_KEYS = ("seeds", "sweep")


def _identity(experiment: Any, *, grid: bool = True) -> Any:
    """What makes two experiment configs the same experiment (where the config file and the data lie do not); with
    ``grid = False``, the same experiment up to its grid (``seeds`` and ``[sweep]``), which may grow or shrink in
    place."""
    if not isinstance(experiment, dict):
        return experiment
    from privdl.experiment.config import without_locations

    return without_locations({k: v for k, v in experiment.items()
                              if k != "base_dir" and (grid or k not in GRID_KEYS)})


class ResultStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._done: set[str] = set()  # runs found finished (a finished run stays finished): parsed once

    def claim(self, experiment: dict) -> None:
        """Bind the directory to ``experiment``; refuse a directory holding another experiment's results."""
        path = self.root / "experiment.json"
        text = json.dumps(experiment, indent=2, sort_keys=True, default=str)
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"--out {self.root} is a file, not a folder; choose another --out")
        if path.exists():
            old = _experiment(self.root)
            if _identity(old) != _identity(json.loads(text)):
                keys = ", ".join(_diff(old, json.loads(text))[:8])
                if _identity(old, grid=False) == _identity(json.loads(text), grid=False):
                    # the same experiment over another grid (more seeds, ε, graphs): finished runs whose ids the new
                    # grid also produces are kept and skipped; the others stay on disk, out of results.csv
                    atomic_write(path, text)
                    return
                if not self._holds_results():  # e.g. a config that failed at build: nothing of it to protect
                    warnings.warn(f"{self.root} held another experiment (differing at: {keys}) with no finished or "
                                  "running run; it now holds this one", stacklevel=2)
                    atomic_write(path, text)
                    return
                raise ConfigError(
                    f"{self.root} holds results of a different experiment (config differs at: {keys}); "
                    f"choose another --out directory or delete it"
                )
            return
        if self.root.exists() and any(not p.name.startswith(".") for p in self.root.iterdir()):
            raise ConfigError(f"{self.root} is not empty and holds no privdl experiment; choose another --out")
        atomic_write(path, text)

    def check_writable(self) -> None:
        """Refuse, before anything is computed, a folder where finished runs could not be saved."""
        for d in (self.root, self.root / "runs"):
            try:
                d.mkdir(parents=True, exist_ok=True)
                probe = d / f".probe-{os.getpid()}"
                probe.write_text("")
                probe.unlink()
            except OSError as exc:
                raise ConfigError(f"cannot write in {d} ({exc.strerror or exc}); finished runs could not be saved: "
                                  "choose another --out") from None

    def _holds_results(self) -> bool:
        """Some run here finished (a manifest) or is running (a lock of a live process)."""
        runs = self.root / "runs"
        if not runs.is_dir():
            return False
        for d in runs.iterdir():
            if (d / "manifest.json").exists() or (d / "metrics.csv").exists():
                return True
            lock = d / ".lock"
            if lock.exists():
                try:
                    host, pid = lock.read_text().split()
                except (OSError, ValueError):
                    return True
                if host != socket.gethostname() or _alive(int(pid)):
                    return True
        return False

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def is_done(self, run_id: str) -> bool:
        """Finished: a manifest that parses, says ``complete`` for this run id, beside its metrics. A run whose
        manifest is damaged (a crash of the disk, a hand edit) is not finished: it is run again, with a warning."""
        if run_id in self._done:
            return True
        path = self.run_dir(run_id) / "manifest.json"
        if not path.is_file():
            return False
        try:
            man = json.loads(path.read_text())
        except (ValueError, OSError):
            man = None
        ok = (isinstance(man, dict) and man.get("status") == "complete" and man.get("run_id") == run_id
              and (self.run_dir(run_id) / "metrics.csv").is_file())
        if not ok:
            warnings.warn(f"run {run_id}: its manifest ({path}) is damaged or incomplete; the run is done again",
                          stacklevel=2)
        else:
            self._done.add(run_id)
        return ok

    def lock(self, run_id: str) -> bool:
        """Take the run for this process (an exclusive ``.lock`` file in its folder, holding host and pid). False
        when another live process on this host holds it, or any process on another host (delete the ``.lock`` by
        hand if that process is gone); a lock left by a dead process on this host is taken over."""
        d = self.run_dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        lock = d / ".lock"
        me = f"{socket.gethostname()} {os.getpid()}"
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    host, pid = lock.read_text().split()
                except (OSError, ValueError):
                    host, pid = socket.gethostname(), "0"
                if f"{host} {pid}" == me:
                    return True
                if host != socket.gethostname() or _alive(int(pid)):
                    return False
                lock.unlink(missing_ok=True)  # its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(me)
            return True
        return False

    def unlock(self, run_id: str) -> None:
        (self.run_dir(run_id) / ".lock").unlink(missing_ok=True)

    def save_run(self, run_id: str, rows: Iterable[tuple[int, str, float]], manifest: dict) -> None:
        self.save_runs([(run_id, rows, manifest)])

    def save_runs(self, runs: list[tuple[str, Iterable[tuple[int, str, float]], dict]]) -> None:
        """Save finished runs: every file is staged, made durable with one sync for the whole batch, then renamed
        into place — metrics first, each run's manifest last — so an interruption at any point leaves each run
        either finished or to be redone."""
        staged: list[tuple[str, Path]] = []
        try:
            for run_id, rows, manifest in runs:
                buf = io.StringIO()
                w = csv.writer(buf)
                w.writerow(["iteration", "metric", "value"])
                w.writerows(rows)
                d = self.run_dir(run_id)
                staged.append((_stage(d / "metrics.csv", buf.getvalue(), sync=len(runs) == 1), d / "metrics.csv"))
                # compact JSON: the C encoder (json with indent is pure Python, ~10× slower on large sweeps)
                text = json.dumps(manifest, default=str, separators=(",", ":"))
                staged.append((_stage(d / "manifest.json", text, sync=len(runs) == 1), d / "manifest.json"))
            if len(runs) > 1:
                os.sync()
            for tmp, path in staged:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            raise

    def load_rows(self, run_id: str) -> list[tuple[int, str, float]]:
        path = self.run_dir(run_id) / "metrics.csv"
        with open(path) as f:
            r = csv.reader(f)
            next(r, None)
            try:
                return [(int(t), m, float(v)) for t, m, v in r]
            except ValueError as exc:
                raise ValidationError(f"{path} is damaged ({exc}); delete {path.parent} and run the experiment "
                                      "again to redo that run") from None

    def manifest(self, run_id: str) -> dict:
        return json.loads((self.run_dir(run_id) / "manifest.json").read_text())

    def write_results(self, axes: list[str], runs: list[tuple[str, dict]]) -> Path:
        """Assemble DIR/results.csv from the finished runs' files (runs still to do, e.g. another shard's, are left
        out until they finish)."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["run_id", *axes, "iteration", "metric", "value"])
        for rid, sweep in runs:
            if not self.is_done(rid):
                continue
            cols = ["" if sweep.get(a) is None else sweep[a] for a in axes]
            for t, m, v in self.load_rows(rid):
                w.writerow([rid, *cols, t, m, repr(v)])
        path = self.root / "results.csv"
        atomic_write(path, buf.getvalue())
        return path


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class MergeSummary:
    """What :func:`merge` did: runs copied, runs the destination already had finished, runs left behind (unfinished
    in their source, or being run in the destination), and how many finished runs of the destination lie outside
    the grid its experiment.json names (they count once that grid is grown to them)."""
    dest: Path
    copied: int = 0
    present: int = 0
    unfinished: int = 0
    busy: int = 0
    outside_grid: int = 0
    rekeyed: int = 0  # copied runs named by the id privdl gave them before data folders left run ids
    foreign: int = 0  # finished runs of another experiment that this grid does not hold: not copied
    other_experiments: list[str] = field(default_factory=list)  # sources holding another experiment, and where
    sources: dict[str, int] = field(default_factory=dict)  # privdl_source_sha256 → copied runs made by that code


def _experiment(folder: Path) -> dict:
    path = folder / "experiment.json"
    if not path.is_file():
        hint = (f"; a reproduction keeps its runs in a subfolder: name {folder / 'runs'}"
                if (folder / "runs" / "experiment.json").is_file() else "")
        raise ConfigError(f"{folder} holds no privdl experiment (no experiment.json){hint}")
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{path} is damaged ({exc}); it names the experiment this folder holds — restore it, or "
                          "choose another folder") from None


def merge(sources: Iterable[str | Path], dest: str | Path) -> MergeSummary:
    """Gather the finished runs of experiment folders (shards run on other machines, earlier sessions' slices of
    a long grid) into ``dest``, which then holds them as if it had run them: a later ``privdl run`` / ``privdl
    reproduce`` over ``dest`` skips them and runs only the rest.

    A source holding the same experiment as ``dest`` up to its grid (``seeds`` and ``[sweep]``; an empty ``dest``
    takes the first source's experiment) gives all its runs, also those a larger grid would hold; a source holding
    another experiment gives only the runs ``dest``'s grid holds (the same resolved config, so the same id: Table 1's
    λ = 0.06 runs are Table 2's t = 1 column). A run is copied only if it is finished there and its manifest's
    config hashes to its id (so a run cannot land under another run's name; a run named by the id privdl gave it
    before data folders left run ids is copied under its id now, its old one kept as ``previous_run_id``); each is
    written as the runner writes one, metrics first and manifest last. A run ``dest`` already finished is kept,
    one another process is running there is left to it. ``dest``'s experiment.json, and so its grid, is not
    changed: results.csv and tables are rebuilt by the next ``privdl run`` / ``privdl reproduce`` (``--collect``)
    over the grid wanted."""
    from privdl.experiment.config import expand, legacy_run_id, run_id  # (config imports nothing of the store)

    dest_store = ResultStore(dest)
    srcs = [Path(s) for s in sources]
    if not srcs:
        raise ConfigError("name at least one experiment folder to merge from")
    experiments = [(s, _experiment(s)) for s in srcs]
    for s, _ in experiments:
        if s.resolve() == dest_store.root.resolve():
            raise ConfigError(f"{s} is the destination itself; name the other folders to merge into it")
    root = dest_store.root
    if not (root / "experiment.json").is_file():  # a reproduction keeps its runs one folder down: say so
        if (root / "runs" / "experiment.json").is_file():
            raise ConfigError(f"{root} is a reproduction's folder; its runs are in {root / 'runs'}: merge into that")
        if all(s.name == "runs" for s in srcs) and root.name != "runs" and not root.exists():
            warnings.warn(f"the sources look like reproductions' runs/ folders; if {root} is to be a reproduction's "
                          f"--out, merge into {root / 'runs'}, where `privdl reproduce … --out {root}` reads them",
                          stacklevel=2)
    target = _experiment(root) if (root / "experiment.json").is_file() else experiments[0][1]
    dest_store.claim(target)
    dest_store.check_writable()
    grid = {r.run_id for r in expand(target)[0]}
    summary = MergeSummary(dest_store.root)
    for s, exp in experiments:
        src = ResultStore(s)
        # another experiment (e.g. Table 1 for Table 2's t = 1 column) gives only the runs this grid holds too
        foreign = _identity(exp, grid=False) != _identity(target, grid=False)
        if foreign:
            summary.other_experiments.append(
                f"{s} (differs at: {', '.join(k for k in _diff(target, exp) if k.split('.')[0] not in GRID_KEYS)})")
        for d in sorted((s / "runs").glob("*/")) if (s / "runs").is_dir() else []:
            rid = d.name
            if not (d / "manifest.json").is_file():
                summary.unfinished += int((d / "metrics.csv").exists() or (d / ".lock").exists())
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a damaged source manifest is reported below, not as "redone"
                done = src.is_done(rid)
            man = src.manifest(rid) if done else None
            config = man.get("config", {}) if isinstance(man, dict) else {}
            rekey = done and run_id(config) != rid and legacy_run_id(config) == rid
            if rekey:
                man = {**man, "run_id": run_id(config), "previous_run_id": rid}  # made before ids left data out
            elif not done or run_id(config) != rid:
                warnings.warn(f"run {rid} in {s} is damaged or is not the run its name says; not copied",
                              stacklevel=2)
                summary.unfinished += 1
                continue
            old_id, rid = rid, man["run_id"]
            if foreign and rid not in grid:
                summary.foreign += 1
                continue
            if dest_store.is_done(rid):
                summary.present += 1
                continue
            if not dest_store.lock(rid):
                summary.busy += 1
                continue
            try:
                dest_store.save_run(rid, src.load_rows(old_id), man)  # read only for a run that is copied
            finally:
                dest_store.unlock(rid)
            summary.copied += 1
            summary.rekeyed += int(rekey)
            code = str(man.get("privdl_source_sha256", "unknown"))
            summary.sources[code] = summary.sources.get(code, 0) + 1
    summary.outside_grid = sum(1 for p in (dest_store.root / "runs").glob("*/manifest.json")
                               if p.parent.name not in grid)
    return summary


def read_results(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    """The rows of a results.csv; a file cut short (no final newline: an interrupted copy, a full disk) or a row
    whose value is not a number is refused rather than plotted."""
    text = Path(path).read_text()
    if text and not text.endswith("\n"):
        raise ValidationError(f"{path} ends in the middle of a line (cut short?); `privdl run CONFIG --out "
                              f"{Path(path).parent}` rebuilds it from the finished runs without recomputing them")
    r = csv.DictReader(io.StringIO(text))
    rows = list(r)
    for k, row in enumerate(rows, start=2):
        try:
            float(row.get("value", "nan"))
        except (TypeError, ValueError):
            raise ValidationError(f"{path}, line {k}: value {row.get('value')!r} is not a number") from None
    return list(r.fieldnames or []), rows
