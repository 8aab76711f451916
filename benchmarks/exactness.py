"""Exactness on any x86-64 CPU (issue 29): the tests that assert bit-for-bit equality, run under every ATen CPU
capability this processor has, and fingerprints of what stays the same across capabilities and thread counts.

ATen compiles its CPU kernels once per capability (``default``, ``avx2``, ``avx512``) and picks the highest the
processor has; ``ATEN_CPU_CAPABILITY`` forces a lower one. The kernels of different capabilities round differently
(other vector widths, other remainders, other FMA use), so a test may assert bit-for-bit equality only between
computations that do the same operations in the same order whatever the capability (docs/ARCHITECTURE.md, "What is
bit-exact"). The tests marked ``exact`` are those; this script runs them under each capability (all must pass) and
then prints, per capability and thread count, a fingerprint (sha256) of the keyed draws, of a model's default
initialisation and of three short runs, so that what holds across machines is measured, not assumed.

NumPy and SciPy each bundle an OpenBLAS built for every x86-64 core type (DYNAMIC_ARCH) that picks the best kernels
the processor has; ``OPENBLAS_CORETYPE`` forces others (issue 43: on AVX-512 machines numpy picks ``SkylakeX``, whose
kernels once led the covariance solver to another optimum of a singular W's problem (P)). The script therefore also
runs the ``exact`` tests under every OpenBLAS core type the CPU can run (at ATen's own capability), and solves the
Whisper covariance design of a few networks — singular ones, whose design is the tie-break of
privdl.covariance.dual, and a non-singular one — under each core type, reporting λ_max(R), the relative difference
‖ΔR‖_F/‖R‖_F to the first core type and whether it is within the solution's own bound κ·(δ₁ + δ₂) (all must be).

    python benchmarks/exactness.py                      # every capability and core type: tests, designs, fingerprints
    python benchmarks/exactness.py --capability avx2 --skip-tests
    python benchmarks/exactness.py --coretype SkylakeX Haswell --skip-tests     # the designs under these core types
    python benchmarks/exactness.py --fingerprint        # (internal) this process's fingerprints as JSON
    python benchmarks/exactness.py --design             # (internal) this process's designs as JSON

On a processor without AVX-512 the ``avx512`` column (and the SkylakeX core types) are absent (neither library can run
those kernels there); the tests' exactness then rests on their construction, which each explains.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: ATen's capabilities, lowest first, with the CPU flags each needs (aten/src/ATen/native/DispatchStub.cpp)
CAPABILITIES = {"default": set(), "avx2": {"avx2", "fma"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}
THREADS = (1, 2)
_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
#: OpenBLAS's x86-64 core types (``OPENBLAS_CORETYPE``, oldest first) with the CPU flags their kernels need
#: (OpenBLAS driver/others/dynamic.c); a forced core type the build lacks falls back to another, which the table shows
OPENBLAS_CORETYPES = {"Prescott": {"pni"}, "Core2": {"ssse3"}, "Nehalem": {"sse4_2"}, "Sandybridge": {"avx"},
                      "Haswell": {"avx2", "fma"}, "Zen": {"avx2", "fma"}, "SkylakeX": _AVX512,
                      "Cooperlake": _AVX512 | {"avx512_bf16"},
                      "SapphireRapids": _AVX512 | {"avx512_bf16", "avx512_fp16"}}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def available() -> list[str]:
    flags = cpu_flags()
    return [name for name, need in CAPABILITIES.items() if need <= flags]


def openblas_available() -> list[str]:
    """The OpenBLAS core types whose kernels this CPU can run."""
    flags = cpu_flags()
    return [name for name, need in OPENBLAS_CORETYPES.items() if need <= flags]


def _env(capability: str | None, threads: int | None = None, coretype: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    if threads is not None:
        env["PRIVDL_EXACTNESS_THREADS"] = str(threads)
    return env


def blas_kernels() -> dict[str, str]:
    """The kernels NumPy's and SciPy's OpenBLAS picked in this process (threadpoolctl's ``architecture``)."""
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401  (loads SciPy's own OpenBLAS)
    from threadpoolctl import threadpool_info

    out = {}
    for lib in threadpool_info():
        if lib.get("internal_api") == "openblas":
            who = "scipy" if "scipy_openblas" in lib["filepath"] and "numpy" not in lib["filepath"] else "numpy"
            out[who] = str(lib.get("architecture"))
    return out


def effective(capability: str) -> str:
    """The capability torch reports when asked for ``capability`` (a forced value above the CPU's is ignored)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=_env(capability), capture_output=True, text=True, check=True)
    return out.stdout.strip()


def run_tests(capability: str | None, coretype: str | None = None) -> tuple[bool, str, float]:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-m", "exact", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=_env(capability, coretype=coretype), capture_output=True, text=True)
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    failed = [ln.removeprefix("FAILED ").split(" - ")[0] for ln in lines if ln.startswith("FAILED ")]
    summary = (lines[-1:] or [res.stderr.strip()[-200:]])[0] + (f" ({'; '.join(failed)})" if failed else "")
    return res.returncode == 0, summary, time.perf_counter() - start


# ---- fingerprints (run in a child process per capability and thread count) -------------------------------------------
def _sha(t) -> str:
    import numpy as np
    import torch

    a = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
    return hashlib.sha256(a.tobytes()).hexdigest()[:12]


def fingerprints() -> dict[str, str]:
    import numpy as np
    import torch

    torch.set_num_threads(int(os.environ.get("PRIVDL_EXACTNESS_THREADS", "1")))
    from privdl.algorithms import make_algorithm
    from privdl.keys import fold, normal, uniform
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network
    from privdl.schedules import make_schedule
    from privdl.simulator import simulate
    from privdl.tasks import make_task

    keys = fold(np.arange(500, dtype=np.uint64) * np.uint64(7919), 3)
    out = {
        "keyed uniforms (500 × 1000)": _sha(uniform(keys, 1000)),
        "keyed normals, Φ⁻¹ (500 × 1000)": _sha(normal(keys, 1000)),
        "keyed normals, Philox (8 × 5000)": _sha(normal(keys[:8], 5000)),
        "MLP default init (torch's layer init)": _sha(make_task("mlp", 2, dataset="digits", hidden=32).init_params(
            torch.Generator().manual_seed(0))),
    }
    net = Network.from_topology("erdos_renyi", 6, p=0.5, seed=1)
    logistic = make_task("logistic", 6, dataset="breast_cancer", partition="dirichlet", alpha=1.0, batch_size=8)
    mech = make_mechanism("gaussian_ldp", steps=60, network=net, clip=0.5, epsilon=5.0, delta=1e-5)
    out["run: logistic D-SGD + LDP, 60 rounds"] = _sha(simulate(
        task=logistic, network=net, algorithm=make_algorithm("dsgd"), mechanism=mech, iterations=60, seed=7,
        schedule=make_schedule("constant", eta=0.1, iterations=60), metrics=False).final)
    quad = make_task("quadratic", 6)
    dsgt = make_algorithm("dsgt")
    decor = make_mechanism("decor", steps=dsgt.accesses(100, net.edges), network=net, clip=5.0, epsilon=20.0)
    out["run: quadratic DSGT + DECOR, 100 rounds"] = _sha(simulate(
        task=quad, network=net, algorithm=dsgt, mechanism=decor, iterations=100, seed=3,
        schedule=make_schedule("inv_sqrt", eta=0.02, iterations=100), metrics=False).final)
    cnn = make_task("cnn", 3, dataset="digits", kernel=3, filters=2, width=8, dtype=torch.float64)
    ring = Network.from_topology("ring", 3)
    dp = make_mechanism("dp_sgd", steps=5, task=cnn, clip=1.0, lot_size=16, noise_multiplier=1.0, network=ring)
    out["run: CNN DP-DSGD (ghost clipping), 5 rounds"] = _sha(simulate(
        task=cnn, network=ring, algorithm=make_algorithm("dsgd"), mechanism=dp, iterations=5, seed=3,
        schedule=make_schedule("constant", eta=0.05, iterations=5), metrics=False).final)
    return out


# ---- the Whisper design under each OpenBLAS core type (a child process per core type) ----------------------------
def design_networks() -> dict[str, object]:
    """Networks whose Whisper design is compared across core types: the issue's ER(6, 0.6, seed 3) (singular; its agent
    4 has a slack constraint), an ER(20, 0.8) draw with two such agents, the complete graph (no minimiser: the
    tie-break's ~1/(τb) variance on null(W)), the star, and a non-singular ER(20, 0.3)."""
    from privdl.network import Network

    return {"ER(6, 0.6, seed 3)": Network.from_topology("erdos_renyi", 6, p=0.6, seed=3).W,
            "ER(20, 0.8, seed 24)": Network.from_topology("erdos_renyi", 20, p=0.8, seed=24).W,
            "complete(12)": Network.from_topology("complete", 12, mixing="uniform").W,
            "star(15)": Network.from_topology("star", 15).W,
            "ER(20, 0.3, seed 0)": Network.from_topology("erdos_renyi", 20, p=0.3, seed=0).W}


def designs() -> dict[str, object]:
    """This process's designs (at b = 1) and the kernels its OpenBLAS libraries picked, as JSON-ready data."""
    import numpy as np

    from privdl.covariance.dual import solve_dual

    out: dict[str, object] = {"blas": blas_kernels(), "designs": {}}
    for name, w in design_networks().items():
        t0 = time.perf_counter()
        sol = solve_dual(w)
        out["designs"][name] = {  # type: ignore[index]
            "R": sol.R.tolist(), "lambda_max": float(np.linalg.eigvalsh(sol.R)[-1]), "objective": sol.primal,
            "singular": sol.singular, "stationarity": sol.stationarity, "condition": sol.tie_condition,
            "relative_gap": sol.gap / sol.primal, "seconds": time.perf_counter() - t0}
    return out


def design_table(coretypes: list[str]) -> tuple[list[str], bool]:
    """The designs under each core type against the first: (markdown lines, whether every difference is within the
    solutions' bound κ·(δ₁ + δ₂) — a non-singular design: within 1e-6, its solver's tolerance)."""
    import numpy as np

    runs = []
    for ct in coretypes:
        res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--design"], env=_env(None, coretype=ct),
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(res.stdout))
    head = ["| network | " + " | ".join(f"{ct} (numpy {r['blas'].get('numpy')}, scipy {r['blas'].get('scipy')})"
                                         for ct, r in zip(coretypes, runs)) + " | within the bound |",
            "|---|" + "---|" * len(coretypes) + "---|"]
    lines, ok = [], True
    for name, ref in runs[0]["designs"].items():
        r0 = np.asarray(ref["R"])
        cells, worst_ratio = [], 0.0
        for run in runs:
            d = run["designs"][name]
            diff = float(np.linalg.norm(np.asarray(d["R"]) - r0) / np.linalg.norm(r0))
            allowed = (d["condition"] * (d["stationarity"] + ref["stationarity"]) + 1e-13 if d["singular"]
                       else 1e-6)
            worst_ratio = max(worst_ratio, diff / allowed)
            cells.append(f"λ_max {d['lambda_max']:.10g}, ΔR {diff:.1e}, {d['seconds'] * 1e3:.0f} ms")
        ok &= worst_ratio <= 1.0
        lines.append(f"| {name}{' (singular)' if ref['singular'] else ''} | " + " | ".join(cells) +
                     f" | {'yes' if worst_ratio <= 1.0 else 'NO'} ({worst_ratio:.1e} of it) |")
    return head + lines, ok


def fingerprint_table(capabilities: list[str]) -> list[str]:
    columns, prints = [], []
    for cap in capabilities:
        for threads in THREADS:
            res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--fingerprint"],
                                 env=_env(cap, threads), capture_output=True, text=True, check=True)
            columns.append(f"{cap}, {threads} thr")
            prints.append(json.loads(res.stdout))
    lines = ["| what | " + " | ".join(columns) + " | the same in every column |",
             "|---|" + "---|" * len(columns) + "---|"]
    for what in prints[0]:
        values = [p[what] for p in prints]
        same = "yes" if len(set(values)) == 1 else "no"
        lines.append(f"| {what} | " + " | ".join(values) + f" | {same} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capability", nargs="+", choices=list(CAPABILITIES), help="default: every one the CPU has")
    ap.add_argument("--coretype", nargs="+", choices=list(OPENBLAS_CORETYPES),
                    help="OpenBLAS core types (default: every one the CPU can run)")
    ap.add_argument("--skip-tests", action="store_true", help="only the designs and fingerprints")
    ap.add_argument("--skip-designs", action="store_true", help="no design table")
    ap.add_argument("--fingerprint", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--design", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fingerprint:
        print(json.dumps(fingerprints()))
        return
    if args.design:
        print(json.dumps(designs()))
        return
    caps = args.capability or available()
    missing = [c for c in caps if c not in available()]
    if missing:
        sys.exit(f"error: this CPU cannot run ATen's {', '.join(missing)} kernels (flags {sorted(cpu_flags())})")
    coretypes = args.coretype or openblas_available()
    missing = [c for c in coretypes if c not in openblas_available()]
    if missing:
        sys.exit(f"error: this CPU cannot run OpenBLAS's {', '.join(missing)} kernels (flags {sorted(cpu_flags())})")
    import torch

    print(f"torch {torch.__version__}; CPU capabilities here: {', '.join(available())} "
          f"(torch picks {effective(available()[-1])}); OpenBLAS core types here: {', '.join(openblas_available())} "
          f"(picked: {blas_kernels()})\n")
    failed = False
    if not args.skip_tests:
        print("| ATEN_CPU_CAPABILITY | OPENBLAS_CORETYPE | torch reports | `pytest -m exact` | seconds |")
        print("|---|---|---|---|---|")
        for cap in caps:
            ok, summary, seconds = run_tests(cap)
            failed |= not ok
            print(f"| {cap} | (default) | {effective(cap)} | {summary} | {seconds:.0f} |", flush=True)
        for ct in coretypes:  # at ATen's own capability
            ok, summary, seconds = run_tests(None, ct)
            failed |= not ok
            print(f"| (default) | {ct} | {effective(available()[-1])} | {summary} | {seconds:.0f} |", flush=True)
        print()
    if not args.skip_designs:
        lines, ok = design_table(coretypes)
        failed |= not ok
        print("Whisper designs (b = 1) under each OpenBLAS core type: λ_max(R), ‖ΔR‖_F/‖R‖_F against the first column "
              "and the solve's time; the bound is κ·(δ₁ + δ₂) for a singular W (privdl.covariance.dual), 1e-6 else.\n")
        print("\n".join(lines))
        print()
    print("\n".join(fingerprint_table(caps)))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
