"""Seed 002's random matrix step-sizes and the replica axis.

1. M·g per agent at L = 10⁶, n = 5, for each structure, draws included (every entry of M comes from the agent's
   keyed stream): ``upper_bidiagonal`` and ``sparse`` are O(L) and must stay within 5× of a plain diagonal scaling
   (the issue's bar), measured in one run. ``dense`` is O(L²) and refused at that size.
2. ``rms_filtering``'s panels: R runs of one method stacked on the replica axis against the same R runs one by one
   in the same process (same keys, same results to rounding).
3. The floor under ``privdl reproduce rms_filtering``: the keyed numbers it draws per round, and what drawing them
   costs over 60 000 rounds.

    python benchmarks/bench_rms.py [--dim 1000000] [--replicas 50] [--iterations 2000] [--floor-rounds 300]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from privdl.algorithms import make_algorithm
from privdl.keys import Keys, _Lookahead
from privdl.mechanisms import make_mechanism
from privdl.mechanisms.rms import RandomMatrixStepSize
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import Replica, simulate, simulate_replicas
from privdl.tasks import make_task


def best_of(fn, repeat: int = 5) -> float:
    fn()
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def bench_products(dim: int, n: int = 5) -> None:
    keys = Keys(0, n)
    g = torch.randn(n, dim, dtype=torch.float64)
    base = None
    print(f"M·g, n = {n}, L = {dim:,} (draws included), best of 5")
    for structure in ("diagonal", "upper_bidiagonal", "sparse"):
        rms = RandomMatrixStepSize(sigma_mu=0.1, sigma_z=0.1, structure=structure)
        t = best_of(lambda: rms.apply(g, keys, 1))
        base = base or t
        print(f"  {structure:17s} {t * 1e3:9.1f} ms   {t / base:5.2f}× diagonal")


def bench_replicas(replicas: int, iterations: int) -> None:
    net = Network.from_topology("erdos_renyi", 5, p=0.5, mixing="laplacian", seed=2)
    task = make_task("adaptive_filtering", 5, heterogeneous=True)
    print(f"rms_filtering panel: {replicas} runs × {iterations} rounds, K = 5, L = 5")
    for name in ("dsgd", "dsg_rms", "pd_lms"):
        alg = make_algorithm(name)
        sched = make_schedule("constant", iterations=iterations, eta=4e-4)
        steps = alg.accesses(iterations, net.edges)

        def stacked():
            reps = [Replica(net, make_mechanism("none", steps=steps), sched, s) for s in range(replicas)]
            return simulate_replicas(task=task, algorithm=alg, replicas=reps, iterations=iterations,
                                     eval_every=20)

        def one_by_one():
            return [simulate(task=task, network=net, algorithm=alg, mechanism=make_mechanism("none", steps=steps),
                             schedule=sched, iterations=iterations, seed=s, eval_every=20)
                    for s in range(replicas)]

        t_stack, t_single = best_of(stacked, 1), best_of(one_by_one, 1)
        a, b = stacked().final, torch.stack([r.final for r in one_by_one()])
        agree = float((a - b).abs().max())
        ahead = _Lookahead.get
        _Lookahead.get = lambda *args: None  # every keyed draw computed at its own round (before the lookahead)
        try:
            t_plain = best_of(stacked, 1)
            same = torch.equal(stacked().final, a)
        finally:
            _Lookahead.get = ahead
        print(f"  {name:8s} stacked {t_stack:6.2f} s   one by one {t_single:7.2f} s   {t_single / t_stack:5.1f}× "
              f"  (max |difference| {agree:.1e})   without lookahead {t_plain:5.2f} s ({t_plain / t_stack:.2f}×, "
              f"{'identical' if same else 'DIFFERENT'})")


def bench_draw_floor(rounds: int, horizon: int = 60_000) -> None:
    """The keyed numbers ``privdl reproduce rms_filtering`` draws per round (counted on a short run of the packaged
    config), and what drawing them alone costs over the reproduction's horizon: a floor under its run time that no
    batching of the Python steps removes."""
    import tempfile

    from privdl.experiment import run_experiment
    from privdl.keys import Keys, fold, normal
    from privdl.reproductions import packaged_config
    from privdl.reproductions.common import with_overrides

    drawn = [0]
    inner = Keys._draw

    def counting(self, fn, purpose, counter, size, rows, requesters, **kw):
        out = inner(self, fn, purpose, counter, size, rows, requesters, **kw)
        drawn[0] += out.numel()
        return out

    cfg = with_overrides(packaged_config("rms_filtering"), {"iterations": rounds, "task.switch_at": rounds // 2})
    Keys._draw = counting
    try:
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            run_experiment(cfg, out, progress=False)
            spent = time.perf_counter() - t0
    finally:
        Keys._draw = inner
    per_round = drawn[0] / rounds
    keys = fold(np.uint64(7), np.arange(4096))
    t = best_of(lambda: normal(keys, 25), 5)
    ns = t / keys.size / 25 * 1e9
    print(f"rms_filtering at {rounds} rounds: {spent:.1f} s; {per_round:,.0f} keyed numbers per round (all 1200 "
          f"runs); {ns:.1f} ns per keyed normal in blocks → drawing alone takes {per_round * horizon * ns * 1e-9:.0f} s "
          f"of one core over {horizon:,} rounds")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=50)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--floor-rounds", type=int, default=300, help="rounds of the run that counts the keyed draws")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    bench_products(a.dim)
    bench_replicas(a.replicas, a.iterations)
    bench_draw_floor(a.floor_rounds)


if __name__ == "__main__":
    main()
