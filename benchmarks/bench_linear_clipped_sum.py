"""Benchmark: per-example clipping of a linear model (softmax regression 784→10 on MNIST digits, the seed-001 authors'
image model), 20 agents × 128 examples per access, float32.

1. The clipped batch sums alone: the closed form of :meth:`privdl.tasks.supervised.SupervisedTask.clipped_sum`
   against ghost clipping and torch.func per-example gradients on the same batches (checking the sums agree).
2. Whole D-SGD steps with Whisper noise (after one warm-up run): ``clipping = "batch"`` (the paper's text) against
   ``clipping = "per_example"`` (the authors' code) through the closed form and through ghost clipping.

    python benchmarks/bench_linear_clipped_sum.py [--data-dir ../shared/data] [--replicas 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from privdl.gradients import clipped_example_sum, ghost_clipped_sum
from privdl.keys import Draws, Keys
from privdl.tasks import make_task


def best_of(fn, repeats: int) -> tuple[float, torch.Tensor]:
    out = fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--replicas", type=int, default=1, help="stacked replicas (rows = 20 × replicas)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n = 20
    task = make_task("softmax", n, dataset="mnist_t10k", data_dir=args.data_dir, train_size=8000,
                     normalize=[0.1307, 0.3081], partition="dirichlet", batch_size=128, dtype=torch.float32)
    rows = n * args.replicas
    agents = torch.arange(rows) % n
    keys = Keys(0, rows)
    batch, mask = task.sample_subset(Draws(keys, "batch", 1, torch.arange(rows).numpy(), torch.arange(rows).numpy()),
                                     agents, 128)
    x = 0.01 * torch.randn(rows, task.dim, generator=torch.Generator().manual_seed(1))
    clip = 0.1
    paths = {"closed form": lambda: task.clipped_sum(x, batch, mask, clip),
             "ghost clipping": lambda: ghost_clipped_sum(task, x, batch, mask, clip),
             "torch.func vmap": lambda: clipped_example_sum(task, x, batch, mask, clip)}
    res = {k: best_of(f, args.repeats) for k, f in paths.items()}
    ref = res["closed form"][1]
    print(f"{rows} rows × 128 examples, d = {task.dim}, {args.threads} threads, best of {args.repeats}")
    print("| path | ms per access | vs closed form | max rel. diff to closed form |")
    print("|---|---|---|---|")
    base = res["closed form"][0]
    for k, (s, out) in res.items():
        diff = float((out - ref).abs().max() / ref.abs().max())
        print(f"| {k} | {1000 * s:.2f} | {s / base:.1f}× slower | {diff:.1e} |" if k != "closed form" else
              f"| {k} | {1000 * s:.2f} | 1.0× | 0 |")


    steps(task, args.repeats)


def steps(task, iterations: int) -> None:
    from privdl.algorithms import make_algorithm
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network
    from privdl.schedules import make_schedule
    from privdl.simulator import simulate

    net = Network.from_topology("erdos_renyi", task.n, p=0.5, seed=3)
    variants = {"batch clipping (paper's text)": {"clipping": "batch"},
                "per-example, closed form": {"clipping": "per_example", "per_example": "closed_form"},
                "per-example, ghost clipping": {"clipping": "per_example", "per_example": "ghost"}}
    print(f"\nD-SGD + Whisper, {task.n} agents, {iterations} steps after a warm-up run")
    print("| clipping | ms per step | vs batch clipping |")
    print("|---|---|---|")
    base = None
    for label, kw in variants.items():
        best = float("inf")
        for _ in range(2):  # the first run warms up (vmap, hooks); the second is timed
            mech = make_mechanism("whisper", steps=iterations, network=net, task=task, clip=0.1, epsilon=10.0,
                                  accountant="paper", **kw)
            t = time.perf_counter()
            simulate(task=task, algorithm=make_algorithm("dsgd"), mechanism=mech, iterations=iterations,
                     schedule=make_schedule("constant", iterations=iterations, eta=0.1), network=net, seed=4,
                     metrics=False)
            best = min(best, (time.perf_counter() - t) / iterations)
        base = base or best
        print(f"| {label} | {1000 * best:.1f} | {best / base:.2f}× |")


if __name__ == "__main__":
    main()
