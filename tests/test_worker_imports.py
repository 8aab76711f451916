"""A worker of the distributed runtime imports only what it runs (issue 44, item 5): no accounting library
(dp_accounting, and the scipy.stats / scipy.signal / scipy.optimize it loads), no plotting (matplotlib), no CLI
(privdl.cli, typer, rich), no covariance solver (privdl.covariance) — unless its run needs one. What a worker does
load of scipy it runs: scipy.sparse (the network's W, privdl.network) and scipy.special (``ndtri``, the keyed normal
draws of privdl.keys, chosen for bits equal on every CPU). Process 0 also loads dp_accounting at the end of a DP
run: it accounts the merged ledger for the manifest (docs/backends.md, "What a worker imports")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
#: what no worker may load for a run that does not need it
NOT_RUN = ("dp_accounting", "scipy.stats", "scipy.signal", "scipy.optimize", "matplotlib", "privdl.cli", "typer",
           "rich", "privdl.covariance", "privdl.experiment.plot")
#: what accounting loads: dp_accounting and the scipy modules it imports
ACCOUNTING = {"dp_accounting", "scipy.stats", "scipy.signal", "scipy.optimize"}
#: everything a worker imports before its first run: ``python -m privdl.runtime`` (torchrun's entry) and what its
#: main() and run_experiment_distributed import (privdl run --procs's workers import the same from launch._worker)
WORKER_MODULES = ("privdl.runtime.__main__", "privdl.runtime.launch", "privdl.runtime.worker", "privdl.experiment",
                  "privdl.experiment.build", "privdl.experiment.config", "privdl.experiment.runner",
                  "privdl.experiment.store", "privdl.agreement.keystore")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(SRC)}


@pytest.mark.slow  # a fresh interpreter importing torch: 3-9 s on 2 busy cores
def test_a_worker_loads_no_accounting_plotting_or_cli():
    """A fresh interpreter that imports the worker's modules has none of :data:`NOT_RUN` (accounting still works
    where it is asked for: the accountants' own tests, which load dp_accounting on first use)."""
    code = (f"import sys\nfor m in {WORKER_MODULES!r}:\n    __import__(m)\n"
            f"print(sorted(m for m in {NOT_RUN!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"a worker loads {out.stdout.strip()}"


def test_a_lazy_module_loads_on_first_use_and_can_be_patched(tmp_path, monkeypatch):
    from privdl.lazy_module import lazy

    (tmp_path / "privdl_lazy_probe.py").write_text("VALUE = 42\nLOADS = []\nLOADS.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "privdl_lazy_probe", raising=False)
    mod = lazy("privdl_lazy_probe")
    assert "privdl_lazy_probe" not in sys.modules and "not loaded" in repr(mod)
    assert mod.VALUE == 42 and mod.LOADS == [1]  # loaded once, on the first attribute read
    assert mod.LOADS is sys.modules["privdl_lazy_probe"].LOADS
    monkeypatch.setattr(mod, "VALUE", 7)  # what test_example_accountant does to dp_accounting's calibration
    assert sys.modules["privdl_lazy_probe"].VALUE == 7
    monkeypatch.undo()
    assert sys.modules.get("privdl_lazy_probe") is None or sys.modules["privdl_lazy_probe"].VALUE == 42
    with pytest.raises(AttributeError):
        mod.MISSING  # noqa: B018


#: a plug-in dataset (numpy only): a supervised DP-SGD run whose data loader needs nothing else (the bundled
#: scikit-learn datasets load sklearn, and with it scipy.stats and scipy.optimize: a run on them needs them)
PLUGIN = '''
import numpy as np
from privdl.data.datasets import DATASETS, Dataset


@DATASETS.register("imports_blobs")
def imports_blobs() -> Dataset:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    X = (rng.normal(size=(300, 5)) + 1.5 * y[:, None]).astype(np.float32)
    return Dataset("imports_blobs", X[:240], y[:240], X[240:], y[240:], n_classes=2, source="imports_plugin")
'''
CONFIG = '''name = "imports"
plugins = ["imports_plugin"]
seeds = [0]
iterations = 4
eval_every = 2
[schedule]
eta = 0.05
[network]
topology = "ring"
n = 4
sparse = true
[task]
name = "logistic"
dataset = "imports_blobs"
[algorithm]
name = "dsgd"
[mechanism]
name = "dp_sgd"
lot_size = 20
noise_multiplier = 1.0
'''
#: imported by every Python process started with its folder on PYTHONPATH: at exit, each process writes which of
#: NOT_RUN it loaded and whether it is a worker (a child of multiprocessing's spawn)
PROBE = f'''
import atexit, json, os, sys


def _dump():
    import multiprocessing
    worker = multiprocessing.parent_process() is not None
    with open(os.path.join(os.environ["IMPORTS_PROBE"], str(os.getpid()) + ".json"), "w") as f:
        json.dump({{"worker": worker, "loaded": [m for m in {NOT_RUN!r} if m in sys.modules],
                   "torch": "torch" in sys.modules}}, f)


atexit.register(_dump)
'''


@pytest.mark.slow
def test_the_workers_of_privdl_run_procs_import_only_what_they_run(tmp_path):
    """``privdl run CONFIG --procs 2`` started as the console script (whose main module spawn would run again in
    every worker): both workers of a DP-SGD run load none of :data:`NOT_RUN`, except dp_accounting in process 0,
    which accounts the merged ledger for the manifest; the launcher (the CLI) loads what it uses."""
    script = Path(sys.executable).parent / "privdl"
    if not script.exists():
        pytest.skip("no privdl console script beside this Python")
    probe = tmp_path / "probe"
    probe.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROBE)
    (site / "imports_plugin.py").write_text(PLUGIN)
    cfg = tmp_path / "imports.toml"
    cfg.write_text(CONFIG)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(site)]), "IMPORTS_PROBE": str(probe)}
    got = subprocess.run([str(script), "run", str(cfg), "--procs", "2", "--out", str(out), "--no-plot"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    assert (out / "results.csv").exists()
    reports = [json.loads(p.read_text()) for p in probe.glob("*.json")]
    workers = [r["loaded"] for r in reports if r["worker"]]
    launcher = [r["loaded"] for r in reports if not r["worker"]]  # and spawn's resource tracker
    assert len(workers) == 2, reports
    # the probe sees the launcher's CLI (so it would see the workers'); the others: spawn's resource tracker
    assert any("privdl.cli" in loaded for loaded in launcher), reports
    # the launcher of a run with --no-plot draws nothing: no matplotlib (its table of final metrics needs none); and
    # it loads no torch at all: its workers check the config (privdl.runtime.launch.launch)
    assert not any("matplotlib" in loaded for loaded in launcher), reports
    assert not any(r["torch"] for r in reports if not r["worker"]), reports
    first, other = sorted(workers, key=len, reverse=True)
    assert other == [], workers  # process 1: nothing of NOT_RUN
    assert "dp_accounting" in first and set(first) <= ACCOUNTING, workers  # process 0: the accounting only


@pytest.mark.slow  # a fresh interpreter importing torch
def test_a_run_without_a_mechanism_writes_its_ledger_without_dp_accounting(tmp_path):
    """A run with mechanism "none" (the benchmarks' anchor runs) accounts nothing: its manifest's ledger says
    ε = ∞ for every agent, and the process that wrote it never loaded dp_accounting (nor the scipy modules it
    imports) — the non-private event is known as such without its DpEvent."""
    cfg = tmp_path / "none.toml"
    cfg.write_text('iterations = 2\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "quadratic"\n'
                   '[schedule]\nname = "constant"\neta = 0.01\n[mechanism]\nname = "none"\n')
    code = (f"import sys\nfrom privdl.experiment import load_config, run_experiment\n"
            f"run_experiment(load_config({str(cfg)!r}), {str(tmp_path / 'out')!r}, progress=False)\n"
            f"print(sorted(m for m in {sorted(ACCOUNTING)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
    man = json.loads(next((tmp_path / "out").rglob("manifest.json")).read_text())
    ledger = man["privacy_ledger"][0]
    assert ledger["epsilon"] == "inf" and [a["epsilon"] for a in ledger["per_agent"]] == ["inf"] * 4, ledger
