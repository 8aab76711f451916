"""Example-level grids stacked on the replica axis (issue 32): one grid cell run end to end by the CLI, the old path
(a checkout whose runner never stacks DP-SGD runs, ``--old-src``) against this checkout, ``--jobs 2`` both, back to
back on the same machine; each invocation a fresh process tree, the variants' repeats interleaved.

Cells:

* ``dpdl`` — seed 003's DPDL benchmark cell "MNIST digits, ring, Dirichlet 0.1" at one seed: 7 methods × (ε ∈ {1, 3,
  10} and non-private) = 28 runs (``privdl reproduce dpdl --dataset mnist_t10k --graph ring --split 'Dirichlet
  0.1' --seeds 1 --method ...``), ``--rounds`` rounds each (the full cell is 1000);
* ``table1`` — seed 004's Table 1 at one seed (``privdl reproduce table1 --seeds 1 --dataset DATASET``).

Also reported, for this checkout: the FLOPs of one round of the whole cell (torch's FlopCounterMode over one round of
every stacked batch: convolutions and matrix products, the per-example work included) and the achieved FLOP/s of the
stacked run; the replica cap the runner chose per batch; the peak RSS of the run's process tree.

    git worktree add /tmp/old <commit before stacking>
    python benchmarks/bench_grid_stack.py --old-src /tmp/old/src [--cell dpdl] [--rounds 100] [--repeats 1]
    python benchmarks/bench_grid_stack.py --old-src - --per-round --rounds 30   # the engine's loop alone
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DPDL_METHODS = ("DPDL", "DPDL self-noise", "DPDL uncalibrated", "DP-DSGD", "DP-DSGT", "DP-DSGD 10eta", "DP-DSGT 10eta")


def command(cell: str, out: str, rounds: int, dataset: str) -> list[str]:
    base = [sys.executable, "-m", "privdl.cli", "reproduce", cell, "--out", out, "--seeds", "1", "--iterations",
            str(rounds), "--jobs", "2"]
    if cell == "dpdl":
        base += ["--dataset", dataset, "--graph", "ring", "--split", "Dirichlet 0.1"]
        for m in DPDL_METHODS:
            base += ["--method", m]
    else:
        base += ["--dataset", dataset]
    return base


def once(src: str, cell: str, rounds: int, dataset: str) -> tuple[float, int, list[dict]]:
    """Wall seconds, peak RSS (kB) of the largest process of the tree, and every run's manifest."""
    env = {**os.environ, "PYTHONPATH": src}
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        start = time.perf_counter()
        proc = subprocess.run(command(cell, tmp, rounds, dataset), env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode:
            raise SystemExit(f"{src}: {proc.stderr[-3000:]}")
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        mans = [json.loads(p.read_text()) for p in Path(tmp).glob("**/runs/*/manifest.json")]
    return wall, max(rss, before), mans


def flops_of_one_round(cell: str, dataset: str) -> tuple[float, list[int]]:
    """FLOPs of one round of every run of the cell (each stacked batch as the runner plans it) and the batch sizes."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from privdl.experiment.build import build, build_network, build_task
    from privdl.experiment.config import expand
    from privdl.experiment.capacity import capacity
    from privdl.experiment.run_plan import plan
    from privdl.reproductions.common import packaged_config, with_overrides
    from privdl.simulator import Replica, simulate_replicas
    from privdl.mechanisms.stack import need_signature

    if cell != "dpdl":
        return float("nan"), []
    cfg = packaged_config("dpdl")
    cfg = with_overrides(cfg, {"seeds": 1, "iterations": 1, "eval_every": 1,
                               "sweep.data": [b for b in cfg["sweep"]["data"] if b["task"]["dataset"] == dataset],
                               "sweep.graph": [cfg["sweep"]["graph"][0]], "sweep.split": [cfg["sweep"]["split"][0]]})
    runs, _ = expand(cfg)
    total, sizes = 0.0, []
    for group in plan(runs):
        first = group[0].config
        task = build_task(first, build_network(first["network"], first["seed"], first.get("base_dir")).n)
        parts = [build(s.config, task=task) for s in group]
        by: dict[tuple, list[int]] = {}
        for k, c in enumerate(parts):
            by.setdefault(need_signature(c.mechanism.need), []).append(k)
        for members in by.values():
            cap = capacity(first, parts[members[0]])
            for lo in range(0, len(members), cap):
                chunk = [parts[k] for k in members[lo:lo + cap]]
                sizes.append(len(chunk))
                reps = [Replica(c.network, c.mechanism, c.schedule, group[0].config["seed"]) for c in chunk]
                with FlopCounterMode(display=False) as counter:
                    simulate_replicas(task=task, algorithm=chunk[0].algorithm, replicas=reps, iterations=1,
                                      metrics=False)
                total += counter.get_total_flops()
    del torch
    return total, sizes


def loop_seconds(mans: list[dict]) -> float:
    """Seconds the processes spent in the rounds and evaluations (the engine's loop; a stacked batch once): the
    cell's time less start-up, data loading and the σ calibrations (the same work in both variants)."""
    batches = {(m["process"]["pid"], m["batch"].get("seconds", m["seconds"]), m["batch"]["replicas"]) for m in mans
               if m["batch"]["replicas"] > 1}
    return sum(m["seconds"] for m in mans if m["batch"]["replicas"] == 1) + sum(b[1] for b in batches)


def _alone_and_stacked(task, net, algorithm: str, replicas: int, rounds: int, lot: int,
                       sigma_step: float) -> tuple[float, float]:
    """Seconds per round of ``replicas`` DP-SGD runs (noise multipliers 1, 1 + step, …) on ``task`` over ``net``: one
    at a time, and stacked; the engine's loop only (no calibration, no evaluation), one thread, after a warm-up."""
    import torch

    from privdl.algorithms import make_algorithm
    from privdl.mechanisms import make_mechanism
    from privdl.schedules import make_schedule
    from privdl.simulator import Replica, simulate, simulate_replicas

    torch.set_num_threads(1)
    alg = make_algorithm(algorithm)

    def rep(k: int) -> Replica:
        mech = make_mechanism("dp_sgd", steps=alg.accesses(rounds + 2, net.edges), task=task, clip=1.0, lot_size=lot,
                              noise_multiplier=1.0 + sigma_step * k)
        return Replica(net, mech, make_schedule("constant", eta=0.05, iterations=rounds), 0)

    simulate_replicas(task=task, algorithm=alg, replicas=[rep(k) for k in range(replicas)], iterations=2,
                      metrics=False)
    t0 = time.perf_counter()
    for k in range(replicas):
        r = rep(k)
        simulate(task=task, network=net, algorithm=alg, mechanism=r.mechanism, schedule=r.schedule,
                 iterations=rounds, seed=0, metrics=False)
    alone = (time.perf_counter() - t0) / rounds
    t0 = time.perf_counter()
    simulate_replicas(task=task, algorithm=alg, replicas=[rep(k) for k in range(replicas)], iterations=rounds,
                      metrics=False)
    return alone, (time.perf_counter() - t0) / rounds


def per_round(algorithm: str, replicas: int, rounds: int, dataset: str, lot: int = 64,
              split: dict | None = None) -> tuple[float, float]:
    """:func:`_alone_and_stacked` for the cell's configuration (ring of 10, the small CNN, lots of 64, float32)."""
    import torch

    from privdl.network import Network
    from privdl.tasks import make_task

    split = split or {"partition": "dirichlet", "alpha": 0.1, "min_size": lot,
                      **({"train_size": 8000} if dataset == "mnist_t10k" else {})}
    task = make_task("cnn", 10, dataset=dataset, batch_size=lot, dtype=torch.float32, **split)
    return _alone_and_stacked(task, Network.from_topology("ring", 10), algorithm, replicas, rounds, lot, 0.5)


def per_round_linear(algorithm: str, replicas: int, rounds: int) -> tuple[float, float]:
    """:func:`_alone_and_stacked` for logistic regression on a9a (20 agents, ER(0.3), lots of 64, the closed-form
    clipped sum): a model small enough that one access is mostly per-call work."""
    from privdl.network import Network
    from privdl.tasks import make_task

    task = make_task("logistic", 20, dataset="a9a", batch_size=64)
    return _alone_and_stacked(task, Network.from_topology("erdos_renyi", 20, p=0.3, seed=0), algorithm, replicas,
                              rounds, 64, 0.1)


def matmul_gflops(threads: int = 2, size: int = 2048) -> float:
    """The cores' reachable FLOP/s: a large float32 matrix product on ``threads`` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-src", required=True, help="src folder of a checkout whose runner does not stack DP-SGD")
    ap.add_argument("--cell", default="dpdl", choices=["dpdl", "table1"])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dataset", default="mnist_t10k")
    ap.add_argument("--json", default=None)
    ap.add_argument("--per-round", action="store_true", help="only the engine's loop: R runs one at a time against "
                    "the same R stacked (DP-DSGD R = 6, DPDL R = 3), in this process")
    args = ap.parse_args()
    if args.per_round:
        for algorithm, reps in (("dsgt", 12), ("dpdl", 12)):
            alone, stacked = per_round_linear(algorithm, reps, 200)
            print(f"a9a logistic, 20 agents ER(0.3), {algorithm}: {reps} runs one at a time {1e3 * alone:.1f} ms per "
                  f"round of all, stacked {1e3 * stacked:.1f} ms: {alone / stacked:.2f}x")
        for algorithm, reps in (("dsgd", 6), ("dpdl", 3)):
            alone, stacked = per_round(algorithm, reps, args.rounds, args.dataset)
            print(f"{algorithm}: {reps} runs one at a time {1e3 * alone:.0f} ms per round of all, stacked "
                  f"{1e3 * stacked:.0f} ms: {alone / stacked:.2f}x")
        # seed 004's Table 1 configuration: Fashion-MNIST, one class per agent, lots of 256; the 4 graphs of a cell
        alone, stacked = per_round("dsgd", 4, max(5, args.rounds // 3), "fashion_mnist", lot=256,
                                   split={"partition": "a_t", "t": 1.0})
        print(f"table1 (Fashion-MNIST, lots of 256), dsgd: 4 runs one at a time {1e3 * alone:.0f} ms per round of "
              f"all, stacked {1e3 * stacked:.0f} ms: {alone / stacked:.2f}x")
        return
    variants = {"stacked (this checkout)": str(ROOT / "src"), "old (one DP-SGD run at a time)": args.old_src}
    best: dict[str, tuple[float, int, list[dict]]] = {}
    for _ in range(args.repeats):
        for name, src in variants.items():
            res = once(src, args.cell, args.rounds, args.dataset)
            if name not in best or res[0] < best[name][0]:
                best[name] = res
    flops, sizes = flops_of_one_round(args.cell, args.dataset)
    old = best["old (one DP-SGD run at a time)"][0]
    print(f"{args.cell} cell, {args.rounds} rounds, --jobs 2, best of {args.repeats}, {os.cpu_count()} cores")
    report = {"cell": args.cell, "rounds": args.rounds, "variants": {}}
    loops = {name: loop_seconds(mans) for name, (_, _, mans) in best.items()}
    old_loop = loops["old (one DP-SGD run at a time)"]
    for name, (wall, rss, mans) in best.items():
        stacks = sorted({m["batch"]["replicas"] for m in mans})
        print(f"  {name:32s} {wall:8.1f} s  ({old / wall:4.2f}x)  runs {len(mans)}, batch sizes {stacks}, "
              f"peak RSS {rss / 1024:.0f} MB; rounds + evaluations {loops[name]:.1f} process-s "
              f"({old_loop / loops[name]:4.2f}x)")
        report["variants"][name] = {"seconds": wall, "speedup": old / wall, "runs": len(mans),
                                    "batch_sizes": stacks, "peak_rss_mb": rss / 1024, "loop_seconds": loops[name],
                                    "loop_speedup": old_loop / loops[name]}
    if flops == flops:
        wall = best["stacked (this checkout)"][0]
        print(f"  one round of the cell: {flops / 1e9:.2f} GFLOP (batches of {sizes}); stacked: "
              f"{flops * args.rounds / wall / 1e9:.2f} GFLOP/s achieved over the whole run (evaluation and start-up "
              "included)")
        peak = matmul_gflops()
        print(f"  the cores' reachable rate (float32 2048² matrix product, 2 threads): {peak:.1f} GFLOP/s")
        report.update(gflop_per_round=flops / 1e9, batch_sizes=sizes,
                      achieved_gflops=flops * args.rounds / wall / 1e9, matmul_gflops=peak)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
