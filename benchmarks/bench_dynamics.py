"""Benchmark: a time-varying graph against a static one (issue 46 item 1, "Speed": at most 1.2×).

n = 1000 agents, sparse W: D-SGD with agent-level Gaussian LDP on seed 001's quadratic (d = 2: the rounds are
nearly all communication, the case where making W(t) weighs most) and on softmax regression over the bundled
digits (d = 650), each run on a static sparse graph (random 4-regular, Metropolis–Hastings, ``SparseComm``) and on
each law of W(t) (``random_matching``, ``one_peer_exponential``, ``peer_sampling`` with k = 2), in the same
process, ``--repeats`` interleaved repeats. Two ratios, same algorithm, mechanism and task: against the static
4-regular graph, and against the law frozen at W(1) (the same graph shape every round: the cost of W changing
alone — drawing, building, checking and switching to each round's edges). Each ratio is **paired** (the two runs of
one repeat, made back to back under the same load) and the median over repeats is reported, with its range; the
machine's load average (``os.getloadavg``) is printed before and after, since other processes share the cores, and
each line is repeated in process CPU time (``time.process_time``: all of this process's threads), which other jobs
on the cores move much less than wall-clock time.

    PYTHONPATH=src python benchmarks/bench_dynamics.py [--iterations 200] [--repeats 5] [--tasks quadratic,softmax]
        [--laws random_matching,one_peer_exponential,peer_sampling] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from privdl.algorithms import make_algorithm
from privdl.experiment.build import build_network
from privdl.mechanisms import make_mechanism
from privdl.network.dynamics import Dynamics
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task

LAWS = {
    "static (random 4-regular)": {"topology": "random_regular", "degree": 4},
    "random_matching": {"dynamics": "random_matching"},
    "one_peer_exponential": {"dynamics": "one_peer_exponential"},
    "peer_sampling (k = 2)": {"dynamics": "peer_sampling", "peers": 2},
}


class Frozen(Dynamics):
    """Round 1's W(t) in every round: a static run on the law's own graph shape (degrees, slots), so that the ratio
    to it is the cost of W changing alone."""

    def edges(self, t: int):
        return super().edges(1)


def frozen(net):
    """``net`` with its law frozen at W(1)."""
    import copy

    d = net.dynamics
    out = copy.copy(net)
    out.dynamics = copy.copy(d)
    out.dynamics.__class__ = Frozen
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tasks", default="quadratic,softmax")
    ap.add_argument("--laws", default=",".join(v.get("dynamics", "static") for v in LAWS.values()),
                    help="laws to run (the static graph always runs: the baseline)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n, T = args.n, args.iterations
    tasks = {"quadratic (d = 2)": lambda: make_task("quadratic", n),
             "softmax digits (d = 650)": lambda: make_task("softmax", n, dataset="digits", batch_size=1, seed=0)}
    alg = make_algorithm("dsgd")
    print(f"n = {n}, T = {T}, D-SGD + gaussian_ldp, {args.threads} threads, {args.repeats} repeats: medians of "
          "paired ratios [min–max]; load average (1, 5, 15 min) before: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    for label, make in tasks.items():
        if label.split()[0] not in args.tasks.split(","):
            continue
        task = make()
        rounds = T if label.startswith("quadratic") else max(5, T // 10)  # (softmax: the gradients dominate)
        sched = make_schedule("constant", eta=0.05, iterations=rounds)
        nets = {law: build_network({"n": n, **table}, 0) for law, table in LAWS.items()
                if "dynamics" not in table or table["dynamics"] in args.laws.split(",")}
        for law in [k for k, v in nets.items() if v.dynamics is not None]:
            nets[f"{law.split()[0]} frozen at W(1)"] = frozen(nets[law])
        times: dict[str, list[float]] = {law: [] for law in nets}
        cpu: dict[str, list[float]] = {law: [] for law in nets}  # process CPU time: less moved by other jobs
        for _ in range(args.repeats):  # interleaved: a busy machine slows every law of a repeat alike
            for law, net in nets.items():
                mech = make_mechanism("gaussian_ldp", steps=alg.accesses(rounds, net.edges), network=net, clip=1.0,
                                      epsilon=10.0)
                start, start_cpu = time.perf_counter(), time.process_time()
                simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds,
                         seed=1, sparse=True, metrics=False)
                times[law].append(time.perf_counter() - start)
                cpu[law].append(time.process_time() - start_cpu)
        base, base_cpu = times[next(iter(LAWS))], cpu[next(iter(LAWS))]

        def paired(a: list[float], b: list[float]) -> str:
            r = [x / y for x, y in zip(a, b)]
            return f"{statistics.median(r):5.2f} [{min(r):4.2f}–{max(r):4.2f}]"

        for law, secs in times.items():
            own = times.get(f"{law.split()[0]} frozen at W(1)")
            own_cpu = cpu.get(f"{law.split()[0]} frozen at W(1)")
            print(f"{label:26s} {law:28s} T = {rounds:4d} {statistics.median(secs) * 1e3 / rounds:8.3f} ms/round "
                  f"(median)   vs static {paired(secs, base)}" + (f"   vs its W(1) frozen {paired(secs, own)}"
                                                                   if own else ""))
            print(f"{'':26s} {'  (CPU time)':28s} {'':8s} {statistics.median(cpu[law]) * 1e3 / rounds:8.3f} ms/round "
                  f"(median)   vs static {paired(cpu[law], base_cpu)}"
                  + (f"   vs its W(1) frozen {paired(cpu[law], own_cpu)}" if own_cpu else ""))
    print("load average (1, 5, 15 min) after: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
