"""Comm (DESIGN.md "communication"): every backend computes the same combinations as W and the graph say; the sparse
backend sums in the documented canonical order bit for bit; per-edge pull/push/reduce route values along the right
edges; observers see every message; a transcript replays one agent's view."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.comm import SERVER, ByteCounter, DenseComm, ReplayComm, SparseComm, StackedComm, Transcript, make_comm
from privdl.errors import PrivdlError, ValidationError
from privdl.network import Network

pytestmark = pytest.mark.exact  # every test here asserts exact (bit-for-bit) values


def _net(n=9, p=0.4, seed=3):
    return Network.from_topology("erdos_renyi", n, p=p, seed=seed)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 12), p=st.floats(0.2, 1.0), seed=st.integers(0, 50))
def test_edges_are_the_graph_in_canonical_order(n, p, seed):
    net = Network.from_topology("erdos_renyi", n, p=p, seed=seed)
    e = net.edges
    pairs = list(zip(e.dst.tolist(), e.src.tolist()))
    assert pairs == sorted(pairs)  # receiver, then sender
    assert {(min(a, b), max(a, b)) for a, b in pairs} == {tuple(sorted(x)) for x in net.graph.edges()}
    assert torch.equal(e.src[e.reverse], e.dst) and torch.equal(e.dst[e.reverse], e.src)
    assert torch.equal(e.reverse[e.reverse], torch.arange(len(e)))
    np.testing.assert_array_equal(e.weight.numpy(), net.W[e.dst.numpy(), e.src.numpy()])
    np.testing.assert_array_equal(e.degree.numpy(), [d for _, d in sorted(net.graph.degree())])


def test_every_backend_mixes_as_w_and_sums_neighbours_as_the_graph():
    net = _net()
    x = torch.randn(net.n, 4, 3, dtype=torch.float64)
    W = torch.as_tensor(net.W)
    A = torch.as_tensor(np.isin(net.W, 0, invert=True).astype(float) - np.eye(net.n))
    for comm in (DenseComm(net), SparseComm(net), StackedComm([net])):
        assert torch.allclose(comm.mix(x, tag="x"), torch.einsum("ij,jab->iab", W, x), atol=1e-14)
        assert torch.allclose(comm.neighbour_sum(x, tag="x"), torch.einsum("ij,jab->iab", A, x), atol=1e-14)


def test_sparse_backend_sums_in_canonical_order_bit_for_bit():
    """w_ii·x_i first, then + w_ij·x_j for j in increasing order, each term rounded before it is added. The loop
    and the backend do the same separate elementwise products and sums, each correctly rounded whatever vector block
    an element falls in: equal bit for bit on any CPU by construction."""
    net = _net(12, 0.5, 1)
    x = torch.randn(12, 257, dtype=torch.float32)
    out = SparseComm(net).mix(x, tag="x")
    for i in range(12):
        acc = float(net.W[i, i]) * x[i]
        for j in sorted(net.neighbours(i)):
            acc = acc + float(net.W[i, j]) * x[j]
        assert torch.equal(out[i], acc), i


def _plain_row_sums(e, x, *, start, weight):
    """Reference for the canonical sums: row by row in Python, its incoming edges found by scanning the edge list
    (no slot table), sorted by sender; acc = start_i, then acc = acc + weight_e · x_e for each (``x``: one value per
    edge, ``weight`` None: no product)."""
    out = []
    for i in range(e.rows):
        acc = start[i].clone()
        for s, k in sorted((int(e.src[k]), k) for k in range(len(e)) if int(e.dst[k]) == i):
            acc = acc + (x[k] if weight is None else weight[k] * x[k])
        out.append(acc)
    return torch.stack(out)


def test_slot_sums_are_the_plain_per_row_sums_in_canonical_order():
    """mix, neighbour_sum, a weighted per-edge reduce and held rows (canonical_rows) against a plain per-row loop
    in canonical order, float64, bit for bit and sign of zero included, on ragged graphs (a Metropolis–Hastings graph
    of random pairs with isolated and high-degree rows; a peer-sampling round) and on a regular one. A row past
    its degree adds nothing (not even +0.0): a row of −0.0 terms stays −0.0, as in the loop."""
    from privdl.comm.base import _slot_sum, canonical_mix, canonical_neighbour_sum, canonical_rows
    from privdl.network.dynamics import Dynamics, mh_edges

    rng = np.random.default_rng(5)
    gen = torch.Generator().manual_seed(5)
    hub = np.concatenate([np.zeros(12, dtype=np.int64), rng.integers(1, 40, 30)])  # row 0: degree ≥ 12
    ragged = mh_edges(45, hub, np.concatenate([np.arange(1, 13), rng.integers(1, 40, 30)]))  # rows 40–44 isolated
    graphs = {"ragged": ragged, "peer sampling": Dynamics("peer_sampling", 40, seed=3, peers=2).edges(1),
              "regular": Network.from_topology("random_regular", 30, degree=4, seed=2).edges}
    assert ragged.degree.min() == 0 and ragged.degree.max() >= 12
    for name, e in graphs.items():
        n = e.rows
        x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
        low = int(torch.argmin(torch.where(e.degree > 0, e.degree, n)))  # a row with neighbours, below the max
        x[low, 0] = -0.0
        x[e.src[e.dst == low].long(), 0] = -0.0
        selfw = e.self_weight[:, None] * x
        edge_w = e.weight.double()
        want_mix = _plain_row_sums(e, x[e.src.long()], start=selfw, weight=edge_w)
        want_sum = _plain_row_sums(e, x[e.src.long()], start=torch.zeros_like(x), weight=None)
        got_mix, got_sum = canonical_mix(x, e), canonical_neighbour_sum(x, e)
        if name != "regular":
            assert torch.signbit(want_mix[low, 0]) and e.degree[low] < e.degree.max(), name
        per_edge = torch.randn(len(e), 3, generator=gen, dtype=torch.float64)
        u = torch.rand(len(e), generator=gen, dtype=torch.float64)
        want_reduce = _plain_row_sums(e, per_edge, start=torch.zeros_like(x), weight=u)
        got_reduce = _slot_sum(torch.zeros_like(x), e, per_edge, u)
        for got, want in ((got_mix, want_mix), (got_sum, want_sum), (got_reduce, want_reduce)):
            assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want)), name
        rows = torch.tensor([low, 0, n - 1, n // 2])  # held rows, from a table of only the rows they read
        read = torch.unique(torch.cat([rows, e.src[torch.isin(e.dst, rows)].long()]))
        order = read[torch.randperm(len(read), generator=gen)]
        position = torch.full((n,), -1, dtype=torch.long)
        position[order] = torch.arange(len(order))
        for weighted, want in ((True, want_mix), (False, want_sum)):
            got = canonical_rows(x[order], e, rows, position, weighted=weighted)
            assert torch.equal(got, want[rows]) and torch.equal(torch.signbit(got), torch.signbit(want[rows])), name


def test_pull_push_reduce_route_along_the_edges():
    net = _net()
    comm = SparseComm(net)
    x = torch.randn(net.n, 5, dtype=torch.float64)
    e = comm.edges
    pulled = comm.pull(x, tag="model")  # edge j → i delivers x_j to i
    assert torch.equal(pulled, x[e.src])
    # i computes a value for each incoming edge (here: a function of the sender's model and of i) and sends it back
    reply = pulled * (1 + e.dst[:, None].double())
    back = comm.push(reply, tag="reply")  # edge j → i now carries what j computed for i
    assert torch.equal(back, (x[e.dst] * (1 + e.src[:, None].double())))
    # each agent sums what it got back: Σ_j (1 + j)·x_i = x_i · Σ_{j ∈ N(i)} (1 + j)
    expected = x * torch.tensor([sum(1 + j for j in net.neighbours(i)) for i in range(net.n)],
                                dtype=torch.float64)[:, None]
    assert torch.allclose(comm.reduce(back), expected, atol=1e-12)
    # with the mixing weights, reduce of pulled values plus the own term is mix
    own = torch.as_tensor(np.diag(net.W).copy())[:, None] * x
    assert torch.allclose(own + comm.reduce(pulled, weight="mixing"), torch.as_tensor(net.W) @ x, atol=1e-14)


def test_average_is_per_independent_system():
    nets = [_net(4, 1.0, 0), Network.from_topology("ring", 4)]
    comm = StackedComm(nets)
    x = torch.randn(8, 3, dtype=torch.float64)
    out = comm.average(x, tag="g")
    assert torch.allclose(out[:4], x[:4].mean(0).expand(4, 3)) and torch.allclose(out[4:], x[4:].mean(0).expand(4, 3))


def test_stacked_comm_equals_its_systems_one_by_one():
    nets = [_net(6, 0.5, s) for s in range(3)]
    x = torch.randn(18, 7, dtype=torch.float64)
    stacked = StackedComm(nets)
    copies = StackedComm.copies(nets[0], 3)
    for r, net in enumerate(nets):
        single = DenseComm(net)
        rows = slice(6 * r, 6 * r + 6)
        assert torch.allclose(stacked.mix(x, tag="x")[rows], single.mix(x[rows], tag="x"), atol=1e-14)
        assert torch.allclose(stacked.neighbour_sum(x, tag="x")[rows], single.neighbour_sum(x[rows], tag="x"))
        assert torch.allclose(copies.mix(x, tag="x")[rows], DenseComm(nets[0]).mix(x[rows], tag="x"), atol=1e-14)
    assert torch.equal(stacked.pull(x, tag="p"), x[stacked.edges.src])
    assert int(stacked.edges.src.max()) < 18 and not bool(((stacked.edges.src // 6) != (stacked.edges.dst // 6)).any())
    with pytest.raises(ValidationError, match="same number of agents"):
        StackedComm([nets[0], Network.from_topology("ring", 5)])


def test_observers_see_every_message_with_its_tag_and_count_bytes():
    net = _net()
    comm = make_comm(net)
    tr, bc = comm.attach(Transcript()), comm.attach(ByteCounter())
    x = torch.randn(net.n, 10, dtype=torch.float32)
    comm.t = 4
    comm.mix(x, tag="theta")
    comm.neighbour_sum(x, tag="y")
    comm.average(x, tag="g")
    E = len(net.edges)
    assert tr.tags() == [(4, "theta"), (4, "y"), (4, "g"), (4, "g")]
    m = tr.messages[0]
    assert torch.equal(m.payload, x[m.src]) and torch.equal(m.dst, net.edges.dst)
    up, down = tr.messages[2], tr.messages[3]
    assert bool((up.dst == SERVER).all()) and bool((down.src == SERVER).all())
    assert bc.messages["theta"] == E and bc.bytes["theta"] == E * 10 * 4 and bc.total_bytes == 4 * 10 * (2 * E + 2 * net.n)
    received = tr.received_by(2)
    assert all(bool((mm.dst == 2).all()) for mm in received) and len(received) == 3
    comm.detach(tr)
    comm.mix(x, tag="late")
    assert len(tr.messages) == 4


def test_replay_serves_an_agent_exactly_what_it_received_and_nothing_else():
    net = _net()
    comm = SparseComm(net)
    tr = comm.attach(Transcript())
    x = torch.randn(net.n, 6, dtype=torch.float64)
    real = comm.mix(x, tag="a")
    replay = ReplayComm(tr, comm, agent=5)
    blind = x.clone()
    blind[torch.arange(net.n) != 5] = float("nan")  # the agent knows only its own row
    got = replay.mix(blind, tag="a")
    assert torch.equal(got[5], real[5]) and bool(torch.isnan(got[torch.arange(net.n) != 5]).all())
    with pytest.raises(ValidationError, match="no message left"):
        replay.mix(blind, tag="a")
    comm.neighbour_sum(x, tag="b")
    with pytest.raises(ValidationError, match="out of step"):
        ReplayComm(tr, comm, agent=1).neighbour_sum(blind, tag="zzz")


def test_network_mix_points_to_comm():
    with pytest.raises(PrivdlError, match="Comm"):
        _net().mix(torch.zeros(9, 2))


def test_authors_in_place_averaging_is_gauss_seidel_on_neighbour_averages():
    """Comm.average_in_place (seed 004's gossip) equals the matrix (I − L)⁻¹(D + U) of the neighbour-average weights
    W = diag(1/(deg+1))(A + I) split into diagonal D, strictly lower L and upper U — computed here with numpy — on a
    single network and on every system of a stacked Comm; it is row stochastic but not doubly stochastic."""
    import networkx as nx

    from privdl.comm import StackedComm, Transcript, make_comm

    nets = [Network.from_topology("erdos_renyi", 7, p=0.4, seed=s) for s in (1, 2)]
    x = torch.randn(14, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = []
    for r, net in enumerate(nets):
        a = nx.to_numpy_array(net.graph, nodelist=range(7))
        w = (a + np.eye(7)) / (a.sum(1, keepdims=True) + 1)
        lower, rest = np.tril(w, -1), np.triu(w)
        m = np.linalg.solve(np.eye(7) - lower, rest)
        assert np.allclose(m.sum(1), 1) and not np.allclose(m.sum(0), 1)
        expected.append(m @ x[7 * r:7 * (r + 1)].numpy())
        single = make_comm(net).average_in_place(x[7 * r:7 * (r + 1)], tag="x")
        np.testing.assert_allclose(single.numpy(), expected[-1], rtol=1e-12, atol=1e-12)
    comm = StackedComm(nets)
    seen = comm.attach(Transcript())
    out = comm.average_in_place(x, tag="x")
    np.testing.assert_allclose(out.numpy(), np.concatenate(expected), rtol=1e-12, atol=1e-12)
    assert sum(int(m.src.numel()) for m in seen.messages) == len(comm.edges)  # every neighbour read once
