"""Exactness on any x86-64 CPU (issue 29): the tests that assert bit-for-bit equality, run under every ATen CPU
capability this processor has, and fingerprints of what stays the same across capabilities and thread counts.

ATen compiles its CPU kernels once per capability (``default``, ``avx2``, ``avx512``) and picks the highest the
processor has; ``ATEN_CPU_CAPABILITY`` forces a lower one. The kernels of different capabilities round differently
(other vector widths, other remainders, other FMA use), so a test may assert bit-for-bit equality only between
computations that do the same operations in the same order whatever the capability (docs/ARCHITECTURE.md, "What is
bit-exact"). The tests marked ``exact`` are those; this script runs them under each capability (all must pass) and
then prints, per capability and thread count, a fingerprint (sha256) of the keyed draws, of a model's default
initialisation and of three short runs, so that what holds across machines is measured, not assumed.

    python benchmarks/exactness.py                      # every capability the CPU has: tests, then fingerprints
    python benchmarks/exactness.py --capability avx2 --skip-tests
    python benchmarks/exactness.py --fingerprint        # (internal) this process's fingerprints as JSON

On a processor without AVX-512 the ``avx512`` column is absent (ATen cannot run those kernels there); the tests'
exactness then rests on their construction, which each explains.
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


def _env(capability: str, threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    if threads is not None:
        env["PRIVDL_EXACTNESS_THREADS"] = str(threads)
    return env


def effective(capability: str) -> str:
    """The capability torch reports when asked for ``capability`` (a forced value above the CPU's is ignored)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=_env(capability), capture_output=True, text=True, check=True)
    return out.stdout.strip()


def run_tests(capability: str) -> tuple[bool, str, float]:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-m", "exact", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=_env(capability), capture_output=True, text=True)
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
    ap.add_argument("--skip-tests", action="store_true", help="only the fingerprints")
    ap.add_argument("--fingerprint", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fingerprint:
        print(json.dumps(fingerprints()))
        return
    caps = args.capability or available()
    missing = [c for c in caps if c not in available()]
    if missing:
        sys.exit(f"error: this CPU cannot run ATen's {', '.join(missing)} kernels (flags {sorted(cpu_flags())})")
    import torch

    print(f"torch {torch.__version__}; CPU capabilities here: {', '.join(available())} "
          f"(torch picks {effective(available()[-1])})\n")
    failed = False
    if not args.skip_tests:
        print("| ATEN_CPU_CAPABILITY | torch reports | `pytest -m exact` | seconds |")
        print("|---|---|---|---|")
        for cap in caps:
            ok, summary, seconds = run_tests(cap)
            failed |= not ok
            print(f"| {cap} | {effective(cap)} | {summary} | {seconds:.0f} |", flush=True)
        print()
    print("\n".join(fingerprint_table(caps)))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
