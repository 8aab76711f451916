"""A run alone and beside busy processes: privdl's thread defaults on a shared machine (issue 29).

Users run several sweeps at once. torch's intra-op threads are an OpenMP pool (libgomp in the CPU wheel) whose idle
threads spin 300 000 times before they sleep. Beside busy processes a spinning thread holds a core that another
thread of the pool needs, and every parallel region waits for a thread the system has descheduled — milliseconds
per call, even for calls on a few hundred numbers (the evaluation's binary cross-entropy enters the pool). privdl
now (1) runs a run on one thread when its largest tensor of a round is below ATen's grain of 32 768 elements
(``privdl.experiment.threads.auto_threads``: no kernel would be split, the pool could only cost) and (2) sets
``GOMP_SPINCOUNT=3000`` when the user set no wait policy (``privdl/process_defaults.py``, set by the ``privdl``
command this benchmark runs): idle threads spin tens of µs, then sleep.

Two workloads through ``privdl run`` (one run each; the run's own seconds from its manifest, and the CPU seconds of
the whole process), each alone and beside ``--busy`` processes that spin on the CPU:

* ``small``: the issue's D-SGD + DECOR, n = 9, T = 6000, logistic regression (breast cancer, bundled), evaluated
  every 100 rounds;
* ``cnn``: DP-DSGD of seed 004's CNN, n = 10, Poisson lots of 64, 40 rounds, on MNIST's 10 000 test digits
  (``--data-dir``, default ``../shared/data``; skipped when absent).

Settings: ``before`` (torch's thread count and libgomp's default spinning: ``OMP_NUM_THREADS`` = cores and
``GOMP_SPINCOUNT=300000``, which also tell privdl that the user chose), ``after`` (nothing set: privdl's defaults),
and two alternatives measured to choose them: ``passive`` (``OMP_WAIT_POLICY=PASSIVE``, torch's thread count) and
``1 thread`` (``OMP_NUM_THREADS=1``).

    python benchmarks/bench_threads.py [--busy 2] [--repeat 3] [--workload small cnn] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRIVDL = Path(sys.executable).with_name("privdl")
CORES = str(os.cpu_count() or 1)

WORKLOADS = {
    "small": """
name = "threads_small"
seeds = [0]
iterations = 6000
eval_every = 100
dtype = "float64"
network = {{ topology = "erdos_renyi", n = 9, p = 0.5, seed = 0 }}
task = {{ name = "logistic", dataset = "breast_cancer", partition = "dirichlet", alpha = 10.0, batch_size = 16 }}
algorithm = {{ name = "dsgd" }}
mechanism = {{ name = "decor", clip = 1.0, epsilon = 10.0, delta = 1e-5 }}
schedule = {{ name = "constant", eta = 0.1 }}
""",
    "cnn": """
name = "threads_cnn"
seeds = [0]
iterations = 40
eval_every = 0
network = {{ topology = "ring", n = 10 }}
task = {{ name = "cnn", dataset = "mnist_t10k", data_dir = "{data_dir}", partition = "iid", batch_size = 64 }}
algorithm = {{ name = "dsgd", form = "cta" }}
mechanism = {{ name = "dp_sgd", clip = 1.0, epsilon = 10.0, delta = 1e-5, lot_size = 64 }}
schedule = {{ name = "constant", eta = 0.05 }}
""",
}
SETTINGS = [
    ("before", {"OMP_NUM_THREADS": CORES, "GOMP_SPINCOUNT": "300000"}),
    ("after", {}),
    ("passive", {"OMP_NUM_THREADS": CORES, "OMP_WAIT_POLICY": "PASSIVE"}),
    ("1 thread", {"OMP_NUM_THREADS": "1"}),
]
#: variables a user may set to choose the pool's behaviour; cleared so that each setting is only its own
CLEARED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def spinners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def one_run(config: Path, out: Path, env: dict[str, str]) -> tuple[float, float]:
    """(run, CPU) seconds of one ``privdl run`` in a fresh folder: the run's own seconds (its manifest: the rounds,
    not the process start) and the CPU time of the whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([str(PRIVDL), "run", str(config), "--out", str(out), "--quiet", "--no-plot"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (manifest,) = out.glob("runs/*/manifest.json")
    return (float(json.loads(manifest.read_text())["seconds"]),
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, default=2, help="spinning processes beside the run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    print(f"{CORES} cores; median of {args.repeat}; run s = the run's own seconds, CPU s = the whole process")
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workload:
            if workload == "cnn" and not (Path(args.data_dir) / "mnist" / "t10k-images-idx3-ubyte.gz").is_file():
                print(f"\n{workload}: skipped (no MNIST test digits under {args.data_dir})")
                continue
            config = Path(tmp) / f"{workload}.toml"
            config.write_text(WORKLOADS[workload].format(data_dir=Path(args.data_dir).resolve()))
            print(f"\n{workload}\n")
            print(f"| setting | alone: run s | alone: CPU s | beside {args.busy} busy: run s | "
                  f"beside {args.busy} busy: CPU s |")
            print("|---|---|---|---|---|")
            results = {}
            for name, env in SETTINGS:
                row = []
                for busy in (0, args.busy):
                    procs = spinners(busy)
                    try:
                        time.sleep(0.5 if busy else 0)
                        samples = [one_run(config, Path(tmp) / f"{workload}-{name}-{busy}-{k}".replace(" ", "_"),
                                           {**base, **env}) for k in range(args.repeat)]
                    finally:
                        for p in procs:
                            p.kill()
                            p.wait()
                    row += [statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)]
                results[name] = row
                print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in row) + " |", flush=True)
            old, new = results["before"], results["after"]
            print(f"\nafter against before: alone {old[0] / new[0]:.2f}× as fast, beside busy processes "
                  f"{old[2] / new[2]:.2f}× as fast ({old[3] / new[3]:.2f}× less CPU)")


if __name__ == "__main__":
    main()
