"""PLD accounting of example-level DP (issue 34, part 3): dp_accounting's privacy-loss-distribution accountant beside
RDP — never above RDP's ε, equal to the exact Gaussian mechanism's at q = 1, calibration that never overshoots and is
tight, a run whose ledger names it and re-accounts with it, the config keys and their defaults (reproductions stay on
RDP and keep their run ids), the CLI, and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy import optimize
from scipy.stats import norm
from typer.testing import CliRunner

from privdl.cli import app
from privdl.errors import ConfigError, ValidationError
from privdl.mechanisms import make_mechanism
from privdl.privacy import example_accountant as ea
from privdl.privacy.accountants import ACCOUNTANTS
from privdl.privacy.events import GaussianEvent, SubsampledGaussianEvent
from privdl.privacy.example_accountant import (
    DEFAULT_EXAMPLE_ACCOUNTANT, calibrate_noise_multiplier, pld_epsilon, rdp_epsilon,
)
from privdl.tasks import make_task

DELTA = 1e-5


# ---- the accountant --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.8, 1.5, 5.0])
@pytest.mark.parametrize("q", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("steps", [1, 100, 1000])
def test_pld_epsilon_is_never_above_rdp(sigma, q, steps):
    """Both are upper bounds of the same mechanism's ε; PLD is tight up to its discretisation, RDP loses in its
    conversion to (ε, δ): on the whole grid PLD's is at most RDP's (and strictly below it)."""
    pld, interval = pld_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
    rdp, _ = rdp_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
    assert 0 < pld < rdp and 0 < interval < 1


def test_pld_at_the_published_vector_is_below_the_published_rdp_value():
    """q = 0.04, σ = 1.5, T = 2250, δ = 1e-5: the RDP literature's ε ≈ 7.329 (Abadi et al.'s vector; privdl's RDP
    matches it, tests/test_example_accountant.py); PLD's is 7.6 % below it, and dp_accounting's PLD accountant at a
    fixed fine interval agrees with the adaptive one."""
    import dp_accounting

    pld, _ = pld_epsilon(noise_multiplier=1.5, sample_rate=0.04, steps=2250, delta=DELTA)
    fine = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    fine.compose(dp_accounting.PoissonSampledDpEvent(0.04, dp_accounting.GaussianDpEvent(1.5)), 2250)
    assert pld < 7.329 and pld == pytest.approx(6.770, abs=1e-3)
    assert pld == pytest.approx(fine.get_epsilon(DELTA), rel=1e-3) and pld >= fine.get_epsilon(DELTA) * (1 - 1e-4)


def exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact ε at δ of one Gaussian mechanism of sensitivity 1 and noise σ (Balle & Wang 2018, Thm. 8):
    δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ), solved for ε (an independent closed form, not dp_accounting)."""
    def gap(eps: float) -> float:
        a = norm.logcdf(0.5 / sigma - eps * sigma)
        b = eps + norm.logcdf(-0.5 / sigma - eps * sigma)
        return math.exp(a) * -math.expm1(b - a) - delta

    return optimize.brentq(gap, 0.0, 1e4, xtol=1e-13, rtol=1e-14)


@pytest.mark.parametrize("sigma,steps,delta", [(0.8, 1, 1e-5), (1.5, 100, 1e-5), (5.0, 1000, 1e-5), (40.0, 100, 1e-5),
                                               (2.0, 10, 1e-3), (1.0, 1, 1e-7)])
def test_pld_at_q_1_is_the_exact_gaussian_mechanism(sigma, steps, delta):
    """At q = 1, T steps of N(0, σ²) noise on a sensitivity-1 sum are one Gaussian mechanism of noise σ/√T, whose
    exact ε is known in closed form: PLD matches it to 1e-4 and is never below it (a pessimistic upper bound)."""
    exact = exact_gaussian_epsilon(sigma / math.sqrt(steps), delta)
    pld, _ = pld_epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=steps, delta=delta)
    assert pld == pytest.approx(exact, rel=1e-4)
    assert pld >= exact * (1 - 1e-9)


def test_pld_accountant_is_registered_and_composes_event_lists():
    """``pld`` accounts what ``rdp`` accounts — Gaussian and subsampled Gaussian events, alone or composed — and a
    composition of two halves is the whole."""
    acc = ACCOUNTANTS.get("pld")
    assert acc.name == "pld" and "dp_accounting" in acc.reference
    whole = [SubsampledGaussianEvent(noise_multiplier=1.2, sample_rate=0.05, count=200)]
    halves = [SubsampledGaussianEvent(noise_multiplier=1.2, sample_rate=0.05, count=100)] * 2
    assert acc.account(whole, delta=DELTA) == pld_epsilon(noise_multiplier=1.2, sample_rate=0.05, steps=200,
                                                          delta=DELTA)[0]
    assert acc.account(halves, delta=DELTA) == pytest.approx(acc.account(whole, delta=DELTA), rel=1e-3)
    mixed = [GaussianEvent(precision=4.0, sensitivity=0.2, count=50), *whole]  # z = 1/(Δ√m) = 2.5
    assert acc.account(mixed, delta=DELTA) < ACCOUNTANTS.get("rdp").account(mixed, delta=DELTA)
    assert acc.account(mixed, delta=DELTA) > acc.account(whole, delta=DELTA)


# ---- calibration -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps,q,steps", [(1.0, 1.0, 100), (3.0, 0.1, 100), (2.0, 0.08, 7)])
def test_pld_calibration_never_overshoots_and_is_tight(eps, q, steps):
    """The calibrated σ re-accounts to ε ≤ target; 0.1 % less noise would break it; it is below RDP's σ for the same
    target — RDP's ε at it is above the target: the same guarantee for less noise — and within 20 % of it."""
    sigma = calibrate_noise_multiplier(epsilon=eps, sample_rate=q, steps=steps, delta=DELTA, accountant="pld")
    assert pld_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)[0] <= eps
    assert pld_epsilon(noise_multiplier=sigma * 0.999, sample_rate=q, steps=steps, delta=DELTA)[0] > eps
    assert rdp_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)[0] > eps
    assert rdp_epsilon(noise_multiplier=sigma / 0.8, sample_rate=q, steps=steps, delta=DELTA)[0] <= eps


def test_pld_calibration_guard_holds_when_the_library_search_undershoots(monkeypatch):
    """If dp_accounting's search returned a σ 3 % too small, the guard raises it until the PLD ε meets the target."""
    real = ea.mechanism_calibration.calibrate_dp_mechanism
    monkeypatch.setattr(ea.mechanism_calibration, "calibrate_dp_mechanism", lambda *a, **k: 0.97 * real(*a, **k))
    ea._calibrate_pld.cache_clear()
    try:
        sigma = calibrate_noise_multiplier(epsilon=2.0, sample_rate=1.0, steps=30, delta=DELTA, accountant="pld")
        assert pld_epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=30, delta=DELTA)[0] <= 2.0
    finally:
        ea._calibrate_pld.cache_clear()


# ---- runs: dp_sgd, DPDL, the correlated mechanisms' Poisson lots ----------------------------------------------------
def _config(**mechanism) -> dict:
    return {"name": "pld", "iterations": 6, "eval_every": 6, "dtype": "float64",
            "task": {"name": "softmax", "dataset": "digits", "batch_size": 8},
            "network": {"topology": "ring", "n": 4}, "algorithm": {"name": "dsgt"},
            "mechanism": {"name": "dp_sgd", "epsilon": 2.0, "delta": DELTA, "clip": 1.0, "lot_size": 20,
                          "sample_rate": 0.1, **mechanism},
            "schedule": {"name": "constant", "eta": 0.1}}


def test_a_dp_sgd_run_is_calibrated_accounted_and_re_accounted_with_pld(tmp_path):
    """A new config without ``accountant`` runs PLD: the effective config records it, the ledger names it, every
    agent's ε is ≤ the target and equal to dp_accounting's PLD accountant's at a fixed fine interval, and ``privdl
    account --manifest`` re-accounts it with PLD to the stated ε, bit for bit."""
    import dp_accounting

    from privdl.experiment import run_experiment

    assert DEFAULT_EXAMPLE_ACCOUNTANT == "pld"
    run_experiment(_config(), tmp_path / "out", progress=False)
    (path,) = (tmp_path / "out" / "runs").glob("*/manifest.json")
    man = json.loads(path.read_text())
    assert man["config"]["mechanism"]["accountant"] == "pld"
    stated = man["privacy_ledger"][0]
    assert stated["accountant"] == "pld" and stated["unit"] == "example" and 1.99 < stated["epsilon"] <= 2.0
    (sigma,) = {row["noise_multiplier"] for row in stated["per_agent"]}  # one public rate: one σ
    fine = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)  # dp_accounting itself, fixed interval
    fine.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(sigma)), 7)
    for row in stated["per_agent"]:
        assert row["accesses"] == 7  # DSGT: T + 1
        assert row["epsilon"] == pytest.approx(fine.get_epsilon(DELTA), rel=1e-3)
    res = CliRunner().invoke(app, ["account", "--manifest", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["accountant"] == "pld" and out["verified"] and out["epsilon"] == stated["epsilon"]
    # the same noise under RDP is a weaker statement: the PLD ledger is not re-accountable as an RDP one
    from privdl.privacy.ledger import Ledger

    assert Ledger.from_dict(stated).reaccount("rdp").epsilon > stated["epsilon"]


def test_dpdl_with_self_noise_meets_its_target_under_pld():
    """DPDL's cross-gradients and noised self-gradients go through dp_sgd: calibrated per owner over T·deg + T
    accesses with PLD, the ledger names PLD and every owner re-accounts to ε ≤ 3."""
    from privdl.algorithms import make_algorithm
    from privdl.network import Network
    from privdl.privacy.ledger import statement

    net = Network.from_topology("ring", 4)
    task = make_task("softmax", 4, dataset="digits", batch_size=8, dtype=torch.float64)
    alg = make_algorithm("dpdl", self_noise=True)
    mech = make_mechanism("dp_sgd", steps=alg.accesses(3, net.edges), task=task, epsilon=3.0, delta=DELTA,
                          clip=1.0, lot_size=16, sample_rate=0.2)
    ledger = statement(mech, alg, iterations=3, edges=net.edges)
    assert ledger.accountant == "pld" and mech.calls.sum() == 0
    assert all(2.99 < e <= 3.0 for e in ledger.reaccount().epsilons)


def test_correlated_poisson_lots_use_the_named_example_accountant():
    """The correlated designs with per-example clipping and Poisson lots: calibrated and accounted with PLD by
    default (less noise for the same ε than RDP: RDP's ε of that noise is above the target), with RDP when named;
    each never overshoots, and the agent-level ε beside it keeps its own accountant."""
    from privdl.network import Network

    net = Network.from_topology("complete", 2)
    task = make_task("softmax", 2, dataset="digits", batch_size=16, dtype=torch.float64)  # 719 examples each
    kw = dict(steps=20, network=net, task=task, clip=0.1, epsilon=3.0, delta=DELTA, clipping="per_example",
              sampling="poisson")
    pld, rdp = make_mechanism("ldp", **kw).ledger(), make_mechanism("ldp", example_accountant="rdp", **kw).ledger()
    assert pld.accountant == "pld" and rdp.accountant == "rdp" and pld.beside[0].accountant == "tight"
    assert 2.99 < max(pld.epsilons) <= 3.0 and 2.99 < max(rdp.epsilons) <= 3.0
    assert pld.reaccount("rdp").epsilon > 3.0  # the PLD-calibrated noise is less than RDP would ask for


# ---- configs: the key, its default, run ids, reproductions ----------------------------------------------------------
def test_the_accountant_key_is_recorded_and_rdp_keeps_the_runs_made_before_it():
    """The effective config records the accountant; ``accountant = "rdp"`` — what every run made before the key
    existed used — hashes to the id such a run has (the config without the key), the default (PLD) to another."""
    from privdl.experiment.config import expand
    from privdl.experiment.run_identity import _digest, identity, run_id

    (new,), _ = expand(_config())
    (old,), _ = expand(_config(accountant="rdp"))
    assert new.config["mechanism"]["accountant"] == "pld" and old.config["mechanism"]["accountant"] == "rdp"
    before = {**old.config, "mechanism": {k: v for k, v in old.config["mechanism"].items() if k != "accountant"}}
    assert old.run_id == run_id(before) == _digest(identity(before)) != new.run_id


def test_every_reproduction_names_the_rdp_accountant():
    """Seed 004's tables, DPDL's benchmark and the seed-004 example name RDP in every dp_sgd mechanism they run, so
    their committed numbers (and run ids) stay."""
    from pathlib import Path

    from privdl.experiment import load_config
    from privdl.experiment.config import expand
    from privdl.reproductions.common import packaged_config

    root = Path(__file__).resolve().parents[1]
    configs = [packaged_config("table1"), packaged_config("dpdl"),
               load_config(root / "examples" / "dp_dsgt_fmnist.toml")]
    for cfg in configs:
        mechs = [s.config["mechanism"] for s in expand(cfg)[0] if s.config["mechanism"]["name"] == "dp_sgd"]
        assert mechs and all(m["accountant"] == "rdp" for m in mechs)


# ---- the CLI ---------------------------------------------------------------------------------------------------------
def test_account_example_level_with_pld():
    """``privdl account --unit example --accountant pld``: σ → the PLD ε (and its discretisation interval), ε → the
    calibrated σ; the library's numbers, and the default at the example level."""
    run = CliRunner().invoke
    args = ["account", "--unit", "example", "--sample-rate", "1", "--steps", "100", "--format", "json"]
    res = run(app, [*args, "--accountant", "pld", "--noise-multiplier", "40"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["accountant"] == "pld" and "value_discretization_interval" in out and "order" not in out
    assert out["epsilon"] == pld_epsilon(noise_multiplier=40.0, sample_rate=1.0, steps=100, delta=DELTA)[0]
    res = run(app, [*args, "--epsilon", "1"])  # no --accountant: pld
    out = json.loads(res.output)
    assert res.exit_code == 0 and out["accountant"] == "pld" and out["epsilon"] <= 1.0
    assert out["noise_multiplier"] == calibrate_noise_multiplier(epsilon=1.0, sample_rate=1.0, steps=100,
                                                                 delta=DELTA, accountant="pld")


# ---- bad input -------------------------------------------------------------------------------------------------------
def test_a_discretisation_that_cannot_reach_the_target_is_refused_saying_why():
    with pytest.raises(ValidationError, match=r"interval 1 cannot reach ε = 0.5 .*even σ = 10000 accounts to ε"):
        calibrate_noise_multiplier(epsilon=0.5, sample_rate=0.04, steps=100, delta=DELTA, accountant="pld",
                                   value_discretization_interval=1.0)
    res = CliRunner().invoke(app, ["account", "--unit", "example", "--epsilon", "0.5", "--sample-rate", "0.04",
                                   "--steps", "100", "--pld-interval", "1"])
    assert res.exit_code == 2 and "cannot reach" in res.output
    with pytest.raises(ValidationError, match="no noise multiplier up to"):  # unreachable at any interval
        calibrate_noise_multiplier(epsilon=1e-6, sample_rate=1.0, steps=1000, delta=DELTA, accountant="pld")


@pytest.mark.parametrize("interval,words", [(0.0, "finite number > 0"), (-1e-3, "finite number > 0"),
                                            (math.nan, "finite number > 0"), (math.inf, "finite number > 0"),
                                            (1e-9, "finer than 1e-06")])
def test_bad_discretisation_intervals_are_refused(interval, words):
    with pytest.raises(ValidationError, match=words):
        pld_epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=DELTA,
                    value_discretization_interval=interval)


def test_unknown_or_misplaced_accountants_are_refused_with_the_valid_names():
    from privdl.experiment.config import expand
    from privdl.network import Network

    with pytest.raises(ConfigError, match=r"mechanism.accountant.*'prv'.*valid names: pld, rdp"):
        expand(_config(accountant="prv"))
    task = make_task("softmax", 2, dataset="digits")
    with pytest.raises(ValidationError, match="unknown accountant 'tight'; valid names: rdp, pld"):
        make_mechanism("dp_sgd", steps=3, task=task, epsilon=1.0, lot_size=8, accountant="tight")
    with pytest.raises(ValidationError, match="applies to the pld accountant only"):
        calibrate_noise_multiplier(epsilon=1.0, sample_rate=0.1, steps=10, delta=DELTA,
                                   value_discretization_interval=1e-3)
    with pytest.raises(ValidationError, match="unknown example-level accountant 'paper'"):
        calibrate_noise_multiplier(epsilon=1.0, sample_rate=0.1, steps=10, delta=DELTA, accountant="paper")
    with pytest.raises(ValidationError, match="example_accountant applies to sampling = 'poisson'"):
        make_mechanism("ldp", steps=3, network=Network.from_topology("ring", 3), clip=1.0, epsilon=1.0,
                       example_accountant="rdp")
    run = CliRunner().invoke
    example = ["account", "--unit", "example", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "10"]
    res = run(app, [*example, "--accountant", "tight"])
    assert res.exit_code == 2 and "agent-level accountant" in res.output and "pld (the default) or rdp" in res.output
    res = run(app, [*example, "--accountant", "rdp", "--pld-interval", "1e-3"])
    assert res.exit_code == 2 and "--pld-interval applies to --unit example --accountant pld" in res.output
    res = run(app, ["account", "--epsilon", "1", "--clip", "0.1", "--steps", "10", "--accountant", "pld"])
    assert res.exit_code == 2 and "example-level accountant" in res.output
    res = run(app, ["account", "--manifest", "m.json", "--accountant", "rdp"])
    assert res.exit_code == 2 and "the accountant the run's ledger names" in res.output


def test_a_grid_stored_before_pld_was_the_default_still_finds_its_rdp_runs(tmp_path):
    """An experiment.json written before the ``accountant`` key existed names none, and expands today to PLD; its
    runs were made under RDP (their ids leave "rdp" out). ``finished_runs`` takes them as the grid's runs — unless the
    folder also holds a run of the point under today's id, which then wins (never both of one point)."""
    from privdl.experiment import run_experiment
    from privdl.reproductions.common import finished_runs

    out = tmp_path / "out"
    run_experiment(_config(accountant="rdp"), out, progress=False)
    stored = json.loads((out / "experiment.json").read_text())
    stored["mechanism"].pop("accountant", None)  # as privdl wrote it before the key existed
    (out / "experiment.json").write_text(json.dumps(stored))
    (old,) = finished_runs(out)
    assert old.config["mechanism"].get("accountant", "rdp") == "rdp"
    run_experiment(_config(), out, progress=False)  # the same point under today's default: PLD, another run id
    (new,) = finished_runs(out)
    assert new.run_id != old.run_id and new.config["mechanism"]["accountant"] == "pld"
