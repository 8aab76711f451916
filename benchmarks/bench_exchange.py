"""Benchmark: the runtime's Comm over torch.distributed against a raw exchange of the same bytes, and the setup time.

**Exchange.** n agents, one per process (gloo, loopback), on a ring or ER(0.5); each round every agent sends its
d float64 numbers to each neighbour and combines what it receives. Three timings per round, in the same
processes, back to back:

* ``raw``   — ``isend`` / ``irecv`` of each agent's row to and from each neighbour, all waited (no header, no
  combination): the floor for these bytes between these pairs;
* ``raw+mix`` — the same, then Σ_j w_ij x_j over the received rows (the arithmetic every mix needs);
* ``comm``  — ``SliceComm.mix`` over ``DistTransport``: header checked before every payload, rows gathered for
  each peer, the canonical combination in the network frame (the simulator's kernel on an (n, d) tensor).

Time per round is the slowest process's mean over the timed rounds (after warm-up).

**Setup.** Rendezvous (``init_process_group``) and key agreement (X25519 + HKDF over the links, group secrets
wrapped for Whisper's seed group) for n agents on K processes; the slowest process's time.

    python benchmarks/bench_exchange.py exchange [--agents 8] [--dims 10000,1000000] [--topologies ring,er]
    python benchmarks/bench_exchange.py setup [--agents 8,32] [--procs 8]
"""

from __future__ import annotations

import argparse
import datetime
import json
import time


def _exchange_worker(rank, world, port, topology, d, rounds, out):
    import torch
    import torch.distributed as dist

    from privdl.comm.sliced import SliceComm
    from privdl.network import Network
    from privdl.placement import partition
    from privdl.runtime.transport import DistTransport
    from privdl.simulator.sliced import owners_of

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    n = world
    net = (Network.from_topology("ring", n) if topology == "ring" else
           Network.from_topology("erdos_renyi", n, p=0.5, seed=0))
    placements = partition(n, slices=world)
    owner = owners_of(placements, n)
    transport = DistTransport(rank, world, [p.agents for p in placements], timeout=300)
    comm = SliceComm(net, placements[rank], rank, owner, transport)
    e = net.edges
    nbrs = sorted({int(s) for s, t in zip(e.src.tolist(), e.dst.tolist()) if t == rank})
    weights = {int(s): float(w) for s, t, w in zip(e.src.tolist(), e.dst.tolist(), e.weight.tolist()) if t == rank}
    self_w = float(e.self_weight[rank])
    x = torch.randn(n, d, dtype=torch.float64)
    mine = x[rank].clone()
    bufs = {j: torch.empty(d, dtype=torch.float64) for j in nbrs}

    def raw(combine: bool):
        works = [dist.isend(mine, j) for j in nbrs] + [dist.irecv(bufs[j], j) for j in nbrs]
        for w in works:
            w.wait()
        if combine:
            acc = self_w * mine
            for j in nbrs:
                acc = acc + weights[j] * bufs[j]
            return acc
        return None

    def ours(_):
        return comm.mix(x, tag="x")

    result = {}
    for name, fn, arg in (("raw", raw, False), ("raw+mix", raw, True), ("comm", ours, None)):
        for _ in range(3):
            fn(arg)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn(arg)
        elapsed = torch.tensor([(time.perf_counter() - t0) / rounds])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        result[name] = float(elapsed)
    if rank == 0:
        out.put(result)
    dist.barrier()
    dist.destroy_process_group()


def _setup_worker(rank, world, port, n, family, out):
    t_start = time.perf_counter()
    import torch
    import torch.distributed as dist

    from privdl.algorithms import make_algorithm
    from privdl.keys import RootKeys
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network
    from privdl.placement import partition
    from privdl.agreement import agree, shared_groups
    from privdl.runtime.transport import DistTransport
    from privdl.simulator.sliced import owners_of

    torch.set_num_threads(1)
    imported = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    joined = time.perf_counter()
    net = Network.from_topology("erdos_renyi", n, p=0.5, seed=0)
    alg = make_algorithm("dsgd")
    mech = make_mechanism(family, steps=alg.accesses(10, net.edges), network=net, clip=1.0, epsilon=10.0)
    groups = shared_groups(mech, n)
    placements = partition(n, slices=world)
    transport = DistTransport(rank, world, [p.agents for p in placements], timeout=600)
    dist.barrier()
    t0 = time.perf_counter()
    agree(part=rank, placement=placements[rank], owner=owners_of(placements, n), network=net, groups=groups,
          transport=transport, public=RootKeys(0), context="bench")
    agreed = time.perf_counter() - t0
    times = torch.tensor([imported - t_start, joined - imported, agreed, float(transport.setup_bytes)])
    dist.all_reduce(times[:3], op=dist.ReduceOp.MAX)
    total = times[3:].clone()
    dist.all_reduce(total)
    if rank == 0:
        out.put({"import_s": float(times[0]), "rendezvous_s": float(times[1]), "agreement_s": float(times[2]),
                 "setup_bytes": int(total[0]), "edges": len(net.edges) // 2, "groups": len(groups)})
    dist.destroy_process_group()


def _spawn(target, world, *args):
    import torch.multiprocessing as mp

    from privdl.runtime.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a worker failed: exit codes {[p.exitcode for p in procs]}")
    return out.get()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["exchange", "setup"])
    ap.add_argument("--agents", default=None)
    ap.add_argument("--dims", default="10000,1000000")
    ap.add_argument("--topologies", default="ring,er")
    ap.add_argument("--procs", type=int, default=8)
    args = ap.parse_args()
    if args.what == "exchange":
        n = int(args.agents or 8)
        for topology in args.topologies.split(","):
            for d in (int(v) for v in args.dims.split(",")):
                rounds = max(20, min(200, int(2e7 // (d * n))))
                r = _spawn(_exchange_worker, n, topology, d, rounds)
                print(json.dumps({"topology": topology, "n": n, "d": d, "rounds": rounds,
                                  **{k: round(v * 1e3, 3) for k, v in r.items()},
                                  "comm/raw": round(r["comm"] / r["raw"], 3),
                                  "comm/raw+mix": round(r["comm"] / r["raw+mix"], 3)}), flush=True)
    else:
        for n in (int(v) for v in (args.agents or "8,32").split(",")):
            for family in ("decor", "whisper"):
                world = min(args.procs, n)
                r = _spawn(_setup_worker, world, n, family)
                print(json.dumps({"agents": n, "processes": world, "mechanism": family,
                                  **{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}}),
                      flush=True)


if __name__ == "__main__":
    main()
