"""Run state and checkpoints: a run interrupted after any round and resumed from its per-agent checkpoint equals the
uninterrupted run bit for bit — in the simulator, the sliced backend (resumed with another number of slices) and
stacked replicas of a sweep; bad checkpoints are refused by name.

Why bit for bit holds on any CPU: the resumed run performs, from round t + 1 on, exactly the operations of the
uninterrupted one on exactly the same numbers — the state is restored bit for bit (tensors saved as they are), the
access counter that keys every later draw is restored, and keyed draws are pure functions of (key, counter); the
shapes are the same. A state the checkpoint forgot (an optimizer moment, a pending protection vector, a counter,
an eavesdropper's window, a running average) would change the numbers after the cut.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.comm.eavesdropper import Eavesdropper
from privdl.errors import ConfigError
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.checkpoint import CheckpointError, Checkpoints
from privdl.simulator.sliced import simulate_sliced
from privdl.tasks import make_task
from tests.conftest import Stop, stop_after

N, ROUNDS, EVERY = 5, 10, 3


@pytest.fixture(scope="module")
def setup():
    net = Network.from_topology("erdos_renyi", N, p=0.6, seed=3)
    task = make_task("softmax", N, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)
    return net, task


def _ck(folder, **kw):
    return Checkpoints([folder], [{"run_id": "r", "config_digest": "c", "source": "s"}], n=N, every=EVERY, **kw)


CASES = [("dsgd", {"form": "cta", "optimizer": {"name": "sgd", "momentum": 0.9}}, "dp_sgd"),
         ("dinno", {"primal_steps": 2, "optimizer": "adam"}, "ldp"),  # (neighbour sums: DECOR refuses DiNNO)
         ("dsg_rms", {"protection": "tanh"}, "whisper"),
         ("edsg_rms", {"structure": "upper_bidiagonal", "protection": "erf"}, "none"),
         ("dpdl", {}, "dp_sgd"),
         ("dsgt", {}, "decor")]


def _mech(net, task, alg, family):
    steps = alg.accesses(ROUNDS, net.edges)
    if family == "none":
        return make_mechanism("none", steps=steps)
    if family == "dp_sgd":
        return make_mechanism("dp_sgd", steps=steps, task=task, clip=1.0, lot_size=20, noise_multiplier=1.0)
    return make_mechanism(family, steps=steps, network=net, clip=1.0, epsilon=20.0)


@pytest.mark.parametrize("name,params,family", CASES)
@pytest.mark.exact
def test_a_resumed_run_equals_the_uninterrupted_one_at_every_cut(setup, tmp_path, name, params, family):
    net, task = setup
    alg = make_algorithm(name, **params)
    mech = _mech(net, task, alg, family)
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    kw = dict(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS, seed=7,
              sparse=True, eval_every=2)
    want = simulate(**kw)
    for cut in (EVERY, 5, 2 * EVERY + 1):
        folder = tmp_path / f"cut{cut}"
        with pytest.raises(Stop):
            simulate(**kw, checkpoints=_ck(folder), on_step=stop_after(cut))
        assert _ck(folder).latest() == cut // EVERY * EVERY
        got = simulate(**kw, checkpoints=_ck(folder), resume=True)
        assert torch.equal(got.final, want.final), cut
        assert got.records == want.records, cut
        assert torch.equal(got.accesses, want.accesses), cut
        assert mech.ledger(got.accesses).to_dict() == mech.ledger(want.accesses).to_dict()


@pytest.mark.exact
def test_sliced_checkpoints_resume_with_any_number_of_slices(setup, tmp_path):
    """Checkpoints are per agent, not per slice: written by 2 slices, resumed by 3 slices or by the simulator."""
    net, task = setup
    alg = make_algorithm("dsgt")
    mech = _mech(net, task, alg, "dp_sgd")
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    kw = dict(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS, seed=7,
              eval_every=2)
    want = simulate(**kw, sparse=True)
    with pytest.raises(Stop):
        simulate_sliced(**kw, slices=2, checkpoints=_ck(tmp_path / "a"), on_step=stop_after(8))
    assert sorted(p.name for p in (tmp_path / "a" / "round-000000006").iterdir()) == [
        *(f"agent-{i}.pt" for i in range(N)), "run.pt"]
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    got = simulate_sliced(**kw, slices=3, checkpoints=_ck(tmp_path / "a"), resume=True)
    assert torch.equal(got.final, want.final) and got.records == want.records
    assert torch.equal(got.accesses, want.accesses)
    got = simulate(**kw, sparse=True, checkpoints=_ck(tmp_path / "b"), resume=True)
    assert torch.equal(got.final, want.final) and got.records == want.records


@pytest.mark.exact
def test_an_eavesdroppers_window_and_running_averages_survive_a_resume(tmp_path):
    """Seed 002's filtering task: the eavesdropper observer (a sliding window of 4 rounds) and the running average
    metrics are part of the run state."""
    net = Network.from_topology("ring", N)
    task = make_task("adaptive_filtering", N, dim=3, seed=0)
    alg = make_algorithm("dsg_rms")
    mech = make_mechanism("none", steps=alg.accesses(ROUNDS, net.edges))
    sched = make_schedule("constant", eta=0.05, iterations=ROUNDS)

    def run(**extra):
        spy = Eavesdropper(N, window=4, target=task.optimum, wire=alg.wire)
        return simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                        seed=1, sparse=True, eval_every=1, observers=[spy], **extra)

    want = run()
    assert any(m == "eavesdropper_msd" for _, m, _ in want.records)
    with pytest.raises(Stop):
        run(checkpoints=_ck(tmp_path), on_step=stop_after(7))
    got = run(checkpoints=_ck(tmp_path), resume=True)
    assert got.records == want.records and torch.equal(got.final, want.final)


@pytest.mark.parametrize("rest", [
    '[mechanism]\nname = "decor"\nepsilon = 10.0\n',
    # stacked example-level DP-SGD with DPDL's cross-gradients: lots, noise and access counts continue exactly
    '[algorithm]\nname = "dpdl"\nself_noise = true\n[mechanism]\nname = "dp_sgd"\nnoise_multiplier = 1.0\n'
    'lot_size = 20\nclip = 1.0\n'], ids=["decor", "dpdl-dp_sgd"])
def test_a_stacked_sweep_resumes_mid_sweep(tmp_path, rest):
    """The runner's stacked replicas: each run keeps its own per-agent checkpoints; the batch resumes together and
    every run equals its uninterrupted self; the manifest says where it resumed."""
    from privdl.experiment.build import build, build_task
    from privdl.experiment.config import expand, load_config
    from privdl.experiment.run_pipeline import run_batch

    cfg = tmp_path / "c.toml"
    cfg.write_text('iterations = 12\neval_every = 2\nseeds = [0, 1, 2]\n[schedule]\neta = 0.05\n'
                   '[network]\ntopology = "ring"\nn = 6\n[task]\nname = "logistic"\ndataset = "breast_cancer"\n'
                   + rest + '[runtime]\ncheckpoint_every = 5\n')
    specs, _ = expand(load_config(cfg))
    task = build_task(specs[0].config, 6)
    parts = lambda: [build(s.config, task=task) for s in specs]  # noqa: E731
    want = run_batch(specs, parts())
    folders = [tmp_path / f"run{i}" for i in range(3)]
    with pytest.raises(Stop):
        run_batch(specs, parts(), on_step=stop_after(11), checkpoints=folders)
    got = run_batch(specs, parts(), checkpoints=folders, resume=True)
    for (rows, man), (want_rows, _) in zip(got, want):
        assert rows == want_rows
        assert man["checkpoints"] == {"every": 5, "resumed_from_round": 10}


def test_privdl_run_resume_continues_an_interrupted_run(tmp_path):
    """As a user runs it: a run stopped after round 8 (checkpoint_every = 3) leaves round 6; `privdl run --resume`
    continues from it and writes the uninterrupted run's results; without --resume the run starts over."""
    import csv
    import json

    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.experiment.config import expand, load_config
    from privdl.experiment.run_pipeline import run_one
    from privdl.experiment.store import ResultStore

    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "r"\niterations = 10\neval_every = 2\n[schedule]\neta = 0.05\n[network]\n'
                   'topology = "ring"\nn = 4\n[task]\nname = "logistic"\ndataset = "breast_cancer"\n'
                   '[mechanism]\nname = "gaussian_ldp"\nepsilon = 10.0\n[runtime]\ncheckpoint_every = 3\n')
    runner = CliRunner()
    ok = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "want"), "--no-plot", "--quiet"])
    assert ok.exit_code == 0, ok.output
    out = tmp_path / "got"
    store = ResultStore(out)
    spec = expand(load_config(cfg))[0][0]
    store.claim(load_config(cfg))
    with pytest.raises(Stop):
        run_one(spec, on_step=stop_after(8), checkpoints=store.run_dir(spec.run_id) / "checkpoints")
    res = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--no-plot", "--quiet", "--resume"])
    assert res.exit_code == 0, res.output
    man = json.loads((store.run_dir(spec.run_id) / "manifest.json").read_text())
    assert man["checkpoints"] == {"every": 3, "resumed_from_round": 6}
    assert not (store.run_dir(spec.run_id) / "checkpoints").exists()  # a saved run needs none

    def rows(folder):
        return sorted(tuple(r.values()) for r in csv.DictReader(open(folder / "results.csv")))

    assert rows(out) == rows(tmp_path / "want")


# ---- bad checkpoints ---------------------------------------------------------------------------------------------
@pytest.fixture
def written(setup, tmp_path):
    net, task = setup
    alg = make_algorithm("dsgd")
    mech = _mech(net, task, alg, "none")
    kw = dict(task=task, network=net, algorithm=alg, mechanism=mech,
              schedule=make_schedule("constant", eta=0.1, iterations=ROUNDS), iterations=ROUNDS, seed=7, sparse=True)
    with pytest.raises(Stop):
        simulate(**kw, checkpoints=_ck(tmp_path), on_step=stop_after(7))
    return kw, tmp_path


@pytest.mark.parametrize("identity,match", [
    ({"run_id": "r", "config_digest": "other", "source": "s"}, "another configuration"),
    ({"run_id": "r", "config_digest": "c", "source": "newer"}, "another privdl source version"),
    ({"run_id": "q", "config_digest": "c", "source": "s"}, "another run"),
])
def test_a_checkpoint_of_another_config_or_version_is_refused(written, identity, match):
    kw, folder = written
    with pytest.raises(CheckpointError, match=match):
        simulate(**kw, checkpoints=Checkpoints([folder], [identity], n=N, every=EVERY), resume=True)


def test_a_corrupt_or_truncated_checkpoint_is_refused_by_name(written):
    kw, folder = written
    path = folder / "round-000000006" / "agent-2.pt"
    blob = path.read_bytes()
    path.write_bytes(blob[:-100])
    with pytest.raises(CheckpointError, match="agent-2.pt is truncated or corrupt"):
        simulate(**kw, checkpoints=_ck(folder), resume=True)
    flipped = bytearray(blob)
    flipped[-50] ^= 1
    path.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="agent-2.pt is truncated or corrupt"):
        simulate(**kw, checkpoints=_ck(folder), resume=True)
    path.write_bytes(b"PK\x03\x04 not ours")
    with pytest.raises(CheckpointError, match="not a privdl checkpoint"):
        simulate(**kw, checkpoints=_ck(folder), resume=True)


def test_a_round_some_agent_lacks_is_passed_over_with_a_warning(written):
    kw, folder = written
    (folder / "round-000000006" / "agent-3.pt").unlink()
    with pytest.warns(UserWarning, match="lacks agent 3; resuming from round 3"):
        assert _ck(folder).latest() == 3
    shutil.rmtree(folder / "round-000000003")
    with pytest.raises(CheckpointError, match="lacks agent 3, and no earlier round is complete"):
        _ck(folder).latest()


def test_bad_checkpoint_settings_are_refused(tmp_path):
    from privdl.experiment.config import load_config

    with pytest.raises(CheckpointError, match="checkpoint_every must be an integer >= 1"):
        Checkpoints([tmp_path], [{}], n=N, every=0)
    path = tmp_path / "c.toml"
    for bad in ("0", "-3"):
        path.write_text(f'[schedule]\neta = 0.1\n[runtime]\ncheckpoint_every = {bad}\n')
        with pytest.raises(ConfigError, match="runtime.checkpoint_every must be >= 1"):
            load_config(path)
