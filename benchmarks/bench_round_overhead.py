"""Benchmark: the per-round cost of one process of ``privdl run --procs 2`` outside the gloo wait (issue 44).

Runs process 0's slice of bench_anchor.py's privdl D-SGD (K = 2, n = 4 on a ring, the held frame, mechanism
``none``) in this one process, with gloo's ``isend`` / ``irecv`` replaced by a loopback that completes at once
(every received message is zeros under the header the receiver expects): what is left is the round's own work —
the oracle (sampling, gradient), the Comm's plan and sums, the transport's headers and buffers, the hooks — with no
waiting for a peer. Prints the median round and, with ``--sections``, the median time of the main parts of a round
(each timed by a wrapper, which adds a little to every part). ``--profile`` prints cProfile's 40 largest own times.

``--anchor`` also runs the hand-written anchor's round body (bench_anchor.py's ``AnchorRound``, process 0 of the
same K = 2, n = 4 ring) over the same loopback in this process, interleaved with privdl's rounds in blocks of 100
(after every 100 privdl rounds, 100 anchor rounds), and prints both sides' own work per round and their ratio: the
median round of each, and the median over blocks of (privdl's block median / the next anchor block's median). Both
sides see the same machine load at nearly the same time, so the ratio holds on a loaded machine where the
end-to-end one (bench_anchor.py) does not.

    python benchmarks/bench_round_overhead.py [--dims 15,985] [--rounds 2000] [--sections] [--profile] [--anchor]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

BLOCK = 100  # rounds per block (best median of a block; --anchor's interleaving)


def one(d: int, rounds: int, sections: bool, profile: bool, anchor: bool = False) -> None:
    import numpy as np
    import torch

    import privdl.runtime.transport as T
    from bench_anchor import MODELS, AnchorRound, held_config
    from privdl.experiment.build import build
    from privdl.keys import HeldKeys, Keys, RootKeys
    from privdl.runtime.worker import placements_for
    from privdl.simulator.sliced import owners_of, run_slice
    from privdl.tasks.held import HeldTask

    torch.set_num_threads(1)
    task, dataset, hidden = MODELS[d]
    cfg = held_config(d, rounds)
    c = build(cfg)

    class Done:
        def wait(self) -> None:
            pass

    class Loopback:  # gloo's point-to-point, completed at once: a receive gets the expected header, zeros after it
        def isend(self, message, dst):
            return Done()

        def irecv(self, buffer, src):
            buffer.zero_()
            return Done()

    T.dist = Loopback()
    take = T.DistTransport._take

    def _take(self, dst, posted):
        src, header, buffer, work = posted  # (header: the expected header, or it with its entries and more)
        head = T._header_array(header) if isinstance(header[1], str) else header[1]
        buffer.numpy()[:T.HEADER * 8] = head.view(np.uint8)  # (what gloo's receive writes: no torch call)
        return take(self, dst, posted)

    T.DistTransport._take = _take
    times: dict[str, list[float]] = defaultdict(list)
    if sections:
        import privdl.comm.held as H
        import privdl.comm.sliced as S
        import privdl.simulator.access as A

        def wrap(cls, name: str, label: str) -> None:
            f = getattr(cls, name)

            def timed(*a, **k):
                t0 = time.perf_counter()
                out = f(*a, **k)
                times[label].append(time.perf_counter() - t0)
                return out
            setattr(cls, name, timed)
        for cls, name, label in ((A.GradientOracle, "__call__", "oracle (all)"),
                                 (A.GradientOracle, "_held", "  sampling"), (H.HeldComm, "mix", "mix (all)"),
                                 (S.SliceComm, "_send_receive" if hasattr(S.SliceComm, "_send_receive") else
                                  "_exchange", "  exchange"), (S.SliceComm, "_held_rows_sum", "  sums")):
            wrap(cls, name, label)
    placements = placements_for(cfg, 4, 2)
    p = placements[0]
    rounds_s: list[float] = []
    anchor_s: list[float] = []
    body = AnchorRound(0, 2, dataset, hidden, Loopback()) if anchor else None
    last = [time.perf_counter()]

    def on_step(t: int) -> None:
        now = time.perf_counter()
        rounds_s.append(now - last[0])
        if body is not None and len(rounds_s) % BLOCK == 0:  # a block of the anchor's rounds after each of privdl's
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                body.step()
                anchor_s.append(time.perf_counter() - t0)
            now = time.perf_counter()
        last[0] = now

    kw = dict(part=0, placement=p, owner=owners_of(placements, 4), network=c.network, task=HeldTask(c.task, p),
              keys=Keys(HeldKeys(RootKeys(0), p.held), 4), mechanism=c.mechanism, algorithm=c.algorithm,
              schedule=c.schedule, iterations=rounds, x0=None, gradient=cfg["gradient"], marks=set(),
              transport=T.DistTransport(0, 2, [q.agents for q in placements], timeout=60), wire=None,
              record=lambda *a: None, on_step=on_step, checkpoints=None, resume=False, last=None, saved=None,
              held_rows=True, frame="held")
    if profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        run_slice(**kw)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(40)
        return
    run_slice(**kw)
    blocks = [statistics.median(rounds_s[i:i + BLOCK]) for i in range(0, len(rounds_s) - BLOCK + 1, BLOCK)]
    print(f"d = {d}: median round {1e3 * statistics.median(rounds_s):.3f} ms, best median of 100 rounds "
          f"{1e3 * min(blocks):.3f} ms")
    if body is not None:
        theirs = [statistics.median(anchor_s[i:i + BLOCK]) for i in range(0, len(anchor_s), BLOCK)]
        ratios = [a / b for a, b in zip(blocks, theirs)]
        print(f"  anchor: median round {1e3 * statistics.median(anchor_s):.3f} ms, best median of 100 rounds "
              f"{1e3 * min(theirs):.3f} ms")
        print(f"  own work privdl / anchor: {statistics.median(rounds_s) / statistics.median(anchor_s):.2f} "
              f"(medians), {statistics.median(ratios):.2f} (median over {len(ratios)} blocks), "
              f"{min(blocks) / min(theirs):.2f} (best blocks)")
    for label, v in times.items():
        print(f"  {label:14s} {1e6 * statistics.median(v):8.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="15,985")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--sections", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--anchor", action="store_true", help="also time the anchor's round body, interleaved")
    args = ap.parse_args()
    for d in (int(v) for v in args.dims.split(",")):
        one(d, args.rounds, args.sections, args.profile, args.anchor)


if __name__ == "__main__":
    main()
