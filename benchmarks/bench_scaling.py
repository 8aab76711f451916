"""Benchmark: strong scaling of the distributed runtime — `privdl run --procs K` against the simulator, one machine.

A compute-bound run (issue 44): seed 004's small CNN with DP-SGD (per-example clipping, Poisson lots of 64 expected
examples, ε = 3 at example level) on 16 agents (ring), the bundled digits upsampled to 28 × 28, T rounds. The same
config runs in the simulator (one process, torch's threads) and on K processes (each holding 16/K agents; privdl's
launcher gives each process cores/K intra-op threads). Per round: the manifest's ``seconds`` / T for both (the
rounds, the recorded rounds' metrics and the final gather), and for ``--procs K`` the slowest process's median
round (``placement.per_process``). The goal: K = 16 on 16 cores faster than the simulator.

    python benchmarks/bench_scaling.py [--procs 2,4,8,16] [--rounds 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """name = "scaling"
seeds = [0]
iterations = {rounds}
eval_every = {rounds}
[schedule]
eta = 0.05
[network]
topology = "ring"
n = 16
sparse = true
[task]
name = "cnn"
dataset = "digits"
resize = 28
batch_size = 64
[algorithm]
name = "dsgd"
[mechanism]
name = "dp_sgd"
epsilon = 3.0
delta = 1e-5
lot_size = 64
"""


def run(rounds: int, procs: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text(CONFIG.format(rounds=rounds))
        extra = ["--procs", str(procs)] if procs else []
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "privdl.cli", "run", str(cfg), "--out", str(Path(tmp) / "o"),
                        "--no-plot", "--quiet", *extra], check=True)
        wall = time.perf_counter() - t0
        man = json.loads(next((Path(tmp) / "o" / "runs").rglob("manifest.json")).read_text())
    out = {"procs": procs or 0, "round_seconds": man["seconds"] / rounds, "wall_seconds": wall,
           "threads": man["process"]["threads"], "cpus": os.cpu_count()}
    per = man.get("placement", {}).get("per_process")
    if per:
        out.update(round_seconds_median=max(p["round_seconds_median"] for p in per),
                   startup_seconds=max(p["startup_seconds"] for p in per),
                   peak_rss_bytes=max(p["peak_rss_bytes"] for p in per))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="2,4,8,16")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [run(args.rounds, None)] + [run(args.rounds, int(k)) for k in args.procs.split(",")]
    base = rows[0]["round_seconds"]
    for r in rows:
        r["ratio_to_simulator"] = r["round_seconds"] / base
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
