"""Keyed draws against torch.randn, at the shapes privdl's runs draw per noisy access.

Every noise row of a run is keyed by (purpose, access, agent) (privdl/keys.py): short rows come from the SplitMix64
stream through Φ⁻¹, vectorised over keys; rows of at least ``keys.WIDE`` numbers from numpy's Philox per key on
``torch.get_num_threads()`` threads. The baseline is ``torch.randn`` of the same shape and dtype from one unkeyed
generator (what a simulator without per-agent keys would do); "Φ⁻¹ only" is the keyed path without the Philox rows
(what privdl used for every row before), shown for the wide shapes.

    python benchmarks/bench_keys.py [--repeat 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from privdl import keys

# (what, rows, numbers per row, dtype)
SHAPES = [
    ("quadratic grid: 1680 replicas share 200 own keys, d = 10", 200, 10, torch.float64),
    ("a9a: 48 replicas × 20 agents, d = 124", 960, 124, torch.float64),
    ("seed 004 CNN: 10 agents, d = 28 440", 10, 28_440, torch.float32),
    ("audit softmax: 600 copies, d = 7 850", 600, 7_850, torch.float64),
    ("Fig. 5 MLP: 20 agents, d = 101 770", 20, 101_770, torch.float32),
]


def timed(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, numpy {np.__version__}, {args.threads} threads; best of 3 × {args.repeat}")
    print("| shape | torch.randn (ms) | keyed (ms) | keyed / randn | Φ⁻¹ only (ms) |")
    print("|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for what, rows, d, dtype in SHAPES:
        k = keys.fold(np.arange(rows, dtype=np.uint64) * np.uint64(7919), 3)
        randn = timed(lambda: torch.randn(rows, d, generator=gen, dtype=dtype), args.repeat)
        keyed = timed(lambda: keys.normal(k, d, dtype), args.repeat)
        inverse = (timed(lambda: keys._fill(k, d, dtype, keys.inverse_normal),
                         args.repeat) if d >= keys.WIDE else None)
        print(f"| {what} ({str(dtype).removeprefix('torch.')}) | {1e3 * randn:.2f} | {1e3 * keyed:.2f} | "
              f"{keyed / randn:.2f} | {'—' if inverse is None else f'{1e3 * inverse:.2f}'} |", flush=True)


if __name__ == "__main__":
    main()
