"""Metrics where the agents live (issue 44, item 4): on a recorded round each process of a distributed run evaluates
its own agents and sends process 0 only the scalars a metric needs; the models' average x̄, which the consensus
distance and the metrics of the average model need, is summed at the last process, not at process 0. So what process
0 receives per recorded round does not grow with the models' dimension d, and results.csv still equals the
simulator's to rounding (the metrics' sums are added in another order: float64, relative ≈ 1e-15, far inside
tests/test_runtime.py's REL)."""

from __future__ import annotations

import json

import pytest
import torch

from privdl.runtime.transport import HEADER
from tests.test_runtime import _rows, _same_within_rounding

#: seed 002's streaming task (its metrics: per-agent MSDs, the consensus distance and three metrics of x̄), without
#: the eavesdropper (an observer receives the transcript at process 0, which does grow with d)
CONFIG = '''name = "local_metrics"
seeds = [0]
iterations = 12
eval_every = 4
eavesdropper_window = 0
[schedule]
eta = 0.05
[network]
topology = "erdos_renyi"
n = 6
p = 0.6
seed = 1
sparse = true
[task]
name = "adaptive_filtering"
dim = DIM
exact_gradient = true
[algorithm]
name = "dsgd"
[mechanism]
name = "none"
'''


def _expected(procs: int, terms: int, at_mean: int) -> int:
    """What process 0 receives on a recorded round before the last: the holder's scalars (the consensus distance
    and the metrics of x̄), each other process's sums of its agents' terms and its meter's (sent, received) totals —
    each message its header (HEADER int64) and float64/int64 values."""
    head = HEADER * 8
    return (head + 8 * (1 + at_mean)) + (procs - 1) * ((head + 8 * terms) + (head + 8 * 2))


@pytest.mark.slow
def test_what_process_0_receives_per_recorded_round_does_not_grow_with_d(tmp_path):
    from typer.testing import CliRunner

    from privdl.cli import app

    runner = CliRunner()
    received = {}
    for dim in (5, 200):
        cfg = tmp_path / f"d{dim}.toml"
        cfg.write_text(CONFIG.replace("DIM", str(dim)))
        common = ["--no-plot", "--quiet"]
        want = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / f"sim{dim}"), "--set",
                                   "batch_replicas=1", *common])
        assert want.exit_code == 0, want.output
        got = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / f"dist{dim}"), "--procs", "3", *common])
        assert got.exit_code == 0, got.output
        _same_within_rounding(_rows(tmp_path / f"dist{dim}"), _rows(tmp_path / f"sim{dim}"))
        man = json.loads(next((tmp_path / f"dist{dim}" / "runs").rglob("manifest.json")).read_text())
        received[dim] = man["placement"]["control_bytes_received"]
    assert received[5] == received[200], received
    # rounds 0, 4, 8: exactly the scalars (msd's sum; the consensus distance, grad_norm_sq, centroid_msd, gap);
    # the last round also takes the access counts, draw counts, per-tag bytes and per-process facts (none of d)
    assert [received[5][t] for t in ("0", "4", "8")] == [_expected(3, 1, 3)] * 3, received
    assert received[5]["12"] > _expected(3, 1, 3)
    # a model of d = 200 float64 values alone is 1600 bytes; process 0 takes in less on a recorded round, and one
    # process's models of d = 200 (its 2 agents: 3200 bytes, as gathered before) more than all it gets at the end
    assert _expected(3, 1, 3) < 1600 and received[200]["12"] < 3200, received


@pytest.mark.parametrize("name, params", [
    ("quadratic", {"init_scale": 1.0}),
    ("adaptive_filtering", {"dim": 3, "exact_gradient": True}),
    pytest.param("logistic", {"dataset": "breast_cancer", "batch_size": 8}, marks=pytest.mark.slow),  # 4 s: data
])
def test_slices_evaluating_their_own_agents_record_the_simulator_metrics(name, params):
    """Threads of the sliced backend with ``local_metrics`` (the runtime's protocol over the in-process transport):
    every recorded metric equals the simulator's, which evaluates the gathered models, within float64 rounding of
    sums taken in another order (relative 1e-12; an exact zero may come out as ≈ 1e-32) — 3 uneven slices, so the
    mean's holder (slice 2) is not slice 0 — and the final models are bit for bit the simulator's."""
    import math

    from privdl.algorithms import make_algorithm
    from privdl.mechanisms import make_mechanism
    from privdl.network import Network
    from privdl.placement import partition
    from privdl.schedules import make_schedule
    from privdl.simulator import simulate
    from privdl.simulator.sliced import simulate_sliced
    from privdl.tasks import make_task

    n, rounds = 7, 6
    net = Network.from_topology("erdos_renyi", n, p=0.6, seed=3)
    task = make_task(name, n, seed=1, **params)
    if name == "logistic":
        task.grad_norm = True  # ‖∇F(x̄)‖², a metric of the average model (the sigmoid CNN's option; set here)
    alg = make_algorithm("dsgd")
    mech = make_mechanism("none", steps=rounds, network=net, task=task)
    sched = make_schedule("constant", eta=0.02, iterations=rounds)
    common = dict(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=rounds, seed=5,
                  eval_every=2)
    want = simulate(**common, sparse=True)
    got = simulate_sliced(**common, placements=partition(n, assignment=[[0, 4], [1, 2, 5], [3, 6]]),
                          local_metrics=True)
    assert torch.equal(got.final, want.final)
    assert [(t, k) for t, k, _ in got.records] == [(t, k) for t, k, _ in want.records]
    for (t, k, a), (_, _, b) in zip(got.records, want.records):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-30), (t, k, a, b)
