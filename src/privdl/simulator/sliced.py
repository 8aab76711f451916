"""The sliced backend: one run split into K engines in one process, each holding only some agents.

``simulate_sliced(..., placements=partition(n, slices=K))`` runs K engines (:mod:`privdl.placement`), one per
thread, each with only its agents' data (a :class:`HeldTask` view that refuses any other agent's), keys
(:class:`privdl.keys.HeldKeys`: no other agent's key is ever derived) and mechanism state (its own copy), joined by
an in-process :class:`privdl.comm.transport.Transport` that carries exactly what would cross a process boundary. The
algorithm and mechanism code is the simulator's, unchanged; the result — final models, every recorded metric, the
transcript's messages, the accesses behind the ledger — equals ``simulate(..., sparse=True)`` bit for bit
(``tests/test_sliced.py``), which is what proves that nothing of an agent's computation needs another agent's data,
keys or rows beyond what the Comm delivers.

Metrics are evaluated as the simulator evaluates them, on the agents' models gathered at the recorded rounds (the
evaluation data are the task's, held by the coordinator that writes results: slice 0's
:class:`privdl.simulator.coordinator.Coordinator`, the same code the distributed runtime's processes run).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Callable, Sequence

import numpy as np
import torch

from privdl.agreement import agree, shared_groups
from privdl.algorithms.base import Algorithm, check_directed
from privdl.comm import Observer
from privdl.comm.observers import AgentBytes
from privdl.comm.held import HeldComm
from privdl.comm.sliced import SliceComm
from privdl.comm.transport import Transport
from privdl.comm.wire import Wire
from privdl.errors import ValidationError
from privdl.keys import HeldKeys, Keys, KeySource, RootKeys
from privdl.mechanisms.base import GradientMechanism
from privdl.network.network import Network
from privdl.placement import Placement, partition
from privdl.schedules import Schedule
from privdl.simulator.access import GradientOracle
from privdl.simulator.checkpoint import Checkpoints
from privdl.simulator.coordinator import BYTES, Coordinator, NetworkBytes
from privdl.simulator.engine import SimulationResult, _loop, checkpoint_hooks, recorded_rounds
from privdl.tasks.base import Task
from privdl.tasks.held import HeldTask


def run_slice(*, part: int, placement: Placement, owner: np.ndarray, network: Network, task: Task, keys: Keys,
              mechanism: GradientMechanism, algorithm: Algorithm, schedule: Schedule, iterations: int,
              x0: torch.Tensor | None, gradient: str, marks: set[int], transport, wire: Wire | None,
              record: Callable[[int, torch.Tensor, tuple[int, int]], None],
              on_step: Callable[[int], None] | None, checkpoints: Checkpoints | None, resume: bool, last: int | None,
              saved: Callable[[int, dict], None], held_rows: bool = False, frame: str = "network"
              ) -> tuple[torch.Tensor, torch.Tensor, float, AgentBytes]:
    """One slice's engine — a thread of :func:`simulate_sliced`, or a process of the distributed runtime: its
    Comm over ``transport``, its oracle (only ``task``'s held agents, lots padded as agreed), its own ``mechanism``
    (a copy), its agents' checkpoints (``saved(t, per_tag)`` completes a round), its meter (payload bytes of its
    agents' ends: ``record(t, x, totals)`` gets its (sent, received) totals, ``saved`` its per-tag counts, since the
    run (re)started). ``held_rows``: gradients computed on the held agents' rows alone (the distributed runtime;
    equal to the simulator's within rounding) instead of the network's frame (bit for bit:
    :class:`~privdl.simulator.access.GradientOracle`). ``frame = "held"``: the engine's tensors have one row per
    held agent (:mod:`privdl.placement`; :class:`~privdl.comm.held.HeldComm`; gradients on held rows) — refused
    for an algorithm or mechanism that needs more (:func:`check_held_frame`).
    Returns (models in the engine's frame, the mechanism's accesses per global row, seconds, the meter)."""
    n = network.n
    held = frame == "held"
    if held:
        check_held_frame(algorithm, mechanism)
        comm = HeldComm(network, placement, part, owner, transport, wire, algorithm=algorithm.name)
    else:
        comm = SliceComm(network, placement, part, owner, transport, wire)
    if task.device.type != "cpu":  # a process of the distributed runtime on a GPU: its plan's indices there too
        comm.to(task.device)
    meter = comm.meter = AgentBytes(n, held=placement.held)
    rows = len(placement.agents) if held else n
    if x0 is not None:
        start = x0.index_select(0, placement.held_rows.to(x0.device)) if held else x0.clone()
    else:
        start = task.init_params(keys.generator("init")).expand(rows, -1).clone()
    oracle = GradientOracle(task, mechanism, keys, gradient=gradient, placement=placement, held_rows=held_rows,
                            frame=frame)
    mine = None if checkpoints is None else checkpoints.held_by(placement.agents, held_frame=held)
    restore, on_round = checkpoint_hooks(mine, resume=resume, mechanism=mechanism, recorder=None, observers=(),
                                         comm=comm, rows=rows, algorithm=algorithm, keys=keys,
                                         after_save=lambda t: saved(t, meter.per_tag()), last=last)
    final, secs = _loop(task=task, comm=comm, algorithm=algorithm, mechanism=mechanism, keys=keys, eta=schedule,
                        iterations=iterations, x0=start.to(dtype=task.dtype, device=task.device), gradient=gradient,
                        marks=marks, record=lambda t, x: record(t, x, meter.totals()), on_step=on_step,
                        oracle=oracle, restore=restore, on_round=on_round)
    return final, mechanism.accesses().clone(), secs, meter


#: the frames an engine of a split run computes in (:mod:`privdl.placement`)
FRAMES = ("network", "held")
#: the held-frame reason of a mechanism that wraps the Comm and does not declare the held frame (``held_reason``;
#: ``zip_dl`` and ``muffliato`` declare it: each engine draws and sends its own agents' noise)
WRAPS_COMM = ("it wraps the Comm (encodes what is sent per edge, or averages over gossip rounds of its own) and is "
              "not one of the mechanisms checked to draw and send only its engine's agents' values")


def held_frame_refusal(algorithm: Algorithm, mechanism: GradientMechanism) -> tuple[str, str] | None:
    """Why ``algorithm`` with ``mechanism`` cannot run in the held frame (one row per held agent: only
    :data:`privdl.comm.held.HELD_METHODS` between agents, each agent's own data and noise) and what to do instead,
    or None when it can. The algorithm declares it (:attr:`~privdl.algorithms.base.Algorithm.held_reason`)."""
    network = "use runtime.frame = \"network\""
    if algorithm.held_reason is not None:
        return (f"runtime.frame = \"held\" cannot run algorithm {algorithm.name!r}: {algorithm.held_reason}",
                network)
    for m in [mechanism, *getattr(mechanism, "members", [])]:
        if m.wraps_comm and getattr(m, "held_reason", WRAPS_COMM) is not None:
            return (f"runtime.frame = \"held\" cannot run mechanism {m.name!r}: "
                    f"{getattr(m, 'held_reason', WRAPS_COMM)}", network)
        generation = getattr(m, "generation", "per_agent")
        if generation != "per_agent" and getattr(getattr(m, "noise", None), "draw_keys", None):  # shared draws
            return (f"runtime.frame = \"held\" cannot run mechanism {m.name!r} with generation = {generation!r}: "
                    "it draws the whole network's noise in one product",
                    "use generation = \"per_agent\" (the same noise, each agent's row drawn alone)")
    return None


def check_held_frame(algorithm: Algorithm, mechanism: GradientMechanism) -> None:
    """Refuse, before a run starts, what cannot run in the held frame, naming the reason
    (:func:`held_frame_refusal`)."""
    refusal = held_frame_refusal(algorithm, mechanism)
    if refusal is not None:
        raise ValidationError("; ".join(refusal))


def network_frame_refusal(mechanism: GradientMechanism) -> str | None:
    """Why a split run's network frame (a slice with a row per agent of the network) cannot run ``mechanism``, or
    None: a mechanism that wraps the Comm (``zip_dl``, ``muffliato``) averages in one engine holding every row (the
    simulator) or in the held frame only (:func:`privdl.mechanisms.peers.refuse_sliced`, the same refusal at run
    time)."""
    for m in [mechanism, *getattr(mechanism, "members", [])]:
        if m.wraps_comm:
            return (f"mechanism {m.name!r} wraps the Comm: in a split run it runs in the held frame only "
                    "(runtime.frame = \"held\"), not in the network frame (a slice with a row per agent of the "
                    "network, where its averaging would draw and combine rows the slice does not hold)")
    return None


def choose_frame(asked: str | None, algorithm: Algorithm, mechanism: GradientMechanism) -> tuple[str, str | None]:
    """The frame of a distributed run and why it is not the held frame: ``asked`` ("network", "held" — refused by
    reason if the run cannot — or None: "held" where the run allows it, else "network" with the reason). A run
    that can run in neither (a Comm-wrapping mechanism with what the held frame refuses) is refused with both
    reasons."""
    if asked == "held":
        check_held_frame(algorithm, mechanism)
        return "held", None
    refusal = None if asked == "network" else held_frame_refusal(algorithm, mechanism)
    if asked == "network" or refusal is not None:
        network = network_frame_refusal(mechanism)
        if network is not None:
            raise ValidationError(network if refusal is None else f"{network}; and {refusal[0]}")
    if asked == "network":
        return "network", "runtime.frame = \"network\""
    return ("held", None) if refusal is None else ("network", refusal[0])


def owners_of(placements: Sequence[Placement], n: int) -> np.ndarray:
    """The slice that holds each agent (every agent exactly once)."""
    owner = np.full(n, -1, dtype=np.int64)
    for k, p in enumerate(placements):
        if p.n != n:
            raise ValidationError(f"placement {k} is for {p.n} agents, the network has {n}")
        clash = owner[list(p.agents)] >= 0
        if clash.any():
            raise ValidationError(f"agent {int(np.asarray(p.agents)[clash][0])} is placed in two slices")
        owner[list(p.agents)] = k
    if (owner < 0).any():
        raise ValidationError(f"no slice holds agent {int(np.flatnonzero(owner < 0)[0])}")
    return owner


def _evaluator(task: Task) -> Task:
    """A slice's own copy of ``task`` for evaluating its agents' metrics in its thread: its round state and its own
    model module (``torch.func.functional_call`` swaps a module's parameters while it runs: two threads on one module
    read each other's — a flaky test_loss and "mat1 and mat2 must have the same dtype" on the logistic task)."""
    out = copy.copy(task)
    if hasattr(task, "model"):
        out.model = copy.deepcopy(task.model)
    return out


def simulate_sliced(
    *, task: Task, algorithm: Algorithm, mechanism: GradientMechanism, schedule: Schedule, iterations: int,
    network: Network, seed: int | None = None, source: KeySource | None = None,
    placements: Sequence[Placement] | None = None, slices: int | None = None, eval_every: int = 0,
    gradient: str = "auto", on_step: Callable[[int], None] | None = None, x0: torch.Tensor | None = None,
    metrics: bool = True, observers: Sequence[Observer] = (), timeout: float = 120.0,
    tasks: Sequence[Task] | None = None, sources: Sequence[KeySource] | None = None,
    checkpoints: Checkpoints | None = None, resume: bool = False, agreed: bool = False, context: str = "",
    entropy: Callable[[str], bytes] | None = None, keep_secrets: bool = False, identities=None, store=None,
    store_identity: dict | None = None, held_rows: bool = False, local_metrics: bool = False,
    frame: str = "network",
) -> SimulationResult:
    """Run ``algorithm`` with ``mechanism`` as K slices (``placements``, or ``slices`` contiguous blocks), one
    thread each, joined by an in-process transport. Same arguments and result as :func:`privdl.simulate` (keys from
    the root ``seed``, or ``source``). ``tasks`` / ``sources`` give each slice its own task and key source (tests:
    a slice's task that lacks the other agents' data); by default each gets a :class:`HeldTask` view of ``task``
    and ``HeldKeys`` of the root source. ``result.extra`` holds the transport's payload bytes per pair of slices
    and its control operations. ``checkpoints`` / ``resume``: as :func:`privdl.simulate` — each slice writes its
    own agents' files, and slice 0, once every slice has saved a checkpointed round, writes the recorder's file,
    which completes the round (:class:`privdl.simulator.coordinator.Coordinator`, as in the distributed runtime).
    ``agreed``: each slice's keys come from key agreement with the other slices (:func:`privdl.agreement.agree`,
    salted with ``context``, the run's identity; ``entropy`` for tests) instead of the root seed; ``result.extra``
    then holds the setup bytes and the setup time, whether the secrets were loaded from ``store`` (``restored``; the
    folder of the run's agent secrets: a run started again replays its released rounds), and with ``keep_secrets``
    the slices' key sources, ``key_sources``, for an audit of the wire. ``identities``
    (:class:`privdl.agreement.identity.Identities` of every agent) authenticate the exchange. ``held_rows``: each
    slice computes gradients on its agents' rows alone, as the distributed runtime's processes do (equal to the
    simulator within rounding; by default on the network's frame, bit for bit). ``local_metrics``: each slice
    evaluates its own agents and slice 0 receives the metrics' scalars (the distributed runtime's way; equal to the
    simulator within rounding: :meth:`privdl.simulator.coordinator.Coordinator._local_metrics`). ``frame``:
    "held" gives each slice tensors of its own agents' rows only (:mod:`privdl.placement`; refused, naming the
    reason, for what needs more: :func:`check_held_frame`), "network" (default) the network's rows."""
    n = network.n
    if frame not in FRAMES:
        raise ValidationError(f"frame must be one of {', '.join(FRAMES)}, got {frame!r}")
    if frame == "held":
        check_held_frame(algorithm, mechanism)
    elif network_frame_refusal(mechanism) is not None:
        raise ValidationError(network_frame_refusal(mechanism))
    if task.n != n:
        raise ValidationError(f"the task has {task.n} agents, the network {n}")
    check_directed(algorithm, mechanism, network)
    if placements is None:
        placements = partition(n, slices=slices)
    placements = list(placements)
    owner = owners_of(placements, n)
    parts = len(placements)
    if source is None:
        if seed is None:
            raise ValidationError("simulate_sliced needs a seed or a key source")
        source = RootKeys(int(seed))
    if x0 is None:  # the common initial model, a public draw: made once here (torch's layer init uses the global
        # generator, which the slices' threads would otherwise race for)
        x0 = task.init_params(Keys(source, n).generator("init")).expand(n, -1).clone()
    transport = Transport(parts, timeout=timeout)
    marks = set(recorded_rounds(iterations, eval_every or iterations))
    coordinators = [Coordinator(transport, k, placements, task=task if not local_metrics else _evaluator(task),
                                observers=observers, checkpoints=checkpoints, metrics=metrics,
                                local_metrics=local_metrics, held_frame=frame == "held") for k in range(parts)]
    last = checkpoints.latest() if (checkpoints is not None and resume) else None
    coordinators[0].load(last)  # the coordinator's part of the checkpoint: records and observers
    ends: dict = {}  # slice 0's: the final models, accesses and per-tag bytes of every slice
    errors: list[BaseException | None] = [None] * parts
    memo = {id(task): task, id(network): network}
    groups = shared_groups(mechanism, n) if agreed else []
    agreed_sources: list = [None] * parts
    setup = [0.0] * parts

    def work(k: int) -> None:
        try:
            p = placements[k]
            mine = sources[k] if sources is not None else source
            if agreed:
                began = time.perf_counter()
                mine = agreed_sources[k] = agree(part=k, placement=p, owner=owner, network=network, groups=groups,
                                                 transport=transport, public=source, context=context,
                                                 entropy=entropy, keep=keep_secrets, identities=identities,
                                                 store=store, store_identity=store_identity)
                setup[k] = time.perf_counter() - began
            keys = Keys(mine if sources is not None and not agreed else HeldKeys(mine, p.held), n)
            final, accesses, _, meter = run_slice(
                part=k, placement=p, owner=owner, network=network, task=tasks[k] if tasks is not None else
                HeldTask(task, p), keys=keys, mechanism=copy.deepcopy(mechanism, dict(memo)), algorithm=algorithm,
                schedule=schedule, iterations=iterations, x0=x0, gradient=gradient, marks=marks, transport=transport,
                wire=Wire(k, parts, transport, observers) if observers else None, record=coordinators[k].record,
                on_step=on_step if k == 0 else None,
                checkpoints=checkpoints, resume=resume, last=last, saved=coordinators[k].saved, held_rows=held_rows,
                frame=frame)
            got = coordinators[k].finals(iterations, final, accesses)
            per_tag = coordinators[k].per_tag(BYTES, iterations, meter.per_tag())
            if got is not None:
                ends.update(final=got[0], accesses=got[1], bytes=per_tag)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, and stops the other slices
            errors[k] = exc
            transport.fail(k, exc)

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(k,), name=f"privdl-slice-{k}", daemon=True) for k in range(parts)]
    for th in threads:
        th.start()
    try:
        for th in threads:
            th.join()
    except BaseException as exc:  # Ctrl-C: stop the slices (they wait on each other) before leaving
        transport.fail(-1, exc)
        for th in threads:
            th.join(timeout=5)
        raise
    wall = time.perf_counter() - start
    if transport.failed is not None:
        raise transport.failed[1]
    for e in errors:
        if e is not None:
            raise e
    extra = {"slices": parts, "payload_bytes": int(transport.payload_bytes.sum()),
             "control_messages": transport.control_messages, "bytes": ends["bytes"]}
    if agreed:
        extra.update(setup_bytes=transport.setup_bytes, setup_seconds=max(setup),
                     restored=all(src.restored for src in agreed_sources))
        if keep_secrets:
            extra["key_sources"] = agreed_sources
    return SimulationResult(coordinators[0].records, ends["final"].cpu().clone(), wall, iterations, ends["accesses"],
                            extra)


# NetworkBytes: the coordinator's
__all__ = ["FRAMES", "NetworkBytes", "WRAPS_COMM", "check_held_frame", "choose_frame", "held_frame_refusal",
           "network_frame_refusal", "owners_of", "run_slice", "simulate_sliced"]
