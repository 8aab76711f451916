"""The results store of one experiment directory, written atomically so an interrupted sweep loses nothing.

    DIR/experiment.json            the experiment's config (a different config is refused; the same one over
                                   another grid of seeds / [sweep] values re-points the folder and keeps its runs;
                                   the same one on another device — or with other threads, [runtime] placement or
                                   data folders — joins it, and the file keeps its first claimer's config)
    DIR/runs/<run_id>/metrics.csv  one run's rows
    DIR/runs/<run_id>/manifest.json  written last: its presence marks the run finished
    DIR/results.csv                long format: run_id, <sweep axes...>, iteration, metric, value

Each run's files are written atomically and its manifest last, so a run interrupted at any point is simply run again;
several processes (shards, ``--jobs``, a second ``privdl run``) may share one directory: the first to come claims it
(experiment.json appears at once, complete, or not at all, so processes started together all join), and each run is
held by one process at a time through ``runs/<run_id>/.lock`` (:mod:`privdl.experiment.lock`: host and pid;
refreshed every ``LOCK_BEAT`` seconds while held, and taken over when its process is gone: ended on this host, or
silent for ``LOCK_STALE`` seconds on any host — a folder copied with its locks from another machine does not keep its
runs forever).
"""

from __future__ import annotations

import csv
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from privdl.data.files import read_json, read_text
from privdl.errors import ConfigError, FileError, PrivdlError, ValidationError
from privdl.experiment.lock import HEARTBEAT, Held, create_whole, holder, holder_name, take_over



def make_folder(folder: Path, what: str = "--out") -> None:
    """Create ``folder`` (and its parents), or say why it cannot be: a file on the way, no permission, a read-only
    file system."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise FileError(f"{what} {folder} is a file, not a folder" + ("; choose another --out" if what == "--out"
                                                                      else "")) from None
    except NotADirectoryError:
        above = next((q for q in reversed(folder.parents) if q.is_file()), folder)
        raise FileError(f"{what} {folder} cannot be made: {above} is a file, not a folder") from None
    except OSError as exc:
        raise FileError(f"{what} {folder} cannot be made ({exc.strerror or exc}); choose a folder you can write "
                        "in") from None


def _stage(path: Path, text: str, *, sync: bool) -> str:
    """Write ``text`` to a temporary file beside ``path`` (fsync'd if ``sync``); returns its name."""
    make_folder(path.parent, "folder")
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.tmp")  # one writer per run: a fixed name is safe
    try:
        with open(tmp, "w") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise FileError(f"cannot write {path} ({exc.strerror or exc})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _replace(tmp: str, path: Path) -> None:
    """Rename a staged file onto ``path`` (an error naming ``path`` where that cannot be: e.g. it is a folder)."""
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise FileError(f"cannot write {path} ({exc.strerror or exc})") from None


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically and durably (fsync, then rename)."""
    tmp = _stage(path, text, sync=True)
    try:
        _replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys at which two configs differ (a table one of them lacks: the keys the other sets in it)."""
    if isinstance(a, dict) and b is None or a is None and isinstance(b, dict):
        a, b = a or {}, b or {}
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if a == b else [prefix or "(root)"]


#: the top-level keys that only choose which runs an experiment holds: a run's id hashes its own resolved config,
#: never its place in the grid, so a folder may be re-pointed to a larger (or other) grid and keeps its finished runs
GRID_KEYS = ("seeds", "sweep")


#: the top-level keys that name an experiment without changing its runs: two folders that differ in them hold two
#: experiments (Table 1 is not Table 2, though Table 2's t = 1 column is Table 1's λ = 0.06 runs: :func:`merge`
#: takes such shared runs, and only those, from one into the other)
LABEL_KEYS = ("name", "description")


def _identity(experiment: Any, *, grid: bool = True) -> Any:
    """What makes two experiment configs the same experiment: what its runs' ids hash
    (:func:`privdl.experiment.run_identity.identity`: the config less where and how it runs — ``device``, ``threads``,
    ``batch_replicas``, ``[runtime]`` but for agreed keys — and where the config file and the data lie), and its
    labels (:data:`LABEL_KEYS`). So a folder filled on a GPU is joined by the same grid run or collected on a CPU.
    With ``grid = False``, the same experiment up to its grid (``seeds`` and ``[sweep]``), which may grow or shrink
    in place."""
    if not isinstance(experiment, dict):
        return experiment
    from privdl.experiment.run_identity import identity

    out = identity({k: v for k, v in experiment.items()
                    if (grid or k not in GRID_KEYS) and (k != "runtime" or isinstance(v, dict))})
    if "keys" in out:  # runtime.keys = "agreed": other noise, so other runs (named as the config names it)
        out["runtime"] = {"keys": out.pop("keys")}
    out.update({k: experiment[k] for k in LABEL_KEYS if k in experiment})
    return out


def _identity_diff(a: Any, b: Any, *, grid: bool = True) -> list[str]:
    """The keys at which two experiment configs differ as experiments (never the device, the threads or where the
    data lie)."""
    return _diff(_identity(a, grid=grid), _identity(b, grid=grid))


def run_device(manifest: dict) -> str:
    """Where a finished run ran, from its manifest: the kind of device its ``device_info`` block records (the
    runner's: ``type``, and for a GPU its ``name``), else its config's ``device`` (``"cpu"``, ``"cuda"``,
    ``"cuda:1"``; manifests made before the block): ``"cpu"``, ``"cuda (NVIDIA H100 80GB HBM3)"``. Never an error:
    a damaged or missing field gives ``"cpu"``, the default device."""
    if not isinstance(manifest, dict):
        return "cpu"
    config = manifest.get("config")
    device = config.get("device") if isinstance(config, dict) else None
    info: Any = next((manifest[k] for k in ("device_info", "device")
                      if isinstance(manifest.get(k), (dict, str)) and manifest.get(k)), {})
    if isinstance(info, str):  # a bare device string: where it ran
        info = {"type": info}
    kind = next((info[k] for k in ("type", "kind") if isinstance(info.get(k), str) and info[k]), None)
    device = kind or (device if isinstance(device, str) and device else "cpu")
    name = next((info[k] for k in ("name", "gpu_name", "gpu") if isinstance(info.get(k), str) and info[k]), None)
    return f"{device} ({name})" if name and device != "cpu" and name != device else device


def device_counts(manifests: Iterable[dict]) -> dict[str, int]:
    """How many of these runs ran on each device (:func:`run_device`)."""
    out: dict[str, int] = {}
    for man in manifests:
        d = run_device(man)
        out[d] = out.get(d, 0) + 1
    return dict(sorted(out.items()))


def write_runs(runs: list[tuple[Path, Iterable[tuple[int, str, float]], dict]]) -> None:
    """Write finished runs, each into its folder (made if absent): ``metrics.csv`` (iteration, metric, value) and
    ``manifest.json``. Every file is staged, made durable with one sync for the whole batch, then renamed into place
    — metrics first, each run's manifest last — so an interruption at any point leaves each run either finished or
    to be redone (:meth:`ResultStore.save_runs`; :meth:`privdl.Result.save` writes one run alike)."""
    staged: list[tuple[str, Path]] = []
    try:
        for d, rows, manifest in runs:
            buf = io.StringIO()
            w = csv.writer(buf)
            w.writerow(["iteration", "metric", "value"])
            w.writerows(rows)
            staged.append((_stage(d / "metrics.csv", buf.getvalue(), sync=len(runs) == 1), d / "metrics.csv"))
            # compact JSON: the C encoder (json with indent is pure Python, ~10× slower on large sweeps)
            text = json.dumps(manifest, default=str, separators=(",", ":"))
            staged.append((_stage(d / "manifest.json", text, sync=len(runs) == 1), d / "manifest.json"))
        if len(runs) > 1:
            os.sync()
        for tmp, path in staged:
            _replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise


class ResultStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._done: set[str] = set()  # runs found finished (a finished run stays finished): parsed once

    def claim(self, experiment: dict) -> None:
        """Bind the directory to ``experiment``; refuse a directory holding another experiment's results. Processes
        started together on one empty folder all join: experiment.json is created whole, by one of them (a hard
        link of a finished file, which fails if the name exists), and the others read it."""
        path = self.root / "experiment.json"
        text = json.dumps(experiment, indent=2, sort_keys=True, default=str)
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"--out {self.root} is a file, not a folder; choose another --out")
        make_folder(self.root)
        for _ in range(3):
            if path.exists():
                self._compare(path, text)
                return
            names = [p.name for p in self.root.iterdir() if not p.name.startswith(".")]
            if "experiment.json" in names or path.exists():  # another process claimed it meanwhile
                continue
            if names:
                raise ConfigError(f"{self.root} is not empty and holds no privdl experiment (it holds "
                                  f"{', '.join(sorted(names)[:5])}); choose another --out")
            if create_whole(path, text):
                return
        raise ConfigError(f"{path} keeps changing under other processes; try again")

    def _compare(self, path: Path, text: str) -> None:
        """The folder already holds an experiment: the same one (join it), the same over another grid (re-point
        it), or another (refused, unless nothing of it is finished or running)."""
        old = _experiment(self.root)
        if _identity(old) == _identity(json.loads(text)):
            return  # the same experiment (perhaps run on another device): experiment.json stays the first claimer's
        keys = ", ".join(_identity_diff(old, json.loads(text))[:8])
        if _identity(old, grid=False) == _identity(json.loads(text), grid=False):
            # the same experiment over another grid (more seeds, ε, graphs): finished runs whose ids the new grid
            # also produces are kept and skipped; the others stay on disk, out of results.csv
            atomic_write(path, text)
            return
        held = self._holds_results()
        if not held:  # e.g. a config that failed at build: nothing of it to protect
            warnings.warn(f"{self.root} held another experiment (differing at: {keys}) with no finished or "
                          "running run; it now holds this one", stacklevel=3)
            atomic_write(path, text)
            return
        raise ConfigError(
            f"{self.root} holds {held} of a different experiment (config differs at: {keys}); "
            f"choose another --out directory or delete it"
        )

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

    def _holds_results(self) -> str | None:
        """What of its experiment this folder holds that a claim by another must not take over: "results" (a run
        finished — a manifest — or running: a lock of a live process), or "checkpoint or key files" (a run's agents'
        files that resume it: on a host whose ``--out`` process 0 does not see, a distributed run leaves only
        these); None where it holds nothing of it."""
        runs = self.root / "runs"
        if not runs.is_dir():
            return None
        files = None
        for d in runs.iterdir():
            if (d / "manifest.json").exists() or (d / "metrics.csv").exists():
                return "results"
            held = holder(d / ".lock")
            if held is not None and held.gone() is None:
                return "results"
            if files is None and any(p.is_file() for sub in ("checkpoints", "keys") for p in (d / sub).rglob("*")):
                files = "checkpoint or key files"
        return files

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
            man = read_json(path, "manifest")
        except FileError:
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
        """Take the run for this process: an exclusive ``.lock`` file in its folder, created whole (host and pid),
        whose time stamp this process refreshes every :data:`~privdl.experiment.lock.LOCK_BEAT` seconds while it
        holds it. False while another process holds it; a lock whose process is gone — ended (this host), or not
        refreshed for :data:`~privdl.experiment.lock.LOCK_STALE` seconds (any host: a crash, a folder copied from
        another machine with its locks) — is taken over, with a warning that names its host and pid where that
        process was not seen to end here."""
        d = self.run_dir(run_id)
        make_folder(d, "run folder")
        lock = d / ".lock"
        left: tuple[Held, str] | None = None  # the stale lock this process removed, and why it was stale
        for _ in range(3):
            held = holder(lock)
            if held is None:
                if not create_whole(lock, holder_name()):
                    continue  # another process created it meanwhile: look at it
                HEARTBEAT.add(lock)
                if left is not None and left[1] != "ended":
                    warnings.warn(f"run {run_id}: took over its lock {lock}, left by {left[0]} ({left[1]}): that "
                                  "process is gone (crashed or frozen, or the folder was copied from another "
                                  "machine); the run is done here", stacklevel=2)
                return True
            if held.mine():
                HEARTBEAT.add(lock)
                return True
            why = held.gone()
            if why is None:
                return False
            if take_over(lock, held):
                left = (held, why)
        return False

    def holder(self, run_id: str) -> str | None:
        """Who holds the run's lock now ("host H, pid P, refreshed N s ago"), or None."""
        held = holder(self.run_dir(run_id) / ".lock")
        return None if held is None else f"{held}, refreshed {held.age():.0f} s ago"

    def unlock(self, run_id: str) -> None:
        """Release the run (only a lock this process holds: one taken over meanwhile is the new holder's)."""
        lock = self.run_dir(run_id) / ".lock"
        HEARTBEAT.discard(lock)
        held = holder(lock)
        if held is not None and held.mine():
            lock.unlink(missing_ok=True)

    def save_run(self, run_id: str, rows: Iterable[tuple[int, str, float]], manifest: dict) -> None:
        self.save_runs([(run_id, rows, manifest)])

    def save_runs(self, runs: list[tuple[str, Iterable[tuple[int, str, float]], dict]]) -> None:
        """Save finished runs: every file is staged, made durable with one sync for the whole batch, then renamed
        into place — metrics first, each run's manifest last — so an interruption at any point leaves each run
        either finished or to be redone."""
        write_runs([(self.run_dir(run_id), rows, manifest) for run_id, rows, manifest in runs])

    def load_rows(self, run_id: str) -> list[tuple[int, str, float]]:
        """A finished run's rows; a metrics.csv that is cut short, mis-encoded or holds other columns is refused
        (never read as fewer or other numbers)."""
        path = self.run_dir(run_id) / "metrics.csv"
        redo = f"; delete {path.parent} and run the experiment again to redo that run"
        try:
            text = read_text(path, "metrics file")
        except FileError as exc:
            raise FileError(f"{exc}{redo}") from None
        if not text.endswith("\n"):
            raise FileError(f"{path} ends in the middle of a line (cut short?){redo}")
        r = csv.reader(io.StringIO(text))
        header = next(r, None)
        if header != ["iteration", "metric", "value"]:
            raise FileError(f"{path} is damaged: its header is {header}, not iteration,metric,value{redo}")
        try:
            return [(int(t), m, float(v)) for t, m, v in r]
        except ValueError as exc:
            raise ValidationError(f"{path} is damaged ({exc}){redo}") from None

    def manifest(self, run_id: str) -> dict:
        return read_manifest(self.run_dir(run_id) / "manifest.json")

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
    devices: dict[str, int] = field(default_factory=dict)  # where copied runs ran (:func:`run_device`) → how many


def _experiment(folder: Path) -> dict:
    """The experiment config a folder holds (its experiment.json), or an error that names what is wrong."""
    path = folder / "experiment.json"
    if not folder.is_dir():
        raise ConfigError(f"{folder} " + ("is a file, not an experiment folder" if folder.exists() else
                                          "does not exist"))
    if not path.exists():
        hint = (f"; a reproduction keeps its runs in a subfolder: name {folder / 'runs'}"
                if (folder / "runs" / "experiment.json").is_file() else "")
        raise ConfigError(f"{folder} holds no privdl experiment (no experiment.json){hint}")
    try:
        return read_json(path, "experiment file")
    except FileError as exc:
        raise FileError(f"{exc}: it is damaged; it names the experiment this folder holds — restore it, or choose "
                        "another folder") from None


def read_experiment(folder: str | Path) -> dict:
    """The experiment config a folder holds (its experiment.json): an error names a folder that holds none, or an
    experiment.json that is empty, cut short, not JSON or not an object."""
    return _experiment(Path(folder))


def read_manifest(path: str | Path) -> dict:
    """A run's manifest.json: an error names it where it is empty, cut short, not JSON, not an object, or not a
    run's manifest (no ``run_id`` and ``config``)."""
    man = read_json(path, "manifest")
    missing = [k for k in ("run_id", "config") if k not in man]
    if missing:
        raise FileError(f"manifest {path} is not a privdl run's manifest (no {', '.join(missing)})")
    return man


def merge(sources: Iterable[str | Path], dest: str | Path, *, other_experiments: bool = False) -> MergeSummary:
    """Gather the finished runs of experiment folders (shards run on other machines, earlier sessions' slices of
    a long grid) into ``dest``, which then holds them as if it had run them: a later ``privdl run`` / ``privdl
    reproduce`` over ``dest`` skips them and runs only the rest.

    A source holding the same experiment as ``dest`` up to its grid (``seeds`` and ``[sweep]``; an empty ``dest``
    takes the first source's experiment) — on whatever device it ran (:func:`_identity`) — gives all its runs, also
    those a larger grid would hold (``summary.devices`` counts the copied runs by where they ran). A source holding
    another experiment is refused before anything is copied, naming it and the keys at which it differs (a folder
    of another run, another host's outputs of another experiment); with ``other_experiments`` it gives only the
    runs ``dest``'s grid holds (the same resolved config, so the same id: Table 1's λ = 0.06 runs are Table 2's
    t = 1 column). A run is copied only if it is finished there and its manifest's
    config hashes to its id (so a run cannot land under another run's name; a run named by the id privdl gave it
    before data folders left run ids is copied under its id now, its old one kept as ``previous_run_id``); each is
    written as the runner writes one, metrics first and manifest last. A run ``dest`` already finished is kept,
    one another process is running there is left to it. ``dest``'s experiment.json, and so its grid, is not
    changed: results.csv and tables are rebuilt by the next ``privdl run`` / ``privdl reproduce`` (``--collect``)
    over the grid wanted."""
    from privdl.experiment.config import expand  # (config imports nothing of the store)
    from privdl.experiment.run_identity import legacy_run_id, run_id

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
    origin = root if (root / "experiment.json").is_file() else experiments[0][0]
    target = _experiment(root) if origin == root else experiments[0][1]
    try:
        grid = {r.run_id for r in expand(target)[0]}
    except ConfigError as exc:  # an experiment.json edited by hand, or of a later privdl
        raise ConfigError(f"{origin / 'experiment.json'} is not a config privdl can run: {exc}") from None
    others = [f"{s} (differs at: {', '.join(_identity_diff(target, exp, grid=False)[:8])})"
              for s, exp in experiments if _identity(exp, grid=False) != _identity(target, grid=False)]
    if others and not other_experiments:  # before anything is written: nothing taken from a folder by mistake
        raise ConfigError(f"{'; '.join(others)}: {'it holds' if len(others) == 1 else 'they hold'} another "
                          f"experiment than {origin / 'experiment.json'}; merge gathers the runs of one experiment "
                          "— name only its folders, or pass --other-experiments to take from the others only the "
                          f"runs {root}'s grid also holds")
    dest_store.claim(target)
    dest_store.check_writable()
    summary = MergeSummary(dest_store.root)
    for s, exp in experiments:
        src = ResultStore(s)
        # another experiment (e.g. Table 1 for Table 2's t = 1 column) gives only the runs this grid holds too
        foreign = _identity(exp, grid=False) != _identity(target, grid=False)
        if foreign:
            summary.other_experiments.append(
                f"{s} (differs at: {', '.join(_identity_diff(target, exp, grid=False))})")
        for d in sorted((s / "runs").glob("*/")) if (s / "runs").is_dir() else []:
            rid = d.name
            if not (d / "manifest.json").is_file():
                summary.unfinished += int((d / "metrics.csv").exists() or (d / ".lock").exists())
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a damaged source manifest is reported below, not as "redone"
                done = src.is_done(rid)
            try:
                man = src.manifest(rid) if done else None
            except FileError:  # a manifest without its config: reported below as damaged
                done, man = False, None
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
                rows = src.load_rows(old_id)  # read only for a run that is copied
            except PrivdlError as exc:
                warnings.warn(f"run {old_id} in {s} is damaged ({exc}); not copied", stacklevel=2)
                summary.unfinished += 1
                dest_store.unlock(rid)
                continue
            try:
                dest_store.save_run(rid, rows, man)
            finally:
                dest_store.unlock(rid)
            summary.copied += 1
            summary.rekeyed += int(rekey)
            code = str(man.get("privdl_source_sha256", "unknown"))
            summary.sources[code] = summary.sources.get(code, 0) + 1
            where = run_device(man)
            summary.devices[where] = summary.devices.get(where, 0) + 1
    summary.outside_grid = sum(1 for p in (dest_store.root / "runs").glob("*/manifest.json")
                               if p.parent.name not in grid)
    return summary


def read_results(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    """The rows of a results.csv; a file cut short (no final newline: an interrupted copy, a full disk) or a row
    whose value is not a number is refused rather than plotted."""
    text = read_text(path, "results file", empty=True)
    if text and not text.endswith("\n"):
        raise ValidationError(f"{path} ends in the middle of a line (cut short?); `privdl run CONFIG --out "
                              f"{Path(path).parent}` rebuilds it from the finished runs without recomputing them")
    r = csv.DictReader(io.StringIO(text))
    rows = list(r)
    missing = [c for c in ("run_id", "iteration", "metric", "value") if r.fieldnames and c not in r.fieldnames]
    if missing:
        raise ValidationError(f"{path} is not a privdl results.csv: its header lacks {', '.join(missing)} (it has "
                              f"{', '.join(r.fieldnames or [])[:200]})")
    for k, row in enumerate(rows, start=2):
        if None in row or None in row.values():
            raise ValidationError(f"{path}, line {k} has {'more' if None in row else 'fewer'} fields than its "
                                  f"header ({len(r.fieldnames or [])}): damaged?")
        try:
            float(row.get("value", "nan"))
        except (TypeError, ValueError):
            raise ValidationError(f"{path}, line {k}: value {row.get('value')!r} is not a number") from None
    return list(r.fieldnames or []), rows
