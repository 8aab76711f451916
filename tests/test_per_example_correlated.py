"""Per-example clipping for the correlated-noise mechanisms (issue 12): what the seed-001 authors' code runs, with
the privacy unit it really has (one example) and the agent-level ε of the same noise beside it."""

import math

import numpy as np
import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.errors import ValidationError
from privdl.keys import Draws, Keys
from privdl.mechanisms import make_mechanism
from privdl.mechanisms.base import Access, MechanismEnv
from privdl.network import Network
from privdl.privacy.ledger import Ledger
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task

N = 8


@pytest.fixture(scope="module")
def net():
    return Network.from_topology("erdos_renyi", N, p=0.6, seed=3)


def _task(batch: int):
    return make_task("softmax", N, dataset="digits", partition="dirichlet", batch_size=batch)


def _paper_epsilon(rho: float, delta: float) -> float:
    """zCDP → (ε, δ): ε = ρ + 2√(ρ log 1/δ) (seed 001, Theorem 2), written out here independently."""
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def _precisions(mech) -> np.ndarray:
    """[R⁻¹]_ii of the covariance the generator actually draws from (numpy's inverse, not the mechanism's)."""
    return np.diag(np.linalg.inv(mech.noise.covariance()))


def test_noise_on_the_averaged_update_has_covariance_R_over_B_squared(net):
    """Per-example mode adds v ~ N(0, R) to the clipped *sum* and divides by B: the update's noise is R/B²."""
    B = 16
    mech = make_mechanism("whisper", steps=400, network=net, task=_task(B), clip=0.1, epsilon=10.0,
                          clipping="per_example")
    mech.bind(MechanismEnv(Keys(7, N)))
    d, calls = 1000, 60
    zero = torch.zeros(N, d, dtype=torch.float64)
    rows = torch.arange(N)
    samples = torch.cat([mech.privatize(zero, Access(rows, rows, call=c, everyone=True)) for c in range(1, calls + 1)],
                        dim=1)  # (n, calls·d): every column one draw of the network's noise
    emp = (samples @ samples.T / samples.shape[1]).numpy()
    expected = mech.noise.covariance() / B**2
    scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))
    # entries of an empirical covariance of 60 000 draws: std ≈ √(2/60000)·scale ≈ 0.006·scale
    assert np.max(np.abs(emp - expected) / scale) < 0.04
    # and it is not the batch-clipping noise R (B² = 256 times larger)
    assert np.trace(emp) < 1.1 * np.trace(mech.noise.covariance()) / B**2


def test_per_example_ldp_noise_matches_an_independent_calibration(net):
    """LDP, paper accountant: b = (√(L+ε) − √L)²/(2TC²) written out here (seed 001, Theorem 2 inverted), so the
    update's noise has variance 1/(b·B²) per coordinate — measured on the noise actually added."""
    B, T, C, eps, delta = 16, 400, 0.1, 10.0, 1e-5
    mech = make_mechanism("ldp", steps=T, network=net, task=_task(B), clip=C, epsilon=eps, delta=delta,
                          accountant="paper", clipping="per_example")
    L = math.log(1 / delta)
    b = (math.sqrt(L + eps) - math.sqrt(L)) ** 2 / (2 * T * C**2)
    mech.bind(MechanismEnv(Keys(11, N)))
    rows = torch.arange(N)
    noise = torch.cat([mech.privatize(torch.zeros(N, 2000, dtype=torch.float64), Access(rows, rows, call=c,
                                                                                          everyone=True))
                       for c in range(1, 11)], dim=1)  # 160 000 draws
    assert float(noise.var()) == pytest.approx(1 / (b * B**2), rel=0.02)


@pytest.mark.exact
def test_with_one_example_per_batch_both_clipping_modes_agree(net):
    """B = 1: clipping the mini-batch gradient is clipping the example, the sum is the mean; the per-example batch
    draws the same example from the same key, and the noise is the same keyed draw. Same models on both per-example
    paths, to rounding: the closed-form gradient, ghost clipping and torch.func compute the example's gradient and
    its norm with other kernels (other summation orders), so the bound is conftest.rounding_tolerance with 2d + 2·64
    operations per entry and round (the norm over d entries, the logits over 64 features) on the run's largest
    privatised gradient; a clip skipped or scaled moves the models by η·C, far above it."""
    from tests.conftest import rounding_tolerance, watch_privatised

    task = _task(1)
    T = 30
    finals, scale = {}, 0.0
    for clipping, path in (("batch", "auto"), ("per_example", "ghost"), ("per_example", "vmap")):
        mech = make_mechanism("whisper", steps=T, network=net, task=task, clip=0.1, epsilon=5.0,
                              clipping=clipping, per_example=path)
        seen = watch_privatised(mech)
        res = simulate(task=task, algorithm=make_algorithm("dsgd"), mechanism=mech,
                       schedule=make_schedule("constant", iterations=T, eta=0.3), iterations=T, network=net,
                       seed=4, metrics=False)
        finals[(clipping, path)] = res.final
        scale = max(scale, max(seen), float(res.final.abs().max()))
    first = finals[("batch", "auto")]
    assert not torch.equal(first, task.init_params(torch.Generator().manual_seed(0)).expand_as(first))
    tol = rounding_tolerance(rounds=T, ops=2 * task.dim + 2 * 64, scale=scale)
    assert tol < 1e-6
    for key, x in finals.items():
        assert float((x - first).abs().max()) <= tol, key


@pytest.mark.exact
def test_uniform_batches_are_distinct_uniform_and_start_with_the_minibatch_draw():
    task = _task(12)
    counts = task.counts
    hits = torch.zeros(N, int(counts.max()), dtype=torch.float64)
    keys = Keys(3, N)
    rows = torch.arange(N)
    for call in range(1, 301):
        draws = Draws(keys, "batch", call, rows.numpy(), rows.numpy())
        (X, y), mask = task.sample_subset(draws, rows, 12)
        # recover positions: gather is deterministic, so compare against the agent's data
        for i in range(N):
            m = int(counts[i])
            data = task.X[i, :m].reshape(m, -1)
            pos = [int(torch.nonzero((data == X[i, b].reshape(1, -1)).all(1))[0]) for b in range(12)]
            assert len(set(pos)) == 12  # distinct examples (digits has no duplicate images within an agent)
            hits[i, pos] += 1
        if call == 1:
            first, _ = task.sample(draws, rows)[0], None
            assert torch.equal(first[:, 0], X[:, 0])
    # each example is in a batch with probability 12/m: compare the mean inclusion frequency per agent
    for i in range(N):
        m = int(counts[i])
        assert float(hits[i].sum()) == 12 * 300  # exactly 12 per batch, all within the agent's data
        freq = hits[i, :m] / 300
        assert float(freq.std()) < 4 * math.sqrt((12 / m) * (1 - 12 / m) / 300)  # no example favoured


def test_ledger_states_example_level_and_agent_level_epsilons_that_reaccount(net):
    """The example-level ε is the target; the agent-level ε of the same noise follows from sensitivity
    2·C·min(B, m_i) and each agent's precision; both re-account from the stored events."""
    B, T, C, eps, delta = 16, 40, 0.1, 10.0, 1e-5
    task = _task(B)
    mech = make_mechanism("decor", steps=T, network=net, task=task, clip=C, epsilon=eps, delta=delta,
                          accountant="paper", clipping="per_example")
    ledger = Ledger.from_dict(mech.ledger().to_dict())
    again = ledger.reaccount()
    assert ledger.unit == "example" and again.epsilon == pytest.approx(ledger.epsilon, rel=1e-12)
    assert again.epsilon <= eps and again.epsilon == pytest.approx(eps, rel=1e-6)
    p = _precisions(mech)
    sizes = np.minimum(task.counts.numpy(), B)
    # example level: replace-one sensitivity 2C on the clipped sum, ρ = T(2C)²p/2
    example = [_paper_epsilon(T * (2 * C) ** 2 * pi / 2, delta) for pi in p]
    assert again.epsilons == pytest.approx(example, rel=1e-7)
    (agent,) = again.beside
    assert agent.unit == "agent" and agent.accountant == "paper"
    expected = [_paper_epsilon(T * (2 * C * s) ** 2 * pi / 2, delta) for pi, s in zip(p, sizes)]
    assert agent.epsilons == pytest.approx(expected, rel=1e-7)
    assert "agent level" in ledger.guarantee


def test_agent_level_epsilon_at_the_authors_settings():
    """The issue's number: the authors' nominal ε = 10 (T = 1000, C = 0.1, B = 128, δ = 1e-5, paper accountant)
    is ε ≈ 2.65·10⁴ for an agent's whole data."""
    n = 20
    net = Network.from_topology("erdos_renyi", n, p=0.5, seed=0)

    class Data:  # a task with enough examples per agent that every batch has B = 128
        counts = torch.full((n,), 400)
        batch_size = 128
        examples = True
        name = "stand-in"

    mech = make_mechanism("ldp", steps=1000, network=net, task=Data(), clip=0.1, epsilon=10.0, accountant="paper",
                          clipping="per_example")
    led = mech.ledger()
    assert led.epsilon == pytest.approx(10.0, rel=1e-6)
    assert led.beside[0].epsilon == pytest.approx(2.648e4, rel=1e-3)


@pytest.mark.slow
def test_poisson_lots_use_the_subsampled_rdp_accountant_and_never_overshoot(net):
    import dp_accounting

    B, T, C, eps, delta = 16, 60, 0.1, 3.0, 1e-5
    task = _task(B)
    mech = make_mechanism("whisper", steps=T, network=net, task=task, clip=C, epsilon=eps, delta=delta,
                          clipping="per_example", sampling="poisson", example_accountant="rdp")
    led = mech.ledger()
    assert led.unit == "example" and led.accountant == "rdp"
    assert all(e <= eps for e in led.epsilons) and max(led.epsilons) == pytest.approx(eps, rel=0.02)
    # independently: dp_accounting's RDP accountant on each agent's effective multiplier 1/(C√[R⁻¹]_ii)
    p = _precisions(mech)
    q = (B / task.counts.double()).clamp(max=1).numpy()
    for i in (0, N - 1):
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.PoissonSampledDpEvent(
            float(q[i]), dp_accounting.GaussianDpEvent(1 / (C * math.sqrt(p[i])))), T)
        assert led.epsilons[i] == pytest.approx(acc.get_epsilon(delta), rel=1e-6)
    # amplification: the Poisson calibration allows far less noise than the uniform one at the same ε
    uniform = make_mechanism("whisper", steps=T, network=net, task=task, clip=C, epsilon=eps, delta=delta,
                             clipping="per_example", accountant="tight")
    assert mech.bound > 5 * uniform.bound


def test_per_example_runs_stack_and_match_their_single_runs(tmp_path):
    from privdl.experiment.runner import run_experiment

    cfg = {"name": "pe", "iterations": 15, "seeds": 1,
           "network": {"topology": "erdos_renyi", "n": N, "p": 0.6, "seed": 1},
           "task": {"name": "softmax", "dataset": "digits", "partition": "dirichlet", "batch_size": 8},
           "algorithm": {"name": "dsgd"}, "mechanism": {"clip": 0.1, "epsilon": 10.0, "clipping": "per_example"},
           "schedule": {"name": "constant", "eta": 0.5},
           "sweep": {"mechanism.name": ["ldp", "whisper", "none"]}}
    stacked = run_experiment(cfg, tmp_path / "stacked", progress=False)
    single = run_experiment({**cfg, "batch_replicas": 1}, tmp_path / "single", progress=False)
    import json

    def finals(root):
        out = {}
        for m in sorted((root / "runs").glob("*/manifest.json")):
            man = json.loads(m.read_text())
            out[man["sweep"]["mechanism.name"]] = (man["final_metrics"], man["batch"], man["privacy_ledger"][0])
        return out

    a, b = finals(stacked.directory if hasattr(stacked, "directory") else tmp_path / "stacked"), \
        finals(tmp_path / "single")
    assert a["ldp"][1]["replicas"] == 2  # the two per-example runs stacked; 'none' reads batches: apart
    for name in ("ldp", "whisper"):
        assert a[name][0]["test_loss"] == pytest.approx(b[name][0]["test_loss"], rel=1e-9)
        assert a[name][2]["unit"] == "example" and a[name][2]["beside"][0]["unit"] == "agent"
    assert a["none"][2]["unit"] == "none"


def test_bad_per_example_settings_are_refused(net):
    with pytest.raises(ValidationError, match="needs a task"):
        make_mechanism("ldp", steps=10, network=net, clip=0.1, epsilon=1.0, clipping="per_example")
    with pytest.raises(ValidationError, match="applies to clipping = 'per_example' only"):
        make_mechanism("ldp", steps=10, network=net, clip=0.1, epsilon=1.0, sampling="poisson")
    with pytest.raises(ValidationError, match="clipping must be one of"):
        make_mechanism("ldp", steps=10, network=net, clip=0.1, epsilon=1.0, clipping="sample")
    with pytest.raises(ValidationError, match="clip > 0"):
        make_mechanism("ldp", steps=10, network=net, task=_task(4), clip=0, precision_bound=1.0,
                       clipping="per_example")


@pytest.mark.parametrize("name,dataset", [("softmax", "digits"), ("logistic", "breast_cancer")])
@pytest.mark.parametrize("clip", [0.05, None])
def test_closed_form_clipped_sum_matches_ghost_and_torch_func(name, dataset, clip):
    """Linear models: the closed-form clipped sum (no per-example gradients) against the two generic paths, on a
    Poisson lot (ragged: masked padding) at perturbed models."""
    from privdl.gradients import clipped_example_sum, ghost_clipped_sum
    from tests.conftest import draw_lot

    task = make_task(name, N, dataset=dataset, partition="dirichlet", batch_size=8)
    assert task.has_closed_form_clipped_sum()
    gen = torch.Generator().manual_seed(5)
    x = task.init_params(gen).expand(N, -1).clone() + 0.3 * torch.randn(N, task.dim, generator=gen,
                                                                        dtype=task.dtype)
    batch, mask = draw_lot(task, torch.full((N,), 0.3), seed=2)
    closed = task.clipped_sum(x, batch, mask, clip)
    torch.testing.assert_close(closed, ghost_clipped_sum(task, x, batch, mask, clip), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(closed, clipped_example_sum(task, x, batch, mask, clip), rtol=1e-10, atol=1e-12)
    with_l2 = make_task(name, N, dataset=dataset, partition="dirichlet", batch_size=8, l2=1e-3)
    assert not with_l2.has_closed_form_clipped_sum() and with_l2.clipped_sum(x, batch, mask, clip) is None
