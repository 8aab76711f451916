"""The held frame's Comm and noise (issue 44, "held rows"): each held agent's row of the simulator's, bit for bit.

What is exact and why. The held-frame Comm (privdl.comm.held.HeldComm) combines each held agent's row from the
rows it reads with the simulator's canonical summation (privdl.comm.base.canonical_rows: w_ii·x_i, then each
in-neighbour's term rounded and added in canonical order) — the same elementwise float64 operations on the same
numbers as SparseComm's whole-network mix, so the same bits on any CPU (elementwise mul/add round each value alone,
whatever the tensor's shape). The noise of a held agent is drawn from its own key (and the shared keys it holds)
alone, row by row: keyed draws are row-independent by construction (tests/test_keys.py), so a held agent's noise is
the simulator's row bit for bit. The per-edge messages (pull, push, send: copies of values; reduce: the canonical
sum of each held agent's received edges) are the simulator's entries for the edges the held agents receive, bit for
bit. All are tested `exact`.
"""

from __future__ import annotations

import pytest
import torch

from privdl.comm.base import canonical_mix, canonical_neighbour_sum
from privdl.comm.held import HeldComm
from privdl.keys import HeldKeys, Keys, RootKeys
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.placement import partition
from privdl.simulator.sliced import owners_of
from tests.conftest import in_slices


# ---- the Comm and the noise: exact --------------------------------------------------------------------------------
@pytest.mark.exact
def test_the_held_comm_combines_each_held_row_as_the_simulator_bit_for_bit():
    """Each slice gives its local rows (m, d) and gets back, for each of its agents, the row of the simulator's
    canonical mix / neighbour sum of the whole network — bit for bit — from its own rows and the rows its peers
    sent; what it sends a peer is only the rows that peer's agents read."""
    net = Network.from_topology("erdos_renyi", 9, p=0.4, seed=5)
    x = torch.randn(9, 70_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # > SliceComm.SMALL
    placements = partition(9, assignment=[[0, 4, 8], [1, 2], [3, 5, 6, 7]])
    owner = owners_of(placements, 9)
    want = {"mix": canonical_mix(x, net.edges), "neighbour_sum": canonical_neighbour_sum(x, net.edges)}
    got = {}

    def work(k, transport):
        p = placements[k]
        comm = HeldComm(net, p, k, owner, transport, algorithm="test")
        mine = x[list(p.agents)]
        got[k] = {"mix": comm.mix(mine, tag="x"), "neighbour_sum": comm.neighbour_sum(mine, tag="y"),
                  "degree": comm.degree}

    transport = _threads(placements, work)
    for k, p in enumerate(placements):
        rows = list(p.agents)
        assert got[k]["mix"].shape == (len(rows), x.shape[1])
        assert torch.equal(got[k]["mix"], want["mix"][rows])
        assert torch.equal(got[k]["neighbour_sum"], want["neighbour_sum"][rows])
        assert torch.equal(got[k]["degree"].reshape(-1), net.edges.degree[rows])
    # payload: for each ordered pair of slices, the sender's agents that the receiver's agents read, x2 calls
    src, dst = net.edges.src.numpy(), net.edges.dst.numpy()
    for a in range(3):
        for b in range(3):
            if a != b:
                rows = {int(s) for s, d in zip(src, dst) if owner[s] == a and owner[d] == b}
                assert int(transport.payload_bytes[a, b]) == 2 * len(rows) * x.shape[1] * 8


def _threads(placements, work):
    """Run ``work(k, transport)`` for every slice k in a thread of its own, over one transport; returns it."""
    transport, errors = in_slices(len(placements), work)
    assert not any(errors), errors
    return transport


@pytest.mark.exact
def test_the_held_comms_per_edge_values_are_the_simulators_bit_for_bit():
    """pull, push, send and reduce in the held frame: each slice gets, for every edge its agents receive (canonical
    order), the value the simulator's Comm delivers on that edge — x_src(e) (pull), the value computed for the
    reverse edge (push), the value its sender put on the edge (send) — and reduce gives its agents' rows of the
    simulator's weighted per-edge sum, bit for bit; what crosses between two slices is one row per sender (pull)
    and one value per edge (push, send) between their agents."""
    from privdl.comm import make_comm

    net = Network.from_topology("erdos_renyi", 9, p=0.4, seed=5)
    e = net.edges
    src, dst = e.src.long(), e.dst.long()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 300, dtype=torch.float64, generator=gen)
    per_edge = torch.randn(len(e), 300, dtype=torch.float64, generator=gen)
    sim = make_comm(net, sparse=True)
    received = sim.send(per_edge, tag="s")
    want = {"pull": x[src], "push": per_edge[e.reverse.long()], "send": per_edge,
            "reduce": sim.reduce(received, weight="mixing"), "sum": sim.reduce(received)}
    placements = partition(9, assignment=[[0, 4, 8], [1, 2], [3, 5, 6, 7]])
    owner = owners_of(placements, 9)
    got = {}

    def work(k, transport):
        p = placements[k]
        comm = HeldComm(net, p, k, owner, transport, algorithm="test")
        mine_in = torch.isin(dst, torch.tensor(p.agents)).nonzero().reshape(-1)  # the edges my agents receive
        mine_out = torch.isin(src, torch.tensor(p.agents)).nonzero().reshape(-1)  # the edges they send along
        assert torch.equal(comm.edges_received, mine_in) and torch.equal(comm.edges_sent, mine_out)
        local = {a: r for r, a in enumerate(p.agents)}
        assert comm.received_by.tolist() == [local[int(d)] for d in dst[mine_in]]
        assert comm.sent_from.tolist() == [local[int(s)] for s in src[mine_out]]
        sent = comm.send(per_edge[mine_out], tag="s")
        got[k] = {"pull": comm.pull(x[list(p.agents)], tag="x"),
                  "push": comm.push(per_edge[mine_in], tag="c"),  # what my agents computed for their received edges
                  "send": sent, "reduce": comm.reduce(sent, weight="mixing"), "sum": comm.reduce(sent), "in": mine_in}

    transport = _threads(placements, work)
    for k, p in enumerate(placements):
        rows, mine_in = list(p.agents), got[k]["in"]
        for name in ("pull", "push", "send"):
            assert got[k][name].shape == (mine_in.numel(), x.shape[1])
            assert torch.equal(got[k][name], want[name][mine_in]), name
        assert torch.equal(got[k]["reduce"], want["reduce"][rows])
        assert torch.equal(got[k]["sum"], want["sum"][rows])
    # payload: pull one row per (sender, receiving slice) pair, push and send one value per edge between the slices
    for a in range(3):
        for b in range(3):
            if a != b:
                edges = [(int(s), int(d)) for s, d in zip(src, dst) if owner[s] == a and owner[d] == b]
                rows = {s for s, _ in edges}
                assert int(transport.payload_bytes[a, b]) == (len(rows) + 2 * len(edges)) * x.shape[1] * 8


@pytest.mark.exact
@pytest.mark.parametrize("shape", [(300,), (7, 11)])
def test_the_held_comms_average_is_the_simulators_bit_for_bit(shape):
    """average in the held frame (central SGD's aggregator, on slice 0): every held agent gets the simulator's mean
    of the network's rows, bit for bit (the same reduction over the same (1, n, ...) tensor, rows in agent order);
    slice 0 receives each other slice's rows (one row per agent) and sends each the mean (one row); the meters count
    the simulator's messages (the slices' counts add up to the network's)."""
    import numpy as np

    from privdl.comm import make_comm
    from privdl.comm.observers import AgentBytes, add_per_tag

    n = 9
    net = Network.from_topology("erdos_renyi", n, p=0.4, seed=5)
    x = torch.randn(n, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 1e3
    sim = make_comm(net, sparse=True)
    sim.meter = AgentBytes(n)
    want = sim.average(x, tag="g")
    assert not torch.equal(x.flip(0).mean(0), x.mean(0))  # the row order matters: the check can fail
    width = x[0].numel() * 8
    for assignment in ([[0, 4, 8], [1, 2], [3, 5, 6, 7]], [[8], [0, 1, 2, 3, 4, 5, 6, 7]]):
        placements = partition(n, assignment=assignment)
        owner = owners_of(placements, n)
        got = {}

        def work(k, transport):
            p = placements[k]
            comm = HeldComm(net, p, k, owner, transport, algorithm="test")
            comm.meter = AgentBytes(n, held=np.isin(np.arange(n), p.agents))
            got[k] = (comm.average(x[list(p.agents)], tag="g"), comm.meter)

        transport = _threads(placements, work)
        for k, p in enumerate(placements):
            assert got[k][0].shape == (len(p.agents), *shape)
            assert torch.equal(got[k][0], want[list(p.agents)])
        assert add_per_tag(*(got[k][1].per_tag() for k in got)) == sim.meter.per_tag()
        for a in range(len(placements)):
            for b in range(len(placements)):
                rows = len(placements[a].agents) if b == 0 and a != 0 else 1 if a == 0 and b != 0 else 0
                assert int(transport.payload_bytes[a, b]) == rows * width, (a, b)


@pytest.mark.exact
@pytest.mark.parametrize("name,kw", [("zip_dl", {}), ("zip_dl", {"sigma": 0.7}), ("muffliato", {"gossip_rounds": 3}),
                                     ("muffliato", {"gossip_rounds": 3, "accelerated": True})])
def test_the_comm_wrapping_mechanisms_average_each_held_row_as_the_simulator_bit_for_bit(name, kw):
    """Zip-DL's averaging (each agent's zero-sum noise on the edges it sends along and on its own copy, the noised
    copies sent, received and combined) and Muffliato's gossip rounds, around a held-frame Comm: each slice gets its
    agents' rows of the simulator's averaging (around SparseComm, every key known) bit for bit, from its own rows
    alone — its keys a HeldKeys that derives no other agent's key. What crosses between slices is, for Zip-DL, one
    value per edge between their agents (each edge's own noised copy), for Muffliato one row per (sender,
    receiving slice) pair and gossip round."""
    from privdl.comm import SparseComm

    net = Network.from_topology("erdos_renyi", 9, p=0.4, seed=5)
    e = net.edges
    src, dst = e.src.long(), e.dst.long()
    make = dict(steps=3, network=net, clip=1.0, **({"epsilon": 5.0} if "sigma" not in kw else {}), **kw)
    x = torch.randn(9, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    eta = lambda t: 0.1  # noqa: E731
    sim = make_mechanism(name, **make).wrap_comm(SparseComm(net), keys=Keys(RootKeys(4), 9), eta=eta,
                                                 algorithm="dsgd")
    sim.t = 2
    want = sim.mix(x, tag="x")
    placements = partition(9, assignment=[[0, 4, 8], [1, 2], [3, 5, 6, 7]])
    owner = owners_of(placements, 9)
    got, asked = {}, {}

    def work(k, transport):
        p = placements[k]
        source = HeldKeys(RootKeys(4), p.held, record=True)
        comm = make_mechanism(name, **make).wrap_comm(HeldComm(net, p, k, owner, transport, algorithm="dsgd"),
                                                      keys=Keys(source, 9), eta=eta, algorithm="dsgd")
        comm.t = 2
        got[k] = comm.mix(x[list(p.agents)], tag="x")
        asked[k] = source.asked

    transport = _threads(placements, work)
    for k, p in enumerate(placements):
        assert torch.equal(got[k], want[list(p.agents)])
        assert {a for a in asked[k] if isinstance(a, int)} <= set(p.agents) and not any(
            isinstance(a, tuple) for a in asked[k])
    assert not torch.equal(want, canonical_mix(x, e))  # the noise is there (Zip-DL) / the rounds are (Muffliato)
    rounds = kw.get("gossip_rounds", 1)
    for a in range(3):
        for b in range(3):
            if a != b:
                edges = [(int(s_), int(d_)) for s_, d_ in zip(src, dst) if owner[s_] == a and owner[d_] == b]
                per_call = len(edges) if name == "zip_dl" else len({s_ for s_, _ in edges})
                assert int(transport.payload_bytes[a, b]) == rounds * per_call * x.shape[1] * 8


@pytest.mark.parametrize("family", ["gaussian_ldp", "decor", "whisper"])
@pytest.mark.exact
def test_a_held_agents_noise_is_its_row_of_the_networks(family):
    """CorrelatedNoise.rows draws only the given agents' noise — from their own keys and the shared keys they hold
    (a HeldKeys that knows no other agent's key) — and equals those rows of the whole network's draw."""
    net = Network.from_topology("erdos_renyi", 8, p=0.5, seed=2)
    mech = make_mechanism(family, steps=3, network=net, clip=1.0, epsilon=5.0)
    want_noise = mech.noise
    want_noise.bind(Keys(RootKeys(4), 8))
    full = want_noise.network(2, 5000)
    held = torch.zeros(8, dtype=torch.bool)
    held[[1, 6, 7]] = True
    noise = make_mechanism(family, steps=3, network=net, clip=1.0, epsilon=5.0).noise
    source = HeldKeys(RootKeys(4), held.numpy(), record=True)
    noise.bind(Keys(source, 8))
    assert torch.equal(noise.rows(torch.tensor([1, 6, 7]), 2, 5000), full[[1, 6, 7]])
    assert {a for a in source.asked if isinstance(a, int)} <= {1, 6, 7}
