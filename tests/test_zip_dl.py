"""Zip-DL (privdl.mechanisms.zip_dl): the per-sender zero sum, the network average on a real transcript, Lemma 3.3's
per-message variance, the refusals, calibration and the ledger, and a run through the config path."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.comm import SparseComm, Transcript
from privdl.errors import ValidationError
from privdl.keys import Keys
from privdl.mechanisms import make_mechanism
from privdl.mechanisms.zip_dl import ZipDLComm, ZipDLEncoding, zip_dl_plan
from privdl.network import Network
from privdl.privacy.events import GaussianEvent
from privdl.privacy.example_accountant import RdpAccountant
from privdl.privacy.ledger import Ledger
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task


def _net(n=7, p=0.5, seed=2):
    return Network.from_topology("erdos_renyi", n, p=p, seed=seed)


def _encoding(net, sigma=1.0, eta=1.0, seed=0):
    e = net.edges
    plan = zip_dl_plan(net.W, e.src.numpy(), e.dst.numpy())
    return plan, ZipDLEncoding(plan, np.full(net.n, sigma), Keys(seed, net.n), lambda t: eta)


def test_zero_sum_per_sender_is_exact_in_float64():
    net = _net()
    w = net.W
    plan, enc = _encoding(net, sigma=3.0, eta=0.5)
    e = net.edges
    z_edge, z_self = enc.noise(e.src, e.dst, 4, 50)
    scale = z_edge.abs().max()
    for a in range(net.n):
        out = e.src == a
        total = w[a, a] * z_self[a] + sum(w[a, int(v)] * z_edge[k] for k, v in zip(out.nonzero().flatten().tolist(),
                                                                                      e.dst[out].tolist()))
        assert float(total.abs().max()) <= 1e-15 * float(scale) * (out.sum() + 1)


@pytest.mark.exact
def test_a_held_engines_noise_is_its_agents_rows_and_edges_of_the_networks():
    """The held frame's draw (an engine's agents, the edges they send along, each edge's sender's local row) equals
    those rows and edges of the whole network's draw bit for bit (keyed draws are row-independent; each sender's
    zero-sum correction sums its own edges' terms in the same order), from keys that know only those agents; and a
    draw with the agents but not their edges (an incomplete correction) is refused."""
    from privdl.keys import HeldKeys, RootKeys

    net = _net()
    e = net.edges
    plan = zip_dl_plan(net.W, e.src.numpy(), e.dst.numpy())
    sigma = np.linspace(0.5, 2.0, net.n)
    full = ZipDLEncoding(plan, sigma, Keys(RootKeys(3), net.n), lambda t: 0.3)
    z_edge, z_self = full.noise(e.src, e.dst, 5, 40)
    agents = torch.tensor([1, 4, 5])
    held = np.zeros(net.n, dtype=bool)
    held[agents.numpy()] = True
    source = HeldKeys(RootKeys(3), held, record=True)
    enc = ZipDLEncoding(plan, sigma, Keys(source, net.n), lambda t: 0.3)
    edges = torch.isin(e.src, agents).nonzero().reshape(-1)
    local = torch.full((net.n,), -1, dtype=torch.long)
    local[agents] = torch.arange(3)
    got_edge, got_self = enc.noise(e.src[edges], e.dst[edges], 5, 40, edges=edges, agents=agents,
                                   sender=local[e.src[edges].long()])
    assert torch.equal(got_edge, z_edge[edges]) and torch.equal(got_self, z_self[agents])
    assert {a for a in source.asked if isinstance(a, int)} == {1, 4, 5}
    with pytest.raises(ValidationError, match="needs both its agents and the edges they send along"):
        enc.noise(e.src[edges], e.dst[edges], 5, 40, agents=agents)


def test_lemma_3_3_per_message_variance_against_draws():
    net = _net(n=6, p=0.6, seed=5)
    w = net.W
    plan, enc = _encoding(net, sigma=2.0, eta=1.0)
    e = net.edges
    draws = 40_000
    z_edge, z_self = enc.noise(e.src, e.dst, 1, draws)  # coordinates are i.i.d.: one wide draw
    emp = z_edge.var(dim=1).numpy()
    # Lemma 3.3 written out independently for each edge a → v
    for k, (a, v) in enumerate(zip(e.src.tolist(), e.dst.tolist())):
        gamma = [a] + [j for j in range(net.n) if j != a and w[a, j] != 0]
        d = len(gamma)
        lemma = ((d - 1) ** 2 / d**2 + sum(w[a, j] ** 2 for j in gamma if j != v) / (d * w[a, v]) ** 2) * 4.0
        assert plan["c_edge"][k] * 4.0 == pytest.approx(lemma, rel=1e-12)
        # the sample variance of 40 000 normals is within 4 standard errors (√(2/N) relative)
        assert emp[k] == pytest.approx(lemma, rel=4 * math.sqrt(2 / draws))


def test_a_zero_weight_on_the_closed_neighbourhood_is_refused():
    w = np.array([[0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.5, 0.5, 0.0]])  # a triangle with no self-weight
    net = Network.from_matrix(w)
    with pytest.raises(ValidationError, match=r"W\[0, 0\] = 0"):
        make_mechanism("zip_dl", steps=3, network=net, sigma=1.0)


def _one_step(mechanism, net, task, observers=()):
    alg = make_algorithm("dsgd")
    return simulate(task=task, network=net, algorithm=alg, mechanism=mechanism, seed=11, iterations=1,
                    schedule=make_schedule("constant", eta=0.3, iterations=1), metrics=False, sparse=True,
                    observers=observers)


def test_the_network_average_is_unchanged_by_the_noise_on_a_real_transcript():
    net = _net(n=8, p=0.5, seed=4)
    task = make_task("logistic", 8, dataset="breast_cancer", batch_size=4, dtype=torch.float64)
    noisy = make_mechanism("zip_dl", steps=1, network=net, sigma=5.0, clip=1.0)
    transcript = Transcript()
    with_noise = _one_step(noisy, net, task, [transcript])
    without = _one_step(make_mechanism("clip", steps=1, clip=1.0), net, task)
    # the same clipped gradient step, the same combine: the agents' models differ by the noise, their average not
    assert float((with_noise.final - without.final).abs().max()) > 0.1
    torch.testing.assert_close(with_noise.final.mean(0), without.final.mean(0), rtol=0, atol=1e-12)
    # the wire carried one distinct payload per edge (send), every one noised
    (msg,) = [m for m in transcript.messages if m.tag == "x"]
    assert msg.payload.shape[0] == len(net.edges)
    sent_twice = [(msg.payload[k] - msg.payload[j]).abs().max()
                  for k in range(len(msg.src)) for j in range(k) if msg.src[k] == msg.src[j]]
    assert min(float(s) for s in sent_twice) > 0.1


def test_calibration_never_overshoots_and_reaccounts():
    net = _net(n=9, p=0.4, seed=7)
    for eps in (0.5, 2.0, 8.0):
        mech = make_mechanism("zip_dl", steps=25, network=net, epsilon=eps, clip=0.7, delta=1e-5)
        led = mech.ledger()
        assert led.epsilon <= eps and led.epsilon == pytest.approx(eps, rel=1e-3)
        # re-account every pair's Gaussian mechanism by hand: variance c_{a→v} ς_a², sensitivity 2C, 25 steps
        prec = 1.0 / (mech.plan["c_edge"] * mech.sigma[mech.src] ** 2)
        worst = max(RdpAccountant().account([GaussianEvent(precision=float(p), sensitivity=1.4, count=25)],
                                            delta=1e-5) for p in prec)
        assert worst <= eps
        assert Ledger.from_dict(json.loads(json.dumps(led.to_dict()))).reaccount().epsilon == pytest.approx(
            led.epsilon, rel=1e-12)


def test_ledger_states_the_notion_and_none_for_an_eavesdropper():
    mech = make_mechanism("zip_dl", steps=10, network=_net(), sigma=3.0)
    led = mech.ledger()
    d = led.to_dict()
    assert "pairwise network DP" in d["notion"] and d["accountant"] == "rdp" and d["unit"] == "agent"
    (eaves,) = d["beside"]
    assert eaves["epsilon"] is None and "eavesdropper" in eaves["notion"]
    assert "eavesdropper on every link: none" in led.guarantee
    assert all(r["epsilon"] is None for r in eaves["per_agent"])


def test_example_level_and_other_algorithms_are_refused():
    net = _net()
    with pytest.raises(ValidationError, match="example level"):
        make_mechanism("zip_dl", steps=3, network=net, sigma=1.0, clipping="per_example")
    mech = make_mechanism("zip_dl", steps=6, network=net, sigma=1.0)
    task = make_task("logistic", net.n, dataset="breast_cancer", batch_size=4)
    with pytest.raises(ValidationError, match="D-SGD"):
        simulate(task=task, network=net, algorithm=make_algorithm("dsgt"), mechanism=mech, seed=0, iterations=2,
                 schedule=make_schedule("constant", eta=0.1, iterations=2), metrics=False)
    with pytest.raises(ValidationError, match="exactly one"):
        make_mechanism("zip_dl", steps=3, network=net)


CONFIG = """
name = "zip"
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
name = "zip_dl"
epsilon = 3.0
delta = 1e-5
clip = 1.0
[schedule]
name = "constant"
eta = 0.1
"""


def test_end_to_end_through_the_config_path(tmp_path):
    from tests.conftest import run_toml

    man = run_toml(tmp_path, CONFIG)
    (led,) = man["privacy_ledger"]
    assert led["mechanism"] == "zip_dl" and "pairwise network DP" in led["notion"]
    assert led["epsilon"] <= 3.0 and led["beside"][0]["epsilon"] is None
    assert math.isfinite(man["final_metrics"]["loss"]) if "loss" in man.get("final_metrics", {}) else True


def test_privdl_account_reaccounts_a_zip_dl_manifest_and_refuses_an_edited_one(tmp_path):
    """``privdl account --manifest`` on a Zip-DL run: the stated pairwise ε bit for bit from the events alone, each
    agent's row what dp_accounting's own RDP accountant gives its Gaussian events (its default orders: within 2 %),
    "none" against an eavesdropper on every link — and an edited event count named as the field that disagrees."""
    import json

    import dp_accounting
    from typer.testing import CliRunner

    from privdl.cli import app
    from tests.conftest import run_and_reaccount

    man, path, out = run_and_reaccount(tmp_path, CONFIG)
    stated = man["privacy_ledger"][0]
    assert out["epsilon"] == stated["epsilon"] <= 3.0 and out["mechanism"] == "zip_dl" and out["accountant"] == "rdp"
    assert out["agent_level_epsilon"] is None and out["agent_level_accountant"] == "none"
    assert "eavesdropper on every link: none" in out["guarantee"]
    for row in out["per_agent"]:
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(row["noise_multiplier"]), row["accesses"])
        assert row["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=2e-2)
    edited = json.loads(path.read_text())
    edited["privacy_ledger"][0]["per_agent"][2]["events"][0]["count"] = 3
    path.write_text(json.dumps(edited))
    res = CliRunner().invoke(app, ["account", "--manifest", str(path)])
    assert res.exit_code != 0 and "per_agent[2]" in res.output


def test_an_eavesdropper_averages_the_victims_per_edge_copies_and_is_left_with_the_own_term_only():
    """Attack views (privdl.attacks.views): an eavesdropper who taps every link of a Zip-DL sender takes the W-weighted
    mean of its copies. By the zero sum (Lemma 3.1, built here by hand from the paper's formula) that leaves exactly
    x_a − w_aa Z_{a→a} / (1 − w_aa): the noise of the one copy that never travels, not a copy's own noise."""
    from privdl.attacks.views import _View
    from privdl.comm.observers import Message
    from privdl.network.edges import Edges
    from privdl.network.mixing import metropolis_hastings
    from privdl.network.topology import erdos_renyi

    w = metropolis_hastings(erdos_renyi(7, p=0.6, seed=3)).astype(np.float64)
    a, dim = 2, 5
    hood = np.flatnonzero(w[a])  # closed neighbourhood Γ_a, a included
    g = torch.Generator().manual_seed(0)
    x = torch.randn(dim, generator=g, dtype=torch.float64)
    y = {v: torch.randn(dim, generator=g, dtype=torch.float64) for v in hood}
    mean = sum(w[a, j] * y[j] for j in hood)
    z = {v: y[v] - mean / (len(hood) * w[a, v]) for v in hood}
    out = [int(v) for v in hood if v != a]
    msg = Message(t=0, tag="x", src=torch.full((len(out),), a), dst=torch.tensor(out),
                  payload=torch.stack([x + z[v] for v in out]))
    view = _View([msg], Edges.from_matrix(w), kind="eavesdropper", victim=a, attacker=None, own=None, protection=None,
                 lag=0, per_edge=False)
    got = view.victim_sent("x", 0)
    want = x - w[a, a] * z[a] / (1 - w[a, a])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert any("weighted mean" in n for n in view.notes)
    # a single copy carries its own noise, larger than what the weighted mean leaves here
    assert float((got - x).norm()) < float((msg.payload[0] - x).norm())


def test_the_noise_on_the_wire_is_what_an_independent_calibration_of_epsilon_asks_for():
    """Calibrated to (ε, δ) over one step, the per-edge noise a real run sends, read off its transcript against a
    noise-free run, has the std an independent calibration gives: per sender a, its worst neighbour's message must be a
    Gaussian mechanism of sensitivity η·2C and noise multiplier z (dp_accounting's own RDP accountant, bisected here),
    so ς_a = z·2C/√c_min(a) and the message a → v carries std η·√c_{a→v}·ς_a (Lemma 3.3, written out here).
    A halved σ, a skipped clip bound or a wrong η scale moves the measured ratio far outside its tolerance."""
    import dp_accounting

    eps, delta, clip, eta = 2.0, 1e-5, 1.0, 0.3
    net = _net(n=8, p=0.5, seed=4)
    task = make_task("logistic", 8, dataset="breast_cancer", batch_size=4, dtype=torch.float64)

    def epsilon(z: float) -> float:
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z))
        return acc.get_epsilon(delta)

    lo, hi = 0.1, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if epsilon(mid) <= eps else (mid, hi)
    z = hi
    w = net.W
    c = {}
    for a, v in zip(net.edges.src.tolist(), net.edges.dst.tolist()):
        gamma = [a] + [j for j in range(net.n) if j != a and w[a, j] != 0]
        d = len(gamma)
        c[(a, v)] = (d - 1) ** 2 / d**2 + sum(w[a, j] ** 2 for j in gamma if j != v) / (d * w[a, v]) ** 2

    transcript, clean = Transcript(), Transcript()
    mech = make_mechanism("zip_dl", steps=1, network=net, epsilon=eps, delta=delta, clip=clip)
    simulate(task=task, network=net, algorithm=make_algorithm("dsgd"), mechanism=mech, seed=11, iterations=1,
             schedule=make_schedule("constant", eta=eta, iterations=1), metrics=False, sparse=True,
             observers=[transcript])
    simulate(task=task, network=net, algorithm=make_algorithm("dsgd"), mechanism=make_mechanism("clip", steps=1,
             clip=clip), seed=11, iterations=1, schedule=make_schedule("constant", eta=eta, iterations=1),
             metrics=False, sparse=True, observers=[clean])
    (noisy,) = [m for m in transcript.messages if m.tag == "x"]
    (plain,) = [m for m in clean.messages if m.tag == "x"]
    sent = {int(s): plain.payload[k] for k, s in enumerate(plain.src.tolist())}  # the same value on every link
    scaled = []  # each message's noise over the std the independent calibration asks of it
    for k, (a, v) in enumerate(zip(noisy.src.tolist(), noisy.dst.tolist())):
        worst = min(c[(a, u)] for (b, u) in c if b == a)
        want = eta * math.sqrt(c[(a, v)]) * z * 2 * clip / math.sqrt(worst)
        scaled.append((noisy.payload[k] - sent[a]) / want)
    ratio = float(torch.cat(scaled).std())
    assert ratio == pytest.approx(1.0, rel=0.15), ratio  # ≈ 1000 normals: 0.15 is > 6 standard errors
