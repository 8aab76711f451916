"""Benchmark: the sliced backend's overhead against the simulator (issue 30).

The simulator benchmark's setting (BENCHMARKS.md, "Simulator vs per-agent loop"): private D-SGD, logistic
regression on a9a, n = 20 agents on ER(0.5) with Metropolis–Hastings weights, batch 128, agent-level Gaussian LDP —
run by ``simulate(sparse=True)`` and by ``simulate_sliced`` with K ∈ {2, 4, 20} slices, in the same process, best of
``--repeats``; every sliced run is checked to equal the simulator's bit for bit. Also DECOR (pairwise shared seeds)
and DP-SGD (Poisson lots: one control operation per access).

    python benchmarks/bench_sliced.py [--iterations 200] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import time

import torch

from privdl.algorithms import make_algorithm
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.sliced import simulate_sliced
from privdl.tasks import make_task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slices", default="2,4,20")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n, T = 20, args.iterations
    net = Network.from_topology("erdos_renyi", n, p=0.5, seed=0)
    task = make_task("logistic", n, dataset="a9a", partition="dirichlet", alpha=10.0, batch_size=128, seed=0,
                     data_dir=args.data_dir)
    alg = make_algorithm("dsgd")
    sched = make_schedule("constant", eta=0.05, iterations=T)
    steps = alg.accesses(T, net.edges)
    mechs = {
        "gaussian_ldp": lambda: make_mechanism("gaussian_ldp", steps=steps, network=net, clip=0.1, epsilon=10.0),
        "decor": lambda: make_mechanism("decor", steps=steps, network=net, clip=0.1, epsilon=10.0),
        "dp_sgd": lambda: make_mechanism("dp_sgd", steps=steps, task=task, clip=0.1, lot_size=128,
                                         noise_multiplier=1.0),
    }
    print(f"a9a logistic regression, n={n}, ER(0.5) MH, batch 128, T={T}, {args.threads} threads, best of "
          f"{args.repeats}")
    print("| mechanism | backend | seconds | rounds/s | / simulator | payload MB | equal to the simulator |")
    print("|---|---|---|---|---|---|---|")
    for name, make in mechs.items():
        mech = make()
        kw = dict(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=T, seed=0,
                  metrics=False)

        def best(fn):
            out, secs = None, []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                out = fn()
                secs.append(time.perf_counter() - t0)
            return out, min(secs)

        base, s0 = best(lambda: simulate(**kw, sparse=True))
        print(f"| {name} | simulator (sparse) | {s0:.2f} | {T / s0:.0f} | 1.00 | | |", flush=True)
        for k in (int(x) for x in args.slices.split(",")):
            res, s = best(lambda: simulate_sliced(**kw, slices=k))
            same = torch.equal(res.final, base.final)
            print(f"| {name} | sliced, K = {k} | {s:.2f} | {T / s:.0f} | {s / s0:.2f} | "
                  f"{res.extra['payload_bytes'] / 2**20:.1f} | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
