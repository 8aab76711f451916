"""Seed 002: random matrix step-sizes, protection vectors, exact diffusion, DSG-RMS / EDSG-RMS, PD-LMS, PSGT, the
streaming tasks and the eavesdropper — each checked against an independent fact (a closed form, a least-squares
solve, a moment with a stated false-alarm rate, the plain algorithm bit for bit)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from privdl.algorithms import make_algorithm
from privdl.comm import SparseComm
from privdl.comm.eavesdropper import Eavesdropper
from privdl.errors import PrivdlError, ValidationError
from privdl.experiment.build import check_requirements
from privdl.keys import Keys
from privdl.mechanisms import make_mechanism
from privdl.mechanisms.perturbation import laplace, pd_lms_noise, psgt_variance
from privdl.mechanisms.protection import Protection
from privdl.mechanisms.rms import RandomMatrixStepSize
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks import make_task

# Statistical tests below use fixed seeds; each z-test is two-sided at |z| < 5 (false-alarm rate 5.7e-7 per
# check), so a failure means a wrong law, not bad luck.
Z = 5.0


def _net(lazy=False, seed=1, mixing="laplacian"):
    return Network.from_topology("erdos_renyi", 5, p=0.6, mixing=mixing, lazy=lazy, seed=seed)


def _run(alg, net, task, T, eta, seed=0, mech="none", observers=(), eval_every=0, **mech_params):
    a = make_algorithm(alg) if isinstance(alg, str) else alg
    m = make_mechanism(mech, steps=a.accesses(T, net.edges), network=net, **mech_params)
    return simulate(task=task, network=net, algorithm=a, mechanism=m,
                    schedule=make_schedule("constant", iterations=T, eta=eta), iterations=T, seed=seed,
                    eval_every=eval_every or T, observers=observers)


def _final(result):
    T = result.iterations
    return {k: v for t, k, v in result.records if t == T}


# ---- random matrix step-sizes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", ["dense", "upper_bidiagonal", "sparse", "diagonal"])
def test_random_matrix_has_mean_mu_identity_and_the_stated_entry_variances(structure):
    L, draws = 6, 4000
    rms = RandomMatrixStepSize(mu=0.7, sigma_mu=0.3, sigma_z=0.2, structure=structure)
    keys = Keys(11, 2)
    M = torch.cat([rms.matrices(keys, c, L) for c in range(1, draws // 2 + 1)])  # (draws, L, L)
    n = M.shape[0]
    diag = M.diagonal(dim1=1, dim2=2)
    assert abs(float(diag.mean()) - 0.7) < Z * 0.3 / math.sqrt(n * L)
    assert abs(float(diag.var()) / 0.09 - 1) < Z * math.sqrt(2 / (n * L))
    off = M - torch.diag_embed(diag)
    support = {"dense": ~torch.eye(L, dtype=torch.bool),
               "upper_bidiagonal": torch.diag(torch.ones(L - 1, dtype=torch.bool), 1),
               "diagonal": torch.zeros(L, L, dtype=torch.bool)}
    if structure in support:
        assert bool((off[:, ~support[structure]] == 0).all())
        vals = off[:, support[structure]]
        if vals.numel():
            assert abs(float(vals.mean())) < Z * 0.2 / math.sqrt(vals.numel())
            assert abs(float(vals.var()) / 0.04 - 1) < Z * math.sqrt(2 / vals.numel())
    else:  # sparse: L positions per draw, uniform over the L(L−1) off-diagonal slots, zero-mean
        assert bool((off.diagonal(dim1=1, dim2=2) == 0).all())
        total = float((off**2).sum()) / n  # E Σ off² = L σ_z² (positions drawn independently)
        assert abs(total / (L * 0.04) - 1) < 0.1
        hits = (off != 0).sum(dim=0)[~torch.eye(L, dtype=torch.bool)].double()
        chi2 = float(((hits - hits.mean()) ** 2 / hits.mean()).sum())
        assert stats.chi2.sf(chi2, L * (L - 1) - 1) > 1e-6
        assert abs(float(off.sum()) / n) < Z * math.sqrt(L * 0.04 / n)


def test_sparse_random_matrix_on_model_sized_rows_keeps_its_law():
    """L ≥ keys.WIDE draws positions as exact integers: still L zero-mean off-diagonal entries per draw."""
    L = 6000
    rms = RandomMatrixStepSize(mu=1.0, sigma_mu=0.0, sigma_z=0.5, structure="sparse")
    out = rms.apply(torch.ones(4, L, dtype=torch.float64), Keys(2, 4), 1) - 1.0  # row sums of the off-diagonal part
    total = float((out**2).sum(dim=1).mean())  # E = L σ_z² (independent positions)
    assert abs(total / (L * 0.25) - 1) < Z * math.sqrt(2 / (4 * L)) * 1.5
    assert abs(float(out.sum())) < Z * math.sqrt(4 * L * 0.25)
    j = 123
    unit = torch.zeros(4, L, dtype=torch.float64)
    unit[:, j] = 1.0
    for c in range(1, 6):  # column j's own entry stays μ: no position on the diagonal
        assert torch.equal(rms.apply(unit.clone(), Keys(2, 4), c)[:, j], torch.ones(4, dtype=torch.float64))


@pytest.mark.exact
def test_random_matrix_is_each_agents_own_draw():
    """Row 2 alone equals row 2 of the whole batch bit for bit: keyed draws per element, elementwise products and
    sums, a gather and an in-order scatter-add — no operation whose rounding depends on the number of rows."""
    rms = RandomMatrixStepSize(sigma_mu=0.1, sigma_z=0.1)
    g = torch.randn(5, 4, dtype=torch.float64)
    full = rms.apply(g.clone(), Keys(3, 5), 7)
    alone = rms.apply(g[2:3].clone(), Keys(3, 5), 7, rows=np.array([2]))
    assert torch.equal(full[2:3], alone)
    assert not torch.equal(full, rms.apply(g.clone(), Keys(3, 5), 8))


def test_sparse_and_bidiagonal_products_agree_with_their_matrices():
    keys = Keys(5, 3)
    g = torch.randn(3, 7, dtype=torch.float64)
    for structure in ("sparse", "upper_bidiagonal", "dense"):
        rms = RandomMatrixStepSize(sigma_mu=0.2, sigma_z=0.5, structure=structure)
        M = rms.matrices(keys, 4, 7)
        assert torch.allclose(rms.apply(g.clone(), keys, 4), torch.einsum("kij,kj->ki", M, g), atol=1e-13)


def test_bad_random_matrix_settings_are_refused_with_the_way_out():
    with pytest.raises(ValidationError, match="mu must be > 0"):
        RandomMatrixStepSize(mu=0.0)
    with pytest.raises(ValidationError, match="sigma_z.*>= 0"):
        RandomMatrixStepSize(sigma_z=-0.1)
    with pytest.raises(ValidationError, match="sigma_mu.*>= 0"):
        make_algorithm("dsg_rms", sigma_mu=-1.0)
    with pytest.raises(ValidationError, match="sparse"):
        RandomMatrixStepSize(structure="dense").check_dim(10**5)
    with pytest.raises(ValidationError, match="takes no tau"):
        make_algorithm("dsg_rms", protection="none", tau=0.5)


# ---- protection vectors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("law", ["norm", "erf", "tanh"])
def test_protection_leaves_the_network_average_unchanged(law):
    net = _net()
    comm = SparseComm(net)
    psi = torch.randn(5, 4, dtype=torch.float64)
    w = torch.randn(5, 4, dtype=torch.float64)
    prot = Protection(law, 0.8)
    vector = prot.vector(w)
    assert float(vector.abs().min()) > 0
    out = prot.protect(comm, vector).mix(psi, tag="x")
    assert torch.allclose(out.mean(dim=0), psi.mean(dim=0), atol=1e-14)
    # and it is the seed's combination (5c): Σ_ℓ a_ℓk ψ^c_ℓ − ψ^c_k + ψ_k
    W = torch.as_tensor(net.W)
    sent = psi + vector
    assert torch.allclose(out, W @ sent - sent + psi, atol=1e-14)


def test_norm_protection_is_the_seeds_vector_and_the_adaptive_inversion_undoes_it():
    w = torch.tensor([[3.0, -4.0, 0.0, 0.0]], dtype=torch.float64)
    for tau in (0.5, 1.0, 2.0):
        p = Protection("norm", tau).vector(w)
        assert torch.allclose(p, torch.full((1, 4), tau / 2 * 5.0, dtype=torch.float64))
    for law, tau in (("norm", 0.5), ("norm", 1.0), ("erf", 1.0), ("tanh", 0.8)):
        prot = Protection(law, tau)
        v = torch.randn(20, 5, dtype=torch.float64)
        assert torch.allclose(prot.recover(v + prot.vector(v)), v, atol=1e-9), law


# ---- the algorithms -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("plain, private, lazy", [("dsgd", "dsg_rms", False), ("exact_diffusion", "edsg_rms", True),
                                                  ("dsgt", "dsgt_rms", False)])
def test_rms_with_no_randomness_is_the_plain_algorithm_bit_for_bit(plain, private, lazy):
    net = _net(lazy=lazy)
    task = make_task("adaptive_filtering", 5, switch_at=30)
    a = _run(plain, net, task, 60, 0.05)
    b = _run(make_algorithm(private, sigma_z=0.0, sigma_mu=0.0, tau=0.0), net, task, 60, 0.05)
    assert torch.equal(a.final, b.final)
    c = _run(make_algorithm(private), net, task, 60, 0.05)
    assert not torch.equal(a.final, c.final)


def test_exact_diffusion_reaches_w_star_where_dsgd_keeps_a_bias():
    net = _net(lazy=True)
    task = make_task("adaptive_filtering", 5, heterogeneous=True, exact_gradient=True)
    dsgd = _final(_run("dsgd", net, task, 4000, 0.05))["msd"]
    ed = _final(_run("exact_diffusion", net, task, 4000, 0.05))["msd"]
    assert ed < 1e-12 < 1e-5 < dsgd
    edsg = _final(_run(make_algorithm("edsg_rms", sigma_z=0.0, sigma_mu=0.0), net, task, 4000, 0.05))["msd"]
    assert edsg < 1e-12  # the protection vector does not move the fixed point


def test_exact_diffusion_refuses_a_matrix_that_is_not_positive_definite():
    net = Network.from_topology("complete", 4, mixing="laplacian")  # W = 11ᵀ/4: eigenvalue 0
    for name in ("exact_diffusion", "edsg_rms"):
        with pytest.raises(ValidationError, match="lazy"):
            check_requirements(make_algorithm(name), net)
    check_requirements(make_algorithm("exact_diffusion"), Network.from_topology("complete", 4, lazy=True))


def test_rms_runs_have_no_dp_guarantee_but_keep_a_dp_mechanisms_guarantee():
    net = _net()
    task = make_task("adaptive_filtering", 5)
    alg = make_algorithm("dsg_rms")
    ledger = make_mechanism("none", steps=alg.accesses(10, net.edges)).ledger().with_parts(alg.privacy, alg.name)
    assert ledger.epsilon is None and ledger.guarantee.startswith("none: obfuscation")
    assert [e.mechanism for e in ledger.events[0]] == ["random_matrix_step_size(dense, gaussian) + protection(norm)"]
    assert ledger.per_agent()[0]["accesses"] == 10  # one event per access, not one per part
    ldp = make_mechanism("gaussian_ldp", steps=alg.accesses(50, net.edges), network=net, epsilon=5.0, delta=1e-5,
                         clip=1.0)
    both = ldp.ledger().with_parts(alg.privacy, alg.name)
    assert both.epsilon == pytest.approx(ldp.ledger().epsilon) and both.epsilon <= 5.0
    assert "post-processing" in both.note
    res = _run(alg, net, task, 50, 0.05, mech="gaussian_ldp", epsilon=5.0, delta=1e-5, clip=1.0)
    assert torch.isfinite(res.final).all()


# ---- PD-LMS and PSGT ----------------------------------------------------------------------------------------------
def _edge_matrix(comm, per_edge, own):
    """g[ℓ, k] = the perturbation on ℓ → k (own on the diagonal), one coordinate."""
    n = comm.rows
    g = torch.zeros(n, n, dtype=torch.float64)
    e = comm.edges
    g[e.src, e.dst] = per_edge[:, 0]
    g[torch.arange(n), torch.arange(n)] = own[:, 0]
    return g


def test_pd_lms_nullspace_and_edge_schemes_cancel_as_stated():
    net = _net(mixing="metropolis_hastings")
    comm, keys = SparseComm(net), Keys(4, 5)
    A = torch.as_tensor(net.W)  # a_ℓk = W[k, ℓ] = W[ℓ, k] (symmetric)
    g = _edge_matrix(comm, *pd_lms_noise("nullspace", comm, keys, 3, 1, 1.0))
    assert torch.allclose((A * g).sum(dim=1), torch.zeros(5, dtype=torch.float64), atol=1e-12)  # Σ_k a_ℓk g_ℓk = 0
    assert float(g.abs().sum()) > 0
    g = _edge_matrix(comm, *pd_lms_noise("edge", comm, keys, 3, 1, 1.0))
    off = ~torch.eye(5, dtype=torch.bool)
    assert torch.equal(g[off], -g.T[off])  # antisymmetric per edge
    assert abs(float((A * g).sum())) < 1e-12
    g = _edge_matrix(comm, *pd_lms_noise("independent", comm, keys, 3, 1, 1.0))
    assert abs(float((A * g).sum())) > 1e-6  # the standard scheme does not cancel
    for scheme in ("independent", "nullspace", "edge"):  # what is sent carries σ_g² per coordinate
        per_edge, _ = pd_lms_noise(scheme, comm, keys, 4, 20_000, 0.3)
        assert abs(float(per_edge.var()) / 0.3 - 1) < Z * math.sqrt(5 / per_edge.numel()) * 3, scheme


def test_pd_lms_graph_homomorphic_schemes_keep_the_centroid_of_one_combination():
    net = _net(mixing="metropolis_hastings")
    task = make_task("adaptive_filtering", 5)
    for scheme, centroid_free in (("nullspace", True), ("edge", True), ("independent", False)):
        big = _run(make_algorithm("pd_lms", scheme=scheme, variance=1.0), net, task, 1, 0.05)
        free = _run(make_algorithm("pd_lms", scheme=scheme, variance=0.0), net, task, 1, 0.05)
        same = torch.allclose(big.final.mean(0), free.final.mean(0), atol=1e-12)
        assert same == centroid_free, scheme


def test_pd_lms_nullspace_needs_a_self_weight():
    net = Network.from_topology("path", 3, mixing="metropolis_hastings")
    zero_self = Network.from_matrix(np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]))  # middle: a_kk = 0
    task = make_task("adaptive_filtering", 3)
    with pytest.raises(ValidationError, match="self-weight"):
        _run(make_algorithm("pd_lms", scheme="nullspace"), zero_self, task, 2, 0.01)
    _run(make_algorithm("pd_lms", scheme="nullspace"), net, task, 2, 0.01)


@pytest.mark.slow
def test_laplace_draws_and_psgt_schedule_have_the_stated_variance():
    u = torch.rand(200_000, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = laplace(u, 0.3)
    assert abs(float(x.var()) / 0.3 - 1) < Z * math.sqrt(5 / x.numel())  # Var(X²)/σ⁴ = 5 for Laplace
    assert psgt_variance(3, variance=0.1, decay=0.8, root=True) == pytest.approx(math.sqrt(0.1 * 0.8**3))
    assert psgt_variance(3, variance=0.1, decay=0.8, root=False) == pytest.approx(0.1 * 0.8**3)
    # the perturbation PSGT really sends, x̃(t) − x(t), round by round against the schedule (γ ≈ 0: x(t) = W x̃(t−1))
    n = 4000
    net = Network.from_topology("ring", n)
    task = make_task("adaptive_filtering", n, dim=2, heterogeneous=False)
    from privdl.comm.observers import Transcript

    tr = Transcript()
    r = _run("psgt", net, task, 4, 1e-300, observers=[tr])  # γ ≈ 0: −γỹ vanishes against O(1) values
    W = torch.as_tensor(net.W)
    x = r.final.new_zeros(n, 2)
    sent_prev = None
    for t in range(1, 5):
        m = [m for m in tr.messages if m.t == t and m.tag == "x"][0]
        sent = torch.zeros(n, 2, dtype=torch.float64).index_copy_(0, m.src.long(), m.payload.to(torch.float64))
        x = W @ sent_prev if sent_prev is not None else sent - sent + sent.mean(0)  # round 1: the common start
        noise = sent - x if t > 1 else sent - task.init_params(Keys(0, n).generator("init")).to(torch.float64)
        want = psgt_variance(t, variance=0.1, decay=0.8, root=True)
        assert abs(float((noise**2).mean()) / want - 1) < Z * math.sqrt(5 / noise.numel()), t
        sent_prev = sent


# ---- tasks ------------------------------------------------------------------------------------------------------
def test_filtering_optimum_matches_least_squares_on_many_samples():
    task = make_task("adaptive_filtering", 5, heterogeneous=True)
    keys = Keys(9, 5)
    from privdl.keys import Draws

    X, d = [], []
    for c in range(1, 4001):
        x, y = task.sample(Draws(keys, "batch", c), torch.arange(5))
        X.append(x[:, 0]), d.append(y[:, 0])
    X, d = torch.cat(X).numpy(), torch.cat(d).numpy()
    ls = np.linalg.lstsq(X, d, rcond=None)[0]
    assert np.linalg.norm(ls - task.w_star) < 0.05 * (1 + np.linalg.norm(task.w_star))
    homog = make_task("adaptive_filtering", 5, heterogeneous=False)
    assert np.allclose(homog.w_star, homog.w_o[0].numpy())  # one w°: w* = w°


def test_filtering_switch_flips_the_optimum_and_the_data():
    task = make_task("adaptive_filtering", 3, switch_at=10, exact_gradient=True)
    task.at_round(10)
    before = task.optimum().clone()
    task.at_round(11)
    assert torch.allclose(task.optimum(), -before)
    # the metrics: zero at w*, and ‖∇J(w̄)‖² equals autograd of J = (1/K) Σ ½(w − w°_k)ᵀR_k(w − w°_k) elsewhere
    at_opt = task.metrics(task.optimum()[None].expand(3, -1).clone())
    assert at_opt["msd"] < 1e-28 and at_opt["grad_norm_sq"] < 1e-28
    w = torch.randn(3, task.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    wbar = w.mean(0).requires_grad_(True)
    diff = wbar[None] - task.sign() * task.w_o
    (torch.einsum("ki,kij,kj->", diff, task.R, diff) / (2 * 3)).backward()
    assert task.metrics(w)["grad_norm_sq"] == pytest.approx(float((wbar.grad**2).sum()), rel=1e-12)


def test_localization_optimum_is_near_the_target_and_bad_anchors_are_refused():
    task = make_task("localization", 4)
    assert np.linalg.norm(task.w_star - np.array([3.0, 7.0])) < 1e-3
    with pytest.raises(ValidationError, match="coincide"):
        make_task("localization", 4, anchors=[[0, 0], [0, 0], [1, 1], [2, 0]])
    with pytest.raises(ValidationError, match="one anchor per agent"):
        make_task("localization", 5)


# ---- the eavesdropper -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_eavesdropper_recovers_w_star_from_unprotected_dsgd_but_not_from_dsg_rms():
    net = _net()
    task = make_task("adaptive_filtering", 5, heterogeneous=False, exact_gradient=False)
    out = {}
    for alg in ("dsgd", "pd_lms", "dsg_rms"):
        a = make_algorithm(alg)
        ev = Eavesdropper(5, window=200, target=task.optimum, wire=a.wire)
        out[alg] = _final(_run(a, net, task, 3000, 0.05, observers=[ev]))
    scale = float((task.optimum() ** 2).sum())
    assert out["dsgd"]["eavesdropper_msd"] < 0.01 * scale
    assert out["pd_lms"]["eavesdropper_msd"] < 0.01 * scale
    assert out["dsg_rms"]["eavesdropper_msd"] > 0.1 * scale
    assert out["dsg_rms"]["msd"] < 0.05 * scale  # ... while the agents themselves learn w*
    # the adaptive eavesdropper knows the norm law and τ and undoes it
    assert out["dsg_rms"]["adaptive_eavesdropper_msd"] < 0.01 * scale


# ---- theory helpers, config contract ------------------------------------------------------------------------------
def test_rms_bounds_match_the_closed_forms_on_the_lazy_complete_graph():
    from privdl.algorithms.rms_bounds import rms_bounds

    K, L = 4, 3
    W = 0.5 * (np.eye(K) + np.full((K, K), 1 / K))  # eigenvalues 1 and ½ (K − 1 times)
    b = rms_bounds(W, dim=L, mu=1.0, sigma_mu=0.1, sigma_z=0.2, smoothness=2.0, strong_convexity=0.5)
    s2 = 0.01 + (L - 1) * 0.04
    assert b["norm_D"] == pytest.approx(0.5) and b["sigma_b"] == pytest.approx(0.5)
    assert b["dsg_rms_gamma_convex_eq12"] == pytest.approx(0.5 / (14 * 2.0 * (1 + s2)))
    assert b["dsg_rms_tau_eq13"] == pytest.approx(0.5 / (math.sqrt(8) * 0.5))
    assert b["edsg_rms_tau_eq18"] == pytest.approx(0.5 * math.sqrt(0.5) / math.sqrt(16))
    assert b["edsg_rms_gamma_convex_eq17"] == pytest.approx(
        min(0.5 * math.sqrt(0.5) / (28 * 2 * (math.sqrt(s2) + 1)), 1 / (4 * (2 + s2))))
    from privdl.algorithms.rms_bounds import warn_outside

    assert warn_outside("dsg_rms", b, gamma=1e-9, tau=0.0) == []  # inside: silent
    with pytest.warns(UserWarning, match="eq13"):
        assert len(warn_outside("dsg_rms", b, gamma=1e-9, tau=1.0)) == 1
    plain = rms_bounds(np.full((K, K), 1 / K), dim=L, smoothness=1.0)  # eigenvalue 0: not positive definite
    assert plain["edsg_rms_gamma_convex_eq17"] is None and plain["dsg_rms_gamma_strongly_convex_eq15"] is None


def test_a_config_drives_every_seed_002_name_and_writes_msd_and_the_eavesdroppers(tmp_path):
    from privdl.experiment.config import expand
    from privdl.experiment.runner import run_experiment
    from privdl.experiment.store import ResultStore

    cfg = {"name": "contract", "iterations": 200, "eval_every": 50, "seeds": [0, 1],
           "network": {"topology": "erdos_renyi", "n": 5, "p": 0.6, "seed": 1, "mixing": "laplacian", "lazy": True},
           "task": {"name": "adaptive_filtering", "dim": 4, "heterogeneous": True, "exact_gradient": False,
                    "switch_at": 100, "seed": 3},
           "algorithm": {"name": "dsgd"}, "schedule": {"name": "constant", "eta": 0.02},
           "sweep": {"algorithm.name": ["dsgd", "exact_diffusion", "dsg_rms", "edsg_rms", "pd_lms", "psgt"]}}
    with pytest.warns(UserWarning, match=r"dsg_rms runs outside .*\|τ\| = 1 > eq13"):
        summary = run_experiment(cfg, tmp_path / "out", progress=False)
    assert summary.runs == 12
    import csv

    rows = list(csv.DictReader(open(summary.results)))
    assert {"msd", "msd_db", "eavesdropper_msd", "grad_norm_sq_avg"} <= {r["metric"] for r in rows}
    adaptive = {r["algorithm.name"] for r in rows if r["metric"] == "adaptive_eavesdropper_msd"}
    assert adaptive == {"dsg_rms", "edsg_rms"}
    spec = next(s for s in expand(cfg)[0] if s.config["algorithm"]["name"] == "dsg_rms")
    man = ResultStore(tmp_path / "out").manifest(spec.run_id)
    assert man["algorithm"]["sigma_mu"] == 0.01 and man["algorithm"]["structure"] == "dense"
    assert man["privacy_ledger"][0]["epsilon"] is None
    assert "no DP guarantee" in man["privacy_ledger"][0]["guarantee"]
    pd = next(s for s in expand(cfg)[0] if s.config["algorithm"]["name"] == "pd_lms")
    events = ResultStore(tmp_path / "out").manifest(pd.run_id)["privacy_ledger"][0]["per_agent"][0]["events"]
    assert events[0]["kind"] == "laplace" and "unbounded" in events[0]["reason"]


def test_bad_seed_002_settings_are_refused_at_the_boundary():
    from privdl.experiment.config import expand

    base = {"network": {"n": 5, "p": 0.6, "mixing": "laplacian"}, "task": {"name": "adaptive_filtering"},
            "iterations": 10, "schedule": {"name": "constant", "eta": 0.01}}
    for algorithm, match in (({"name": "pd_lms", "variance": -1.0}, "variance"),
                             ({"name": "psgt", "decay": 1.5}, "decay"),
                             ({"name": "dsg_rms", "mu": -1.0}, "mu must be > 0"),
                             ({"name": "dsg_rms", "structure": "triangular"}, "triangular")):
        with pytest.raises(PrivdlError, match=match):
            cfg = dict(base, algorithm=algorithm)
            for spec in expand(cfg)[0]:
                from privdl.experiment.build import build

                build(spec.config)
    with pytest.raises(PrivdlError, match="eavesdropper_window"):
        expand(dict(base, eavesdropper_window=-1))
    with pytest.raises(ValidationError, match="switch_at"):
        make_task("adaptive_filtering", 3, switch_at=-2)


@pytest.mark.slow
def test_rms_reproductions_run_end_to_end_on_a_small_budget(tmp_path):
    import csv

    from privdl.reproductions import REPRODUCTIONS

    summary = REPRODUCTIONS.get("rms_filtering")(tmp_path / "f", seeds=2, iterations=200)
    assert {r["method"] for r in summary} == {"DSG", "EDSG", "DSG-RMS", "EDSG-RMS", "PD-LMS", "PSGT"}
    assert len(summary) == 24 and all(r["runs"] == 2 for r in summary)
    c = list(csv.DictReader(open(tmp_path / "f" / "rms_filtering_c.csv")))
    assert c[-1]["iteration"] == "200"
    # Fig. 1(c)'s ψ is recovered from the transcript with eq. (5c); ψᶜ − ψ is the norm protection (τ/√L)‖w(n−1)‖
    last = c[-1]
    assert float(last["psi_c"]) - float(last["psi"]) > 0
    loc = REPRODUCTIONS.get("rms_localization")(tmp_path / "l", seeds=2, iterations=50)
    assert len(loc) == 6
    assert (tmp_path / "l" / "rms_localization_exact_gradient=False.png").is_file()
    # Fig. 3(a): 4 anchors, the target, and per method 4 final estimates and 4 eavesdropper averages
    field = list(csv.DictReader(open(tmp_path / "l" / "rms_localization_a.csv")))
    kinds = [r["kind"] for r in field]
    assert kinds.count("anchor") == 4 and kinds.count("target") == 1
    for m in ("DSG-RMS", "EDSG-RMS", "PD-LMS"):
        assert kinds.count(f"{m} final estimates") == 4 and kinds.count(f"{m} eavesdropper's averages") == 4
    # Fig. 3(c): both coordinates at agent 1 every round; ψᶜ − ψ is the norm protection on each coordinate
    c3 = list(csv.DictReader(open(tmp_path / "l" / "rms_localization_c.csv")))
    assert [int(r["iteration"]) for r in c3] == list(range(1, 51))
    assert all(float(c3[-1][f"dsg_rms_psi_c_{k}"]) - float(c3[-1][f"dsg_rms_psi_{k}"]) > 0 for k in (1, 2))
    assert float(c3[-1]["dsg_rms_w_star_1"]) == pytest.approx(float(field[4]["x"]), abs=0.05)  # w* ≈ the target
    for name in ("rms_localization_a.png", "rms_localization_c_x1.png", "rms_localization_c_x2.png"):
        assert (tmp_path / "l" / name).stat().st_size > 10_000
