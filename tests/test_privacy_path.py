"""The privacy path as it runs (issue 29): the engine's data access (``privdl.simulator.access``) joins the lot
drawing, the clipping and the mechanism — tested here end to end, through ``simulate`` and the runner, against facts
that do not come from the code under test:

* the lots a run actually draws, per agent, follow Binomial(m_i, q_i) with the q_i its manifest's ledger states
  (and q_i = L/m_i from the config and the data);
* one example with a gradient a million times too large moves what an agent releases by at most its sensitivity —
  C/L for example-level DP-SGD in every consumer (DP-DSGD, DP-DSGT, DP-DiNNO, DPDL's cross- and self-gradients),
  2C for agent-level clipping (LDP, DECOR, Whisper), 2C/B for per-example clipping of correlated noise — and by
  exactly that much when it is drawn.

The noise is removed by running twice with the same keys (the same noise draws) on neighbouring data, and the step
size is 0 so that every access of both runs is at the same model: the difference of two releases is then the
difference of the clipped sums alone. These are the tests that kill the mutants "per-example clipping skipped in the
DP-SGD path" and "lots drawn at 2q while the ledger says q" (benchmarks/mutation.py, docs/MUTATION.md).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from privdl.algorithms import make_algorithm
from privdl.data import load_dataset
from privdl.data.datasets import Dataset
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.simulator import simulate
from privdl.tasks.base import Task
from privdl.tasks.models import linear
from privdl.tasks.supervised import SupervisedTask
from tests.conftest import binomial_fit_p_value
from tests.test_ledger import CONFIG as LEDGER_RUNS

# ---- (a) the lots a run draws follow Binomial(m_i, q_i), q_i from its ledger ------------------------------------
#: total false-alarm probability of the lot-size test below: over the root seeds of the runs, a correct engine fails
#: it with probability at most this (Bonferroni over every agent, run and test; the draws are keyed, so for the
#: fixed seeds here the outcome is deterministic — it passes, or it fails every time)
FALSE_ALARM = 1e-4

#: the runs of tests/test_ledger.py (softmax on digits, 4 agents of different data sizes on a ring) without their
#: sweep; each case below sets its algorithm and mechanism
BASE = LEDGER_RUNS.split("[[sweep.privacy]]")[0]
DP_SGD = ['mechanism.name="dp_sgd"', "mechanism.noise_multiplier=1.0", "mechanism.clip=1.0", "mechanism.lot_size=20"]
#: (label, overrides, rounds, expected lot size L): DP-SGD through every row's own access (DP-DSGD), through
#: cross-gradients and un-noised self-gradients (DPDL: owners ≠ rows), and correlated noise with per-example clipping
#: over Poisson lots, two seeds stacked on the replica axis (simulate_replicas)
LOT_CASES = [
    ("dp_dsgd", ['algorithm.name="dsgd"', 'algorithm.form="cta"', *DP_SGD], 150, 20),
    ("dpdl", ['algorithm.name="dpdl"', *DP_SGD], 50, 20),
    ("ldp_poisson_stacked", ['algorithm.name="dsgd"', 'mechanism.name="ldp"', "mechanism.precision_bound=1.0",
                             "mechanism.clip=1.0", 'mechanism.clipping="per_example"', 'mechanism.sampling="poisson"',
                             "seeds=[0, 1]"], 80, 16),
]


@pytest.fixture(scope="module")
def drawn_lots(tmp_path_factory):
    """Every lot the engine draws in each case's runs (through the runner), observed where the task draws it: the
    (owner, lot size) pairs, with the runs' manifests."""
    from privdl.experiment import load_config, run_experiment

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = Task.sample_lot

    def observed(self, draws, agents, rates, *, block=1):
        batch, mask = original(self, draws, agents, rates, block=block)
        seen.append((agents.clone(), mask.sum(1).round().to(torch.int64)))  # rates: the code under test, unread
        return batch, mask

    out = {}
    root = tmp_path_factory.mktemp("lots")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Task, "sample_lot", observed)
        for label, overrides, rounds, lot in LOT_CASES:
            seen.clear()
            path = root / f"{label}.toml"
            path.write_text(BASE.replace("seed = 3\n", "") if "seeds=[0, 1]" in overrides else BASE)
            run_experiment(load_config(path, [f"iterations={rounds}", *overrides]), root / label, progress=False)
            manifests = [json.loads(p.read_text()) for p in sorted((root / label / "runs").glob("*/manifest.json"))]
            out[label] = (list(seen), manifests, lot)
    return out


@pytest.mark.parametrize("label", [c[0] for c in LOT_CASES])
def test_drawn_lot_sizes_follow_binomial_with_the_ledgers_rate(drawn_lots, label):
    """Per agent i, the K lot sizes s_1..s_K drawn from its data are independent Binomial(m_i, q_i) (a fresh key per
    access): their total is Binomial(K·m_i, q_i) — exact two-sided binomial test — and their histogram follows the
    Binomial(m_i, q_i) pmf — chi-square goodness of fit over bins of expected count ≥ 5. q_i is the one the run's
    manifest states (every run of the case states the same), itself L/m_i with L from the config. Each test runs
    at FALSE_ALARM / (number of tests)."""
    seen, manifests, lot = drawn_lots[label]
    if label.endswith("stacked"):  # the runner stepped both seeds as replicas of one batch (simulate_replicas)
        assert [man["batch"]["replicas"] for man in manifests] == [2, 2]
    counts = manifests[0]["task"]["samples_per_agent"]  # the data each agent held
    assert len(set(counts)) == 4  # four different data sizes: four different rates
    rates = []
    for i, m in enumerate(counts):
        stated = {man["privacy_ledger"][0]["per_agent"][i]["sample_rate"] for man in manifests}
        assert len(stated) == 1
        q = stated.pop()
        assert q == pytest.approx(lot / m, rel=1e-12)  # the rate the config and the data give
        rates.append(q)
    owners = torch.cat([a for a, _ in seen])
    sizes = torch.cat([s for _, s in seen])
    tests = 2 * len(counts) * len(LOT_CASES)
    for i, (m, q) in enumerate(zip(counts, rates)):
        s = sizes[owners == i].numpy()
        assert len(s) >= 150, len(s)
        total = binomial_p_value(int(s.sum()), len(s) * m, q)
        fit = binomial_fit_p_value(s, m, q)
        assert total > FALSE_ALARM / tests and fit > FALSE_ALARM / tests, (label, i, s.mean(), m * q, total, fit)


def binomial_p_value(k: int, n: int, q: float) -> float:
    return float(stats.binomtest(k, n, q).pvalue)


def test_the_lot_size_tests_reject_lots_drawn_at_twice_the_rate():
    """The two tests above, fed Binomial(m, 2q) sizes (what a run drawing at 2q would give) or lots of fixed size
    L, reject far below their threshold: the test has power against the errors it is for."""
    rng = np.random.default_rng(0)
    m, q, k = 200, 0.1, 150
    assert binomial_p_value(int(rng.binomial(m, 2 * q, k).sum()), k * m, q) < 1e-12
    assert binomial_fit_p_value(np.full(k, int(m * q)), m, q) < 1e-12
    assert binomial_fit_p_value(rng.binomial(m, q, k), m, q) > 1e-3


# ---- (b) a huge gradient moves a release by at most its sensitivity -------------------------------------------
N, PER_AGENT, OWNER, C = 4, 40, 1, 1.0
#: the canary: the owner's first image scaled by this (its gradient is ~10⁶ times any other example's)
HUGE = 1e6


def canary_task(scale: float | None, batch_size: int = 4) -> SupervisedTask:
    """N agents with PER_AGENT digits each; agent OWNER also holds the canary as its last example (its own first image
    × ``scale``, same label) — or not (``scale`` None). Softmax regression from the zero model, where every example's
    residual softmax(0) − onehot(y) is the same non-zero vector, so the canary's gradient is ``scale`` times an
    ordinary one (its clipped value is exactly C in the canary's direction)."""
    ds = load_dataset("digits")
    X, y = ds.X_train[: N * PER_AGENT], ds.y_train[: N * PER_AGENT]
    parts = [np.arange(i * PER_AGENT, (i + 1) * PER_AGENT) for i in range(N)]
    if scale is not None:
        X = np.concatenate([X, X[OWNER * PER_AGENT: OWNER * PER_AGENT + 1] * np.float32(scale)])
        y = np.concatenate([y, y[OWNER * PER_AGENT: OWNER * PER_AGENT + 1]])
        parts[OWNER] = np.append(parts[OWNER], N * PER_AGENT)
    data = Dataset("digits-canary", X, y, ds.X_test[:10], ds.y_test[:10], ds.n_classes)
    return SupervisedTask("softmax", data, linear(X.shape[1], ds.n_classes), N, partition_name="explicit",
                          partition_params={"parts": parts}, batch_size=batch_size, l2=0.0, zero_init=True,
                          rng=np.random.default_rng(0), dtype=torch.float64, eval_train_samples=1)


def releases(task: Task, algorithm: str, params: dict, mechanism: str, mech_params: dict, rounds: int, *,
             eta: float = 0.0, models: list | None = None) -> list:
    """Every value the mechanism releases to the algorithm in a run (by default step size 0: every access at the zero
    model): (kind, access index, owners, value), kind "noisy" (privatize) or "unprotected" (DPDL's published
    self-gradient), then "-self" (every row its own data) or "-cross" (DPDL's cross-gradients). ``models`` receives
    the agents' models after every round."""
    alg = make_algorithm(algorithm, **params)
    net = Network.from_topology("ring", N)
    extra = {"task": task} if mechanism == "dp_sgd" or mech_params.get("clipping") == "per_example" else {}
    if mechanism != "dp_sgd":
        extra["network"] = net
    mech = make_mechanism(mechanism, steps=alg.accesses(rounds, net.edges), **extra, **mech_params)
    seen = []
    for kind, name in (("noisy", "privatize"), ("unprotected", "unprotected")):
        inner = getattr(mech, name)

        def watched(value, access, inner=inner, kind=kind):
            out = inner(value, access)
            seen.append((f"{kind}-{'self' if access.is_self else 'cross'}", access.call, access.owners.clone(),
                         out.reshape(out.shape[0], -1).clone()))
            return out

        setattr(mech, name, watched)
    simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=lambda t: eta, iterations=rounds,
             seed=11, metrics=False, eval_every=1,
             on_record=None if models is None else lambda t, x: models.append(x.clone()))
    return seen


def moves(a: list, b: list) -> dict[str, list[float]]:
    """How far the canary's owner's releases move between two runs (per kind: one norm per row it owns), after
    checking that both runs made the same accesses and that nobody else's release moved."""
    assert [(k, c, o.tolist()) for k, c, o, _ in a] == [(k, c, o.tolist()) for k, c, o, _ in b]
    out: dict[str, list[float]] = {}
    for (kind, _, owners, va), (_, _, _, vb) in zip(a, b):
        diff = va - vb
        mine = owners == OWNER
        # other owners: the same data, lots, batches and noise; only the padded width of a lot may differ, which may
        # round their sums differently (last bits of values of order 1)
        assert not bool((diff[~mine].abs() > 1e-12).any()), kind
        out.setdefault(kind, []).extend(torch.linalg.vector_norm(diff[mine], dim=1).tolist())
    return out


def assert_moved_by(norms: list[float], bound: float) -> None:
    """Every move is 0 (the canary not drawn) or exactly ``bound`` (drawn: its clipped value, the sensitivity), to
    1e-9 relative (rounding of sums of order-1 values), and both happen."""
    drawn = [d for d in norms if d > 1e-9 * bound]
    assert all(abs(d - bound) <= 1e-9 * bound for d in drawn), (max(norms), bound)
    assert 0 < len(drawn) < len(norms), (len(drawn), len(norms))


#: (algorithm, its parameters, rounds): every consumer of DP-SGD's releases
CONSUMERS = [
    ("dsgd", {"form": "cta"}, 12),
    ("dsgt", {}, 12),
    ("dinno", {"primal_steps": 2, "optimizer": "sgd"}, 6),
    ("dpdl", {}, 6),  # cross-gradients (noisy) and the published un-noised self-gradient
    ("dpdl", {"self_noise": True}, 6),  # both noisy
]
Q, LOT = 0.25, 10


@pytest.mark.parametrize("algorithm,params,rounds", CONSUMERS,
                         ids=["dp-dsgd", "dp-dsgt", "dp-dinno", "dpdl-published", "dpdl-self-noise"])
def test_a_huge_example_moves_every_dp_sgd_release_by_at_most_C_over_L(algorithm, params, rounds):
    """Add/remove one example with a fixed public rate q (the lots of the other examples do not change): agent
    OWNER's release G̃ = (Σ_lot clip_C(∇l) + σCξ)/L moves by clip_C(∇l(canary))/L — norm exactly C/L when the
    canary is in the lot, 0 otherwise — whatever the consumer, cross-gradients and un-noised self-gradients
    included."""
    mech = {"clip": C, "lot_size": LOT, "sample_rate": Q, "noise_multiplier": 1.0}
    a = releases(canary_task(HUGE), algorithm, params, "dp_sgd", mech, rounds)
    b = releases(canary_task(None), algorithm, params, "dp_sgd", mech, rounds)
    moved = moves(a, b)
    kinds = {"noisy-self"} if algorithm != "dpdl" else {"noisy-cross", "noisy-self" if params else "unprotected-self"}
    assert set(moved) == kinds
    for norms in moved.values():  # each kind of release: the canary drawn in some, not in others
        assert_moved_by(norms, C / LOT)


@pytest.mark.parametrize("method", ["closed_form", "ghost", "vmap"])
def test_every_per_example_path_clips_the_huge_example(method):
    """The same through each per-example gradient path the engine may pick (closed form for linear models, ghost
    clipping, torch.func): a kernel that skipped the clip would move the release by ~10⁶·C/L."""
    mech = {"clip": C, "lot_size": LOT, "sample_rate": Q, "noise_multiplier": 1.0, "per_example": method}
    a = releases(canary_task(HUGE), "dsgd", {"form": "cta"}, "dp_sgd", mech, 12)
    b = releases(canary_task(None), "dsgd", {"form": "cta"}, "dp_sgd", mech, 12)
    assert_moved_by(moves(a, b)["noisy-self"], C / LOT)


#: (mechanism, its parameters, algorithm, the sensitivity the release moves by): agent-level clipping of the
#: mini-batch gradient (replace one agent's data: 2C) and per-example clipping of correlated noise (replace one example
#: of a uniform batch of B: 2C on the sum, /B)
AGENT_LEVEL = [
    ("ldp", {}, "dsgd", 2 * C),
    ("decor", {}, "dsgt", 2 * C),
    ("whisper", {}, "dsgd", 2 * C),
    ("ldp", {"clipping": "per_example"}, "dsgd", 2 * C / 4),
]


@pytest.mark.parametrize("mechanism,params,algorithm,bound", AGENT_LEVEL,
                         ids=["ldp", "decor-dsgt", "whisper", "ldp-per-example"])
def test_a_huge_gradient_moves_an_agent_level_release_by_at_most_its_sensitivity(mechanism, params, algorithm,
                                                                                    bound):
    """Replace the canary x·10⁶ by −x·10⁶ (same data sizes, so the same batches): whenever the canary is in agent
    OWNER's batch the batch gradient is ±(huge) along the canary's gradient plus O(1), so its clipped value is ±C
    along it and the release moves by 2C (1 − O(10⁻¹²)) — the replace-one sensitivity, attained; 0 otherwise. With
    per-example clipping the canary alone is clipped to ±C and the sum is divided by B = 4: 2C/B."""
    mech = {"clip": C, "precision_bound": 1.0, **params}
    a = releases(canary_task(HUGE), algorithm, {}, mechanism, mech, 40)
    b = releases(canary_task(-HUGE), algorithm, {}, mechanism, mech, 40)
    assert_moved_by(moves(a, b)["noisy-self"], bound)


@pytest.mark.parametrize("mechanism,params,form", [
    ("dp_sgd", {"lot_size": LOT, "sample_rate": 1.0, "noise_multiplier": 1.0}, "cta"),
    ("ldp", {"precision_bound": 1.0}, "atc"),
])
def test_one_update_with_the_huge_gradient_moves_by_eta_times_its_sensitivity(mechanism, params, form):
    """The update itself, with a step size η > 0, over one round from the common zero model, where the canary is
    drawn (DP-SGD: q = 1, the lot is the whole data; agent level: a batch of 400 draws with replacement from 41
    examples misses the canary with probability (40/41)^400 ≈ 5e-5 — keyed, so for this seed it is drawn or this test
    fails every time). Combine-then-adapt (DP-DSGD) θ ← Wθ − ηG̃: agent OWNER's model alone moves, by ηC/L.
    Adapt-then-combine (LDP D-SGD) x ← W(x − η(ĝ + v)): every agent i moves by η·w_{i,OWNER}·2C, in all
    ‖Δx‖ = η·2C·‖W e_OWNER‖."""
    eta = 0.5
    ends = []
    for scale in (HUGE, None if mechanism == "dp_sgd" else -HUGE):
        models: list[torch.Tensor] = []
        releases(canary_task(scale, batch_size=400), "dsgd", {"form": form}, mechanism, {"clip": C, **params}, 1,
                 eta=eta, models=models)
        ends.append(models[-1])
    diff = ends[0] - ends[1]
    w = Network.from_topology("ring", N).dense()
    bound = eta * C / LOT if mechanism == "dp_sgd" else eta * 2 * C * float(np.linalg.norm(w[:, OWNER]))
    assert float(torch.linalg.vector_norm(diff)) == pytest.approx(bound, rel=1e-9)
    if form == "cta":  # the others' models do not move
        assert not bool((diff[torch.arange(N) != OWNER].abs() > 1e-12).any())
