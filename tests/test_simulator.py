import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from privdl.algorithms import make_algorithm
from privdl.mechanisms import clip_rows, make_mechanism
from privdl.network import Network
from privdl.schedules import make_schedule
from privdl.gradients import per_agent_gradients, per_example_gradients
from privdl.simulator import simulate
from privdl.simulator.reference import loop_private_dsgd
from privdl.tasks import make_task, quadratic_optimum, quadratic_problem
from tests.conftest import draw_batch


def test_quadratic_optimum_matches_a_numerical_minimiser():
    A, c = quadratic_problem(20)
    x_star, f_star = quadratic_optimum(A, c)

    def F(x):
        d = x[None] - c
        return np.einsum("ki,kij,kj->k", d, A, d).mean()

    res = minimize(F, np.array([3.0, -2.0]), method="BFGS", options={"gtol": 1e-10})
    assert np.allclose(res.x, x_star, atol=1e-5) and res.fun == pytest.approx(f_star, rel=1e-9)


def test_quadratic_rotation_keeps_the_local_minimisers():
    A, c = quadratic_problem(6)
    assert c[:3, 0].tolist() == [-1, -2, -3] and c[3:, 0].tolist() == [4, 5, 6]
    assert np.allclose(np.linalg.eigvalsh(A[5]), [1, 15]) and not np.allclose(A[5], np.diag([15, 1]))


def test_quadratic_offers_both_optimality_gaps():
    """(1/n)Σ F(x_i) − F* and the seed's (1/n)Σ f_i(x_i) − F*: equal at consensus on x*, and at every agent's own
    minimiser the seed's metric is −F* (each f_i is 0 there) while the other is the mean of F over the c_i."""
    task = make_task("quadratic", 6)
    A, c = quadratic_problem(6)
    _, f_star = quadratic_optimum(A, c)
    at_star = task.metrics(torch.as_tensor(task.x_star).expand(6, 2).clone())
    assert at_star["optimality_gap"] == pytest.approx(0.0, abs=1e-9)
    assert at_star["local_optimality_gap"] == pytest.approx(0.0, abs=1e-9)
    own = task.metrics(torch.as_tensor(c))
    assert own["local_optimality_gap"] == pytest.approx(-f_star, rel=1e-12)
    F = [np.einsum("ki,kij,kj->k", ci[None] - c, A, ci[None] - c).mean() for ci in c]
    assert own["optimality_gap"] == pytest.approx(np.mean(F) - f_star, rel=1e-12)


@pytest.mark.parametrize("task_name,params", [
    ("logistic", {"dataset": "breast_cancer", "batch_size": 8, "l2": 0.01}),
    ("softmax", {"dataset": "digits", "batch_size": 6}),
    ("mlp", {"dataset": "digits", "batch_size": 5, "hidden": 16}),
    ("quadratic", {}),
])
def test_per_example_gradients_equal_a_per_sample_loop(task_name, params):
    task = make_task(task_name, 3, dtype=torch.float64, **params)
    gen = torch.Generator().manual_seed(0)
    x = task.init_params(gen).expand(3, -1).clone() + 0.01 * torch.randn(3, task.dim, generator=gen,
                                                                             dtype=torch.float64)
    batch = draw_batch(task)
    pe = per_example_gradients(task, x, batch)
    for i in range(3):
        for b in range(batch[0].shape[1]):
            theta = x[i].clone().requires_grad_(True)
            loss = task.loss(theta, *(t[i, b:b + 1] for t in batch))
            (g,) = torch.autograd.grad(loss, theta)
            assert torch.allclose(pe[i, b], g, atol=1e-12)
    # and the mean of per-example gradients is the mini-batch gradient
    assert torch.allclose(pe.mean(dim=1), per_agent_gradients(task, x, batch), atol=1e-12)


@pytest.mark.parametrize("task_name,params", [
    ("logistic", {"dataset": "breast_cancer", "batch_size": 8, "l2": 0.1}),
    ("softmax", {"dataset": "digits", "batch_size": 6}),
    ("quadratic", {}),
])
def test_closed_form_gradients_equal_torch_func(task_name, params):
    task = make_task(task_name, 4, dtype=torch.float64, **params)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, task.dim, generator=gen, dtype=torch.float64) * 0.1
    batch = draw_batch(task, seed=1)
    assert torch.allclose(task.batched_grad(x, batch), per_agent_gradients(task, x, batch), atol=1e-12)


@pytest.mark.exact
def test_clipping_caps_norms_and_leaves_small_rows():
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64)
    out = clip_rows(g, 1.0)
    assert torch.allclose(out[0], torch.tensor([0.6, 0.8], dtype=torch.float64))
    assert torch.equal(out[1], g[1]) and torch.equal(out[2], g[2])


def _setup(T=60, eps=5.0, batch_size=8):
    net = Network.from_topology("erdos_renyi", 6, p=0.5, seed=1)
    task = make_task("logistic", 6, dataset="breast_cancer", partition="dirichlet", alpha=1.0,
                     batch_size=batch_size)
    mech = make_mechanism("gaussian_ldp", steps=T, network=net, clip=0.5, epsilon=eps, delta=1e-5)
    return net, task, mech, make_schedule("constant", eta=0.1, iterations=T)


@pytest.mark.parametrize("batch_size,epsilon", [(8, 5.0), (5, 1000.0)])
@pytest.mark.parametrize("gradient", ["closed_form", "torch_func"])
@pytest.mark.exact
def test_simulator_equals_the_per_agent_loop_bit_for_bit(gradient, batch_size, epsilon):
    """Each agent alone (its own keyed batch and noise, the canonical combination order) gives exactly the
    simulator's numbers when it evaluates its gradient through the simulator's kernel at the simulator's shape
    (``shape="network"``): the kernels then do the same operations in the same order on its row, on any CPU, so the
    equality holds by construction (privdl.simulator.reference). It once held only by luck: with one row per agent,
    an agent's 8 logits were a whole AVX2 vector block of ATen's loops but a scalar remainder under AVX-512, whose
    vectorised and scalar sigmoids differ in the last bit (the suite failed on AVX-512 machines). B = 5 makes the
    same split on every vector width (an agent's 5 logits alone are a remainder; the 6 agents' 30 are mostly whole
    blocks), and ε = 1000 keeps the noise small enough not to round the difference away: on an AVX2 machine the
    one-row loop then ends 1e-16 away from the simulator (measured), as AVX-512 machines saw at B = 8, ε = 5.

    One row per agent (``shape="agent"``, what a one-agent process computes) and the dense BLAS backend use other
    kernels and agree to rounding: the bound of conftest.rounding_tolerance, with about 4d + 2B + 2·(degree + 1)
    operations per entry and round on values bounded by the noise's 8.3σ (|Φ⁻¹| ≤ 8.3 for the keyed draws)."""
    from tests.conftest import rounding_tolerance

    T = 60
    net, task, mech, sch = _setup(T, eps=epsilon, batch_size=batch_size)
    run = dict(task=task, network=net, algorithm=make_algorithm("dsgd"), mechanism=mech, schedule=sch,
               iterations=T, seed=7, gradient=gradient)
    loop = dict(iterations=T, seed=7, clip=0.5, sigma=mech.sigma, gradient=gradient)
    res = simulate(sparse=True, **run)
    loop_x, _ = loop_private_dsgd(task, net, sch, shape="network", **loop)
    assert torch.equal(res.final, loop_x)
    ops = 4 * task.dim + 2 * batch_size + 2 * (int(net.edges.degree.max()) + 1)
    tol = rounding_tolerance(rounds=T, ops=ops, scale=8.3 * mech.sigma + 1.0)
    one_row, _ = loop_private_dsgd(task, net, sch, shape="agent", **loop)
    dense = simulate(sparse=False, **run)
    assert float((one_row - loop_x).abs().max()) <= tol and float((dense.final - loop_x).abs().max()) <= tol
    assert tol < 1e-6 < float((res.final - res.final.mean(0)).abs().max())  # the bound is far below the spread


@pytest.mark.exact
def test_run_is_bit_reproducible_and_seed_dependent():
    net, task, mech, sch = _setup(30)
    kw = dict(task=task, network=net, algorithm=make_algorithm("dsgd"), mechanism=mech, schedule=sch, iterations=30)
    a, b, c = simulate(seed=3, **kw), simulate(seed=3, **kw), simulate(seed=4, **kw)
    assert torch.equal(a.final, b.final) and not torch.equal(a.final, c.final)


def test_ldp_noise_has_the_calibrated_variance():
    """The privatised zero gradient is the noise alone; its variance is 1/b with b computed here from the tight
    accountant's GDP closed form (μ = 2C√(Tb)), not read from the mechanism."""
    import math

    from privdl.keys import Keys
    from privdl.mechanisms import Access, MechanismEnv
    from privdl.privacy.agent_accountant import gdp_delta

    net = Network.from_topology("complete", 50)
    mech = make_mechanism("gaussian_ldp", steps=100, network=net, clip=1.0, epsilon=2.0, delta=1e-5)
    mech.bind(MechanismEnv(Keys(0, 50)))
    rows = torch.arange(50)
    v = mech.privatize(torch.zeros(50, 4000, dtype=torch.float64), Access(rows, rows, 1))
    lo, hi = 1e-3, 10.0  # μ with δ(2; μ) = 1e-5, by bisection
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gdp_delta(epsilon=2.0, mu=mid) < 1e-5 else (lo, mid)
    b = lo**2 / (4 * 1.0**2 * 100)
    # sample variance of 200k N(0, s^2) draws: relative std sqrt(2/200k) ~ 0.3%; 5 sigma band -> false alarm ~6e-7
    assert float(v.var()) == pytest.approx(1 / b, rel=5 * (2 / v.numel()) ** 0.5)
    assert math.isclose(mech.bound, b, rel_tol=1e-9)


def test_nonprivate_dsgd_on_the_quadratic_has_a_bias_that_shrinks_with_the_step_size():
    # constant-step D-SGD on heterogeneous objectives stalls at a gap that shrinks with eta
    n, T = 10, 3000
    net = Network.from_topology("erdos_renyi", n, p=0.5, seed=0)
    task = make_task("quadratic", n)
    final = {}
    for eta in (0.003, 0.0005):
        res = simulate(task=task, network=net, algorithm=make_algorithm("dsgd"),
                       mechanism=make_mechanism("none", steps=T), schedule=make_schedule("constant", eta=eta,
                       iterations=T), iterations=T, seed=0)
        gaps = [v for t, m, v in res.records if m == "optimality_gap"]
        final[eta] = gaps[-1]
    assert final[0.0005] < 0.25 * final[0.003] < 0.25 * gaps[0]


def test_central_sgd_keeps_agents_identical_and_learns():
    net, task, _, sch = _setup(50)
    res = simulate(task=task, network=net, algorithm=make_algorithm("central_sgd"),
                   mechanism=make_mechanism("none", steps=50), schedule=sch, iterations=50, seed=0)
    assert torch.allclose(res.final, res.final[:1].expand_as(res.final))
    acc = [v for t, m, v in res.records if m == "test_accuracy"]
    assert acc[-1] > 0.9


@pytest.mark.parametrize("name,params,t,expected", [
    ("constant", {"eta": 0.1}, 7, 0.1), ("inv_sqrt", {"eta": 0.1}, 4, 0.05), ("inv_t", {"eta": 0.1}, 4, 0.025),
    ("geometric", {"eta_start": 1.0, "eta_end": 0.01}, 11, 0.01), ("geometric", {"eta_start": 1.0, "eta_end": 0.01}, 6, 0.1),
])
def test_schedules(name, params, t, expected):
    assert make_schedule(name, iterations=11, **params)(t) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["dsgd", "dsgt"])
def test_authors_gossip_matches_their_node_by_node_loops(name):
    """gossip = 'authors' against a literal transcription of seed 004's code (jbayrooti/dp-dec-learning,
    image_systems.py: DistributedConsensusSystem / DSGTSystem), node by node with in-place updates, on the
    quadratic task whose gradients are exact: W = neighbour averages 1/(deg+1), DSGT's y⁰ = g⁰ = 0."""
    import networkx as nx

    from privdl.algorithms import make_algorithm
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network
    from privdl.schedules import make_schedule
    from privdl.simulator import simulate

    n, T, eta = 6, 7, 0.01
    net = Network.from_topology("erdos_renyi", n, p=0.5, seed=4)
    task = make_task("quadratic", n)
    A, c = quadratic_problem(n)
    params = {"form": "cta", "gossip": "authors"} if name == "dsgd" else {"gossip": "authors"}
    res = simulate(task=task, algorithm=make_algorithm(name, **params), mechanism=make_mechanism("none", steps=T),
                   schedule=make_schedule("constant", eta=eta, iterations=T), iterations=T, network=net, seed=0,
                   metrics=False)
    x0 = task.init_params(torch.Generator().manual_seed(0)).numpy()
    theta = [x0.copy() for _ in range(n)]
    y = [np.zeros(2) for _ in range(n)]
    g_old = [np.zeros(2) for _ in range(n)]
    nbrs = [sorted(net.graph.neighbors(i)) for i in range(n)]
    w = [1.0 / (len(nb) + 1) for nb in nbrs]
    grad = lambda i, th: 2 * A[i] @ (th - c[i])  # noqa: E731
    for _ in range(T):
        if name == "dsgd":
            for i in range(n):  # communicate, in place
                theta[i] = w[i] * theta[i] + sum(w[i] * theta[j] for j in nbrs[i])
            for i in range(n):  # then each node's SGD step at its averaged model
                theta[i] = theta[i] - eta * grad(i, theta[i])
        else:
            for i in range(n):  # weight_update
                theta[i] = w[i] * theta[i] - eta * w[i] * y[i] + sum(w[i] * theta[j] - eta * w[i] * y[j]
                                                                      for j in nbrs[i])
            for i in range(n):  # gradient_update
                g = grad(i, theta[i])
                y[i] = w[i] * y[i] + sum(w[i] * y[j] for j in nbrs[i]) + g - g_old[i]
                g_old[i] = g
    assert nx.is_connected(net.graph)
    np.testing.assert_allclose(res.final.numpy(), np.array(theta), rtol=1e-10, atol=1e-10)
