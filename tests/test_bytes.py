"""Bytes on the wire: every run records ``bytes_sent`` / ``bytes_received`` (payload bytes all agents sent and
received since the start) at its recorded rounds, counted from shapes by the Comm's meter
(privdl.comm.observers.AgentBytes) — equal to what the byte observer counts from the payloads themselves, in the
simulator, the sliced backend and (tests/test_runtime.py, results.csv) the distributed runtime."""

from __future__ import annotations

import pytest
import torch

from privdl.algorithms import ALGORITHMS, make_algorithm
from privdl.comm import ByteCounter
from privdl.comm.base import SERVER
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.sliced import simulate_sliced
from privdl.tasks import make_task

N, ROUNDS = 5, 3
PARAMS = {"dsgd": {}, "dsgt": {}, "dinno": {"primal_steps": 2}, "central_sgd": {}, "exact_diffusion": {},
          "dsg_rms": {}, "edsg_rms": {}, "dsgt_rms": {"structure": "diagonal"},
          "pd_lms": {"scheme": "edge", "variance": 0.1}, "psgt": {}, "dpdl": {}, "cga": {"beta": 0.5},
          "sgp": {}}


@pytest.fixture(scope="module")
def setup():
    net = Network.from_topology("erdos_renyi", N, p=0.6, seed=3)
    task = make_task("softmax", N, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)
    return net, task


class _ByEnd(ByteCounter):
    """The byte observer, also split into what agents sent and what they received (the aggregator is no agent)."""

    def __init__(self):
        super().__init__()
        self.sent = self.received = 0

    def on_message(self, *, t, tag, src, dst, payload):
        super().on_message(t=t, tag=tag, src=src, dst=dst, payload=payload)
        row = payload[0].numel() * payload.element_size() if payload.shape[0] else 0
        self.sent += int((src != SERVER).sum()) * row
        self.received += int((dst != SERVER).sum()) * row


def _run(net, task, name, **kw):
    alg = make_algorithm(name, **PARAMS[name])
    mech = make_mechanism("none", steps=alg.accesses(ROUNDS, net.edges))
    return simulate(task=task, network=net, algorithm=alg, mechanism=mech, iterations=ROUNDS, seed=1, eval_every=1,
                    schedule=make_schedule("constant", eta=0.1, iterations=ROUNDS), **kw)


def test_the_params_cover_every_registered_algorithm():
    assert set(PARAMS) == set(ALGORITHMS.names())


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_the_meter_counts_what_the_byte_observer_sees(setup, name):
    """Per tag and in total, at every recorded round: the meter (shapes only) equals the observer (payloads)."""
    net, task = setup
    seen: list[tuple[int, int]] = []
    observer = _ByEnd()

    class Snapshot:  # the observer's totals at each recorded round
        def on_message(self, **kw):
            pass

        def metrics(self, t, rows):
            seen.append((observer.sent, observer.received))
            return {}

    got = _run(net, task, name, observers=[observer, Snapshot()])
    sent = [v for t, m, v in got.records if m == "bytes_sent"]
    received = [v for t, m, v in got.records if m == "bytes_received"]
    assert [(int(s), int(r)) for s, r in zip(sent, received)] == seen
    assert sent[-1] > 0
    per_tag = got.extra["bytes"]
    assert set(per_tag) == set(observer.bytes)
    for tag, b in observer.bytes.items():
        if name == "central_sgd":  # through the aggregator: the observer counts both legs, the agents' ends each
            assert per_tag[tag]["bytes_sent"] + per_tag[tag]["bytes_received"] == b
        else:
            assert per_tag[tag]["bytes_sent"] == per_tag[tag]["bytes_received"] == b
            assert per_tag[tag]["messages"] == observer.messages[tag]


def test_communication_cost_in_closed_form(setup):
    """D-SGD sends one model per directed edge per round (T·|E|·d·8 bytes in float64); DSGT twice that (its
    iterates and its trackers); the sliced backend's slices add up to the same numbers."""
    net, task = setup
    e, d = len(net.edges), task.dim
    dsgd = {m: v for t, m, v in _run(net, task, "dsgd").records if t == ROUNDS}
    dsgt = {m: v for t, m, v in _run(net, task, "dsgt").records if t == ROUNDS}
    assert dsgd["bytes_sent"] == dsgd["bytes_received"] == ROUNDS * e * d * 8
    assert dsgt["bytes_sent"] == 2 * dsgd["bytes_sent"]
    alg = make_algorithm("dsgt")
    sliced = simulate_sliced(task=task, network=net, algorithm=alg, iterations=ROUNDS, seed=1, slices=3,
                             mechanism=make_mechanism("none", steps=alg.accesses(ROUNDS, net.edges)),
                             schedule=make_schedule("constant", eta=0.1, iterations=ROUNDS))
    last = {m: v for t, m, v in sliced.records if t == ROUNDS}
    assert last["bytes_sent"] == dsgt["bytes_sent"]
    assert sum(v["bytes_sent"] for v in sliced.extra["bytes"].values()) == dsgt["bytes_sent"]
    assert torch.is_tensor(sliced.final)


def test_byte_counts_split_and_join_with_the_runs_of_a_stacked_batch():
    """A stacked batch's meter state splits into its runs' (each run keeps its own carried totals) and joins back,
    a coordinator's totals-only state counting as its run's base; tags of any run survive the join."""
    from privdl.comm.observers import AgentBytes, as_rows, join_states, slice_state

    n = 2
    coordinator = {"kind": "bytes", "rows": None, "base": {"x": {"bytes_sent": 5, "bytes_received": 5, "messages": 1}}}
    alone = AgentBytes(n)
    alone.count("y", torch.tensor([0, 1]), torch.tensor([1, 0]), 8)
    batch = AgentBytes(2 * n)
    batch.load_state_dict(join_states([as_rows(coordinator, n), alone.state_dict()]))
    assert batch.totals(slice(0, n)) == (5, 5) and batch.totals(slice(n, 2 * n)) == (16, 16)
    assert set(batch.per_tag()) == {"x", "y"}
    batch.count("y", torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2]), 8)
    first, second = AgentBytes(n), AgentBytes(n)
    first.load_state_dict(slice_state(batch.state_dict(), 0, n))
    second.load_state_dict(slice_state(batch.state_dict(), n, 2 * n))
    assert first.totals() == (5 + 16, 5 + 16) and second.totals() == (32, 32)


def test_the_meter_adds_every_call_when_read_whatever_the_ends():
    """The meter keeps calls pending and adds them when read: after many calls — repeated ends (the edges' tensors),
    fresh ends every call (the aggregator's, uncached) and the aggregator's end as sender — each row's bytes and
    messages per tag are the sums of every call's, message by message (a plain loop here), with reads in between;
    and what it keeps pending stays bounded."""
    import numpy as np

    from privdl.comm.observers import AgentBytes

    n = 4
    gen = np.random.default_rng(0)
    meter = AgentBytes(n, held=np.array([True, False, True, True]))
    want = {k: {} for k in ("sent", "received", "messages")}
    src, dst = torch.tensor([1, 2, 3, 0, 0]), torch.tensor([0, 0, 1, 2, 3])
    for call in range(200):
        width = int(gen.integers(0, 50))
        tag = "x" if call % 3 else "y"
        if call % 4 == 0:  # fresh ends, some from the aggregator
            s, d = torch.from_numpy(gen.integers(-1, n, 6)), torch.from_numpy(gen.integers(0, n, 6))
            meter.count(tag, s, d, width, cache=False)
        else:
            s, d = src, dst
            meter.count(tag, s, d, width)
        for k in want:
            want[k].setdefault(tag, np.zeros(n, dtype=np.int64))
        for a, b in zip(s.tolist(), d.tolist()):
            if a >= 0 and meter.held[a]:
                want["sent"][tag][a] += width
            if b >= 0 and meter.held[b]:
                want["received"][tag][b] += width
            at = a if a >= 0 else b  # the agent end counts the message
            if meter.held[at]:
                want["messages"][tag][at] += 1
        assert len(meter._pending) <= meter.CACHE
        if call in (0, 57, 199):
            for k in want:
                got = getattr(meter, k)
                assert set(got) == set(want[k]) and all(np.array_equal(got[t], want[k][t]) for t in got), (k, call)
