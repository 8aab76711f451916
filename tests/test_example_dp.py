"""Example-level DP-SGD (SPEC §2, §4): per-example gradients, Poisson lots, clipping, noise level, calibration,
the DP-DSGD / DP-DSGT / DP-DiNNO algorithms and their optimizers."""

import math

import numpy as np
import pytest
import torch

from privdl.algorithms import StepContext, make_algorithm
from privdl.algorithms.optimizers import Optimizer
from privdl.comm import DenseComm
from privdl.errors import ValidationError
from privdl.gradients import clipped_example_sum, per_example_gradients
from privdl.keys import Keys
from privdl.mechanisms import MechanismEnv, make_mechanism
from privdl.mechanisms.base import AccessBudgetExceeded
from privdl.network import Network
from privdl.privacy.example_accountant import rdp_epsilon
from privdl.schedules import make_schedule
from privdl.simulator import GradientOracle, simulate
from privdl.tasks import make_task, quadratic_optimum, quadratic_problem
from privdl.tasks.models import ModuleModel
from tests.conftest import assert_ghost_matches_per_example, draw_batch, draw_lot


def _oracle(task, mech, seed=0):
    mech.bind(MechanismEnv(Keys(seed, task.n)))
    return GradientOracle(task, mech, Keys(seed, task.n))


def _cnn(n=3, **kw):
    return make_task("cnn", n, dataset="digits", kernel=3, filters=2, width=8, dtype=torch.float64, **kw)


def _loop_gradients(task, x, batch):
    out = torch.empty(x.shape[0], batch[0].shape[1], x.shape[1], dtype=x.dtype)
    for i in range(x.shape[0]):
        for b in range(batch[0].shape[1]):
            theta = x[i].clone().requires_grad_(True)
            (g,) = torch.autograd.grad(task.loss(theta, *(t[i, b:b + 1] for t in batch)), theta)
            out[i, b] = g
    return out


def test_cnn_per_example_gradients_equal_a_loop():
    task = _cnn(batch_size=5)
    gen = torch.Generator().manual_seed(0)
    x = task.init_params(gen).expand(3, -1).clone() + 0.05 * torch.randn(3, task.dim, generator=gen,
                                                                             dtype=torch.float64)
    batch = draw_batch(task)
    assert torch.allclose(per_example_gradients(task, x, batch), _loop_gradients(task, x, batch), atol=1e-12)


@pytest.mark.parametrize("chunk", [None, 2])
def test_clipped_lot_sum_equals_a_loop(chunk):
    task = _cnn()
    gen = torch.Generator().manual_seed(1)
    x = task.init_params(gen).expand(3, -1).clone() * 3
    (batch, mask) = draw_lot(task, torch.full((3,), 0.02, dtype=torch.float64))
    grads = _loop_gradients(task, x, batch)
    norms = grads.norm(dim=2, keepdim=True)
    C = float(norms[mask.bool()].median())
    assert (norms > C).any() and (norms < C).any()  # both branches of the clip are exercised
    expected = (grads * torch.clamp(C / norms, max=1.0) * mask[..., None]).sum(dim=1)
    assert torch.allclose(clipped_example_sum(task, x, batch, mask, C, chunk), expected, atol=1e-12)
    assert torch.allclose(clipped_example_sum(task, x, batch, mask, None, chunk), (grads * mask[..., None]).sum(1))


@pytest.mark.slow
def test_poisson_lots_have_the_right_size_and_inclusion_rate():
    task = make_task("softmax", 4, dataset="digits", partition="dirichlet", alpha=0.5, seed=3)
    counts = task.counts.double()
    rates = torch.tensor([0.05, 0.1, 0.2, 0.3], dtype=torch.float64)
    sizes, hits = [], torch.zeros(4, int(counts.max()), dtype=torch.float64)
    reps = 400
    for k in range(reps):
        (X, y), mask = draw_lot(task, rates, seed=2, call=k + 1)
        sizes.append(mask.sum(1))
        # which examples were drawn: recover the position inside each agent's data from the gathered rows
        for i in range(4):
            k = int(mask[i].sum())
            rows = X[i, :k].reshape(k, -1)
            data = task.X[i, : int(counts[i])].reshape(int(counts[i]), -1)
            idx = (rows[:, None, :] == data[None]).all(-1).double().argmax(1)
            hits[i, idx] += 1
            assert len(set(idx.tolist())) == k or True  # duplicates in the data itself are possible
    sizes = torch.stack(sizes)
    mean, expected = sizes.mean(0), counts * rates
    sd = (counts * rates * (1 - rates) / reps).sqrt()
    assert ((mean - expected).abs() < 5 * sd).all(), (mean, expected)
    var = sizes.var(0)
    assert ((var / (counts * rates * (1 - rates)) - 1).abs() < 0.35).all()  # Binomial, not fixed, lot sizes
    for i in range(4):
        freq = hits[i, : int(counts[i])] / reps
        assert abs(float(freq.mean()) - float(rates[i])) < 0.01


def test_zero_gradient_noise_level():
    """With zero gradients, θ_T = −η Σ_t σC ξ_t / L, so ‖θ_T‖² = T·d·σ²C²η²/L² · χ²_d/d (relative sd √(2/d));
    the per-step noises are independent, so Σ_t ‖G̃_t‖² ≈ T·d·σ²C²/L² with relative sd √(2/(T d))."""
    task = make_task("softmax", 1, dataset="digits", dtype=torch.float64)
    task.block_loss = lambda blocks, *batch: 0.0 * sum(b.sum() for b in blocks)  # zero gradients
    T, eta, L, C, sigma = 50, 0.3, 64, 2.0, 1.7
    mech = make_mechanism("dp_sgd", steps=T, task=task, clip=C, lot_size=L, noise_multiplier=sigma,
                          per_example="vmap")  # the patched loss goes through torch.func
    res = simulate(task=task, network=Network.from_topology("complete", 1), algorithm=make_algorithm("dsgd"),
                   mechanism=mech, schedule=make_schedule("constant", eta=eta, iterations=T), iterations=T, seed=4,
                   x0=torch.zeros(1, task.dim, dtype=torch.float64))
    sq = float((res.final ** 2).sum())
    expected = T * task.dim * sigma**2 * C**2 * eta**2 / L**2
    assert abs(sq / expected - 1) < 4 * math.sqrt(2 / task.dim)
    oracle = _oracle(task, mech, seed=9)
    x = torch.zeros(1, task.dim, dtype=torch.float64)
    total = sum(float((oracle(x) ** 2).sum()) for t in range(T))
    assert abs(total / (expected / eta**2) - 1) < 4 * math.sqrt(2 / (T * task.dim))


def test_calibration_is_per_agent_and_re_accounted():
    task = make_task("softmax", 3, dataset="digits", partition="dirichlet", alpha=0.3, seed=0)
    mech = make_mechanism("dp_sgd", steps=40, task=task, clip=1.0, lot_size=32, epsilon=2.0, delta=1e-5,
                          accountant="rdp")
    assert len(set(task.counts.tolist())) == 3 and len(set(mech.sigmas.tolist())) == 3
    ledger = mech.ledger()
    assert ledger.unit == "example" and ledger.accountant == "rdp"
    for i, q in enumerate((32 / task.counts.double()).tolist()):
        assert mech.rates[i] == pytest.approx(q)
        eps, _ = rdp_epsilon(noise_multiplier=float(mech.sigmas[i]), sample_rate=q, steps=40, delta=1e-5)
        assert eps <= 2.0 and eps > 2.0 * 0.999
        row = ledger.per_agent()[i]
        assert row["sample_rate"] == pytest.approx(q) and row["accesses"] == 40
        assert row["epsilon"] == pytest.approx(eps, rel=1e-9)


def test_bad_input_is_refused_with_a_reason():
    task = make_task("softmax", 3, dataset="digits")
    with pytest.raises(ValidationError, match="larger than the data of agent"):
        make_mechanism("dp_sgd", steps=10, task=task, lot_size=10_000, epsilon=1.0)
    with pytest.raises(ValidationError, match="no noise multiplier"):
        make_mechanism("dp_sgd", steps=10, task=task, lot_size=400, epsilon=1e-6, delta=1e-12)
    with pytest.raises(ValidationError, match="exactly one"):
        make_mechanism("dp_sgd", steps=10, task=task, lot_size=10)
    with pytest.raises(ValidationError, match="cannot draw Poisson lots"):
        make_mechanism("dp_sgd", steps=10, task=make_task("quadratic", 3), epsilon=1.0)
    bn = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    with pytest.raises(ValidationError, match=r"layer '1' \(BatchNorm2d\).*GroupNorm"):
        ModuleModel("bad", bn, (1, 8, 8))
    mech = make_mechanism("dp_sgd", steps=2, task=task, lot_size=16, noise_multiplier=1.0)
    x = torch.zeros(3, task.dim, dtype=task.dtype)
    oracle = _oracle(task, mech)
    oracle(x)
    oracle(x)
    with pytest.raises(AccessBudgetExceeded, match="agent 0"):
        oracle(x)


@pytest.mark.parametrize("algorithm,calls", [("dsgd", 30), ("dsgt", 31), ("dinno", 60)])
def test_accounting_covers_every_noisy_access(algorithm, calls):
    params = {"primal_steps": 2} if algorithm == "dinno" else {"form": "cta"} if algorithm == "dsgd" else {}
    alg = make_algorithm(algorithm, **params)
    assert alg.gradient_calls(30) == calls
    task = make_task("softmax", 3, dataset="digits", dtype=torch.float32)
    mech = make_mechanism("dp_sgd", steps=calls, task=task, lot_size=32, epsilon=3.0)
    net = Network.from_topology("ring", 3)
    assert alg.accesses(30, net.edges).tolist() == [calls] * 3
    simulate(task=task, network=net, algorithm=alg, mechanism=mech,
             schedule=make_schedule("constant", eta=0.05, iterations=30), iterations=30, seed=0)
    assert mech.calls.tolist() == [calls] * 3 and mech.ledger().steps == calls


def test_dsgt_tracks_the_average_noisy_gradient():
    n, d = 5, 4
    net = Network.from_topology("ring", n)
    gen = torch.Generator().manual_seed(0)
    seen = []

    def noisy(x):
        g = x + torch.randn(x.shape, generator=gen, dtype=x.dtype)
        seen.append(g)
        return g

    alg = make_algorithm("dsgt")
    comm = DenseComm(net)
    state = alg.init(torch.zeros(n, d, dtype=torch.float64), StepContext(0, 0.1, comm, noisy))
    assert len(seen) == 1  # y⁰ is drawn in init
    for t in range(1, 20):
        state = alg.step(state, StepContext(t, 0.1, comm, noisy))
        assert torch.allclose(state.y.mean(0), seen[-1].mean(0), atol=1e-12)
    assert len(seen) == 20  # y⁰ plus one per round


def test_dinno_without_privacy_reaches_the_centralized_solution():
    n = 6
    A, c = quadratic_problem(n)
    x_star, _ = quadratic_optimum(A, c)
    task = make_task("quadratic", n)
    res = simulate(task=task, network=Network.from_topology("ring", n),
                   algorithm=make_algorithm("dinno", rho=0.5, optimizer="sgd", primal_steps=3),
                   mechanism=make_mechanism("none", steps=3 * 4000),
                   schedule=make_schedule("constant", eta=0.01, iterations=4000), iterations=4000, seed=0)
    assert np.allclose(res.final.numpy(), x_star[None, :], atol=1e-6)


@pytest.mark.parametrize("name,params", [("dsgd", {"form": "cta", "optimizer": {"name": "sgd", "momentum": 0.9}}),
                                          ("dsgd", {}), ("dsgt", {}),
                                          ("dinno", {"optimizer": "adam", "primal_steps": 2})])
def test_updates_are_synchronous(name, params):
    """Relabelling the agents relabels the result: no agent reads a neighbour's already-updated model."""
    n, d = 6, 3
    net = Network.from_topology("erdos_renyi", n, p=0.5, seed=2)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    P = np.eye(n)[perm.numpy()]
    net_p = Network.from_matrix(P @ net.W @ P.T)
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(n, d, d, generator=gen, dtype=torch.float64)
    b = torch.randn(n, d, generator=gen, dtype=torch.float64)

    def grad_fn(A, b):
        return lambda x: torch.einsum("nij,nj->ni", A, x) - b

    x0 = torch.randn(n, d, generator=gen, dtype=torch.float64)
    alg = make_algorithm(name, **params)
    comm, comm_p = DenseComm(net), DenseComm(net_p)
    s = alg.init(x0, StepContext(0, 0.05, comm, grad_fn(A, b)))
    sp = alg.init(x0[perm], StepContext(0, 0.05, comm_p, grad_fn(A[perm], b[perm])))
    for t in range(1, 6):
        s = alg.step(s, StepContext(t, 0.05, comm, grad_fn(A, b)))
        sp = alg.step(sp, StepContext(t, 0.05, comm_p, grad_fn(A[perm], b[perm])))
    assert torch.allclose(alg.params(s)[perm], alg.params(sp), atol=1e-12)


@pytest.mark.parametrize("opt,torch_opt", [
    (Optimizer("sgd", momentum=0.9, weight_decay=1e-2), lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9,
                                                                                   weight_decay=1e-2)),
    (Optimizer("adam"), lambda p: torch.optim.Adam([p], lr=0.1)),
    (Optimizer("adam", weight_decay=1e-3), lambda p: torch.optim.Adam([p], lr=0.1, weight_decay=1e-3)),
])
def test_optimizers_match_torch_optim(opt, torch_opt):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    p = x.clone().requires_grad_(True)
    ref = torch_opt(p)
    state = opt.init(x)
    for _ in range(15):
        g = torch.randn(4, 7, generator=gen, dtype=torch.float64) + x
        u, state = opt.update(state, g, 0.1, x)
        x = x + u
        p.grad = g.clone()
        ref.step()
        assert torch.allclose(x, p.detach(), atol=1e-12)


def test_resnet9_groupnorm_forward_and_per_example_gradients_on_random_tensors():
    from privdl.tasks.models import resnet9

    model = resnet9((3, 32, 32), 100, width=8, groups=4)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.module.modules())
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.module.modules())
    theta = model.init(torch.Generator().manual_seed(0), torch.float64)
    X = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    logits = model.predict(theta, X)
    assert logits.shape == (3, 100)
    # one example's logits do not depend on the others (no batch statistics)
    assert torch.allclose(model.predict(theta, X[:1]), logits[:1], atol=1e-10)
    from torch.func import grad, vmap

    def loss(blocks, x, y):
        return torch.nn.functional.cross_entropy(model.predict_blocks(blocks, x[None]), y[None])

    y = torch.tensor([1, 7, 42])
    pe = vmap(grad(loss), in_dims=(None, 0, 0))(model.split(theta), X, y)
    for b in range(3):
        t = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(model.predict(t, X[b:b + 1]), y[b:b + 1]), t)
        assert torch.allclose(torch.cat([p[b].reshape(-1) for p in pe]), g, atol=1e-10)


@pytest.mark.parametrize("algorithm,mechanism,params", [
    ("dsgt", "decor", {"epsilon": 5.0, "clip": 0.5}),
    ("dsgt", "whisper", {"epsilon": 5.0, "clip": 0.5}),
    ("dinno", "gaussian_ldp", {"epsilon": 5.0, "clip": 0.5}),
])
def test_tracking_and_admm_compose_with_agent_level_mechanisms(algorithm, mechanism, params):
    """Composition, not copies: the agent-level mechanisms of seeds 000/001 plug into DSGT and DiNNO; the accounting
    covers all their accesses and no two accesses of a round reuse a keyed noise draw."""
    from privdl.experiment.build import build

    cfg = {"network": {"topology": "ring", "n": 5}, "task": {"name": "softmax", "dataset": "digits", "batch_size": 16},
           "algorithm": {"name": algorithm, **({"primal_steps": 2} if algorithm == "dinno" else {})},
           "mechanism": {"name": mechanism, **params}, "schedule": {"name": "constant", "eta": 0.05},
           "iterations": 12, "dtype": "float64"}
    c = build(cfg)
    calls = c.algorithm.gradient_calls(12)
    assert c.mechanism.steps.tolist() == [calls] * 5 and c.mechanism.ledger().steps == calls
    keys = []
    original = c.mechanism.privatize

    def spy(g, access):
        keys.append(access.call)
        return original(g, access)

    c.mechanism.privatize = spy
    res = simulate(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism,
                   schedule=c.schedule, iterations=12, seed=3)
    assert c.mechanism.calls.tolist() == [calls] * 5 and np.isfinite(res.final.numpy()).all()
    # every access gets its own noise key (DSGT makes two accesses in round 1, DiNNO two per round)
    assert keys == list(range(1, calls + 1))
    if mechanism != "gaussian_ldp":
        assert not torch.allclose(c.mechanism.noise.network(1, 7), c.mechanism.noise.network(2, 7))


@pytest.mark.parametrize("name,params", [("cnn", {"dataset": "digits", "kernel": 3, "filters": 2, "width": 8}),
                                         ("softmax", {"dataset": "digits"}),
                                         ("logistic", {"dataset": "breast_cancer"}),
                                         ("mlp", {"dataset": "digits", "hidden": 16})])
@pytest.mark.parametrize("clip", [0.3, None])
def test_ghost_clipping_equals_per_example_gradients(name, params, clip):
    assert_ghost_matches_per_example(make_task(name, 4, dtype=torch.float64, **params), seed=7, rate=0.1,
                                     spread=0.3, clip=clip)


def test_ghost_clipping_is_chosen_only_where_it_applies():
    digits = make_task("softmax", 3, dataset="digits")
    mech = make_mechanism("dp_sgd", steps=5, task=digits, lot_size=16, noise_multiplier=1.0)
    assert _oracle(digits, mech).per_example == "closed_form"  # a linear model without L2: no per-example grads
    mech = make_mechanism("dp_sgd", steps=5, task=make_task("mlp", 3, dataset="digits", hidden=8), lot_size=16,
                          noise_multiplier=1.0)
    assert _oracle(mech.task, mech).per_example == "ghost"
    with_l2 = make_task("softmax", 3, dataset="digits", l2=0.1)
    mech = make_mechanism("dp_sgd", steps=5, task=with_l2, lot_size=16, noise_multiplier=1.0)
    assert _oracle(with_l2, mech).per_example == "vmap"
    with pytest.raises(ValidationError, match="ghost clipping does not support"):
        _oracle(with_l2, make_mechanism("dp_sgd", steps=5, task=with_l2, lot_size=16, noise_multiplier=1.0,
                                        per_example="ghost"))
    # a model with a layer that has no rule (GroupNorm) takes the generic path
    from privdl.gradients import supports_ghost

    assert not supports_ghost(make_task("resnet9", 2, dataset="digits", width=4, groups=2, batch_size=4))


def test_fixed_sample_rate_is_checked_and_q_one_is_the_full_batch():
    task = make_task("softmax", 3, dataset="digits")
    for bad in (0.0, 1.5):
        with pytest.raises(ValidationError, match="sample_rate must be in"):
            make_mechanism("dp_sgd", steps=5, task=task, lot_size=16, sample_rate=bad, epsilon=1.0)
    (X, y), mask = draw_lot(task, torch.ones(3, dtype=torch.float64))
    assert torch.equal(mask.sum(1).long(), task.counts)


@pytest.mark.slow
def test_audit_command_prints_json(tmp_path):
    import json

    from typer.testing import CliRunner

    from privdl.cli import app

    r = CliRunner().invoke(app, ["audit", "--algorithm", "dsgt", "--model", "softmax", "--dataset", "digits",
                                 "--per-class", "20", "--models", "20", "--iterations", "5", "--one-run", "40",
                                 "--format", "json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)  # the result; the progress goes to stderr
    res = report["results"]["dsgt"]
    assert report["unit"] == "example" and report["nominal_epsilon"] == 1.0
    assert "epsilon_lower" in res["threshold_audit"] and "epsilon_lower" in res["one_run_audit"]
    assert (tmp_path / "audit.json").is_file() and (tmp_path / "scores_dsgt.npz").is_file()
    # seed 004's Fig. 3 (the score distributions); its Table 5 only beside an audit in its setting (CNN, blank
    # canary, nominal (1, 1e-2), C = 10, 100 rounds): not beside this softmax one
    assert (tmp_path / "scores.png").stat().st_size > 10_000
    assert "seed004_table5_epsilon_lower" not in res
    r = CliRunner().invoke(app, ["audit", "--algorithm", "central", "--algorithm", "dsgd", "--model", "cnn",
                                 "--dataset", "digits", "--per-class", "4", "--models", "4", "--iterations", "100",
                                 "--out", str(tmp_path / "paper")])
    assert r.exit_code == 0, r.output
    assert "seed 004 Table 5" in r.output and "0.230" in r.output and "0.173" in r.output
    report = json.loads((tmp_path / "paper" / "audit.json").read_text())
    assert [v["seed004_table5_epsilon_lower"] for v in report["results"].values()] == [0.230, 0.173]


def _dp_dsgt_run(device):
    task = _cnn(n=4)
    net = Network.from_topology("ring", 4)
    mech = make_mechanism("dp_sgd", steps=6, task=task, clip=1.0, lot_size=16, noise_multiplier=1.0, network=net)
    return simulate(task=task, network=net, algorithm=make_algorithm("dsgt"), mechanism=mech,
                    schedule=make_schedule("constant", eta=0.05, iterations=5), iterations=5, seed=3, device=device,
                    eval_every=5)


@pytest.mark.exact
def test_device_option_keeps_the_draws_and_the_result():
    """device='cpu' (or 'auto' without CUDA) is the default path bit for bit (the same computation in the same
    process: same kernels, same shapes); on CUDA the lots and noise are the
    same CPU draws, so a run differs only by floating-point rounding (checked on the GPU machine, see
    BENCHMARKS.md)."""
    base = _dp_dsgt_run(None)
    same = _dp_dsgt_run("cpu")
    assert torch.equal(base.final, same.final) and base.records == same.records
    if not torch.cuda.is_available():
        assert torch.equal(_dp_dsgt_run("auto").final, base.final)
        with pytest.raises(ValidationError, match="no CUDA"):
            _dp_dsgt_run("cuda")
    else:
        cuda = _dp_dsgt_run("cuda")
        assert cuda.final.device.type == "cpu"
        torch.testing.assert_close(cuda.final, base.final, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValidationError, match="CPU only"):
        make_task("quadratic", 4).to("cuda")


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_cross_gradients_evaluate_the_owners_data_at_the_requesters_model(method):
    """Per-edge models (E, d): agent j's data at neighbour i's model (DPDL's access). Each edge is one noisy access
    to j's data, keyed by (access, owner j, requester i): j's accesses count deg_j, and the lot and noise of edge
    (i → j) are the ones j alone would draw for i."""
    from privdl.comm import SparseComm
    from privdl.mechanisms import Access

    task = make_task("softmax", 4, dataset="digits", partition="dirichlet", alpha=0.5, seed=2)
    net = Network.from_topology("star", 4)  # degrees 3, 1, 1, 1
    comm = SparseComm(net)
    deg = comm.edges.degree
    mech = make_mechanism("dp_sgd", steps=deg * 2, task=task, clip=1.0, lot_size=16, noise_multiplier=1.0,
                          per_example=method)
    oracle = _oracle(task, mech, seed=4)
    x = 0.1 * torch.randn(4, task.dim, generator=torch.Generator().manual_seed(0), dtype=task.dtype)
    models = comm.pull(x, tag="model")  # edge src → dst: the src's model, at the dst (the data owner)
    g = oracle(models, owners=comm.edges.dst, requesters=comm.edges.src)
    assert g.shape == (len(comm.edges), task.dim) and bool(torch.isfinite(g).all())
    assert mech.calls.tolist() == deg.tolist()  # one access per incoming edge, to the owner's data
    # edge e alone, evaluated by its owner for its requester, draws exactly the same lot and noise
    e = 2
    alone = make_mechanism("dp_sgd", steps=deg * 2, task=task, clip=1.0, lot_size=16, noise_multiplier=1.0,
                           per_example=method)
    single = _oracle(task, alone, seed=4)
    got = single(models[e:e + 1], owners=comm.edges.dst[e:e + 1], requesters=comm.edges.src[e:e + 1])
    assert torch.allclose(got[0], g[e], atol=1e-12)
    oracle(models, owners=comm.edges.dst, requesters=comm.edges.src)
    with pytest.raises(AccessBudgetExceeded, match="agent 0"):  # the hub (degree 3) runs out first
        oracle(models, owners=comm.edges.dst, requesters=comm.edges.src)
    assert mech.ledger().per_agent()[0]["accesses"] == 6
