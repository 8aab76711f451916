"""W and R designed together (issue 46, item 3): ``privdl covariance --optimize-mixing`` and ``[mechanism]
optimize_mixing``. Every fact is recomputed here independently of privdl.covariance.joint (eigenvalues of W − 11ᵀ/n,
an explicit inverse of R, the Metropolis–Hastings weights from networkx's graph), and the W-step is checked against
cvxpy's optimum on a small graph."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

from privdl.covariance.joint import EdgeWeights, _phase_one, design_joint, metropolis_hastings_on, mixing_step
from privdl.errors import ValidationError


def _graph(n: int, p: float, seed: int) -> np.ndarray:
    g = nx.erdos_renyi_graph(n, p, seed=seed)
    assert nx.is_connected(g)
    return nx.to_numpy_array(g)


def _gap(w: np.ndarray) -> float:
    """1 − SLEM = 1 − the largest |eigenvalue| of W − 11ᵀ/n (W symmetric)."""
    n = len(w)
    return 1.0 - float(np.max(np.abs(np.linalg.eigvalsh(w - np.full((n, n), 1.0 / n)))))


def _mh(adj: np.ndarray) -> np.ndarray:
    """Metropolis–Hastings from the definition, W_ij = 1/(1 + max(d_i, d_j)) (seed 000, §VI-A)."""
    deg = adj.sum(axis=1)
    w = np.where(adj > 0, 1.0 / (1.0 + np.maximum.outer(deg, deg)), 0.0)
    return w + np.diag(1.0 - w.sum(axis=1))


@pytest.fixture(scope="module")
def joint():
    adj = _graph(9, 0.45, 4)
    return adj, design_joint(adj, 2.0)


def test_joint_design_is_a_valid_mixing_matrix_on_the_graph(joint):
    adj, j = joint
    w = j.W
    assert np.max(np.abs(w - w.T)) == 0.0  # built symmetric entry by entry
    # rows and columns sum to 1 up to the rounding of summing ≤ n terms
    assert np.allclose(w.sum(axis=0), 1.0, atol=1e-13) and np.allclose(w.sum(axis=1), 1.0, atol=1e-13)
    assert w.min() >= 0.0
    off = (adj == 0) & ~np.eye(len(adj), dtype=bool)
    assert np.all(w[off] == 0.0)  # nothing off the graph's edges
    assert np.all(w[adj > 0] > 0.0)
    # the spectral gap bound: MH's own gap, from the definition
    gap_mh = _gap(_mh(adj))
    assert j.spectral_gap_fixed_mixing == pytest.approx(gap_mh, rel=1e-12)
    assert _gap(w) >= gap_mh - 1e-12 and j.spectral_gap == pytest.approx(_gap(w), abs=1e-12)


def test_joint_design_is_private_and_no_worse_than_fixed_mixing(joint):
    adj, j = joint
    b = 2.0
    r = j.design.R
    assert np.linalg.eigvalsh(r)[0] > 0
    assert np.max(np.diag(np.linalg.inv(r))) <= b * (1 + 1e-8)  # [R⁻¹]_ii ≤ b, an explicit inverse (rounding)
    assert j.objective == pytest.approx(float(np.trace(j.W @ r @ j.W.T)), rel=1e-10)
    # the fixed-mixing reference is MH + the optimal R, recomputed
    from privdl.covariance import design_covariance

    fixed = design_covariance("whisper", _mh(adj), bound=b)
    assert j.objective_fixed_mixing == pytest.approx(fixed.trace, rel=1e-9)
    assert j.objective <= j.objective_fixed_mixing
    assert j.objective < 0.95 * j.objective_fixed_mixing  # (this graph: about 20% lower; a real improvement)
    # the R-step's certificate at the final W
    assert j.design.duality_gap <= 1e-8 * j.objective
    hist = j.history
    assert all(a >= c for a, c in zip(hist, hist[1:]))  # monotone decrease


def test_a_larger_spectral_gap_bound_is_held_and_an_unreachable_one_refused():
    adj = _graph(8, 0.5, 2)
    gap_mh = _gap(_mh(adj))
    bound = gap_mh + 0.01
    j = design_joint(adj, 1.0, min_spectral_gap=bound)
    assert _gap(j.W) >= bound - 1e-12
    with pytest.raises(ValidationError, match="--min-spectral-gap 0.99"):
        design_joint(adj, 1.0, min_spectral_gap=0.99)
    with pytest.raises(ValidationError, match=r"in \[0, 1\)"):
        design_joint(adj, 1.0, min_spectral_gap=1.5)


def test_w_step_matches_cvxpy():
    """At fixed R, the barrier W-step reaches cvxpy's optimum of min Tr(W R W) over the edge weights with
    ‖W − 11ᵀ/n‖₂ ≤ 1 − γ and W ≥ 0. Tolerance 1e-5 relative: the barrier stops at (constraints)/t ≤ 1e-7·f,
    Clarabel at its default gap tolerance ~1e-8; both are far below it."""
    cp = pytest.importorskip("cvxpy", reason="the reference needs the optional extra: pip install 'privdl[reference]'")
    from privdl.covariance import design_covariance

    adj = _graph(6, 0.6, 1)
    n = len(adj)
    w_mh = metropolis_hastings_on(adj)
    r = design_covariance("whisper", w_mh, bound=1.0).R
    gamma = _gap(w_mh)
    edges = EdgeWeights(adj)
    start = _phase_one(edges, edges.weights_of(w_mh), gamma)
    assert start is not None
    for dense in (True, False):  # the dense Newton system and the conjugate-gradient one
        w, _, _ = mixing_step(edges, r, start, gamma, dense=dense)
        ours = float(np.trace(edges.mixing(w) @ r @ edges.mixing(w)))
        x = cp.Variable(edges.m)
        a = [np.outer(np.eye(n)[i] - np.eye(n)[j], np.eye(n)[i] - np.eye(n)[j]) for i, j in zip(edges.i, edges.j)]
        wm = np.eye(n) - sum(x[k] * a[k] for k in range(edges.m))
        sq = np.linalg.cholesky(r)
        dev = wm - np.full((n, n), 1.0 / n)
        prob = cp.Problem(cp.Minimize(cp.sum_squares(wm @ sq)),
                          [x >= 0, cp.diag(wm) >= 0, cp.lambda_max(dev) <= 1 - gamma, cp.lambda_min(dev) >= gamma - 1])
        prob.solve(solver="CLARABEL")
        assert ours == pytest.approx(prob.value, rel=1e-5)
        assert ours <= float(np.trace(w_mh @ r @ w_mh))


def test_cli_optimize_mixing_json_and_saved_w_reads_back(tmp_path):
    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.network import load_network_file

    saved = tmp_path / "W.csv"
    args = ["covariance", "--n", "7", "--p", "0.5", "--graph-seed", "3", "--precision-bound", "1", "--format", "json"]
    res = CliRunner().invoke(app, [*args, "--optimize-mixing", "--save-mixing", str(saved)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("objective", "objective_fixed_mixing", "spectral_gap", "spectral_gap_fixed_mixing"):
        assert isinstance(out[key], float)
    assert out["objective"] <= out["objective_fixed_mixing"]
    plain = json.loads(CliRunner().invoke(app, args).output)  # MH + optimal R: the fixed-mixing objective
    assert out["objective_fixed_mixing"] == pytest.approx(plain["trace"], rel=1e-9)
    net = load_network_file(saved, kind="mixing")
    assert net.spectral_gap == pytest.approx(out["spectral_gap"], abs=1e-12)
    assert net.n == 7 and np.allclose(net.W, net.W.T, atol=0)


def test_cli_refuses_optimize_mixing_with_another_design():
    from typer.testing import CliRunner

    from privdl.cli import app

    for design in ("decor", "ldp"):
        res = CliRunner().invoke(app, ["covariance", "--n", "6", "--precision-bound", "1", "--design", design,
                                       "--optimize-mixing"])
        assert res.exit_code == 2 and f"not --design {design}" in res.output
    res = CliRunner().invoke(app, ["covariance", "--n", "6", "--precision-bound", "1", "--min-spectral-gap", "0.1"])
    assert res.exit_code == 2 and "need --optimize-mixing" in res.output


def test_whisper_run_mixes_with_the_designed_w():
    import privdl
    from privdl.network.edges import fingerprint

    net = {"topology": "erdos_renyi", "n": 8, "p": 0.5, "seed": 3}
    res = privdl.train(task={"name": "quadratic", "start": "zero"}, network=net,
                       mechanism={"name": "whisper", "precision_bound": 1.0, "clip": 0.1, "optimize_mixing": True},
                       schedule={"name": "constant", "eta": 0.01}, iterations=2)
    adj = nx.to_numpy_array(nx.from_numpy_array(privdl.Network.from_topology("erdos_renyi", 8, p=0.5, seed=3).W > 0))
    j = design_joint(adj, 1.0)
    manifest = res.manifest()["network"]
    assert "weights optimized with R" in manifest["description"]
    assert manifest["fingerprint"] == fingerprint(j.W)
    with pytest.raises(ValidationError, match="optimize_mixing"):
        privdl.train(task="quadratic", network=net, schedule={"name": "constant", "eta": 0.01}, iterations=1,
                     mechanism={"name": "whisper", "precision_bound": 1.0, "min_spectral_gap": 0.1})


def test_time_limit_keeps_the_best_so_far(monkeypatch):
    import privdl.covariance.joint as joint

    monkeypatch.setattr(joint, "TIME_LIMIT", 0.0)
    monkeypatch.setattr(joint, "_CACHE", {})
    adj = _graph(8, 0.6, 5)
    j = joint.design_joint(adj, 1.0)
    assert j.outer_iterations == 2 and "time limit" in j.note  # one alternation, then the limit
    assert j.objective < j.objective_fixed_mixing and _gap(j.W) >= _gap(_mh(adj)) - 1e-12
