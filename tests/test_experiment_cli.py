"""The privdl command around experiments: ``privdl run`` and ``privdl plot``, ``privdl account`` (JSON round trip,
table, bad input), clear errors instead of tracebacks for bad command-line input (issue 16), ``privdl reproduce
--jobs``, and the process defaults the command applies first (huge pages for large tensors).
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from privdl.cli import app
from privdl.experiment import load_config, run_experiment
from privdl.privacy import get_accountant
from tests.test_experiment import BASE_TOML, _write

@pytest.mark.slow
def test_cli_run_and_plot(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path)), "--out", str(out), "--quiet",
                                   "--set", "iterations=10"])
    assert res.exit_code == 0, res.output
    assert "6 runs" in res.output and (out / "plots" / "test_loss_vs_iteration.png").stat().st_size > 1000
    assert (out / "plots" / "test_loss_vs_mechanism_epsilon.png").exists()
    res = CliRunner().invoke(app, ["plot", str(out)])
    assert res.exit_code == 0


def test_cli_reports_bad_config_key_cleanly(tmp_path):
    res = CliRunner().invoke(app, ["run", str(_write(tmp_path)), "--out", str(tmp_path / "o"), "--set", "task.bogus=1"])
    assert res.exit_code == 2 and "task.bogus" in res.output


@pytest.mark.parametrize("acc", ["paper", "tight"])
def test_cli_account_json_round_trip(acc):
    res = CliRunner().invoke(app, ["account", "--unit", "agent", "--accountant", acc, "--epsilon", "10",
                                   "--delta", "1e-5", "--clip", "0.1", "--steps", "5000", "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["bound"] == pytest.approx(get_accountant(acc).bound(epsilon=10, delta=1e-5, clip=0.1, steps=5000))
    assert out["ldp_variance"] == pytest.approx(1 / out["bound"]) and out["epsilon"] <= 10
    back = CliRunner().invoke(app, ["account", "--accountant", acc, "--precision-bound", str(out["bound"]),
                                    "--delta", "1e-5", "--clip", "0.1", "--steps", "5000", "--format", "json"])
    assert json.loads(back.output)["epsilon"] == pytest.approx(10, rel=1e-9)


@pytest.mark.parametrize("args,match", [
    (["--epsilon", "0"], "epsilon"), (["--epsilon", "1", "--delta", "1.5"], "delta"),
    (["--epsilon", "1", "--clip", "-1"], "clip"), (["--epsilon", "1", "--steps", "0"], "steps"),
])
def test_cli_account_bad_input(args, match):
    base = {"--clip": "1", "--steps": "10"}
    for k, v in base.items():
        if k not in args:
            args = args + [k, v]
    res = CliRunner().invoke(app, ["account", *args, "--format", "json"])
    assert res.exit_code == 2 and match in res.output


def test_cli_account_table_format():
    res = CliRunner().invoke(app, ["account", "--epsilon", "1", "--clip", "1", "--steps", "10"])
    assert res.exit_code == 0 and "ldp_variance" in res.output and math.isfinite(1.0)


def test_bad_cli_input_gets_a_clear_error_not_a_traceback(tmp_path):
    """One case per class of input that used to end in a traceback (issue 16)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(BASE_TOML)
    np.save(tmp_path / "obj.npy", np.array([[1, "a"], [None, 2]], dtype=object))
    (tmp_path / "afile").write_text("")
    bad_json = tmp_path / "badjson"
    bad_json.mkdir()
    (bad_json / "experiment.json").write_text("{")
    runs_file = tmp_path / "runsfile"
    run_experiment(load_config(cfg), runs_file, progress=False)
    import shutil

    shutil.rmtree(runs_file / "runs")
    (runs_file / "runs").write_text("")  # runs/ cannot be made: finished runs could not be saved
    cases = [
        (["run", str(cfg), "--out", str(tmp_path / "afile")], "is a file, not a folder"),
        (["run", str(cfg), "--out", str(bad_json)], "is damaged"),
        (["run", str(cfg), "--out", str(runs_file)], "cannot write in"),
        (["rms-bounds", "--mixing", str(tmp_path / "obj.npy"), "--dim", "2"], "numeric .npy"),
        (["rms-bounds", "--mixing", str(tmp_path), "--dim", "2"], "is a folder, not a file"),
        (["account", "--precision-bound", "0", "--steps", "10", "--clip", "1"], "precision bound b must be a finite number > 0"),
        (["account", "--unit", "example", "--epsilon", "1", "--steps", "10", "--clip", "3", "--sample-rate", "0.01"],
         "--clip does not apply at the example level"),
        (["covariance", "--topology", "ring", "--n", "5", "--epsilon", "1", "--save-covariance",
          str(tmp_path / "nope" / "R.npy")], "does not exist"),
        (["covariance", "--topology", "ring", "--n", "5", "--epsilon", "1", "--coalition-size", "-1"], "--coalition-size"),
        (["audit", "--batch", "0"], "--batch"),
    ]
    for args, match in cases:
        res = CliRunner().invoke(app, args)
        assert res.exit_code != 0, (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
        assert match in " ".join(res.output.split()), (args, res.output)


def test_reproduce_jobs_reach_every_sweep_of_a_reproduction(tmp_path, monkeypatch):
    """``privdl reproduce --jobs N`` sets the processes of every sweep the reproduction runs (and only inside it)."""
    from privdl.errors import ValidationError
    from privdl.reproductions import common, parallel

    seen = []
    monkeypatch.setattr(common, "run_experiment", lambda cfg, out, **kw: seen.append(kw["jobs"]))
    common.run({}, tmp_path)
    with parallel(3):
        common.run({}, tmp_path)
        common.run({}, tmp_path)
    common.run({}, tmp_path)
    assert seen == [1, 3, 3, 1]
    with pytest.raises(ValidationError, match="jobs must be an integer >= 1"):
        with parallel(0):
            pass
    res = CliRunner().invoke(app, ["reproduce", "rms_filtering", "--jobs", "0", "--out", str(tmp_path / "r")])
    assert res.exit_code != 0 and "--jobs" in res.output


_FAULTS = """
import resource, sys
import privdl.process_defaults
privdl.process_defaults.apply()  # what the privdl command does first
import torch
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    torch.ones(16 * 2**20)  # 64 MiB, written once, freed
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
def test_privdl_puts_large_tensors_on_huge_pages_unless_told_not_to():
    """Where the kernel gives huge pages on request, with privdl's process defaults applied first (as the privdl
    command does), 8 fresh 64 MiB tensors take a small fraction of the 8 × 16 384 page faults of 4 KiB pages
    (PyTorch's THP_MEM_ALLOC_ENABLE, which the command turns on by default), and a user's THP_MEM_ALLOC_ENABLE=0 is
    kept."""
    import os
    import subprocess
    import sys

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[madvise]" not in thp.read_text():
        pytest.skip("this kernel gives huge pages to every process (always) or to none (never), not on request: "
                    "privdl's switch changes nothing here")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    faults = {value: int(subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, check=True,
                                        env=env if value is None else {**env, "THP_MEM_ALLOC_ENABLE": value}
                                        ).stdout) for value in (None, "0")}
    assert faults["0"] > 0.8 * 8 * 16384
    assert faults[None] < 0.2 * faults["0"]
