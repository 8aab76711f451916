"""Benchmark: ``privdl run --jobs 2`` on a sweep of runs that never stack (DP-SGD), the current planner against
another checkout's (``--old-src``, e.g. ``git worktree add /tmp/old c7cdc6c~1``: the planner that gave a whole
group of unstackable runs to one process). The sweep is the seed-004 example (DP-DSGT, 10 agents, the small CNN on
Fashion-MNIST, Poisson lots of 256) over ``--runs`` seeds, ``--rounds`` rounds each, no evaluation but the last.
Each invocation is a fresh process; the variants' repeats are interleaved, so a noisy machine slows them alike.

Reports wall time (best of ``--repeats``) and how many processes ran runs (distinct pids in the manifests). Needs
Fashion-MNIST (Debian package ``dataset-fashion-mnist``).

    python benchmarks/bench_jobs.py --old-src /tmp/old/src [--runs 4] [--rounds 40] [--repeats 2]
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

ROOT = Path(__file__).resolve().parents[1]


def once(src: str, runs: int, rounds: int) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": src}
    example = (ROOT / "examples" / "dp_dsgt_fmnist.toml").read_text()
    assert "\nseed = 0\n" in example
    with tempfile.TemporaryDirectory() as out:
        config = Path(out) / "sweep.toml"  # the example over seeds 0 … runs − 1
        config.write_text(example.replace("\nseed = 0\n", f"\nseeds = {list(range(runs))}\n"))
        out = str(Path(out) / "out")
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "privdl.cli", "run", str(config), "--set", f"iterations={rounds}",
                        "--set", "eval_every=100000", "--out", out, "--no-plot", "--quiet", "--jobs", "2"],
                       env=env, check=True, capture_output=True)
        wall = time.perf_counter() - start
        pids = {json.loads(p.read_text())["process"]["pid"] for p in Path(out).glob("runs/*/manifest.json")}
    return wall, len(pids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-src", required=True, help="src folder of a checkout with the old planner")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    variants = {"privdl now": str(ROOT / "src"), "old planner": args.old_src}
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.repeats):
        for name, src in variants.items():
            wall, procs = once(src, args.runs, args.rounds)
            if name not in best or wall < best[name][0]:
                best[name] = (wall, procs)
    base = best["old planner"][0]
    print(f"{args.runs} DP-SGD runs of {args.rounds} rounds, --jobs 2, best of {args.repeats}")
    for name, (wall, procs) in best.items():
        print(f"  {name:12s} {wall:7.1f} s  {procs} process(es) ran runs  {base / wall:5.2f}× the old planner")


if __name__ == "__main__":
    main()
