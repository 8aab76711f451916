"""Time-varying graphs ([network] dynamics, issue 46 item 1): the law of W(t), the round loop on W(t), refusals.

Facts checked, each independent of privdl's own validation: every W(t) is symmetric doubly stochastic (dense numpy);
the one-peer exponential graph with n a power of 2 averages exactly in log₂ n rounds (Ying et al. 2021; the product
of the log₂ n matchings of the hypercube is 11ᵀ/n) while random matchings do not; the messages of a run are exactly
W(t)'s edges; the sliced backend equals the simulator bit for bit on W(t).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privdl.comm import Transcript, make_comm
from privdl.errors import ConfigError, ValidationError
from privdl.experiment.build import build_network
from privdl.algorithms import make_algorithm
from privdl.mechanisms import make_mechanism
from privdl.network.dynamics import Dynamics
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.sliced import simulate_sliced
from privdl.tasks import make_task

LAWS = [("random_matching", {}), ("one_peer_exponential", {}), ("peer_sampling", {"peers": 2})]


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("name,kw", LAWS)
@pytest.mark.parametrize("n", [7, 16])
def test_every_round_is_symmetric_doubly_stochastic(name, kw, n, lazy):
    d = Dynamics(name, n, seed=5, lazy=lazy, **kw)
    if lazy:
        assert d.matrix(2).diagonal().min() >= 0.5
    for t in range(12):
        w = d.matrix(t).toarray()
        assert np.array_equal(w, w.T) and w.min() >= 0
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    if name == "peer_sampling":  # every agent has at least its k out-peers (symmetrised: maybe more)
        assert ((d.matrix(3).toarray() > 0).sum(axis=1) - 1 >= 2).all()


def test_the_law_is_a_function_of_the_run_seed_only():
    a, b, c = (Dynamics("random_matching", 10, seed=s) for s in (1, 1, 2))
    assert all(np.array_equal(a.matrix(t).toarray(), b.matrix(t).toarray()) for t in range(5))
    assert any(not np.array_equal(a.matrix(t).toarray(), c.matrix(t).toarray()) for t in range(5))


def _average_through_comm(network, rounds, start=1, n=None):
    """Plain averaging x ← W(t) x through the run's Comm for ``rounds`` rounds from round ``start``."""
    comm = make_comm(network)
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(network.n, 3)))
    y = x.clone()
    for t in range(start, start + rounds):
        comm.t = t
        y = comm.mix(y, tag="x")
    return (y - x.mean(dim=0)).abs().max().item()


@pytest.mark.parametrize("n", [8, 16])
def test_one_peer_exponential_averages_exactly_in_log2_n_rounds(n):
    """Ying et al. 2021: on the one-peer exponential graph with n = 2^τ, any τ consecutive rounds of plain averaging
    give the exact average (up to rounding: τ halvings of sums of doubles), and τ − 1 rounds do not."""
    net = build_network({"dynamics": "one_peer_exponential", "n": n}, 3)
    tau = int(np.log2(n))
    for start in (1, 2):
        assert _average_through_comm(net, tau, start) < 1e-12
    assert _average_through_comm(net, tau - 1) > 1e-3


@pytest.mark.parametrize("n", [8, 16])
def test_random_matching_does_not_average_in_log2_n_rounds(n):
    net = build_network({"dynamics": "random_matching", "n": n}, 3)
    assert _average_through_comm(net, int(np.log2(n))) > 1e-3


def _run(net, task, alg, mech, rounds, **kw):
    sched = make_schedule("constant", eta=0.1, iterations=rounds)
    return simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds,
                    seed=4, **kw)


@pytest.mark.parametrize("name,kw", LAWS)
def test_messages_and_bytes_follow_the_rounds_edges(name, kw):
    n, rounds = 6, 4
    net = build_network({"dynamics": name, "n": n, **kw}, 9)
    task = make_task("quadratic", n)
    alg = make_algorithm("dsgd")
    wire = Transcript()
    res = _run(net, task, alg, make_mechanism("none", steps=alg.accesses(rounds, net.edges)), rounds,
               observers=[wire])
    sent = {m.t: (m.src.tolist(), m.dst.tolist()) for m in wire.messages}
    for t in range(1, rounds + 1):
        e = net.dynamics.edges(t)
        assert sent[t] == (e.src.tolist(), e.dst.tolist())
    total = sum(len(net.dynamics.edges(t)) for t in range(1, rounds + 1))
    assert res.extra["bytes"]["x"]["messages"] == total


@pytest.mark.exact
@pytest.mark.parametrize("name,kw", LAWS[:2])
def test_sliced_equals_the_simulator_on_a_time_varying_graph(name, kw):
    n, rounds = 6, 3
    net = build_network({"dynamics": name, "n": n, **kw}, 2)
    task = make_task("softmax", n, dataset="digits", batch_size=8, seed=1)
    for alg_name in ("dsgd", "dsgt"):
        alg = make_algorithm(alg_name)
        mech = make_mechanism("gaussian_ldp", steps=alg.accesses(rounds, net.edges), network=net, clip=1.0,
                              epsilon=20.0)
        sched = make_schedule("constant", eta=0.1, iterations=rounds)
        want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds,
                        seed=3, sparse=True, eval_every=1)
        got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched,
                              iterations=rounds, seed=3, slices=3, eval_every=1)
        assert torch.equal(got.final, want.final)
        assert got.records == want.records


def test_a_cycle_of_graph_files(tmp_path):
    (tmp_path / "a.csv").write_text("0,1\n2,3\n")
    (tmp_path / "b.csv").write_text("1,2\n3,0\n")
    net = build_network({"dynamics": "cycle", "graphs": ["a.csv", "b.csv"]}, 0, str(tmp_path))
    d = net.dynamics
    assert d.n == 4 and d.period == 2 and len(d.law()["fingerprints"]) == 2
    want_a = np.array([[.5, .5, 0, 0], [.5, .5, 0, 0], [0, 0, .5, .5], [0, 0, .5, .5]])
    np.testing.assert_array_equal(d.matrix(4).toarray(), want_a)
    assert np.array_equal(d.matrix(1).toarray(), d.matrix(3).toarray())
    (tmp_path / "c.csv").write_text("0,1\n1,2\n2,3\n3,4\n")
    with pytest.raises(ValidationError, match=r"one number of agents.*a.csv: n = 4.*c.csv: n = 5"):
        build_network({"dynamics": "cycle", "graphs": ["a.csv", "c.csv"]}, 0, str(tmp_path))
    with pytest.raises(ValidationError, match="union of the cycle's graphs is disconnected"):
        build_network({"dynamics": "cycle", "graphs": ["a.csv", "a.csv"]}, 0, str(tmp_path))


@pytest.mark.parametrize("table,match", [
    ({"dynamics": "peer_sampling", "n": 5, "peers": 5}, r"peers = 5.*1 <= peers <= 4"),
    ({"dynamics": "peer_sampling", "n": 5}, r"needs \[network\] peers"),
    ({"dynamics": "random_matching", "n": 5, "peers": 2}, r"peers = 2 applies to dynamics \"peer_sampling\" only"),
    ({"dynamics": "random_matching", "n": 5, "mixing": "laplacian"},
     r"mixing = 'laplacian' cannot be used with it: allowed mixing = \"metropolis_hastings\""),
    ({"dynamics": "one_peer_exponential", "n": 5, "mixing": "max_degree"}, r"mixing = 'max_degree'"),
    ({"dynamics": "cycle", "n": 5}, r"needs \[network\] graphs"),
    ({"topology": "ring", "n": 5, "peers": 2}, r"peers = 2 applies to dynamics = \"peer_sampling\" only"),
    ({"dynamics": "random_matching", "n": 6, "directed": True}, r"a directed network .* is static"),
    ({"dynamics": "cycle", "topology": "directed_ring", "n": 6}, r"a directed network .* is static"),
])
def test_bad_dynamics_are_refused_naming_the_value(table, match):
    with pytest.raises(ValidationError, match=match):
        build_network(table, 0)


def test_an_unknown_dynamics_name_is_a_config_error(tmp_path):
    from privdl.experiment import load_config

    path = tmp_path / "c.toml"
    path.write_text('[network]\ndynamics = "gossip"\nn = 4\n')
    with pytest.raises(ConfigError, match=r"gossip.*random_matching"):
        load_config(path)


def test_algorithms_and_mechanisms_that_need_one_W_are_refused_by_reason():
    from privdl.experiment.build import build

    base = {"seed": 0, "iterations": 3, "dtype": "float64", "network": {"dynamics": "random_matching", "n": 4},
            "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.1},
            "mechanism": {"name": "none"}}
    for name, why in (("exact_diffusion", "fixed point of one combination matrix"), ("dinno", "consensus ADMM")):
        with pytest.raises(ValidationError, match=f"algorithm '{name}' needs one mixing matrix.*{why}"):
            build({**base, "algorithm": {"name": name}})
    with pytest.raises(ValidationError, match=r"algorithm 'dpdl' needs a neighbour for every agent in every round.*"
                                              r"odd number of agents \(n = 5\)"):
        build({**base, "network": {"dynamics": "random_matching", "n": 5}, "algorithm": {"name": "dpdl"}})
    with pytest.raises(ValidationError, match="mechanism 'zip_dl' cannot run on a time-varying graph.*one W"):
        build({**base, "algorithm": {"name": "dsgd"}, "mechanism": {"name": "zip_dl", "sigma": 1.0}})
    c = build({**base, "algorithm": {"name": "dsgt"}})  # gradient tracking: any doubly stochastic W(t) (DIGing)
    assert c.network.dynamics.name == "random_matching"


@pytest.mark.slow
@pytest.mark.parametrize("network,mechanism", [
    ('dynamics = "peer_sampling"\npeers = 1\nn = 6', "ldp"),
    ('dynamics = "one_peer_exponential"\nn = 8', "whisper"),  # each process: W(t)'s design, its own agents' draws
    ('dynamics = "random_matching"\nn = 6', "decor"),  # each process: round t's terms on W(t)'s edges
])
def test_processes_equal_the_simulator_on_a_time_varying_graph(tmp_path, network, mechanism):
    """privdl run --procs 2: each process computes W(t) alone from the run seed's public key and exchanges with the
    round's neighbours only; results.csv equals the simulator's (to rounding: each process computes its rows)."""
    import csv
    import math

    from typer.testing import CliRunner

    from privdl.cli import app

    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "dyn"\nseeds = [0]\niterations = 12\neval_every = 4\n[schedule]\neta = 0.05\n'
                   f'[network]\n{network}\n[task]\nname = "logistic"\n'
                   f'dataset = "breast_cancer"\n[algorithm]\nname = "dsgt"\n[mechanism]\nname = "{mechanism}"\n'
                   'epsilon = 10.0\n[runtime]\ntimeout = 60\n')
    runner = CliRunner()
    rows = {}
    for label, extra in (("sim", []), ("p2", ["--procs", "2"])):
        got = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / label), "--no-plot", "--quiet", *extra])
        assert got.exit_code == 0, got.output
        with open(tmp_path / label / "results.csv") as f:
            rows[label] = list(csv.reader(f))
    assert len(rows["sim"]) == len(rows["p2"]) > 1
    for a, b in zip(rows["p2"], rows["sim"]):
        assert a[:-1] == b[:-1]
        assert a[-1] == b[-1] or math.isclose(float(a[-1]), float(b[-1]), rel_tol=1e-9, abs_tol=1e-12)


def test_the_eavesdropper_averages_each_sender_over_the_rounds_it_sent_in():
    """On a random matching of 5 agents one agent idles each round: its sliding average is the mean of what it sent,
    never diluted by the rounds it was silent (checked against the transcript)."""
    from privdl.comm.eavesdropper import Eavesdropper

    n, rounds = 5, 6
    net = build_network({"dynamics": "random_matching", "n": n}, 1)
    task = make_task("quadratic", n, init_scale=1.0)
    alg = make_algorithm("dsgd")
    spy = Eavesdropper(n, window=100, target=lambda t: torch.zeros(2))
    wire = Transcript()
    _run(net, task, alg, make_mechanism("none", steps=alg.accesses(rounds, net.edges)), rounds,
         observers=[spy, wire])
    sums, counts = torch.zeros(n, 2, dtype=torch.float64), torch.zeros(n)
    for m in wire.messages:
        for k in range(len(m.src)):  # every message an agent sends in a round is the same value (its x − η g)
            s = int(m.src[k])
            if k == 0 or int(m.src[:k].eq(s).sum()) == 0:
                sums[s] += m.payload[k].to(torch.float64)
                counts[s] += 1
    assert (counts < rounds).any()  # someone idled
    torch.testing.assert_close(spy.estimate(), sums / counts[:, None], rtol=1e-12, atol=1e-14)


def test_the_ledger_counts_the_accesses_each_round_made():
    """DPDL reads a neighbour's data once per incoming edge per round: on W(t) an owner's accesses are
    Σ_t deg_i(t) (+ T self-gradients), what the mechanism was built for and what the run made."""
    n, rounds = 6, 5
    net = build_network({"dynamics": "peer_sampling", "peers": 1, "n": n}, 2)
    task = make_task("quadratic", n)
    alg = make_algorithm("dpdl", self_noise=True)
    want = sum(net.dynamics.edges(t).degree for t in range(1, rounds + 1)) + rounds
    planned = net.dynamics.accesses(alg, rounds)
    assert torch.equal(planned, want)
    res = _run(net, task, alg, make_mechanism("none", steps=planned), rounds)
    assert torch.equal(res.accesses, want)


@pytest.mark.parametrize("mech,law,match", [
    ("whisper", {"dynamics": "random_matching"}, r"draws a different W\(t\) almost every round.*perfect matchings"),
    ("whisper", {"dynamics": "peer_sampling", "peers": 1}, r"'peer_sampling' draws a different W\(t\)"),
])
def test_correlated_designs_for_one_W_are_refused_naming_why(mech, law, match):
    from privdl.experiment.build import build

    cfg = {"seed": 0, "iterations": 3, "dtype": "float64", "network": {"n": 4, **law},
           "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.1},
           "algorithm": {"name": "dsgd"}, "mechanism": {"name": mech, "epsilon": 10.0}}
    with pytest.raises(ValidationError, match=f"mechanism '{mech}' cannot run on a time-varying graph.*{match}"):
        build(cfg)


RUNS_ON_W_T = [("dsgd", {}), ("dsgd", {"form": "cta", "gossip": "authors"}), ("dsgt", {}), ("psgt", {}),
               ("dsg_rms", {}), ("dsgt_rms", {"structure": "diagonal"}), ("pd_lms", {"scheme": "nullspace"}),
               ("pd_lms", {"scheme": "edge"}), ("dpdl", {}), ("cga", {"beta": 0.5}), ("central_sgd", {})]


@pytest.mark.parametrize("name,params", RUNS_ON_W_T)
def test_every_algorithm_that_mixes_runs_on_a_time_varying_graph(name, params):
    """n = 5 on random matchings: one agent idles every round (no neighbour at all), the models stay finite, and
    a noiseless run on the quadratic moves towards the optimum."""
    alg = make_algorithm(name, **params)
    n, rounds = (6 if alg.cross else 5), 6  # (cross-gradients need a neighbour every round: n even)
    net = build_network({"dynamics": "random_matching", "n": n}, 4)
    task = make_task("quadratic", n, init_scale=1.0)
    res = _run(net, task, alg, make_mechanism("none", steps=net.dynamics.accesses(alg, rounds)), rounds,
               eval_every=rounds)
    assert torch.isfinite(res.final).all()


def test_a_cycle_config_runs_and_its_manifest_records_the_law(tmp_path):
    import json

    from privdl.experiment import load_config, run_experiment

    (tmp_path / "a.csv").write_text("0,1\n2,3\n")
    (tmp_path / "b.csv").write_text("1,2\n3,0\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text('seed = 0\niterations = 4\n[network]\ndynamics = "cycle"\ngraphs = ["a.csv", "b.csv"]\n'
                   '[task]\nname = "quadratic"\n[algorithm]\nname = "dsgd"\n[mechanism]\nname = "none"\n'
                   '[schedule]\nname = "constant"\neta = 0.1\n')
    run_experiment(load_config(cfg), tmp_path / "out", progress=False)
    (manifest,) = [json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").rglob("manifest.json")]
    assert manifest["dynamics"]["dynamics"] == "cycle" and manifest["dynamics"]["graphs"] == ["a.csv", "b.csv"]
    assert manifest["dynamics"]["period"] == 2 and len(manifest["dynamics"]["fingerprints"]) == 2
    assert {"network.graphs[0]", "network.graphs[1]"} <= set(manifest["input_files"])
    assert manifest["bytes_per_tag"]["x"]["messages"] == 4 * 4  # 4 rounds × 2 edges × 2 directions


def test_a_run_moved_to_a_device_follows_the_same_rounds():
    """``device=`` moves each round's edges to the device once (``Comm.to``); on the CPU the run is the same."""
    n, rounds = 6, 5
    net = build_network({"dynamics": "peer_sampling", "peers": 1, "n": n}, 3)
    task = make_task("quadratic", n, init_scale=1.0)
    alg = make_algorithm("dsgt")
    mech = lambda: make_mechanism("none", steps=alg.accesses(rounds, net.edges))  # noqa: E731
    want = _run(net, task, alg, mech(), rounds)
    got = _run(net, task, alg, mech(), rounds, device="cpu")
    assert torch.equal(got.final, want.final)


# ---- Whisper on a periodic law: R designed for each distinct W(t) -----------------------------------------------

def _mh(n, pairs):
    """Metropolis–Hastings W of an undirected edge list, written out here (w_ij = 1/(1 + max(d_i, d_j)))."""
    deg = np.zeros(n, dtype=int)
    for i, j in pairs:
        deg[i] += 1
        deg[j] += 1
    w = np.zeros((n, n))
    for i, j in pairs:
        w[i, j] = w[j, i] = 1.0 / (1 + max(deg[i], deg[j]))
    return w + np.diag(1.0 - w.sum(axis=1))


CYCLE_A = [(0, 1), (2, 3), (4, 5)]  # a perfect matching (disconnected on its own)
CYCLE_B = [(1, 2), (3, 4), (5, 0), (0, 3)]


def _cycle_network(tmp_path):
    (tmp_path / "a.csv").write_text("".join(f"{i},{j}\n" for i, j in CYCLE_A))
    (tmp_path / "b.csv").write_text("".join(f"{i},{j}\n" for i, j in CYCLE_B))
    return build_network({"dynamics": "cycle", "graphs": ["a.csv", "b.csv", "a.csv"]}, 0, str(tmp_path))


def test_whisper_designs_R_for_each_distinct_W_of_a_cycle(tmp_path):
    """A cycle a, b, a: two distinct W(t) (a cached by its fingerprint), each round's noise has the covariance of
    problem (P) solved separately for that round's graph (weights written out by hand here), both read from the
    generator and estimated from the noise actually added; every design meets the one per-round bound b."""
    from privdl.covariance.designs import design_covariance
    from privdl.covariance.problem import precision_diagonal
    from privdl.keys import Keys
    from privdl.mechanisms.base import Access, MechanismEnv

    n, b = 6, 0.5
    net = _cycle_network(tmp_path)
    m = make_mechanism("whisper", steps=net.dynamics.accesses(make_algorithm("dsgd"), 6), network=net, clip=1.0,
                       precision_bound=b)
    facts = m.round_facts()
    assert facts["period"] == 3 and facts["distinct"] == 2
    assert facts["fingerprints"][0] == facts["fingerprints"][2] != facts["fingerprints"][1]
    want = {0: design_covariance("whisper", _mh(n, CYCLE_A), bound=b).R,
            1: design_covariance("whisper", _mh(n, CYCLE_B), bound=b).R}
    assert np.abs(want[0] - want[1]).max() > 0.5 * np.abs(want[0]).max()  # the two designs really differ
    for t, k in ((1, 1), (2, 0), (3, 0), (4, 1)):  # W(t) = W_{t mod 3}: a, b, a, a, b, ...
        got = m.round_mechanism(t).noise.covariance()
        # (P) is solved to the dual solver's tolerance (~1e-7 relative): equal to it, not bit for bit
        np.testing.assert_allclose(got, want[k], rtol=1e-5, atol=1e-5 * np.abs(want[k]).max())
        assert precision_diagonal(got).max() <= b * (1 + 1e-9)
    np.testing.assert_array_equal(m.precisions, np.maximum(*(precision_diagonal(r.noise.covariance())
                                                            for r in m.round_designs.values())))
    m.bind(MechanismEnv(Keys(1, n)))
    d = 200_000
    for call, (t, k) in enumerate(((1, 1), (3, 0)), start=1):
        v = m.privatize(torch.zeros(n, d, dtype=torch.float64),
                        Access(owners=torch.arange(n), requesters=torch.arange(n), call=call, everyone=True, t=t))
        emp = (v @ v.T).numpy() / d
        scale = np.sqrt(np.outer(np.diag(want[k]), np.diag(want[k])))
        err = np.abs(emp - want[k]) / scale  # a sample covariance's entry has std ≤ √(2/d) of that scale
        assert err.max() < 6 * np.sqrt(2 / d), err.max()
        assert (np.abs(emp - want[1 - k]) / scale).max() > 20 * np.sqrt(2 / d)  # not the other round's R


def test_whisper_on_a_periodic_law_adds_each_rounds_design_in_a_run(tmp_path):
    """Through the engine: every access of a D-SGD run is made in its round t and privatized by W(t)'s design."""
    net = _cycle_network(tmp_path)
    rounds = 5
    alg = make_algorithm("dsgd")
    m = make_mechanism("whisper", steps=net.dynamics.accesses(alg, rounds), network=net, clip=1.0, epsilon=20.0)
    seen = []
    for fp, r in m.round_designs.items():
        r.privatize = (lambda f, fp=fp: lambda value, access: (seen.append((access.t, fp)), f(value, access))[1])(
            r.privatize)
    res = _run(net, make_task("quadratic", 6), alg, m, rounds)
    assert torch.isfinite(res.final).all()
    assert seen == [(t, net.dynamics.fingerprint(t)) for t in range(1, rounds + 1)]


@pytest.mark.exact
def test_sliced_equals_the_simulator_with_whisper_on_a_periodic_law(tmp_path):
    nets = [_cycle_network(tmp_path), build_network({"dynamics": "one_peer_exponential", "n": 8}, 2)]
    for net in nets:
        n, rounds = net.n, 4
        task = make_task("quadratic", n, init_scale=1.0)
        alg = make_algorithm("dsgd")
        mech = make_mechanism("whisper", steps=net.dynamics.accesses(alg, rounds), network=net, clip=1.0,
                              epsilon=20.0)
        sched = make_schedule("constant", eta=0.1, iterations=rounds)
        want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds,
                        seed=3, sparse=True, eval_every=1)
        got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched,
                              iterations=rounds, seed=3, slices=2, eval_every=1)
        assert torch.equal(got.final, want.final)
        assert got.records == want.records


def test_a_whisper_config_on_one_peer_exponential_builds_and_meets_its_epsilon():
    from privdl.experiment.build import build

    cfg = {"seed": 0, "iterations": 6, "dtype": "float64", "network": {"n": 8, "dynamics": "one_peer_exponential"},
           "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.1},
           "algorithm": {"name": "dsgd"}, "mechanism": {"name": "whisper", "epsilon": 5.0}}
    built = build(cfg)
    assert built.mechanism.round_facts()["distinct"] == 3  # i XOR 1, i XOR 2, i XOR 4
    assert built.mechanism.ledger().epsilon <= 5.0 * (1 + 1e-6)
    static = make_mechanism("whisper", steps=6, network=build_network({"topology": "ring", "n": 8}, 0), clip=1.0,
                            epsilon=5.0)
    from privdl.network.dynamics import check_mechanism

    with pytest.raises(ValidationError, match="designed for another network"):
        check_mechanism(static, built.network.dynamics)


@pytest.mark.parametrize("law", ["cycle", "one_peer_exponential"])
def test_whisper_ledger_on_a_periodic_law_equals_the_exact_per_round_composition(law, tmp_path):
    """The ledger accounts every access at the agent's largest [R(t)⁻¹]_ii over the round designs (a valid upper
    bound). Composed exactly instead — round t's release at its own design's precision, the rounds of each design
    counted — the ε is the same to 1e-6: problem (P) pushes every agent's precision up to the one bound b in every
    design (less noise always lowers Tr(W R Wᵀ)), so the worst over designs is each round's own. A design that left
    an agent below b (a looser round) would make the exact ε smaller and fail this test."""
    from privdl.covariance.problem import precision_diagonal
    from privdl.privacy.events import GaussianEvent
    from privdl.privacy.ledger import Ledger

    rounds = 7
    net = (_cycle_network(tmp_path) if law == "cycle"
           else build_network({"dynamics": "one_peer_exponential", "n": 8}, 0))
    m = make_mechanism("whisper", steps=net.dynamics.accesses(make_algorithm("dsgd"), rounds), network=net,
                       clip=1.0, epsilon=4.0)
    got = m.ledger()
    sens = got.noise["sensitivity"]
    per_round = [precision_diagonal(m.round_mechanism(t).noise.covariance()) for t in range(1, rounds + 1)]
    exact = Ledger.build(unit=got.unit, mechanism="exact", accountant=got.accountant, delta=got.delta,
                         events=[[GaussianEvent(precision=float(p[i]), sensitivity=sens) for p in per_round]
                                 for i in range(net.n)])
    assert len({m.round_fingerprints[t % len(m.round_fingerprints)] for t in range(1, rounds + 1)}) >= 2
    np.testing.assert_array_less(np.array(exact.epsilons), np.array(got.epsilons) * (1 + 1e-9))  # an upper bound
    np.testing.assert_allclose(exact.epsilons, got.epsilons, rtol=1e-6)


# ---- DECOR on any law: the canceling terms of round t on W(t)'s edges --------------------------------------------

DECOR_LAWS = [({"dynamics": "random_matching", "n": 6}, 2), ({"dynamics": "peer_sampling", "peers": 1, "n": 8}, 5),
              ({"dynamics": "one_peer_exponential", "n": 8}, 0)]


@pytest.mark.parametrize("law,seed", DECOR_LAWS)
def test_decor_draws_its_canceling_terms_on_each_rounds_edges(law, seed):
    """Every round t: one term per edge of W(t) (read off the dense W(t) here), +s and −s at its two ends — the
    terms sum to exactly 0 over the agents, so the network average is unperturbed by them; R(t) = σ²(I + c·L(t)) for
    the hand-made Laplacian of round t, whose worst precision max_i [R(t)⁻¹]_ii is b (np.linalg.inv); the noise
    actually added has that covariance, and its sum over agents only the n·σ² of the own draws."""
    from privdl.keys import Keys
    from privdl.mechanisms.base import Access, MechanismEnv

    net = build_network(law, seed)
    n, dyn = net.n, net.dynamics
    alg = make_algorithm("dsgd")
    m = make_mechanism("decor", steps=dyn.accesses(alg, 4), network=net, clip=1.0, epsilon=5.0)
    assert m.ratio > 0.1  # (every agent has a neighbour in every round of these laws: the terms are used)
    m.bind(MechanismEnv(Keys(1, n)))
    d = 100_000
    for t in range(1, 5):
        w = dyn.matrix(t).toarray()
        adj = (w > 0) & ~np.eye(n, dtype=bool)
        edges = {(i, j) for i, j in zip(*np.nonzero(np.triu(adj)))}
        noise = m.round_noise(t)
        f = noise.dense_factor()
        assert f.shape[1] == len(edges)
        for col in f.T:
            (i, j) = np.flatnonzero(col)
            assert (i, j) in edges and col[i] == -col[j]
        assert not f.sum(axis=0).any()  # each term: exactly +s and −s
        lap = np.diag(adj.sum(axis=1)) - adj
        want = noise.sigma_mix**2 * (np.eye(n) + m.ratio * lap)
        np.testing.assert_allclose(noise.covariance(), want, rtol=1e-12, atol=0)
        np.testing.assert_allclose(np.diag(np.linalg.inv(want)).max(), m.bound, rtol=1e-9)
        v = m.privatize(torch.zeros(n, d, dtype=torch.float64),
                        Access(owners=torch.arange(n), requesters=torch.arange(n), call=t, everyone=True, t=t))
        emp = (v @ v.T).numpy() / d
        scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
        assert (np.abs(emp - want) / scale).max() < 6 * np.sqrt(2 / d)  # sample covariance: std ≤ √(2/d)·scale
        total = v.sum(dim=0)  # the own draws only: variance n·σ², not Σ_i R_ii
        assert abs(float(total.var()) / (n * noise.sigma_mix**2) - 1) < 6 * np.sqrt(2 / d)
        assert np.trace(want) > 1.5 * n * noise.sigma_mix**2
    assert m.ledger().epsilon <= 5.0 * (1 + 1e-9)


def test_decor_runs_on_random_matchings_and_the_sliced_backend_equals_the_simulator():
    net = build_network({"dynamics": "random_matching", "n": 6}, 2)
    rounds = 4
    task = make_task("quadratic", 6, init_scale=1.0)
    alg = make_algorithm("dsgd")
    mech = make_mechanism("decor", steps=net.dynamics.accesses(alg, rounds), network=net, clip=1.0, epsilon=20.0)
    sched = make_schedule("constant", eta=0.1, iterations=rounds)
    want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds, seed=3,
                    sparse=True, eval_every=1)
    got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds,
                          seed=3, slices=2, eval_every=1)
    assert torch.isfinite(want.final).all()
    assert torch.equal(got.final, want.final) and got.records == want.records
    from privdl.network.dynamics import check_mechanism

    static = make_mechanism("decor", steps=4, network=build_network({"topology": "ring", "n": 6}, 0), clip=1.0,
                            epsilon=5.0)
    with pytest.raises(ValidationError, match="drawn on another network's edges"):
        check_mechanism(static, net.dynamics)


def test_decor_common_ratio_of_one_W_is_decor_designs_ratio():
    """For a single connected W the per-component search is DECOR's own (dense eigendecomposition) search."""
    from privdl.covariance.designs import decor_common_ratio, design_covariance

    w = build_network({"topology": "erdos_renyi", "n": 12, "p": 0.4}, 3).dense()
    d = design_covariance("decor", w, bound=1.0)
    np.testing.assert_allclose(decor_common_ratio([w]), d.extra["sigma_cor2"] / d.extra["sigma_pair2"], rtol=1e-6)


def test_agreed_keys_cover_every_pair_a_law_may_join(tmp_path):
    """With runtime.keys = "agreed" the pairs that run X25519 must include every edge a round may draw, not only the
    reference graph's (DECOR's per-round terms are keyed by the round's edge): a periodic law's union over its period
    (the hypercube for the one-peer exponential graph, n = 8: 12 pairs), every pair for a random law; and an agreed
    DECOR run on random matchings completes (before: "no key was agreed for the agents [1, 2]" mid-run)."""
    from privdl.agreement import needed_pairs
    from privdl.experiment import load_config
    from privdl.experiment.build import build
    from privdl.experiment.config import expand
    from privdl.experiment.run_pipeline import run_one

    hyper = {(a, a ^ (1 << k)) for a in range(8) for k in range(3) if a < a ^ (1 << k)}
    assert set(needed_pairs(build_network({"dynamics": "one_peer_exponential", "n": 8}, 0), [])) == hyper
    assert len(needed_pairs(build_network({"dynamics": "random_matching", "n": 7}, 0), [])) == 21
    assert len(needed_pairs(build_network({"topology": "ring", "n": 7}, 0), [])) == 7  # a static graph: its edges
    cfg = tmp_path / "c.toml"
    cfg.write_text('iterations = 6\n[network]\nn = 6\ndynamics = "random_matching"\n[task]\nname = "logistic"\n'
                   'dataset = "breast_cancer"\nbatch_size = 8\n[mechanism]\nname = "decor"\nepsilon = 10.0\n'
                   '[schedule]\neta = 0.1\n[runtime]\nkeys = "agreed"\n')
    spec = expand(load_config(cfg))[0][0]
    _, man = run_one(spec, components=build(spec.config))
    assert man["keys"]["draws"]["chacha20"] > 0


# ---- the peer_sampling draw (vectorised: Floyd's sampling for all agents, MH edges built by counting) ----------
def test_sample_peers_draws_every_k_subset_of_the_others_equally_often():
    """n = 5, k = 2: each agent's out-peers are one of the C(4, 2) = 6 pairs of the other agents, each with
    probability 1/6 (Floyd's algorithm is exact); 6000 draws per agent: a chi-square test with 5 degrees of freedom
    at level 1e-6 (critical value 35.9) — a biased sampler (e.g. one that redrew only the second peer) fails it."""
    from itertools import combinations

    from privdl.network.dynamics import sample_peers

    n, k, draws = 5, 2, 6000
    rng = np.random.default_rng(11)
    picks = np.concatenate([sample_peers(rng, n, k) for _ in range(draws)])  # (draws·n, k)
    agent = np.tile(np.arange(n), draws)
    assert (picks != agent[:, None]).all() and (picks[:, 0] != picks[:, 1]).all()
    for i in range(n):
        subsets = [tuple(sorted(p)) for p in picks[agent == i].tolist()]
        counts = np.array([subsets.count(s) for s in combinations([j for j in range(n) if j != i], k)])
        assert counts.sum() == draws
        chi2 = ((counts - draws / 6) ** 2 / (draws / 6)).sum()
        assert chi2 < 35.9, (i, counts)


@pytest.mark.parametrize("lazy", [False, True])
def test_mh_edges_equal_the_metropolis_hastings_matrix_of_networkx(lazy):
    """The counting construction against the textbook one: networkx graph → dense MH W (privdl.network.mixing) →
    Edges.from_matrix (canonical order, reverse by search); same edges, order, reverses, slots; weights to 1e-15
    (the dense path sums a row in another order)."""
    import networkx as nx

    from privdl.network.dynamics import mh_edges
    from privdl.network.edges import Edges
    from privdl.network.mixing import mixing_matrix

    rng = np.random.default_rng(3)
    for n in (2, 9, 40):
        i, j = rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n)  # duplicates and self-loops included
        g = nx.empty_graph(n)
        g.add_edges_from((a, b) for a, b in zip(i.tolist(), j.tolist()) if a != b)
        want = Edges.from_matrix(mixing_matrix(g, "metropolis_hastings", lazy_=lazy))
        got = mh_edges(n, i, j, lazy=lazy)
        for f in ("src", "dst", "reverse"):
            assert torch.equal(getattr(got, f).long(), getattr(want, f).long()), f
        torch.testing.assert_close(got.weight, want.weight, rtol=0, atol=1e-15)
        torch.testing.assert_close(got.self_weight, want.self_weight, rtol=0, atol=1e-15)
        assert torch.equal(got.slots.long(), Edges(want.src, want.dst, want.weight, want.reverse,
                                                    want.self_weight, n).slots.long())


def test_check_round_refuses_a_reverse_that_is_not_the_reverse_edge():
    from privdl.network.dynamics import check_round, mh_edges
    from privdl.network.edges import Edges

    e = mh_edges(4, np.array([0, 1, 2]), np.array([1, 2, 3]))
    check_round(e, 1, "peer_sampling")
    bad = Edges(e.src, e.dst, e.weight, e.reverse.roll(1), e.self_weight, 4)
    with pytest.raises(ValidationError, match=r"W\(1\).*reverse"):
        check_round(bad, 1, "peer_sampling")


def test_peer_sampling_checks_a_block_at_once_and_names_the_bad_round(monkeypatch):
    """The rounds of a block are checked together (one pass); a bad W(t) anywhere in the block is still refused,
    named by its own round, even when another round of the block is asked for."""
    import privdl.network.dynamics as dy

    n, real = 9, dy.mh_edges

    def broken(rows, i, j, **kw):
        e = real(rows, i, j, **kw)
        e.weight[int(torch.nonzero(e.dst >= 5 * n)[0])] += 0.25  # round 5's first edge: its row sums to 1.25
        return e

    monkeypatch.setattr(dy, "mh_edges", broken)
    with pytest.raises(ValidationError, match=r"W\(5\) of dynamics 'peer_sampling'.*sums to 1\.25"):
        Dynamics("peer_sampling", n, seed=1, peers=2).edges(0)


@pytest.mark.parametrize("lazy", [False, True])
def test_peer_sampling_rounds_drawn_in_blocks_equal_rounds_built_one_by_one(lazy):
    """Rounds are drawn BLOCK at a time (one graph of BLOCK·n rows, split): each round's Edges must be exactly
    those built from that round's own edge set alone (mh_edges of its pairs), slots and degrees included, for
    rounds inside a block and across a block boundary; consecutive rounds differ."""
    from privdl.network.dynamics import mh_edges

    n, k = 9, 2
    d = Dynamics("peer_sampling", n, seed=7, peers=k, lazy=lazy)
    BLOCK = d.block
    assert BLOCK == 16 == d.law()["block"] and Dynamics("peer_sampling", 10**5, peers=2).block == 1
    for t in (0, 1, BLOCK - 1, BLOCK, 2 * BLOCK + 3):
        e = d.edges(t)
        one = mh_edges(n, e.src.numpy(), e.dst.numpy(), lazy=lazy)
        for f in ("src", "dst", "weight", "reverse", "self_weight", "degree", "slots"):
            assert torch.equal(getattr(e, f), getattr(one, f)) and getattr(e, f).dtype == getattr(one, f).dtype, (t, f)
        # the slot order the canonical sums run over, counted in numpy for the whole block, against the one read
        # off the round's own slot table (rows by degree, decreasing; each slot's edges over those rows)
        got, want = e.slot_order, one.slot_order
        assert got.counts == want.counts and torch.equal(got.edge.long(), want.edge.long()), t
        assert got.perm is not None and torch.equal(got.perm, want.perm) and torch.equal(got.place, want.place), t
        assert (e.degree >= k).all() and int(e.src.max()) < n
    assert not np.array_equal(d.matrix(BLOCK - 1).toarray(), d.matrix(BLOCK).toarray())
