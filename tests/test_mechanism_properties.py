"""Mechanism properties that one-line mutants broke unnoticed (issue 43, finding 7), each tested as the property,
through the engine, against facts computed here (closed forms, dp_accounting), never against the mechanism's own
attributes:

1. **DP-SGD's noise belongs to the data owner.** Each owner j's σ_j is calibrated for its own rate q_j = L/m_j and
   its own number of accesses; a cross-gradient (DPDL: owner j's data at requester i's model) carries N(0, σ_j²C²)
   on its lot sum — owner j's σ, whoever asked. Measured on the wire (a run minus the same run with the noise off:
   the same keys, the same lots) for every (owner, requester) pair, single runs and replicas stacked on one axis.
2. **Zip-DL calibrates each sender on what it sends.** Agent a's ς_a is set so that its worst *outgoing* message
   a → v (the smallest Lemma 3.3 coefficient c_{a→v}) meets (ε, δ). Zip-DL accepts only a symmetric W (checked
   below: a doubly stochastic, non-symmetric W is refused), so W_{a,v} = W_{v,a} on every W it runs with; what
   differs between a's outgoing and incoming edges is the sender's neighbourhood: c_{a→v} depends on d_a and a's
   row, c_{v→a} on d_v and v's. On the irregular graph below the two minima differ by up to 5.3× (the pendant 3:
   4.25 out, 0.8 in); the tests check the per-edge noise on the wire and each agent's ledger ε against Lemma 3.3
   written out here. (Mutants that transpose W, or count Γ_a's size or Σ W² over incoming edges, are equivalent on
   every W Zip-DL accepts: W symmetric, the graph undirected.)
3. **Lots are Poisson at every rate.** At q ≥ 0.5, at q = 1 exactly, and with mixed per-agent rates, each lot of
   owner i has Binomial(m_i, q_i) size, every example joins at rate q_i (not a fixed prefix), the whole data only
   when q_i = 1 — with the q_i the ledger states, itself the config's (L/m_i or ``sample_rate``). Through the
   simulator (DP-DSGD and DPDL's cross-gradients), stacked replicas and the sliced backend.
4. **The access budget holds on every path of the count**: the simulator's, a slice's rows, and a held frame's
   repeated owners (counted from a cached headroom): the first access beyond the accounting is refused.

The statistical tests are exact binomial tests and a chi-square fit at a stated total false-alarm probability (for a
correct engine and the fixed seeds here, the outcome is deterministic: it passes, or it fails every time); the
std comparisons allow six standard errors of a sample std plus the difference between RDP order grids.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from scipy import stats

from privdl.algorithms import make_algorithm
from privdl.comm import Transcript
from privdl.data.datasets import Dataset
from privdl.errors import ValidationError
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.engine import Replica, simulate_replicas
from privdl.simulator.sliced import simulate_sliced
from privdl.tasks.base import Task
from privdl.tasks.models import linear
from privdl.tasks.supervised import SupervisedTask
from tests.conftest import binomial_fit_p_value

#: relative gap allowed between dp_accounting's RDP (its default orders) and privdl's (its own order grid) for the
#: same mechanism: both are upper bounds on the same RDP curve, minimised over different α grids
ORDER_GRID = 0.02


def numbered_task(counts: list[int], features: int, seed: int = 0) -> SupervisedTask:
    """Softmax regression (2 classes) over agents holding ``counts`` examples each, contiguous in a synthetic data
    set of distinct Gaussian rows whose first feature is the example's number (exact in float32): a batch tells
    which examples it holds."""
    rng = np.random.default_rng(seed)
    total = sum(counts)
    X = rng.standard_normal((total, features)).astype(np.float32)
    X[:, 0] = np.arange(total)
    y = rng.integers(0, 2, total)
    starts = np.cumsum([0, *counts])
    parts = [np.arange(starts[i], starts[i + 1]) for i in range(len(counts))]
    data = Dataset("numbered", X, y, X[:4], y[:4], 2)
    return SupervisedTask("softmax", data, linear(features, 2), len(counts), partition_name="explicit",
                          partition_params={"parts": parts}, batch_size=4, l2=0.0, zero_init=True,
                          rng=np.random.default_rng(0), dtype=torch.float64, eval_train_samples=1)


def rdp_noise_multiplier(*, epsilon: float, delta: float, steps: int) -> float:
    """The smallest z (to 1e-6 relative) whose ``steps`` Gaussian steps have RDP ε ≤ ``epsilon`` by dp_accounting's own
    accountant and default orders (bisection in log z)."""
    lo, hi = math.log(0.05), math.log(500.0)
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if rdp_gaussian_epsilon(math.exp(mid), steps=steps, delta=delta) <= epsilon else (mid, hi)
    return math.exp(hi)


def rdp_gaussian_epsilon(z: float, *, steps: int, delta: float) -> float:
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), steps)
    return acc.get_epsilon(delta)


def std_tolerance(samples: int) -> float:
    """Six standard errors of a sample std of ``samples`` normals (√(1/(2N)) relative), plus :data:`ORDER_GRID`."""
    return 6 / math.sqrt(2 * samples) + ORDER_GRID


# ---- 1. DP-SGD: the noise on owner j's gradient has owner j's σ, for every requester --------------------------------
#: data sizes alternating around the ring 0-1-2-3: with L = 12 the rates are 0.4 and 0.1, so the two ends of every
#: edge have different σ (calibrated per owner: 2.4× apart at ε = 3) — a σ looked up by requester lands far off
SIGMA_COUNTS, SIGMA_LOT, SIGMA_ROUNDS, SIGMA_CLIP, SIGMA_DELTA = [30, 120, 30, 120], 12, 8, 1.5, 1e-5


def cross_gradient_noise(epsilons: list[float]) -> tuple[list[tuple[int, int, int, torch.Tensor]], list, Network]:
    """DPDL with DP-SGD (calibrated to each ε of ``epsilons``: one run, or several replicas stacked on one axis) at
    step size 0 — every access at the same model — minus the same run with the noise off (the same keys: the same
    lots and the same clipped sums): per cross-gradient message its (replica, owner, requester, noise on the lot sum
    in units of C); and each replica's ledger."""
    task = numbered_task(SIGMA_COUNTS, features=199)
    net = Network.from_topology("ring", len(SIGMA_COUNTS))
    alg = make_algorithm("dpdl")
    steps = alg.accesses(SIGMA_ROUNDS, net.edges)
    n = net.n
    wire, ledgers = {}, []
    for noisy in (True, False):
        mechs = [make_mechanism("dp_sgd", steps=steps, task=task, clip=SIGMA_CLIP, lot_size=SIGMA_LOT,
                                delta=SIGMA_DELTA, accountant="rdp",
                                **({"epsilon": eps} if noisy else {"noise_multiplier": 1.0, "unsafe_noise_scale": 0.0}))
                 for eps in epsilons]
        transcript = Transcript()
        if len(mechs) == 1:
            simulate(task=task, network=net, algorithm=alg, mechanism=mechs[0], schedule=lambda t: 0.0,
                     iterations=SIGMA_ROUNDS, seed=5, metrics=False, observers=[transcript])
        else:
            simulate_replicas(task=task, algorithm=alg, iterations=SIGMA_ROUNDS, metrics=False, observers=[transcript],
                              replicas=[Replica(net, m, lambda t: 0.0, 5 + r) for r, m in enumerate(mechs)])
        wire[noisy] = [m for m in transcript.messages if m.tag == "cross_gradient"]
        if noisy:
            ledgers = [m.ledger() for m in mechs]
    assert len(wire[True]) == len(wire[False]) == SIGMA_ROUNDS
    out = []
    for with_noise, clean in zip(wire[True], wire[False]):
        assert torch.equal(with_noise.src, clean.src) and torch.equal(with_noise.dst, clean.dst)
        noise = (with_noise.payload - clean.payload).reshape(clean.payload.shape[0], -1) * SIGMA_LOT / SIGMA_CLIP
        # what arrives at dst(e) was computed by src(e) on its own data: owner src, requester dst
        for k, (s, d) in enumerate(zip(with_noise.src.tolist(), with_noise.dst.tolist())):
            assert s // n == d // n  # never across replicas
            out.append((s // n, s % n, d % n, noise[k]))
    return out, ledgers, net


def sampled_gaussian_epsilon(z: float, *, q: float, steps: int, delta: float) -> float:
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("epsilons", [[3.0], [3.0, 1.0]], ids=["single", "stacked"])
@pytest.mark.slow
def test_a_cross_gradient_carries_its_owners_noise_level_for_every_requester(epsilons):
    """For every (replica, owner j, requester i): the noise on the lot sum, over the rounds and coordinates, has std
    σ_j·C, σ_j the noise multiplier the ledger states for owner j — which meets the target ε with owner j's own
    q_j = L/m_j and its own T·deg(j) accesses, re-accounted here with dp_accounting's RDP. σ_i differs from σ_j by far
    more than the tolerance, so a σ taken from the requester fails."""
    noise, ledgers, net = cross_gradient_noise(epsilons)
    n = net.n
    deg = [int((net.W[j] > 0).sum()) - 1 for j in range(n)]
    sigma = {}
    for r, (eps, ledger) in enumerate(zip(epsilons, ledgers)):
        for j, row in enumerate(ledger.per_agent()):
            q = SIGMA_LOT / SIGMA_COUNTS[j]
            assert row["sample_rate"] == pytest.approx(q, rel=1e-12)
            sigma[(r, j)] = row["noise_multiplier"]
            got = sampled_gaussian_epsilon(sigma[(r, j)], q=q, steps=SIGMA_ROUNDS * deg[j], delta=SIGMA_DELTA)
            assert eps * (1 - ORDER_GRID) < got < eps * (1 + ORDER_GRID), (r, j, got)
    pairs: dict[tuple[int, int, int], list[torch.Tensor]] = {}
    for r, j, i, z in noise:
        pairs.setdefault((r, j, i), []).append(z)
    assert len(pairs) == len(epsilons) * 2 * n  # every directed edge of the ring, in every replica
    for (r, j, i), zs in pairs.items():
        z = torch.cat(zs)
        tol = std_tolerance(z.numel())
        assert abs(sigma[(r, j)] / sigma[(r, i)] - 1) > 3 * tol, "the design must separate owner and requester"
        got = float(z.std())
        assert got == pytest.approx(sigma[(r, j)], rel=tol), (r, j, i, got, sigma[(r, j)], sigma[(r, i)])


# ---- 2. Zip-DL: each sender calibrated on its outgoing messages ------------------------------------------------------
#: an irregular graph: a hub 0 with neighbours 1-4, a triangle 0-1-2, a pendant 3 and a triangle 4-5-6
ZIP_EDGES = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (4, 5), (5, 6), (4, 6)]


def zip_net() -> Network:
    i, j = zip(*ZIP_EDGES)
    return Network.from_edges(7, np.array(i), np.array(j))


def lemma_3_3(w: np.ndarray) -> dict[tuple[int, int], float]:
    """c_{a→v} = (d_a − 1)²/d_a² + Σ_{j∈Γ_a, j≠v} W_{a,j}² / (d_a W_{a,v})² for every edge a → v (Γ_a: a's closed
    neighbourhood, d_a its size; BASELINES.md §7.2)."""
    n = w.shape[0]
    c = {}
    for a in range(n):
        gamma = [j for j in range(n) if j == a or w[a, j] > 0]
        d = len(gamma)
        for v in gamma:
            if v != a:
                c[(a, v)] = (d - 1) ** 2 / d**2 + sum(w[a, j] ** 2 for j in gamma if j != v) / (d * w[a, v]) ** 2
    return c


def test_zip_dl_accepts_only_a_symmetric_w():
    """The premise of the tests below: W_{a,v} = W_{v,a} on every W Zip-DL runs with (a doubly stochastic W that is
    not symmetric is refused), so outgoing and incoming edges differ by the sender's neighbourhood, not the weight."""
    w = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]])
    net = Network.from_matrix(w)  # doubly stochastic, symmetric support: a valid network
    with pytest.raises(ValidationError, match="symmetric"):
        make_mechanism("zip_dl", steps=3, network=net, sigma=1.0)
    c = lemma_3_3(zip_net().W)
    out_min = {a: min(v for (s, _), v in c.items() if s == a) for a in range(7)}
    in_min = {a: min(v for (_, t), v in c.items() if t == a) for a in range(7)}
    assert max(max(out_min[a] / in_min[a], in_min[a] / out_min[a]) for a in range(7)) > 3  # the graph separates them


def test_zip_dl_sends_on_every_edge_the_noise_its_senders_worst_outgoing_message_needs():
    """Calibrated to (ε, δ) for one step: the noise on each edge a → v of a real round (the run minus the same run
    with clipping only) has std η·√c_{a→v}·ς_a with ς_a = 2C·z/√(min_u c_{a→u}) — the minimum over a's *outgoing*
    edges — z from dp_accounting's RDP, c from Lemma 3.3 written out here; and every agent's achieved ε, read off the
    measured noise, meets the target."""
    eps, delta, clip, eta = 2.0, 1e-5, 1.0, 0.3
    net = zip_net()
    task = numbered_task([6] * 7, features=1499)  # 3000 parameters: 3000 draws per edge
    runs = {}
    for name, params in (("zip_dl", {"network": net, "epsilon": eps, "delta": delta}), ("clip", {})):
        transcript = Transcript()
        simulate(task=task, network=net, algorithm=make_algorithm("dsgd"), seed=11, iterations=1, metrics=False,
                 mechanism=make_mechanism(name, steps=1, clip=clip, **params), sparse=True, observers=[transcript],
                 schedule=make_schedule("constant", eta=eta, iterations=1))
        (runs[name],) = [m for m in transcript.messages if m.tag == "x"]
    plain = {int(s): runs["clip"].payload[k] for k, s in enumerate(runs["clip"].src.tolist())}  # one value per sender
    z = rdp_noise_multiplier(epsilon=eps, delta=delta, steps=1)
    c = lemma_3_3(net.W)
    measured: dict[int, list[float]] = {}
    msg = runs["zip_dl"]
    assert len(msg.src) == len(c)
    tol = std_tolerance(task.dim)  # one draw per parameter on every edge
    for k, (a, v) in enumerate(zip(msg.src.tolist(), msg.dst.tolist())):
        worst = min(val for (s, _), val in c.items() if s == a)
        want = eta * math.sqrt(c[(a, v)]) * 2 * clip * z / math.sqrt(worst)
        noise = msg.payload[k] - plain[a]
        got = float(noise.std())
        assert got == pytest.approx(want, rel=tol), (a, v, got, want)
        measured.setdefault(a, []).append(got / (eta * 2 * clip))  # the pair's noise multiplier, as measured
    for a, zs in measured.items():  # the measured noise, granted its tolerance, meets (ε, δ) on a's worst edge
        assert rdp_gaussian_epsilon(min(zs) / (1 - tol), steps=1, delta=delta) <= eps * (1 + ORDER_GRID), a


def test_zip_dl_ledger_states_each_agents_worst_outgoing_pair():
    """With ς given (the same for every agent) over T steps: agent a's ledger ε is the largest RDP ε among its
    outgoing pairs a → v, each a Gaussian mechanism of noise multiplier √c_{a→v}·ς/(2C) (Lemma 3.3, dp_accounting)
    — not its incoming ones, which differ here by up to 5.3× in c; calibrated to ε instead, every agent's ledger ε
    re-accounts to the target."""
    sigma, clip, delta, steps = 4.0, 0.5, 1e-5, 20
    net = zip_net()
    c = lemma_3_3(net.W)
    mech = make_mechanism("zip_dl", steps=steps, network=net, sigma=sigma, clip=clip, delta=delta)
    stated = [row["epsilon"] for row in mech.ledger().per_agent()]
    for a in range(net.n):
        pairs = [rdp_gaussian_epsilon(math.sqrt(val) * sigma / (2 * clip), steps=steps, delta=delta)
                 for (s, _), val in c.items() if s == a]
        assert stated[a] == pytest.approx(max(pairs), rel=ORDER_GRID), (a, stated[a], max(pairs))
    calibrated = make_mechanism("zip_dl", steps=steps, network=net, epsilon=3.0, clip=clip, delta=delta)
    for a, row in enumerate(calibrated.ledger().per_agent()):
        assert 3.0 * (1 - ORDER_GRID) < row["epsilon"] <= 3.0, (a, row["epsilon"])


# ---- 3. lots: Poisson at every rate, with the ledger's q ------------------------------------------------------------
#: total false-alarm probability of the lot tests below (Bonferroni over every case, agent and test)
FALSE_ALARM = 1e-4
LOT_COUNTS, LOT_L, LOT_ROUNDS = [20, 24, 40, 80], 20, 80  # L/m = 1, 0.833, 0.5, 0.25
#: (label, algorithm, mechanism parameters, engine): mixed rates (one exactly 1, one exactly 0.5, one above), every
#: rate ≥ 0.5 (a public sample_rate), every rate 1; DP-DSGD, DPDL's cross-gradients (owner ≠ requester), stacked
#: replicas and the sliced backend
LOT_CASES = [
    ("mixed", "dsgd", {"lot_size": LOT_L}, "simulate"),
    ("all_high", "dsgd", {"lot_size": LOT_L, "sample_rate": 0.75}, "simulate"),
    ("all_half", "dsgd", {"lot_size": LOT_L, "sample_rate": 0.5}, "simulate"),
    ("all_one", "dsgd", {"lot_size": LOT_L, "sample_rate": 1.0}, "simulate"),
    ("dpdl_mixed", "dpdl", {"lot_size": LOT_L}, "simulate"),
    ("stacked_mixed", "dsgd", {"lot_size": LOT_L}, "replicas"),
    ("sliced_high", "dsgd", {"lot_size": LOT_L, "sample_rate": 0.75}, "sliced"),
    ("sliced_mixed", "dsgd", {"lot_size": LOT_L}, "sliced"),
]
TESTS_PER_AGENT = 3


def drawn_lots(algorithm: str, params: dict, engine: str, monkeypatch) -> tuple[dict[int, list[np.ndarray]], list]:
    """Every lot the engine draws in a run (observed where the task draws it), as positions in the owner's data,
    per owner; and the rates the run's ledger states per agent."""
    task = numbered_task(LOT_COUNTS, features=3)
    start = np.cumsum([0, *LOT_COUNTS])
    net = Network.from_topology("path" if algorithm == "dpdl" else "ring", len(LOT_COUNTS))
    alg = make_algorithm(algorithm)
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    original = Task.sample_lot

    def observed(self, draws, agents, rates, *, block=1):  # rates: the code under test, unread
        batch, mask = original(self, draws, agents, rates, block=block)
        seen.append((agents.cpu().clone(), mask.cpu().bool(), batch[0][..., 0].cpu().clone()))
        return batch, mask

    monkeypatch.setattr(Task, "sample_lot", observed)

    def mech():
        return make_mechanism("dp_sgd", steps=alg.accesses(LOT_ROUNDS, net.edges), task=task, clip=1.0,
                              noise_multiplier=1.0, **params)

    schedule = make_schedule("constant", eta=0.05, iterations=LOT_ROUNDS)
    m = mech()
    if engine == "simulate":
        simulate(task=task, network=net, algorithm=alg, mechanism=m, schedule=schedule, iterations=LOT_ROUNDS,
                 seed=7, metrics=False)
    elif engine == "replicas":
        simulate_replicas(task=task, algorithm=alg, iterations=LOT_ROUNDS, metrics=False,
                          replicas=[Replica(net, m, schedule, 7), Replica(net, mech(), schedule, 8)])
    else:
        simulate_sliced(task=task, network=net, algorithm=alg, mechanism=m, schedule=schedule,
                        iterations=LOT_ROUNDS, seed=7, metrics=False, slices=2, timeout=60)
    lots: dict[int, list[np.ndarray]] = {}
    for agents, mask, numbers in seen:
        for row, i in enumerate(agents.tolist()):
            pos = numbers[row][mask[row]].numpy().astype(np.int64) - start[i]
            assert pos.min(initial=0) >= 0 and pos.max(initial=0) < LOT_COUNTS[i], "an example of another agent"
            assert len(np.unique(pos)) == len(pos), "an example twice in one lot"
            lots.setdefault(i, []).append(pos)
    return lots, [row["sample_rate"] for row in m.ledger().per_agent()]


@pytest.mark.parametrize("label,algorithm,params,engine", LOT_CASES, ids=[c[0] for c in LOT_CASES])
def test_lots_are_poisson_at_every_rate_with_the_ledgers_q(label, algorithm, params, engine, monkeypatch):
    """Per owner i, with q_i the ledger states — equal to the config's (``sample_rate``, or L/m_i): at q_i = 1 every
    lot is the whole data; below, the K lot sizes are independent Binomial(m_i, q_i) (exact binomial test on their
    total, chi-square fit of their histogram) and the examples in the second half of the data join at rate q_i
    (exact binomial test: not a fixed prefix) — so never the whole data every time, nor a fixed fraction, nor a
    clamped rate."""
    lots, stated = drawn_lots(algorithm, params, engine, monkeypatch)
    level = FALSE_ALARM / (len(LOT_CASES) * len(LOT_COUNTS) * TESTS_PER_AGENT)
    for i, m in enumerate(LOT_COUNTS):
        config = params.get("sample_rate", LOT_L / m)
        assert stated[i] == pytest.approx(config, rel=1e-12), (i, stated[i], config)
        q = stated[i]
        sizes = np.array([len(p) for p in lots[i]])
        assert len(sizes) >= LOT_ROUNDS, (i, len(sizes))
        if q == 1.0:
            assert all(np.array_equal(np.sort(p), np.arange(m)) for p in lots[i]), i
            continue
        back = np.arange(m // 2, m)
        joined = sum(int(np.isin(p, back).sum()) for p in lots[i])
        p_total = stats.binomtest(int(sizes.sum()), len(sizes) * m, q).pvalue
        p_fit = binomial_fit_p_value(sizes, m, q)
        p_back = stats.binomtest(joined, len(sizes) * len(back), q).pvalue
        assert min(p_total, p_fit, p_back) > level, (label, i, q, sizes.mean() / m, p_total, p_fit, p_back)


def test_the_lot_tests_reject_whole_data_fixed_fractions_and_clamped_rates():
    """Power: fed what a broken engine would draw at q = 0.75 on 24 examples over 80 accesses — the whole data every
    time, a fixed lot of 18, lots at a rate clamped to 0.5, or Poisson lots of the first examples only — the tests
    above reject far below their threshold; fed true Poisson lots they do not."""
    rng = np.random.default_rng(0)
    m, q, k = 24, 0.75, LOT_ROUNDS
    level = FALSE_ALARM / (len(LOT_CASES) * len(LOT_COUNTS) * TESTS_PER_AGENT)
    assert stats.binomtest(k * m, k * m, q).pvalue < level  # whole data
    assert binomial_fit_p_value(np.full(k, 18), m, q) < level  # a fixed fraction
    assert stats.binomtest(int(rng.binomial(m, 0.5, k).sum()), k * m, q).pvalue < level  # clamped at 0.5
    prefix = [np.arange(s) for s in rng.binomial(m, q, k)]  # Poisson sizes, always the first examples
    back = np.arange(m // 2, m)
    joined = sum(int(np.isin(p, back).sum()) for p in prefix)
    assert stats.binomtest(joined, k * len(back), q).pvalue < level
    fair = rng.binomial(m, q, k)
    assert stats.binomtest(int(fair.sum()), k * m, q).pvalue > 1e-3 and binomial_fit_p_value(fair, m, q) > 1e-3


# ---- 4. the access budget holds on every path of the count ------------------------------------------------------------
@pytest.mark.parametrize("how", ["simulator", "network", "held"])
def test_a_run_longer_than_its_accounting_is_refused_at_the_first_access_beyond_it(how):
    """A mechanism calibrated for 3 accesses per agent, in a run of 5 rounds of D-SGD (one access per agent a
    round), refuses the 4th round's access and counts nothing beyond the budget — on the simulator (every row, the
    count's "everyone" path), a sliced run's network frame (owner rows rebuilt per access) and its held frame (the
    same owners tensor every round: the count's repeated-access path, whose budget check is a cached headroom)."""
    from privdl.mechanisms.base import AccessBudgetExceeded
    from privdl.placement import partition
    from privdl.tasks import make_task

    n, budget, rounds = 6, 3, 5
    net = Network.from_topology("ring", n)
    task = make_task("softmax", n, dataset="digits", batch_size=8, seed=1)
    alg = make_algorithm("dsgd")
    assert alg.accesses(budget, net.edges).tolist() == [budget] * n  # one access per agent a round
    mech = make_mechanism("gaussian_ldp", steps=alg.accesses(budget, net.edges), network=net, clip=1.0,
                          epsilon=20.0)
    schedule = make_schedule("constant", eta=0.1, iterations=rounds)
    run = dict(task=task, network=net, algorithm=alg, mechanism=mech, iterations=rounds, schedule=schedule, seed=1)
    with pytest.raises(AccessBudgetExceeded, match=f"noisy access {budget + 1} to the data of agent"):
        if how == "simulator":
            simulate(**run)
        else:
            simulate_sliced(**run, placements=partition(n, slices=2), frame=how)
    if how == "simulator":  # (a sliced run's slices count on copies of the mechanism)
        assert mech.calls.tolist() == [budget] * n


def test_the_count_of_repeated_accesses_is_each_access_counted():
    """The count defers a repeated access (every row, or the same owners tensor again) and adds the pending repeats
    when the counts are read: what it reads must be the plain per-access sums at every point — between repeats,
    after another access interrupts them, read twice, after the counts are set — and the budget still stops it."""
    from privdl.keys import Keys
    from privdl.mechanisms.base import Access, AccessBudgetExceeded, MechanismEnv

    mech = make_mechanism("none", steps=[20, 20, 20, 20])
    mech.bind(MechanismEnv(Keys(1, 4)))
    held = torch.tensor([0, 2, 2])
    every, want = torch.arange(4), np.zeros(4, dtype=np.int64)

    def access(owners, everyone=False):
        mech.count(Access(owners=owners, requesters=owners, call=1, everyone=everyone))
        np.add.at(want, owners.numpy(), 1)

    for _ in range(2):
        access(held)
    assert mech.calls.tolist() == want.tolist() == [2, 0, 4, 0]
    assert mech.calls.tolist() == [2, 0, 4, 0]  # read twice: nothing counted again
    access(held)
    access(every, everyone=True)  # another increment: the held repeats are added first
    access(every, everyone=True)
    access(torch.tensor([1, 3]))
    access(held)
    assert mech.calls.tolist() == want.tolist() == [6, 3, 10, 3]
    mech.calls = torch.tensor([0, 0, 12, 0])  # set (a checkpoint's counts, restore_calls): nothing pending
    mech._headroom = 8
    access(every, everyone=True)
    assert mech.calls.tolist() == [1, 1, 13, 1]
    with pytest.raises(AccessBudgetExceeded, match="noisy access 21 to the data of agent 2"):
        for _ in range(9):
            access(held)
    assert mech.calls.tolist() == [4, 1, 19, 1]  # 3 accesses of held fit (13 → 19 at agent 2), the 4th is refused
