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
from privdl.experiment.threads import GRAIN, auto_threads, intra_op_threads
from privdl.tasks import make_task

SMALL = {"iterations": 5, "eval_every": 5, "seeds": 2, "network": {"topology": "ring", "n": 4},
         "task": {"name": "logistic", "dataset": "breast_cancer", "batch_size": 8},
         "mechanism": {"name": "gaussian_ldp", "clip": 1.0, "epsilon": 10.0},
         "schedule": {"name": "constant", "eta": 0.1}}
CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


#: a fresh Python that imports privdl (and the modules that load torch) and says whether its environment changed
IMPORT = """
import json, os
before = dict(os.environ)
import privdl, privdl.privacy, privdl.experiment, privdl.runtime, privdl.cli
import torch
print(json.dumps({k: [before.get(k), os.environ.get(k)] for k in set(before) | set(os.environ)
                  if before.get(k) != os.environ.get(k)}))
"""

#: the privdl command's entry with its command replaced by a report: the variables it sees and whether torch had
#: loaded by then
COMMAND = """
import os, sys
import privdl.cli as cli
cli.app = lambda: print(os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"),
                        os.environ.get("THP_MEM_ALLOC_ENABLE"), "torch" in sys.modules)
cli.main()
"""


def _clean(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (*CHOICES, "THP_MEM_ALLOC_ENABLE")} | (extra or {})


def _python(code: str, extra: dict[str, str] | None = None) -> str:
    return subprocess.run([sys.executable, "-c", code], env=_clean(extra), capture_output=True, text=True,
                          check=True).stdout


def test_importing_privdl_changes_no_environment_variable():
    assert json.loads(_python(IMPORT)) == {}


def test_the_privdl_command_sets_a_short_spin_and_huge_pages_before_torch_unless_the_user_chose():
    assert _python(COMMAND).split() == ["3000", "None", "1", "False"]
    assert _python(COMMAND, {"OMP_WAIT_POLICY": "ACTIVE"}).split() == ["None", "ACTIVE", "1", "False"]
    assert _python(COMMAND, {"GOMP_SPINCOUNT": "7"}).split() == ["7", "None", "1", "False"]
    assert _python(COMMAND, {"KMP_BLOCKTIME": "0"}).split() == ["None", "None", "1", "False"]
    assert _python(COMMAND, {"THP_MEM_ALLOC_ENABLE": "0"}).split() == ["3000", "None", "0", "False"]


def test_a_runtime_worker_sets_them_before_torch_loads():
    """``python -m privdl.runtime`` (what torchrun starts) sets them as its first act; its package loads no torch
    before that."""
    code = ("import os, runpy, sys\nsys.argv = ['privdl.runtime', '--help']\n"
            "import privdl.runtime\nloaded = 'torch' in sys.modules\n"
            "try:\n    runpy.run_module('privdl.runtime', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(loaded, os.environ.get('GOMP_SPINCOUNT'), os.environ.get('THP_MEM_ALLOC_ENABLE'))")
    assert _python(code).split()[-3:] == ["False", "3000", "1"]


def test_processes_privdl_starts_get_them_and_the_starting_process_keeps_its_own(tmp_path, monkeypatch):
    """``--jobs`` helpers (run_parallel) and ``--procs`` workers (launch) start with the command's settings while a
    user's process that starts them keeps its environment."""
    import multiprocessing.context

    from privdl.experiment.runner import run_parallel
    from privdl.process_defaults import for_children
    from privdl.runtime import launch

    for var in (*CHOICES, "THP_MEM_ALLOC_ENABLE"):
        monkeypatch.delenv(var, raising=False)
    before = dict(os.environ)
    with for_children() as added:
        assert added == {"THP_MEM_ALLOC_ENABLE": "1", "GOMP_SPINCOUNT": "3000"}
        seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ['GOMP_SPINCOUNT'])"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert seen == ["3000"]
    assert dict(os.environ) == before

    class Started(Exception):
        pass

    started: list[dict] = []

    def record(process):  # what a spawned process would inherit, then no process at all
        started.append({k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "THP_MEM_ALLOC_ENABLE")})
        raise Started

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "_Popen", staticmethod(record))
    config = tmp_path / "exp.toml"
    config.write_text('iterations = 2\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "quadratic"\n'
                      '[schedule]\nname = "constant"\neta = 0.01\n')
    from privdl.experiment import load_config

    with pytest.raises(Started):
        run_parallel(load_config(config), tmp_path / "jobs", jobs=2, progress=False)
    with pytest.raises(Started):
        launch(config, procs=2, out=tmp_path / "procs")
    assert started == [{"GOMP_SPINCOUNT": "3000", "THP_MEM_ALLOC_ENABLE": "1"}] * 2
    assert dict(os.environ) == before


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
