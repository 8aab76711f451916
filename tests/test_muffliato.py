"""Muffliato (privdl.mechanisms.muffliato): the accelerated gossip against a dense polynomial of W, the pairwise bound
against a direct evaluation of the authors' formula, refusals, calibration, the ledger and a config-path run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.comm import SparseComm, Transcript
from privdl.errors import ValidationError
from privdl.mechanisms import make_mechanism
from privdl.mechanisms.muffliato import GossipComm, chebyshev_omega, gossip_matrices, pairwise_sums
from privdl.network import Network
from privdl.privacy.events import GaussianEvent
from privdl.privacy.example_accountant import RdpAccountant
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task


def _net(n=8, p=0.4, seed=3):
    return Network.from_topology("erdos_renyi", n, p=p, seed=seed)


def _omega_by_hand(w):
    lap = np.eye(len(w)) - w
    lam = sorted(np.linalg.eigvals(lap).real)[1]  # second-smallest eigenvalue of I − W
    return 2 * (1 - math.sqrt(lam * (1 - lam / 4))) / (1 - lam / 2) ** 2


@pytest.mark.parametrize("rounds", [1, 2, 5])
@pytest.mark.parametrize("accelerated", [False, True])
def test_gossip_against_a_dense_polynomial_of_w(rounds, accelerated):
    net = _net()
    w = net.W
    omega = _omega_by_hand(w)
    assert chebyshev_omega(w)[0] == pytest.approx(omega, rel=1e-10)
    # the polynomial, written out: P_0 = I, P_1 = W, P_{r+1} = ω W P_r + (1 − ω) P_{r−1} (plain: ω = 1)
    om = omega if accelerated else 1.0
    polys = [np.eye(net.n), w]
    for _ in range(rounds - 1):
        polys.append(om * w @ polys[-1] + (1 - om) * polys[-2])
    x = torch.randn(net.n, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    comm = GossipComm(SparseComm(net), rounds=rounds, accelerated=accelerated, omega=chebyshev_omega(w)[0],
                      owner="muffliato")
    transcript = comm.attach(Transcript())
    out = comm.mix(x, tag="x")
    torch.testing.assert_close(out, torch.as_tensor(polys[rounds]) @ x, rtol=1e-12, atol=1e-12)
    assert len(transcript.messages) == rounds  # every round is a real transmission on the wire
    for got, want in zip(gossip_matrices(w, rounds, accelerated=accelerated), polys):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValidationError, match="second averaging"):
        comm.mix(x, tag="y")


def _authors_formula(w, T, u, alpha, sigma):
    """The authors' simulation loop, written independently: for t = 1..T, Wt = W^t; every observer v sums over its
    neighbours w ≠ v the contribution (Wt[w, u])² / ‖Wt[w, ·]‖², times α/(2σ²)."""
    n = len(w)
    eps = np.zeros(n)
    wt = w.copy()
    for _ in range(T):
        for v in range(n):
            for x in range(n):
                if x != v and w[v, x] != 0:
                    eps[v] += alpha * wt[x, u] ** 2 / np.sum(wt[x] ** 2) / (2 * sigma**2)
        wt = w @ wt
    return eps


def test_pairwise_sums_match_the_authors_formula():
    net = _net(n=9, p=0.35, seed=5)
    w = net.W
    T = 4
    powers = [np.linalg.matrix_power(w, t) for t in range(1, T + 1)]
    s = pairwise_sums(w, powers)
    for u in range(net.n):
        np.testing.assert_allclose(s[u] * 2.5 / (2 * 1.3**2), _authors_formula(w, T, u, 2.5, 1.3), rtol=1e-12)


def test_the_mechanisms_bound_is_the_formula_with_rounds_0_to_k_capped_at_ldp():
    net = _net(n=9, p=0.35, seed=5)
    w = net.W
    k = 3
    mech = make_mechanism("muffliato", steps=5, network=net, sigma=2.0, gossip_rounds=k)
    direct = np.zeros((net.n, net.n))
    for u in range(net.n):  # rounds r = 0 (I) … K of plain gossip: sensitivity-1 sums
        direct[u] = sum(_single(np.linalg.matrix_power(w, r), w, u) for r in range(k + 1))
    np.testing.assert_allclose(mech.pair_sums, direct, rtol=1e-12)
    capped = np.minimum(direct, 1.0)
    np.fill_diagonal(capped, 0.0)
    adj = (w != 0) & ~np.eye(net.n, dtype=bool)
    assert np.all(capped[adj] == 1.0)  # direct neighbours fall back to local DP
    report = mech.pair_report(5)
    assert report["worst_neighbour_pair"]["S_per_step"] == 1.0
    non = np.where(adj | np.eye(net.n, dtype=bool), -1, capped)
    assert report["worst_non_neighbour_pair"]["S_per_step"] == pytest.approx(non.max(), rel=1e-12)
    assert report["ldp_rdp_per_step"] == pytest.approx(4 / (2 * 4.0))


def _single(p, w, u):
    n = len(w)
    out = np.zeros(n)
    for v in range(n):
        for x in range(n):
            if x != v and w[v, x] != 0:
                out[v] += p[x, u] ** 2 / np.sum(p[x] ** 2)
    return out


def test_gossip_rounds_below_one_refused():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValidationError, match="gossip_rounds"):
            make_mechanism("muffliato", steps=3, network=_net(), sigma=1.0, gossip_rounds=bad)
    with pytest.raises(ValidationError, match="example level"):
        make_mechanism("muffliato", steps=3, network=_net(), sigma=1.0, clipping="per_example")


@pytest.mark.parametrize("accelerated", [False, True])
def test_calibration_never_overshoots(accelerated):
    net = _net(n=10, p=0.3, seed=8)
    for eps in (0.5, 3.0):
        mech = make_mechanism("muffliato", steps=20, network=net, epsilon=eps, clip=0.5, gossip_rounds=4,
                              accelerated=accelerated)
        led = mech.ledger()
        assert led.epsilon <= eps and led.epsilon == pytest.approx(eps, rel=1e-3)
        worst = float(mech.capped.max())
        again = RdpAccountant().account([GaussianEvent(precision=worst / mech.sigma**2, sensitivity=1.0, count=20)],
                                        delta=1e-5)
        assert again <= eps
        (ldp,) = led.beside  # the eavesdropper's statement: local DP with the agent-level (tight) accountant
        assert ldp.accountant == "tight" and ldp.epsilon <= led.epsilon and "eavesdropper" in ldp.notion


CONFIG = """
name = "muff"
seeds = [0]
iterations = 6
eval_every = 3
[network]
n = 6
p = 0.6
[task]
name = "logistic"
dataset = "breast_cancer"
batch_size = 4
[algorithm]
name = "dsgd"
[mechanism]
name = "muffliato"
epsilon = 3.0
delta = 1e-5
clip = 1.0
gossip_rounds = 3
accelerated = true
[schedule]
name = "constant"
eta = 0.1
"""


def test_end_to_end_through_the_config_path(tmp_path):
    from tests.conftest import run_toml

    man = run_toml(tmp_path, CONFIG)
    (led,) = man["privacy_ledger"]
    assert led["mechanism"] == "muffliato" and "pairwise network DP" in led["notion"]
    assert led["epsilon"] <= 3.0 and led["noise"]["gossip_rounds"] == 3 and led["noise"]["accelerated"] is True
    assert "eavesdropper" in led["beside"][0]["notion"] and led["beside"][0]["epsilon"] <= 3.0


def test_privdl_account_reaccounts_both_statements_of_a_muffliato_manifest(tmp_path):
    """``privdl account --manifest`` on a Muffliato run re-accounts (and so verifies) both statements: its pairwise ε
    and, beside it, the local-DP ε of the same noise against an eavesdropper. The latter is checked independently:
    the tight accountant's T-fold Gaussian composition with μ = √T·Δ/σ has δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2),
    evaluated here with scipy at each agent's stated ε from its event alone."""
    import math

    from scipy.stats import norm

    from tests.conftest import run_and_reaccount

    man, path, out = run_and_reaccount(tmp_path, CONFIG)
    led = man["privacy_ledger"][0]
    assert out["epsilon"] == led["epsilon"] and out["mechanism"] == "muffliato"
    beside = led["beside"][0]
    assert out["agent_level_epsilon"] == beside["epsilon"] and out["agent_level_accountant"] == "tight"
    for row in beside["per_agent"]:
        (event,) = row["events"]
        mu = math.sqrt(event["count"] * event["precision"]) * event["sensitivity"]
        eps = row["epsilon"]
        delta = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert delta == pytest.approx(row["delta"], rel=1e-6)


def test_other_algorithms_refused_at_build(tmp_path):
    from privdl.experiment import load_config, run_experiment

    (tmp_path / "exp.toml").write_text(CONFIG.replace('name = "dsgd"', 'name = "dsgt"'))
    with pytest.raises(ValidationError, match="D-SGD"):
        run_experiment(load_config(tmp_path / "exp.toml"), tmp_path / "out", progress=False)


# ---- calibration = "mean_pair" (issue 46): the authors' way of reporting privacy ---------------------------------
@pytest.mark.parametrize("n", [8, 13, 20])
def test_mean_pair_on_a_ring_has_its_closed_form(n):
    """Ring, Metropolis–Hastings weights 1/3, one plain round (P_0 = I, P_1 = W, every row of W has squared norm
    1/3): an observer at distance 1 gets S = 1 (capped; P_0 alone gives 1) and at distance 2 gets S = (1/9)/(1/3) =
    1/3 (one of its neighbours sees u with weight 1/3), farther 0. So the per-distance means are 1, 1/3, 0, …, the
    mean over the n − 1 observers is (2·1 + 2·⅓)/(n − 1) = 8/(3(n − 1)), and the mean-pair σ is the worst-pair σ
    times √(8/(3(n − 1)))."""
    net = Network.from_topology("ring", n)
    worst = make_mechanism("muffliato", steps=50, network=net, epsilon=3.0, gossip_rounds=1)
    mean = make_mechanism("muffliato", steps=50, network=net, epsilon=3.0, gossip_rounds=1, calibration="mean_pair")
    closed = 8 / (3 * (n - 1))
    assert mean.mean_pair == pytest.approx(closed, rel=1e-12)
    by = mean.noise_facts()["mean_pair_by_distance"]
    assert by["1"] == pytest.approx(1.0) and by["2"] == pytest.approx(1 / 3)
    assert all(v == pytest.approx(0.0, abs=1e-15) for k, v in by.items() if int(k) > 2)
    assert len(by) == n // 2  # distances 1 … ⌊n/2⌋ on a ring
    assert mean.sigma / worst.sigma == pytest.approx(math.sqrt(closed), rel=1e-12)
    # the mean pair meets the target (never above it); the worst observer, a neighbour, does not
    facts = mean.noise_facts()
    assert facts["mean_pair"]["epsilon"] == pytest.approx(3.0, rel=1e-6) and facts["mean_pair"]["epsilon"] <= 3.0
    assert mean.ledger().epsilon > 3.0 >= worst.ledger().epsilon
    assert facts["calibration"] == "mean_pair" and "MEAN over pairs" in mean.ledger().note


def test_mean_pair_equals_worst_pair_on_a_complete_graph_and_never_exceeds_it():
    """On the complete graph every pair is a direct neighbour (S ≥ 1, capped at the local-DP 1): the mean is the
    worst, the same σ. On any graph the mean over pairs is at most the largest, so the mean-pair σ is never larger."""
    net = Network.from_topology("complete", 9)
    a = make_mechanism("muffliato", steps=20, network=net, epsilon=1.0, gossip_rounds=2)
    b = make_mechanism("muffliato", steps=20, network=net, epsilon=1.0, gossip_rounds=2, calibration="mean_pair")
    assert b.mean_pair == pytest.approx(1.0) and b.sigma == pytest.approx(a.sigma, rel=1e-12)
    for seed, rounds, accelerated in ((0, 1, False), (1, 3, True), (2, 10, True)):
        net = Network.from_topology("erdos_renyi", 15, p=0.3, seed=seed)
        kw = dict(steps=30, network=net, epsilon=3.0, gossip_rounds=rounds, accelerated=accelerated)
        assert (make_mechanism("muffliato", calibration="mean_pair", **kw).sigma
                <= make_mechanism("muffliato", **kw).sigma * (1 + 1e-12))
        assert make_mechanism("muffliato", **kw).sigma == make_mechanism("muffliato", calibration="worst_pair",
                                                                         **kw).sigma  # the default is unchanged


def test_unknown_calibration_refused():
    with pytest.raises(ValidationError, match="calibration must be one of worst_pair, mean_pair.*'median'"):
        make_mechanism("muffliato", steps=5, network=Network.from_topology("ring", 5), epsilon=1.0,
                       calibration="median")
