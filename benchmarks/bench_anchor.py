"""Benchmark: `privdl run --procs K` against a hand-written gloo D-SGD of the same exchange (issue 44's anchor).

The anchor (``AnchorRound`` and ``anchor`` below, ~100 lines) is what one would write by hand with
torch.distributed: K processes on loopback gloo, n = 2K agents on a ring (agent i talks to i ± 1,
Metropolis–Hastings weights 1/3), each process holding two consecutive agents; every round each process computes its
agents' mini-batch gradients (batch 32 of the same data: torch.func ``vmap(grad)`` for the MLPs, the closed form for
softmax regression — as privdl does), takes the step, posts one ``irecv`` and one ``isend`` per peer process (the
rows its agents need / the rows the peer's agents need), waits on all of them and combines: x_i ← (y_{i−1} + y_i +
y_{i+1}) / 3 with y = x − η g (adapt then combine). privdl runs the same D-SGD (``dsgd``, mechanism ``none``, the
ring's Metropolis–Hastings W, ``sparse = true``) with the same K, n, model, batch size, rounds and one intra-op
thread per process.

Models (float32): ``d = 15``: softmax regression on iris (4 features, 3 classes); ``d = 985``: an MLP 64 → 13 → 10
on digits; ``d = 99 985``: an MLP 64 → 1333 → 10 on digits.

Measured per (K, d): the median round of each side (privdl: the manifest's ``placement.per_process``, the slowest
process's median; the anchor: the same, each process timing its own rounds), and the start-up — the wall time of
the whole command less its rounds (process start, imports, rendezvous, data, writing results) — of each. Prints one
JSON object per case and a table of ratios (privdl / anchor).

``--frames network,held`` runs privdl once per frame (``runtime.frame``, privdl.placement) against the same
anchor run, in that order, and reports a ratio per frame.

    python benchmarks/bench_anchor.py [--procs 2,4,8] [--dims 15,985,99985] [--rounds 200] [--frames network]
        [--out FILE]
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

MODELS = {15: ("softmax", "iris", 0), 985: ("mlp", "digits", 13), 99985: ("mlp", "digits", 1333)}
ETA, BATCH = 0.05, 32


def _data(dataset: str):
    import numpy as np
    from sklearn import datasets

    X, y = (datasets.load_iris if dataset == "iris" else datasets.load_digits)(return_X_y=True)
    X = (X - X.mean(0)) / np.maximum(X.std(0), 1e-12)
    return X.astype(np.float32), y.astype(np.int64)


class AnchorRound:
    """The hand-written D-SGD's state for process ``rank`` of ``world`` and its round body (``step``), with the
    point-to-point operations of ``p2p`` (``torch.distributed``, or a stand-in: bench_round_overhead.py's loopback
    times the body without the wait on a peer)."""

    def __init__(self, rank: int, world: int, dataset: str, hidden: int, p2p) -> None:
        import torch
        from torch.func import functional_call, grad, vmap

        self.p2p = p2p
        X, y = _data(dataset)
        self.n, per = 2 * world, 2
        self.mine = mine = list(range(rank * per, rank * per + per))
        f, c = X.shape[1], int(y.max()) + 1
        model = (torch.nn.Sequential(torch.nn.Linear(f, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, c))
                 if hidden else torch.nn.Linear(f, c))
        names = [k for k, _ in model.named_parameters()]
        shapes = [p.shape for _, p in model.named_parameters()]
        sizes = [p.numel() for _, p in model.named_parameters()]
        self.x = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).expand(per, -1).clone()
        self.data = [(torch.from_numpy(X[i::self.n]), torch.from_numpy(y[i::self.n])) for i in mine]

        def loss(flat, xb, yb):
            params = {k: v.reshape(s) for k, v, s in zip(names, flat.split(sizes), shapes)}
            return torch.nn.functional.cross_entropy(functional_call(model, params, (xb,)), yb)

        self.per_agent_grad = vmap(grad(loss))
        if not hidden:  # softmax regression: the gradient in closed form, [(softmax(z) − onehot(y))ᵀ X, Σ r] / B

            def closed_form(flat, xb, yb):
                W, b = flat[:, :c * f].reshape(-1, c, f), flat[:, c * f:]
                r = torch.softmax(torch.baddbmm(b[:, None, :], xb, W.transpose(1, 2)), -1)
                r = (r - torch.nn.functional.one_hot(yb, c).to(r.dtype)) / xb.shape[1]
                return torch.cat([torch.bmm(r.transpose(1, 2), xb).reshape(len(flat), -1), r.sum(1)], 1)
            self.per_agent_grad = closed_form
        n = self.n
        owner = lambda i: (i % n) // per  # noqa: E731
        # for each peer process: my rows its agents read, and its rows my agents read (ring neighbours i ± 1)
        self.peers = sorted({owner(j) for i in mine for j in (i - 1, i + 1)} - {rank})
        self.rows_out = {q: [k for k, i in enumerate(mine) if any(owner(j) == q for j in (i - 1, i + 1))]
                         for q in self.peers}
        self.rows_in = {q: sorted({j % n for i in mine for j in (i - 1, i + 1) if owner(j) == q}) for q in self.peers}
        self.g = torch.Generator().manual_seed(rank)

    def step(self) -> None:
        """One round: a batch per agent, the gradient step, one irecv and one isend per peer, the combination."""
        import torch

        data, x, peers, rows_in, rows_out, n, mine = (self.data, self.x, self.peers, self.rows_in, self.rows_out,
                                                      self.n, self.mine)
        idx = [torch.randint(len(d[1]), (BATCH,), generator=self.g) for d in data]
        xb = torch.stack([d[0][i] for d, i in zip(data, idx)])
        yb = torch.stack([d[1][i] for d, i in zip(data, idx)])
        step = x - ETA * self.per_agent_grad(x, xb, yb)
        bufs = {q: torch.empty(len(rows_in[q]), x.shape[1]) for q in peers}
        reqs = ([self.p2p.irecv(bufs[q], q) for q in peers]
                + [self.p2p.isend(step[rows_out[q]].contiguous(), q) for q in peers])
        for r in reqs:
            r.wait()
        rows = {i: step[k] for k, i in enumerate(mine)}
        for q in peers:
            rows.update({j: bufs[q][k] for k, j in enumerate(rows_in[q])})
        self.x = torch.stack([(rows[(i - 1) % n] + rows[i] + rows[(i + 1) % n]) / 3 for i in mine])


def anchor(rank: int, world: int, port: int, dataset: str, hidden: int, rounds: int, out: str) -> None:
    """One process of the hand-written D-SGD (see the module's docstring)."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    body = AnchorRound(rank, world, dataset, hidden, dist)
    seconds = []
    first = time.time()
    for _ in range(rounds):
        t0 = time.perf_counter()
        body.step()
        seconds.append(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()
    Path(f"{out}.{rank}").write_text(json.dumps({"median": statistics.median(seconds), "first_round": first}))


def run_anchor(world: int, dataset: str, hidden: int, rounds: int) -> dict:
    from privdl.runtime.launch import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "anchor")
        port = free_port()
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(world), str(port), dataset,
                                   str(hidden), str(rounds), out]) for r in range(world)]
        codes = [p.wait() for p in procs]
        wall = time.perf_counter() - t0
        if any(codes):
            raise SystemExit(f"anchor failed: {codes}")
        got = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    median = max(g["median"] for g in got)
    return {"round_seconds": median, "wall_seconds": wall, "startup_seconds": wall - rounds * median}


CONFIG = """name = "anchor"
seeds = [0]
iterations = {rounds}
eval_every = {rounds}
threads = 1
dtype = "float32"
[schedule]
eta = {eta}
[network]
topology = "ring"
n = {n}
sparse = true
[task]
name = "{task}"
dataset = "{dataset}"
batch_size = {batch}
{hidden}
[algorithm]
name = "dsgd"
[mechanism]
name = "none"
"""


def privdl_toml(world: int, task: str, dataset: str, hidden: int, rounds: int, frame: str = "network") -> str:
    """privdl's config of the anchor's run: K = ``world`` processes, n = 2K agents, ``frame`` (``runtime.frame``)."""
    return (CONFIG.format(rounds=rounds, eta=ETA, n=2 * world, task=task, dataset=dataset, batch=BATCH,
                          hidden=f"hidden = {hidden}" if hidden else "")
            + ("" if frame == "network" else f'[runtime]\nframe = "{frame}"\n'))


def held_config(d: int, rounds: int) -> dict:
    """The expanded config (one run, ``runtime.backend = "dist"``) of K = 2's privdl run at ``d`` in the held frame:
    what the in-process benchmarks (bench_round_overhead, bench_oracle, ab_held_mix) run process 0's slice of."""
    from privdl.experiment import load_config
    from privdl.experiment.config import expand

    task, dataset, hidden = MODELS[d]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_text(privdl_toml(2, task, dataset, hidden, rounds, "held"))
        return expand(load_config(path, ['runtime.backend="dist"']))[0][0].config


def run_privdl(world: int, task: str, dataset: str, hidden: int, rounds: int, frame: str = "network") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text(privdl_toml(world, task, dataset, hidden, rounds, frame))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "privdl.cli", "run", str(cfg), "--out", str(Path(tmp) / "o"),
                        "--procs", str(world), "--no-plot", "--quiet"], check=True)
        wall = time.perf_counter() - t0
        man = json.loads(next((Path(tmp) / "o" / "runs").rglob("manifest.json")).read_text())
    per = man["placement"]["per_process"]
    median = max(p["round_seconds_median"] for p in per)
    return {"round_seconds": median, "wall_seconds": wall, "startup_seconds": wall - rounds * median,
            "worker_startup_seconds": max(p["startup_seconds"] for p in per),
            "peak_rss_bytes": max(p["peak_rss_bytes"] for p in per)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        r, w, port, dataset, hidden, rounds, out = sys.argv[2:]
        anchor(int(r), int(w), int(port), dataset, int(hidden), int(rounds), out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="2,4,8")
    ap.add_argument("--dims", default="15,985,99985")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", default=None, help="also write the cases as JSON lines here")
    ap.add_argument("--frames", default="network", help="privdl's runtime.frame values, each against the anchor")
    args = ap.parse_args()
    frames = args.frames.split(",")
    rows = []
    for d in (int(v) for v in args.dims.split(",")):
        task, dataset, hidden = MODELS[d]
        for k in (int(v) for v in args.procs.split(",")):
            a = run_anchor(k, dataset, hidden, args.rounds)
            for frame in frames:
                p = run_privdl(k, task, dataset, hidden, args.rounds, frame)
                row = {"K": k, "n": 2 * k, "d": d, "rounds": args.rounds, "frame": frame, "anchor": a, "privdl": p,
                       "round_ratio": p["round_seconds"] / a["round_seconds"],
                       "startup_ratio": p["startup_seconds"] / a["startup_seconds"], "cpus": os.cpu_count()}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
    print(f"\n{'K':>3} {'d':>6} {'frame':>8} {'anchor ms':>10} {'privdl ms':>10} {'ratio':>6} {'start a s':>9} "
          f"{'start p s':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['K']:>3} {r['d']:>6} {r['frame']:>8} {1e3 * r['anchor']['round_seconds']:>10.3f} "
              f"{1e3 * r['privdl']['round_seconds']:>10.3f} {r['round_ratio']:>6.2f} "
              f"{r['anchor']['startup_seconds']:>9.2f} {r['privdl']['startup_seconds']:>9.2f} "
              f"{r['startup_ratio']:>6.2f}")


if __name__ == "__main__":
    main()
