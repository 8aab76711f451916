"""Privacy as events (DESIGN.md "privacy accounting"): accountants say which events they support; a finished run's
manifest is re-accounted from its events alone and gives the run's stated ε (checked against dp_accounting and the
closed forms directly, not against privdl's own numbers); numeric public APIs are keyword-only."""

from __future__ import annotations

import inspect
import json
import math

import dp_accounting
import pytest
from typer.testing import CliRunner

from privdl.cli import app
from privdl.privacy import (
    GaussianEvent, Ledger, NonPrivateEvent, ObfuscationEvent, SubsampledGaussianEvent, UnsupportedEventError,
)
from privdl.privacy.accountants import ACCOUNTANTS

CONFIG = """
name = "ledger"
iterations = 6
seed = 3
[network]
topology = "ring"
n = 4
[task]
name = "softmax"
dataset = "digits"
partition = "dirichlet"
alpha = 0.5
batch_size = 16
[algorithm]
name = "dsgt"
[schedule]
name = "constant"
eta = 0.05
[[sweep.privacy]]
label = "dp_sgd"
mechanism = { name = "dp_sgd", epsilon = 2.0, delta = 1e-5, clip = 1.0, lot_size = 20, accountant = "rdp" }
[[sweep.privacy]]
label = "whisper"
mechanism = { name = "whisper", epsilon = 3.0, delta = 1e-5, clip = 0.5, accountant = "paper" }
[[sweep.privacy]]
label = "none"
mechanism = { name = "none" }
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from privdl.experiment import load_config, run_experiment

    root = tmp_path_factory.mktemp("ledger")
    (root / "exp.toml").write_text(CONFIG)
    run_experiment(load_config(root / "exp.toml"), root / "out", progress=False)
    found = {}
    for path in (root / "out" / "runs").glob("*/manifest.json"):
        man = json.loads(path.read_text())
        found[man["sweep"]["privacy"]] = path
    return found


def _account(path):
    res = CliRunner().invoke(app, ["account", "--manifest", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.slow
def test_reaccounting_a_dp_sgd_manifest_gives_its_stated_epsilon(runs):
    stated = json.loads(runs["dp_sgd"].read_text())["privacy_ledger"][0]
    out = _account(runs["dp_sgd"])
    assert out["epsilon"] == stated["epsilon"] and out["unit"] == "example" and out["accountant"] == "rdp"
    assert len(out["per_agent"]) == 4
    for row in out["per_agent"]:
        assert {"agent", "epsilon", "delta", "noise_multiplier", "sample_rate", "accesses"} <= set(row)
        assert row["accesses"] == 7  # DSGT: T + 1
        acc = dp_accounting.rdp.RdpAccountant()  # dp_accounting itself, default orders
        acc.compose(dp_accounting.PoissonSampledDpEvent(row["sample_rate"],
                                                        dp_accounting.GaussianDpEvent(row["noise_multiplier"])), 7)
        assert row["epsilon"] <= 2.0 and acc.get_epsilon(1e-5) == pytest.approx(row["epsilon"], rel=2e-2)
    assert out["epsilon"] == max(r["epsilon"] for r in out["per_agent"])


def test_reaccounting_a_correlated_noise_manifest_gives_its_stated_epsilon(runs):
    stated = json.loads(runs["whisper"].read_text())["privacy_ledger"][0]
    out = _account(runs["whisper"])
    assert out["epsilon"] == pytest.approx(stated["epsilon"], rel=1e-12) and out["epsilon"] <= 3.0
    L = math.log(1e5)
    for row in out["per_agent"]:
        z = row["noise_multiplier"]  # 1/(2C√m): seed 001 Theorem 2 with m = 1/(2Cz)²
        m = 1 / (2 * 0.5 * z) ** 2
        eps = 2 * 0.5**2 * 7 * m + 2 * 0.5 * math.sqrt(2 * 7 * m * L)
        assert row["epsilon"] == pytest.approx(eps, rel=1e-9) and row["accesses"] == 7


def test_a_non_private_run_is_stated_as_such(runs):
    out = _account(runs["none"])
    assert out["epsilon"] == "inf" and out["unit"] == "none" and "non-private" in out["guarantee"]


def test_account_manifest_errors_are_clear(tmp_path):
    res = CliRunner().invoke(app, ["account", "--manifest", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())
    (tmp_path / "bad.json").write_text("{}")
    res = CliRunner().invoke(app, ["account", "--manifest", str(tmp_path / "bad.json")])
    assert res.exit_code == 2 and "privacy ledger" in " ".join(res.output.split())


def test_accountants_say_which_events_they_support():
    g, s = GaussianEvent(precision=2.0, sensitivity=0.5, count=3), SubsampledGaussianEvent(1.2, 0.1, 5)
    assert ACCOUNTANTS.get("tight").supports(g) and not ACCOUNTANTS.get("tight").supports(s)
    assert ACCOUNTANTS.get("rdp").supports(s) and ACCOUNTANTS.get("rdp").supports(g)
    with pytest.raises(UnsupportedEventError, match="subsampling"):
        ACCOUNTANTS.get("paper").account([s], delta=1e-5)
    # tight = exact GDP composition: μ² = Σ count/z²
    z = g.noise_multiplier
    assert z == pytest.approx(1 / (0.5 * math.sqrt(2.0)))
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(z), 3)
    assert ACCOUNTANTS.get("tight").account([g], delta=1e-5) == pytest.approx(pld.get_epsilon(1e-5), rel=2e-3)


def test_obfuscation_has_no_epsilon_and_non_private_use_is_infinite():
    led = Ledger.build(unit="agent", mechanism="rms", accountant="tight", delta=1e-5,
                       events=[[ObfuscationEvent("rms", "random step sizes")], [GaussianEvent(1.0, 1.0, 2)]])
    assert led.epsilons[0] is None and led.epsilon is None and "no DP guarantee" in led.guarantee
    again = Ledger.from_dict(json.loads(json.dumps(led.to_dict()))).reaccount()
    assert again.epsilons[0] is None and again.epsilons[1] == pytest.approx(led.epsilons[1])
    led2 = Ledger.build(unit="none", mechanism="none", accountant="none", delta=0.0,
                        events=[[NonPrivateEvent(count=3)], []])
    assert led2.epsilons == [math.inf, 0.0] and led2.to_dict()["epsilon"] == "inf"


def _numeric_apis():
    from privdl import privacy
    from privdl.covariance import design_covariance
    from privdl.covariance.hbc import solve_hbc
    from privdl.covariance.problem import verify_covariance
    from privdl.covariance.reference import solve_official, solve_precision
    from privdl.covariance.seeds import coalition_precisions, coalition_worst_ratio
    from privdl.privacy.agent_accountant import gdp_epsilon_many, gdp_mu_for

    tight = privacy.get_accountant("tight")
    return {
        privacy.rdp_epsilon: (1.5, 0.04, 2250, 1e-5), privacy.calibrate_noise_multiplier: (1.0, 0.04, 100, 1e-5),
        privacy.paper_epsilon: (0.01, 1e-5, 0.1, 100), privacy.paper_bound: (10.0, 1e-5, 0.1, 100),
        privacy.paper_simplified_bound: (10.0, 1e-5, 0.1, 100), privacy.tight_bound: (10.0, 1e-5, 0.1, 100),
        privacy.tight_epsilon: (0.01, 1e-5, 0.1, 100), privacy.gdp_mu: (0.01, 0.1, 100),
        privacy.gdp_delta: (1.0, 1.0), privacy.gdp_epsilon: (1.0, 1e-5), gdp_epsilon_many: ([1.0], 1e-5),
        gdp_mu_for: (1.0, 1e-5), tight.bound: (10.0, 1e-5, 0.1, 100), tight.epsilon: (0.01, 1e-5, 0.1, 100),
        privacy.check_budget: (1.0, 1e-5), design_covariance: ("ldp", [[1.0]], 1.0), solve_hbc: ([[1.0]], 1.0),
        verify_covariance: ([[1.0]], 1.0), solve_official: ([[1.0]], 1.0), solve_precision: ([[1.0]], 1.0),
        coalition_worst_ratio: (1.0, [], 1, 0, 1.0), coalition_precisions: (1.0, [], 1, 0),
    }


@pytest.mark.parametrize("fn,args", list(_numeric_apis().items()), ids=lambda v: getattr(v, "__qualname__", ""))
def test_numeric_public_apis_reject_positional_calls(fn, args):
    """Two swapped numbers would give a silently wrong ε: every budget / noise / bound parameter is keyword-only."""
    numeric = {"epsilon", "delta", "clip", "steps", "bound", "noise_multiplier", "sample_rate", "mu", "precision",
               "coalition_size", "rho"}
    params = inspect.signature(fn).parameters
    named = [p for p in params.values() if p.name in numeric]
    assert named and all(p.kind is p.KEYWORD_ONLY for p in named), [str(p) for p in named]
    with pytest.raises(TypeError):
        fn(*args)
