"""Example-level DP-SGD runs stacked on the replica axis (issue 32): every replica equals its single run, keeps its
own σ, lot size, keys and access budget, and the runner stacks such runs in a grid with a memory cap."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.errors import ConfigError
from privdl.experiment import run_experiment
from privdl.mechanisms import make_mechanism
from privdl.mechanisms.base import AccessBudgetExceeded
from privdl.mechanisms.stack import StackedDPSGD, may_stack, stack
from privdl.network import Network
from privdl.privacy.ledger import Ledger
from privdl.schedules import make_schedule
from privdl.simulator import Replica, simulate, simulate_replicas
from privdl.tasks import make_task

T = 12
#: (σ, η, root seed, ER edge probability) of the stacked replicas: different noise multipliers, step sizes, seeds and
#: graphs; replicas 0 and 2 share a seed and a graph (their own draws are then the same numbers, drawn once)
SPECS = [(1.5, 0.1, 0, 0.6), (0.7, 0.3, 1, 0.8), (1.1, 0.2, 0, 0.6)]
ALGORITHMS = [("dsgd", {}), ("dsgt", {}), ("dinno", {"optimizer": "sgd"}), ("dpdl", {}), ("dpdl", {"self_noise": True}),
              ("central_sgd", {})]


@pytest.fixture(scope="module")
def task():
    return make_task("softmax", 5, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)


def _replicas(task, alg, specs=SPECS, lot_size=20, iterations=T):
    out = []
    for sigma, eta, seed, p in specs:
        net = Network.from_topology("erdos_renyi", 5, p=p, seed=seed)
        mech = make_mechanism("dp_sgd", steps=alg.accesses(iterations, net.edges), task=task, clip=1.0,
                              lot_size=lot_size, noise_multiplier=sigma)
        out.append(Replica(net, mech, make_schedule("constant", eta=eta, iterations=iterations), seed))
    return out


@pytest.mark.parametrize("name,params", ALGORITHMS, ids=[f"{n}{'-self_noise' if p.get('self_noise') else ''}"
                                                         for n, p in ALGORITHMS])
@pytest.mark.exact
def test_stacked_replicas_equal_their_single_runs(task, name, params):
    """DP-DSGD, DP-DSGT, DP-DiNNO, DPDL (published, and with self noise: cross-gradients keyed by owner and
    requester), central DP-SGD: each replica of a stack with other σ, η, seeds and graphs ends where its single run
    does. Replicas 0 and 2 (the graph and seed of their single runs, so the same mixing products in the same shapes
    as the first block of the stack) are bit for bit equal; replica 1 to rounding: its single run mixes with one
    n×n product, the stack with a batched product over the replicas' W, and the clipped sums see other row groups
    (conftest.rounding_tolerance, 2·(degree + 1) operations per entry per exchange and 16 for the gradient step).
    The accesses each replica made are its single run's."""
    from tests.conftest import rounding_tolerance, watch_privatised

    alg = make_algorithm(name, **params)
    res = simulate_replicas(task=task, algorithm=alg, replicas=_replicas(task, alg), iterations=T)
    for r, rep in enumerate(_replicas(task, alg)):
        seen = watch_privatised(rep.mechanism)
        single = simulate(task=task, network=rep.network, algorithm=alg, mechanism=rep.mechanism,
                          schedule=rep.schedule, iterations=T, seed=rep.seed)
        assert torch.equal(res.accesses[r], single.accesses)
        gap = float((res.final[r] - single.final).abs().max())
        ops = 4 * (int(rep.network.edges.degree.max()) + 1) + 16
        tol = rounding_tolerance(rounds=T, ops=ops, scale=max(seen) + float(single.final.abs().max()))
        assert gap <= tol < 1e-8, (r, gap, tol)
        # a wrong key, σ or lot size moves the model by about η·σ·C/L per step: far above the tolerance
        assert float(single.final.abs().max()) > 1e3 * tol


def test_a_wrong_sigma_or_key_would_be_seen(task):
    """The comparison above can fail: a replica stepped with another replica's σ (or keys) ends far from its single
    run (the size of the effect the tolerance must be small against)."""
    alg = make_algorithm("dsgd")
    reps = _replicas(task, alg)
    swapped = [Replica(reps[0].network, reps[1].mechanism, reps[0].schedule, reps[0].seed), *reps[1:]]
    res = simulate_replicas(task=task, algorithm=alg, replicas=swapped, iterations=T)
    r0 = _replicas(task, alg)[0]
    single = simulate(task=task, network=r0.network, algorithm=alg, mechanism=r0.mechanism, schedule=r0.schedule,
                      iterations=T, seed=r0.seed)
    assert float((res.final[0] - single.final).abs().max()) > 1e-3


def test_each_replica_keeps_its_sigma_lot_and_budget(task):
    """The stacked mechanism holds replica r's σ_j·C and lot size on its rows, and refuses an access beyond the
    accounting of the replica whose budget is smallest (its σ was calibrated for fewer accesses)."""
    alg = make_algorithm("dsgd")
    reps = _replicas(task, alg, specs=SPECS[:2], lot_size=20)
    # one public sampling rate: the lots are drawn alike, the lot size only normalises (and may differ)
    first = make_mechanism("dp_sgd", steps=T, task=task, clip=1.0, lot_size=20, sample_rate=0.1, epsilon=2.0)
    short = make_mechanism("dp_sgd", steps=T - 2, task=task, clip=1.0, lot_size=10, sample_rate=0.1, epsilon=3.0)
    reps[0] = Replica(reps[0].network, first, reps[0].schedule, reps[0].seed)
    mechs = [first, short]
    stacked = stack(mechs, 5)
    assert isinstance(stacked, StackedDPSGD)
    assert torch.equal(stacked.scale[:5], first.sigmas * 1.0)
    assert torch.equal(stacked.scale[5:], short.sigmas * 1.0)
    assert not torch.equal(first.sigmas, short.sigmas)
    assert stacked.lot.tolist() == [20.0] * 5 + [10.0] * 5
    assert torch.equal(stacked.steps, torch.cat([first.steps, short.steps]))
    reps[1] = Replica(reps[1].network, short, reps[1].schedule, reps[1].seed)
    with pytest.raises(AccessBudgetExceeded, match="replica 1"):
        simulate_replicas(task=task, algorithm=alg, replicas=reps, iterations=T)
    # DP-SGD with another clip (another per-example computation) or a correlated mechanism does not stack with it
    other = make_mechanism("dp_sgd", steps=T, task=task, clip=2.0, lot_size=20, sample_rate=0.1, epsilon=3.0)
    assert stack([first, other], 5) is None
    assert stack([first, make_mechanism("ldp", steps=T, network=reps[0].network, clip=1.0, epsilon=3.0)], 5) is None
    assert may_stack("dp_sgd") and not may_stack("clip")


def _grid(tmp_path, **top):
    cfg = {"name": "g", "iterations": 8, "eval_every": 4, "seeds": 2,
           "task": {"name": "softmax", "dataset": "digits", "partition": "dirichlet", "alpha": 1.0, "batch_size": 8},
           "network": {"topology": "ring", "n": 5},
           "mechanism": {"name": "dp_sgd", "clip": 1.0, "lot_size": 20, "sample_rate": 0.08, "delta": 1e-5,
                         "epsilon": 2.0, "accountant": "rdp"},  # RDP: checked below against dp_accounting's own
           "schedule": {"name": "constant", "eta": 0.1},
           "sweep": {"mechanism.epsilon": [1.0, 4.0], "schedule.eta": [0.1, 0.3],
                     "method": [{"label": "DPDL", "algorithm": {"name": "dpdl", "self_noise": True}},
                                {"label": "DP-DSGT", "algorithm": {"name": "dsgt"}}]},
           **top}
    return cfg


def _rows(folder):
    import csv

    with open(folder / "results.csv") as fh:
        return {(r["run_id"], r["iteration"], r["metric"]): float(r["value"]) for r in csv.DictReader(fh)}


@pytest.mark.slow
def test_a_grid_stacks_dp_sgd_runs_and_each_ledger_reaccounts_to_its_target(tmp_path):
    """Through the runner: the DP-SGD runs of one algorithm and seed share a batch (DPDL's too, as asked with
    batch_replicas; on the CPU it runs alone by default, tests/test_results_store.py); each run's manifest states its
    own σ, its own ε (re-accounted from the σ and accesses it used: at most its target and within 2 % of it) and the
    batch it ran in; results equal the unstacked grid's (batch_replicas = 1) to rounding."""
    stacked = run_experiment(_grid(tmp_path, seeds=1, batch_replicas=4), tmp_path / "stacked", progress=False)
    alone = run_experiment(_grid(tmp_path, seeds=1, batch_replicas=1), tmp_path / "alone", progress=False)
    assert stacked.executed == alone.executed == 8
    sizes = set()
    for man_path in (tmp_path / "stacked" / "runs").glob("*/manifest.json"):
        man = json.loads(man_path.read_text())
        sizes.add(man["batch"]["replicas"])
        led = Ledger.from_dict(man["privacy_ledger"][0])
        target = man["config"]["mechanism"]["epsilon"]
        assert led.epsilon <= target * (1 + 1e-9) and led.epsilon >= 0.98 * target, (led.epsilon, target)
        assert man["device_info"]["type"] == "cpu"
        # every owner's own σ_j, re-accounted with dp_accounting's RDP for its q_j and the accesses it made
        agents = man["privacy_ledger"][0]["per_agent"]
        assert len(agents) == 5 and sorted(a["noise_multiplier"] for a in agents) == sorted(
            man["mechanism"]["noise_multiplier"])
        for a in agents:
            acc = dp_accounting.rdp.RdpAccountant()  # dp_accounting itself, not our wrapper
            acc.compose(dp_accounting.PoissonSampledDpEvent(
                a["sample_rate"], dp_accounting.GaussianDpEvent(a["noise_multiplier"])), a["accesses"])
            eps = acc.get_epsilon(1e-5)
            assert eps <= target * (1 + 1e-9) and eps >= 0.98 * target, (a["agent"], eps, target)
    assert sizes == {4}  # per algorithm: 2 ε × 2 η
    a, b = _rows(tmp_path / "stacked"), _rows(tmp_path / "alone")
    assert a.keys() == b.keys()
    worst = max(abs(a[k] - b[k]) / max(1.0, abs(a[k])) for k in a)
    assert worst < 1e-9, worst


def test_mixed_dtypes_never_share_a_batch_and_the_cap_bounds_memory(tmp_path):
    """A grid over dtypes stacks float32 and float64 runs apart (each equals its own single run); a replica too
    large for the budget runs alone (the cap is at least 1, never a crash); batch_replicas < 0 is refused."""
    from privdl.experiment.build import build
    from privdl.experiment.config import expand
    from privdl.experiment.capacity import BATCH_BUDGET, CPU_ACCESS_BUDGET, batch_inputs, capacity, replica_numbers

    cfg = _grid(tmp_path)
    cfg["sweep"] = {"dtype": ["float32", "float64"], "mechanism.epsilon": [1.0, 4.0],
                    "method": [{"label": "DP-DSGT", "algorithm": {"name": "dsgt"}}]}
    cfg["seeds"] = 1
    run_experiment(cfg, tmp_path / "mixed", progress=False)
    mans = [json.loads(p.read_text()) for p in (tmp_path / "mixed" / "runs").glob("*/manifest.json")]
    assert len(mans) == 4 and {m["batch"]["replicas"] for m in mans} == {2}
    by_dtype = {}
    for m in mans:
        by_dtype.setdefault(m["config"]["dtype"], set()).add(m["batch"]["replicas"])
    assert set(by_dtype) == {"float32", "float64"}
    spec = expand(cfg)[0][0]
    parts = build(spec.config)
    per = replica_numbers(parts)
    assert per > 5 * parts.task.dim  # the model state and the lot's examples
    access = parts.network.n * batch_inputs(parts.task, parts.mechanism.need)  # one access's inputs
    assert capacity(spec.config, parts) == max(1, min(BATCH_BUDGET // per, CPU_ACCESS_BUDGET // access))
    import privdl.experiment.capacity as caps

    old = caps.BATCH_BUDGET
    caps.BATCH_BUDGET = per // 2  # one replica does not fit: it runs alone, the grid still finishes
    try:
        assert capacity(spec.config, parts) == 1
        summary = run_experiment({**cfg, "seeds": [5]}, tmp_path / "capped", progress=False)
    finally:
        caps.BATCH_BUDGET = old
    assert summary.executed == 4
    assert {json.loads(p.read_text())["batch"]["replicas"]
            for p in (tmp_path / "capped" / "runs").glob("*/manifest.json")} == {1}
    with pytest.raises(ConfigError, match="batch_replicas"):
        run_experiment({**cfg, "batch_replicas": -1}, tmp_path / "bad", progress=False)
    assert math.isfinite(per)


def test_on_a_gpu_the_stack_is_sized_for_its_free_memory(monkeypatch):
    """device = "cuda": the budget is a quarter of the GPU's free memory now (in float64 numbers) — on an 80 GB GPU
    one process holds 80× the CPU's replicas; on a GPU others have filled, fewer (at least one: the cap is ≥ 1). No
    GPU here: the device query is stubbed."""
    import privdl.experiment.capacity as caps
    from privdl.experiment.capacity import BATCH_BUDGET, GPU_SHARE, batch_budget

    assert batch_budget("cpu") == BATCH_BUDGET
    monkeypatch.setattr(caps, "resolve_device", lambda d: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (80 * 2**30, 94 * 2**30))
    assert batch_budget("cuda") == int(GPU_SHARE * 80 * 2**30) // 8 == 80 * BATCH_BUDGET
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (2**20, 94 * 2**30))  # a full GPU
    assert batch_budget("cuda") == 2**15
