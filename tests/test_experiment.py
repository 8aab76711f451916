import csv
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from privdl.cli import app
from privdl.errors import ConfigError, UnknownNameError
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


def test_sweep_expands_to_a_grid_and_runs_nonprivate_once_per_seed(tmp_path):
    runs, axes = expand(load_config(_write(tmp_path)))
    assert axes == ["mechanism.name", "mechanism.epsilon", "seed"]
    assert len(runs) == 6  # (none + 2 eps) x 2 seeds
    none = [r for r in runs if r.config["mechanism"]["name"] == "none"]
    assert all(r.sweep["mechanism.epsilon"] is None for r in none) and len(none) == 2


def test_unknown_config_key_is_named_when_the_config_is_loaded(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.batchsize.*valid keys: .*batch_size"):
        load_config(_write(tmp_path, SMALL.replace("batch_size = 4", "batch_size = 4\nbatchsize = 3")))
    with pytest.raises(ConfigError, match="unknown key 'foo'"):
        load_config(_write(tmp_path, "foo = 1\n" + SMALL))
    cfg = load_config(_write(tmp_path, "foo = 1\n" + SMALL), validate=False)  # raw reading stays possible
    with pytest.raises(ConfigError, match="unknown key 'foo'"):
        expand(cfg)


def test_wrong_type_and_unknown_names_in_config(tmp_path):
    with pytest.raises(ConfigError, match="batch_size.*int"):
        expand(load_config(_write(tmp_path), ["task.batch_size='x'"]))
    with pytest.raises(ConfigError, match="valid names: .*dsgd"):
        expand(load_config(_write(tmp_path), ["algorithm.name='admm'"]))
    with pytest.raises(ConfigError, match="valid names: .*logistic"):
        expand(load_config(_write(tmp_path), ["task.name='svm'"]))


#: a config with one name made unknown and a sweep over a key of that section: (what is replaced, by what, the sweep,
#: the error). The unknown name is reported as such, with the valid names, before any sweep key is checked (issue 45:
#: it said "sweep key ... valid keys: name").
UNKNOWN_NAMES = [
    ('name = "dp_sgd"', 'name = "dp_sgdd"', '"mechanism.epsilon" = [1.0, 2.0]',
     r"mechanism\.name: unknown mechanism 'dp_sgdd'; valid names: .*dp_sgd.*whisper"),
    ('name = "dsgd"', 'name = "admm"', '"algorithm.gamma" = [0.1, 0.2]',
     r"algorithm\.name: unknown algorithm 'admm'; valid names: .*dsgd.*dsgt"),
    ('name = "constant"', 'name = "cosine"', '"schedule.eta" = [0.1, 0.2]',
     r"schedule\.name: unknown schedule 'cosine'; valid names: .*constant"),
    ('name = "logistic"', 'name = "svm"', '"task.batch_size" = [4, 8]',
     r"task\.name: unknown task 'svm'; valid names: .*logistic"),
    ('dataset = "breast_cancer"', 'dataset = "cifar1000"', '"task.batchsize" = [4, 8]',
     r"key 'task\.dataset': unknown dataset 'cifar1000'; valid names: .*breast_cancer"),
    ('topology = "ring"', 'topology = "moebius"', '"network.p" = [0.5, 0.8]',
     r"network\.topology: unknown topology 'moebius'; valid names: .*erdos_renyi.*ring"),
    ('accountant = "rdp"', 'accountant = "renyi"', '"mechanism.epsilonn" = [1.0, 2.0]',
     r"key 'mechanism\.accountant': unknown name 'renyi'; valid names: .*pld.*rdp"),
]
NAMED = """
iterations = 5
[network]
topology = "ring"
n = 4
[task]
name = "logistic"
dataset = "breast_cancer"
batch_size = 4
[algorithm]
name = "dsgd"
[mechanism]
name = "dp_sgd"
accountant = "rdp"
clip = 1.0
lot_size = 4
noise_multiplier = 1.0
[schedule]
name = "constant"
eta = 0.1
[sweep]
"""


@pytest.mark.parametrize("old,new,sweep,error", UNKNOWN_NAMES, ids=[u[1] for u in UNKNOWN_NAMES])
def test_an_unknown_name_is_reported_before_the_keys_swept_over_it(tmp_path, old, new, sweep, error):
    assert NAMED.count(old) == 1
    with pytest.raises(ConfigError, match=error) as err:
        load_config(_write(tmp_path, NAMED.replace(old, new) + sweep + "\n"))
    assert "sweep key" not in str(err.value)


@pytest.mark.parametrize("sweep,error", [
    ('"mechanism.name" = ["none", "nope"]\n"mechanism.epsilon" = [1.0, 2.0]', "unknown mechanism 'nope'"),
    ('[[sweep.privacy]]\nlabel = "x"\nmechanism = { name = "nope", epsilon = 1.0 }', "unknown mechanism 'nope'"),
    ('"task.dataset" = ["breast_cancer", "nope"]\n"task.batchsize" = [4]', "key 'task.dataset': unknown dataset 'nope'"),
])
def test_an_unknown_name_given_by_the_sweep_itself_comes_first_too(tmp_path, sweep, error):
    with pytest.raises(ConfigError, match=error) as err:
        load_config(_write(tmp_path, NAMED + sweep + "\n"))
    assert "sweep key" not in str(err.value)


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


@pytest.mark.parametrize("override,key,valid", [
    ('task.partition="dirichlett"', "task.partition", "dirichlet"),
    ('task.dataset="breast_cancr"', "task.dataset", "breast_cancer"),
    ('network.mixing="metropolis"', "network.mixing", "metropolis_hastings"),
    ('mechanism.accountant="tigt"', "mechanism.accountant", "tight"),
    ('algorithm.optimizer="adamw"', "algorithm.optimizer", "adam"),
    ('algorithm.optimizer={name="sdg"}', "algorithm.optimizer", "sgd"),
    ('dtype="float16"', "dtype", "float32"),
    ('schedule.name="cosine"', "schedule.name", "inv_sqrt"),
])
def test_a_misspelled_registry_name_fails_at_load_with_the_valid_names(tmp_path, override, key, valid):
    text = SMALL.replace('"mechanism.name" = ["none", "gaussian_ldp"]', '"mechanism.name" = ["gaussian_ldp"]')
    text = text.replace('name = "logistic"', 'name = "logistic"\npartition = "iid"')
    if "optimizer" in override:
        text = text.replace("[schedule]", '[algorithm]\nform = "cta"\n[schedule]')
    with pytest.raises(ConfigError, match=rf"{key.split('.')[-1]}.*{valid}"):
        load_config(_write(tmp_path, text), [override])


def test_seed_groups_and_run_seeds_are_checked_too(tmp_path):
    text = SMALL.replace('"mechanism.name" = ["none", "gaussian_ldp"]', '"mechanism.name" = ["whisper"]')
    with pytest.raises(ConfigError, match="groups:M"):
        load_config(_write(tmp_path, text), ['mechanism.seeds="grups:3"'])
    cfg = load_config(_write(tmp_path, text), ['mechanism.seeds="groups:3"', 'network.seed="run"'])
    assert expand(cfg)[0][0].config["network"]["seed"] == "run"
    with pytest.raises(ConfigError, match="network.seed"):
        load_config(_write(tmp_path, text), ['network.seed="later"'])


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


@pytest.mark.parametrize("axis,match", [("mechanism.epsilom", r"'mechanism.epsilom' is not a key of any \[mechanism\]"),
                                        ("network.pp", r"'network.pp' is not a key of any \[network\]"),
                                        ("mechanismm.epsilon", r"unknown section \[mechanismm\]")])
def test_a_misspelled_sweep_axis_is_an_error_not_a_collapsed_grid(tmp_path, axis, match):
    """A sweep key no component accepts used to be dropped: the grid collapsed to the base value, silently."""
    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.errors import ConfigError
    from privdl.experiment.config import expand

    cfg = {"iterations": 2, "network": {"topology": "ring", "n": 4}, "task": {"name": "quadratic"},
           "mechanism": {"name": "gaussian_ldp", "epsilon": 10.0, "clip": 1.0},
           "schedule": {"name": "constant", "eta": 0.01}, "sweep": {axis: [1.0, 30.0]}}
    with pytest.raises(ConfigError, match=match):
        expand(cfg)
    bundle = {**cfg, "sweep": {"method": [{"label": "a", "mechanism": {"epsilom": 1.0}}]}}
    with pytest.raises(ConfigError, match="epsilom"):
        expand(bundle)
    path = tmp_path / "c.toml"
    path.write_text('iterations = 2\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "quadratic"\n'
                    f'[sweep]\n"{axis}" = [1.0, 30.0]\n')
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and axis in res.output and "[" in res.output  # bracketed words survive the markup


def test_a_network_file_defines_the_graph_and_conflicting_keys_are_refused(tmp_path):
    """A 4-agent W file under `topology = "ring", n = 5` used to run 4 agents while the manifest said ring, n = 5."""
    from privdl.errors import ConfigError
    from privdl.experiment.runner import run_experiment

    np.save(tmp_path / "w4.npy", np.full((4, 4), 0.25))
    base = {"iterations": 2, "eval_every": 2, "task": {"name": "quadratic"},
            "schedule": {"name": "constant", "eta": 0.01}}
    for extra in ({"topology": "ring", "n": 5}, {"n": 5}, {"seed": 3}):
        with pytest.raises(ConfigError, match="defines the graph"):
            run_experiment({**base, "network": {"file": str(tmp_path / "w4.npy"), **extra}}, tmp_path / "bad")
    res = run_experiment({**base, "network": {"file": str(tmp_path / "w4.npy")}}, tmp_path / "ok")
    man = json.loads(next((tmp_path / "ok" / "runs").glob("*/manifest.json")).read_text())
    assert res.executed == 1 and man["network"]["n"] == 4 and "topology" not in man["config"]["network"]


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


def test_progress_lines_for_logs_count_runs_and_estimate_the_time_left(tmp_path):
    """Without a terminal the runner reports plain lines: the count, the elapsed time and (while runs are left) an
    estimate of the time left."""
    import privdl.experiment.runner as runner

    cfg = load_config_text('iterations = 5\nseeds = 3\nbatch_replicas = 1\n[network]\ntopology = "ring"\nn = 4\n'
                           '[task]\nname = "quadratic"\n[schedule]\nname = "constant"\neta = 0.01\n', tmp_path)
    lines: list[str] = []
    old = runner.Lines.__init__.__defaults__
    runner.Lines.__init__.__defaults__ = (0.0,)  # a line after every run
    try:
        run_experiment(cfg, tmp_path / "o", progress=lines.append)
    finally:
        runner.Lines.__init__.__defaults__ = old
    assert lines[0].endswith("3 runs, 0 already done")
    counts = [ln.split(": ")[1].split(" runs")[0] for ln in lines[1:]]
    assert counts == sorted(counts) and list(dict.fromkeys(counts)) == ["0/3", "1/3", "2/3", "3/3"]
    # before the first run ends, the estimate already counts the rounds measured (a long stacked batch is not
    # silent until it finishes)
    assert "left" in lines[1] and counts[0] == "0/3"
    assert "left" not in lines[-1]
    lines.clear()
    run_experiment(cfg, tmp_path / "o", progress=lines.append)  # resumed: all done
    assert lines == ["experiment: 3 runs, 3 already done"]


def test_the_time_left_weights_runs_by_rounds_and_agents():
    """A sweep that finishes a cheap run first (a central run: one agent) is not promised an early end: the
    estimate scales the time spent by the cost left over the cost done (rounds × agents), not by run counts."""
    import privdl.experiment.runner as runner
    from privdl.experiment.config import RunSpec

    specs = [RunSpec("central", {"iterations": 100, "network": {"n": 1}}, {}),
             *[RunSpec(f"d{k}", {"iterations": 100, "network": {"n": 10}}, {}) for k in range(3)]]
    said: list[str] = []
    lines = runner.Lines("t", {s.run_id: runner.run_cost(s.config) for s in specs}, set(), said.append,
                          every=0.0)
    lines.start -= 10.0  # the central run took 10 s
    lines.update({"central"})
    assert said[-1].startswith("t: 1/4 runs done, 10s elapsed, ≈ 5m00s left")  # 3 × 10 agents at 10 s per agent
    lines.update({"central", "d0", "d1", "d2"})
    assert "left" not in said[-1] and "4/4" in said[-1]


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


def load_config_text(text: str, folder: Path, *, validate: bool = True) -> dict:
    path = folder / f"c{abs(hash(text))}.toml"
    path.write_text(text)
    return load_config(path, validate=validate)


def test_plots_are_readable_at_a_glance():
    """Series differ in colour, line style and marker; a series on top of another says so; reference lines never
    take a series' colour; labels are human names; the caption is written."""
    import matplotlib.colors as mcolors

    from privdl.experiment.plot import figure, label

    series = [("ε=1", [1, 2, 3], [1.0, 2.0, 3.0], None), ("ε=10", [1, 2, 3], [1.0, 2.0, 3.0], None),
              ("ε=100", [1, 2, 3], [3.0, 2.0, 1.0], None)]
    fig = figure(series, xlabel=label("mechanism.epsilon"), ylabel=label("test_accuracy"), title="t",
                 references=[("non-private", 2.5, 0.1)], caption="privacy: agent-level, δ = 1e-05")
    ax = fig.axes[0]
    lines = ax.get_lines()
    styles = {(ln.get_linestyle(), ln.get_marker()) for ln in lines[:3]}
    assert len(styles) == 3
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "ε=10 (coincides with ε=1)" in texts and "ε=100" in texts
    ref = lines[3]
    assert all(mcolors.to_hex(ref.get_color()) != mcolors.to_hex(ln.get_color()) for ln in lines[:3])
    assert ax.get_xlabel() == "ε" and ax.get_ylabel() == "test accuracy"
    assert any("δ = 1e-05" in t.get_text() for t in fig.texts)
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.slow
def test_experiment_plots_split_by_task_and_carry_the_privacy_caption(tmp_path):
    from privdl.experiment.plot import plot_experiment, privacy_caption

    cfg = load_config_text(
        'iterations = 20\neval_every = 10\nseeds = 2\n[network]\ntopology = "ring"\nn = 4\n[mechanism]\nclip = 1.0\n'
        'delta = 1e-5\n[sweep]\n"mechanism.name" = ["none", "gaussian_ldp"]\n"mechanism.epsilon" = [10.0, 100.0, 30.0]\n'
        '[[sweep.task]]\nlabel = "quadratic"\ntask = { name = "quadratic" }\nschedule = { name = "constant", eta = 0.01 }\n'
        '[[sweep.task]]\nlabel = "logistic"\ntask = { name = "logistic", dataset = "breast_cancer", batch_size = 8 }\n'
        'schedule = { name = "constant", eta = 0.1 }\n', tmp_path)
    run_experiment(cfg, tmp_path / "o", progress=False)
    files = {p.name for p in plot_experiment(tmp_path / "o")}
    assert "quadratic_consensus_distance_vs_iteration.png" in files
    assert "logistic_consensus_distance_vs_iteration.png" in files
    assert not any(f.startswith("consensus") for f in files)  # no axis mixes the two tasks
    cap = privacy_caption(tmp_path / "o")
    assert "agent-level" in cap and "δ = 1e-05" in cap and "accountant" in cap and "mechanism none" in cap


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


BASE_TOML = ('iterations = 3\n[network]\ntopology = "ring"\nn = 5\n[task]\nname = "quadratic"\n'
             '[schedule]\nname = "constant"\neta = 0.01\n')


@pytest.mark.parametrize("prefix,match", [
    ("threads = -1\n", "threads must be >= 0"),
    ('device = "tpu"\n', "device must be"),
    ("eval_every = -5\n", "eval_every must be >= 0"),
    ('seed = "abc"\nseeds = [0, 1]\n', "either 'seed'"),  # the seed axis would silently overwrite it
])
def test_bad_top_level_values_are_refused_at_load(tmp_path, prefix, match):
    (tmp_path / "c.toml").write_text(prefix + BASE_TOML)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / "c.toml")


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


@pytest.mark.parametrize("override,match", [
    ("task.angle_deg=-inf", "give a finite number"),
    ("schedule.eta=nan", "give a finite number"),
    ("task.seed=-1", "random seed and must be >= 0"),
    ("network.topology=[1, 2]", "must be a name"),
])
def test_values_no_parameter_can_mean_are_refused_at_load(tmp_path, override, match):
    """Found by benchmarks/bad_inputs.py: these ran into a traceback or printed nan."""
    (tmp_path / "c.toml").write_text(BASE_TOML)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / "c.toml", [override])


def test_a_diverging_run_is_flagged_not_silently_saved(tmp_path):
    (tmp_path / "c.toml").write_text(BASE_TOML.replace("eta = 0.01", "eta = 100.0").replace("iterations = 3",
                                                                                         "iterations = 300"))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o"), "--no-plot",
                                   "--quiet"])
    assert res.exit_code == 0, res.output
    assert "ended with nan or inf metrics" in " ".join(res.output.split())
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "o" / "runs").glob("*/manifest.json")]
    assert manifests and all("optimality_gap" in m["nonfinite_metrics"] for m in manifests)


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
