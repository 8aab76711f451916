"""The sliced backend: a run split into K engines, each holding only some agents, equals the simulator bit for bit.

Why bit for bit holds on any CPU (docs/ARCHITECTURE.md, "What is bit-exact"): each slice computes in the network
frame (privdl.placement) — every kernel (the gradient of the task, clipping, the canonical mix, the algorithms'
elementwise updates) runs on tensors of the simulator's shapes, and a held agent's row holds the simulator's values:
its data (sampled from its own keys; the other rows are zeros), its keyed draws (row-independent by construction,
tests/test_keys.py), the neighbours' rows the transport delivers. A kernel's result for a row depends on the row's
values and the shapes, never on the other rows' values, and a lot is summed in blocks of a size every slice derives
from public facts (a block of padding adds exact zeros: a slice's lots, padded to its own longest, give the
simulator's bits). So the same operations run in the same order on the same numbers, whatever the processor; if a
slice read anything the Comm did not deliver (another agent's data, key or row), its numbers would differ.
"""

from __future__ import annotations

import copy
import json
import math
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privdl.algorithms import ALGORITHMS, make_algorithm
from privdl.comm import Transcript
from privdl.comm.base import LINEAR_MIXING
from privdl.comm.transport import Transport, TransportError
from privdl.errors import ValidationError
from privdl.keys import Draws, HeldKeys, Keys, RootKeys
from privdl.mechanisms import Clip, chain, make_mechanism
from privdl.network import Network
from privdl.placement import Placement, partition
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.sliced import simulate_sliced
from privdl.tasks import make_task
from privdl.tasks.held import HeldTask

N, ROUNDS, SEED = 5, 3, 11
VARIANTS = {
    "dsgd": [{}, {"form": "cta", "optimizer": {"name": "sgd", "momentum": 0.9}}, {"form": "cta", "gossip": "authors"}],
    "dsgt": [{}],
    "dinno": [{"primal_steps": 2, "optimizer": "adam"}],
    "central_sgd": [{}],
    "exact_diffusion": [{}],
    "dsg_rms": [{}],
    "edsg_rms": [{"structure": "upper_bidiagonal", "protection": "erf"}],
    "dsgt_rms": [{"structure": "diagonal"}],
    "pd_lms": [{"scheme": "independent", "variance": 0.1}, {"scheme": "nullspace", "variance": 0.1},
               {"scheme": "edge", "variance": 0.1}],
    "psgt": [{}],
    "dpdl": [{}, {"self_noise": True, "calibration": False}],
    "cga": [{"beta": 0.5}],
    "sgp": [{}],
}
FAMILIES = ["none", "ldp", "decor", "whisper", "covariance", "dp_sgd", "chain", "decor_per_example"]


@pytest.fixture(scope="module")
def setup():
    net = Network.from_topology("erdos_renyi", N, p=0.6, seed=3)
    task = make_task("softmax", N, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)
    return net, task


def _mechanism(net, task, alg, family, tmp_path_factory):
    steps = alg.accesses(ROUNDS, net.edges)
    if family == "none":
        return make_mechanism("none", steps=steps)
    if family == "dp_sgd":  # Poisson lots: each slice pads to its own longest, summed in blocks
        return make_mechanism("dp_sgd", steps=steps, task=task, clip=1.0, lot_size=20, noise_multiplier=1.0)
    if family == "chain":
        return chain(Clip(steps=steps, clip=1.0), make_mechanism("ldp", steps=steps, network=net, clip=0, sigma=0.5))
    if family == "decor_per_example":
        return make_mechanism("decor", steps=steps, network=net, clip=1.0, epsilon=20.0, clipping="per_example",
                              sampling="poisson", task=task)
    if family == "covariance":
        decor = make_mechanism("decor", steps=steps, network=net, clip=1.0, epsilon=20.0)
        path = tmp_path_factory.mktemp("cov") / "R.npy"
        np.save(path, decor.noise.covariance())
        return make_mechanism("covariance", steps=steps, network=net, clip=1.0, epsilon=20.0, file=str(path))
    name = "gaussian_ldp" if family == "ldp" else family
    return make_mechanism(name, steps=steps, network=net, clip=1.0, epsilon=20.0)


def _same_transcripts(a: Transcript, b: Transcript) -> bool:
    return len(a.messages) == len(b.messages) and all(
        x.t == y.t and x.tag == y.tag and torch.equal(x.src, y.src) and torch.equal(x.dst, y.dst)
        and torch.equal(x.payload, y.payload) for x, y in zip(a.messages, b.messages))


def test_every_registered_algorithm_is_covered():
    assert set(VARIANTS) == set(ALGORITHMS.names())


#: DECOR and Whisper refuse an algorithm that does not mix linearly (Algorithm.combines; LDP covers those)
REFUSED = {(n, json.dumps(p)) for n, ps in VARIANTS.items() for p in ps
           if make_algorithm(n, **p).combines != LINEAR_MIXING}
CASES = [(n, p, f) for n, ps in VARIANTS.items() for p in ps for f in FAMILIES
         if not (n in ("dpdl", "cga") and f not in ("none", "dp_sgd"))  # cross-gradients refuse correlated noise
         and not (f in ("decor", "whisper", "decor_per_example") and (n, json.dumps(p)) in REFUSED)
         # sgp's gradient path is dsgd's (one access at the model a round): its other families add fast-tier time only
         and not (n == "sgp" and f in ("covariance", "dp_sgd", "chain", "decor_per_example"))]


@pytest.mark.parametrize("name,params,family", CASES)
@pytest.mark.exact
def test_a_sliced_run_equals_the_simulator_bit_for_bit(setup, name, params, family, tmp_path_factory):
    """K = 2, 3 and n slices: final models, every recorded metric, the accesses behind the ledger and (K = 3) every
    message of the transcript, bit for bit against simulate(sparse=True)."""
    net, task = setup
    alg = make_algorithm(name, **params)
    mech = _mechanism(net, task, alg, family, tmp_path_factory)
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    want_wire = Transcript()
    want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                    seed=SEED, sparse=True, eval_every=1, observers=[want_wire])
    for k in (2, 3, N):
        wire = Transcript()
        got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched,
                              iterations=ROUNDS, seed=SEED, slices=k, eval_every=1,
                              observers=[wire] if k == 3 else ())
        assert torch.equal(got.final, want.final), (k, (got.final - want.final).abs().max())
        assert got.records == want.records, k
        assert torch.equal(got.accesses, want.accesses), k
        if k == 3:
            assert _same_transcripts(wire, want_wire)
    ledger = mech.ledger(want.accesses)
    assert ledger.epsilon == mech.ledger(got.accesses).epsilon or (ledger.epsilon is None)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 3), min_size=N, max_size=N))
@pytest.mark.exact
def test_any_assignment_of_agents_to_slices_gives_the_same_run(setup, labels):
    """Hypothesis over assignments: agents placed in up to 4 slices in any pattern (non-contiguous, uneven)."""
    net, task = setup
    parts = [[a for a in range(N) if labels[a] == s] for s in range(4)]
    parts = [p for p in parts if p]
    alg = make_algorithm("dsgt")
    mech = make_mechanism("decor", steps=alg.accesses(ROUNDS, net.edges), network=net, clip=1.0, epsilon=20.0)
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                    seed=SEED, sparse=True)
    got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                          seed=SEED, placements=partition(N, assignment=parts))
    assert torch.equal(got.final, want.final)
    assert got.records == want.records


@pytest.mark.exact
def test_a_slice_reads_only_its_own_agents_data_and_keys(setup):
    """Each slice gets a task whose other agents' examples are NaN (and which refuses to gather them) and a key
    source that records every key it derives: the run is still the simulator's, and no slice derived a key of an
    agent it does not hold, nor of a seed group without one of its agents."""
    net, task = setup
    alg = make_algorithm("dsgd")
    placements = partition(N, slices=3)
    tasks, sources = [], []
    for p in placements:
        t = copy.copy(task)
        t.X = task.X.clone()
        t.X[torch.from_numpy(~p.held)] = math.nan  # the other agents' examples: poison
        t._X_flat = t.X.reshape(task._X_flat.shape)
        tasks.append(HeldTask(t, p))
        sources.append(HeldKeys(RootKeys(SEED), p.held, record=True))
    for family in ("dp_sgd", "whisper"):
        steps = alg.accesses(ROUNDS, net.edges)
        mech = (make_mechanism("dp_sgd", steps=steps, task=task, clip=1.0, lot_size=20, noise_multiplier=1.0)
                if family == "dp_sgd" else
                make_mechanism("whisper", steps=steps, network=net, clip=1.0, epsilon=20.0))
        sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
        want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                        seed=SEED, sparse=True)
        got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched,
                              iterations=ROUNDS, seed=SEED, placements=placements, tasks=tasks, sources=sources)
        assert torch.equal(got.final, want.final), family
    for p, s in zip(placements, sources):
        agents = {a for a in s.asked if isinstance(a, int)}
        groups = [g for g in s.asked if isinstance(g, tuple)]
        assert agents and agents <= set(p.agents)
        assert groups and all(set(g) & set(p.agents) for g in groups)
    with pytest.raises(ValidationError, match="asked for the data of agent"):
        tasks[0].gather(torch.tensor([N - 1]), torch.zeros((1, 2), dtype=torch.int64))
    # the default view keeps only its agents' examples: the others' are not in its memory at all
    view = HeldTask(task, placements[0])
    assert view._task.X.shape[0] == len(placements[0].agents) and view._task.dataset.X_train.shape[0] == 0
    assert torch.equal(view.gather(torch.tensor([1]), torch.arange(4)[None])[0],
                       task.gather(torch.tensor([1]), torch.arange(4)[None])[0])


def test_a_held_view_refuses_other_agents_after_passing_its_own(setup):
    """The check remembers the agents of the last access it passed (the held frame asks for the same agents every
    round): an access that differs in any way is checked again and refused — another tensor, the same tensor changed
    in place (also through a numpy view, which torch's version counter does not see), other dtypes and shapes."""
    _, task = setup
    p = partition(N, slices=3)[0]
    view = HeldTask(task, p)
    other = next(a for a in range(N) if not p.held[a])
    mine = torch.tensor(list(p.agents), dtype=torch.int64)
    index = torch.zeros((len(p.agents), 2), dtype=torch.int64)
    want = task.gather(mine, index)
    for _ in range(2):  # passed, then passed again from what it remembers
        assert all(torch.equal(a, b) for a, b in zip(view.gather(mine, index), want))
    refuse = pytest.raises(ValidationError, match=f"asked for the data of agent {other}")
    with refuse:
        view.gather(torch.tensor([other] * len(p.agents)), index)
    mine.numpy()[0] = other  # in place, behind torch's back
    with refuse:
        view.gather(mine, index)
    with refuse:
        view.gather(torch.tensor([other], dtype=torch.int32), index[:1])
    with refuse:
        view.gather(torch.tensor(list(p.agents) + [other]), torch.zeros((len(p.agents) + 1, 2), dtype=torch.int64))


def test_the_runner_runs_a_sliced_config_to_the_simulators_results(tmp_path):
    """End to end as a user runs it: --set runtime.slices=K writes the same results.csv as the simulator (alone, on
    the canonical mix), and the manifest records the placement."""
    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.experiment.store import read_experiment  # noqa: F401 - the store reads what run wrote

    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "s"\nseeds = [0, 1]\niterations = 30\neval_every = 10\n'
                   '[network]\ntopology = "ring"\nn = 6\nsparse = true\n'
                   '[task]\nname = "logistic"\ndataset = "breast_cancer"\n'
                   '[schedule]\neta = 0.05\n[mechanism]\nname = "decor"\nepsilon = 10.0\n[sweep]\n"algorithm.name" = ["dsgd", "dsgt"]\n')
    runner = CliRunner()
    a = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "a"), "--set", "batch_replicas=1",
                            "--no-plot"])
    assert a.exit_code == 0, a.output
    b = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "b"), "--set", "runtime.slices=3",
                            "--no-plot"])
    assert b.exit_code == 0, b.output
    import csv
    import json

    def rows(folder):
        return sorted(tuple(v for k, v in r.items() if k != "run_id")
                      for r in csv.DictReader(open(folder / "results.csv")))

    assert rows(tmp_path / "a") == rows(tmp_path / "b")
    manifests = list((tmp_path / "b" / "runs").rglob("manifest.json"))
    assert manifests
    m = json.loads(manifests[0].read_text())
    assert m["placement"]["backend"] == "sliced" and m["placement"]["slices"] == [[0, 1], [2, 3], [4, 5]]
    assert m["placement"]["payload_bytes"] > 0


# ---- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"slices": 0}, "from 1 to the number of agents"),
    ({"slices": N + 1}, "from 1 to the number of agents"),
    ({"assignment": [[0, 1], [2, 3]]}, "misses agent 4"),
    ({"assignment": [[0, 1, 2], [2, 3, 4]]}, "places agent 2 twice"),
    ({"assignment": [[0, 1, 2, 3, 4], []]}, "holds no agent"),
    ({"assignment": [[0, 1, 2, 3, 9]]}, "not one of 0..4"),
])
def test_bad_placements_are_refused_by_name(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        partition(N, **kwargs)


@pytest.mark.parametrize("text,match", [
    ("[runtime]\nslices = 0\n", "runtime.slices must be >= 1"),
    ("[runtime]\nbackend = \"mpi\"\n", "runtime.backend must be one of"),
    ("[runtime]\nbackend = \"simulator\"\nslices = 2\n", "set runtime.backend"),
    ("[runtime]\nassignment = [[0, 1], []]\n", "non-empty lists"),
    ("[runtime]\nthreads = 2\n", "unknown key 'runtime.threads'"),
    ("[runtime]\nslices = 7\n", "from 1 to the number of agents"),
])
def test_bad_runtime_configs_are_refused(tmp_path, text, match):
    from privdl.errors import PrivdlError
    from privdl.experiment.config import load_config
    from privdl.experiment.run_pipeline import run_one
    from privdl.experiment.config import expand

    path = tmp_path / "c.toml"
    path.write_text('iterations = 2\n[schedule]\neta = 0.1\n[network]\ntopology = "ring"\nn = 6\n' + text)
    with pytest.raises(PrivdlError, match=match):
        specs, _ = expand(load_config(path))
        run_one(specs[0])


def test_a_failing_slice_stops_the_others_with_its_error(setup):
    """A slice that raises does not leave the other slices waiting: the caller gets the slice's own error."""
    net, task = setup
    alg = make_algorithm("dsgd")
    mech = make_mechanism("none", steps=alg.accesses(ROUNDS, net.edges))
    placements = partition(N, slices=2)

    class Broken(HeldTask):
        def sample(self, draws, agents):
            raise RuntimeError("disk gone")

    tasks = [HeldTask(task, placements[0]), Broken(task, placements[1])]
    with pytest.raises(RuntimeError, match="disk gone"):
        simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech,
                        schedule=make_schedule("constant", eta=0.1, iterations=ROUNDS), iterations=ROUNDS,
                        seed=SEED, placements=placements, tasks=tasks, timeout=20)


def test_the_transport_checks_every_header():
    """A payload with another round, tag, dtype or shape than the receiver expects is an error naming both."""
    t = Transport(2, timeout=1.0)
    x = torch.zeros(3, 4, dtype=torch.float64)
    t.send(0, 1, (1, "theta", 0, "torch.float64", (3, 4)), x)
    with pytest.raises(TransportError, match="expected round 1, tag 'theta', message 0 \\(torch.float32"):
        t.recv(0, 1, (1, "theta", 0, "torch.float32", (3, 4)))
    t.send(0, 1, (1, "theta", 1, "torch.float64", (3, 4)), x)
    with pytest.raises(TransportError, match="shape \\(2, 4\\)"):
        t.recv(0, 1, (1, "theta", 1, "torch.float64", (2, 4)))
    with pytest.raises(TransportError, match="nothing arrived"):
        t.recv(1, 0, (1, "theta", 0, "torch.float64", (3, 4)))


def test_a_placement_keys_rows_by_global_agent():
    p = Placement(6, (4, 1), replicas=2)
    assert p.agents == (1, 4) and p.rows == 12
    assert p.held_rows.tolist() == [1, 4, 7, 10]
    assert not Placement.everyone(3).held_rows.tolist() != [0, 1, 2]


@pytest.mark.exact
def test_a_sliced_streaming_run_with_an_eavesdropper_equals_the_simulator():
    """Seed 002's adaptive filtering (data that change with the round: every slice follows the round on its own copy
    of the task) watched by the eavesdropper, whose metrics come from the wire merged over the slices."""
    from privdl.comm.eavesdropper import Eavesdropper

    net = Network.from_topology("ring", 6)
    task = make_task("adaptive_filtering", 6, dim=3, seed=0)
    alg = make_algorithm("edsg_rms", structure="upper_bidiagonal", protection="erf")
    mech = make_mechanism("none", steps=alg.accesses(8, net.edges))
    sched = make_schedule("constant", eta=0.05, iterations=8)

    def spy():
        return Eavesdropper(6, window=3, target=task.optimum, wire=alg.wire)

    kw = dict(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=8, seed=2,
              eval_every=1)
    want = simulate(**kw, sparse=True, observers=[spy()])
    assert any(m == "adaptive_eavesdropper_msd" for _, m, _ in want.records)
    got = simulate_sliced(**kw, placements=partition(6, assignment=[[0, 4], [1, 2, 5], [3]]), observers=[spy()])
    assert got.records == want.records and torch.equal(got.final, want.final)


def test_a_slice_receives_only_from_its_neighbours_slices(setup):
    """Every payload that crosses between slices goes from a slice holding a sender to a slice holding one of its
    neighbours (the aggregator of central SGD aside): no broadcast, nothing to a slice that does not need it."""
    from privdl.comm import transport as comm_transport

    net, task = setup
    pairs = set()
    send = comm_transport.Transport.send

    def spy(self, src, dst, header, payload):
        pairs.add((src, dst))
        return send(self, src, dst, header, payload)

    placements = partition(N, assignment=[[3], [0, 1], [2, 4]])  # agent 3's only neighbour is agent 2
    owner = {a: k for k, p in enumerate(placements) for a in p.agents}
    alg = make_algorithm("dsgt")
    mech = make_mechanism("decor", steps=alg.accesses(ROUNDS, net.edges), network=net, clip=1.0, epsilon=20.0)
    comm_transport.Transport.send = spy
    try:
        simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech,
                        schedule=make_schedule("constant", eta=0.1, iterations=ROUNDS), iterations=ROUNDS,
                        seed=SEED, placements=placements)
    finally:
        comm_transport.Transport.send = send
    src, dst = net.edges.src.tolist(), net.edges.dst.tolist()
    linked = {(owner[s], owner[d]) for s, d in zip(src, dst) if owner[s] != owner[d]}
    assert (0, 1) not in linked and (1, 0) not in linked  # the network gives these two slices nothing to say
    assert pairs and pairs <= linked


@pytest.mark.exact
def test_model_tasks_slice_without_sharing_a_module_or_the_global_generator():
    """An MLP's layers (torch.func transforms swap a module's parameters; torch's layer init draws from the global
    generator): each slice has its own module, and the common initial model is drawn once — threads never race for
    either (before, 1 run in 8 failed or differed). Repeated, every slice count, plain and ghost-clipped DP-SGD."""
    net = Network.from_topology("ring", 4)
    task = make_task("mlp", 4, dataset="digits", hidden=16, batch_size=8, seed=1)
    alg = make_algorithm("dsgd")
    for family in ("none", "dp_sgd"):
        steps = alg.accesses(ROUNDS, net.edges)
        mech = (make_mechanism("none", steps=steps) if family == "none" else
                make_mechanism("dp_sgd", steps=steps, task=task, clip=1.0, lot_size=20, noise_multiplier=1.0,
                               per_example="ghost"))
        kw = dict(task=task, network=net, algorithm=alg, mechanism=mech, iterations=ROUNDS, seed=3, eval_every=1,
                  schedule=make_schedule("constant", eta=0.1, iterations=ROUNDS))
        want = simulate(**kw, sparse=True)
        for _ in range(4):
            got = simulate_sliced(**kw, slices=4, timeout=30)
            assert torch.equal(got.final, want.final) and got.records == want.records, family


def test_a_placement_refuses_what_is_not_an_agent():
    for bad in ((1.9, 3), ("3",), (True,)):
        with pytest.raises(ValidationError, match="integer indices"):
            Placement(5, bad)
    with pytest.raises(ValidationError, match="replicas >= 1"):
        Placement(5, (1,), replicas=0)


@pytest.mark.exact
@pytest.mark.parametrize("name,family", [("dsgd", "decor"), ("dsgt", "whisper"), ("dsg_rms", "none"),
                                         ("dinno", "dp_sgd")])
def test_the_held_row_combination_of_large_tensors_is_the_simulators(setup, name, family, monkeypatch,
                                                                     tmp_path_factory):
    """mix / neighbour_sum of tensors above SliceComm.SMALL numbers combine only the held rows (canonical_rows):
    forced here for every size, the run is still the simulator's bit for bit — the same operations on the same
    numbers per row (docs/ARCHITECTURE.md)."""
    from privdl.comm.sliced import SliceComm

    monkeypatch.setattr(SliceComm, "SMALL", 0)
    net, task = setup
    alg = make_algorithm(name, **VARIANTS[name][0])
    mech = _mechanism(net, task, alg, family, tmp_path_factory)
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                    seed=SEED, sparse=True, eval_every=1)
    got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                          seed=SEED, slices=3, eval_every=1)
    assert torch.equal(got.final, want.final)
    assert got.records == want.records


@pytest.mark.exact
def test_canonical_rows_are_the_canonical_sums_rows():
    """Any subset of rows, from a table holding only the rows they read (in any order), in float64 / float32 with
    signed zeros: canonical_rows equals those rows of canonical_mix / canonical_neighbour_sum bit for bit."""
    from privdl.comm.base import canonical_mix, canonical_neighbour_sum, canonical_rows

    gen = torch.Generator().manual_seed(0)
    for seed, dtype in ((0, torch.float64), (1, torch.float32), (2, torch.float64)):
        net = Network.from_topology("erdos_renyi", 9, p=0.4, seed=seed)
        e = net.edges
        x = torch.randn(9, 7, generator=gen, dtype=dtype)
        x[0, :3] = -0.0
        rows = torch.tensor([1, 4, 8]) if seed != 1 else torch.tensor([0, 2, 3, 5])
        read = torch.unique(torch.cat([rows, e.src[torch.isin(e.dst, rows)].long()]))
        order = read[torch.randperm(len(read), generator=gen)]
        position = torch.full((9,), -1, dtype=torch.long)
        position[order] = torch.arange(len(order))
        table = x[order]
        for weighted, whole in ((True, canonical_mix), (False, canonical_neighbour_sum)):
            got = canonical_rows(table, e, rows, position, weighted=weighted)
            assert torch.equal(got, whole(x, e)[rows])
            assert torch.equal(torch.signbit(got), torch.signbit(whole(x, e)[rows]))


@pytest.mark.parametrize("family", ["dp_sgd", "ldp"])
def test_held_rows_compute_only_the_slices_agents_within_rounding(setup, family, tmp_path_factory, monkeypatch):
    """``held_rows`` (what a process of the distributed runtime does): each slice computes gradients on its agents'
    rows alone — the task never sees a batch of more rows than the slice holds — and the run equals the simulator's
    within rounding, not bit for bit: an elementwise kernel rounds a row's value by its SIMD position (body or tail
    of the vector loop), at most a few ulps per value. The bound: 8 rounds (ROUNDS) of steps η = 0.1 from values of
    size ≤ 1 keep such differences below 1e-12 (measured ≤ 1e-16 here)."""
    from privdl.simulator.access import GradientOracle

    net, task = setup
    alg = make_algorithm("dsgd")
    mech = _mechanism(net, task, alg, family, tmp_path_factory)
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                    seed=SEED, sparse=True)
    seen: list[tuple[int, int]] = []  # (thread, value): the slices' threads append in any interleaving
    rows = GradientOracle._rows

    def spy(self, models, idx, fn, batch, mask):
        me = threading.get_ident()
        seen.append((me, int(idx.numel())))
        return rows(self, models, idx, lambda x, b, m: (seen.append((me, -x.shape[0])), fn(x, b, m))[1], batch,
                    mask)

    monkeypatch.setattr(GradientOracle, "_rows", spy)
    got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                          seed=SEED, slices=3, held_rows=True)
    held = [(th, s) for th, s in seen if s > 0]
    computed = [(th, -s) for th, s in seen if s < 0]
    assert computed and max(s for _, s in computed) <= max(len(p.agents) for p in partition(N, slices=3)) < N
    for thread in {th for th, _ in seen}:  # in each slice's own order: every call computed exactly its held rows
        assert [s for th, s in held if th == thread] == [s for th, s in computed if th == thread]
    assert torch.allclose(got.final, want.final, rtol=0, atol=1e-12), (got.final - want.final).abs().max()
    assert torch.equal(got.accesses, want.accesses)


@pytest.mark.exact
def test_a_supervised_tasks_batches_are_the_generic_draw_whatever_agents_came_before(setup):
    """SupervisedTask.sample keeps the last agents' counts and offsets: its batches are Task.sample's (example
    ⌊u·m_agent⌋ of each keyed uniform, gathered) for agents that repeat, change (also in place), and in a restricted
    copy (its own offsets), bit for bit."""
    from privdl.tasks.base import Task

    _, task = setup
    keys = Keys(SEED, N)
    agents = torch.tensor([0, 2])
    cases = [(task, agents), (task, agents), (task, torch.tensor([2, 0])), (task, agents), (task, torch.tensor([1, 2])),
             ("held", torch.tensor([1, 2])), ("held", torch.tensor([1, 4])), (task, torch.tensor([1, 4])),
             ("held", torch.tensor([2, 2, 1]))]
    held = None
    for call, (t, a) in enumerate(cases, 1):
        if t == "held":  # restricted after the task kept [1, 2]'s columns: the copy must not use them
            held = held or task.restrict([1, 2, 4])
            t = held
        draws = Draws(keys, "batch", call, a.numpy().copy(), a.numpy().copy())
        got, want = t.sample(draws, a), Task.sample(task, draws, a)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), call
    agents.numpy()[0] = 3  # the same tensor changed behind torch's back
    draws = Draws(keys, "batch", 99, agents.numpy().copy(), agents.numpy().copy())
    assert all(torch.equal(g, w) for g, w in zip(task.sample(draws, agents), Task.sample(task, draws, agents)))
