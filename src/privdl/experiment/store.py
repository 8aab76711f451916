"""The results store of one experiment directory, written atomically so an interrupted sweep loses nothing.

    DIR/experiment.json            the experiment's config (a different config is refused)
    DIR/runs/<run_id>/metrics.csv  one run's rows
    DIR/runs/<run_id>/manifest.json  written last: its presence marks the run finished
    DIR/results.csv                long format: run_id, <sweep axes...>, iteration, metric, value
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from privdl.errors import ConfigError


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
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


class ResultStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def claim(self, experiment: dict) -> None:
        """Bind the directory to ``experiment``; refuse a directory holding another experiment's results."""
        path = self.root / "experiment.json"
        text = json.dumps(experiment, indent=2, sort_keys=True, default=str)
        if path.exists():
            old = json.loads(path.read_text())
            if old != json.loads(text):
                keys = ", ".join(_diff(old, json.loads(text))[:8])
                raise ConfigError(
                    f"{self.root} holds results of a different experiment (config differs at: {keys}); "
                    f"choose another --out directory or delete it"
                )
            return
        if self.root.exists() and any(self.root.iterdir()):
            raise ConfigError(f"{self.root} is not empty and holds no privdl experiment; choose another --out")
        atomic_write(path, text)

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def is_done(self, run_id: str) -> bool:
        return (self.run_dir(run_id) / "manifest.json").is_file()

    def save_run(self, run_id: str, rows: Iterable[tuple[int, str, float]], manifest: dict) -> None:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["iteration", "metric", "value"])
        w.writerows(rows)
        atomic_write(self.run_dir(run_id) / "metrics.csv", buf.getvalue())
        atomic_write(self.run_dir(run_id) / "manifest.json", json.dumps(manifest, indent=2, default=str))

    def load_rows(self, run_id: str) -> list[tuple[int, str, float]]:
        with open(self.run_dir(run_id) / "metrics.csv") as f:
            r = csv.reader(f)
            next(r)
            return [(int(t), m, float(v)) for t, m, v in r]

    def manifest(self, run_id: str) -> dict:
        return json.loads((self.run_dir(run_id) / "manifest.json").read_text())

    def write_results(self, axes: list[str], runs: list[tuple[str, dict]]) -> Path:
        """Assemble DIR/results.csv from the finished runs' files."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["run_id", *axes, "iteration", "metric", "value"])
        for rid, sweep in runs:
            cols = ["" if sweep.get(a) is None else sweep[a] for a in axes]
            for t, m, v in self.load_rows(rid):
                w.writerow([rid, *cols, t, m, repr(v)])
        path = self.root / "results.csv"
        atomic_write(path, buf.getvalue())
        return path


def read_results(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path) as f:
        r = csv.DictReader(f)
        return list(r.fieldnames or []), list(r)
