"""Benchmark: the gradient side of one held-frame round alone (issue 44) — ``GradientOracle.__call__`` of process 0
of bench_anchor.py's privdl D-SGD (K = 2, n = 4, the held frame, mechanism ``none``), with no Comm around it.

Builds the oracle exactly as ``run_slice`` does for that process (its HeldTask, held keys, the mechanism bound to
them), then calls it ``--rounds`` times on models that follow x ← x − η·g: the keyed sampling, the task's gather
and gradient, the budget count. Prints the median call, the best median of 100 consecutive calls and a hash of the
final models (equal hashes: the same draws and gradients, bit for bit — compare two checkouts with it).

    PYTHONPATH=src python benchmarks/bench_oracle.py [--dims 15,985] [--rounds 3000]

Old against new, interleaved: run it alternately with PYTHONPATH pointing at each checkout's src/.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def one(d: int, rounds: int) -> None:
    import torch

    from bench_anchor import ETA, MODELS, held_config
    from privdl.experiment.build import build
    from privdl.keys import HeldKeys, Keys, RootKeys
    from privdl.mechanisms.base import MechanismEnv
    from privdl.runtime.worker import placements_for
    from privdl.simulator.access import GradientOracle
    from privdl.tasks.held import HeldTask

    torch.set_num_threads(1)
    task, dataset, hidden = MODELS[d]
    cfg = held_config(d, rounds)
    c = build(cfg)
    p = placements_for(cfg, 4, 2)[0]
    keys = Keys(HeldKeys(RootKeys(0), p.held), 4)
    c.mechanism.bind(MechanismEnv(keys))
    oracle = GradientOracle(HeldTask(c.task, p), c.mechanism, keys, gradient=cfg["gradient"], placement=p,
                            held_rows=True, frame="held")
    x = c.task.init_params(keys.generator("init")).expand(len(p.agents), -1).clone().to(c.task.dtype)
    times = []
    for t in range(1, rounds + 1):
        oracle.t = t
        t0 = time.perf_counter()
        g = oracle(x)
        times.append(time.perf_counter() - t0)
        x = x - ETA * g
    blocks = [statistics.median(times[i:i + 100]) for i in range(0, len(times) - 99, 100)]
    print(f"d = {d}: oracle median {1e6 * statistics.median(times):.1f} us, best median of 100 calls "
          f"{1e6 * min(blocks):.1f} us, models {hashlib.sha256(x.numpy().tobytes()).hexdigest()[:12]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="15,985")
    ap.add_argument("--rounds", type=int, default=3000)
    args = ap.parse_args()
    for d in (int(v) for v in args.dims.split(",")):
        one(d, args.rounds)


if __name__ == "__main__":
    main()
