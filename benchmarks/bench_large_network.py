"""Large sparse networks (issue 16): build time and peak memory of ring and ER(p = 10/n, connect = "bridge") at
n = 10⁴, 10⁵, 10⁶, and one round of D-SGD on seed 001's quadratic (d = 2) over them. Each case runs in a fresh
process, so its peak resident memory (ru_maxrss) is its own; the import baseline (torch, numpy, privdl) is measured
the same way and reported beside it. The baseline for time is the dense path at the largest n it accepts
(n = 4096): a dense W there is what privdl built before W could be sparse.

    python benchmarks/bench_large_network.py [--sizes 10000 100000 1000000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASE = r"""
import json, resource, sys, time
import torch
from privdl.algorithms import make_algorithm
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task
torch.set_num_threads(2)
top, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss()
if top == "import":
    print(json.dumps({"rss_mb": base})); sys.exit()
t = time.perf_counter()
params = {"p": 10.0 / n, "connect": "bridge"} if top == "erdos_renyi" else {}
net = Network.from_topology(top, n, **params)
edges = len(net.edges) // 2
build = time.perf_counter() - t
built = rss()
task = make_task("quadratic", n)
alg = make_algorithm("dsgd")
mech = make_mechanism("none", steps=rounds, task=task, network=net)
sched = make_schedule("constant", iterations=rounds, eta=1e-3)
t = time.perf_counter()
res = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds, seed=0,
               metrics=False)
step = (time.perf_counter() - t) / rounds
print(json.dumps({"topology": top, "n": n, "edges": edges, "sparse": net.sparse, "build_s": build,
                  "build_rss_mb": built, "round_s": step, "peak_rss_mb": rss(), "import_rss_mb": base}))
"""


def run(top: str, n: int, rounds: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, top, str(n), str(rounds)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    base = run("import", 0, 1)["rss_mb"]
    print(f"import baseline: {base:.0f} MB resident")
    print("| topology | n | edges | W | build (s) | peak after build (MB) | one D-SGD round (s) | peak (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for top in ("ring", "erdos_renyi"):
        for n in [4096, *args.sizes]:
            r = run(top, n, args.rounds)
            print(f"| {top} | {n:,} | {r['edges']:,} | {'sparse' if r['sparse'] else 'dense'} | {r['build_s']:.2f} | "
                  f"{r['build_rss_mb']:.0f} | {r['round_s']:.3f} | {r['peak_rss_mb']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
