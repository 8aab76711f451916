"""W and R designed together (issue 46, item 3): what ``--optimize-mixing`` buys on seed 001's settings.

    python benchmarks/bench_joint_mixing.py [--ps 0.2 0.4 0.5 0.6 0.8 1.0] [--seeds 0 1 2] [--n 20] [--json FILE]
    python benchmarks/bench_joint_mixing.py --timing [--n 200] [--ps 0.05 0.2]
    python benchmarks/bench_joint_mixing.py --runs [--ps 0.2 0.5] [--seeds 0 1 2] [--epsilon 10] [--iterations 5000]

Seed 001's quadratic and logistic (a9a) reproductions share the network: n = 20, ER(p) with the graph seed = the run
seed, Metropolis–Hastings weights (src/privdl/reproductions/configs/quadratic.toml, a9a_epsilon.toml), so (P)'s
objective Tr(W R Wᵀ) — the privacy noise one D-SGD step adds (seed 001, Theorem 1) — is the same for both tasks. Per
(p, seed), at b = 1 ((P) is homogeneous: every ratio below holds at every ε, δ, C, T):

- ``mh``: Metropolis–Hastings W + the optimal R (today's Whisper);
- ``joint``: ``--optimize-mixing`` (spectral gap ≥ MH's);
- ``fmmc``: the fastest-mixing W of Boyd, Diaconis & Xiao (2004), computed here with cvxpy (reference only) +
  the optimal R for it; and ``joint_mid_gap``: the joint design held at the gap halfway between MH's and FMMC's
  (None where the joint design's phase I did not reach that bound).

Reported: objective, ratio to ``mh``, spectral gap 1 − SLEM, seconds. ``--timing`` times the joint design alone at
larger n. ``--runs``: D-SGD on seed 001's rotated quadratic at equal ε, started at x* as ``privdl reproduce
quadratic_at_optimum`` (from x₀ = 0 every private run ends ≈ 600 away whatever the noise: REPRODUCTION.md, Fig. 3),
paper accountant, η_t = 1e-2/√t, T = 5000: Whisper with MH W against Whisper with ``optimize_mixing = true``, the
final optimality gap per seed and the mean over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def fmmc(w_mh: np.ndarray) -> np.ndarray:
    """Boyd et al. (2004): minimise ‖W − 11ᵀ/n‖₂ over symmetric stochastic W on the graph (cvxpy, Clarabel)."""
    import cvxpy as cp

    from privdl.covariance.joint import EdgeWeights

    e = EdgeWeights(w_mh)
    n = e.n
    x = cp.Variable(e.m)
    lap = np.zeros((e.m, n, n))
    for k, (i, j) in enumerate(zip(e.i, e.j)):
        lap[k, i, i] = lap[k, j, j] = 1.0
        lap[k, i, j] = lap[k, j, i] = -1.0
    w = np.eye(n) - sum(x[k] * lap[k] for k in range(e.m))
    dev = w - np.full((n, n), 1.0 / n)
    cp.Problem(cp.Minimize(cp.sigma_max(dev)), [x >= 0, cp.diag(w) >= 0]).solve(solver="CLARABEL")
    xs = np.clip(x.value, 0.0, None)
    deg = e.degrees(xs)
    xs = xs / np.maximum(1.0, deg.max())  # (rounding: keep W_ii ≥ 0)
    return e.mixing(xs)


def objectives(n: int, ps: list[float], seeds: list[int]) -> list[dict]:
    from privdl.covariance import design_covariance
    from privdl.covariance.joint import design_joint, spectral_gap
    from privdl.errors import ValidationError
    from privdl.network import Network

    rows = []
    for p in ps:
        for seed in seeds:
            net = Network.from_topology("erdos_renyi", n, p=p, seed=seed)
            w = net.dense()
            t = time.perf_counter()
            joint = design_joint(w, 1.0)
            t_joint = time.perf_counter() - t
            row = {"n": n, "p": p, "seed": seed, "mh": joint.objective_fixed_mixing,
                   "gap_mh": joint.spectral_gap_fixed_mixing, "joint": joint.objective, "gap_joint": joint.spectral_gap,
                   "joint_seconds": t_joint, "joint_iterations": joint.outer_iterations}
            try:
                w_f = fmmc(w)
                row["fmmc"] = design_covariance("whisper", w_f, bound=1.0).trace
                row["gap_fmmc"] = spectral_gap(w_f)
                mid = 0.5 * (row["gap_mh"] + row["gap_fmmc"])
                try:
                    row["joint_mid_gap"] = design_joint(w, 1.0, min_spectral_gap=mid).objective
                except ValidationError:  # (phase I did not reach it)
                    row["joint_mid_gap"] = None
            except ImportError:
                pass
            for k in ("joint", "fmmc", "joint_mid_gap"):
                if row.get(k) is not None:
                    row[f"{k}_ratio"] = row[k] / row["mh"]
            print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            rows.append(row)
    return rows


def timing(n: int, ps: list[float]) -> list[dict]:
    from privdl.covariance.joint import design_joint
    from privdl.network import Network

    rows = []
    for p in ps:
        w = Network.from_topology("erdos_renyi", n, p=p, seed=0).dense()
        load = os.getloadavg()[0]
        t = time.perf_counter()
        joint = design_joint(w, 1.0)
        row = {"n": n, "p": p, "edges": int((np.count_nonzero(w) - n) // 2), "seconds": time.perf_counter() - t,
               "load_before": load, "load_after": os.getloadavg()[0], "ratio": joint.objective /
               joint.objective_fixed_mixing, "outer_iterations": joint.outer_iterations}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def runs(ps: list[float], seeds: list[int], epsilon: float, iterations: int) -> list[dict]:
    import privdl

    rows = []
    for p in ps:
        for seed in seeds:
            row = {"p": p, "seed": seed, "epsilon": epsilon}
            for label, extra in (("mh", {}), ("joint", {"optimize_mixing": True})):
                res = privdl.train(task={"name": "quadratic", "start": "optimum"},
                                   network={"topology": "erdos_renyi", "n": 20, "p": p, "seed": seed},
                                   mechanism={"name": "whisper", "epsilon": epsilon, "delta": 1e-5, "clip": 0.1,
                                              "accountant": "paper", **extra},
                                   schedule={"name": "inv_sqrt", "eta": 0.01}, iterations=iterations, seed=seed)
                row[f"{label}_optimality_gap"] = res.final["optimality_gap"]
            print(json.dumps(row), flush=True)
            rows.append(row)
        sel = [r for r in rows if r["p"] == p]
        for label in ("mh", "joint"):
            v = np.array([r[f"{label}_optimality_gap"] for r in sel])
            print(f"p = {p}: {label} mean {v.mean():.4g} ± {v.std(ddof=1) if len(v) > 1 else 0:.2g}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--ps", type=float, nargs="+", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--timing", action="store_true")
    ap.add_argument("--runs", action="store_true")
    ap.add_argument("--epsilon", type=float, default=10.0)
    ap.add_argument("--iterations", type=int, default=5000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.timing:
        out = timing(a.n or 200, a.ps or [0.05, 0.2])
    elif a.runs:
        out = runs(a.ps or [0.2, 0.5], a.seeds, a.epsilon, a.iterations)
    else:
        out = objectives(a.n or 20, a.ps or [0.2, 0.4, 0.5, 0.6, 0.8, 1.0], a.seeds)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
