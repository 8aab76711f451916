"""A process of the distributed runtime: it holds one slice of agents of every run of an experiment.

Every process expands the same config into the same runs and runs each of them as one slice of
:func:`privdl.simulator.sliced.run_slice` — the sliced backend's engine — over a :class:`DistTransport`. The
placement is a pure function of (config, world size, rank): contiguous blocks of agents, ``runtime.assignment``
when given. Process 0 is the coordinator: it decides which runs are left (a finished run in ``--out`` is kept),
receives the metrics' scalars at the recorded rounds (each process evaluates its own agents; the last one sums the
models into their average: :meth:`privdl.simulator.coordinator.Coordinator._local_metrics`), merges the access
counts behind the ledger, completes checkpoints and writes results, manifests and results.csv into ``--out`` as a
simulator run does. Each process writes its agents' checkpoint files in its own ``--out`` and removes them once the
run is saved.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import torch
import torch.distributed as dist

from privdl.agreement import agree, config_options, keys_facts, shared_groups
from privdl.errors import ConfigError, PrivdlError, ValidationError
from privdl.keys import HeldKeys, Keys, RootKeys, drawn
from privdl.placement import Placement, partition
from privdl.comm.transport import TransportError
from privdl.comm.wire import Wire
from privdl.runtime.transport import DistTransport, all_max, broadcast_bytes, broadcast_ints
from privdl.runtime_spec import RuntimeSpec
from privdl.simulator.checkpoint import Checkpoints
from privdl.simulator.coordinator import BYTES, DRAWS, Coordinator
from privdl.simulator.engine import recorded_rounds
from privdl.simulator.sliced import choose_frame, owners_of, run_slice
from privdl.tasks.held import HeldTask

#: tag of each process's facts for the manifest (control)
PROCESS = "privdl/process"
#: the generators whose numbers a run counts (privdl.keys.DRAWN), in the order process 0 receives them
GENERATORS = ("chacha20", "splitmix64", "philox")


def process_started() -> float:
    """When this process started (seconds since the epoch): from /proc on Linux (the kernel's start time of the
    process), else when this module was first imported."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat(5): start time after boot, in clock ticks
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        import os

        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


_IMPORTED = time.time()
#: the facts of each process behind the manifest's ``placement.per_process`` (float64 columns; the host apart)
PER_PROCESS = ("peak_rss_bytes", "round_seconds_median", "startup_seconds")
HOST_BYTES = 64  # a host name travels as this many bytes (UTF-8, zero-padded; longer names cut)


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (getrusage; Linux reports KiB, macOS bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class RoundClock:
    """Times the rounds of one run in this process (each round: from the end of the previous one to its end, the
    first from the loop's start); ``median`` over them."""

    def __init__(self, then) -> None:
        self.then, self.seconds = then, []

    def __call__(self, t: int) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self.then)
        self.then = now

    @property
    def median(self) -> float:
        import statistics

        return float(statistics.median(self.seconds)) if self.seconds else float("nan")


def placements_for(cfg: dict, n: int, world: int) -> list[Placement]:
    """The placement of every process: a pure function of the config, the network's size and the world size."""
    runtime = RuntimeSpec.of(cfg)
    per = runtime.agents_per_process
    if per:
        blocks = [list(range(lo, min(n, lo + per))) for lo in range(0, n, per)]
        if len(blocks) != world:
            raise ValidationError(f"runtime.agents_per_process = {per} places {n} agents on {len(blocks)} "
                                  f"processes; {world} were started (start {len(blocks)}, or change it)")
        return partition(n, assignment=blocks)
    if world > n:
        raise ValidationError(f"{world} processes for {n} agents: every process must hold at least one agent "
                              f"(use at most {n} processes)")
    parts = partition(n, slices=None if runtime.assignment else world, assignment=runtime.assignment)
    if len(parts) != world:
        raise ValidationError(f"runtime.assignment has {len(parts)} parts for {world} processes: process "
                              f"{min(len(parts), world)} would " + ("hold no agent and receive no message"
                                                                      if world > len(parts) else
                                                                      "not be started, and its agents' neighbours "
                                                                      "would never get their messages") +
                              f" (start {len(parts)} processes, or give {world} parts)")
    return parts


def check_placements(cfg: dict, world: int) -> None:
    """Refuse, before any run starts, an experiment with a run that ``world`` processes cannot hold (every process
    would refuse it alike, but only when that run comes, after the runs before it): an assignment of another
    number of parts, an agent placed twice or nowhere, a process with no agent — e.g. one assignment over a
    ``[sweep]`` of ``network.n``. The error names the run. An assignment that covers every agent once leaves no
    process without a message it needs: each process receives its agents' in-neighbours' rows from the processes
    holding them (:class:`privdl.comm.sliced.SliceComm`)."""
    import json

    from privdl.experiment.build import build_network
    from privdl.experiment.config import expand
    from privdl.experiment.loop_steps import run_label

    seen: set[str] = set()
    for spec in expand(cfg)[0]:
        c = spec.config
        runtime = RuntimeSpec.of(c)
        key = json.dumps([c["network"], c["seed"] if c["network"].get("seed") == "run" else None,
                          runtime.assignment, runtime.agents_per_process], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            placements_for(c, build_network(c["network"], c["seed"], c.get("base_dir")).n, world)
        except ValidationError as exc:
            raise ValidationError(f"run {run_label(spec)}: {exc}") from None


def run_one_distributed(spec, components, *, rank: int, world: int, timeout: float, checkpoints=None,
                        resume: bool = False, on_step=None, secrets: Path | None = None,
                        secrets_identity: dict | None = None, since: float | None = None):
    """One run as this process's slice; process 0 returns (records, None, accesses, seconds, extra): the final
    models stay with the processes that hold them (no run writes them; a checkpoint does, by its holder).
    ``secrets``: the folder of an agreed-key run's agent secrets (each process writes and reads its agents').
    ``since``: when this process began working towards the run (epoch seconds; default: the process's start) —
    the start of its ``startup_seconds`` in the manifest's ``placement.per_process``."""
    from privdl.experiment.backends import observers

    c, cfg = components, spec.config
    n = c.network.n
    device = run_device(cfg, rank, world)  # refused here, by reason, if this process cannot have it
    watching = observers(cfg, c, n)  # the eavesdropper of a streaming task: fed by process 0's wire
    # before any message, alike in every process: the held frame where the run allows it (an explicit "held" that
    # it does not is refused by reason), else the network frame and why
    frame, not_held = choose_frame(RuntimeSpec.of(cfg).frame, c.algorithm, c.mechanism)
    placements = placements_for(cfg, n, world)
    owner = owners_of(placements, n)
    p = placements[rank]
    task = place_on(device, c.task, HeldTask(c.task, p))
    transport = DistTransport(rank, world, [q.agents for q in placements], timeout=timeout, device=device)
    marks = set(recorded_rounds(cfg["iterations"], cfg["eval_every"] or cfg["iterations"]))
    # metrics where the agents live: process 0 receives scalars on a recorded round, never the models
    coordinator = Coordinator(transport, rank, placements, task=c.task, observers=watching, checkpoints=checkpoints,
                              local_metrics=True, held_frame=frame == "held")
    wire = Wire(rank, world, transport, watching) if watching else None
    saved = _pruning(coordinator, checkpoints, c.network, placements, owner, rank)
    last = None
    if checkpoints is not None and resume:
        last = _resume_round(checkpoints, transport, p, rank)
        coordinator.load(last)
    elif checkpoints is not None and rank:  # a fresh start: this host's files of an earlier attempt go (process 0
        checkpoints.held_by(p.agents).remove_held()  # cleared the whole folder; another host's is only its own)
    root = RootKeys(int(cfg["seed"]))
    agreed = RuntimeSpec.of(cfg).agreed
    before = drawn()
    began = time.perf_counter()
    source = root if not agreed else agree(part=rank, placement=p, owner=owner, network=c.network,
                                           groups=shared_groups(c.mechanism, n), transport=transport, public=root,
                                           context=spec.run_id, store=secrets, store_identity=secrets_identity,
                                           **config_options(cfg, n, p.agents))
    setup = time.perf_counter() - began
    keys = Keys(HeldKeys(source, p.held), n)
    start = time.perf_counter()
    startup = time.time() - (process_started() if since is None else since)
    clock = RoundClock(start)

    def step(t: int) -> None:
        clock(t)
        if on_step is not None and rank == 0:
            on_step(t)

    final, accesses, _, meter = run_slice(
        part=rank, placement=p, owner=owner, network=c.network, task=task, keys=keys,
        mechanism=c.mechanism, algorithm=c.algorithm, schedule=c.schedule, iterations=cfg["iterations"], x0=None,
        gradient=cfg["gradient"], marks=marks, transport=transport, wire=wire, record=coordinator.record,
        on_step=step, checkpoints=checkpoints, resume=resume, last=last, saved=saved, held_rows=True,
        frame=frame)
    after = drawn()
    draws = coordinator.counts(DRAWS, cfg["iterations"], [[after[k] - before[k] for k in GENERATORS]])
    ends = coordinator.finals(cfg["iterations"], None, accesses)  # the final models stay with their holders
    seconds = time.perf_counter() - start
    per_tag = coordinator.per_tag(BYTES, cfg["iterations"], meter.per_tag())  # the agents' bytes per tag
    # the bytes each process sent travel with its facts to process 0 (no collective: a dead or hung peer is named
    # by the transport, within the run's timeout, as in the rounds)
    sent = [int(transport.payload_bytes.sum()), int(transport.setup_bytes), int(transport.control_bytes)]
    got = _per_process(transport, rank, cfg["iterations"], placements, [peak_rss_bytes(), clock.median, startup],
                       sent)
    if rank:
        return None
    per_process, sent = got
    control = sent[2].sum()
    extra = {"backend": "dist", "frame": frame, **({"frame_reason": not_held} if not_held else {}),
             "processes": world, "slices": [list(q.agents) for q in placements],
             "payload_bytes": int(sent[0].sum()), "payload_bytes_per_process": sent[0].tolist(),
             **({"setup_bytes": int(sent[1].sum()), "setup_seconds": setup} if agreed else {}),
             "control_messages": transport.control_messages, "control_bytes": int(control),
             "resumed_from_round": last, "per_process": per_process,
             "control_bytes_received": {str(t): transport.control_received.get(t, 0) for t in sorted(marks)},
             "bytes": per_tag,
             "keys": keys_facts(cfg, restored=bool(getattr(source, "restored", False)), gathered="process 0",
                                summed=f"process {coordinator.mean_holder}" if coordinator.local else None,
                                draws={k: sum(int(part[0][j]) for part in draws) for j, k in enumerate(GENERATORS)})}
    return coordinator.records, None, ends[1].reshape(-1), seconds, extra


def host_place(rank: int, world: int, env: dict | None = None) -> tuple[int, int]:
    """This process's (local rank, processes on its host): ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` where set
    (torchrun sets them; so does ``privdl run --procs K``'s launcher), else (``rank``, ``world``): one host."""
    import os

    env = os.environ if env is None else env
    local, local_world = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
    if local is None or local_world is None:
        return int(rank), int(world)
    return int(local), int(local_world)


def run_device(cfg: dict, rank: int, world: int) -> torch.device:
    """The device of process ``rank`` of ``world`` for run config ``cfg``: :func:`privdl.device.process_device` of
    the run's ``device`` and ``runtime.transport``, the process's place on its host (:func:`host_place`) and the
    GPUs it sees — refused, naming the process and why, where it cannot have it. NCCL is refused here too (not
    built: :func:`privdl.device.check_transport`), for a torchrun start that no launcher checked."""
    from privdl.device import check_transport, process_device, visible_gpus

    local, local_world = host_place(rank, world)
    runtime = RuntimeSpec.of(cfg)
    gpus = visible_gpus()
    device = process_device(cfg.get("device", "cpu"), local_rank=local, local_world=local_world, gpus=gpus,
                            transport=runtime.transport, who=f"process {rank} of {world}")
    check_transport(runtime, local_world, gpus, cfg.get("device", "cpu"))
    return device


def place_on(device: torch.device, task, held: HeldTask) -> HeldTask:
    """Put this process's run on ``device``: on a GPU it becomes the process's current device (what torch
    allocates on by default), the engine's task — its agents' examples only (``held``, restricted on the CPU
    first) — and the whole task (the coordinator's evaluation: the test and training-evaluation sets, as the
    simulator keeps them) move there; the engine's Comm moves its indices there
    (:func:`privdl.simulator.sliced.run_slice`), and the draws stay on the CPU's keyed streams (the same numbers
    on every device). On the CPU nothing moves. Returns ``held``."""
    if device.type == "cpu":
        return held
    torch.cuda.set_device(device)
    task.to(device)
    held.to(device)
    return held


def _resume_round(checkpoints: Checkpoints, transport: DistTransport, p: Placement, rank: int) -> int | None:
    """The round to resume from: the newest one every process's own files complete (its agents', and process 0's
    recorder file), agreed by control messages before the rounds — each process reads only its own folder, so
    hosts need not share one (each host's ``--out`` holds its agents' checkpoints). None: no checkpoint anywhere; a
    checkpoint with no round common to all processes is refused by every process alike."""
    import warnings

    from privdl.simulator.checkpoint import CheckpointError, agreed_round

    mine = checkpoints.held_by(p.agents, writes_run=rank == 0).held_rounds()
    last = agreed_round(mine, lambda v: transport.agree_max(rank, v))
    if last is None:
        if transport.agree_max(rank, int(bool(mine))):
            raise CheckpointError(f"no checkpoint round is complete on every process (process {rank} has "
                                  f"{mine or 'none'} in {checkpoints.folders[0]}): nothing to resume from (delete "
                                  "the checkpoints folders to start over)")
        return None
    if mine and mine[-1] > last:
        warnings.warn(f"process {rank}: checkpoint round {mine[-1]} is not complete on every process; resuming "
                      f"from round {last}, the last round every process has", stacklevel=2)
    return last


def _pruning(coordinator: Coordinator, checkpoints: Checkpoints | None, network, placements: list[Placement],
             owner, rank: int):
    """What a process does once it saved its agents' files of a checkpointed round: report it (the coordinator's
    ``saved``), then — any process but 0, whose folder process 0 may not see — remove its own files of the rounds
    known complete everywhere but the newest ones kept (:mod:`privdl.runtime.pruning`; a time-varying graph, or
    a process no path reaches, leaves them to the end of the run)."""
    from privdl.runtime.pruning import lag, prune_before

    if checkpoints is None or rank == 0 or getattr(network, "dynamics", None) is not None:
        return coordinator.saved
    behind = lag(network.edges.src.long().cpu().numpy(), network.edges.dst.long().cpu().numpy(), owner, rank,
                 len(placements))
    if behind is None:
        return coordinator.saved
    mine = checkpoints.held_by(placements[rank].agents)

    def saved(t: int, per_tag: dict) -> None:
        coordinator.saved(t, per_tag)
        before = prune_before(Checkpoints._rounds(mine.folders[0]), t, behind, mine.keep)
        if before is not None:
            mine.remove_held(before)

    return saved


#: the byte counts each process sends process 0 with its facts: payload, setup and control bytes it sent
SENT = ("payload_bytes", "setup_bytes", "control_bytes")


def _per_process(transport: DistTransport, rank: int, t: int, placements: list[Placement],
                 facts: list[float], sent: list[int]) -> tuple[list[dict], torch.Tensor] | None:
    """Every process's facts (:data:`PER_PROCESS`, its host and agents) and the bytes it sent (:data:`SENT`) at
    process 0 — one control message of a few numbers from each, after the rounds, through the transport (a peer
    that died or hangs is named within the timeout) —: the manifest's ``placement.per_process``, and the (3,
    processes) int64 table of the bytes; the others get None. (Byte counts travel as float64: exact below 2⁵³.)"""
    import socket

    host = socket.gethostname().encode()[:HOST_BYTES]
    mine = torch.tensor([float(v) for v in facts] + [float(v) for v in sent] + list(host.ljust(HOST_BYTES, b"\0")),
                        dtype=torch.float64)
    got = transport.gather(rank, t, PROCESS, mine, [tuple(mine.shape)] * len(placements))
    if got is None:
        return None
    out = []
    table = torch.zeros(len(SENT), len(placements), dtype=torch.int64)
    for k, (value, p) in enumerate(zip(got, placements)):
        v = value.tolist()
        facts = dict(zip(PER_PROCESS, v[:len(PER_PROCESS)]))
        table[:, k] = torch.tensor([int(b) for b in v[len(PER_PROCESS):len(PER_PROCESS) + len(SENT)]])
        v = v[:len(PER_PROCESS)] + v[len(PER_PROCESS) + len(SENT):]
        name = bytes(int(b) for b in v[len(PER_PROCESS):]).rstrip(b"\0").decode(errors="replace")
        out.append({"rank": k, "host": name, "agents": list(p.agents), "peak_rss_bytes": int(facts["peak_rss_bytes"]),
                    "round_seconds_median": facts["round_seconds_median"],
                    "startup_seconds": facts["startup_seconds"]})
    return out, table


def _attempt_store(world: int, timeout: float):
    """The rendezvous store of this torchrun attempt: torchrun's agent hosts one TCP store for the whole job
    (``TORCHELASTIC_USE_AGENT_STORE=True``, the default since torch 2.5) and torch's ``env://`` joins it without a
    prefix, so a restarted worker reads the previous attempt's keys — the dead workers' addresses and barrier
    counts — and cannot connect (pytorch/pytorch#135712). Here every attempt has its own keys,
    ``privdl/attempt-<TORCHELASTIC_RESTART_COUNT>/``: the restart count is the same on every worker of one agent
    (``--standalone``, or one torchrun per host with static ranks, where a failure fails every host)."""
    import os

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                           timeout=datetime.timedelta(seconds=timeout))
    return dist.PrefixStore(f"privdl/attempt-{attempt}/", client)


def init_process_group(*, rank: int, world: int, init_method: str | None, timeout: float, port: int | None = None,
                       listen_fd: int | None = None) -> None:
    """Join the gloo process group with the run's timeout; a rendezvous that fails is a :class:`PrivdlError` with
    what to check. Under torchrun's shared store (its default), each restart attempt rendezvouses under its own
    prefix (:func:`_attempt_store`), so ``--max-restarts`` works without ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.

    gloo connects lazily (``TORCH_GLOO_LAZY_INIT=1`` unless the environment says otherwise): a pair of processes
    connects when it first exchanges — neighbours, process 0 with the others (its orders and gathers), the ring of
    the few collectives at the launch's start — instead of the full mesh gloo builds at init (K(K−1)/2 pairs; it
    fails above ~150 processes on one host, pytorch#59256). The launch's first collectives
    (:func:`check_same_launch`) come right after the rendezvous, so a peer that died before first contact is met
    early (gloo#520).

    ``port`` (a local launch, :func:`privdl.runtime.launch.launch`): the rendezvous store on 127.0.0.1:``port``,
    served by process 0 on the launcher's listening socket ``listen_fd`` (:func:`privdl.runtime.launch.reserve_port`:
    held from the port's choice on, so no other program can take it); the others connect to it."""
    import os

    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    kw = {"init_method": init_method} if init_method else {}
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    shared = (port is None and init_method in (None, "env://")
              and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
    try:
        if shared:
            kw = {"store": _attempt_store(world, timeout)}
        elif port is not None:
            kw = {"store": dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, master_listen_fd=listen_fd,
                                         timeout=datetime.timedelta(seconds=timeout))}
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout), **kw)
    except (RuntimeError, ValueError) as exc:
        if port is not None:
            raise PrivdlError(f"process {rank} of {world} could not join the others "
                              f"({str(exc).splitlines()[0][:200]}): the launcher's rendezvous on 127.0.0.1:{port} did "
                              "not answer — most likely process 0, which serves it, did not start or stopped first "
                              "(the launcher reports its own error, if any)") from None
        raise PrivdlError(f"process {rank} of {world} could not join the others ({str(exc).splitlines()[0][:200]}): "
                          "check MASTER_ADDR / MASTER_PORT (reachable, the port free on the master), and on several "
                          "hosts GLOO_SOCKET_IFNAME (one interface name, e.g. eth0)" +
                          ("; restarted by torchrun (attempt "
                           f"{os.environ.get('TORCHELASTIC_RESTART_COUNT')}): if the hosts' torchrun agents count "
                           "restarts differently (c10d rendezvous over several hosts), start torchrun with "
                           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (each attempt then rendezvouses on a store of its "
                           "own: pytorch/pytorch#135712)" if restarted and shared else "")) from None


__all__ = ["check_placements", "host_place", "init_process_group", "place_on", "placements_for",
           "run_device", "run_one_distributed"]


#: config keys that may differ between the hosts of one launch (paths on each host, this host's own identities)
HOST_KEYS = ("base_dir", "runtime.identity_dir", "runtime.roster", "runtime.procs")


def _flat(table: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{name}."))
        else:
            out[name] = v
    return out


def launch_facts(cfg: dict) -> dict[str, str]:
    """What every process of one launch must share, as text: the config (less :data:`HOST_KEYS`), privdl's
    version and source digest, torch's version."""
    import json

    import privdl

    config = {k: v for k, v in _flat(cfg).items() if k not in HOST_KEYS}
    return {"config": json.dumps(config, sort_keys=True, default=str),
            "privdl": f"{privdl.__version__} (source {privdl.source_hash()})", "torch": torch.__version__}


def check_same_launch(cfg: dict, rank: int, world: int) -> None:
    """Refuse, on every process, a launch whose processes run different configs, privdl sources or torch versions
    (hosts started with different files or installs): process 0's facts (:func:`launch_facts`) reach the others as
    bytes of JSON text — parsed, never unpickled —, each compares them with its own, and one maximum over the
    processes tells every process whether any differs; the error names the differing keys or versions."""
    import json

    mine = launch_facts(cfg)
    got = broadcast_bytes(json.dumps(mine).encode() if rank == 0 else None, what="process 0's config and versions")
    theirs = json.loads(got.decode())
    differ = []
    if theirs.get("config") != mine["config"]:
        a, b = json.loads(theirs.get("config", "{}")), json.loads(mine["config"])
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        differ.append("config (" + ", ".join(f"{k}: {b.get(k, '(absent)')!r} here, {a.get(k, '(absent)')!r} at "
                                             "process 0" for k in keys[:5]) + (" …" if len(keys) > 5 else "") + ")")
    for name in ("privdl", "torch"):
        if theirs.get(name) != mine[name]:
            differ.append(f"{name} {mine[name]} here, {theirs.get(name)} at process 0")
    anyone = all_max(1 if differ else 0, who=f"process {rank}", what="compare their configs")
    if differ:
        raise PrivdlError(f"process {rank} of {world} runs another launch than process 0: " + "; ".join(differ) +
                          " — start every host with the same config and the same privdl and torch")
    if anyone:
        raise PrivdlError(f"process {rank} of {world}: another process runs a different config, privdl or torch "
                          "than process 0 (its error names the difference)")


def claim_outputs(store, cfg: dict, rank: int, world: int) -> None:
    """Every process claims its own ``--out`` (:meth:`~privdl.experiment.store.ResultStore.claim`: on one host, or
    hosts sharing a folder, they join one claim; on a host process 0 cannot see, this one's agents' checkpoint and
    key files will go there) before anything runs: a folder holding another experiment's results or agents' files
    is refused — on every process at once, through one maximum over the processes — with the folder and the keys
    at which the two experiments differ named by the process that holds it; the same experiment is joined (its
    runs resumed or skipped, as a single process does)."""

    refused: PrivdlError | None = None
    try:
        store.claim(cfg)
        store.check_writable()
    except PrivdlError as exc:
        refused = exc
    worst = all_max(rank + 1 if refused is not None else 0, who=f"process {rank}",
                    what="check their --out folders")
    if refused is not None:
        raise refused
    if worst:
        raise ConfigError(f"process {worst - 1} of {world}: its --out cannot hold this experiment (its "
                          "error names the folder and how the experiments differ)")


#: process 0's orders to the others, one int64 pair (order, index of the run in the distinct runs) each
END, RUN, WAIT, ABORT = 0, 1, 2, 3


def _orders(cfg: dict, store, unique: list, todo: list[int], *, timeout: float, say):
    """Process 0's orders, one at a time: run ``unique[i]`` (this launch holds its lock), wait (runs other processes
    sharing ``--out`` hold: ask again), or end — the experiment loop's choice of runs
    (:func:`privdl.experiment.loop_steps.take_runs`: the runner's per-run locks, so two launches on one folder never run a
    run twice; a run whose holder is gone is taken over and run here). Each order comes with the runs taken so far."""
    from privdl.experiment.loop_steps import WAIT_POLL, take_runs, waiting_note

    index = {unique[i].run_id: i for i in todo}
    ran: list[int] = []
    for group in take_runs(store, [[unique[i]] for i in todo],
                           say=lambda held: say(waiting_note(cfg, store, held))):
        if group:
            ran.append(index[group[0].run_id])
            yield RUN, ran[-1], ran
        else:
            time.sleep(min(WAIT_POLL, timeout / 4))  # the others wait in a broadcast: answer well within the timeout
            yield WAIT, -1, ran
    yield END, -1, ran


def run_experiment_distributed(cfg: dict, out: str | Path, *, rank: int, world: int, timeout: float,
                               resume: bool = False, progress: bool = False):
    """Every run of ``cfg`` not finished in ``out``, each split over the ``world`` processes (this one: ``rank``);
    process 0 takes each run's lock in ``out`` as the simulator's runner does (a second launch on the same folder
    runs what is left, waits for what the first holds, never repeats a run), writes the results and, with
    ``progress``, a line per finished run on stderr. Process 0 returns the
    :class:`~privdl.experiment.outcome.ExperimentSummary` (the others: None). Every decision reaches the other
    processes as integers (:func:`~privdl.runtime.transport.broadcast_ints`): nothing received is unpickled."""
    import sys

    from privdl.agreement.keystore import forget
    from privdl.experiment.build import build
    from privdl.experiment.config import expand
    from privdl.experiment.loop_steps import check_inputs_unchanged, distinct_runs, run_label, save_finished
    from privdl.experiment.outcome import ExperimentSummary
    from privdl.experiment.run_manifest import finished_run
    from privdl.experiment.run_state import checkpoint_identity, secrets_folder, secrets_identity
    from privdl.experiment.store import ResultStore
    from privdl.experiment.threads import intra_op_threads

    started = time.perf_counter()
    check_same_launch(cfg, rank, world)
    check_placements(cfg, world)  # the same config on every process: all refuse alike, before any claim
    runs, axes = expand(cfg)
    store = ResultStore(out)
    unique = distinct_runs(runs, None)  # the same list, in the same order, on every process
    claim_outputs(store, cfg, rank, world)
    orders = None
    if rank == 0:
        try:
            todo = [i for i, r in enumerate(unique) if not store.is_done(r.run_id)]
            check_inputs_unchanged(store, (r for i, r in enumerate(unique) if i not in todo))
        except BaseException:  # tell the others at once (they wait for process 0's first order), then say why
            broadcast_ints([ABORT, -1], 2, what="the next run")
            raise
        if progress:
            print(f"{cfg.get('name', 'experiment')}: {len(todo)} of {len(unique)} runs to do on {world} processes",
                  file=sys.stderr, flush=True)
        orders = _orders(cfg, store, unique, todo, timeout=timeout,
                         say=lambda note: print(note, file=sys.stderr, flush=True) if progress else None)
    ran: list[int] = []
    nonfinite: dict[str, list[str]] = {}
    saved: tuple | None = None  # (secrets folder, this process's agents, checkpoints) of the run process 0 saved last
    first = True  # this process's first run: its start-up counts from the process's start
    while True:
        order = next(orders) if rank == 0 else None
        if order is not None:
            ran = order[2]
        kind, i = broadcast_ints(None if order is None else list(order[:2]), 2, what="the next run")
        if saved is not None:  # process 0 saved that run before this order: this process's secrets of it go
            forget(*saved[:2])
            if saved[2] is not None:  # and its checkpoint files on this host (process 0 removed its folder)
                ck_done = saved[2]
                ck_done.held_by(saved[1]).remove_held()
            saved = None
        if kind == END:
            break
        if kind == ABORT:
            raise TransportError(f"process {rank}: process 0 stopped before the first run (its error says why)")
        if kind == WAIT:
            continue
        if kind != RUN or not 0 <= i < len(unique):
            raise PrivdlError(f"process {rank}: process 0 sent an unknown order ({kind}, {i})")
        spec = unique[i]
        began = time.perf_counter()
        ordered = None if first else time.time()  # the start-up of a later run: from its order on
        first = False
        try:
            c = build(spec.config)
            every = RuntimeSpec.of(spec.config).checkpoint_every
            ck = None
            if every:  # every process writes its agents' files into the run's folder (a folder all of them see)
                ck = Checkpoints([store.run_dir(spec.run_id) / "checkpoints"], [checkpoint_identity(spec)],
                                 n=c.network.n, every=int(every))
                if rank == 0 and not resume:
                    ck.clear()
            broadcast_ints([1], 1, what="the go-ahead for the run")  # after process 0 removed stale checkpoints
            secrets = secrets_folder(store.run_dir(spec.run_id))  # each process: its agents' files (agreed keys)
            with intra_op_threads(spec.config, c.task, c.network.n, c.mechanism.need):  # the runner's thread rule
                got = run_one_distributed(spec, c, rank=rank, world=world, timeout=timeout, checkpoints=ck,
                                          resume=resume, secrets=secrets,
                                          secrets_identity=secrets_identity(spec), since=ordered)
            saved = (secrets, placements_for(spec.config, c.network.n, world)[rank].agents, ck)
            if rank == 0:
                rows, final, accesses, seconds, extra = got
                rows, man = finished_run(spec, c, rows, seconds=seconds, accesses=accesses, keys=extra.pop("keys"))
                resumed = extra.pop("resumed_from_round")
                man["bytes_per_tag"] = extra.pop("bytes")
                man["placement"] = extra
                if ck is not None:
                    man["checkpoints"] = {"every": ck.every, "resumed_from_round": resumed}
                save_finished(store, [(spec, rows, man)], nonfinite, secrets=False)  # each process forgets its own
                if progress:
                    print(f"  run {len(ran)}/{len(todo)} ({run_label(spec)}) done in "
                          f"{time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
        finally:
            if rank == 0:
                store.unlock(spec.run_id)
    if rank:
        return None
    results = store.write_results(axes, [(r.run_id, r.sweep) for r in runs])
    todo_ids = {unique[i].run_id for i in todo}
    mine = {unique[i].run_id for i in ran}
    others = sum(1 for rid in todo_ids - mine if store.is_done(rid))
    return ExperimentSummary(Path(out), len(unique), len(mine), len(unique) - len(todo), results,
                             time.perf_counter() - started, 0, nonfinite, others)


__all__ += ["check_same_launch", "claim_outputs", "launch_facts", "run_experiment_distributed"]
