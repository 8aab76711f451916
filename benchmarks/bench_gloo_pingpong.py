"""Benchmark: two processes on loopback gloo exchanging one message per round, each spinning ``--work-us`` µs of
its own work per round first (issue 44: what a lockstep round costs on this machine for a given own work).

Each round, as bench_anchor.py's anchor: post one ``irecv`` and one ``isend`` of ``--size`` bytes (uint8), wait on
both. ``--order sr`` posts the send first; ``--prepost`` posts the next round's receive as soon as a round ends (the
peer's send then finds it posted). Prints, per work value, each process's median round (µs) and the median and 90th
percentile of its ``irecv`` call (a call that blocks inside gloo shows there).

    python benchmarks/bench_gloo_pingpong.py [--work-us 0,200,500] [--size 248] [--rounds 800] [--repeat 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time


def worker(rank: int, port: int, size: int, work: float, rounds: int, order: str, prepost: bool) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    peer, out = 1 - rank, torch.zeros(size, dtype=torch.uint8)
    rounds_s, calls = [], []
    nxt = dist.irecv(torch.empty(size, dtype=torch.uint8), peer) if prepost else None
    then = time.perf_counter()
    for k in range(rounds):
        t = time.perf_counter()
        while time.perf_counter() - t < work * 1e-6:
            pass
        a = time.perf_counter()
        if prepost:
            r, s = nxt, dist.isend(out.clone(), peer)
        elif order == "rs":
            r = dist.irecv(torch.empty(size, dtype=torch.uint8), peer)
            s = dist.isend(out.clone(), peer)
        else:
            s = dist.isend(out.clone(), peer)
            r = dist.irecv(torch.empty(size, dtype=torch.uint8), peer)
        calls.append(time.perf_counter() - a)
        r.wait()
        s.wait()
        if prepost and k < rounds - 1:
            nxt = dist.irecv(torch.empty(size, dtype=torch.uint8), peer)
        now = time.perf_counter()
        rounds_s.append(now - then)
        then = now
    dist.barrier()
    dist.destroy_process_group()
    keep = rounds_s[rounds // 10:], sorted(calls[rounds // 10:])
    print(json.dumps({"rank": rank, "round_us": 1e6 * statistics.median(keep[0]),
                      "post_us": 1e6 * statistics.median(keep[1]),
                      "post_p90_us": 1e6 * keep[1][int(.9 * len(keep[1]))]}),
          flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        r, port, size, work, rounds, order, prepost = sys.argv[2:]
        worker(int(r), int(port), int(size), float(work), int(rounds), order, prepost == "1")
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--work-us", default="0,200,500")
    ap.add_argument("--size", type=int, default=248)
    ap.add_argument("--rounds", type=int, default=800)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--order", choices=("rs", "sr"), default="rs")
    ap.add_argument("--prepost", action="store_true")
    args = ap.parse_args()
    from privdl.runtime.launch import free_port

    for rep in range(args.repeat):
        for work in args.work_us.split(","):
            port = free_port()
            procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(port), str(args.size), work,
                                       str(args.rounds), args.order, "1" if args.prepost else "0"],
                                      stdout=subprocess.PIPE, text=True) for r in range(2)]
            got = sorted((json.loads(p.communicate()[0]) for p in procs), key=lambda g: g["rank"])
            print(f"repeat {rep} work {work} us: " + "  ".join(
                f"process {g['rank']} round {g['round_us']:.0f} us (irecv call {g['post_us']:.0f}, p90 "
                f"{g['post_p90_us']:.0f})" for g in got), flush=True)


if __name__ == "__main__":
    main()
