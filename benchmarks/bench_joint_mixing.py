"""W and R designed together (issue 46, item 3): what ``--optimize-mixing`` buys on seed 001's settings.

    python benchmarks/bench_joint_mixing.py [--ps 0.2 0.4 0.5 0.6 0.8 1.0] [--seeds 0 1 2] [--n 20] [--json FILE]
    python benchmarks/bench_joint_mixing.py --timing [--n 200] [--ps 0.05 0.2]
    python benchmarks/bench_joint_mixing.py --runs [--ps 0.2 0.5] [--seeds 0 1 2] [--epsilon 10] [--iterations 5000]
    python benchmarks/bench_joint_mixing.py --runs --task logistic [--ps 0.5 0.8] [--seeds 0 ... 9] [--data-dir DIR]

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

``--runs --task logistic``: seed 001's Fig. 4 setting as ``privdl reproduce a9a`` runs it (configs/a9a_epsilon.toml:
a9a's official train/test files, Dirichlet(10) over n = 20 agents, batch 128, L2 1e-4, C = 0.1, δ = 1e-5, paper
accountant, constant η, T = 5000, graph seed = run seed), Whisper with three W at the same ε: MH + optimal R,
the fastest-mixing W + optimal R (FMMC, cvxpy), and ``optimize_mixing = true``. As the reproduction, η is tuned per
(W, p) over seed 001's grid on the separate seed 100 (lowest final test loss), then seeds ``--seeds`` run at it.
Every run at a seed shares its keys (mini-batches, noise seeds) whatever W: the differences are paired. Reported
per seed: test loss, test accuracy, train loss; per p: means ± standard errors and the paired differences. Runs in
float64 through ``privdl.train`` (the reproduction's config says float32: the same numbers to ~1e-5 at seed 0).
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


#: seed 001's step-size grid (SPEC §3, ``privdl reproduce a9a``) and its tuning seed
ETAS = [0.1, 0.05, 0.01, 0.005, 0.001]
TUNE_SEED = 100
LOGISTIC_DESIGNS = ("mh", "fmmc", "joint")


def _logistic_run(design: str, p: float, seed: int, eta: float, epsilon: float, iterations: int,
                  data_dir: str | None) -> dict:
    """One Whisper run of seed 001's a9a setting with the W of ``design``; its final metrics and W's facts."""
    import privdl
    from privdl.covariance.joint import spectral_gap
    from privdl.network import Network

    task = {"name": "logistic", "dataset": "a9a", "partition": "dirichlet", "alpha": 10.0, "batch_size": 128,
            "l2": 1e-4, "seed": 0, **({"data_dir": data_dir} if data_dir else {})}
    mech = {"name": "whisper", "epsilon": epsilon, "delta": 1e-5, "clip": 0.1, "accountant": "paper"}
    net_table = {"topology": "erdos_renyi", "n": 20, "p": p, "seed": seed}
    if design == "fmmc":
        network = Network.from_matrix(fmmc(Network.from_topology("erdos_renyi", 20, p=p, seed=seed).dense()),
                                      description=f"FMMC on ER(20, {p}, {seed})")
    else:
        network = net_table
        if design == "joint":
            mech["optimize_mixing"] = True
    t = time.perf_counter()
    res = privdl.train(task=task, network=network, mechanism=mech, schedule={"name": "constant", "eta": eta},
                       iterations=iterations, seed=seed, threads=1)
    row = {"design": design, "p": p, "seed": seed, "eta": eta, "epsilon": epsilon, "seconds": time.perf_counter() - t,
           **{k: res.final[k] for k in ("test_loss", "test_accuracy", "train_loss")}}
    if design == "fmmc":
        row["spectral_gap"] = spectral_gap(network.dense())
    return row


def _mean_se(v: list[float]) -> tuple[float, float]:
    a = np.asarray(v, dtype=float)
    return float(a.mean()), float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else 0.0


def logistic_runs(ps: list[float], seeds: list[int], epsilon: float, iterations: int, etas: list[float],
                  data_dir: str | None, designs: tuple[str, ...] = LOGISTIC_DESIGNS) -> list[dict]:
    """Tune η per (W, p) on seed 100, then run every seed with each W of ``designs`` at its η (module docstring);
    a single η in ``etas`` is used as given, without the tuning runs."""
    from privdl.data.datasets import load_dataset
    from privdl.errors import DataError

    try:
        load_dataset("a9a", data_dir=data_dir)
    except DataError as exc:
        raise SystemExit(f"bench_joint_mixing --task logistic needs the a9a files (LIBSVM binary/a9a and a9a.t, see "
                         f"shared/data/SOURCES.md); give --data-dir DIR or set PRIVDL_DATA_DIR.\n{exc}") from None
    rows: list[dict] = []
    for p in ps:
        best: dict[str, float] = {d: etas[0] for d in designs} if len(etas) == 1 else {}
        for design in (designs if len(etas) > 1 else ()):  # (one η given: no tuning)
            tuned = []
            for eta in etas:
                r = _logistic_run(design, p, TUNE_SEED, eta, epsilon, iterations, data_dir)
                print(json.dumps(dict(r, tuning=True)), flush=True)
                rows.append(dict(r, tuning=True))
                tuned.append(r)
            best[design] = min(tuned, key=lambda r: (not np.isfinite(r["test_loss"]), r["test_loss"]))["eta"]
        how = f"tuned on seed {TUNE_SEED}" if len(etas) > 1 else "given"
        print(f"p = {p}: eta {best} ({how})", flush=True)
        final = []
        for seed in seeds:
            for design in designs:
                r = _logistic_run(design, p, seed, best[design], epsilon, iterations, data_dir)
                print(json.dumps(r), flush=True)
                final.append(r)
        rows += final
        by = {d: {r["seed"]: r for r in final if r["design"] == d} for d in designs}
        for metric in ("test_loss", "test_accuracy", "train_loss"):
            for d in designs:
                m, se = _mean_se([by[d][s][metric] for s in seeds])
                print(f"p = {p} {metric} {d} (eta {best[d]}): {m:.4f} ± {se:.4f} (se, {len(seeds)} seeds)", flush=True)
            for a, b in [(a, b) for a, b in (("joint", "mh"), ("joint", "fmmc"), ("fmmc", "mh"))
                         if a in designs and b in designs]:
                diff = [by[a][s][metric] - by[b][s][metric] for s in seeds]
                m, se = _mean_se(diff)
                print(f"p = {p} {metric} {a} − {b}: {m:+.4f} ± {se:.4f} (paired se; {sum(x < 0 for x in diff)} of "
                      f"{len(seeds)} seeds lower)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--ps", type=float, nargs="+", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--timing", action="store_true")
    ap.add_argument("--runs", action="store_true")
    ap.add_argument("--task", choices=["quadratic", "logistic"], default="quadratic",
                    help="with --runs: seed 001's rotated quadratic (default) or its a9a logistic regression")
    ap.add_argument("--etas", type=float, nargs="+", default=ETAS,
                    help="--task logistic: the step sizes tuned over (one: every W runs at it, no tuning)")
    ap.add_argument("--data-dir", default=None, help="--task logistic: the folder holding a9a/ (a9a, a9a.t)")
    ap.add_argument("--designs", nargs="+", choices=LOGISTIC_DESIGNS, default=list(LOGISTIC_DESIGNS),
                    help="--task logistic: the W to run (mh, fmmc, joint)")
    ap.add_argument("--epsilon", type=float, default=10.0)
    ap.add_argument("--iterations", type=int, default=5000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.timing:
        out = timing(a.n or 200, a.ps or [0.05, 0.2])
    elif a.runs and a.task == "logistic":
        out = logistic_runs(a.ps or [0.5, 0.8], a.seeds, a.epsilon, a.iterations, a.etas, a.data_dir,
                            tuple(a.designs))
    elif a.runs:
        out = runs(a.ps or [0.2, 0.5], a.seeds, a.epsilon, a.iterations)
    else:
        out = objectives(a.n or 20, a.ps or [0.2, 0.4, 0.5, 0.6, 0.8, 1.0], a.seeds)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
