"""Sweeps run end to end (privdl.experiment.run_experiment): the results folder (results.csv, one manifest and
privacy ledger per run), resuming an interrupted sweep, runs stacked on the replica axis equal to runs alone,
accounting-only runs, input files read from the config's folder and checked for change, runs that diverge.

The shared configs (:data:`SMALL`, :data:`BASE_TOML`, :func:`_write`, :func:`load_config_text`) live here; the
config checks, the CLI, progress reporting and plots have their own files (tests/test_experiment_*.py).
"""

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from privdl.cli import app
from privdl.errors import ConfigError
from privdl.experiment import expand, load_config, run_experiment
from privdl.privacy import get_accountant

SMALL = """
name = "small"
seeds = [0, 1]
iterations = 20
eval_every = 10
[network]
n = 4
p = 0.8
[task]
name = "logistic"
dataset = "breast_cancer"
batch_size = 4
[mechanism]
clip = 1.0
delta = 1e-5
[schedule]
name = "constant"
eta = 0.1
[sweep]
"mechanism.name" = ["none", "gaussian_ldp"]
"mechanism.epsilon" = [1.0, 10.0]
"""


def _write(tmp_path: Path, text: str = SMALL) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


BASE_TOML = ('iterations = 3\n[network]\ntopology = "ring"\nn = 5\n[task]\nname = "quadratic"\n'
             '[schedule]\nname = "constant"\neta = 0.01\n')


def load_config_text(text: str, folder: Path, *, validate: bool = True) -> dict:
    path = folder / f"c{abs(hash(text))}.toml"
    path.write_text(text)
    return load_config(path, validate=validate)


def test_results_csv_manifest_and_ledger(tmp_path):
    out = tmp_path / "out"
    s = run_experiment(load_config(_write(tmp_path)), out, progress=False)
    assert s.runs == 6 and s.executed == 6
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) == {"run_id", "mechanism.name", "mechanism.epsilon", "seed", "iteration", "metric", "value"}
    assert {r["iteration"] for r in rows} == {"0", "10", "20"}
    ldp = next(r for r in rows if r["mechanism.name"] == "gaussian_ldp" and r["mechanism.epsilon"] == "1.0")
    man = json.loads((out / "runs" / ldp["run_id"] / "manifest.json").read_text())
    entry = man["privacy_ledger"][0]
    assert entry["unit"] == "agent" and entry["accountant"] == "tight" and entry["epsilon"] <= 1.0
    # the ledger's epsilon is re-accounted from the noise actually used
    b = entry["noise"]["precision_bound"]
    assert get_accountant("tight").epsilon(bound=b, delta=1e-5, clip=1.0, steps=20) == pytest.approx(entry["epsilon"])
    assert man["W_fingerprint"] and man["seeds"]["run"] in (0, 1) and man["config"]["iterations"] == 20
    none = next(r for r in rows if r["mechanism.name"] == "none")
    assert json.loads((out / "runs" / none["run_id"] / "manifest.json").read_text())["privacy_ledger"][0][
        "epsilon"] == "inf"


@pytest.mark.parametrize("stack", [0, 1])
def test_interrupted_sweep_resumes_without_redoing_finished_runs(tmp_path, monkeypatch, stack):
    """Interrupted after the 3rd of 6 runs was saved (stacked on the replica axis, or one by one), a second
    invocation runs exactly the other 3."""
    from privdl.experiment.store import ResultStore

    out = tmp_path / "out"
    cfg = load_config(_write(tmp_path), [f"batch_replicas={stack}"])
    real = ResultStore.save_runs
    saved = {"n": 0}

    def flaky(self, runs):  # the process dies while saving the 4th run
        keep = runs[:max(0, 3 - saved["n"])]
        real(self, keep)
        saved["n"] += len(keep)
        if len(keep) < len(runs):
            raise KeyboardInterrupt

    monkeypatch.setattr(ResultStore, "save_runs", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, out, progress=False)
    done = list((out / "runs").glob("*/manifest.json"))
    assert len(done) == 3
    before = {p: p.stat().st_mtime_ns for p in done}
    monkeypatch.setattr(ResultStore, "save_runs", real)
    s = run_experiment(cfg, out, progress=False)
    assert s.executed == 3 and s.skipped == 3
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    again = run_experiment(cfg, out, progress=False)
    assert again.executed == 0


def test_results_are_reproducible_across_invocations(tmp_path):
    cfg = load_config(_write(tmp_path))
    run_experiment(cfg, tmp_path / "a", progress=False)
    run_experiment(cfg, tmp_path / "b", progress=False)
    assert (tmp_path / "a" / "results.csv").read_text() == (tmp_path / "b" / "results.csv").read_text()


def test_correlated_designs_run_from_a_config(tmp_path):
    text = SMALL.replace('"mechanism.name" = ["none", "gaussian_ldp"]', '"mechanism.name" = ["ldp", "decor", "whisper"]')
    text = text.replace('"mechanism.epsilon" = [1.0, 10.0]', '"mechanism.epsilon" = [10.0]\n"mechanism.generation" = ["per_agent"]')
    runs, _ = expand(load_config(_write(tmp_path, text)))
    assert len(runs) == 6 and all(r.config["mechanism"]["epsilon"] == 10.0 for r in runs)  # inherited keys kept
    out = tmp_path / "out"
    run_experiment(load_config(_write(tmp_path, text)), out, progress=False)
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["mechanism.name"] for r in rows} == {"ldp", "decor", "whisper"}
    manifest = json.loads(next((out / "runs").glob("*/manifest.json")).read_text())
    (entry,) = manifest["privacy_ledger"]
    assert entry["unit"] == "agent" and entry["epsilon"] <= 10.0 * (1 + 1e-9)
    assert {"trace", "trace_ldp", "precision_bound"} <= set(entry["noise"])


def test_stacked_runs_equal_runs_alone(tmp_path):
    """The runner stacks runs that share task and algorithm; each run's results equal what it gives alone."""
    stacked = run_experiment(load_config(_write(tmp_path)), tmp_path / "stacked", progress=False)
    alone = run_experiment(load_config(_write(tmp_path), ["batch_replicas=1"]), tmp_path / "alone", progress=False)
    assert stacked.executed == alone.executed == 6
    a = {(r["run_id"], r["iteration"], r["metric"]): float(r["value"])
         for r in csv.DictReader((tmp_path / "stacked" / "results.csv").open())}
    b = {(r["run_id"], r["iteration"], r["metric"]): float(r["value"])
         for r in csv.DictReader((tmp_path / "alone" / "results.csv").open())}
    assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12) for k in a)
    man = json.loads(next((tmp_path / "stacked" / "runs").glob("*/manifest.json")).read_text())
    assert man["batch"]["replicas"] == 6


def test_runs_whose_data_follow_the_run_seed_are_stacked_with_their_own_data(tmp_path):
    """[task] seed = "run" partitions the data by the run seed: runs of different seeds must not share the first
    run's task when they are stacked (each equals its run alone)."""
    text = SMALL.replace('batch_size = 4', 'batch_size = 4\npartition = "dirichlet"\nalpha = 0.3\nseed = "run"')
    stacked = run_experiment(load_config(_write(tmp_path, text)), tmp_path / "stacked", progress=False)
    alone = run_experiment(load_config(_write(tmp_path, text), ["batch_replicas=1"]), tmp_path / "alone",
                           progress=False)
    a = {(r["run_id"], r["iteration"], r["metric"]): float(r["value"])
         for r in csv.DictReader((tmp_path / "stacked" / "results.csv").open())}
    b = {(r["run_id"], r["iteration"], r["metric"]): float(r["value"])
         for r in csv.DictReader((tmp_path / "alone" / "results.csv").open())}
    assert stacked.executed == 6 and a.keys() == b.keys()
    assert all(a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12) for k in a)
    sizes = {json.dumps(json.loads(m.read_text())["task"]["samples_per_agent"]) for m in (tmp_path / "stacked" /
                                                                                 "runs").glob("*/manifest.json")}
    assert len(sizes) == 2  # two seeds, two partitions


def test_accounting_only_runs_record_the_design_and_its_ledger(tmp_path):
    """train = false: every run is built, calibrated and accounted, never trained; its metrics are the mechanism's
    facts (fig1's sweep), and a different graph is drawn per seed with network.seed = "run"."""
    text = """
name = "design"
train = false
iterations = 5000
seeds = [0, 1]
[network]
topology = "erdos_renyi"
n = 12
p = 0.5
seed = "run"
[mechanism]
clip = 0.1
delta = 1e-5
epsilon = 10.0
accountant = "paper"
[schedule]
name = "constant"
eta = 1.0
[sweep]
"mechanism.name" = ["ldp", "whisper"]
"""
    out = tmp_path / "out"
    s = run_experiment(load_config(_write(tmp_path, text)), out, progress=False)
    assert s.executed == 4
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["iteration"] for r in rows} == {"0"}
    trace = {(r["mechanism.name"], r["seed"]): float(r["value"]) for r in rows if r["metric"] == "trace"}
    ldp_bound = get_accountant("paper").bound(epsilon=10.0, delta=1e-5, clip=0.1, steps=5000)
    for seed in ("0", "1"):
        assert trace[("whisper", seed)] < trace[("ldp", seed)]  # correlated noise is never worse than LDP
    fingerprints = {json.loads(p.read_text())["W_fingerprint"] for p in (out / "runs").glob("*/manifest.json")}
    assert len(fingerprints) == 2  # one graph per seed
    for p in (out / "runs").glob("*/manifest.json"):
        man = json.loads(p.read_text())
        assert man["trained"] is False and man["privacy_ledger"][0]["steps"] == 5000
        assert man["privacy_ledger"][0]["epsilon"] <= 10.0
        if man["config"]["mechanism"]["name"] == "ldp":  # LDP's trace is Tr(WWᵀ)/b exactly
            import numpy as np

            from privdl.experiment.build import build_network

            w = build_network(man["config"]["network"], man["config"]["seed"]).W
            assert man["final_metrics"]["trace"] == pytest.approx(float(np.sum(w * w)) / ldp_bound, rel=1e-9)


def test_version_flag_and_the_manifest_say_which_code_and_libraries_ran(tmp_path):
    import privdl

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and privdl.__version__ in res.output and privdl.source_hash() in res.output
    cfg = {"iterations": 2, "eval_every": 2, "network": {"topology": "ring", "n": 4}, "task": {"name": "quadratic"},
           "schedule": {"name": "constant", "eta": 0.01}}
    run_experiment(cfg, tmp_path / "o")
    man = json.loads(next((tmp_path / "o" / "runs").glob("*/manifest.json")).read_text())
    assert man["privdl_source_sha256"] == privdl.source_hash() and len(man["privdl_source_sha256"]) == 16
    assert set(man["versions"]) >= {"numpy", "scipy", "dp-accounting", "torch"}
    assert man["started_at"] <= man["finished_at"] and man["finished_at"].endswith("+00:00")


def test_a_config_that_failed_at_build_does_not_bind_the_out_directory(tmp_path):
    bad = load_config_text('iterations = 5\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "quadratic"\n'
                           '[schedule]\nname = "constant"\neta = 0.01\n[mechanism]\nname = "ldp"\nepsilon = 1.0\ndelta = 1e-5\nclip = -1.0\n', tmp_path,
                           validate=False)
    with pytest.raises(Exception):
        run_experiment(bad, tmp_path / "o", progress=False)
    good = load_config_text('iterations = 5\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "quadratic"\n'
                            '[schedule]\nname = "constant"\neta = 0.01\n', tmp_path)
    with pytest.warns(UserWarning, match="no finished or running run"):
        assert run_experiment(good, tmp_path / "o", progress=False).executed == 1
    with pytest.raises(ConfigError, match="different experiment"):  # now it holds a finished run: protected
        run_experiment(load_config_text(
            'iterations = 6\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "quadratic"\n'
            '[schedule]\nname = "constant"\neta = 0.01\n', tmp_path),
            tmp_path / "o", progress=False)


def test_relative_paths_are_read_from_the_config_files_folder(tmp_path, monkeypatch):
    """network.file and task.data_dir are resolved against the config's folder (not the current one), a missing
    one is an error that says so, and where the experiment lies is not part of its run ids."""
    folder = tmp_path / "exp"
    folder.mkdir()
    np.savetxt(folder / "g.txt", np.array([[0, 1], [1, 2], [2, 3], [3, 0]]), fmt="%d")
    text = ('iterations = 3\n[network]\nfile = "g.txt"\n[task]\nname = "quadratic"\n'
            '[schedule]\nname = "constant"\neta = 0.01\n')
    (folder / "c.toml").write_text(text)
    monkeypatch.chdir(tmp_path)  # g.txt is not in the current folder
    cfg = load_config(folder / "c.toml")
    first = run_experiment(cfg, tmp_path / "o", progress=False)
    assert first.executed == 1
    moved = tmp_path / "moved"
    (folder).rename(moved)
    again = run_experiment(load_config(moved / "c.toml"), tmp_path / "o", progress=False)
    assert again.skipped == 1  # same run id from the new place
    (moved / "c.toml").write_text(text.replace("g.txt", "nothere.txt"))
    with pytest.raises(Exception, match="resolved against the config file's folder"):
        run_experiment(load_config(moved / "c.toml"), tmp_path / "o2", progress=False)
    (moved / "c.toml").write_text('iterations = 3\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "logistic"\n'
                                  'dataset = "a9a"\ndata_dir = "no_such_dir"\n[schedule]\nname = "constant"\n'
                                  'eta = 0.01\n')
    with pytest.raises(Exception, match="no_such_dir is not a folder .*config file's folder"):
        run_experiment(load_config(moved / "c.toml"), tmp_path / "o3", progress=False)


def test_a_finished_run_is_not_reused_for_an_input_file_that_changed(tmp_path):
    """A run id names network.file by its path relative to the config: another folder's g.txt, or the same file
    rewritten, would have reused a run of another graph. The manifest records the file's sha256; a changed file is
    refused with the run and both digests named, in one process and with --jobs; the restored file is reused."""
    ring = np.array([[0, 1], [1, 2], [2, 3], [3, 0]])
    text = ('iterations = 3\n[network]\nfile = "g.txt"\n[task]\nname = "quadratic"\n'
            '[schedule]\nname = "constant"\neta = 0.01\n')
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, edges in ((a, ring), (b, np.vstack([ring, [[0, 2]]]))):
        folder.mkdir()
        np.savetxt(folder / "g.txt", edges, fmt="%d")
        (folder / "c.toml").write_text(text)
    out = tmp_path / "o"
    assert run_experiment(load_config(a / "c.toml"), out, progress=False).executed == 1
    (rid,) = [d.name for d in (out / "runs").iterdir()]
    digest = json.loads((out / "runs" / rid / "manifest.json").read_text())["input_files"]["network.file"]
    assert digest == hashlib.sha256((a / "g.txt").read_bytes()).hexdigest()
    assert expand(load_config(b / "c.toml"))[0][0].run_id == rid  # same id: only the content tells them apart
    for jobs in (1, 2):
        with pytest.raises(ConfigError, match=f"network.file of finished run {rid}.*changed since the run"):
            run_experiment(load_config(b / "c.toml"), out, progress=False, jobs=jobs)
    original = (a / "g.txt").read_text()
    (a / "g.txt").write_text(original.replace("3 0", "3 1"))
    with pytest.raises(ConfigError, match="another output folder"):
        run_experiment(load_config(a / "c.toml"), out, progress=False)
    (a / "g.txt").write_text(original)
    assert run_experiment(load_config(a / "c.toml"), out, progress=False).skipped == 1
    manifest = out / "runs" / rid / "manifest.json"  # a run finished before the record existed: reused, with a warning
    old = json.loads(manifest.read_text())
    del old["input_files"]
    manifest.write_text(json.dumps(old))
    with pytest.warns(UserWarning, match="predate privdl's record"):
        assert run_experiment(load_config(b / "c.toml"), out, progress=False).skipped == 1


def test_a_diverging_run_is_flagged_not_silently_saved(tmp_path):
    (tmp_path / "c.toml").write_text(BASE_TOML.replace("eta = 0.01", "eta = 100.0").replace("iterations = 3",
                                                                                         "iterations = 300"))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o"), "--no-plot",
                                   "--quiet"])
    assert res.exit_code == 0, res.output
    assert "ended with nan or inf metrics" in " ".join(res.output.split())
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "o" / "runs").glob("*/manifest.json")]
    assert manifests and all("optimality_gap" in m["nonfinite_metrics"] for m in manifests)
