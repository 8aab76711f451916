"""Directed networks (issue 46 item 2): push-sum weights, strong connectivity, stochastic gradient push (SGP), what
may run on a directed graph, and the sliced backend. Each check is against an independent fact: closed-form weights,
the exact average, the closed-form minimiser of the average quadratic loss, a numpy recurrence."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.algorithms.base import StepContext
from privdl.comm import Transcript, make_comm
from privdl.errors import ConfigError, ValidationError
from privdl.experiment import expand
from privdl.experiment.build import build
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.network.directed import DirectedNetwork, load_directed_file
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.sliced import simulate_sliced
from privdl.tasks import make_task, quadratic_optimum, quadratic_problem
from tests.conftest import run_toml


@pytest.fixture(scope="module")
def digraph():
    """A strongly connected directed Erdős–Rényi graph on 8 agents whose push-sum A is not doubly stochastic (its
    Perron vector is far from uniform: plain mixing does not average on it)."""
    net = DirectedNetwork.from_topology("directed_erdos_renyi", 8, p=0.3, seed=1)
    assert np.ptp(net.perron) > 0.1
    return net


def test_push_sum_weights_split_each_senders_mass_over_its_out_neighbours_and_itself():
    net = DirectedNetwork.from_edges(3, [(0, 1), (0, 2), (1, 0), (2, 0), (2, 1)])
    a = net.W
    # agent 0 sends to 1 and 2 (outdeg 2): thirds; agent 1 sends to 0 (outdeg 1): halves; agent 2 to 0 and 1: thirds
    want = np.array([[1 / 3, 1 / 2, 1 / 3], [1 / 3, 1 / 2, 1 / 3], [1 / 3, 0, 1 / 3]])
    assert np.allclose(a, want, rtol=0, atol=1e-15)
    assert net.directed and not Network.from_topology("ring", 4).directed
    assert net.out_neighbours(1) == [0] and net.neighbours(1) == [0, 2]  # in-neighbours: whom it hears
    e = net.edges  # every edge i → j once, by receiver then sender, with weight A[j, i]
    assert list(zip(e.src.tolist(), e.dst.tolist())) == [(1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]
    assert torch.allclose(e.weight, torch.tensor([1 / 2, 1 / 3, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64))


@pytest.mark.parametrize("edges,message", [
    ([(0, 1), (1, 2), (2, 0), (2, 3)], "node 3 cannot reach node 0"),
    ([(0, 1), (1, 2), (2, 0), (3, 2)], "node 0 cannot reach node 3"),
])
def test_a_graph_that_is_not_strongly_connected_is_refused_naming_a_node(edges, message):
    with pytest.raises(ValidationError, match=message):
        DirectedNetwork.from_edges(4, edges)


def test_directed_erdos_renyi_is_redrawn_until_strongly_connected():
    for seed in range(10):
        assert nx.is_strongly_connected(DirectedNetwork.from_topology("directed_erdos_renyi", 10, p=0.2,
                                                                      seed=seed).graph)
    with pytest.raises(ValidationError, match="not strongly connected in any of 200 draws; increase p"):
        DirectedNetwork.from_topology("directed_erdos_renyi", 10, p=0.01)


def test_push_sum_averaging_reaches_the_exact_average(digraph):
    """SGP with no gradient is push-sum: z = x / w → (1/n) Σ x0 exactly (A^t → π1ᵀ, x/w → π(1ᵀx0)/(nπ)); plain
    mixing x ← A x goes to n π · average instead, far from it on this graph (so the check can fail)."""
    x0 = torch.tensor(np.random.default_rng(0).normal(size=(8, 3)))
    comm = make_comm(digraph)
    alg = make_algorithm("sgp")
    ctx = StepContext(0, 0.1, comm, lambda z, **_: torch.zeros_like(z))
    s = alg.init(x0, ctx)
    plain = x0.clone()
    for t in range(1, 400):
        s = alg.step(s, StepContext(t, 0.1, comm, lambda z, **_: torch.zeros_like(z)))
        plain = comm.mix(plain, tag="x")
    avg = x0.mean(0)
    assert torch.allclose(alg.params(s), avg.expand(8, 3), rtol=0, atol=1e-12)  # SLEM^400 ≈ 1e-70: rounding only
    assert torch.allclose(s.x.sum(0), x0.sum(0), rtol=0, atol=1e-12) and abs(float(s.w.sum()) - 8) < 1e-12
    assert (plain - avg).abs().max() > 0.1


def _quadratic_run(net, eta, iterations, algorithm="sgp"):
    task = make_task("quadratic", net.n, dtype=torch.float64)
    return simulate(task=task, network=net, algorithm=make_algorithm(algorithm),
                    mechanism=make_mechanism("none", steps=iterations),
                    schedule=make_schedule("constant", eta=eta, iterations=iterations), iterations=iterations,
                    seed=0, metrics=False).final.numpy()


def test_sgp_converges_to_the_minimiser_of_the_average_loss(digraph):
    """Full-gradient SGP with a constant step η: its fixed point z(η) is a smooth function of η with z(0) = x* (at
    η = 0 the stationary point has consensus and Σ_i ∇f_i(z) = 0), so z(η) = x* + η b + O(η²). Checks: the error
    halves with η (a limit z(0) = x* + β, β ≠ 0, would not: the ratio bounds |β| to a few % of the error), and the
    Richardson extrapolation 2 z(η/2) − z(η) removes the O(η) term — what is left, O(η²), is measured at ~12% of
    the error at η/2 for these η (the ratio shrinks with η), bounded by 20%. x* = (Σ A_i)⁻¹ Σ A_i c_i, the
    closed-form minimiser of the AVERAGE loss. T = 1/(8η)·8 rounds contract the transient by (1 − 2μη)^T ≈ e⁻¹⁶
    (μ = 2, the smallest curvature of 2A_i)."""
    n = digraph.n
    x_star, _ = quadratic_optimum(*quadratic_problem(n))
    big, small = _quadratic_run(digraph, 0.008, 1000), _quadratic_run(digraph, 0.004, 2000)
    e_big, e_small = np.abs(big - x_star).max(), np.abs(small - x_star).max()
    assert 0.45 < e_small / e_big < 0.55, (e_big, e_small)
    assert np.abs(2 * small - big - x_star).max() < 0.2 * e_small
    assert e_small < 0.2


def test_dsgd_with_the_push_sum_matrix_converges_to_a_biased_point(digraph):
    """Plain D-SGD x ← A(x − η∇f(x)) with the same column-stochastic A (numpy: the library refuses dsgd on a
    directed network) settles far from x*, and no smaller step removes it: its average is preserved but its
    agents go to n π_i times it."""
    n = digraph.n
    A, c = quadratic_problem(n)
    x_star, _ = quadratic_optimum(A, c)
    errors = []
    for eta, steps in ((0.008, 1000), (0.004, 2000)):
        x = np.zeros((n, 2))
        for _ in range(steps):
            x = digraph.W @ (x - eta * 2 * np.einsum("kij,kj->ki", A, x - c))
        errors.append(np.abs(x - x_star).max())
    assert min(errors) > 1.0 and errors[1] > 0.9 * errors[0]


def _cfg(tmp_path, network: str, algorithm: str = "sgp", mechanism: str = 'name = "none"'):
    text = (f"iterations = 5\nseed = 0\n[network]\n{network}\n[task]\nname = \"quadratic\"\n[algorithm]\n"
            f"name = \"{algorithm}\"\n[mechanism]\n{mechanism}\n[schedule]\nname = \"constant\"\neta = 0.01\n")
    (tmp_path / "exp.toml").write_text(text)
    return text


def test_a_config_runs_sgp_on_a_directed_ring(tmp_path):
    manifest = run_toml(tmp_path, _cfg(tmp_path, 'topology = "directed_ring"\nn = 5'))
    facts = manifest["network"]
    assert facts["directed"] is True and facts["edges"] == 5 and facts["mixing"] == "push_sum"
    # SLEM of A = (I + P)/2, P the 5-cycle: max_{k≠0} |1 + e^{2πik/5}| / 2 = cos(π/5)
    assert facts["spectral_gap"] == pytest.approx(1 - np.cos(np.pi / 5), abs=1e-12)


def _build(text):
    import tomllib

    return build(expand(tomllib.loads(text))[0][0].config)


@pytest.mark.parametrize("network,algorithm,mechanism,error,match", [
    ('topology = "directed_ring"\nn = 5', "dsgd", 'name = "none"', ValidationError,
     "algorithm 'dsgd' cannot run on a directed network: it assumes an undirected graph"),
    ('topology = "directed_ring"\nn = 5', "dpdl", 'name = "none"', ValidationError,
     "along both directions of every edge"),
    ('topology = "directed_ring"\nn = 5', "exact_diffusion", 'name = "none"', ValidationError,
     "algorithm 'exact_diffusion' cannot run on a directed network"),
    ('topology = "directed_ring"\nn = 5', "sgp", 'name = "whisper"\nepsilon = 5.0\nseeds = "edges"',
     ValidationError, "whisper on a directed network solves problem \\(P\\) with one global seed only"),
    ('topology = "directed_ring"\nn = 5', "sgp", 'name = "decor"\nepsilon = 5.0', ValidationError,
     "mechanism 'decor' cannot run on a directed network: its canceling terms"),
    ('topology = "directed_ring"\nn = 5', "sgp", 'name = "muffliato"\nsigma = 1.0', ValidationError,
     "mechanism 'muffliato' cannot run on a directed network: its gossip"),
    ('topology = "ring"\nn = 5', "sgp", 'name = "zip_dl"\nsigma = 1.0', ValidationError,
     "mechanism 'zip_dl' averages what the algorithm sends once per round"),
    ('topology = "ring"\nn = 5\nmixing = "push_sum"', "sgp", 'name = "none"', ValidationError,
     "push_sum.*add directed = true"),
    ('topology = "directed_ring"\nn = 5\ndirected = false', "sgp", 'name = "none"', ValidationError,
     "is directed: remove directed = false"),
    ('topology = "ring"\nn = 5\ndirected = true\nmixing = "metropolis_hastings"', "sgp", 'name = "none"',
     ValidationError, "a directed network mixes by 'push_sum'"),
    ('topology = "ring"\nn = 5\ndirected = "yes"', "sgp", 'name = "none"', ConfigError, "network.directed"),
])
def test_bad_directed_configs_are_refused_by_name(tmp_path, network, algorithm, mechanism, error, match):
    with pytest.raises(error, match=match):
        _build(_cfg(tmp_path, network, algorithm, mechanism))


def test_an_undirected_topology_with_directed_true_sends_both_ways(tmp_path):
    c = _build(_cfg(tmp_path, 'topology = "star"\nn = 4\ndirected = true'))
    # the hub (outdeg 3) keeps and sends a quarter; each leaf (outdeg 1) halves
    assert c.network.directed and np.allclose(c.network.W[:, 0], 0.25) and c.network.W[0, 1] == 0.5


def test_a_directed_edge_list_file_reads_i_to_j(tmp_path):
    (tmp_path / "g.txt").write_text("0 1\n1 2\n2 0\n0 2\n")
    net = load_directed_file(tmp_path / "g.txt")
    assert sorted(net.graph.edges()) == [(0, 1), (0, 2), (1, 2), (2, 0)]
    assert net.W[1, 0] == pytest.approx(1 / 3) and net.W[0, 2] == pytest.approx(1 / 2)
    text = _cfg(tmp_path, 'file = "g.txt"\ndirected = true').replace("iterations = 5", f"base_dir = '{tmp_path}'"
                                                                        "\niterations = 5")
    assert _build(text).network.fingerprint == net.fingerprint
    (tmp_path / "h.txt").write_text("0 1\n1 2\n")
    with pytest.raises(ValidationError, match="h.txt.*node 1 cannot reach node 0"):
        load_directed_file(tmp_path / "h.txt")


def test_ldp_runs_with_sgp_and_states_its_epsilon(digraph):
    task = make_task("quadratic", 8, dtype=torch.float64)
    mech = make_mechanism("gaussian_ldp", steps=20, network=digraph, clip=1.0, epsilon=3.0)
    res = simulate(task=task, network=digraph, algorithm=make_algorithm("sgp"), mechanism=mech,
                   schedule=make_schedule("constant", eta=0.01, iterations=20), iterations=20, seed=0)
    assert mech.ledger(res.accesses).epsilon == pytest.approx(3.0, rel=1e-6)
    assert torch.all(res.accesses == 20)


@pytest.mark.parametrize("family", ["none", "gaussian_ldp"])
@pytest.mark.exact
def test_a_sliced_sgp_run_on_a_digraph_equals_the_simulator_bit_for_bit(family):
    net = DirectedNetwork.from_topology("directed_erdos_renyi", 5, p=0.4, seed=2)
    task = make_task("softmax", 5, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)
    mech = (make_mechanism("none", steps=3) if family == "none" else
            make_mechanism(family, steps=3, network=net, clip=1.0, epsilon=20.0))
    sched = make_schedule("constant", eta=0.1, iterations=3)
    want_wire = Transcript()
    want = simulate(task=task, network=net, algorithm=make_algorithm("sgp"), mechanism=mech, schedule=sched,
                    iterations=3, seed=11, sparse=True, eval_every=1, observers=[want_wire])
    for k in (2, 5):
        wire = Transcript()
        got = simulate_sliced(task=task, network=net, algorithm=make_algorithm("sgp"), mechanism=mech,
                              schedule=sched, iterations=3, seed=11, slices=k, eval_every=1, observers=[wire])
        assert torch.equal(got.final, want.final) and got.records == want.records, k
        assert [(m.tag, m.src.tolist(), m.dst.tolist()) for m in wire.messages] == \
            [(m.tag, m.src.tolist(), m.dst.tolist()) for m in want_wire.messages]
        assert all(torch.equal(a.payload, b.payload) for a, b in zip(wire.messages, want_wire.messages))


def test_the_library_refuses_dsgd_on_a_directed_network(digraph):
    with pytest.raises(ValidationError, match="algorithm 'dsgd' cannot run on a directed network"):
        _quadratic_run(digraph, 0.01, 2, algorithm="dsgd")
    with pytest.raises(ValidationError, match="algorithm 'dsgd' cannot run on a directed network"):
        simulate_sliced(task=make_task("quadratic", 8), network=digraph, algorithm=make_algorithm("dsgd"),
                        mechanism=make_mechanism("none", steps=2), iterations=2, seed=0, slices=2,
                        schedule=make_schedule("constant", eta=0.1, iterations=2))


@pytest.mark.parametrize("p,seed,singular", [(0.4, 0, False), (0.5, 4, True)])
def test_whisper_solves_problem_p_for_a_non_symmetric_push_sum_matrix(p, seed, singular):
    """Problem (P), min Tr(A R Aᵀ) s.t. [R⁻¹]_ii ≤ b, for a column-stochastic, non-symmetric A (a non-singular one:
    the eigh-based dual iteration; a singular one: the least-trace tie-break): privdl's dual solver (both methods)
    against cvxpy's SDP (Clarabel, interior point: agreement measured within 1e-8 relative, bounded by 1e-6). The
    design for Aᵀ differs by more than 1%, so a transposition would fail the check. The certificate, the relative
    duality gap, is within the solver's stopping tolerance (1e-10; bounded by 1e-9), and the design beats LDP's
    Tr(AAᵀ)/b."""
    pytest.importorskip("cvxpy")
    from privdl.covariance.designs import whisper_design
    from privdl.covariance.reference import solve_precision

    a = DirectedNetwork.from_topology("directed_erdos_renyi", 7, p=p, seed=seed).W
    assert np.abs(a - a.T).max() > 0.3
    ref = solve_precision(a, bound=2.0).trace
    for method in ("fixed_point", "newton"):
        d = whisper_design(a, 2.0, method=method)
        assert d.singular == singular
        assert d.trace == pytest.approx(ref, rel=1e-6) and d.extra["relative_duality_gap"] < 1e-9
        assert d.max_precision_ratio <= 1 + 1e-9 and d.trace < d.trace_ldp
    assert abs(whisper_design(np.ascontiguousarray(a.T), 2.0).trace / ref - 1) > 0.01


def test_whisper_runs_with_sgp_on_a_directed_network(tmp_path):
    manifest = run_toml(tmp_path, _cfg(tmp_path, 'topology = "directed_erdos_renyi"\nn = 6\np = 0.5',
                                       mechanism='name = "whisper"\nepsilon = 5.0'))
    assert manifest["network"]["directed"] is True
    assert manifest["privacy_ledger"][0]["epsilon"] == pytest.approx(5.0, rel=1e-6)
    assert manifest["mechanism"]["trace"] < manifest["mechanism"]["trace_ldp"]


def test_zip_dl_noise_over_out_edges_leaves_the_network_sum_unperturbed(digraph):
    """Per sender a, Σ_{v ∈ out(a) ∪ {a}} A[v, a] Z_{a→v} = 0, so one noisy push-sum mix keeps Σ_i x_i (A column
    stochastic) while every agent's value moves; the weight's mix is A w exactly. Push-sum's uniform split gives
    Remark 3.4's closed form c_{a→v} = (d_a − 1)/d_a, d_a = outdeg(a) + 1. (Built from A instead of Aᵀ the plan
    would put the reverse direction's weight, 0 on a one-way edge, on each message: refused.)"""
    from privdl.keys import Keys

    mech = make_mechanism("zip_dl", steps=5, network=digraph, sigma=1.0)
    d = digraph.out_degrees() + 1.0
    assert np.allclose(mech.plan["c_edge"], ((d - 1) / d)[mech.src], rtol=0, atol=1e-14)
    inner = make_comm(digraph)
    comm = mech.wrap_comm(inner, keys=Keys(0, 8), eta=lambda t: 0.5, algorithm="sgp")
    comm.t = inner.t = 1
    x = torch.tensor(np.random.default_rng(1).normal(size=(8, 4)))
    out = comm.mix(x, tag="x")
    plain = torch.as_tensor(digraph.W) @ x
    assert torch.allclose(out.sum(0), x.sum(0), rtol=0, atol=1e-12)
    assert (out - plain).abs().max() > 0.1
    w = torch.ones(8, 1, dtype=torch.float64)
    assert torch.equal(comm.mix(w, tag="w"), inner.mix(w, tag="w"))


def test_zip_dl_runs_with_sgp_on_a_directed_network(tmp_path):
    manifest = run_toml(tmp_path, _cfg(tmp_path, 'topology = "directed_erdos_renyi"\nn = 6\np = 0.5',
                                       mechanism='name = "zip_dl"\nepsilon = 5.0'))
    assert manifest["privacy_ledger"][0]["epsilon"] == pytest.approx(5.0, rel=1e-3)


@pytest.mark.slow
def test_sgp_on_a_digraph_on_processes_equals_the_simulator_to_rounding(tmp_path):
    """privdl run --procs 3, SGP + LDP on a directed Erdős–Rényi graph, writes the simulator's results.csv to
    rounding (each process computes only its agents' rows: tests/test_runtime.py's REL)."""
    import csv

    from typer.testing import CliRunner

    from privdl.cli import app

    text = _cfg(tmp_path, 'topology = "directed_erdos_renyi"\nn = 6\np = 0.4',
                mechanism='name = "gaussian_ldp"\nepsilon = 5.0').replace("iterations = 5", "iterations = 12\n"
                                                                          "eval_every = 4")
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    runner = CliRunner()

    def rows(out):
        with open(out / "results.csv") as f:
            return [(r["iteration"], r["metric"], float(r["value"])) for r in csv.DictReader(f)]

    want = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "sim"), "--no-plot", "--quiet"])
    assert want.exit_code == 0, want.output
    got = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "p3"), "--procs", "3", "--no-plot"])
    assert got.exit_code == 0, got.output
    a, b = rows(tmp_path / "p3"), rows(tmp_path / "sim")
    assert len(a) == len(b) > 0 and [r[:2] for r in a] == [r[:2] for r in b]
    assert all(np.isclose(x[2], y[2], rtol=1e-9, atol=1e-12) for x, y in zip(a, b)), (a, b)


def test_neighbour_sums_on_a_digraph_add_what_each_agent_hears():
    """comm.neighbour_sum on a directed network sums over in-neighbours only (dense, sparse and stacked Comms alike)."""
    from privdl.comm import StackedComm

    net = DirectedNetwork.from_edges(3, [(0, 1), (1, 2), (2, 0), (0, 2)])
    x = torch.tensor([[1.0], [10.0], [100.0]], dtype=torch.float64)
    want = torch.tensor([[100.0], [1.0], [11.0]], dtype=torch.float64)  # 0 hears 2; 1 hears 0; 2 hears 0 and 1
    for comm in (make_comm(net, sparse=False), make_comm(net, sparse=True)):
        assert torch.equal(comm.neighbour_sum(x, tag="s"), want)
    assert torch.equal(StackedComm(net, 2).neighbour_sum(torch.cat([x, x]), tag="s"), torch.cat([want, want]))


def test_the_directed_recipes_config_runs_as_written(tmp_path):
    """docs/recipes/directed.md's config (its toml block), through load_config and the runner."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "recipes" / "directed.md").read_text()
    (block,) = re.findall(r"^```toml\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    manifest = run_toml(tmp_path, block)
    assert manifest["network"]["directed"] is True and manifest["config"]["algorithm"]["name"] == "sgp"
    assert manifest["privacy_ledger"][0]["epsilon"] == pytest.approx(10.0, rel=1e-6)


def test_a_directed_mixing_file_is_validated_column_by_column(tmp_path):
    a = DirectedNetwork.from_topology("directed_erdos_renyi", 5, p=0.5, seed=0).W
    np.savetxt(tmp_path / "a.csv", a, delimiter=",")
    assert np.allclose(load_directed_file(tmp_path / "a.csv", kind="mixing").W, a, rtol=0, atol=1e-15)
    np.savetxt(tmp_path / "rows.csv", a.T / a.T.sum(axis=1, keepdims=True), delimiter=",")  # row, not column
    with pytest.raises(ValidationError, match=r"rows.csv: directed mixing matrix is not column stochastic: column \d"):
        load_directed_file(tmp_path / "rows.csv", kind="mixing")
    s = np.zeros((3, 3))
    s[0, 1] = s[1, 2] = s[2, 0] = 1  # adjacency S[i, j] = 1: edge i → j
    np.savetxt(tmp_path / "s.txt", s)
    assert sorted(load_directed_file(tmp_path / "s.txt").graph.edges()) == [(0, 1), (1, 2), (2, 0)]


@pytest.mark.exact
def test_an_sgp_run_on_a_digraph_resumes_from_its_checkpoint_bit_for_bit(digraph, tmp_path):
    """The push-sum weights are run state: a run cut after round 5 and resumed from its per-agent checkpoint equals the
    uninterrupted one bit for bit (tests/test_checkpoint.py's argument: same operations on the same numbers)."""
    from privdl.simulator.checkpoint import Checkpoints
    from tests.conftest import Stop, stop_after

    task = make_task("quadratic", 8, dtype=torch.float64)
    mech = make_mechanism("gaussian_ldp", steps=10, network=digraph, clip=1.0, epsilon=20.0)
    kw = dict(task=task, network=digraph, algorithm=make_algorithm("sgp"), mechanism=mech, iterations=10, seed=7,
              schedule=make_schedule("constant", eta=0.01, iterations=10), sparse=True, eval_every=2)
    want = simulate(**kw)
    ck = lambda: Checkpoints([tmp_path], [{"run_id": "r", "config_digest": "c", "source": "s"}], n=8,  # noqa: E731
                             every=3)
    with pytest.raises(Stop):
        simulate(**kw, checkpoints=ck(), on_step=stop_after(5))
    got = simulate(**kw, checkpoints=ck(), resume=True)
    assert torch.equal(got.final, want.final) and got.records == want.records


def test_the_eavesdropper_de_biases_push_sum_messages_into_the_senders_z(digraph):
    """SGP with no gradient (push-sum): a sender's round-t messages are x_i(t−1) and w_i(t−1), so an eavesdropper
    hearing both recovers z_i(t−1) = x_i / w_i, the run's de-biased iterate, to rounding (window = 1). One that
    averages the numerators alone (no ``transmits``: the earlier attacker) is off by the factor w_i, far from 1
    on this graph (non-uniform Perron vector): its error is large."""
    from privdl.comm.eavesdropper import Eavesdropper

    n = digraph.n
    x0 = torch.tensor(np.random.default_rng(4).normal(size=(n, 3)))
    comm = make_comm(digraph)
    alg = make_algorithm("sgp")
    zero = lambda z, **_: torch.zeros_like(z)  # noqa: E731
    target = lambda t: torch.zeros(3, dtype=torch.float64)  # noqa: E731
    spy = comm.attach(Eavesdropper(n, window=1, target=target, transmits=alg.transmits))
    naive = comm.attach(Eavesdropper(n, window=1, target=target))
    s = alg.init(x0, StepContext(0, 0.1, comm, zero))
    for t in range(1, 6):
        z = alg.params(s)
        comm.t = t
        s = alg.step(s, StepContext(t, 0.1, comm, zero))
        torch.testing.assert_close(spy.estimate(), z, rtol=1e-12, atol=1e-12)
        if t >= 2:  # (round 1: w = 1 everywhere, the numerator is z)
            assert (naive.estimate() - z).abs().max() > 0.05
    assert naive.tag == "x" and spy.tag == "x" and spy.weight_tag == "w"
