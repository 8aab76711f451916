"""Benchmark: does a change make the simulator slower? Old source tree against new, back to back (issue 30).

Three workloads, each timed in a fresh process under each tree in turn (old, new, old, new, ...), best of
``--repeats``:

* ``simulator``  — BENCHMARKS.md's simulator benchmark: private D-SGD (Gaussian LDP), logistic regression on a9a,
  n = 20, ER(0.5), batch 128, T = 1000, float64, closed form; dense and sparse Comm (rounds per second);
* ``stacked``    — a stacked quadratic grid through the runner: 3 mechanisms × 4 ε × 30 seeds = 360 runs of
  T = 5000 on 10 agents (seconds);
* ``pipeline``   — ``privdl run examples/quickstart.toml`` end to end (18 runs, plots off; seconds).

    git worktree add /tmp/old <commit>
    python benchmarks/bench_regression.py --old-src /tmp/old/src [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

SIMULATOR = r"""
import json, sys, time, torch
from privdl.algorithms import make_algorithm
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task
torch.set_num_threads(2)
T, n = 1000, 20
net = Network.from_topology("erdos_renyi", n, p=0.5, seed=0)
task = make_task("logistic", n, dataset="a9a", partition="dirichlet", alpha=10.0, batch_size=128, seed=0,
                 data_dir=sys.argv[1])
alg = make_algorithm("dsgd")
out = {}
for sparse in (False, True):
    mech = make_mechanism("gaussian_ldp", steps=alg.accesses(T, net.edges), network=net, clip=0.1, epsilon=10.0)
    t0 = time.perf_counter()
    simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=make_schedule("constant", eta=0.05,
             iterations=T), iterations=T, seed=0, sparse=sparse, metrics=False)
    out["sparse" if sparse else "dense"] = T / (time.perf_counter() - t0)
print(json.dumps(out))
"""

STACKED = r"""
import json, sys, time, tempfile
from privdl.experiment import run_experiment
cfg = {"name": "grid", "seeds": list(range(30)), "iterations": 5000, "eval_every": 500, "base_dir": ".",
       "network": {"topology": "erdos_renyi", "n": 10, "p": 0.5, "seed": 0},
       "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.02},
       "mechanism": {"clip": 1.0, "delta": 1e-5},
       "sweep": {"mechanism.name": ["gaussian_ldp", "decor", "whisper"], "mechanism.epsilon": [1.0, 3.0, 10.0, 30.0]}}
with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    run_experiment(cfg, d, progress=False)
    print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def _run(code: str, src: str, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pipeline(src: str) -> dict:
    import time

    env = {**os.environ, "PYTHONPATH": src}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import sys; from privdl.cli import main; sys.argv[0] = 'privdl'; main()",
                        "run", str(HERE.parent / "examples" / "quickstart.toml"), "--out", d, "--no-plot",
                        "--quiet"], env=env, capture_output=True, check=True)
        return {"seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-src", required=True)
    ap.add_argument("--new-src", default=str(HERE.parent / "src"))
    ap.add_argument("--data-dir", default=str(HERE.parent.parent / "shared" / "data"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="simulator,stacked,pipeline")
    args = ap.parse_args()
    trees = {"old": args.old_src, "new": args.new_src}
    work = {"simulator": lambda src: _run(SIMULATOR, src, [args.data_dir]),
            "stacked": lambda src: _run(STACKED, src, []),
            "pipeline": _pipeline}
    print("| workload | measure | old (best) | new (best) | new / old |")
    print("|---|---|---|---|---|")
    for name in args.only.split(","):
        got: dict[str, list[dict]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            for tree in ("old", "new"):
                got[tree].append(work[name](trees[tree]))
        for key in got["old"][0]:
            rate = key != "seconds"  # rounds per second: higher is better; seconds: lower is better
            pick = max if rate else min
            old, new = pick(r[key] for r in got["old"]), pick(r[key] for r in got["new"])
            ratio = (old / new) if rate else (new / old)
            print(f"| {name} | {key if rate else 'seconds'}{' (rounds/s)' if rate else ''} | {old:.1f} | {new:.1f} | "
                  f"{ratio:.3f} (time) |", flush=True)


if __name__ == "__main__":
    main()
