"""Benchmark: the distributed runtime (processes on torch.distributed, gloo, loopback) against the simulator.

One run — D-SGD + DECOR, logistic regression on the bundled breast-cancer data, ER(0.5), T rounds — through
``privdl run`` in the simulator (canonical mix) and with ``--procs K``; rounds per second from each manifest's
``seconds`` (the rounds, metrics at the recorded rounds and the final gather; not the start-up), the whole command's
wall time (process start, imports, rendezvous, data, the run), and whether results.csv is the simulator's to the
digit.

    python benchmarks/bench_runtime.py [--iterations 500] [--agents 8] [--procs 2,4,8]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """name = "bench"
seeds = [0]
iterations = {T}
eval_every = {T}
[schedule]
eta = 0.05
[network]
topology = "erdos_renyi"
n = {n}
p = 0.5
seed = 0
sparse = true
[task]
name = "logistic"
dataset = "breast_cancer"
[algorithm]
name = "dsgd"
[mechanism]
name = "decor"
epsilon = 10.0
"""


def _run(cfg: Path, out: Path, extra: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from privdl.cli import main; main()", "run", str(cfg), "--out", str(out),
                    "--no-plot", "--quiet", *extra], check=True, capture_output=True)
    wall = time.perf_counter() - t0
    man = json.loads(next((out / "runs").rglob("manifest.json")).read_text())
    return man["seconds"], wall


def _rows(out: Path) -> list:
    return sorted(tuple(v for k, v in r.items() if k != "run_id") for r in csv.DictReader(open(out / "results.csv")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--procs", default="2,4,8")
    args = ap.parse_args()
    T, n = args.iterations, args.agents
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "c.toml"
        cfg.write_text(CONFIG.format(T=T, n=n))
        print(f"D-SGD + DECOR, logistic (breast cancer), n = {n}, ER(0.5), T = {T}")
        print("| backend | agents per process | run seconds | rounds/s | / simulator | command wall s | equal |")
        print("|---|---|---|---|---|---|---|")
        base, wall = _run(cfg, Path(d) / "sim", ["--set", "batch_replicas=1"])
        print(f"| simulator | {n} | {base:.2f} | {T / base:.0f} | 1.00 | {wall:.1f} | |", flush=True)
        for k in (int(x) for x in args.procs.split(",")):
            if k > n:
                continue
            secs, wall = _run(cfg, Path(d) / f"p{k}", ["--procs", str(k)])
            same = _rows(Path(d) / f"p{k}") == _rows(Path(d) / "sim")
            print(f"| {k} processes | {n // k} | {secs:.2f} | {T / secs:.0f} | {secs / base:.2f} | {wall:.1f} | "
                  f"{'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
