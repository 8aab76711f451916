"""Audits (SPEC §8): the ε lower-bound estimators on mechanisms with known ε, and the membership audit end to end
(it must flag deliberately broken mechanisms and not flag the correct one)."""

import math

import numpy as np
import pytest
from scipy import stats

from privdl.audit import (
    AuditSetup, clopper_pearson, membership_audit, one_run_audit, one_run_epsilon, one_run_p_value, threshold_audit,
)
from privdl.errors import ValidationError


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact ε(δ) of the Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018), by root finding."""
    f = lambda e: stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2) - delta  # noqa
    from scipy.optimize import brentq
    return brentq(f, 0, 50)


def test_clopper_pearson_matches_the_beta_quantiles_and_covers():
    lo, hi = clopper_pearson(np.array([0, 5, 20]), 20, 0.95)
    assert lo[0] == 0 and hi[2] == 1
    assert lo[1] == pytest.approx(stats.beta.ppf(0.025, 5, 16)) and hi[1] == pytest.approx(stats.beta.ppf(0.975, 6, 15))
    rng = np.random.default_rng(0)
    k = rng.binomial(50, 0.3, size=4000)
    lo, hi = clopper_pearson(k, 50)
    assert np.mean((lo <= 0.3) & (0.3 <= hi)) >= 0.95  # conservative coverage


def test_randomized_response_bound_approaches_its_epsilon():
    eps, n = 1.5, 40_000
    p = math.exp(eps) / (1 + math.exp(eps))
    rng = np.random.default_rng(1)
    s_in = (rng.random(n) < p).astype(float)  # says "in" with probability p when in
    s_out = (rng.random(n) < 1 - p).astype(float)
    res = threshold_audit(s_in, s_out, delta=0.0)
    assert res.epsilon_lower <= eps and res.epsilon_lower > eps - 0.1


@pytest.mark.parametrize("mu,delta", [(1.0, 1e-2), (2.0, 1e-3)])
def test_gaussian_mechanism_bound_is_valid_and_close(mu, delta):
    true_eps = gaussian_epsilon(mu, delta)
    rng = np.random.default_rng(2)
    n = 200_000
    res = threshold_audit(rng.normal(mu, 1, n), rng.normal(0, 1, n), delta)
    # the best threshold test, max_τ log((Φ(μ − τ) − δ)/Φ(−τ)), over thresholds whose FPR the test models can
    # measure (≥ 50 false positives expected); over all τ it equals the true ε (threshold tests are optimal here)
    taus = np.linspace(-3, 8, 4000)
    with np.errstate(invalid="ignore", divide="ignore"):
        curve = np.log((stats.norm.sf(taus - mu) - delta) / stats.norm.sf(taus))
    assert np.nanmax(curve) == pytest.approx(true_eps, abs=1e-3)
    ideal = np.nanmax(np.where(stats.norm.sf(taus) * res.n_out >= 50, curve, np.nan))
    assert res.epsilon_lower <= true_eps
    assert res.epsilon_lower >= ideal - 0.35, (res.epsilon_lower, ideal, true_eps)


def test_no_signal_gives_no_bound_most_of_the_time():
    rng = np.random.default_rng(3)
    hits = [threshold_audit(rng.normal(0, 1, 500), rng.normal(0, 1, 500), 1e-5, seed=s).epsilon_lower > 0
            for s in range(40)]
    assert np.mean(hits) <= 0.1


def test_one_run_bound_against_randomized_response():
    """m canaries through ε-randomized response: the one-run bound stays below ε and gets close with many."""
    eps, m = 2.0, 20_000
    rng = np.random.default_rng(4)
    included = rng.random(m) < 0.5
    keep = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
    said_in = np.where(keep, included, ~included)
    scores = said_in + 1e-6 * rng.random(m)  # ties broken at random
    res = one_run_audit(scores, included, delta=0.0, guesses=(m // 2,))
    assert res.epsilon_lower <= eps and res.epsilon_lower > eps - 0.15
    # the δ term only makes the bound more conservative
    assert one_run_epsilon(m, 2000, 1700, 1e-6) <= one_run_epsilon(m, 2000, 1700, 0.0)
    assert one_run_p_value(100, 10, 5, 0.0, 0.0) == pytest.approx(stats.binom.sf(4, 10, 0.5))


def test_estimators_refuse_bad_input():
    with pytest.raises(ValidationError):
        threshold_audit(np.array([1.0]), np.array([0.0, 1.0]), 1e-5)
    with pytest.raises(ValidationError):
        one_run_p_value(5, 6, 1, 1.0, 0.0)
    with pytest.raises(ValidationError):
        AuditSetup(broken="sometimes").check()


@pytest.fixture(scope="module")
def audits():
    out = {}
    for broken in ("none", "noise", "clip"):
        setup = AuditSetup(algorithm="central", model="softmax", dataset="digits", per_class=30, iterations=60,
                           canary="bright", broken=broken)
        out[broken] = membership_audit(setup, models=200, batch=400)
    return out


@pytest.mark.slow
def test_audit_does_not_flag_the_correct_mechanism(audits):
    res = audits["none"]
    assert not res.violation and res.threshold.epsilon_lower <= 1.0
    assert res.ledger[0]["unit"] == "example" and res.ledger[0]["epsilon"] <= 1.0


@pytest.mark.parametrize("broken", ["noise", "clip"])
@pytest.mark.slow
def test_audit_flags_a_broken_mechanism(audits, broken):
    res = audits[broken]
    assert res.violation and res.threshold.epsilon_lower > 1.0, res.threshold
    assert "BROKEN" in res.ledger[0]["note"]


@pytest.mark.slow
def test_audit_measures_methods_that_claim_no_guarantee():
    """DSG-RMS states no ε (obfuscation only): the audit runs it without a DP mechanism, reports nominal ε = ∞, never
    calls it a violation, and its lower bound shows what membership inference gets — with the bright canary, far
    more than the ε = 1 the DP methods above are held to. Breaking a mechanism it does not have is refused."""
    setup = AuditSetup(algorithm="dsg_rms", model="softmax", dataset="digits", per_class=30, iterations=60,
                       canary="bright")
    res = membership_audit(setup, models=200, batch=400)
    assert res.nominal_epsilon == float("inf") and not res.violation
    assert "obfuscation, no DP guarantee" in res.ledger[0]["guarantee"]
    assert res.threshold.epsilon_lower > 1.0, res.threshold
    with pytest.raises(ValidationError, match="no DP mechanism"):
        AuditSetup(algorithm="pd_lms", broken="noise").check()


def test_audit_runs_both_forms_of_dpdl_and_states_what_each_guarantees():
    """DPDL's published form (un-noised self-gradient) has no overall ε — the ledger says so and keeps the ε of the
    cross-gradients alone; with self-noise the nominal ε holds for every access."""
    out = {}
    for alg in ("dpdl", "dpdl_self_noise"):
        setup = AuditSetup(algorithm=alg, model="softmax", dataset="digits", per_class=30, iterations=20,
                           canary="bright")
        out[alg] = membership_audit(setup, models=20, batch=40)
    published, noised = out["dpdl"].ledger[0], out["dpdl_self_noise"].ledger[0]
    assert published["epsilon"] in ("inf", float("inf")) and "no overall ε" in published["note"]
    assert "the noisy accesses alone: ε = 1" in published["note"]
    assert 0.99 < noised["epsilon"] <= 1.0 and noised["unit"] == "example"
