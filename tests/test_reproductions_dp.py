"""Seed 004's table reproductions run end to end (tiny settings) and survive interruption."""

import math

from privdl.reproductions import REPRODUCTIONS
from privdl.reproductions.common import read_csv


def test_table1_cells_ledgers_and_resume(tmp_path):
    opts = dict(seeds=1, iterations=3, epsilons=(math.inf, 2.0), fiedlers=(1.0,), methods=("dsgt", "dinno"),
                dataset="digits", lot=32)
    summary = REPRODUCTIONS.get("table1")(tmp_path, **opts)
    rows = read_csv(tmp_path / "table1.csv")
    assert len(rows) == 2 + 4  # central per ε, then 2 methods × 2 ε
    private = [r for r in rows if r["epsilon"] == "2.0"]
    assert all(r["unit"] == "example" and float(r["epsilon_achieved"]) <= 2.0 for r in private)
    dsgt = next(r for r in private if r["method"] == "dsgt")
    assert int(dsgt["noisy_accesses"]) == 4  # T + 1: DSGT's initial tracking gradient is accounted
    assert {s["method"] for s in summary} == {"central", "dsgt", "dinno"}
    stamp = (tmp_path / "table1.csv").stat().st_mtime_ns
    REPRODUCTIONS.get("table1")(tmp_path, **opts)  # everything done: nothing reruns
    assert (tmp_path / "table1.csv").stat().st_mtime_ns == stamp
