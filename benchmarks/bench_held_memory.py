"""Benchmark: the peak RSS of a process holding 2 agents, at n = 64 and n = 1024, network frame against held frame.

Issue 44's memory target: a process holding 2 of n = 1024 agents (uneven ``runtime.assignment``) has the same
peak RSS, within 10 %, as one holding 2 of n = 64. Each case is one ``privdl run --procs 2``: process 0 holds agents
0 and 1, process 1 the other n − 2; D-SGD on a ring (process 0's agents read agents n − 1 and 2 from process 1), an
MLP 64 → H → 10 on digits (``--hidden``; 150: d = 11 260), float64, mechanism ``--mechanism`` (none or
gaussian_ldp). Process 0's ``placement.per_process[0].peak_rss_bytes`` is read from the manifest. Cases run
interleaved (n = 64 and n = 1024, each frame) ``--repeats`` times; prints one JSON object per case and the ratios
n = 1024 / n = 64 per frame (median over repeats).

    python benchmarks/bench_held_memory.py [--ns 64,1024] [--frames network,held] [--hidden 150] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = """name = "held_memory"
seeds = [0]
iterations = {rounds}
eval_every = {rounds}
threads = 1
[schedule]
eta = 0.05
[network]
topology = "ring"
n = {n}
sparse = true
[task]
name = "mlp"
dataset = "digits"
hidden = {hidden}
batch_size = 1
[algorithm]
name = "dsgd"
[mechanism]
{mechanism}
[runtime]
frame = "{frame}"
assignment = [[0, 1], [{rest}]]
"""


def run(n: int, frame: str, hidden: int, rounds: int, mechanism: str) -> dict:
    mech = 'name = "none"' if mechanism == "none" else 'name = "gaussian_ldp"\nepsilon = 10.0'
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text(CONFIG.format(rounds=rounds, n=n, hidden=hidden, frame=frame, mechanism=mech,
                                     rest=", ".join(str(i) for i in range(2, n))))
        subprocess.run([sys.executable, "-m", "privdl.cli", "run", str(cfg), "--out", str(Path(tmp) / "o"),
                        "--procs", "2", "--no-plot", "--quiet"], check=True)
        man = json.loads(next((Path(tmp) / "o" / "runs").rglob("manifest.json")).read_text())
    per = man["placement"]["per_process"]
    return {"n": n, "frame": frame, "hidden": hidden, "mechanism": mechanism,
            "rss0_bytes": per[0]["peak_rss_bytes"], "rss1_bytes": per[1]["peak_rss_bytes"],
            "round0_seconds": per[0]["round_seconds_median"], "startup0_seconds": per[0]["startup_seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="64,1024")
    ap.add_argument("--frames", default="network,held")
    ap.add_argument("--hidden", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--mechanism", default="none", choices=["none", "gaussian_ldp"])
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    ns, frames = [int(v) for v in args.ns.split(",")], args.frames.split(",")
    got: dict[tuple[int, str], list[dict]] = {}
    for _ in range(args.repeats):
        for frame in frames:
            for n in ns:
                row = run(n, frame, args.hidden, args.rounds, args.mechanism)
                got.setdefault((n, frame), []).append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'frame':>8} " + " ".join(f"{'rss0 n=' + str(n) + ' MB':>16}" for n in ns) + f" {'ratio':>6}")
    for frame in frames:
        rss = [statistics.median(r["rss0_bytes"] for r in got[(n, frame)]) / 2**20 for n in ns]
        print(f"{frame:>8} " + " ".join(f"{v:>16.1f}" for v in rss) + f" {rss[-1] / rss[0]:>6.3f}")


if __name__ == "__main__":
    main()
