"""Benchmark: an in-process, interleaved A/B of the held frame's mix (issue 44) — robust to a loaded machine.

Another checkout's (``--old SRC``: its ``src`` folder) privdl.comm.base, comm.observers, comm.transport, comm.wire,
comm.sliced, comm.held (those it has: before the split of comm.sliced, that one module held them all) and
runtime.transport are loaded as a second copy next to this tree's; each copy's HeldComm (process 0's slice of
bench_anchor.py's K = 2, n = 4 ring, float32 rows of width d) runs over its own DistTransport with gloo replaced by
a loopback (a received message: the expected header, then a value set by the round). Blocks of 100 mix calls
alternate old / new; prints each side's per-call min and median and the median over the pairs of blocks of
new / old. Both copies must give the same bits (checked) and count the same bytes.

    PYTHONPATH=src python benchmarks/ab_held_mix.py --old /path/to/other/src [--dims 15,985] [--pairs 80]
"""
import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))
from bench_anchor import MODELS, held_config
from privdl.experiment.build import build
from privdl.runtime.worker import placements_for
from privdl.simulator.sliced import owners_of
ap = argparse.ArgumentParser()
ap.add_argument("--old", required=True, help="the other checkout's src folder")
ap.add_argument("--dims", default="15,985")
ap.add_argument("--pairs", type=int, default=80)
args = ap.parse_args()
#: in import order; a module the other checkout lacks is skipped (its names live in one loaded before it)
NAMES = ["privdl.comm.base", "privdl.comm.observers", "privdl.comm.transport", "privdl.comm.wire",
         "privdl.comm.sliced", "privdl.comm.held", "privdl.runtime.transport"]
new = {n: importlib.import_module(n) for n in NAMES}
old = {}
for n in NAMES:
    path = Path(args.old) / (n.replace(".", "/") + ".py")
    if not path.exists():
        continue
    spec = importlib.util.spec_from_file_location(n, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[n] = m
    spec.loader.exec_module(m)
    old[n] = m
sys.modules.update(new)

CALLS, PAIRS = 100, args.pairs
class Done:
    def wait(self): pass
class Loopback:
    def isend(self, m, dst): return Done()
    def irecv(self, b, src):
        return Done()

def one(d: int) -> None:
    task, dataset, hidden = MODELS[d]
    cfg = held_config(d, 10)
    c = build(cfg)
    placements = placements_for(cfg, 4, 2)
    p = placements[0]
    x = torch.randn(2, d, dtype=torch.float32)

    def make(mods):
        T = mods["privdl.runtime.transport"]
        T.dist = Loopback()
        take = T.DistTransport._take
        def _take(self, dst, posted):
            src, header, buffer, work = posted
            head = T.encode(header) if isinstance(header[1], str) else torch.from_numpy(header[1])
            buffer[T.HEADER * 8:].view(torch.float32).fill_(0.37 * (int(head[0]) % 7) - 0.5)
            buffer[:T.HEADER * 8].view(torch.int64).copy_(head)
            return take(self, dst, posted)
        T.DistTransport._take = _take
        comm = mods.get("privdl.comm.held", mods["privdl.comm.sliced"]).HeldComm(c.network, p, 0, owners_of(placements, 4),
                                                   T.DistTransport(0, 2, [q.agents for q in placements], timeout=60))
        comm.meter = mods["privdl.comm.observers"].AgentBytes(4, held=p.held)
        return comm
    A, B = make(old), make(new)
    for comm in (A, B):
        comm.t = 1
    # same bits: both see the same (seeded) received rows
    ra, rb = A.mix(x, tag="x"), B.mix(x, tag="x")
    assert torch.equal(ra, rb), (ra, rb)
    ta, tb, ratios = [], [], []
    t = 1
    for r in range(PAIRS):
        for comm, out in ((A, ta), (B, tb)) if r % 2 == 0 else ((B, tb), (A, ta)):
            t0 = time.perf_counter()
            for k in range(CALLS):
                comm.t = t + k
                comm.mix(x, tag="x")
            out.append((time.perf_counter() - t0) / CALLS)
        t += CALLS
        ratios.append(tb[-1] / ta[-1])
    print(f"mix d={d}: old min {1e6*min(ta):.1f} med {1e6*statistics.median(ta):.1f} us; new min {1e6*min(tb):.1f} "
          f"med {1e6*statistics.median(tb):.1f} us; new/old median of {PAIRS} paired blocks "
          f"{statistics.median(ratios):.3f}; "
          f"bits equal: {torch.equal(A.mix(x, tag='x'), B.mix(x, tag='x'))}")
    print(f"A.meter sent == B.meter sent: {A.meter.per_tag() == B.meter.per_tag()}")


for d in (int(v) for v in args.dims.split(",")):
    one(d)
