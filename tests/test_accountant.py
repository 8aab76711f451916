import math

import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.errors import UnknownNameError, ValidationError
from privdl.privacy import gdp_delta, get_accountant, paper_bound, paper_epsilon, paper_simplified_bound

budgets = st.tuples(st.floats(0.05, 60), st.floats(1e-9, 0.1), st.floats(0.01, 10), st.integers(1, 20_000))


@settings(max_examples=60, deadline=None)
@given(budget=budgets, name=st.sampled_from(["paper", "tight"]))
def test_calibration_never_overshoots_epsilon(budget, name):
    eps, delta, clip, steps = budget
    acc = get_accountant(name)
    b = acc.bound(epsilon=eps, delta=delta, clip=clip, steps=steps)
    assert b > 0
    assert acc.epsilon(bound=b, delta=delta, clip=clip, steps=steps) <= eps
    assert acc.epsilon(bound=b * 1.001, delta=delta, clip=clip, steps=steps) > eps * (1 - 1e-9)  # and it is not needlessly loose


@settings(max_examples=60, deadline=None)
@given(budget=budgets)
def test_tight_bound_is_at_least_the_paper_bound(budget):
    eps, delta, clip, steps = budget
    assert get_accountant("tight").bound(epsilon=eps, delta=delta, clip=clip, steps=steps) >= get_accountant("paper").bound(
        epsilon=eps, delta=delta, clip=clip, steps=steps) * (1 - 1e-9)


def test_paper_bound_is_the_exact_inverse_of_theorem_2():
    eps, delta, clip, steps = 10.0, 1e-5, 0.1, 5000
    L = math.log(1 / delta)
    b = paper_bound(epsilon=eps, delta=delta, clip=clip, steps=steps)
    assert b == pytest.approx((math.sqrt(L + eps) - math.sqrt(L)) ** 2 / (2 * steps * clip**2), rel=1e-12)
    assert paper_epsilon(bound=b, delta=delta, clip=clip, steps=steps) == pytest.approx(eps, rel=1e-12)


def test_simplified_paper_bound_is_invalid_for_large_epsilon():
    # SPEC §2: eps^2/(16 C^2 T L) is stricter than the exact bound for small eps, but not valid above ~2.34 L
    assert paper_simplified_bound(epsilon=5, delta=1e-5, clip=0.1, steps=5000) < paper_bound(epsilon=5, delta=1e-5, clip=0.1, steps=5000)
    assert paper_epsilon(bound=paper_simplified_bound(epsilon=40, delta=1e-5, clip=0.1, steps=5000), delta=1e-5, clip=0.1, steps=5000) > 40


def test_tight_gain_range_matches_spec():
    ratios = [get_accountant("tight").bound(epsilon=e, delta=1e-5, clip=0.1, steps=5000) / get_accountant("paper").bound(epsilon=e, delta=1e-5, clip=0.1, steps=5000)
              for e in (40, 1)]
    assert ratios[0] == pytest.approx(1.14, abs=0.01) and ratios[1] == pytest.approx(1.73, abs=0.01)


@pytest.mark.parametrize("eps,delta", [(0.5, 1e-5), (1.0, 1e-5), (3.0, 1e-6), (8.0, 1e-3)])
def test_tight_accountant_at_one_step_matches_the_analytic_gaussian_mechanism(eps, delta):
    clip = 0.7
    b = get_accountant("tight").bound(epsilon=eps, delta=delta, clip=clip, steps=1)
    sigma = 1 / math.sqrt(b)
    # dp_accounting's analytic Gaussian (Balle & Wang 2018) with sensitivity 2C: noise sigma / (2C) per unit
    assert dp_accounting.get_epsilon_gaussian(sigma / (2 * clip), delta) == pytest.approx(eps, rel=1e-6)


def test_tight_accountant_over_many_steps_matches_pld_accounting():
    clip, steps, delta = 0.1, 500, 1e-5
    b = get_accountant("tight").bound(epsilon=5.0, delta=delta, clip=clip, steps=steps)
    z = 1 / (math.sqrt(b) * 2 * clip)  # noise multiplier relative to sensitivity 2C
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(z), steps)
    assert pld.get_epsilon(delta) == pytest.approx(5.0, rel=2e-3)


def test_gdp_delta_is_monotone():
    assert gdp_delta(epsilon=1.0, mu=0.5) < gdp_delta(epsilon=1.0, mu=1.0) < gdp_delta(epsilon=1.0, mu=2.0)
    assert gdp_delta(epsilon=2.0, mu=1.0) < gdp_delta(epsilon=1.0, mu=1.0)


@pytest.mark.parametrize("kwargs,match", [
    ({"epsilon": 0.0}, "epsilon"), ({"epsilon": -1.0}, "epsilon"), ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"), ({"clip": 0.0}, "clip"), ({"steps": 0}, "steps"),
])
def test_bad_budget_inputs_are_rejected(kwargs, match):
    args = {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, "steps": 10} | kwargs
    with pytest.raises(ValidationError, match=match):
        get_accountant("tight").bound(**args)


def test_unknown_accountant_lists_valid_names():
    with pytest.raises(UnknownNameError, match="paper, tight"):
        get_accountant("renyi")


@pytest.mark.parametrize("eps,delta,clip,steps", [(1.0, 1e-5, 0.7, 1), (5.0, 1e-5, 0.1, 500)])
def test_public_tight_epsilon_is_the_accountants_and_dp_accountings(eps, delta, clip, steps):
    """privacy.tight_epsilon (μ = 2C√(Tb)) against the accountant object and, independently, dp_accounting."""
    from privdl import privacy

    b = privacy.tight_bound(epsilon=eps, delta=delta, clip=clip, steps=steps)
    assert privacy.tight_epsilon(bound=b, delta=delta, clip=clip, steps=steps) == pytest.approx(eps, rel=1e-9)
    z = 1 / (math.sqrt(b) * 2 * clip)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(z), steps)
    assert privacy.tight_epsilon(bound=b, delta=delta, clip=clip, steps=steps) == pytest.approx(
        pld.get_epsilon(delta), rel=2e-3)
    assert privacy.gdp_mu(bound=b, clip=clip, steps=steps) == pytest.approx(math.sqrt(steps) / z)
