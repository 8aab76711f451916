"""The authors' in-place gossip (Comm.average_in_place) through the Comm wrappers (issue 30): a ProtectedComm encodes
every value the sweep sends (or refuses an encoding it cannot apply exactly), and a ReplayComm serves an agent
exactly what it read in the recorded sweep."""

from __future__ import annotations

import math

import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.comm import ReplayComm, SparseComm, StackedComm, Transcript
from privdl.comm.base import LINEAR_MIXING
from privdl.errors import ValidationError
from privdl.keys import Keys
from privdl.mechanisms import IdentityEncoding, MessageMechanism, ProtectedComm, make_mechanism, protect
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task
from tests.test_transcripts import Scale  # a scaling: not a translation

ROUNDS = 3
N = 5
AUTHORS = [("dsgd", {"form": "cta", "gossip": "authors"}),
           ("dsgd", {"form": "cta", "gossip": "authors", "optimizer": {"name": "sgd", "momentum": 0.9}}),
           ("dsgt", {"gossip": "authors"})]


class Added(MessageMechanism):
    """A fixed vector per row added to what is sent and removed by its sender (a protection vector in miniature)."""

    name = "added"
    translation = True

    def __init__(self, vector: torch.Tensor) -> None:
        self.vector = vector

    def encode(self, x, *, tag, t):
        return x + self.vector, -self.vector


def _setup(name, params):
    net = Network.from_topology("erdos_renyi", N, p=0.6, seed=3)
    task = make_task("softmax", N, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)
    return net, task, make_algorithm(name, **params)


def _mechanism(net, task, alg, kind):
    steps = alg.accesses(ROUNDS, net.edges)
    if kind == "dp_sgd":
        return make_mechanism("dp_sgd", steps=steps, task=task, clip=1.0, lot_size=20, noise_multiplier=1.0)
    if kind == "decor" and alg.combines != LINEAR_MIXING:  # the in-place gossip does not mix linearly: DECOR refuses it
        kind = "ldp"
    return make_mechanism(kind, steps=steps, network=net, clip=1.0, epsilon=20.0)


def _x0(task):
    return task.init_params(Keys(11, N).generator("init")).expand(N, -1).clone() + 0.01 * torch.arange(N * 1.0)[:, None]


def _simulate(net, task, alg, comm, x0, kind="decor", observers=()):
    return simulate(task=task, comm=comm, algorithm=alg, mechanism=_mechanism(net, task, alg, kind),
                    schedule=make_schedule("constant", eta=0.1, iterations=ROUNDS), iterations=ROUNDS,
                    keys=Keys(11, N), x0=x0, metrics=False, observers=list(observers))


def _reference_sweep(net, x, vector, offset=None):
    """Seed 004's sweep written out agent by agent, each agent sending its current value plus its vector and removing
    its own vector after averaging: (the reads of every agent, the result)."""
    state, reads = x.clone(), []
    for k in range(net.n):
        nbrs = net.neighbours(k)
        got = torch.stack([state[j] + vector[j] for j in nbrs]) if nbrs else x.new_zeros(0, x.shape[1])
        reads.append(got)
        total = (state[k] + vector[k] + got.sum(0)) / (len(nbrs) + 1) - vector[k]
        state[k] = total if offset is None else total + offset[k]
    return reads, state


# ---- ProtectedComm ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params", AUTHORS)
@pytest.mark.exact
def test_identity_encoding_equals_the_plain_authors_gossip_bit_for_bit(name, params):
    net, task, alg = _setup(name, params)
    plain_tr, wrapped_tr = Transcript(), Transcript()
    plain = _simulate(net, task, alg, SparseComm(net), _x0(task), observers=[plain_tr])
    wrapped = _simulate(net, task, alg, protect(SparseComm(net), IdentityEncoding()), _x0(task), observers=[wrapped_tr])
    assert torch.equal(plain.final, wrapped.final)
    assert [(m.t, m.tag) for m in plain_tr.messages] == [(m.t, m.tag) for m in wrapped_tr.messages]
    assert all(torch.equal(a.payload, b.payload) for a, b in zip(plain_tr.messages, wrapped_tr.messages))


@pytest.mark.parametrize("with_offset", [False, True])
def test_the_wire_sees_every_read_of_the_sweep_encoded(with_offset):
    net = Network.from_topology("erdos_renyi", 7, p=0.4, seed=2)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, dtype=torch.float64, generator=gen)
    vector = 5.0 + torch.randn(7, 3, dtype=torch.float64, generator=gen)
    offset = torch.randn(7, 3, dtype=torch.float64, generator=gen) if with_offset else None
    inner = SparseComm(net)
    wire = inner.attach(Transcript())
    out = ProtectedComm(inner, Added(vector)).average_in_place(x, tag="x", offset=offset)
    reads, expected = _reference_sweep(net, x, vector, offset)
    assert len(wire.messages) == net.n
    for k, (m, got) in enumerate(zip(wire.messages, reads)):
        assert m.tag == "x" and bool((m.dst == k).all())
        torch.testing.assert_close(m.payload, got, rtol=1e-12, atol=1e-12)  # encoded: current value + its vector
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    plain = SparseComm(net).average_in_place(x, tag="x", offset=offset)
    assert not torch.allclose(out, plain)  # the vectors change the sweep (not doubly stochastic: nothing cancels)


def test_observers_of_a_protected_authors_run_see_the_encoded_values():
    net, task, alg = _setup("dsgd", {"form": "cta", "gossip": "authors"})
    x0 = _x0(task)
    plain_tr, wrapped_tr = Transcript(), Transcript()
    _simulate(net, task, alg, SparseComm(net), x0, observers=[plain_tr])
    _simulate(net, task, alg, ProtectedComm(SparseComm(net), Added(torch.full_like(x0, 3.0))), x0,
              observers=[wrapped_tr])
    first = [m for m in wrapped_tr.messages if m.t == 1]
    assert len(first) == N
    # agent 0 reads first: nobody has updated yet, so it reads its neighbours' initial models plus their vectors
    torch.testing.assert_close(first[0].payload, x0[first[0].src] + 3.0, rtol=0, atol=1e-12)
    plain_first = [m for m in plain_tr.messages if m.t == 1]
    torch.testing.assert_close(first[0].payload, plain_first[0].payload + 3.0, rtol=0, atol=1e-12)


def test_an_encoding_that_is_not_a_removed_translation_is_refused():
    net = Network.from_topology("ring", 4)
    x = torch.randn(4, 3, dtype=torch.float64)
    inner = SparseComm(net)
    wire = inner.attach(Transcript())
    with pytest.raises(ValidationError, match=r"'scale' cannot encode the in-place \(Gauss–Seidel\) gossip"):
        protect(inner, Scale(2.0)).average_in_place(x, tag="x")
    assert not wire.messages  # nothing was sent unencoded
    net, task, alg = _setup("dsgd", {"form": "cta", "gossip": "authors"})
    with pytest.raises(ValidationError, match="translation"):
        _simulate(net, task, alg, protect(SparseComm(net), Scale(2.0)), _x0(task))
    # the synchronous gossip still takes it
    _simulate(net, task, make_algorithm("dsgd", form="cta"), protect(SparseComm(net), Scale(2.0)), _x0(task))


def test_wrappers_stack_on_the_sweep():
    net = Network.from_topology("erdos_renyi", 6, p=0.5, seed=4)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 2, dtype=torch.float64, generator=gen)
    a, b = torch.randn(6, 2, dtype=torch.float64, generator=gen), torch.randn(6, 2, dtype=torch.float64, generator=gen)
    inner = SparseComm(net)
    wire = inner.attach(Transcript())
    out = protect(inner, Added(a), IdentityEncoding(), Added(b)).average_in_place(x, tag="x")
    reads, expected = _reference_sweep(net, x, a + b)
    for m, got in zip(wire.messages, reads):
        torch.testing.assert_close(m.payload, got, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


# ---- ReplayComm ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params", AUTHORS)
@pytest.mark.parametrize("kind", ["decor", "dp_sgd"])
@pytest.mark.exact
def test_a_replayed_agent_reproduces_its_authors_gossip_iterates(name, params, kind):
    net, task, alg = _setup(name, params)
    comm, transcript = SparseComm(net), Transcript()
    x0 = _x0(task)
    real = _simulate(net, task, alg, comm, x0, kind, observers=[transcript])
    assert {m.t for m in transcript.messages} >= set(range(1, ROUNDS + 1))
    for agent in range(N):
        blind = x0.clone()
        blind[torch.arange(N) != agent] = math.nan
        replay = _simulate(net, task, alg, ReplayComm(transcript, comm, agent), blind, kind)
        assert torch.equal(replay.final[agent], real.final[agent]), (name, agent)


@pytest.mark.exact
def test_replay_of_one_sweep_gives_each_row_what_it_read_and_nan_elsewhere():
    nets = [Network.from_topology("erdos_renyi", 6, p=0.5, seed=s) for s in (1, 2)]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(12, 3, dtype=torch.float64, generator=gen)
    offset = torch.randn(12, 3, dtype=torch.float64, generator=gen)
    comm = StackedComm(nets)
    transcript = comm.attach(Transcript())
    real = comm.average_in_place(x, tag="x", offset=offset)
    for row in range(12):
        blind = torch.full_like(x, math.nan)
        blind[row] = x[row]
        replay = ReplayComm(transcript, comm, row)
        out = replay.average_in_place(blind, tag="x", offset=offset)
        assert torch.equal(out[row], real[row]), row
        assert bool(torch.isnan(out[torch.arange(12) != row]).all())
    with pytest.raises(ValidationError, match="out of step"):
        ReplayComm(transcript, comm, 0).average_in_place(x, tag="y")


@pytest.mark.exact
def test_a_replayed_agent_reproduces_a_protected_sweep():
    net = Network.from_topology("erdos_renyi", 6, p=0.5, seed=4)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 2, dtype=torch.float64, generator=gen)
    vector = torch.randn(6, 2, dtype=torch.float64, generator=gen)
    comm = SparseComm(net)
    transcript = comm.attach(Transcript())
    real = ProtectedComm(comm, Added(vector)).average_in_place(x, tag="x")
    for agent in range(6):
        blind = torch.full_like(x, math.nan)
        blind[agent] = x[agent]
        out = ProtectedComm(ReplayComm(transcript, comm, agent), Added(vector)).average_in_place(blind, tag="x")
        assert torch.equal(out[agent], real[agent])
