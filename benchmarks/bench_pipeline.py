"""Benchmark: the reproductions through the one pipeline (packaged configs → runner → stacked replicas → store with
manifests and ledgers) against the hand-wired path they replaced, in the same invocation on the same machine.

The old path is a checkout of privdl before the foundation issue (commit f4c4ef3: ``git worktree add /tmp/old
f4c4ef3``), run in a subprocess with ``--old-src /tmp/old/src``; without it only the new path is timed.

    python benchmarks/bench_pipeline.py [--old-src PATH] [--only quadratic fig1 fmnist] [--seeds 10] [--fmnist-steps 100]

fmnist (Fig. 5's reduced protocol, 12 replicas of the 101 770-parameter MLP) needs Fashion-MNIST (Debian package
``dataset-fashion-mnist``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

SNIPPET = """
import inspect, json, sys, time, privdl
from privdl.reproductions import REPRODUCTIONS
name, out, seeds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rounds = "iterations" if "iterations" in inspect.signature(REPRODUCTIONS.get(name)).parameters else "steps"
opts = {"seeds": seeds} if name.startswith("quadratic") else {rounds: steps} if name == "fmnist" else {}
t = time.perf_counter()
rows = REPRODUCTIONS.get(name)(out, **opts)
print(json.dumps({"seconds": time.perf_counter() - t, "rows": len(rows), "privdl": privdl.__file__}))
"""


def timed(name: str, src: str | None, seeds: int, steps: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if src:
        env["PYTHONPATH"] = src
    with tempfile.TemporaryDirectory() as out:
        res = subprocess.run([sys.executable, "-c", SNIPPET, name, out, str(seeds), str(steps)], env=env, check=True,
                             capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-src", default=None, help="src/ of a privdl checkout before the foundation issue")
    ap.add_argument("--only", nargs="*", default=["quadratic", "fig1", "fmnist"])
    ap.add_argument("--seeds", type=int, default=10, help="quadratic: seeds per setting (the paper's 10)")
    ap.add_argument("--fmnist-steps", type=int, default=100, help="fmnist: rounds (the reduced protocol's 1000 takes "
                    "~15 min per path)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print("| reproduction | old path (s) | one pipeline (s) | ratio new/old | rows |")
    print("|---|---|---|---|---|")
    for name in args.only:
        new = timed(name, None, args.seeds, args.fmnist_steps, args.threads)
        old = timed(name, args.old_src, args.seeds, args.fmnist_steps, args.threads) if args.old_src else None
        ratio = f"{new['seconds'] / old['seconds']:.2f}" if old else "—"
        print(f"| {name} | {old['seconds']:.1f} | {new['seconds']:.1f} | {ratio} | {new['rows']} |" if old else
              f"| {name} | — | {new['seconds']:.1f} | {ratio} | {new['rows']} |", flush=True)


if __name__ == "__main__":
    main()
