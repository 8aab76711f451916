"""A process of the distributed runtime: it holds one slice of agents of every run of an experiment.

Every process expands the same config into the same runs and runs each of them as one slice of
:func:`privdl.simulator.sliced.run_slice` — the sliced backend's engine — over a :class:`DistTransport`. The
placement is a pure function of (config, world size, rank): contiguous blocks of agents, ``runtime.assignment``
when given. Process 0 is the coordinator: it decides which runs are left (a finished run in ``--out`` is kept),
gathers the held rows at the recorded rounds and at the end (metrics computed as the simulator computes them),
merges the access counts behind the ledger, completes checkpoints and writes results, manifests and results.csv
into ``--out`` exactly as a simulator run does.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import torch
import torch.distributed as dist

from privdl.errors import PrivdlError, ValidationError
from privdl.keys import HeldKeys, Keys, RootKeys, secure_draws
from privdl.placement import Placement, partition
from privdl.runtime.agreement import agree, shared_groups
from privdl.comm.sliced import Wire
from privdl.runtime.transport import _CODE as CODES, DTYPES, HEADER, DistTransport
from privdl.simulator.checkpoint import Checkpoints, RunState
from privdl.simulator.engine import Recorder, recorded_rounds, stateful
from privdl.simulator.sliced import HeldTask, NetworkBytes, owners_of, run_slice

#: tags of the coordinator's messages (never algorithm payloads)
RECORD, FINAL, ACCESSES, SAVED = "privdl/record", "privdl/final", "privdl/accesses", "privdl/saved"
BYTES, WIRE = "privdl/bytes", "privdl/wire"


def placements_for(cfg: dict, n: int, world: int) -> list[Placement]:
    """The placement of every process: a pure function of the config, the network's size and the world size."""
    runtime = cfg.get("runtime", {})
    per = runtime.get("agents_per_process")
    if per:
        blocks = [list(range(lo, min(n, lo + per))) for lo in range(0, n, per)]
        if len(blocks) != world:
            raise ValidationError(f"runtime.agents_per_process = {per} places {n} agents on {len(blocks)} "
                                  f"processes; {world} were started (start {len(blocks)}, or change it)")
        return partition(n, assignment=blocks)
    if world > n:
        raise ValidationError(f"{world} processes for {n} agents: every process must hold at least one agent "
                              f"(use at most {n} processes)")
    parts = partition(n, slices=None if runtime.get("assignment") else world, assignment=runtime.get("assignment"))
    if len(parts) != world:
        raise ValidationError(f"runtime.assignment has {len(parts)} parts for {world} processes")
    return parts


class DistWire:
    """The wire of a distributed run with observers (the eavesdropper): every process sends its part of each
    transmission — the messages its agents receive — to process 0 (tag ``privdl/wire``: a size message, then the
    entries' positions, senders and receivers, then their payloads), where :class:`privdl.comm.sliced.Wire` merges
    the parts into the simulator's message and hands it to the observers. Control traffic: it exists only when a
    run has observers, and is counted apart from the payload."""

    def __init__(self, rank: int, world: int, transport: DistTransport, observers) -> None:
        self.rank, self.world, self.transport = rank, world, transport
        self.merge = Wire(world, observers) if rank == 0 else None

    def part(self, seq: int, t: int, tag: str, entry: tuple | None) -> None:
        if self.rank:
            meta = torch.full((HEADER,), -1, dtype=torch.int64)
            meta[0] = 0 if entry is None else int(entry[0].numel())
            if entry is not None and entry[0].numel():
                order, src, dst, payload = entry
                shape = tuple(payload.shape[1:])
                meta[1:4] = torch.tensor([CODES[str(payload.dtype)], CODES[str(src.dtype)], len(shape)])
                meta[4:4 + len(shape)] = torch.tensor(shape, dtype=torch.int64)
            self.transport.send(self.rank, 0, (t, WIRE, seq, "torch.int64", (HEADER,)), meta)
            if int(meta[0]):
                index = torch.stack([order.long().cpu(), src.long().cpu(), dst.long().cpu()])
                self.transport.send(self.rank, 0, (t, WIRE, seq, "torch.int64", tuple(index.shape)), index)
                self.transport.send(self.rank, 0, (t, WIRE, seq, str(payload.dtype), tuple(payload.shape)), payload)
            self.transport.flush(self.rank)
            return
        self.merge.part(seq, t, tag, entry)
        for r in range(1, self.world):
            meta = self.transport.recv(r, 0, (t, WIRE, seq, "torch.int64", (HEADER,))).tolist()
            k = meta[0]
            if not k:
                self.merge.part(seq, t, tag, None)
                continue
            index = self.transport.recv(r, 0, (t, WIRE, seq, "torch.int64", (3, k)))
            shape = (k, *meta[4:4 + meta[3]])
            payload = self.transport.recv(r, 0, (t, WIRE, seq, str(DTYPES[meta[1]]), shape))
            kind = DTYPES[meta[2]]
            self.merge.part(seq, t, tag, (index[0], index[1].to(kind), index[2].to(kind), payload))


class _Coordinator:
    """Process 0 gathers; the others send. One instance per run."""

    def __init__(self, transport: DistTransport, placements: list[Placement], on_record, checkpoints, recorder,
                 network_bytes: NetworkBytes, watchers: list):
        self.transport, self.placements, self.bytes, self.watchers = transport, placements, network_bytes, watchers
        self.rank, self.world = transport.rank, transport.parts
        self.on_record, self.checkpoints, self.recorder = on_record, checkpoints, recorder

    def _gather(self, tag: str, t: int, x: torch.Tensor) -> torch.Tensor | None:
        """The held rows of every process in one tensor (process 0), or None (the others, after sending)."""
        mine = self.placements[self.rank].held_rows
        if self.rank:
            rows = x[mine.to(x.device)]
            self.transport.send(self.rank, 0, (t, tag, -1, str(rows.dtype), tuple(rows.shape)), rows)
            self.transport.flush(self.rank)
            return None
        full = x.clone()
        for r in range(1, self.world):
            theirs = self.placements[r].held_rows
            header = (t, tag, -1, str(x.dtype), (int(theirs.numel()), *x.shape[1:]))
            full[theirs.to(x.device)] = self.transport.recv(r, 0, header).to(x.device)
        return full

    def _counts(self, tag: str, t: int, rows: list[list[int]]) -> list | None:
        """Every process's rows of integers (process 0: the list of each process's), or None (the others, after
        sending). Every process has the same number of rows (its meter's tags, in the same order everywhere)."""
        mine = torch.tensor(rows, dtype=torch.int64) if rows else torch.zeros((0, 3), dtype=torch.int64)
        if self.rank:
            self.transport.send(self.rank, 0, (t, tag, -1, str(mine.dtype), tuple(mine.shape)), mine)
            self.transport.flush(self.rank)
            return None
        return [rows] + [self.transport.recv(r, 0, (t, tag, -1, str(mine.dtype), tuple(mine.shape))).tolist()
                         for r in range(1, self.world)]

    def record(self, t: int, x: torch.Tensor, totals: tuple[int, int]) -> None:
        full = self._gather(RECORD, t, x)
        counts = self._counts(BYTES, t, [list(totals)])
        if full is not None:
            self.bytes.record([c[0] for c in counts])
            self.on_record(t, full)

    def per_tag(self, tag: str, t: int, per_tag: dict) -> dict | None:
        """The network's per-tag byte counts since the (re)start, added up at process 0 (the others: None)."""
        names = list(per_tag)
        rows = [[v["bytes_sent"], v["bytes_received"], v["messages"]] for v in per_tag.values()]
        got = self._counts(tag, t, rows)
        if got is None:
            return None
        return self.bytes.add([{name: dict(zip(("bytes_sent", "bytes_received", "messages"), row))
                                for name, row in zip(names, part)} for part in got])

    def saved(self, t: int, per_tag: dict) -> None:
        """Every process wrote its agents' files of round t (and sent its meter's counts); process 0 then writes
        the recorder's (completing it)."""
        counts = self.per_tag(SAVED, t, per_tag)
        if counts is None:
            return
        self.bytes.at_checkpoint = counts
        records, sums, counts_ = self.recorder.state()
        self.checkpoints.save_run(RunState(t, None, 0, torch.zeros(0), records, sums, counts_,
                                           [o.state_dict() for o in stateful(self.watchers)]))


def run_one_distributed(spec, components, *, rank: int, world: int, timeout: float, checkpoints=None,
                        resume: bool = False, on_step=None):
    """One run as this process's slice; process 0 returns (records, final models, accesses, seconds, extra)."""
    from privdl.experiment.runner import observers

    c, cfg = components, spec.config
    n = c.network.n
    if cfg.get("device", "cpu") not in ("cpu", None):
        raise ValidationError("the distributed runtime runs its processes on the CPU (gloo); a run on a GPU is not "
                              "built yet: remove device or set it to \"cpu\"")
    watching = observers(cfg, c, n)  # the eavesdropper of a streaming task: fed by process 0's wire
    placements = placements_for(cfg, n, world)
    owner = owners_of(placements, n)
    p = placements[rank]
    transport = DistTransport(rank, world, [q.agents for q in placements], timeout=timeout)
    marks = set(recorded_rounds(cfg["iterations"], cfg["eval_every"] or cfg["iterations"]))
    network_bytes = NetworkBytes()
    watchers = [*watching, network_bytes]  # the simulator's order: observers, then the meter
    recorder = Recorder(c.task, watchers, 1, n) if rank == 0 else None
    wire = DistWire(rank, world, transport, watching) if watching else None

    def complete(t: int, x: torch.Tensor) -> None:
        c.task.at_round(t)
        recorder(t, x)

    last = None
    if checkpoints is not None and resume:
        box = [checkpoints.latest() if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)  # control: the round every agent has, decided once
        last = box[0]
        if last is not None and rank == 0:
            st = checkpoints.load_run(last, RunState(last, None, 0, torch.zeros(0)))
            recorder.load(st.records, st.sums, st.counts)
            for o, d in zip(stateful(watchers), st.observers):
                o.load_state_dict(d)
    coordinator = _Coordinator(transport, placements, complete, checkpoints, recorder, network_bytes, watchers)
    root = RootKeys(int(cfg["seed"]))
    agreed = cfg.get("runtime", {}).get("keys", "root") == "agreed"
    began = time.perf_counter()
    source = root if not agreed else agree(part=rank, placement=p, owner=owner, network=c.network,
                                           groups=shared_groups(c.mechanism, n), transport=transport, public=root,
                                           context=spec.run_id)
    setup = time.perf_counter() - began
    keys = Keys(HeldKeys(source, p.held), n)
    start = time.perf_counter()
    with secure_draws(source.salt if agreed else None):  # agreed keys: draws that do not give their keys away
        final, accesses, _, meter = run_slice(
            part=rank, placement=p, owner=owner, network=c.network, task=HeldTask(c.task, p), keys=keys,
            mechanism=c.mechanism, algorithm=c.algorithm, schedule=c.schedule, iterations=cfg["iterations"], x0=None,
            gradient=cfg["gradient"], marks=marks, transport=transport, wire=wire, record=coordinator.record,
            on_step=on_step if rank == 0 else None, checkpoints=checkpoints, resume=resume, last=last,
            saved=coordinator.saved)
    models = coordinator._gather(FINAL, cfg["iterations"], final)
    counts = coordinator._gather(ACCESSES, cfg["iterations"], accesses.reshape(-1, 1))
    seconds = time.perf_counter() - start
    sent = torch.zeros(3, world, dtype=torch.int64)
    sent[0, rank] = int(transport.payload_bytes.sum())
    sent[1, rank] = int(transport.setup_bytes)
    sent[2, rank] = int(transport.control_bytes)
    dist.all_reduce(sent)  # control: bytes each process sent, for the manifest
    per_tag = coordinator.per_tag(BYTES, cfg["iterations"], meter.per_tag())  # the agents' bytes per tag
    if rank:
        return None
    control = sent[2].sum()
    extra = {"backend": "dist", "processes": world, "slices": [list(q.agents) for q in placements],
             "payload_bytes": int(sent[0].sum()), "payload_bytes_per_process": sent[0].tolist(),
             **({"setup_bytes": int(sent[1].sum()), "setup_seconds": setup} if agreed else {}),
             "control_messages": transport.control_messages, "control_bytes": int(control),
             "resumed_from_round": last,
             "bytes": per_tag}
    return recorder.records[0], models.cpu(), counts.reshape(-1), seconds, extra


def init_process_group(*, rank: int, world: int, init_method: str | None, timeout: float) -> None:
    kw = {"init_method": init_method} if init_method else {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout), **kw)
    except (RuntimeError, ValueError) as exc:
        import os

        restarted = (int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
                     and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1")
        raise PrivdlError(f"process {rank} of {world} could not join the others ({str(exc).splitlines()[0][:200]}): "
                          "check MASTER_ADDR / MASTER_PORT (reachable, the port free on the master), and on several "
                          "hosts GLOO_SOCKET_IFNAME (one interface name, e.g. eth0)" +
                          ("; restarted by torchrun: start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (with "
                           "the store it shares by default, restarted workers can read a previous attempt's "
                           "addresses: pytorch/pytorch#135712)" if restarted else "")) from None


__all__ = ["placements_for", "run_one_distributed", "init_process_group"]


def run_experiment_distributed(cfg: dict, out: str | Path, *, rank: int, world: int, timeout: float,
                               resume: bool = False, progress: bool = False) -> list[str]:
    """Every run of ``cfg`` not finished in ``out``, each split over the ``world`` processes (this one: ``rank``);
    process 0 writes the results (and, with ``progress``, a line per finished run on stderr). Returns the run ids
    executed."""
    import sys
    import shutil

    from privdl.experiment.build import build
    from privdl.experiment.config import expand
    from privdl.experiment.runner import distinct_runs, checkpoint_identity, finished_run, intra_op_threads
    from privdl.experiment.store import ResultStore

    runs, axes = expand(cfg)
    store = ResultStore(out)
    if rank == 0:
        store.claim(cfg)
        store.check_writable()
    unique = distinct_runs(runs, None)
    box = [[r.run_id for r in unique if not store.is_done(r.run_id)] if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # control: process 0 decides which runs are left
    todo = [r for r in unique if r.run_id in set(box[0])]
    if progress and rank == 0:
        print(f"{cfg.get('name', 'experiment')}: {len(todo)} of {len(unique)} runs to do on {world} processes",
              file=sys.stderr, flush=True)
    for done, spec in enumerate(todo, 1):
        began = time.perf_counter()
        c = build(spec.config)
        every = spec.config.get("runtime", {}).get("checkpoint_every")
        ck = None
        if every:  # every process writes its agents' files into the run's folder (a folder all of them see)
            ck = Checkpoints([store.run_dir(spec.run_id) / "checkpoints"], [checkpoint_identity(spec)],
                             n=c.network.n, every=int(every))
            if rank == 0 and not resume:
                ck.clear()
        dist.barrier()  # process 0 removed stale checkpoints (without --resume) before anyone writes
        with intra_op_threads(spec.config, c.task, c.network.n, c.mechanism.need):  # the runner's thread rule
            got = run_one_distributed(spec, c, rank=rank, world=world, timeout=timeout, checkpoints=ck,
                                      resume=resume)
        if rank == 0:
            rows, final, accesses, seconds, extra = got
            rows, man = finished_run(spec, c, rows, seconds=seconds, accesses=accesses)
            resumed = extra.pop("resumed_from_round")
            man["bytes_per_tag"] = extra.pop("bytes")
            man["placement"] = extra
            if ck is not None:
                man["checkpoints"] = {"every": ck.every, "resumed_from_round": resumed}
            store.save_run(spec.run_id, rows, man)
            if ck is not None:
                shutil.rmtree(store.run_dir(spec.run_id) / "checkpoints", ignore_errors=True)
            if progress:
                label = ", ".join(f"{k}={v}" for k, v in spec.sweep.items() if v is not None) or spec.run_id
                print(f"  run {done}/{len(todo)} ({label}) done in {time.perf_counter() - began:.1f} s",
                      file=sys.stderr, flush=True)
    if rank == 0:
        store.write_results(axes, [(r.run_id, r.sweep) for r in runs])
    return [s.run_id for s in todo]


__all__ += ["run_experiment_distributed"]
