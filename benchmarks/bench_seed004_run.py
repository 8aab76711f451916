"""Benchmark: one short seed-004 run end to end through the command line (``privdl run examples/dp_dsgt_fmnist.toml``:
DP-DSGT, 10 agents, the small CNN on Fashion-MNIST, Poisson lots of 256, one evaluation at the end), each variant in
a fresh process, the variants' repeats interleaved so that a noisy machine slows them alike:

- privdl as it is (large tensors on transparent huge pages, ``privdl.tasks.layers``' Mish and max-pool);
- the same with ``THP_MEM_ALLOC_ENABLE=0`` (4 KiB pages: PyTorch's default outside privdl's command line);
- with ``--old-src PATH``, another privdl checkout (e.g. ``git worktree add /tmp/old HEAD~1``) with huge pages
  and with 4 KiB pages.

Reports wall time, CPU time (user + system, which shows the page faults' cost) and minor page faults per run, best of
``--repeats``. Needs Fashion-MNIST (Debian package ``dataset-fashion-mnist``).

    python benchmarks/bench_seed004_run.py [--rounds 80] [--repeats 3] [--threads 1] [--old-src PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def once(src: str, thp: str | None, rounds: int, threads: int) -> tuple[float, float, int]:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    env |= {"PYTHONPATH": src, "OMP_NUM_THREADS": str(threads)}
    if thp is not None:
        env["THP_MEM_ALLOC_ENABLE"] = thp
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "privdl.cli", "run", str(ROOT / "examples" / "dp_dsgt_fmnist.toml"),
                        "--set", f"iterations={rounds}", "--set", "eval_every=100000", "--out", out, "--no-plot",
                        "--quiet"], env=env, check=True, capture_output=True)
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_minflt - before.ru_minflt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--old-src", default=None, help="src/ folder of another privdl checkout")
    args = ap.parse_args()
    here = str(ROOT / "src")
    variants = [("privdl (huge pages, privdl's layers)", here, None), ("the same, THP_MEM_ALLOC_ENABLE=0", here, "0")]
    if args.old_src:
        variants += [(f"{args.old_src}, huge pages", args.old_src, "1"),
                     (f"{args.old_src}, THP_MEM_ALLOC_ENABLE=0", args.old_src, "0")]
    best = {name: (float("inf"), float("inf"), 0) for name, _, _ in variants}
    for _ in range(args.repeats):
        for name, src, thp in variants:
            r = once(src, thp, args.rounds, args.threads)
            if r[0] < best[name][0]:
                best[name] = r
    base = best[variants[-1][0]][0]
    print(f"seed 004 DP-DSGT run, {args.rounds} rounds + one evaluation, {args.threads} thread(s), best of "
          f"{args.repeats}, interleaved")
    print("| variant | wall (s) | CPU user+sys (s) | minor page faults | speed-up vs last row |")
    print("|---|---|---|---|---|")
    for name, _, _ in variants:
        wall, cpu, faults = best[name]
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {faults:,} | {base / wall:.2f}× |")


if __name__ == "__main__":
    main()
