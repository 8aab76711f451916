"""Device check: the distributed runtime on a GPU (issue 44, item 7), in one call of a few minutes.

Run it on a machine with a CUDA GPU (one H200 was the target: every process of ``--procs K`` shares it, so gloo
carries the messages through the CPU — pinned buffers, docs/backends.md "On GPUs"):

    python benchmarks/gpu_dist_check.py [--procs 1,2,4] [--rounds 30] [--out FILE]

1. **Results.** A float64 run (logistic regression on the bundled breast-cancer data, Gaussian LDP noise, ring of 8,
   100 rounds) with ``device = "cuda"``: the simulator and ``privdl run --procs K`` for each K, every metric of
   results.csv compared with the CPU simulator's. Tolerance: relative ``RTOL`` = 1e-9 (absolute 1e-12 near 0).
   Why: the draws (lots, noise) come from the CPU's keyed streams on every device, so the runs differ only by the
   rounding of the GPU's kernels (other summation orders: about 1e-16 relative per operation, ~d·1e-16 ≈ 3e-15 per
   round for d = 31); a gradient step with η ≤ 2/L on a convex L-smooth loss, the clipping (a projection) and the
   doubly stochastic mixing do not expand a difference, so it grows at most linearly: ≤ T · 3e-15 ≈ 3e-13 after
   T = 100 rounds, and 1e-9 leaves three orders of magnitude (the metrics are Lipschitz in the models). The script
   prints the largest relative difference it saw; a value near 1e-9 or above is a finding, not noise.
   The same for DPDL with DP-SGD (cross-gradients over the edges: the held frame's per-edge ``pull``/``push`` and
   the owners' lots on the device), which only ``--procs K`` with K ≥ 2 reaches; same tolerance, same argument.
2. **Refusals.** ``runtime.transport = "nccl"`` with 2 processes on one GPU is refused naming the shared GPU
   ("needs one GPU per process"); with 1 process it is refused as not built (NCCL is not built: gloo always).
3. **Speed.** benchmarks/bench_scaling.py's run (seed 004's CNN, DP-SGD, 16 agents on a ring) on the CPU simulator,
   the GPU simulator and ``--procs K`` on the GPU: seconds per round (the manifest's ``seconds`` / T), the slowest
   process's median round and start-up, and each one's ratio to the GPU simulator.

Each step prints one JSON line; the last line says PASS or FAIL (what failed). Without CUDA it says so and exits
with status 2 ("not measured: no device"); ``--device cpu`` runs the same steps on the CPU (a check of the script
itself: the runs there equal the simulator to rounding).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RTOL, ATOL = 1e-9, 1e-12
#: seconds any one privdl command may take before the check calls it failed (the whole check: ≈ 3-5 min on an H200)
LIMIT = 240

CORRECTNESS = """name = "gpu-check"
seeds = [0]
iterations = 100
eval_every = 25
dtype = "float64"
[network]
topology = "ring"
n = 8
sparse = true
[task]
name = "logistic"
dataset = "breast_cancer"
batch_size = 16
[algorithm]
name = "dsgd"
[mechanism]
name = "gaussian_ldp"
clip = 1.0
epsilon = 10.0
delta = 1e-5
[schedule]
eta = 0.05
"""

#: the per-edge check: DPDL's cross-gradients (the held frame's pull / push on the device), DP-SGD lots
PER_EDGE = (CORRECTNESS.replace('name = "dsgd"', 'name = "dpdl"')
            .replace('name = "gaussian_ldp"\nclip = 1.0\nepsilon = 10.0\ndelta = 1e-5',
                     'name = "dp_sgd"\nlot_size = 20\nnoise_multiplier = 1.0')
            .replace('name = "gpu-check"', 'name = "gpu-check-edges"'))


def privdl(config: Path, out: Path, *overrides: str, procs: int | None = None) -> tuple[int, str, float]:
    """``privdl run CONFIG --out OUT --set ...`` [--procs K]: (exit status, its last lines, seconds)."""
    cmd = [sys.executable, "-m", "privdl.cli", "run", str(config), "--out", str(out), "--no-plot", "--quiet"]
    for o in overrides:
        cmd += ["--set", o]
    if procs:
        cmd += ["--procs", str(procs)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT)
        code, text = p.returncode, (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        code, text = 124, f"timed out after {LIMIT} s"
    return code, text, time.perf_counter() - t0


def metrics(folder: Path) -> dict[tuple, float]:
    with open(folder / "results.csv") as fh:
        return {(r["seed"], r["iteration"], r["metric"]): float(r["value"]) for r in csv.DictReader(fh)
                if not r["metric"].startswith("bytes_")}


def largest_difference(got: dict, want: dict) -> tuple[float, str]:
    """The largest |got − want| / max(|want|, ATOL/RTOL) over the metrics, and where; inf if the keys differ."""
    if got.keys() != want.keys():
        return float("inf"), f"metrics differ: {sorted(set(got) ^ set(want))[:4]}"
    worst, where = 0.0, ""
    for k, w in want.items():
        rel = abs(got[k] - w) / max(abs(w), ATOL / RTOL)
        if rel > worst:
            worst, where = rel, f"{k}: {got[k]!r} vs {w!r}"
    return worst, where


def manifest(folder: Path) -> dict:
    return json.loads(next((folder / "runs").rglob("manifest.json")).read_text())


def say(row: dict, out: str | None) -> None:
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of the CNN timing runs")
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a check of this script)")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    import torch

    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"not measured: torch {torch.__version__} sees no CUDA device here (CUDA "
              f"{torch.version.cuda or 'not built in'}); run this on a machine with a GPU", file=sys.stderr)
        return 2
    dev = f'device="{args.device}"'
    procs = [int(k) for k in args.procs.split(",")]
    failed: list[str] = []
    started = time.perf_counter()
    gpu = torch.cuda.get_device_name(0) if args.device != "cpu" else "cpu"
    say({"step": "start", "device": args.device, "gpu": gpu, "gpus": torch.cuda.device_count(),
         "cpus": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda}, args.out)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = tmp / "check.toml"
        cfg.write_text(CORRECTNESS)
        # 1. results against the CPU simulator: D-SGD (simulator and --procs K), then DPDL's per-edge messages in
        # the held frame (--procs K >= 2)
        for label, text_cfg, ks in (("", CORRECTNESS, [None, *procs]),
                                    ("dpdl ", PER_EDGE, [k for k in procs if k >= 2])):
            path = tmp / f"{label.strip() or 'check'}.toml"
            path.write_text(text_cfg)
            code, text, secs = privdl(path, tmp / f"cpu{label.strip()}")
            if code:
                say({"step": f"cpu simulator {label}".strip(), "error": text}, args.out)
                return 1
            want = metrics(tmp / f"cpu{label.strip()}")
            for k in ks:
                name = label + ("simulator" if k is None else f"procs {k}")
                folder = tmp / name.replace(" ", "")
                code, text, secs = privdl(path, folder, dev, procs=k)
                row = {"step": "results", "run": name, "device": args.device, "seconds": round(secs, 1)}
                if code:
                    row["error"] = text
                    failed.append(f"{name}: exit {code}")
                else:
                    worst, where = largest_difference(metrics(folder), want)
                    man = manifest(folder)
                    frame = man.get("placement", {}).get("frame")
                    row.update(max_rel_difference=worst, where=where, rtol=RTOL, frame=frame,
                               ran_on=man.get("device_info", {}).get("device"), within=worst <= RTOL)
                    if worst > RTOL:
                        failed.append(f"{name}: {worst:.3g} > {RTOL:g} ({where})")
                    if label and frame != "held":
                        failed.append(f"{name}: ran in the {frame!r} frame, not the held one")
                say(row, args.out)
        # 2. NCCL: refused with the reason
        if args.device != "cpu":
            for k, expect in ((2, "needs one GPU per process"), (1, "not built yet")):
                if k > 1 and torch.cuda.device_count() >= k:
                    expect = "not built yet"
                code, text, _ = privdl(cfg, tmp / f"nccl{k}", dev, 'runtime.transport="nccl"', procs=k)
                ok = code != 0 and expect in " ".join(text.split())
                say({"step": "nccl refused", "procs": k, "expected": expect, "ok": ok, "said": text[-400:]},
                    args.out)
                if not ok:
                    failed.append(f"nccl --procs {k}: expected {expect!r}")
        # 3. the CNN + DP-SGD strong scaling
        if not args.skip_speed:
            spec = importlib.util.spec_from_file_location("bench_scaling", HERE / "bench_scaling.py")
            scaling = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(scaling)
            cnn = tmp / "cnn.toml"
            cnn.write_text(scaling.CONFIG.format(rounds=args.rounds))
            rows = []
            runs = [("cpu", None)] + ([(args.device, None)] if args.device != "cpu" else [])
            for where, k in runs + [(args.device, k) for k in procs]:
                folder = tmp / f"cnn-{where}-{k or 0}"
                code, text, secs = privdl(cnn, folder, f'device="{where}"', procs=k)
                row = {"step": "speed", "device": where, "procs": k or 0, "wall_seconds": round(secs, 1)}
                if code:
                    row["error"] = text
                    failed.append(f"cnn {where} procs {k}: exit {code}")
                else:
                    man = manifest(folder)
                    row["round_seconds"] = man["seconds"] / args.rounds
                    row["final_metrics"] = man.get("final_metrics")
                    per = man.get("placement", {}).get("per_process")
                    if per:
                        row.update(round_seconds_median=max(p["round_seconds_median"] for p in per),
                                   startup_seconds=max(p["startup_seconds"] for p in per),
                                   peak_rss_bytes=max(p["peak_rss_bytes"] for p in per))
                    rows.append(row)
                say(row, args.out)
            base = next((r["round_seconds"] for r in rows if r["device"] == args.device and not r["procs"]), None)
            if base:
                say({"step": "speed ratios", "baseline": f"{args.device} simulator",
                     "ratios": {f"{r['device']} procs {r['procs']}": round(r["round_seconds"] / base, 3)
                                for r in rows}}, args.out)
    say({"step": "end", "seconds": round(time.perf_counter() - started, 1),
         "result": "PASS" if not failed else "FAIL", "failed": failed}, args.out)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
