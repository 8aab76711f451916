"""Gradient inversion (DLG, iDLG) on seed 002's CNN: it must really recover a digit from an exact single-sample
gradient, read every class's label off the gradient, and score reconstructions with scikit-image's metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privdl.attacks import dlg, example_gradient, idlg, idlg_labels, reconstruction_metrics
from privdl.errors import ValidationError
from privdl.tasks import make_task


@pytest.fixture(scope="module")
def mnist():
    from privdl.errors import PrivdlError
    from tests.conftest import SHARED_DATA

    try:
        task = make_task("sigmoid_cnn", 5, data_dir=str(SHARED_DATA), dtype=torch.float64)
    except (PrivdlError, FileNotFoundError) as exc:
        pytest.skip(f"MNIST digits not present under {SHARED_DATA} ({exc})")
    X = task.X.reshape(-1, *task.model.input_shape)
    y = task.y.reshape(-1).long()
    return task, X, y


@pytest.mark.slow
def test_dlg_and_idlg_recover_an_mnist_digit_from_its_exact_gradient(mnist):
    """Untrained seed-002 CNN (DLG's uniform ±0.5 initialisation, seed 0), one MNIST test digit, 100 L-BFGS
    iterations: the reconstruction must reach PSNR > 30 dB (a blank or random image scores < 10 dB)."""
    task, X, y = mnist
    theta = task.init_params(torch.Generator().manual_seed(0))
    x, label = X[:1], y[:1]
    g = example_gradient(task.model, theta, x, torch.nn.functional.one_hot(label, 10).to(x.dtype))
    for attack in (idlg, dlg):
        r = attack(task.model, theta, g, classes=10, iterations=100)
        m = reconstruction_metrics(x, r.inputs)[0]
        assert m["psnr"] > 30 and m["ssim"] > 0.9, (attack.__name__, m)
        assert int(r.labels[0]) == int(label[0])
    noise = reconstruction_metrics(x, torch.rand(x.shape, generator=torch.Generator().manual_seed(1),
                                                 dtype=x.dtype))[0]
    assert noise["psnr"] < 10


def test_idlg_reads_every_class_from_a_single_sample_gradient(mnist):
    task, X, y = mnist
    for seed in (0, 1):
        theta = task.init_params(torch.Generator().manual_seed(seed))
        idx = torch.stack([torch.nonzero(y == c)[seed, 0] for c in range(10)])
        g = example_gradient(task.model, theta, X[idx], torch.nn.functional.one_hot(y[idx], 10).to(X.dtype))
        assert idlg_labels(task.model, g).tolist() == list(range(10))


@pytest.mark.slow
def test_batched_attacks_match_their_single_versions_in_quality(mnist):
    task, X, y = mnist
    theta = task.init_params(torch.Generator().manual_seed(2))
    x = X[:3]
    g = example_gradient(task.model, theta, x, torch.nn.functional.one_hot(y[:3], 10).to(x.dtype))
    r = idlg(task.model, theta, g, classes=10, iterations=150)
    assert min(m["psnr"] for m in reconstruction_metrics(x, r.inputs)) > 25


def test_metrics_are_scikit_images_and_bad_inputs_are_refused():
    from skimage.metrics import peak_signal_noise_ratio

    a = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    b = a + 0.1
    m = reconstruction_metrics(a, b, data_range=1.0)
    assert m[0]["mse"] == pytest.approx(0.01)
    assert m[0]["psnr"] == pytest.approx(20.0)  # 10 log10(1 / 0.01)
    assert m[1]["psnr"] == pytest.approx(peak_signal_noise_ratio(a[1, 0].numpy(), b[1, 0].numpy(), data_range=1.0))
    assert reconstruction_metrics(a, a.clone(), data_range=1.0)[0]["ssim"] == pytest.approx(1.0)
    with pytest.raises(ValidationError, match="shape"):
        reconstruction_metrics(a, b[:1])
    task = make_task("softmax", 2, dataset="digits")
    with pytest.raises(ValidationError, match="gradients must be"):
        dlg(task.model, torch.zeros(task.dim), torch.zeros(1, 3), classes=10)
    with pytest.raises(ValidationError, match="loss"):
        dlg(task.model, torch.zeros(task.dim), torch.zeros(1, task.dim), classes=10, loss="l1")
    assert np.isfinite(m[0]["ssim"])


# ---- attacker views (seed 002 §5.2) --------------------------------------------------------------------------------
def _attacked_run(name, params, rounds=10, eta=0.02, attacker=0, victim=1, mechanism=("none", {}), lazy=False,
                  extra=0):
    from privdl.algorithms import make_algorithm
    from privdl.comm.observers import Transcript
    from privdl.keys import Draws, Keys
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network
    from privdl.schedules import make_schedule
    from privdl.simulator import simulate

    net = Network.from_topology("erdos_renyi", 5, p=0.5, mixing="laplacian", seed=0, lazy=lazy)
    task = make_task("sigmoid_cnn", 5, partition="missing_classes", dtype=torch.float64)
    alg = make_algorithm(name, **params)
    tr, own = Transcript(), {}
    mech = make_mechanism(mechanism[0], steps=rounds + extra + 1, **mechanism[1])
    simulate(task=task, network=net, algorithm=alg, mechanism=mech,
             schedule=make_schedule("constant", iterations=rounds + extra, eta=eta), iterations=rounds + extra,
             seed=0, metrics=False, eval_every=1, observers=[tr],
             on_record=lambda t, x: own.__setitem__(t, x[attacker].clone()))
    rows = np.array([victim])
    x, y = task.sample(Draws(Keys(0, 5), "batch", rounds + extra, rows, rows), torch.tensor([victim]))  # the sample
    return task, net, alg, tr, own, x[0].reshape(1, 1, 28, 28), int(y[0, 0])


@pytest.mark.slow
def test_views_let_dlg_recover_dsgd_samples_and_rms_hides_them_from_the_eavesdropper(mnist):
    from privdl.attacks.views import observe

    task, net, alg, tr, own, x, label = _attacked_run("dsgd", {})
    for kind, msgs in (("eavesdropper", tr.messages), ("curious_neighbour", tr.view_of(0))):
        ob = observe(kind, msgs, net.edges, victim=1, round=10, eta=0.02, attacker=0, own_models=own)
        r = idlg(task.model, ob.model, ob.gradient[None], classes=10, iterations=200)
        assert int(r.labels[0]) == label and reconstruction_metrics(x, r.inputs)[0]["psnr"] > 30, kind
    task, net, alg, tr, own, x, label = _attacked_run("dsg_rms", {"sigma_z": 0.1, "tau": 0.1,
                                                                  "structure": "sparse"})
    ob = observe("eavesdropper", tr.messages, net.edges, victim=1, round=10, eta=0.02)
    r = idlg(task.model, ob.model, ob.gradient[None], classes=10, iterations=200)
    assert reconstruction_metrics(x, r.inputs)[0]["psnr"] < 15  # the protection vector defeats it


@pytest.mark.parametrize("name,params,lazy,extra", [
    ("dsg_rms", {"sigma_z": 0.1, "tau": 0.1, "structure": "sparse"}, False, 0),
    ("edsg_rms", {"sigma_z": 0.1, "tau": 0.1, "structure": "sparse"}, True, 0), ("dsgt", {}, False, 1),
    ("pd_lms", {}, False, 0)])
@pytest.mark.exact
def test_a_curious_neighbours_view_uses_only_its_own_messages_and_state(mnist, name, params, lazy, extra):
    from privdl.attacks.views import observe
    from privdl.comm.observers import Message, Transcript

    task, net, alg, tr, own, x, label = _attacked_run(name, params, lazy=lazy, extra=extra)
    a = 0
    blind = Transcript()  # every entry the attacker neither received nor sent is destroyed
    for m in tr.messages:
        keep = (m.dst == a) | (m.src == a)
        payload = torch.where(keep[:, None], m.payload, torch.full_like(m.payload, float("nan")))
        blind.messages.append(Message(m.t, m.tag, m.src, m.dst, payload))
    args = dict(victim=1, round=10, eta=0.02, attacker=a, own_models=own, protection=alg.wire, algorithm=name,
                initial=own[0], lag=int(alg.facts.get("protection_lag", 1)))
    seen = observe("curious_neighbour", tr.view_of(a), net.edges, **args)
    # the same computation on the same shapes: equal bit for bit unless a destroyed (NaN) entry is read
    again = observe("curious_neighbour", blind.view_of(a), net.edges, **args)
    assert torch.isfinite(seen.gradient).all() and torch.equal(seen.gradient, again.gradient)
    assert torch.equal(seen.model, again.model)
    truth = {t: v.clone() for t, v in own.items()}
    own[10] = own[10] + 1.0  # the attacker's state is used only up to the rounds the attack reads
    assert torch.equal(observe("curious_neighbour", tr.view_of(a), net.edges, **args).gradient, seen.gradient)
    own.update(truth)
    assert 2 not in net.neighbours(1)  # agent 2 is not agent 1's neighbour: it sees none of its messages
    with pytest.raises(ValidationError, match="not its neighbour"):
        observe("curious_neighbour", tr.view_of(2), net.edges, **{**args, "attacker": 2})


@pytest.mark.slow
def test_privdl_attack_prints_the_contracts_json_and_writes_the_grid(mnist, tmp_path):
    import json

    from typer.testing import CliRunner

    from privdl.cli import app

    cfg = tmp_path / "run.toml"
    cfg.write_text('iterations = 12\nseed = 0\ndtype = "float64"\n[network]\ntopology = "erdos_renyi"\nn = 5\n'
                   'p = 0.5\nmixing = "laplacian"\n[task]\nname = "sigmoid_cnn"\npartition = "missing_classes"\n'
                   '[algorithm]\nname = "dsgd"\n[schedule]\nname = "constant"\neta = 0.02\n')
    res = CliRunner().invoke(app, ["attack", "idlg", "--config", str(cfg), "--attacker", "0", "--victim", "1",
                                   "--round", "10", "--images", "2", "--iterations", "150", "--out",
                                   str(tmp_path / "out"), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # the result; the progress goes to stderr
    assert {"mse", "psnr", "ssim", "label_correct"} <= set(out) and len(out["images"]) == 2
    assert out["label_correct"] == 1.0 and out["psnr"] > 30
    assert (tmp_path / "out" / "idlg_curious_neighbour_victim1_round10.png").is_file()
    for args, match in ((["--attacker", "2", "--round", "10"], "not a neighbour"),
                        (["--attacker", "0", "--round", "12", "--images", "2"], "beyond the run"),
                        (["--attacker", "0", "--round", "0"], "round must be >= 1")):
        res = CliRunner().invoke(app, ["attack", "dlg", "--config", str(cfg), "--victim", "1", *args])
        assert res.exit_code == 2 and match in res.output, res.output


# ---- every family's view, checked against the gradient recomputed on the victim's true sample --------------------
@pytest.mark.parametrize("name,params,lazy,extra", [
    ("dsgd", {}, False, 0), ("exact_diffusion", {}, True, 0), ("dsgt", {}, False, 1),
    ("pd_lms", {"variance": 0.0}, False, 0)])
def test_an_eavesdroppers_view_of_an_unprotected_algorithm_is_the_victims_exact_gradient(mnist, name, params, lazy,
                                                                                        extra):
    from privdl.attacks.views import observe

    task, net, alg, tr, own, x, label = _attacked_run(name, params, rounds=6, lazy=lazy, extra=extra)
    ob = observe("eavesdropper", tr.messages, net.edges, victim=1, round=6, eta=0.02, algorithm=name,
                 initial=own[0])
    assert ob.note == "exact" or name == "pd_lms"  # PD-LMS's notes name its per-edge approximations (exact at σ_g = 0)
    onehot = torch.nn.functional.one_hot(torch.tensor([label]), 10).to(torch.float64)
    truth = example_gradient(task.model, ob.model, x, onehot)[0]  # autograd on the true sample at the view's model
    assert torch.allclose(ob.gradient, truth, rtol=1e-6, atol=1e-9), name
    # and the model is the victim's own, checked through the run's own record of it (agent 1 = the victim)
    task2, net2, alg2, tr2, own_v, *_ = _attacked_run(name, params, rounds=6, lazy=lazy, extra=extra, attacker=1)
    assert torch.allclose(ob.model, own_v[6 if name == "dsgt" else 5].to(torch.float64), atol=1e-12)


def _attack_config(name, params, *, lazy=False, mechanism=None, rounds=6):
    cfg = {"seed": 0, "iterations": rounds, "eval_every": 0,
           "task": {"name": "sigmoid_cnn", "partition": "missing_classes", "batch_size": 1,
                    "data_dir": str(_data_dir())},
           "network": {"topology": "erdos_renyi", "n": 5, "p": 0.5, "mixing": "laplacian", "lazy": lazy},
           "algorithm": {"name": name, **params}, "schedule": {"name": "constant", "eta": 0.02},
           "mechanism": mechanism or {"name": "none"}}
    return cfg


def _data_dir():
    from tests.conftest import SHARED_DATA

    return SHARED_DATA


def test_the_generous_oracle_is_what_an_eavesdropper_reads_off_unprotected_edsg_rms(mnist):
    """EDSG-RMS without protection (τ = 0) but with a random matrix: the eavesdropper's exact-diffusion recursion
    gives M·ĝ exactly, so it must equal the oracle's M drawn again from the run's keys; with protection the view
    fails and only the oracle remains."""
    from privdl.attacks.views import GENEROUS_NOTE, observations

    cfg = _attack_config("edsg_rms", {"sigma_z": 0.1, "tau": 0.0, "protection": "none", "structure": "sparse"},
                         lazy=True)
    seen = observations(cfg, attacker=0, victim=1, round=3, images=2, kind="eavesdropper")
    oracle = observations(cfg, attacker=0, victim=1, round=3, images=2, kind="generous")
    assert torch.equal(seen.inputs, oracle.inputs) and oracle.observations[0].note == GENEROUS_NOTE
    for a, b in zip(seen.observations, oracle.observations):
        assert torch.allclose(a.model, b.model, atol=1e-12) and torch.allclose(a.gradient, b.gradient, atol=1e-9)
    onehot = torch.nn.functional.one_hot(oracle.labels, 10).to(torch.float64)
    plain = example_gradient(oracle.task.model, torch.stack([o.model for o in oracle.observations]), oracle.inputs,
                             onehot)
    assert not torch.allclose(plain[0], oracle.observations[0].gradient, atol=1e-3)  # M really acted
    # With protection (seed 002 Fig. 2's τ = 0.1, norm law) the seed says the curious neighbour cannot estimate ψ':
    # its first round (the random c'(−1)) is indeed off, but the protection guesses' errors telescope, and from round
    # 3 on it has M·ĝ within 1 % and the model within 1e-3 — the oracle's numbers, read off its real view.
    protected = _attack_config("edsg_rms", {"sigma_z": 0.1, "tau": 0.1, "structure": "sparse"}, lazy=True,
                               rounds=8)
    true = observations(protected, attacker=0, victim=1, round=2, images=6, kind="generous").observations
    got = observations(protected, attacker=0, victim=1, round=2, images=6, kind="curious_neighbour").observations
    spy = observations(protected, attacker=0, victim=1, round=2, images=6, kind="eavesdropper").observations

    def rel(a, b):
        return float((a - b).norm() / b.norm())
    assert rel(got[0].gradient, true[0].gradient) > 1.0
    assert max(rel(g.gradient, t.gradient) for g, t in zip(got[1:], true[1:])) < 0.01
    assert max(rel(g.model, t.model) for g, t in zip(got[1:], true[1:])) < 1e-3
    assert min(rel(g.model, t.model) for g, t in zip(spy[1:], true[1:])) > 0.05  # the eavesdropper's model is off


@pytest.mark.slow
def test_a_dp_protected_message_at_small_epsilon_leaks_no_more_than_random_guessing(mnist):
    """LDP D-SGD at agent-level ε = 1 (δ = 1e-5, C = 1, over the run's 12 rounds): the curious neighbour's iDLG
    reconstructions (cosine matching, which the clipping's rescaling does not fool) must score within 3 dB PSNR of
    random guessing (uniform noise images in the data's range) and have SSIM below 0.1. The control: the same
    mechanism at ε = 10⁷ (the same clipping, almost no noise) is attacked with SSIM above 0.3 — the noise, not the
    clipping or the view, is what protects."""
    from privdl.attacks.views import attack_run

    args = dict(attacker=0, victim=1, round=9, images=3, iterations=200, loss="cosine")

    def ldp(epsilon):
        return _attack_config("dsgd", {}, rounds=12, mechanism={"name": "gaussian_ldp", "epsilon": epsilon,
                                                                "delta": 1e-5, "clip": 1.0})
    got = attack_run(ldp(1.0), **args)
    assert attack_run(ldp(1e7), **args)["ssim"] > 0.3
    x = got["originals"]
    guesses = torch.rand((63, *x.shape[1:]), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lo, hi = float(mnist[1].min()), float(mnist[1].max())
    random = [m["psnr"] for k in range(0, 63, 3) for m in reconstruction_metrics(x, lo + (hi - lo) * guesses[k:k + 3])]
    assert got["psnr"] < float(np.mean(random)) + 3.0, (got["psnr"], float(np.mean(random)))
    assert got["ssim"] < 0.1
    # scored as read in the data's domain: every reconstruction is clamped into [lo, hi], so its MSE is at most
    # (hi − lo)² and its PSNR (peak: the originals' range r) at least 20·log10(r / (hi − lo)); unclamped, the noisy
    # optimisation's pixels leave the range and PSNRs reach −40 dB and below
    rec = got["reconstructions"]
    assert lo <= float(rec.min()) and float(rec.max()) <= hi
    floor = 20 * np.log10(float(x.max() - x.min()) / (hi - lo))
    assert min(m["psnr"] for m in got["images"]) >= floor - 1e-9
    assert 0.0 < got["clamped_fraction"] <= 1.0 and all(0.0 <= m["clamped_fraction"] <= 1.0 for m in got["images"])


def test_dlg_refuses_a_model_it_cannot_differentiate_through_and_more_images_than_the_victim_holds():
    from privdl.tasks.models import ModuleModel

    class Rounded(torch.nn.Module):  # the input enters through round(): ∂/∂x of the matched gradient is 0
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(torch.round(x.reshape(x.shape[0], -1)))

    model = ModuleModel("rounded", Rounded(), (1, 2, 2))
    theta = torch.randn(model.dim, dtype=torch.float64)
    with pytest.raises(ValidationError, match="no usable derivative with respect to the input"):
        dlg(model, theta, torch.randn(1, model.dim, dtype=torch.float64), classes=3, iterations=2)


def test_an_attack_asks_for_no_more_images_than_the_victim_holds(mnist):
    from privdl.attacks.views import observations

    cfg = _attack_config("dsgd", {}, rounds=3000)
    cfg["task"]["train_size"] = 100  # 100 training digits over 5 agents: agent 1 holds fewer than 40
    with pytest.raises(ValidationError, match="more than agent 1's"):
        observations(cfg, attacker=0, victim=1, round=1, images=40)


@pytest.mark.parametrize("name,extra", [("dsgd", 0), ("dsgt", 1)])
def test_an_attacks_true_samples_are_what_the_engine_drew_for_the_observed_access(mnist, name, extra):
    """The attack takes the victim's true samples from the engine's own record of each access (GradientOracle's
    on_access), not from a re-derived counter rule; they agree with the rule (the observed gradient of round r is
    access r, DSGT's init being access 1), derived here independently from the keys."""
    from privdl.attacks.views import observations
    from privdl.keys import Draws, Keys

    got = observations(_attack_config(name, {}), attacker=0, victim=1, round=3, images=2, kind="eavesdropper")
    for k, r in enumerate((3, 4)):
        want = got.task.sample(Draws(Keys(0, 5), "batch", r + extra, np.array([1]), np.array([1])),
                               torch.tensor([1]))
        assert torch.equal(got.inputs[k].reshape(-1), want[0][0].reshape(-1).to(torch.float64))
        assert int(got.labels[k]) == int(want[1][0][0])
