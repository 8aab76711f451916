"""Benchmark: DP-SGD's clipped lot sums (per-example gradients, clip, sum) for n agents at once, seed 004's small
CNN on Fashion-MNIST (28×28), lot 256 per agent, float32.

Compares, in one process on the same lots: privdl's ghost clipping (the per-layer registry), the same with torch's
Mish kernels, max-pool or both in place of privdl's layers (``privdl.tasks.layers``), privdl's torch.func
(vmap) path, and Opacus' GradSampleModule (one module per agent, as the authors' code does), checking that all give
the same sums. The paths' repeats are interleaved (best of ``--repeats`` each), so a noisy machine slows them alike. ``--old-src PATH`` (a checkout of privdl before the per-layer registry, e.g. ``git worktree add
/tmp/old f4c4ef3`` then ``/tmp/old/src``) also times that version's hand-written SmallCNN ghost clipping on the same
lot and parameters, in a subprocess.

    python benchmarks/bench_per_example.py [--agents 10] [--lot 256] [--repeats 5] [--threads 2] [--old-src PATH]
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time

import torch

from privdl.gradients import clipped_example_sum, ghost_clipped_sum
from privdl.keys import Draws, Keys
from privdl.tasks import layers, make_task, models

OLD = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
from privdl.simulator.ghost import ghost_clipped_sum
from privdl.tasks import make_task, models
data = torch.load(sys.argv[1])
task = make_task("cnn", data["n"], dataset="fashion_mnist", partition="a_t", t=1.0, dtype=torch.float32)
run = lambda: ghost_clipped_sum(task, data["x"], data["batch"], data["mask"], data["clip"])
run()
best = float("inf")
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); out = run(); best = min(best, time.perf_counter() - t)
torch.save({"seconds": best, "sums": out}, sys.argv[1] + ".out")
"""


def old_ghost(src, x, batch, mask, clip, n, threads, repeats):
    """Time the pre-registry ghost clipping (a privdl checkout at ``src``) on the same inputs, in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lot.pt")
        torch.save({"x": x, "batch": batch, "mask": mask, "clip": clip, "n": n}, path)
        env = {**os.environ, "PYTHONPATH": src}
        subprocess.run([sys.executable, "-c", OLD, path, str(threads), str(repeats)], check=True, env=env)
        res = torch.load(path + ".out")
    return res["seconds"], res["sums"]


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


def interleaved(fns, repeats):
    """Best time and last result of every function, their repeats taken in turn (after one warm-up call each)."""
    results = [fn() for fn in fns]
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            results[k] = fn()
            best[k] = min(best[k], time.perf_counter() - start)
    return list(zip(best, results))


def with_swapped(fn, *swaps):
    """``fn`` run with attributes swapped: each swap is (module, name, replacement)."""
    def run():
        saved = [(mod, name, getattr(mod, name)) for mod, name, _ in swaps]
        try:
            for mod, name, new in swaps:
                setattr(mod, name, new)
            return fn()
        finally:
            for mod, name, old in saved:
                setattr(mod, name, old)
    return run


TORCH_POOL = (models, "max_pool2d", torch.nn.functional.max_pool2d)
TORCH_MISH = (models, "mish", torch.nn.functional.mish)
# privdl's Mish as it was at commit b1f2aa2: ATen's kernels inside its vmap rule
ATEN_MISH = ((layers, "_mish_values", torch.nn.functional.mish),
             (layers, "_mish_grad_values", torch.ops.aten.mish_backward))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--lot", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--old-src", default=None, help="src/ folder of a privdl checkout before the layer registry")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from opacus import GradSampleModule

    n = args.agents
    task = make_task("cnn", n, dataset="fashion_mnist", partition="a_t", t=1.0, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    x = task.init_params(gen).expand(n, -1).clone() + 0.05 * torch.randn(n, task.dim, generator=gen)
    batch, mask = task.sample_lot(Draws(Keys(0, n), "lot", 1), torch.arange(n), (args.lot / task.counts).double())
    examples = int(mask.sum())
    clip = 1.0
    modules = [GradSampleModule(copy.deepcopy(task.model.module)) for _ in range(n)]
    ghost = lambda: ghost_clipped_sum(task, x, batch, mask, clip)  # noqa: E731
    timings = interleaved([ghost, with_swapped(ghost, *ATEN_MISH), with_swapped(ghost, TORCH_POOL),
                           with_swapped(ghost, *ATEN_MISH, TORCH_POOL), with_swapped(ghost, TORCH_MISH, TORCH_POOL),
                           lambda: clipped_example_sum(task, x, batch, mask, clip, 16),
                           lambda: opacus_clipped_sum(task, x, batch, mask, clip, modules)], args.repeats)
    names = ["privdl ghost clipping (per-layer registry), privdl's layers", "  … with ATen's Mish kernels",
             "  … with torch's max-pool", "  … with both (privdl at b1f2aa2)",
             "  … with torch's Mish and max-pool", "privdl torch.func vmap", "Opacus GradSampleModule (per agent)"]
    rows = [(name, t, s) for name, (t, s) in zip(names, timings)]
    t_op, s_op = timings[-1]
    if args.old_src:
        t_old, s_old = old_ghost(args.old_src, x, batch, mask, clip, n, args.threads, args.repeats)
        rows.insert(1, ("privdl before: hand-written SmallCNN ghost", t_old, s_old))
    scale = float(s_op.abs().max())
    print(f"small CNN (d = {task.dim}), {n} agents, Poisson lots of expected size {args.lot} ({examples} examples "
          f"this draw), clip {clip}, float32, {args.threads} threads, best of {args.repeats}")
    print("| path | seconds per lot sum | examples/s | vs Opacus | max abs diff to Opacus (rel.) |")
    print("|---|---|---|---|---|")
    for name, t, s in rows:
        diff = float((s - s_op).abs().max()) / scale
        print(f"| {name} | {t:.4f} | {examples / t:,.0f} | {t_op / t:.2f}× | {diff:.1e} |")


if __name__ == "__main__":
    main()
