"""Covariance design (SPEC §3): the dual solver against closed forms and cvxpy references, DECOR, homogeneity,
singular W, bad input, and the honest-but-curious problem (10) with its special cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.covariance import design_covariance, precision_diagonal, solve_dual, verify_covariance
from privdl.covariance.seeds import coalition_worst_ratio, seed_groups
from privdl.errors import ValidationError
from privdl.network import Network

cp = pytest.importorskip("cvxpy", reason="the reference solvers need the optional extra: pip install 'privdl[reference]'")
from privdl.covariance.hbc import solve_hbc  # noqa: E402
from privdl.covariance.reference import solve_official, solve_precision  # noqa: E402


def er(n: int, p: float, seed: int) -> np.ndarray:
    return Network.from_topology("erdos_renyi", n, p=p, seed=seed).W


def test_whisper_matches_both_cvxpy_formulations():
    w, b = er(10, 0.5, 3), 2.0
    ours = design_covariance("whisper", w, bound=b)
    for ref in (solve_official(w, bound=b), solve_precision(w, bound=b)):
        assert abs(ours.trace - ref.trace) <= 1e-5 * ref.trace
    assert ours.duality_gap <= 1e-8 * ours.trace


@settings(max_examples=8, deadline=None)
@given(n=st.integers(4, 12), p=st.floats(0.25, 0.9), seed=st.integers(0, 10_000), b=st.floats(0.01, 100.0))
def test_solver_matches_reference_on_random_graphs(n, p, seed, b):
    w = er(n, p, seed)
    ours = design_covariance("whisper", w, bound=b)
    ref = solve_precision(w, bound=b)
    # the reference is rescaled to feasibility, so it can only be worse than the optimum (up to its accuracy)
    assert ours.trace <= ref.trace * (1 + 1e-5)
    if ours.singular:  # no minimiser: solvers stop short of the infimum, which is ≥ the central-DP bound 1/(nb)
        assert ours.trace >= ours.cdp_lower_bound * (1 - 1e-9)
    else:
        assert ours.trace >= ref.trace * (1 - 1e-5)
    assert ours.max_precision_ratio <= 1 + 1e-9
    assert np.linalg.eigvalsh(ours.R)[0] > 0


@pytest.mark.parametrize("topology,params", [("erdos_renyi", {"p": 0.3}), ("erdos_renyi", {"p": 0.7}),
                                             ("ring", {}), ("star", {}), ("grid", {}), ("complete", {})])
def test_whisper_beats_decor_beats_ldp(topology, params):
    w = Network.from_topology(topology, 16, seed=1, **params).W
    b = 0.5
    designs = {d: design_covariance(d, w, bound=b) for d in ("ldp", "decor", "whisper")}
    traces = {d: x.trace for d, x in designs.items()}
    # singular W (complete graph): the infimum is not attained; both designs stop at a variance cap on null(W)
    # (Whisper: precision floor τ = 1e-6; DECOR: σ_cor²/σ_pair² ≤ 1e6), each within ~1e-6 of the infimum
    slack = 3e-6 if designs["whisper"].singular else 1e-9
    assert traces["whisper"] <= traces["decor"] * (1 + slack)
    assert traces["decor"] <= traces["ldp"] * (1 + 1e-9)
    assert traces["ldp"] == pytest.approx(np.sum(w * w) / b, rel=1e-12)
    assert traces["whisper"] >= 1 / (16 * b) * (1 - 1e-9)  # never below the central-DP bound


def test_complete_graph_reaches_cdp_bound_and_says_singular():
    w = Network.from_topology("complete", 20, mixing="uniform").W
    d = design_covariance("whisper", w, bound=3.0)
    assert d.singular and d.ridge > 0
    assert d.trace == pytest.approx(1 / (20 * 3.0), rel=3e-6)
    assert d.duality_gap <= 3e-6 * d.trace
    assert d.trace >= d.cdp_lower_bound * (1 - 1e-12)
    decor = design_covariance("decor", w, bound=3.0)
    assert decor.trace == pytest.approx(1 / (20 * 3.0), rel=3e-6)  # R_cor ∝ L: pairwise noise is optimal here


def test_homogeneity_and_feasibility():
    w = er(15, 0.4, 7)
    one = design_covariance("whisper", w, bound=1.0)
    for b in (1e-3, 0.37, 250.0):
        d = design_covariance("whisper", w, bound=b)
        np.testing.assert_allclose(d.R, one.R / b, rtol=1e-9)  # (up to the verification margin)
        assert np.max(precision_diagonal(d.R)) <= b * (1 + 1e-9)


def test_dual_certificate_on_independent_graph():
    # a graph where the constraint is tight at every agent: dual value equals primal at the optimum
    w = er(30, 0.3, 11)
    sol = solve_dual(w)
    assert sol.gap <= 1e-9 * sol.primal
    assert not sol.singular


def test_spec_reference_ratios_at_p05():
    """SPEC §3 reference (ER n = 20, p = 0.5): Whisper/LDP ≈ 0.65 and DECOR/LDP ≈ 0.94, averaged over graphs;
    the numbers depend on the graph draw, so only a band is checked."""
    rw, rd = [], []
    for seed in range(10):
        w = er(20, 0.5, seed)
        rw.append(design_covariance("whisper", w, bound=1.0).summary()["ratio_to_ldp"])
        rd.append(design_covariance("decor", w, bound=1.0).summary()["ratio_to_ldp"])
    assert 0.55 < np.mean(rw) < 0.72
    assert 0.85 < np.mean(rd) < 1.0


def test_bad_input_is_named():
    w = er(6, 0.6, 0)
    with pytest.raises(ValidationError, match="b must be"):
        design_covariance("whisper", w, bound=0.0)
    with pytest.raises(ValidationError, match="b must be"):
        design_covariance("ldp", w, bound=-1.0)
    asym = w.copy()
    asym[0, 1] += 0.1
    with pytest.raises(ValidationError, match="DECOR needs a symmetric W|DECOR.*symmetric"):
        design_covariance("decor", asym, bound=1.0)
    with pytest.raises(ValidationError, match="not positive definite"):
        verify_covariance(np.diag([1.0, 1.0, -1.0]), bound=1.0)
    with pytest.raises(ValidationError, match="agent 2 .* 4"):
        verify_covariance(np.diag([1.0, 1.0, 0.25]), bound=1.0)
    with pytest.raises(ValidationError, match="M must be between 1 and n"):
        seed_groups("groups:7", w)
    with pytest.raises(ValidationError, match="q = 6 must be < n = 6"):
        coalition_worst_ratio(1.0, [], 6, coalition_size=6, bound=1.0)
    with pytest.raises(ValidationError, match="leave agents in no group"):
        solve_hbc(w, bound=1.0, groups=[(0, 1), (2, 3)], coalition_size=0)


# ---- honest-but-curious (problem (10)) -------------------------------------------------------------------------
def test_hbc_q0_global_seed_is_problem_p():
    w, b = er(10, 0.5, 2), 1.5
    hbc = solve_hbc(w, bound=b, groups=seed_groups("global", w), coalition_size=0)
    assert hbc.trace == pytest.approx(design_covariance("whisper", w, bound=b).trace, rel=1e-5)


def test_hbc_one_seed_per_agent_against_n_minus_1_is_ldp():
    w, b = er(6, 0.6, 4), 0.8
    hbc = solve_hbc(w, bound=b, groups=seed_groups("groups:6", w), coalition_size=5)
    assert hbc.trace == pytest.approx(design_covariance("ldp", w, bound=b).trace, rel=1e-5)


def test_hbc_global_seed_against_one_curious_agent_is_ldp():
    w, b = er(8, 0.5, 5), 1.0
    hbc = solve_hbc(w, bound=b, groups=seed_groups("global", w), coalition_size=1)
    assert hbc.trace == pytest.approx(design_covariance("ldp", w, bound=b).trace, rel=1e-5)


def test_hbc_q1_designs_are_feasible_and_ordered():
    w, b = er(10, 0.5, 3), 2.0
    edges = solve_hbc(w, bound=b, groups=seed_groups("edges", w), coalition_size=1)
    assert edges.extra["worst_coalition_ratio"] <= 1 + 1e-9
    worst, _ = coalition_worst_ratio(edges.sigma_mix2, edges.components, 10, coalition_size=1, bound=b)
    assert worst <= 1 + 1e-9
    # more protection costs utility: q = 0 (Whisper) ≤ q = 1 (edges) ≤ LDP
    assert design_covariance("whisper", w, bound=b).trace <= edges.trace * (1 + 1e-6)
    assert edges.trace <= design_covariance("ldp", w, bound=b).trace * (1 + 1e-6)
    # Whisper's global-seed design gives no protection against a curious agent that knows the seed
    wh = design_covariance("whisper", w, bound=b)
    assert coalition_worst_ratio(wh.sigma_mix2, wh.components, 10, coalition_size=1, bound=b)[0] > 1.5


def test_hbc_q2_small_network():
    w, b = er(8, 0.6, 1), 1.0
    d = solve_hbc(w, bound=b, groups=seed_groups("neighbourhoods", w), coalition_size=2)
    assert d.extra["worst_coalition_ratio"] <= 1 + 1e-9
    assert d.trace <= design_covariance("ldp", w, bound=b).trace * (1 + 1e-6)
