"""The synchronous simulator: all rows in one process, one (rows, d) tensor, T rounds.

One loop serves a single run (rows = the n agents), independent copies of one network (an audit: a block-diagonal
:class:`privdl.comm.StackedComm` over one task of copies × n agents) and stacked replicas of a sweep
(:func:`simulate_replicas`: R runs with their own network, mechanism, step size and root seed, on R·n rows). The
algorithm sees the Comm, the keyed gradient oracle and its keys — never W, the mechanism or the data.

Every draw is keyed (:mod:`privdl.keys`): the common initial model by (root, "init"), mini-batches, lots and noise by
(access, agent[, requester]), so a run is bit-reproducible from its seed, and a replica draws exactly the numbers of
its single run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from privdl.algorithms.base import Algorithm, StepContext, check_combination, check_directed
from privdl.comm import Comm, Observer, StackedComm, make_comm
from privdl.comm.observers import AgentBytes
from privdl.device import resolve_device
from privdl.errors import ValidationError
from privdl.keys import Keys
from privdl.mechanisms.base import GradientMechanism, MechanismEnv
from privdl.mechanisms.stack import stack
from privdl.network.network import Network
from privdl.schedules import Schedule
from privdl.simulator.access import GradientOracle
from privdl.simulator.checkpoint import Checkpoints, RunState
from privdl.tasks.base import Task


@dataclass
class SimulationResult:
    records: list[tuple[int, str, float]]  # (iteration, metric, value)
    final: torch.Tensor  # agents' models (n, d)
    seconds: float
    iterations: int
    accesses: torch.Tensor | None = None  # noisy accesses made to every owner's data
    extra: dict = field(default_factory=dict)


def recorded_rounds(iterations: int, eval_every: int) -> list[int]:
    """Iterations at which metrics are recorded: 0, every ``eval_every``, and the last."""
    pts = set(range(0, iterations + 1, max(1, eval_every)))
    pts.add(iterations)
    return sorted(pts)



class Recorder:
    """Metrics of recorded rounds, per system (a run, or each replica of a stacked batch): the task's metrics, the
    metrics of observers that have some (an eavesdropper's error) and running averages of the task's ``running``
    metrics (``<name>_avg``, or the name the task's ``running_names`` gives, at round t: the mean of the values
    recorded at rounds before t)."""

    def __init__(self, task: Task, observers: Sequence[Observer], systems: int, n: int) -> None:
        self.task, self.n = task, n
        self.observers = [o for o in observers if callable(getattr(o, "metrics", None))]
        self.running = tuple(task.running)
        self.averages = {name: getattr(task, "running_names", {}).get(name, f"{name}_avg") for name in self.running}
        self.sums = [dict.fromkeys(self.running, 0.0) for _ in range(systems)]
        self.counts = [0] * systems
        self.records: list[list[tuple[int, str, float]]] = [[] for _ in range(systems)]

    def state(self) -> tuple[list, list, list]:
        """What a checkpoint keeps: the records so far, the running sums and counts."""
        return ([list(r) for r in self.records], [dict(s) for s in self.sums], list(self.counts))

    def load(self, records: list, sums: list, counts: list) -> None:
        if len(records) != len(self.records):
            raise ValidationError(f"a checkpoint of {len(records)} systems for a recorder of {len(self.records)}")
        self.records = [list(r) for r in records]
        self.sums = [{**dict.fromkeys(self.running, 0.0), **s} for s in sums]
        self.counts = list(counts)

    def __call__(self, t: int, x: torch.Tensor) -> None:
        self.add(t, self.task.metrics_many(x.reshape(len(self.records), self.n, *x.shape[1:])))

    def add(self, t: int, batch: list[dict[str, float]]) -> None:
        """Record round t's task metrics of every system (``batch``: one dict each), with the observers' metrics
        and the running averages."""
        for r, out in enumerate(self.records):
            rows = slice(r * self.n, (r + 1) * self.n)
            values = batch[r]
            for o in self.observers:
                values.update(o.metrics(t, rows))
            for name in self.running:
                if name in values:
                    if self.counts[r]:
                        values[self.averages[name]] = self.sums[r][name] / self.counts[r]
                    self.sums[r][name] += values[name]
            self.counts[r] += 1
            out.extend((t, k, v) for k, v in values.items())


def _loop(*, task: Task, comm: Comm, algorithm: Algorithm, mechanism: GradientMechanism, keys: Keys,
          eta: Callable[[int], float | torch.Tensor], iterations: int, x0: torch.Tensor, gradient: str,
          marks: set[int], record: Callable[[int, torch.Tensor], None],
          on_step: Callable[[int], None] | None,
          oracle: GradientOracle | None = None,
          restore: Callable[[Any, GradientOracle], tuple[Any, int]] | None = None,
          on_round: Callable[[int, Any, GradientOracle], None] | None = None) -> tuple[torch.Tensor, float]:
    """The rounds. ``restore(template, oracle)`` (a resumed run) gives the state after a checkpointed round t and
    sets the oracle's and mechanism's counters; the loop then continues at t + 1. ``on_round(t, state, oracle)``
    sees the engine's state after every round (checkpoints)."""
    check_combination(algorithm, mechanism)  # what the mechanism needs of the algorithm, as it declares it
    mechanism.bind(MechanismEnv(keys))
    if mechanism.wraps_comm:  # Zip-DL, Muffliato: the mechanism also encodes what is sent
        comm = mechanism.wrap_comm(comm, keys=keys, eta=eta, algorithm=algorithm.name)
    if oracle is None:
        oracle = GradientOracle(task, mechanism, keys, gradient=gradient)
    start = time.perf_counter()
    with torch.no_grad():
        comm.t = 0
        task.at_round(0)
        first = 1
        if restore is not None:  # init only for the state's structure: silent, its counters then overwritten
            with comm.silenced():
                template = algorithm.init(x0, StepContext(0, eta(1), comm, oracle, keys))
            state, done = restore(template, oracle)
            first = done + 1
        else:
            state = algorithm.init(x0, StepContext(0, eta(1), comm, oracle, keys))
            if 0 in marks:
                record(0, algorithm.params(state))
        for t in range(first, iterations + 1):
            comm.t = oracle.t = t
            task.at_round(t)
            state = algorithm.step(state, StepContext(t, eta(t), comm, oracle, keys))
            if t in marks:
                record(t, algorithm.params(state))
            if on_round is not None:
                on_round(t, state, oracle)
            if on_step is not None:
                on_step(t)
    if task.device.type == "cuda":
        torch.cuda.synchronize(task.device)
    return algorithm.params(state), time.perf_counter() - start


def stateful(observers: Sequence[Observer]) -> list:
    """The observers whose state a checkpoint keeps (those with ``state_dict`` / ``load_state_dict``)."""
    return [o for o in observers if callable(getattr(o, "state_dict", None))]


def checkpoint_macs(keys: Keys, agents: Sequence[int]) -> dict[int, bytes] | None:
    """Each agent's checkpoint key when the run's key source derives them (agreed keys: from the agent's own secret),
    else None (root keys: the files carry a SHA-256)."""
    sources = [getattr(s, "source", s) for s in keys.sources]  # HeldKeys wraps the run's source
    makers = [getattr(s, "checkpoint_key", None) for s in sources]
    if all(m is None for m in makers):
        return None
    if len(sources) > 1:
        raise ValidationError("runs with agreed keys are not stacked: each has its own keys")
    return {int(i): makers[0](int(i)) for i in agents}


def checkpoint_hooks(checkpoints: Checkpoints | None, *, resume: bool, mechanism: GradientMechanism,
                     recorder: Recorder | None, observers: Sequence[Observer], comm: Comm, rows: int,
                     algorithm: Algorithm, keys: Keys,
                     after_save: Callable[[int], None] | None = None, last: int | None | str = "auto"):
    """(restore, on_round) for :func:`_loop`: resume from the last complete checkpoint (when ``resume`` and one
    exists) and write one every ``checkpoints.every`` rounds. ``recorder`` None: this engine does not hold the
    recorder (a slice); ``after_save(t)`` then completes the round's checkpoint. ``last``: the round to resume
    from, decided once for all the slices of a run (None: none); "auto" looks now. A checkpoint is refused when an
    agent's access count is not what ``algorithm`` makes in its rounds; with agreed ``keys`` every agent file is
    sealed with an HMAC under its agent's key (:func:`checkpoint_macs`)."""
    if checkpoints is None:
        return None, None
    checkpoints.authenticate(checkpoint_macs(keys, checkpoints.agents))
    restore = None
    if resume and last == "auto":
        last = checkpoints.latest()
    if resume and last is not None:
        def restore(template, oracle):
            expected = (algorithm.accesses(last, comm.edges) if comm.dynamics is None  # (W(t): each round's edges)
                        else comm.dynamics.accesses(algorithm, last))
            st = checkpoints.load(last, template, rows=rows, edges_dst=comm.edges.dst, expected_calls=expected)
            oracle.calls = st.oracle_calls
            mechanism.restore_calls(st.mechanism_calls)
            if recorder is not None:
                recorder.load(st.records, st.sums, st.counts)
                for o, d in zip(stateful(observers), st.observers):
                    o.load_state_dict(d)
            return st.algorithm, st.t

    def on_round(t: int, state: object, oracle: GradientOracle) -> None:
        if not checkpoints.due(t):
            return
        records, sums, counts = recorder.state() if recorder is not None else ([], [], [])
        checkpoints.save(RunState(t, state, oracle.calls, mechanism.calls, records, sums, counts,
                                  [o.state_dict() for o in stateful(observers)]), edges_dst=comm.edges.dst)
        if after_save is not None:
            after_save(t)

    return restore, on_round


def simulate(
    *, task: Task, algorithm: Algorithm, mechanism: GradientMechanism, schedule: Schedule, iterations: int,
    network: Network | None = None, comm: Comm | None = None, seed: int | None = None, keys: Keys | None = None,
    eval_every: int = 0, gradient: str = "auto", sparse: bool | None = None,
    on_step: Callable[[int], None] | None = None, x0: torch.Tensor | None = None, metrics: bool = True,
    device: str | torch.device | None = None, observers: Sequence[Observer] = (),
    on_record: Callable[[int, torch.Tensor], None] | None = None, checkpoints: Checkpoints | None = None,
    resume: bool = False, on_access: Callable | None = None,
) -> SimulationResult:
    """Run ``algorithm`` with ``mechanism`` on ``task`` for ``iterations`` synchronous rounds over ``comm`` (or
    ``make_comm(network, sparse=...)``), with keys from root ``seed`` (or ``keys``). ``metrics=False`` skips the
    task's metrics; ``observers`` watch the wire; ``on_record(t, models)`` sees the agents' models at every recorded
    round; ``device`` ("cuda", "auto" = cuda when available) moves the task's
    data and the agents' state there while every draw still comes from the CPU's keys, so the lots and the noise
    are the same numbers on every device."""
    if comm is None:
        if network is None:
            raise ValidationError("simulate needs a network or a comm")
        comm = make_comm(network, sparse=sparse)
    check_directed(algorithm, mechanism, getattr(comm, "network", network))  # the library path too
    if keys is None:
        if seed is None:
            raise ValidationError("simulate needs a seed or keys")
        keys = Keys(int(seed), comm.rows)
    if keys.rows != comm.rows:
        raise ValidationError(f"keys cover {keys.rows} rows, the comm has {comm.rows}")
    if task.n != comm.rows:
        raise ValidationError(f"the task has {task.n} agents, the network {comm.rows}")
    if device is not None:
        dev = resolve_device(device)
        task.to(dev)
        comm.to(dev)
    for o in observers:
        comm.attach(o)
    if x0 is None:
        x0 = task.init_params(keys.generator("init")).expand(comm.rows, -1).clone()
    marks = set(recorded_rounds(iterations, eval_every or iterations))
    meter = comm.meter = AgentBytes(comm.rows)
    recorder = Recorder(task, [*observers, meter], 1, comm.rows)

    def record(t: int, x: torch.Tensor) -> None:
        if metrics:
            recorder(t, x)
        if on_record is not None:
            on_record(t, x)

    restore, on_round = checkpoint_hooks(checkpoints, resume=resume, mechanism=mechanism, recorder=recorder,
                                         observers=[*observers, meter], comm=comm, rows=comm.rows,
                                         algorithm=algorithm, keys=keys)
    oracle = GradientOracle(task, mechanism, keys, gradient=gradient)
    oracle.on_access = on_access
    try:
        final, seconds = _loop(task=task, comm=comm, algorithm=algorithm, mechanism=mechanism, keys=keys,
                               oracle=oracle, eta=schedule, iterations=iterations, x0=x0.to(dtype=task.dtype, device=task.device),
                               gradient=gradient, marks=marks, record=record, on_step=on_step, restore=restore,
                               on_round=on_round)
    finally:
        comm.meter = None
        for o in observers:
            comm.detach(o)
    return SimulationResult(recorder.records[0], final.cpu().clone(), seconds, iterations,
                            mechanism.accesses().clone(), {"bytes": meter.per_tag()})


@dataclass
class Replica:
    """One run of a stacked batch: its network, mechanism, schedule and root seed (the task and algorithm are
    shared by the batch)."""

    network: Network
    mechanism: GradientMechanism
    schedule: Schedule
    seed: int


@dataclass
class ReplicaResult:
    final: torch.Tensor  # (R, n, d)
    records: list[list[tuple[int, str, float]]]  # per replica
    accesses: list[torch.Tensor]  # per replica, per owner
    seconds: float
    bytes: list[dict] = field(default_factory=list)  # per replica: payload bytes and messages per tag

    @property
    def metrics(self) -> list[dict[str, float]]:
        """Each replica's final metrics."""
        last = [max((t for t, _, _ in r), default=0) for r in self.records]
        return [{k: v for t, k, v in r if t == last_t} for r, last_t in zip(self.records, last)]


def stackable(mechanisms: Sequence[GradientMechanism], n: int, *, cross: bool = False) -> bool:
    """Whether these mechanisms can share a replica axis (``cross``: under an algorithm with cross-gradients)."""
    return stack(mechanisms, n, cross=cross) is not None


def simulate_replicas(
    *, task: Task, algorithm: Algorithm, replicas: Sequence[Replica], iterations: int, eval_every: int = 0,
    gradient: str = "auto", metrics: bool = True, on_step: Callable[[int], None] | None = None,
    device: str | torch.device | None = None, x0: torch.Tensor | None = None, observers: Sequence[Observer] = (),
    checkpoints: Checkpoints | None = None, resume: bool = False,
) -> ReplicaResult:
    """Run R independent runs that share (task, algorithm, iterations) as one batch: R·n rows, a
    :class:`StackedComm` of their networks, their mechanisms stacked (:func:`privdl.mechanisms.stack`), each
    replica keyed by its own root seed and stepping with its own schedule. Replica r draws exactly its single
    run's numbers; its results agree with the single run to rounding (batched products)."""
    reps = len(replicas)
    if not reps:
        raise ValidationError("simulate_replicas needs at least one replica")
    n = task.n
    if any(r.network.n != n for r in replicas):
        raise ValidationError(f"every replica's network must have the task's {n} agents")
    if not algorithm.stackable:
        raise ValidationError(f"algorithm {algorithm.name!r} does not stack on the replica axis; run it alone")
    mechanism = stack([r.mechanism for r in replicas], n, cross=algorithm.cross)
    if mechanism is None:
        raise ValidationError("these mechanisms cannot be stacked on the replica axis; run them one by one")
    comm = StackedComm([r.network for r in replicas])
    keys = Keys.from_seeds([r.seed for r in replicas], n)
    if device is not None:
        dev = resolve_device(device)
        task.to(dev)
        comm.to(dev)
    if x0 is None:
        x0 = torch.cat([task.init_params(keys.generator("init", r)).expand(n, -1) for r in range(reps)])
    else:
        x0 = x0.expand(reps, n, -1).reshape(reps * n, -1) if x0.ndim == 2 else x0.reshape(reps * n, -1)
    groups: dict[int, list[int]] = {}
    scheds: list[Schedule] = []
    for r, rep in enumerate(replicas):  # one evaluation per distinct schedule and round
        key = next((k for k, s in enumerate(scheds) if s is rep.schedule or s == rep.schedule), None)
        if key is None:
            scheds.append(rep.schedule)
            key = len(scheds) - 1
        groups.setdefault(key, []).append(r)
    owner = np.empty(reps, dtype=np.int64)
    for k, rs in groups.items():
        owner[rs] = k
    row_owner = torch.as_tensor(np.repeat(owner, n))

    def eta(t: int) -> float | torch.Tensor:
        if len(scheds) == 1:
            return scheds[0](t)
        values = torch.tensor([s(t) for s in scheds], dtype=task.dtype, device=task.device)
        return values[row_owner.to(task.device)][:, None]

    marks = set(recorded_rounds(iterations, eval_every or iterations))
    meter = comm.meter = AgentBytes(comm.rows)
    recorder = Recorder(task, [*observers, meter], reps, n)

    def record(t: int, x: torch.Tensor) -> None:
        if metrics:
            recorder(t, x)

    for o in observers:
        comm.attach(o)
    restore, on_round = checkpoint_hooks(checkpoints, resume=resume, mechanism=mechanism, recorder=recorder,
                                         observers=[*observers, meter], comm=comm, rows=comm.rows,
                                         algorithm=algorithm, keys=keys)
    try:
        final, seconds = _loop(task=task, comm=comm, algorithm=algorithm, mechanism=mechanism, keys=keys, eta=eta,
                               iterations=iterations, x0=x0.to(dtype=task.dtype, device=task.device),
                               gradient=gradient, marks=marks, record=record, on_step=on_step, restore=restore,
                               on_round=on_round)
    finally:
        comm.meter = None
        for o in observers:
            comm.detach(o)
    acc = mechanism.accesses()
    return ReplicaResult(final.cpu().reshape(reps, n, -1).clone(), recorder.records,
                         [acc[r * n:(r + 1) * n].clone() for r in range(reps)], seconds,
                         [meter.per_tag(slice(r * n, (r + 1) * n)) for r in range(reps)])
