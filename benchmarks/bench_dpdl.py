"""DPDL's per-round cost against DP-DSGD's (the DPDL issue's bar): a DPDL round makes deg(i) cross-gradients per agent
on top of the self-gradient, so it should cost about (1 + mean degree) DP-DSGD rounds of per-example work. Both on the
benchmark's configuration (10 agents on a ring, seed 004's small CNN on MNIST digits, Poisson lots of 64, C = 1,
float32 as `privdl reproduce dpdl` runs it), timed in the same process; the ratio is reported against 1 + mean degree
(the bar: within 1.3× of it).

    python benchmarks/bench_dpdl.py [--rounds 20] [--topology ring] [--data-dir ../shared/data] [--dtype float32]
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
from privdl.tasks import make_task


def timed(name: str, task, net, rounds: int, **params) -> float:
    alg = make_algorithm(name, **params)
    mech = make_mechanism("dp_sgd", steps=alg.accesses(rounds + 2, net.edges), task=task, epsilon=3.0, delta=1e-5,
                          clip=1.0, lot_size=64)
    sched = make_schedule("constant", iterations=rounds + 2, eta=0.05)
    simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=2, seed=0,
             metrics=False)  # warm-up
    t0 = time.perf_counter()
    simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds, seed=1,
             metrics=False)
    return (time.perf_counter() - t0) / rounds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--topology", default="ring")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args()
    net = Network.from_topology(args.topology, 10, **({"p": 0.3} if args.topology == "erdos_renyi" else {}))
    task = make_task("cnn", 10, dataset="mnist_t10k", train_size=8000, partition="dirichlet", alpha=0.1,
                     batch_size=64, dtype=getattr(torch, args.dtype),
                     **({"data_dir": args.data_dir} if args.data_dir else {}))
    degree = float(net.W.astype(bool).sum() - net.n) / net.n
    base = timed("dsgd", task, net, args.rounds)
    ours = timed("dpdl", task, net, args.rounds, self_noise=True)
    print(f"threads {torch.get_num_threads()}, {args.dtype}, {args.topology} n=10, mean degree {degree:.2f}")
    print(f"DP-DSGD {1e3 * base:.1f} ms/round, DPDL (self-noise) {1e3 * ours:.1f} ms/round: ratio "
          f"{ours / base:.2f} vs 1 + mean degree = {1 + degree:.2f} -> {ours / base / (1 + degree):.2f}x of the "
          "expected cost (bar: <= 1.3)")


if __name__ == "__main__":
    main()
