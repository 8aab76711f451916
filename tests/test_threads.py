"""Thread defaults on a shared machine (issue 29, BENCHMARKS.md "A run beside busy processes"): a run whose tensors
stay below ATen's grain takes one intra-op thread, idle pool threads spin briefly, and a user's own choice — the
config's ``threads``, ``OMP_NUM_THREADS``, a wait policy — wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from privdl.experiment import run_experiment
from privdl.experiment.runner import GRAIN, auto_threads, intra_op_threads
from privdl.tasks import make_task

SMALL = {"iterations": 5, "eval_every": 5, "seeds": 2, "network": {"topology": "ring", "n": 4},
         "task": {"name": "logistic", "dataset": "breast_cancer", "batch_size": 8},
         "mechanism": {"name": "gaussian_ldp", "clip": 1.0, "epsilon": 10.0},
         "schedule": {"name": "constant", "eta": 0.1}}
CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def _policy(extra: dict[str, str]) -> list[str]:
    """GOMP_SPINCOUNT and OMP_WAIT_POLICY as a fresh Python sees them after importing privdl."""
    env = {k: v for k, v in os.environ.items() if k not in CHOICES} | extra
    code = "import os, privdl; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def test_importing_privdl_sets_a_short_spin_unless_the_user_chose_a_policy():
    assert _policy({}) == ["3000", "None"]
    assert _policy({"OMP_WAIT_POLICY": "ACTIVE"}) == ["None", "ACTIVE"]
    assert _policy({"GOMP_SPINCOUNT": "7"}) == ["7", "None"]
    assert _policy({"KMP_BLOCKTIME": "0"}) == ["None", "None"]


def _threads_used(tmp_path, name, cfg):
    out = tmp_path / name
    run_experiment(cfg, out, progress=False)
    used = {json.loads(p.read_text())["process"]["threads"] for p in out.glob("runs/*/manifest.json")}
    assert len(used) == 1, used
    return used.pop()


@pytest.fixture
def two_threads(monkeypatch):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_small_run_takes_one_thread_and_gives_the_process_its_threads_back(tmp_path, two_threads):
    """Stacked (2 seeds) and alone (batch_replicas = 1): one thread while the runs compute, recorded in each
    manifest, and the process's 2 threads after."""
    assert _threads_used(tmp_path, "stacked", SMALL) == 1
    assert _threads_used(tmp_path, "alone", {**SMALL, "batch_replicas": 1}) == 1
    assert torch.get_num_threads() == 2


def test_the_users_threads_win_over_the_default(tmp_path, two_threads, monkeypatch):
    assert _threads_used(tmp_path, "config", {**SMALL, "threads": 2}) == 2  # the config's threads, stacked too
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's OpenMP variable: the process's count stands
    assert _threads_used(tmp_path, "omp", SMALL) == 2
    assert torch.get_num_threads() == 2


def test_the_default_is_one_thread_exactly_below_atens_grain(monkeypatch):
    """One thread when the largest tensor of a round (the rows' parameters, or their batch of inputs) is below the
    32 768 elements above which ATen splits a kernel; the process's count at or above it."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    task = make_task("logistic", 4, dataset="breast_cancer", batch_size=8)  # 8 examples × 30 features per row
    per_row = max(task.dim, 8 * 30)
    below, at = (GRAIN - 1) // per_row, -(-GRAIN // per_row)
    assert auto_threads(task, below) == 1 and auto_threads(task, at) is None
    mlp = make_task("mlp", 4, dataset="digits", hidden=600, batch_size=8)  # 38 k+ parameters per row
    assert mlp.dim >= GRAIN and auto_threads(mlp, 1) is None
    with intra_op_threads({"threads": 0}, task, below) as used:
        assert used == 1 == torch.get_num_threads()
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    assert auto_threads(task, below) is None
