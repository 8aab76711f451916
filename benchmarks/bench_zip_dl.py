"""Zip-DL's per-step cost against DECOR's (issue 34): both draw one Gaussian row per edge per step (DECOR one per
undirected edge, shared by its endpoints; Zip-DL one per directed edge plus the sender's own copy, then the zero-sum
correction and one ``send`` of per-edge payloads instead of a broadcast ``mix``). Private D-SGD (ATC) on logistic
regression over a9a (123 features), n agents on ER(0.3), float64, every step of a run timed as the median over
repeats, both in the same process.

    python benchmarks/bench_zip_dl.py [--agents 20 50 100] [--rounds 20] [--repeats 5] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from privdl.algorithms import make_algorithm
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task


def per_step(name: str, task, net, rounds: int, repeats: int) -> float:
    alg = make_algorithm("dsgd")
    mech = make_mechanism(name, steps=alg.accesses(rounds, net.edges), network=net, epsilon=3.0, delta=1e-5,
                          clip=1.0)
    sched = make_schedule("constant", iterations=rounds, eta=0.1)
    run = dict(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, metrics=False, sparse=True)
    simulate(iterations=2, seed=0, **run)  # warm-up
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        simulate(iterations=rounds, seed=r + 1, **run)
        times.append((time.perf_counter() - t0) / rounds)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, nargs="+", default=[20, 50, 100])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    print(f"threads {torch.get_num_threads()}, float64, D-SGD on a9a logistic regression, ER(0.3)")
    for n in args.agents:
        net = Network.from_topology("erdos_renyi", n, p=0.3, seed=0)
        task = make_task("logistic", n, dataset="a9a", batch_size=32, dtype=torch.float64,
                         **({"data_dir": args.data_dir} if args.data_dir else {}))
        decor = per_step("decor", task, net, args.rounds, args.repeats)
        zip_dl = per_step("zip_dl", task, net, args.rounds, args.repeats)
        print(f"n = {n:4d}, {len(net.edges):5d} directed edges: DECOR {1e3 * decor:7.2f} ms/step, Zip-DL "
              f"{1e3 * zip_dl:7.2f} ms/step, ratio Zip-DL / DECOR = {zip_dl / decor:.2f}")


if __name__ == "__main__":
    main()
