"""Benchmark: DP-SGD's clipped lot sums (per-example gradients, clip, sum) for n agents at once, seed 004's small
CNN on Fashion-MNIST (28×28), lot 256 per agent, float32.

Compares, in one process on the same lots: privdl's ghost clipping, privdl's torch.func (vmap) path, and Opacus'
GradSampleModule (one module per agent, as the authors' code does), checking that all three give the same sums.

    python benchmarks/bench_per_example.py [--agents 10] [--lot 256] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from privdl.simulator.ghost import ghost_clipped_sum
from privdl.simulator.gradients import clipped_example_sum
from privdl.tasks import make_task


def opacus_clipped_sum(task, x, batch, mask, clip, modules):
    """Per-agent GradSampleModule: forward/backward on the agent's lot, per-sample norms, clip, sum."""
    X, y = batch
    out = []
    for i, gsm in enumerate(modules):
        with torch.no_grad():
            for p, v in zip(gsm.parameters(), task.model.split(x[i])):
                p.copy_(v)
        gsm.zero_grad(set_to_none=True)
        keep = mask[i].bool()
        logits = gsm(X[i][keep].reshape(-1, *task.model.input_shape))
        torch.nn.functional.cross_entropy(logits, y[i][keep], reduction="sum").backward()
        gs = [p.grad_sample.reshape(int(keep.sum()), -1) for p in gsm.parameters()]
        norms = torch.sqrt(sum((g * g).sum(1) for g in gs))
        factor = torch.clamp(clip / norms.clamp_min(1e-12), max=1.0)
        out.append(torch.cat([(factor[:, None] * g).sum(0) for g in gs]))
        for p in gsm.parameters():
            p.grad_sample = None
    return torch.stack(out)


def timed(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--lot", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from opacus import GradSampleModule

    n = args.agents
    task = make_task("cnn", n, dataset="fashion_mnist", partition="a_t", t=1.0, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    x = task.init_params(gen).expand(n, -1).clone() + 0.05 * torch.randn(n, task.dim, generator=gen)
    batch, mask = task.sample_lot(gen, (args.lot / task.counts).double())
    examples = int(mask.sum())
    clip = 1.0
    modules = [GradSampleModule(copy.deepcopy(task.model.module)) for _ in range(n)]
    t_ghost, s_ghost = timed(lambda: ghost_clipped_sum(task, x, batch, mask, clip), args.repeats)
    t_vmap, s_vmap = timed(lambda: clipped_example_sum(task, x, batch, mask, clip, 16), args.repeats)
    t_op, s_op = timed(lambda: opacus_clipped_sum(task, x, batch, mask, clip, modules), args.repeats)
    scale = float(s_op.abs().max())
    print(f"small CNN (d = {task.dim}), {n} agents, Poisson lots of expected size {args.lot} ({examples} examples "
          f"this draw), clip {clip}, float32, {args.threads} threads, best of {args.repeats}")
    print("| path | seconds per lot sum | examples/s | vs Opacus | max abs diff to Opacus (rel.) |")
    print("|---|---|---|---|---|")
    for name, t, s in (("privdl ghost clipping", t_ghost, s_ghost), ("privdl torch.func vmap", t_vmap, s_vmap),
                       ("Opacus GradSampleModule (per agent)", t_op, s_op)):
        diff = float((s - s_op).abs().max()) / scale
        print(f"| {name} | {t:.4f} | {examples / t:,.0f} | {t_op / t:.2f}× | {diff:.1e} |")


if __name__ == "__main__":
    main()
