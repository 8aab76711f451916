"""Large sparse networks (issue 16): W as CSR from edge arrays, checked against the dense path and against facts
computed independently (networkx, numpy's eigenvalues, the law of G(n, p))."""

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sps
import torch

from privdl.comm import SparseComm, StackedComm, make_comm
from privdl.errors import ValidationError
from privdl.network import Network, mixing_matrix
from privdl.network.sparse import (
    DENSE_MAX_N, _pairs, erdos_renyi_edges, require_dense, sparse_mixing, validate_sparse,
)


@pytest.mark.parametrize("rule", ["metropolis_hastings", "max_degree", "laplacian"])
@pytest.mark.parametrize("lazy", [False, True])
def test_sparse_mixing_equals_the_dense_rule_and_edges_agree(rule, lazy):
    g = nx.gnp_random_graph(40, 0.15, seed=3)
    g = g.subgraph(max(nx.connected_components(g), key=len)).copy()
    g = nx.convert_node_labels_to_integers(g, ordering="sorted")
    e = np.array(g.edges())
    w_sparse = sparse_mixing(g.number_of_nodes(), e[:, 0], e[:, 1], rule, lazy=lazy)
    w_dense = mixing_matrix(g, rule, lazy_=lazy)
    assert np.allclose(w_sparse.toarray(), w_dense, atol=1e-15)
    a, b = Network(w_sparse, None, "s"), Network(w_dense, g, "d")
    assert a.sparse and not b.sparse
    for f in ("src", "dst", "reverse"):
        assert torch.equal(getattr(a.edges, f), getattr(b.edges, f))
    assert torch.allclose(a.edges.weight, b.edges.weight, atol=1e-15)
    assert np.array_equal(a.degrees(), np.array([d for _, d in sorted(g.degree())]))
    assert a.neighbours(5) == sorted(g.neighbors(5))
    x = torch.randn(a.n, 3, dtype=torch.float64)
    assert torch.allclose(SparseComm(a).mix(x, tag="x"), torch.as_tensor(w_dense) @ x, atol=1e-13)
    assert a.fingerprint != b.fingerprint  # the two kinds never share a fingerprint


def test_pairs_enumerate_the_upper_triangle_in_order():
    n = 37
    k = np.arange(n * (n - 1) // 2)
    i, j = _pairs(n, k)
    want = np.array([(a, b) for a in range(n) for b in range(a + 1, n)])
    assert np.array_equal(np.stack([i, j], 1), want)
    # exact at the far end of a 10⁶-agent triangle (floating sqrt would be off by one there)
    n = 10**6
    last = n * (n - 1) // 2 - 1
    i, j = _pairs(n, np.array([0, n - 2, n - 1, last]))
    assert i.tolist() == [0, 0, 1, n - 2] and j.tolist() == [1, n - 1, 2, n - 1]


def test_erdos_renyi_edges_follow_gnp():
    n, p = 3000, 0.004
    counts, deg_var = [], []
    for seed in range(20):
        i, j = erdos_renyi_edges(n, p=p, seed=seed, connect="bridge")
        assert np.all(i < j) and len(set(zip(i.tolist(), j.tolist()))) == len(i)  # distinct undirected pairs
        g = nx.empty_graph(n)
        g.add_edges_from(zip(i.tolist(), j.tolist()))
        assert nx.is_connected(g)
        counts.append(len(i))
        deg_var.append(np.var(np.bincount(np.concatenate([i, j]), minlength=n)))
    pairs = n * (n - 1) / 2
    mean, sd = pairs * p, math.sqrt(pairs * p * (1 - p))
    # bridging adds ≈ n·e^(−np) ≈ 0 edges here; the mean of 20 draws lies within 4 standard errors of E|E|
    assert abs(np.mean(counts) - mean) < 4 * sd / math.sqrt(20) + n * math.exp(-n * p)
    assert abs(np.mean(deg_var) - (n - 1) * p * (1 - p)) < 0.1 * (n - 1) * p  # Binomial(n−1, p) degrees


def test_a_million_agent_ring_builds_sparse_and_mixes():
    net = Network.from_topology("ring", 10**6)
    assert net.sparse and len(net.edges) == 2 * 10**6
    assert net.facts()["spectral_gap"] is None and net.facts()["edges"] == 10**6
    x = torch.arange(net.n, dtype=torch.float64)[:, None]
    y = make_comm(net).mix(x, tag="x")
    assert isinstance(make_comm(net), SparseComm)
    assert torch.allclose(y[1:-1, 0], x[1:-1, 0])  # MH on a ring: 1/3 each, the middle of an arithmetic run
    assert math.isclose(float(y[0, 0]), (0 + 1 + (net.n - 1)) / 3)
    assert math.isclose(float(y.sum()), float(x.sum()), rel_tol=1e-12)


def test_sparse_er_refuses_resampling_that_cannot_end_and_bridges():
    n = 20_000
    with pytest.raises(ValidationError, match="isolated agents expected.*connect = \"bridge\""):
        Network.from_topology("erdos_renyi", n, p=5.0 / n)
    net = Network.from_topology("erdos_renyi", n, p=5.0 / n, connect="bridge", seed=1)
    assert net.sparse
    ncomp, _ = sps.csgraph.connected_components(net.W, directed=False)
    assert ncomp == 1


def test_validate_sparse_decides_slem_like_the_eigenvalues():
    def ring_zero_diagonal(n):
        i = np.arange(n)
        a = sps.coo_array((np.full(2 * n, 0.5), (np.r_[i, (i + 1) % n], np.r_[(i + 1) % n, i])), shape=(n, n))
        return a.tocsr()

    for n in (6, 7):  # even ring: bipartite, eigenvalue −1; odd ring: SLEM < 1
        w = ring_zero_diagonal(n)
        ev = np.sort(np.abs(np.linalg.eigvalsh(w.toarray())))
        if ev[-2] > 1 - 1e-12:
            with pytest.raises(ValidationError, match="eigenvalue −1"):
                validate_sparse(w)
        else:
            validate_sparse(w)
    w = sparse_mixing(5, np.array([0, 1, 2, 3]), np.array([1, 2, 3, 4]), "metropolis_hastings").tolil()
    w[0, 1] += 0.1
    with pytest.raises(ValidationError, match="doubly stochastic"):
        validate_sparse(w.tocsr())
    two = sps.csr_array(np.eye(4))
    with pytest.raises(ValidationError, match="disconnected"):
        validate_sparse(two)


def test_dense_objects_are_refused_up_front_with_their_size():
    net = Network.from_topology("ring", 200_000)
    with pytest.raises(ValidationError, match=r"200000×200000 .*≈ 29[0-9.]* GB"):
        net.dense("the test")
    with pytest.raises(ValidationError, match="covariance design needs dense"):
        from privdl.mechanisms import make_mechanism
        from privdl.tasks import make_task

        make_mechanism("whisper", steps=10, network=net, task=make_task("quadratic", net.n), epsilon=1.0,
                       delta=1e-5, clip=1.0)
    require_dense(100, "small")  # fits: no error


def test_stacked_comm_of_sparse_networks_mixes_edgewise():
    a = Network.from_topology("ring", DENSE_MAX_N + 2)
    b = Network.from_topology("path", DENSE_MAX_N + 2)
    comm = StackedComm([a, b])
    x = torch.randn(2 * a.n, 2, dtype=torch.float64)
    y = comm.mix(x, tag="x")
    assert torch.allclose(y[: a.n], make_comm(a).mix(x[: a.n], tag="x"))
    assert torch.allclose(y[a.n:], make_comm(b).mix(x[a.n:], tag="x"))


@pytest.mark.slow
def test_exact_diffusion_on_a_sparse_network_needs_the_lazy_rule(tmp_path):
    from privdl.algorithms import make_algorithm
    from privdl.experiment.build import check_requirements

    alg = make_algorithm("exact_diffusion")
    check_requirements(alg, Network.from_topology("ring", DENSE_MAX_N + 2, lazy=True))
    with pytest.raises(ValidationError, match="lazy = true"):
        check_requirements(alg, Network.from_topology("ring", DENSE_MAX_N + 2))


@pytest.mark.slow
def test_a_config_with_a_large_network_runs_end_to_end(tmp_path):
    from privdl.experiment.config import load_config
    from privdl.experiment.runner import run_experiment

    cfg = tmp_path / "big.toml"
    cfg.write_text('name = "big"\niterations = 3\n[network]\ntopology = "ring"\nn = 100000\n'
                   '[task]\nname = "quadratic"\n[schedule]\nname = "constant"\neta = 0.001\n')
    summary = run_experiment(load_config(cfg), tmp_path / "out", progress=False)
    assert summary.executed == 1
    import csv
    import json

    from privdl.tasks.quadratic import quadratic_optimum, quadratic_problem

    rows = list(csv.DictReader(open(summary.results)))
    gap0 = next(float(r["value"]) for r in rows if r["metric"] == "optimality_gap" and r["iteration"] == "0")
    A, c = quadratic_problem(100_000)
    _, f_star = quadratic_optimum(A, c)
    assert math.isclose(gap0, np.einsum("ki,kij,kj->k", c, A, c).mean() - f_star, rel_tol=1e-9)  # x0 = 0
    assert any(r["iteration"] == "3" for r in rows)
    man = json.loads(next((tmp_path / "out" / "runs").glob("*/manifest.json")).read_text())
    assert man["network"]["representation"] == "sparse" and man["network"]["edges"] == 100000


def test_quadratic_objective_closed_form_matches_the_sum():
    from privdl.tasks import make_task

    task = make_task("quadratic", 5000)
    x = torch.randn(4000, 2, dtype=torch.float64) * 100
    direct = torch.cat([task.objective(x[k:k + 2]) for k in range(0, 8, 2)])  # under the size switch
    closed = task.objective(x)[:8]  # 4000 × 5000 pairs: the closed form
    assert torch.allclose(direct, closed, rtol=1e-10)


@pytest.mark.parametrize("n", [60, DENSE_MAX_N + 500])
def test_every_edge_knows_its_reverse_and_indices_are_int32(n):
    net = Network.from_topology("erdos_renyi", n, p=8.0 / n, connect="bridge", seed=4)
    e = net.edges
    assert e.src.dtype == e.dst.dtype == e.reverse.dtype == torch.int32
    src, dst, rev = e.src.numpy(), e.dst.numpy(), e.reverse.numpy()
    position = {(int(s), int(d)): k for k, (s, d) in enumerate(zip(src, dst))}  # an independent lookup
    assert all(rev[k] == position[(int(d), int(s))] for k, (s, d) in enumerate(zip(src, dst)))
    assert np.array_equal(np.lexsort((src, dst)), np.arange(len(src)))  # canonical: by dst, then src


def test_a_support_that_is_not_symmetric_is_refused():
    n = 6  # W = (I + P)/2 with P a cyclic shift: doubly stochastic, connected, primitive, but a directed graph
    p = sps.csr_array((np.ones(n), (np.arange(n), (np.arange(n) + 1) % n)), shape=(n, n))
    with pytest.raises(ValidationError, match="symmetric support"):
        validate_sparse(0.5 * (sps.eye_array(n, format="csr") + p))
    assert validate_sparse(0.5 * (sps.eye_array(n) + 0.5 * (p + p.T))).shape == (n, n)  # its symmetrisation passes


def test_sparse_er_builds_in_linear_memory():
    """The graph, W and its edges at ≈ 50 bytes per directed edge at the peak (the first sparse version took ≈ 85;
    the edge tensors alone are 20: int32 src, dst, reverse and a float64 weight)."""
    import tracemalloc

    n = 200_000
    tracemalloc.start()
    try:
        net = Network.from_topology("erdos_renyi", n, p=10.0 / n, connect="bridge")
        edges = len(net.edges)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert net.W.indices.dtype == np.int32
    assert peak < 60 * edges, (peak / edges, edges)
