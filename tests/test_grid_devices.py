"""Grids from any device (issue 32): where a run ran is not what it is. A folder filled on a GPU is the same
experiment as one filled on CPUs: joined, merged and collected, never refused; merge and --collect say how many runs
ran on each device; a folder that differs at a real key is still another experiment, named by that key."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from privdl.cli import app
from privdl.errors import ConfigError
from privdl.experiment import run_experiment
from privdl.experiment.store import ResultStore, merge, run_device

BASE = {"name": "devices", "iterations": 4, "eval_every": 2, "seeds": [0, 1, 2, 3], "device": "cpu",
        "network": {"topology": "ring", "n": 4}, "task": {"name": "quadratic"},
        "schedule": {"name": "constant", "eta": 0.01}}


H100 = {"type": "cuda", "device": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "cuda": "12.4"}


def _as_if_run_on(folder: Path, device: str, info: dict | None = None) -> None:
    """Rewrite a folder run here on the CPU as if it had run with ``device``: its experiment.json and each finished
    run's manifest (``config.device``, and its ``device_info`` block: ``info``, or none)."""
    exp = json.loads((folder / "experiment.json").read_text())
    (folder / "experiment.json").write_text(json.dumps({**exp, "device": device}))
    for path in (folder / "runs").glob("*/manifest.json"):
        man = json.loads(path.read_text())
        man["config"]["device"] = device
        man.pop("device_info", None)
        if info is not None:
            man["device_info"] = info
        path.write_text(json.dumps(man))


def _halves(tmp_path: Path) -> tuple[Path, Path]:
    """The grid of BASE half run into gpu/ (then marked as run with device "cuda") and half into cpu/."""
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    assert run_experiment(BASE, gpu, progress=False, shard=(0, 2)).executed == 2
    assert run_experiment(BASE, cpu, progress=False, shard=(1, 2)).executed == 2
    _as_if_run_on(gpu, "cuda", H100)
    return gpu, cpu


def _stamps(folder: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (folder / "runs").glob("*/manifest.json")}


def test_a_grid_filled_on_a_gpu_and_on_a_cpu_merges_runs_and_collects(tmp_path):
    from privdl.reproductions.common import collecting, finished_runs, grid_status, run

    gpu, cpu = _halves(tmp_path)
    # (a) both halves merge into a new folder: every run copied, counted by where it ran
    s = merge([gpu, cpu], tmp_path / "m")
    assert (s.copied, s.present, s.unfinished, s.foreign, s.outside_grid) == (4, 0, 0, 0, 0)
    assert s.other_experiments == []  # a device is not another experiment
    assert s.devices == {"cpu": 2, "cuda (NVIDIA H100 80GB HBM3)": 2}
    assert json.loads((tmp_path / "m" / "experiment.json").read_text())["device"] == "cuda"  # the first source's
    # (b) the grid run over the merged folder on the CPU runs nothing, and writes results.csv with every run
    stamps = _stamps(tmp_path / "m")
    again = run_experiment(BASE, tmp_path / "m", progress=False)
    assert (again.executed, again.skipped) == (0, 4)
    assert _stamps(tmp_path / "m") == stamps
    run_experiment(BASE, tmp_path / "fresh", progress=False)
    assert (tmp_path / "m" / "results.csv").read_text() == (tmp_path / "fresh" / "results.csv").read_text()
    # --collect with device "cpu" over it binds (not refused) and says how many runs ran on each device
    said: list[str] = []
    with collecting():
        run(BASE, tmp_path / "m", progress=said.append)
    assert len(said) == 1 and "4 of 4 runs of this grid finished" in said[0]
    assert "(2 on cpu, 2 on cuda (NVIDIA H100 80GB HBM3))" in said[0]
    ran = sorted(r.device for r in finished_runs(tmp_path / "m"))
    assert ran == ["cpu"] * 2 + ["cuda (NVIDIA H100 80GB HBM3)"] * 2
    assert "on cuda" not in grid_status(tmp_path / "fresh")  # one device: nothing to say
    # the CLI says it too
    res = CliRunner().invoke(app, ["merge", str(gpu), str(cpu), "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert "4 runs copied" in res.output and "2 on cpu, 2 on cuda (NVIDIA H100 80GB HBM3)" in res.output


def test_a_folder_filled_on_a_gpu_is_joined_by_a_cpu_run_and_the_reverse(tmp_path):
    gpu, cpu = _halves(tmp_path)
    # (c) experiment.json says "cuda": a run with "cpu" joins it (the other shard's runs), it is not refused
    before = _stamps(gpu)
    joined = run_experiment(BASE, gpu, progress=False)
    assert (joined.executed, joined.skipped) == (2, 2)
    assert all(_stamps(gpu)[rid] == t for rid, t in before.items())
    assert json.loads((gpu / "experiment.json").read_text())["device"] == "cuda"  # kept: the first claimer's
    # the reverse (a cpu folder claimed with "cuda"), and other settings of where and how it runs, join too
    store = ResultStore(cpu)
    for where in ({"device": "cuda"}, {"device": "cuda:1", "threads": 3, "batch_replicas": 1},
                  {"device": "auto", "runtime": {"backend": "sliced", "slices": 2, "checkpoint_every": 5}},
                  {"runtime": {"keys": "root"}}):
        store.claim({**BASE, **where})
    assert json.loads((cpu / "experiment.json").read_text())["device"] == "cpu"
    # agreed keys change the noise, so the run ids: another experiment, named by its key
    with pytest.raises(ConfigError, match=r"different experiment \(config differs at: runtime\.keys\)"):
        store.claim({**BASE, "device": "cuda", "runtime": {"keys": "agreed"}})


def test_a_folder_that_differs_at_a_real_key_is_another_experiment_named_by_it(tmp_path):
    gpu, cpu = _halves(tmp_path)
    merge([gpu, cpu], tmp_path / "m")
    # (d) another experiment (iterations), run on the GPU: named by its key, never by the device; of its runs only
    # those the grid holds would be taken (none here)
    other = tmp_path / "other"
    run_experiment({**BASE, "iterations": 6, "seeds": [0, 9]}, other, progress=False)
    _as_if_run_on(other, "cuda")
    with pytest.raises(ConfigError, match=r"differs at: iterations\): it holds another experiment"):
        merge([other], tmp_path / "m")
    said = CliRunner().invoke(app, ["merge", str(other), "--out", str(tmp_path / "m")])
    assert said.exit_code != 0 and "differs at: iterations" in " ".join(said.output.split()), said.output
    said = CliRunner().invoke(app, ["merge", str(other), "--out", str(tmp_path / "m"), "--other-experiments"])
    assert said.exit_code == 0 and "another experiment:" in said.output, said.output
    s = merge([other], tmp_path / "m", other_experiments=True)
    assert (s.copied, s.foreign, s.devices) == (0, 2, {})
    assert len(s.other_experiments) == 1 and "differs at: iterations)" in s.other_experiments[0]
    assert "device" not in s.other_experiments[0]
    assert not any((tmp_path / "m" / "runs" / p.parent.name).exists()
                   for p in (other / "runs").glob("*/manifest.json"))
    with pytest.raises(ConfigError, match=r"differs at: iterations\)"):
        ResultStore(tmp_path / "m").claim({**BASE, "iterations": 6})
    with pytest.raises(ConfigError, match=r"differs at: task.name\)"):
        ResultStore(gpu).claim({**BASE, "device": "cpu", "task": {"name": "logistic"}})
    # a label still names another experiment (Table 1 is not Table 2, though they share runs)
    with pytest.raises(ConfigError, match=r"differs at: name\)"):
        ResultStore(cpu).claim({**BASE, "name": "table 2", "device": "cuda"})


def test_the_device_a_run_ran_on_is_read_from_its_manifest(tmp_path):
    # the runner's device_info block: its type (where "auto" went), and a GPU's name; a CPU is named "cpu"
    assert run_device({"config": {"device": "cuda"}, "device_info": H100}) == "cuda (NVIDIA H100 80GB HBM3)"
    assert run_device({"config": {"device": "cuda:1"}, "device_info": {**H100, "device": "cuda:1"}}) \
        == "cuda (NVIDIA H100 80GB HBM3)"
    assert run_device({"config": {"device": "auto"}, "device_info": H100}) == "cuda (NVIDIA H100 80GB HBM3)"
    assert run_device({"config": {"device": "cpu"}, "device_info": {"type": "cpu", "name": "x86_64"}}) == "cpu"
    assert run_device({"config": {"device": "auto"}, "device": "cpu"}) == "cpu"
    # manifests made before the block: the config's device
    assert run_device({"config": {"device": "cpu"}}) == "cpu"
    assert run_device({"config": {"device": "cuda"}}) == "cuda"
    assert run_device({"config": {}}) == "cpu"  # the default device
    assert run_device({"config": None, "device_info": 3}) == "cpu"  # damaged: never an error
    # a run of today: where it ran, as the runner records it
    run_experiment({**BASE, "seeds": [0]}, tmp_path / "o", progress=False)
    (man,) = [json.loads(p.read_text()) for p in (tmp_path / "o" / "runs").glob("*/manifest.json")]
    assert run_device(man) == "cpu"
