"""What 256-bit agreed keys cost (issue 43): a whole run with root keys, with today's agreed keys (256-bit, ChaCha20,
BLAKE2b folds) and with the agreed keys before them (64-bit draw keys, BLAKE2b-64 folds, ChaCha20 keyed by SHA-256 of
salt and key) — one script, one machine, interleaved; and the setup time of the key agreement with identities.

**Runs.** ``privdl run examples/correlated_noise.toml --set seeds=[0] --set iterations=300 --set batch_replicas=1``
(n = 20 on ER(0.5), logistic regression d = 31, D-SGD; none / LDP / DECOR / Whisper × ε ∈ {3, 10, 30}), each run's
``seconds`` from its manifest (the rounds, not the imports or the setup). ``--old-src`` is the ``src`` folder of the
commit before 256-bit keys (``git worktree add /tmp/old 2e258b9``); its runs go through a subprocess with that
folder on ``PYTHONPATH``. Every variant runs ``--repeat`` times, alternating; the table gives each mechanism's
median of the per-run ratios.

**Setup.** Key agreement for n agents on ER(0.5) in ``--slices`` slices (threads over the in-process transport: the
protocol's work without the imports and rendezvous of processes), DECOR's pairs and Whisper's group, with and
without Ed25519 identities; the slowest slice's time, best of ``--repeat``.

    git worktree add /tmp/old 2e258b9
    python benchmarks/bench_agreed_keys.py runs --old-src /tmp/old/src [--repeat 3]
    python benchmarks/bench_agreed_keys.py setup [--agents 32] [--slices 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "correlated_noise.toml"
SETS = ["seeds=[0]", "iterations=300", "batch_replicas=1"]


def _run(src: Path, keys: str, out: Path) -> dict[tuple[str, float], float]:
    """Run seconds per (mechanism, ε) of one privdl run of the config with ``keys``, from the tree at ``src``."""
    args = [sys.executable, "-m", "privdl.cli.__main__", "run", str(CONFIG), "--out", str(out), "--no-plot",
            "--quiet", *sum((["--set", s] for s in SETS), [])]
    if keys == "agreed":
        args += ["--set", 'runtime.keys="agreed"']
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    subprocess.run(args, check=True, env=env, capture_output=True, cwd=ROOT)
    got = {}
    for path in out.rglob("manifest.json"):
        man = json.loads(path.read_text())
        mech = man["config"]["mechanism"]
        got[(mech["name"], mech.get("epsilon"))] = float(man["seconds"])
    return got


def runs(args) -> None:
    variants = {"root": (ROOT / "src", "root"), "agreed-256": (ROOT / "src", "agreed")}
    if args.old_src:
        variants["agreed-64 (before)"] = (Path(args.old_src), "agreed")
    times: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for name, (src, keys) in variants.items():
                out = Path(tmp) / f"{name.split()[0]}-{r}"
                began = time.perf_counter()
                times[name].append(_run(src, keys, out))
                print(f"repeat {r} {name}: {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    mechanisms = sorted({m for m, _ in times["root"][0]})
    print("| mechanism | root (s, 3 ε) | agreed-256 / root |" + (" agreed-64 (before) / root | agreed-256 / agreed-64 |"
                                                              if args.old_src else ""))
    print("|---|---|---|" + ("---|---|" if args.old_src else ""))
    for m in mechanisms:
        def ratio(a: str, b: str) -> float:
            return statistics.median(x[k] / y[k] for x, y in zip(times[a], times[b]) for k in x if k[0] == m)
        root_s = statistics.median(sum(v for k, v in x.items() if k[0] == m) for x in times["root"])
        row = f"| {m} | {root_s:.2f} | {ratio('agreed-256', 'root'):.2f}× |"
        if args.old_src:
            row += f" {ratio('agreed-64 (before)', 'root'):.2f}× | {ratio('agreed-256', 'agreed-64 (before)'):.2f}× |"
        print(row)


def setup(args) -> None:
    import threading

    import numpy as np

    from privdl.comm.transport import Transport
    from privdl.keys import RootKeys
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network
    from privdl.placement import partition
    from privdl.agreement import agree, shared_groups
    from privdl.agreement.identity import Identities, Roster, generate
    from privdl.simulator.sliced import owners_of

    n, k = args.agents, args.slices
    net = Network.from_topology("erdos_renyi", n, p=0.5, seed=0)
    placements = partition(n, slices=k)
    owner = owners_of(placements, n)
    with tempfile.TemporaryDirectory() as tmp:
        roster, folder = generate(n, tmp)
        print("| agents | slices | mechanism | identities | key agreement (s) | setup bytes |")
        print("|---|---|---|---|---|---|")
        for family in ("decor", "whisper"):
            mech = make_mechanism(family, steps=100, network=net, clip=1.0, epsilon=10.0)
            groups = shared_groups(mech, n)
            for signed in (False, True):
                best, size = float("inf"), 0
                for _ in range(args.repeat):
                    ids = [Identities(Roster(roster, n), folder, p.agents) if signed else None for p in placements]
                    transport = Transport(k, timeout=60)
                    took = [0.0] * k

                    def work(part: int) -> None:
                        began = time.perf_counter()
                        agree(part=part, placement=placements[part], owner=owner, network=net, groups=groups,
                              transport=transport, public=RootKeys(0), context="bench", identities=ids[part])
                        took[part] = time.perf_counter() - began

                    threads = [threading.Thread(target=work, args=(p,)) for p in range(k)]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    best, size = min(best, max(took)), transport.setup_bytes
                print(f"| {n} | {k} | {family} | {'ed25519' if signed else 'none'} | {best:.3f} | {size:,} |")
                assert np is not None


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("runs")
    r.add_argument("--old-src", default=None)
    r.add_argument("--repeat", type=int, default=3)
    s = sub.add_parser("setup")
    s.add_argument("--agents", type=int, default=32)
    s.add_argument("--slices", type=int, default=8)
    s.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    (runs if args.what == "runs" else setup)(args)


if __name__ == "__main__":
    main()
