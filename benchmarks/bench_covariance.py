"""Covariance design speed: our dual solver against the official n-LMI formulation (cvxpy + Clarabel) and the
2n-LMI precision formulation, the cost of generating correlated noise per step, and (issue 32) the dual solver's
Newton method against the original fixed point at large n.

    python benchmarks/bench_covariance.py [--sizes 20 30 100 300 1000 2000] [--reference-max 30] [--json FILE]
                                          [--no-noise] [--hbc-sizes 10 20 30 50]
    python benchmarks/bench_covariance.py --methods newton fixed_point --sizes 1000 2000 5000 [--json FILE]
                                          [--fixed-point-max-n 5000] [--device cuda]
    python benchmarks/bench_covariance.py --singular [--sizes 12 100 400 1000] [--json FILE]

ER(0.5) graphs (seed 0), Metropolis–Hastings weights, b from ε = 10, δ = 1e-5, C = 0.1, T = 5000 (paper accountant).
Reported: seconds per solve (uncached), objective Tr(W R Wᵀ), relative difference to each reference that ran,
relative duality gap and the speed-up. With ``--methods`` each (n, method) runs in a fresh subprocess, so that its
peak resident memory (ru_maxrss, graph construction included) is its own: seconds of the whole
``design_covariance("whisper", W, b)`` (solve, verification, noise split) and of the solve alone, eigendecompositions,
relative gap, max [R⁻¹]_ii / b, and the objective's relative difference between the methods.
With ``--singular`` (issue 43): the singular-W tie-break (P_ρ) of privdl.covariance.dual on the issue's ER(6, 0.6,
seed 3), ER(20, 0.8, seed 24), and per n in ``--sizes`` the complete graph and the first singular ER(n, 0.97) draw:
seconds of the solve (each in a fresh process), SVDs, the stationarity δ, the gap against (P)'s dual, λ_max(R) and
Tr(R) at b = 1.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np
import torch

from privdl.covariance import design_covariance
from privdl.covariance.dual import _CACHE
from privdl.mechanisms.correlated_noise import CorrelatedNoise
from privdl.network import Network
from privdl.privacy.agent_accountant import get_accountant
from privdl.keys import Keys


def bench_solver(sizes: list[int], reference_max: int) -> list[dict]:
    from privdl.covariance.reference import solve_official, solve_precision

    b = _paper_bound()
    rows = []
    for n in sizes:
        w = Network.from_topology("erdos_renyi", n, p=0.5, seed=0).dense("the covariance benchmark")
        _CACHE.clear()
        t0 = time.perf_counter()
        ours = design_covariance("whisper", w, bound=b)  # solve (uncached) + verification + noise factor facts
        seconds = time.perf_counter() - t0
        row = {"n": n, "ours_seconds": seconds, "ours_solve_seconds": ours.extra["solve_seconds_uncached"],
               "iterations": ours.iterations, "trace": ours.trace,
               "relative_gap": ours.extra["relative_duality_gap"], "max_precision_ratio": ours.max_precision_ratio}
        if n <= reference_max:
            for name, fn in (("official", solve_official), ("precision", solve_precision)):
                t0 = time.perf_counter()
                ref = fn(w, b)
                row[f"{name}_seconds"] = time.perf_counter() - t0
                row[f"{name}_trace"] = ref.trace
                row[f"{name}_rel_diff"] = (ours.trace - ref.trace) / ref.trace
                row[f"{name}_violation_before_rescale"] = ref.extra["solver_violation"]
                row[f"speedup_vs_{name}"] = row[f"{name}_seconds"] / seconds
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _paper_bound() -> float:
    return get_accountant("paper").bound(epsilon=10.0, delta=1e-5, clip=0.1, steps=5000)


def solve_once(n: int, method: str, device: str | None) -> dict:
    """One cold ``design_covariance("whisper", W, b, method=...)`` on ER(n, 0.5), seed 0 (run in a subprocess)."""
    torch.set_num_threads(2)
    w = Network.from_topology("erdos_renyi", n, p=0.5, seed=0).dense("the covariance benchmark")
    _CACHE.clear()
    t0 = time.perf_counter()
    d = design_covariance("whisper", w, bound=_paper_bound(), method=method, device=device)
    seconds = time.perf_counter() - t0
    return {"n": n, "method": method, "device": device or "lapack (cpu)", "seconds": seconds,
            "solve_seconds": d.extra["solve_seconds_uncached"], "iterations": d.iterations,
            "relative_gap": d.extra["relative_duality_gap"], "max_precision_ratio": d.max_precision_ratio,
            "trace": d.trace, "singular_W": d.singular,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def bench_methods(sizes: list[int], methods: list[str], fixed_point_max_n: int, device: str | None) -> list[dict]:
    """Newton against the original fixed point, each (n, method) in its own process (clean peak memory)."""
    rows = []
    for n in sizes:
        by_method = {}
        for method in methods:
            if method == "fixed_point" and n > fixed_point_max_n:
                continue
            cmd = [sys.executable, __file__, "--solve-once", str(n), method]
            if device is not None:
                cmd += ["--device", device]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            by_method[method] = row
            rows.append(row)
            print(json.dumps(row), flush=True)
        if len(by_method) == 2:
            new, old = by_method["newton"], by_method["fixed_point"]
            summary = {"n": n, "speedup_total": old["seconds"] / new["seconds"],
                       "speedup_solve": old["solve_seconds"] / new["solve_seconds"],
                       "trace_rel_diff": (new["trace"] - old["trace"]) / old["trace"]}
            rows.append(summary)
            print(json.dumps(summary), flush=True)
    return rows


def _singular_network(name: str):
    """The network a ``--singular`` row names: "er6", "er20", "complete:N" or "er:N" (the first singular ER(N, 0.97)
    draw, seeds 0–49)."""
    if name == "er6":
        return Network.from_topology("erdos_renyi", 6, p=0.6, seed=3).W, "ER(6, 0.6, seed 3)"
    if name == "er20":
        return Network.from_topology("erdos_renyi", 20, p=0.8, seed=24).W, "ER(20, 0.8, seed 24)"
    kind, n = name.split(":")
    if kind == "complete":
        return Network.from_topology("complete", int(n), mixing="uniform").W, f"complete({n})"
    for seed in range(50):
        w = Network.from_topology("erdos_renyi", int(n), p=0.97, seed=seed).W
        mu = np.linalg.eigvalsh(w.T @ w)
        if mu[0] <= 1e-10 * mu[-1]:
            return w, f"ER({n}, 0.97, seed {seed})"
    raise SystemExit(f"no singular ER({n}, 0.97) draw among seeds 0–49")


def singular_once(name: str) -> dict:
    """One cold solve of a singular W's tie-break (run in a subprocess)."""
    from privdl.covariance.dual import solve_dual

    w, label = _singular_network(name)
    t0 = time.perf_counter()
    sol = solve_dual(w)
    seconds = time.perf_counter() - t0
    mu = np.linalg.eigvalsh(sol.R)
    return {"network": label, "n": w.shape[0], "singular": sol.singular, "method": sol.method, "seconds": seconds,
            "svds": sol.iterations, "stationarity": sol.stationarity, "relative_gap": sol.gap / sol.primal,
            "tie_gap_relative": sol.tie_gap / sol.primal, "trace_weight": sol.trace_weight,
            "lambda_max_R": float(mu[-1]), "trace_R": float(mu.sum()), "objective": sol.primal}


def bench_singular(sizes: list[int]) -> list[dict]:
    rows = []
    for name in ["er6", "er20"] + [f"{kind}:{n}" for n in sizes for kind in ("complete", "er")]:
        out = subprocess.run([sys.executable, __file__, "--singular-once", name], check=True, capture_output=True,
                             text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_hbc(sizes: list[int], kinds: list[str], q: int = 1) -> list[dict]:
    """Problem (10) against coalitions of q curious agents (cvxpy + Clarabel), one ER(0.5) graph per n."""
    from privdl.covariance.hbc import solve_hbc
    from privdl.covariance.seeds import seed_groups

    rows = []
    for n in sizes:
        w = Network.from_topology("erdos_renyi", n, p=0.5, seed=0).W
        for kind in kinds:
            d = solve_hbc(w, bound=1.0, groups=seed_groups(kind, w), coalition_size=q, label=kind)
            row = {"n": n, "seeds": kind, "q": q, "m": d.extra["m"], "coalitions": d.extra["coalitions"],
                   "seconds": d.seconds, "trace_over_ldp": d.trace / d.trace_ldp,
                   "worst_coalition_ratio": d.extra["worst_coalition_ratio"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def bench_noise(n: int = 100, d: int = 100_000, steps: int = 3) -> dict:
    torch.set_num_threads(2)
    w = Network.from_topology("erdos_renyi", n, p=0.5, seed=0).W
    design = design_covariance("whisper", w, bound=1.0)
    out = {"n": n, "d": d}
    for generation in ("per_agent", "matmul"):
        noise = CorrelatedNoise(design.sigma_mix2, design.components, n, generation)
        noise.bind(Keys(0, n))
        noise.network(1, d)
        t0 = time.perf_counter()
        for t in range(steps):
            noise.network(t + 2, d)
        out[f"network_{generation}_seconds"] = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for t in range(steps):
        noise.agent(n // 2, t + 2, d)
    out["one_agent_seconds"] = (time.perf_counter() - t0) / steps
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        torch.randn(n, d, generator=g, dtype=torch.float64)
    out["torch_randn_n_by_d_seconds"] = (time.perf_counter() - t0) / steps  # one unkeyed (n, d) draw, for scale
    keys = Keys(0, n)
    t0 = time.perf_counter()
    for t in range(steps):
        keys.normal("noise", t + 2, d)
    out["keyed_own_draws_n_by_d_seconds"] = (time.perf_counter() - t0) / steps  # LDP's draws: one per agent
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 30, 100, 300, 1000, 2000])
    ap.add_argument("--reference-max", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-noise", action="store_true", help="skip the noise-generation benchmark")
    ap.add_argument("--hbc-sizes", type=int, nargs="*", default=[], help="also time problem (10) at these n (q = 1)")
    ap.add_argument("--methods", nargs="+", choices=["newton", "fixed_point"], default=None,
                    help="compare the dual solver's methods at --sizes (each in a fresh process) instead")
    ap.add_argument("--fixed-point-max-n", type=int, default=10**9, help="skip the fixed point above this n")
    ap.add_argument("--device", default=None, help="torch device for the eigendecompositions (default: LAPACK)")
    ap.add_argument("--singular", action="store_true", help="time the singular-W tie-break instead (sizes: 12 100 "
                    "400 1000 unless given)")
    ap.add_argument("--solve-once", nargs=2, metavar=("N", "METHOD"), help=argparse.SUPPRESS)
    ap.add_argument("--singular-once", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.solve_once:
        print(json.dumps(solve_once(int(args.solve_once[0]), args.solve_once[1], args.device)), flush=True)
        return
    if args.singular_once:
        print(json.dumps(singular_once(args.singular_once)), flush=True)
        return
    if args.singular:
        sizes = args.sizes if "--sizes" in sys.argv else [12, 100, 400, 1000]
        result = {"singular": bench_singular(sizes)}
    elif args.methods:
        result = {"methods": bench_methods(args.sizes, args.methods, args.fixed_point_max_n, args.device)}
    else:
        result = {"solver": bench_solver(args.sizes, args.reference_max),
                  "noise": None if args.no_noise else bench_noise(),
                  "hbc": bench_hbc(args.hbc_sizes, ["edges", "neighbourhoods"]) if args.hbc_sizes else None}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
