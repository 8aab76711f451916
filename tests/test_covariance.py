"""Covariance design (SPEC §3): the dual solver against closed forms and cvxpy references, DECOR, homogeneity,
singular W, bad input, and the honest-but-curious problem (10) with its special cases."""

from __future__ import annotations

import functools
import json

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
    # (Whisper: the least-trace tie-break (P_ρ), τ = 1e-6; DECOR: σ_cor²/σ_pair² ≤ 1e6), each within ~1e-6 of it
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


# ---- the dual solver: Newton (the default from 1000 agents on) against the original fixed point (issue 32) ------------------------------
def _solver_graphs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    a = rng.random((30, 30))
    return {
        "ring": Network.from_topology("ring", 11).W,  # vertex-transitive: optimal at λ = 1 (one eigendecomposition)
        "path": Network.from_topology("path", 20).W,
        "star": Network.from_topology("star", 15).W,  # singular
        "er": er(40, 0.3, 2),
        "er_float32": er(300, 0.5, 0),  # n ≥ FLOAT32_MIN_N: the Newton step's products run in float32
        "complete_singular": Network.from_topology("complete", 12, mixing="uniform").W,  # rank one: ridge
        "nonsymmetric": a / a.sum(axis=1, keepdims=True),  # row-stochastic, not symmetric
        "gaussian": rng.standard_normal((20, 20)),
    }


@functools.lru_cache(maxsize=None)
def _solved(name: str, method: str):
    return solve_dual(_solver_graphs()[name], method=method)


@pytest.mark.parametrize("name", list(_solver_graphs()))
def test_newton_solver_agrees_with_the_fixed_point(name):
    """Same R and objective as the original iteration, the same certificate, never more eigendecompositions."""
    w = _solver_graphs()[name]
    old, new = _solved(name, "fixed_point"), _solved(name, "newton")
    assert (old.method, new.method) == ("fixed_point", "newton")
    assert (new.singular, new.ridge) == (old.singular, old.ridge)
    assert new.dual <= new.primal * (1 + 1e-12)
    if not new.singular:  # unique optimum: both within tol = 1e-10 of it
        assert new.gap <= 1e-10 * new.primal
        assert new.primal == pytest.approx(old.primal, rel=1e-9)
        assert new.dual == pytest.approx(old.dual, rel=1e-9)
        assert np.linalg.norm(new.R - old.R) <= 1e-6 * np.linalg.norm(old.R)
        assert np.max(precision_diagonal(new.R)) <= 1 + 1e-12  # feasible at b = 1, up to rounding
        assert new.iterations <= old.iterations
    else:  # (P) is ill posed: both methods solve the same tie-break (P_ρ), one algorithm: the same R, bit for bit
        assert np.array_equal(new.R, old.R) and new.primal == old.primal
        assert new.gap <= 1e-6 * new.primal and new.stationarity < 1e-13
        assert np.max(precision_diagonal(new.R)) <= 1 + 1e-9  # rounding ~ cond(R)·eps, cond(R) up to ~n/τ
    # primal = Tr(W R Wᵀ), recomputed (singular W: R may carry ~1/τ variance on null(W), so rounding ~ 1/τ·eps)
    assert np.einsum("ij,jk,ik->", w, new.R, w) == pytest.approx(new.primal, rel=1e-7 if new.singular else 1e-9)
    assert np.linalg.eigvalsh(new.R)[0] > 0


def test_newton_needs_few_eigendecompositions_and_counts_them_all(monkeypatch):
    """ER(300, 0.5): Newton certifies a 1e-10 gap in ≤ 5 eigendecompositions where the fixed point needs ≥ 15; the
    reported iteration count is the number of eigendecompositions actually made."""
    import privdl.covariance.dual as dual

    w = _solver_graphs()["er_float32"]
    calls = []
    real = dual._eigh
    monkeypatch.setattr(dual, "_eigh", lambda b, device: calls.append(1) or real(b, device))
    new = solve_dual(w, method="newton")
    assert new.gap <= 1e-10 * new.primal
    assert len(calls) == new.iterations <= 5
    assert _solved("er_float32", "fixed_point").iterations >= 15
    assert new.seconds > 0


def test_torch_eigh_route_gives_the_same_solution():
    """device="cpu" sends the eigendecompositions through torch.linalg.eigh (the code path of device="cuda")."""
    pytest.importorskip("torch")
    for w in (er(40, 0.3, 2), _solver_graphs()["nonsymmetric"]):
        ref = solve_dual(w, method="newton")
        via = solve_dual(w, method="newton", device="cpu")
        assert via.gap <= 1e-10 * via.primal
        assert via.primal == pytest.approx(ref.primal, rel=1e-9)
        assert np.linalg.norm(via.R - ref.R) <= 1e-6 * np.linalg.norm(ref.R)
        fixed = solve_dual(w, method="fixed_point", device="cpu")
        assert fixed.method == "fixed_point" and fixed.primal == pytest.approx(ref.primal, rel=1e-9)
    w = er(12, 0.5, 1)
    d = design_covariance("whisper", w, bound=2.0, device="cpu", method="newton")
    assert d.trace == pytest.approx(design_covariance("whisper", w, bound=2.0).trace, rel=1e-9)
    assert d.extra["dual_method"] == "newton" and d.extra["solver"] == "dual newton"


def test_solver_refuses_a_missing_gpu_and_unknown_methods():
    torch = pytest.importorskip("torch")
    w = er(8, 0.5, 0)
    with pytest.raises(ValidationError, match="unknown dual method 'eig'"):
        solve_dual(w, method="eig")
    with pytest.raises(ValidationError, match="not a torch device"):
        solve_dual(w, device="gpu0")
    if torch.cuda.is_available():
        return
    with pytest.raises(ValidationError, match="sees no CUDA device"):
        solve_dual(w, device="cuda")
    with pytest.raises(ValidationError, match="sees no CUDA device"):
        design_covariance("whisper", er(9, 0.5, 0), bound=1.0, device="cuda")


def test_covariance_cli_device_option():
    torch = pytest.importorskip("torch")
    from typer.testing import CliRunner

    from privdl.cli import app

    args = ["covariance", "--n", "10", "--precision-bound", "1", "--format", "json"]
    run = CliRunner().invoke
    plain, via = run(app, args), run(app, [*args, "--device", "cpu"])
    assert plain.exit_code == 0 and via.exit_code == 0, via.output
    assert json.loads(via.output)["trace"] == pytest.approx(json.loads(plain.output)["trace"], rel=1e-9)
    res = run(app, [*args, "--design", "decor", "--device", "cpu"])
    assert res.exit_code == 2 and "--device applies to the whisper design" in res.output
    if not torch.cuda.is_available():
        res = run(app, [*args, "--device", "cuda"])
        assert res.exit_code == 2 and "sees no CUDA device" in res.output


def test_float32_first_eigendecomposition_changes_nothing_but_time(monkeypatch):
    """From FLOAT32_EIGH_MIN_N on, Newton's first eigendecomposition (λ = 1) is float32 and W's singularity is
    decided by a Cholesky factorisation: same solution, same singular flag and ridge, same certificate."""
    import privdl.covariance.dual as dual

    monkeypatch.setattr(dual, "FLOAT32_EIGH_MIN_N", 2)
    for name in ("er_float32", "nonsymmetric", "complete_singular", "star", "ring"):
        ref = _solved(name, "newton")  # (cached before the patch: float64 throughout)
        rough = solve_dual(_solver_graphs()[name], method="newton")
        assert (rough.singular, rough.ridge) == (ref.singular, ref.ridge)
        assert rough.primal == pytest.approx(ref.primal, rel=1e-9 if not ref.singular else 1e-6)
        assert rough.gap <= (1e-10 if not ref.singular else 3e-6) * rough.primal
        if not ref.singular:  # (+1: λ = 1 optimal, e.g. the ring, is redone in float64)
            assert rough.iterations <= ref.iterations + 1


def test_large_whisper_design_skips_r_eigenvectors_with_the_same_result(monkeypatch):
    import privdl.covariance.designs as designs

    w = er(60, 0.5, 3)
    full = design_covariance("whisper", w, bound=2.0, method="newton")
    monkeypatch.setattr(designs, "LARGE_N", 10)
    lean = design_covariance("whisper", w, bound=2.0, method="newton")
    np.testing.assert_allclose(lean.R, full.R, rtol=1e-12)
    assert lean.sigma_mix2 == pytest.approx(full.sigma_mix2, rel=1e-9)
    np.testing.assert_allclose(lean.components[0].cov, full.components[0].cov, rtol=0,
                               atol=1e-12 * np.abs(full.R).max())
    assert lean.max_precision_ratio == pytest.approx(full.max_precision_ratio, rel=1e-12)
    assert lean.trace == pytest.approx(full.trace, rel=1e-12)


def test_singular_w_with_a_slack_agent_gets_the_least_trace_optimum_on_every_path():
    """ER(6, 0.6, seed 3) (issue 43): W is singular and agent 4, whose constraint is slack in (P) (λ_4 → 0), carries
    most of null(W). (P) has optima here, an unbounded set of them; the tie-break picks the one of least trace, which
    fills agent 4's precision to the bound: null(W) gets a variance of 6.7, not the former floor's 10⁶ (OpenBLAS's
    SkylakeX kernels) or 8.0 (its Haswell ones), at (P)'s optimum to 1e-12. Every method and device: the same R."""
    w = Network.from_topology("erdos_renyi", 6, p=0.6, seed=3).W
    fixed, newton = solve_dual(w, method="fixed_point"), solve_dual(w, method="newton")
    assert np.array_equal(fixed.R, newton.R)
    assert np.array_equal(solve_dual(w, method="newton", device="cpu").R, newton.R)  # (the tie-break stays on LAPACK)
    assert newton.singular and newton.lam[4] < 1e-12 * newton.lam.max()  # λ_4 = O(ρ): its precision is at the bound
    assert np.max(precision_diagonal(newton.R)) <= 1 + 1e-12
    assert precision_diagonal(newton.R)[4] >= 1 - 1e-9
    assert np.linalg.eigvalsh(newton.R)[-1] < 7  # (least trace: see tests/test_covariance_unique.py)
    assert newton.gap <= 1e-12 * newton.primal  # (P)'s optimum: the tie-break costs nothing here


def test_auto_method_is_the_fixed_point_below_a_thousand_agents_and_newton_from_there(monkeypatch):
    """The default keeps small networks (every committed reproduction) on the original iteration, bit for bit, and
    switches to Newton at NEWTON_MIN_N."""
    import privdl.covariance.dual as dual

    assert dual.resolve_method("auto", dual.NEWTON_MIN_N - 1) == "fixed_point"
    assert dual.resolve_method("auto", dual.NEWTON_MIN_N) == "newton"
    w = er(40, 0.3, 2)
    auto, fixed = solve_dual(w), _solved("er", "fixed_point")
    assert auto.method == "fixed_point" and np.array_equal(auto.R, fixed.R)
    assert design_covariance("whisper", w, bound=1.0).extra["solver"] == "dual fixed point"
    monkeypatch.setattr(dual, "NEWTON_MIN_N", 40)
    assert solve_dual(w).method == "newton"


def test_a_runs_gpu_device_reaches_the_design_solver(monkeypatch):
    """A run with device = "cuda" builds its mechanism inside eigh_device: Newton's eigendecompositions (from
    NEWTON_MIN_N agents, lowered here) then go to that device (recorded; the CPU route stands in for a GPU), a CPU
    run keeps LAPACK."""
    import privdl.covariance.dual as dual
    import privdl.covariance.dual_device as dual_device
    from privdl.covariance.dual import _CACHE
    from privdl.covariance.dual_device import eigh_device, gpu_of

    assert gpu_of("cuda:1") == "cuda:1" and gpu_of("cpu") is None and gpu_of(None) is None
    seen = []
    real = dual._eigh
    monkeypatch.setattr(dual, "_eigh", lambda b, device: seen.append(device) or real(b, device))
    monkeypatch.setattr(dual_device, "gpu_of", lambda d: d)  # treat "cpu" as the run's accelerator for this test
    monkeypatch.setattr(dual, "NEWTON_MIN_N", 10)
    w = er(14, 0.5, 7)
    _CACHE.clear()
    with eigh_device("cpu"):
        routed = design_covariance("whisper", w, bound=1.0)
    assert seen and set(seen) == {"cpu"}
    seen.clear()
    _CACHE.clear()
    plain = design_covariance("whisper", w, bound=1.0)
    assert seen and set(seen) == {None}  # (Newton on LAPACK)
    assert routed.trace == pytest.approx(plain.trace, rel=1e-9)


def test_a_runs_device_leaves_the_fixed_point_and_its_singular_recovery_alone(monkeypatch):
    """Below NEWTON_MIN_N the fixed point keeps LAPACK on every machine: a run on a GPU gets the CPU's R bit for bit,
    singular W (complete graph, ring) included, whose tie-break runs on LAPACK whatever the device."""
    import privdl.covariance.dual_device as dual_device
    from privdl.covariance.dual import _CACHE
    from privdl.covariance.dual_device import eigh_device

    monkeypatch.setattr(dual_device, "gpu_of", lambda d: d)  # treat "cpu" as the run's accelerator for this test
    for w in (Network.from_topology("complete", 12, mixing="uniform").W, Network.from_topology("ring", 12).W):
        _CACHE.clear()
        plain = design_covariance("whisper", w, bound=1.0)
        _CACHE.clear()
        with eigh_device("cpu"):
            on_device = design_covariance("whisper", w, bound=1.0)
        assert plain.singular and np.array_equal(on_device.R, plain.R)
