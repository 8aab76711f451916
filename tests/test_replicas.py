"""Stacked replicas (the sweeps' engine): each replica equals its single run; one step's noise covariance across
replicas is η² W R Wᵀ (seed 001, Theorem 1); reproductions run through it with the noise calibrated for the clip
they use."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from privdl.algorithms import make_algorithm
from privdl.covariance import design_covariance
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import Replica, simulate, simulate_replicas
from privdl.tasks import make_task


@pytest.mark.parametrize("algorithm", ["dsgd", "dsgt", "dinno"])
def test_replicas_equal_single_runs(algorithm):
    """Different networks, mechanisms (none, LDP, DECOR, Whisper), step sizes and seeds, stacked: every replica
    draws its single run's numbers and ends where it does (to rounding; here exactly)."""
    task = make_task("quadratic", 6)
    T = 150
    alg = make_algorithm(algorithm, **({"optimizer": "sgd"} if algorithm == "dinno" else {}))
    specs = [("none", 0.5, 0, 1.0), ("ldp", 0.8, 1, 0.5), ("decor", 0.5, 2, 2.0), ("whisper", 0.6, 3, 1.0)]
    reps, singles = [], []
    for k, (design, p, s, scale) in enumerate(specs):
        net = Network.from_topology("erdos_renyi", 6, p=p, seed=s)
        steps = alg.accesses(T, net.edges)

        def mech():
            if design == "none":
                return make_mechanism("none", steps=steps)
            return make_mechanism(design, steps=steps, network=net, clip=5.0, epsilon=20.0)

        sched = make_schedule("inv_sqrt", eta=1e-2 * scale, iterations=T)
        reps.append(Replica(net, mech(), sched, 10 + k))
        singles.append(simulate(task=task, network=net, algorithm=alg, mechanism=mech(), schedule=sched,
                                iterations=T, seed=10 + k))
    res = simulate_replicas(task=task, algorithm=alg, replicas=reps, iterations=T)
    for r, single in enumerate(singles):
        np.testing.assert_allclose(res.final[r].numpy(), single.final.numpy(), rtol=1e-12, atol=1e-12)
        last = {m: v for t, m, v in single.records if t == T}
        assert res.metrics[r]["optimality_gap"] == pytest.approx(last["optimality_gap"], rel=1e-10)
        assert torch.equal(res.accesses[r], single.accesses)


def test_one_step_noise_variance_is_eta2_WRW():
    """From each agent's own minimiser (zero gradient, nothing clipped), x¹ − W x⁰ = −η W v: across 6000 replicas
    with their own seeds its covariance is η² W R Wᵀ."""
    n, reps, eta = 5, 6000, 0.3
    net = Network.from_topology("erdos_renyi", n, p=0.6, seed=4)
    task = make_task("quadratic", n)
    design = design_covariance("whisper", net.W, bound=2.0)
    replicas = [Replica(net, make_mechanism("whisper", steps=1, network=net, clip=1e6, precision_bound=2.0),
                        make_schedule("constant", eta=eta, iterations=1), seed) for seed in range(reps)]
    x0 = task.c.clone()  # agent i at the minimiser of its own f_i
    res = simulate_replicas(task=task, algorithm=make_algorithm("dsgd"), replicas=replicas, iterations=1, x0=x0,
                            metrics=False)
    x = (res.final[:, :, 0] - torch.as_tensor(net.W) @ x0[:, 0]).numpy()  # (reps, n): one coordinate
    emp = x.T @ x / reps
    target = eta**2 * net.W @ design.R @ net.W.T
    se = np.sqrt((np.outer(np.diag(target), np.diag(target)) + target**2) / reps)
    assert np.max(np.abs(emp - target) / se) < norm.ppf(1 - 1e-3 / (n * (n + 1)))  # false alarm 1e-3
    assert np.trace(emp) == pytest.approx(eta**2 * design.trace, rel=0.05)


def test_reproduce_quadratic_command_and_its_calibration(tmp_path):
    """The CLI reproduction runs the packaged grid through the runner (stacked); every run's ledger calibrates b
    for the clip it uses (b from Theorem 2 computed here for C = 10, T = 5000), and re-accounts to its ε."""
    import csv

    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.privacy.ledger import Ledger

    res = CliRunner().invoke(app, ["reproduce", "quadratic", "--seeds", "1", "--clip", "10", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "quadratic.csv").open()))
    assert {r["design"] for r in rows} == {"none", "ldp", "decor", "whisper"}
    assert (tmp_path / "quadratic_vs_epsilon.png").exists() and (tmp_path / "quadratic_vs_p.png").exists()
    gap = {(r["design"], r["accountant"], float(r["epsilon"]), float(r["p"])): float(r["optimality_gap"])
           for r in rows}
    # at C = 10 noise dominates: more budget, smaller gap
    assert gap[("whisper", "paper", 40.0, 0.5)] < gap[("whisper", "paper", 3.0, 0.5)]
    L = math.log(1e5)
    checked = 0
    for path in (tmp_path / "runs_quadratic" / "runs").glob("*/manifest.json"):
        man = json.loads(path.read_text())
        ledger = man["privacy_ledger"][0]
        if ledger["unit"] == "none":
            continue
        eps = man["config"]["mechanism"]["epsilon"]
        assert man["batch"]["replicas"] > 1 and ledger["noise"]["clip"] == 10.0
        if ledger["accountant"] == "paper":
            b = (math.sqrt(L + eps) - math.sqrt(L)) ** 2 / (2 * 5000 * 10.0**2)
            assert ledger["noise"]["precision_bound"] == pytest.approx(b, rel=1e-9)
        assert Ledger.from_dict(ledger).reaccount().epsilon == pytest.approx(ledger["epsilon"], rel=1e-12)
        assert ledger["epsilon"] <= eps * (1 + 1e-12)
        checked += 1
    assert checked == 3 * 9 * 6 * 2
