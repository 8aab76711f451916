"""The results folder of an experiment and the processes that share it: a folder bound to one experiment (and
grown with its grid), damaged runs redone, per-run locks across processes, ``--jobs`` helpers and the planner that
hands them runs."""

import csv
import json
from pathlib import Path

import pytest
import torch

from privdl.errors import ConfigError
from privdl.experiment import expand, load_config, run_experiment
from tests.test_experiment import SMALL, _write


def test_output_dir_of_a_different_config_is_refused(tmp_path):
    out = tmp_path / "out"
    run_experiment(load_config(_write(tmp_path)), out, progress=False)
    with pytest.raises(ConfigError, match="different experiment.*iterations"):
        run_experiment(load_config(_write(tmp_path), ["iterations=30"]), out, progress=False)


def test_an_out_directory_grows_or_shrinks_with_its_grid_and_keeps_finished_runs(tmp_path):
    """The same experiment over another grid (more seeds, more ε) re-points its folder: finished runs are reused,
    not re-run, and results.csv is what a fresh folder would hold; anything outside the grid is still refused."""
    out = tmp_path / "out"
    small = SMALL.replace("seeds = [0, 1]", "seeds = [1]").replace("[1.0, 10.0]", "[10.0]")
    (tmp_path / "x").mkdir()
    one = run_experiment(load_config(_write(tmp_path / "x", small)), out, progress=False)
    assert one.executed == 2  # none, gaussian_ldp at ε = 10, seed 1
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/manifest.json")}
    full = run_experiment(load_config(_write(tmp_path)), out, progress=False)
    assert (full.executed, full.skipped) == (4, 2)
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())
    run_experiment(load_config(_write(tmp_path)), tmp_path / "fresh", progress=False)
    assert (out / "results.csv").read_text() == (tmp_path / "fresh" / "results.csv").read_text()
    back = run_experiment(load_config(_write(tmp_path / "x", small)), out, progress=False)
    assert (back.executed, back.skipped) == (0, 2)
    assert len({row["run_id"] for row in csv.DictReader(open(out / "results.csv"))}) == 2
    with pytest.raises(ConfigError, match="different experiment.*iterations"):
        run_experiment(load_config(_write(tmp_path), ["iterations=30"]), out, progress=False)


def test_a_damaged_manifest_is_run_again_and_a_cut_results_csv_is_refused(tmp_path):
    from privdl.errors import ValidationError
    from privdl.experiment.runner import run_experiment
    from privdl.experiment.store import read_results

    cfg = {"iterations": 3, "eval_every": 3, "seeds": 2, "network": {"topology": "ring", "n": 4},
           "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.01}}
    first = run_experiment(cfg, tmp_path / "o")
    manifests = sorted((tmp_path / "o" / "runs").glob("*/manifest.json"))
    assert first.executed == 2 and len(manifests) == 2
    manifests[0].write_text("{")  # damaged: used to count as finished
    with pytest.warns(UserWarning, match="damaged or incomplete"):
        again = run_experiment(cfg, tmp_path / "o")
    assert again.executed == 1 and json.loads(manifests[0].read_text())["status"] == "complete"
    results = tmp_path / "o" / "results.csv"
    fields, rows = read_results(results)
    assert len({r["run_id"] for r in rows}) == 2
    results.write_text(results.read_text()[:-4])  # cut in the middle of a number
    with pytest.raises(ValidationError, match="cut short"):
        read_results(results)
    metrics = manifests[1].parent / "metrics.csv"
    metrics.write_text(metrics.read_text().replace("\n0,", "\nzero,", 1))
    with pytest.raises(ValidationError, match="is damaged"):
        run_experiment(cfg, tmp_path / "o")


@pytest.mark.slow
def test_two_processes_on_one_out_never_run_the_same_run_twice(tmp_path):
    """Each run is claimed with a lock file before it is executed; a second process skips what the first holds (and
    says so), and takes over a lock whose process is gone."""
    import subprocess
    import sys

    from privdl.experiment.store import ResultStore

    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text('iterations = 20000\neval_every = 20000\nseeds = 6\nbatch_replicas = 1\n[network]\n'
                        'topology = "ring"\nn = 4\n[task]\nname = "quadratic"\n[schedule]\nname = "constant"\n'
                        'eta = 0.01\n')
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "privdl.cli", "run", str(cfg_path), "--out", str(out), "--no-plot"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    texts = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), texts
    executed = [int(t.split("runs (")[1].split(" executed")[0]) for t in texts]
    assert sum(executed) == 6, texts  # every run executed exactly once across the two processes
    assert min(executed) >= 1, texts  # they did overlap (else the test would prove nothing)
    store = ResultStore(out)
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 6 and not any((r / ".lock").exists() for r in runs)
    # a lock left by a dead process is taken over
    (runs[0] / ".lock").write_text(f"{__import__('socket').gethostname()} 999999999")
    assert store.lock(runs[0].name)
    (runs[1] / ".lock").write_text(f"{__import__('socket').gethostname()} 1")
    assert not store.lock(runs[1].name)  # pid 1 is alive: another process holds it
    (runs[1] / ".lock").unlink()


@pytest.mark.exact
@pytest.mark.slow
def test_jobs_share_the_runs_between_processes_with_the_results_of_one_process(tmp_path):
    """``jobs = 2``: a spawned helper and this process take the stacked groups in turn; every run is executed once,
    by one of the two processes, with exactly the numbers a single process computes, and results.csv lists all. The
    progress counts the helper's runs too (it used to stop at this process's share)."""
    import os

    import privdl.experiment.runner as runner
    from privdl.errors import ValidationError
    from privdl.experiment.store import read_results

    cfg = {"iterations": 10000, "eval_every": 5000, "seeds": 3, "network": {"topology": "ring", "n": 4},
           "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.01},
           "sweep": {"task.curvature": [1.0 + k / 4 for k in range(10)]}}  # 10 groups of 3 stacked runs
    lines: list[str] = []
    old, runner.Lines.__init__.__defaults__ = runner.Lines.__init__.__defaults__, (0.0,)  # a line per update
    try:
        together = run_experiment(cfg, tmp_path / "jobs", jobs=2, progress=lines.append)
    finally:
        runner.Lines.__init__.__defaults__ = old
    counts = [int(ln.split(": ")[1].split("/")[0]) for ln in lines[1:]]
    assert counts == sorted(counts) and counts[-1] == 30 and lines[-1].startswith("experiment: 30/30 runs done")
    alone = run_experiment(cfg, tmp_path / "one", progress=False)
    assert together.runs == together.executed == alone.executed == 30 and together.skipped == 0
    pids = set()
    for path in (tmp_path / "one" / "runs").glob("*/manifest.json"):
        mine = json.loads(path.read_text())
        theirs = json.loads((tmp_path / "jobs" / "runs" / path.parent.name / "manifest.json").read_text())
        assert theirs["final_metrics"] == mine["final_metrics"]
        pids.add(theirs["process"]["pid"])
        # what decides a run's last bits is recorded: the kernels ATen picked and the intra-op threads
        assert theirs["process"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert theirs["process"]["threads"] >= 1
    assert len(pids) == 2 and os.getpid() in pids  # both processes ran groups
    assert read_results(tmp_path / "jobs" / "results.csv")[1] == read_results(tmp_path / "one" / "results.csv")[1]
    again = run_experiment(cfg, tmp_path / "jobs", jobs=2, progress=False)
    assert again.executed == 0 and again.skipped == 30
    with pytest.raises(ValidationError, match="jobs must be an integer >= 1"):
        run_experiment(cfg, tmp_path / "bad", jobs=0)


@pytest.mark.slow
def test_a_jobs_helper_leaves_when_its_main_process_is_killed(tmp_path):
    """``kill`` of a ``--jobs`` run's main process must not leave its helper running alone (holding a core and its
    runs' locks); the helper's unfinished run is run again by the next invocation, like any interrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "main.py"
    script.write_text(
        "from privdl.experiment import run_experiment\n"
        "cfg = {'iterations': 400000, 'seeds': 1, 'network': {'topology': 'ring', 'n': 4},\n"
        "       'task': {'name': 'quadratic'}, 'schedule': {'name': 'constant', 'eta': 0.01},\n"
        "       'sweep': {'task.curvature': [1.0, 2.0, 3.0, 4.0]}}\n"
        "if __name__ == '__main__':\n"
        f"    run_experiment(cfg, {str(tmp_path / 'out')!r}, jobs=2, progress=False)\n")
    main = subprocess.Popen([sys.executable, str(script)])
    try:
        helper, deadline = None, time.time() + 120
        while helper is None and time.time() < deadline:  # the helper shows itself by the lock of the run it took
            for lock in (tmp_path / "out" / "runs").glob("*/.lock"):
                try:
                    pid = int(lock.read_text().split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if pid != main.pid:
                    helper = pid
            time.sleep(0.2)
        assert helper is not None, "no helper took a run"
        os.kill(main.pid, signal.SIGKILL)
        main.wait()
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                status = Path(f"/proc/{helper}/status").read_text()
            except OSError:
                break  # gone
            if "\nState:\tZ" in status:
                break  # exited, not yet reaped by its new parent
            time.sleep(0.2)
        else:
            os.kill(helper, signal.SIGKILL)
            raise AssertionError("the helper kept running after its main process was killed")
    finally:
        if main.poll() is None:
            main.kill()


def test_runs_that_cannot_stack_are_planned_one_by_one_so_jobs_share_them():
    """The planner groups runs for the replica axis; a group is taken whole by one process, so runs that will never
    stack (clip-only, CGA, batch_replicas = 1) must be groups of one — else ``--jobs 2`` left one process idle.
    DP-SGD runs and DPDL (any mechanism that takes cross-gradients) stack since issue 32."""
    from privdl.experiment.run_plan import plan

    base = {"iterations": 5, "seeds": 2, "network": {"topology": "ring", "n": 4},
            "task": {"name": "logistic", "dataset": "breast_cancer", "batch_size": 4},
            "schedule": {"name": "constant", "eta": 0.1},
            "sweep": {"mechanism.epsilon": [1.0, 10.0]}}

    def sizes(**sections):
        runs, _ = expand({**base, **sections})
        return sorted(len(g) for g in plan(runs))

    assert sizes(mechanism={"name": "gaussian_ldp", "clip": 1.0, "delta": 1e-5}) == [4]
    dp_sgd = {"name": "dp_sgd", "clip": 1.0, "delta": 1e-5, "lot_size": 4}
    assert sizes(mechanism=dp_sgd) == [4]
    # DPDL (cross-gradients) stacks when asked (batch_replicas > 1) or on a GPU; on the CPU by default it runs one
    # run per process (its stacked rounds are no faster there: BENCHMARKS.md)
    assert sizes(algorithm={"name": "dpdl"}, mechanism=dp_sgd) == [1, 1, 1, 1]
    assert sizes(algorithm={"name": "dpdl"}, mechanism=dp_sgd, batch_replicas=4) == [4]
    assert sizes(algorithm={"name": "dpdl"}, mechanism=dp_sgd, device="cuda") == [4]
    assert sizes(mechanism=dp_sgd, batch_replicas=1) == [1, 1, 1, 1]
    assert sizes(mechanism={"name": "clip", "clip": 1.0}, sweep={"mechanism.clip": [1.0, 2.0]}) == [1, 1, 1, 1]
    dpdl = {**base, "sweep": {"schedule.eta": [0.1, 0.2]}}
    runs, _ = expand({**dpdl, "algorithm": {"name": "dpdl"}, "batch_replicas": 8})
    assert sorted(len(g) for g in plan(runs)) == [4]  # non-private DPDL stacks too
    runs, _ = expand({**dpdl, "algorithm": {"name": "cga"}})
    assert sorted(len(g) for g in plan(runs)) == [1, 1, 1, 1]  # CGA's per-agent QPs never stack
    runs, _ = expand({**dpdl, "algorithm": {"name": "dsgd"}})
    assert sorted(len(g) for g in plan(runs)) == [4]


def test_merge_gathers_shard_folders_into_one_that_then_runs_only_the_rest(tmp_path, capsys):
    """Two folders that ran disjoint seeds of one experiment (two machines, two sessions) merge into a third; a run
    over the whole grid there executes nothing, and its results.csv is byte-identical to one folder that ran
    everything. Another experiment gives only the runs the grid holds; a folder without experiment.json, a run
    under a name that is not its own and an unfinished run are refused or left behind."""
    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.experiment.store import merge

    # batch_replicas = 1: every run alone in every folder, so "byte-identical" compares the same operations (a run
    # stacked with two others and the same run alone differ in the last digit on some CPUs: other kernel shapes)
    base = {"iterations": 4, "eval_every": 2, "network": {"topology": "ring", "n": 4}, "batch_replicas": 1,
            "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.01}}
    run_experiment({**base, "seeds": [0]}, tmp_path / "a", progress=False)
    run_experiment({**base, "seeds": [1, 2]}, tmp_path / "b", progress=False)
    s = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    assert (s.copied, s.present, s.unfinished) == (3, 0, 0)
    assert s.outside_grid == 2  # m took a's experiment (seed 0); seeds 1, 2 wait for a larger grid
    assert merge([tmp_path / "b"], tmp_path / "m").present == 2  # merging again copies nothing
    whole = run_experiment({**base, "seeds": [0, 1, 2]}, tmp_path / "m", progress=False)
    assert (whole.executed, whole.skipped) == (0, 3)
    run_experiment({**base, "seeds": [0, 1, 2]}, tmp_path / "fresh", progress=False)
    assert (tmp_path / "m" / "results.csv").read_text() == (tmp_path / "fresh" / "results.csv").read_text()

    run_experiment({**base, "iterations": 6, "seeds": [0]}, tmp_path / "other", progress=False)
    # another experiment is refused, named with the key where it differs, before anything is copied (issue 44)
    with pytest.raises(ConfigError, match=r"other \(differs at: iterations\): it holds another experiment than "):
        merge([tmp_path / "other"], tmp_path / "m")
    # asked for: none of its runs is in m's grid
    s = merge([tmp_path / "other"], tmp_path / "m", other_experiments=True)
    assert (s.copied, s.foreign) == (0, 1) and "iterations" in s.other_experiments[0]
    # another experiment whose runs are m's (the same resolved configs: only its name and grid differ) gives those
    # that m's grid holds, and only those
    run_experiment({**base, "name": "table 2", "seeds": [3, 4]}, tmp_path / "named", progress=False)
    (tmp_path / "b2").mkdir()
    run_experiment({**base, "seeds": [5]}, tmp_path / "b2", progress=False)  # m's experiment, another seed
    with pytest.raises(ConfigError, match=r"named \(differs at: name\).*--other-experiments"):
        merge([tmp_path / "b2", tmp_path / "named"], tmp_path / "m")
    assert not any((tmp_path / "m" / "runs" / d.name).exists() for d in (tmp_path / "b2" / "runs").iterdir())
    s = merge([tmp_path / "named"], tmp_path / "m", other_experiments=True)
    assert (s.copied, s.foreign) == (0, 2)
    grown = {**base, "seeds": [0, 1, 2, 3]}
    run_experiment(grown, tmp_path / "m", progress=False, shard=(0, 1000))  # m now holds the grid of seeds 0…3
    s = merge([tmp_path / "named"], tmp_path / "m", other_experiments=True)
    assert (s.copied, s.foreign) == (1, 1)
    assert run_experiment(grown, tmp_path / "m", progress=False).executed == 0
    (tmp_path / "holder" / "runs").mkdir(parents=True)
    (tmp_path / "a").rename(tmp_path / "holder" / "runs" / "x")
    (tmp_path / "holder" / "runs" / "x" / "experiment.json").rename(tmp_path / "holder" / "runs" / "experiment.json")
    with pytest.raises(ConfigError, match="no experiment.json.*subfolder"):
        merge([tmp_path / "holder"], tmp_path / "n")

    runs = sorted((tmp_path / "b" / "runs").iterdir())
    runs[0].rename(runs[0].parent / "0123456789ab")  # a finished run under another run's name
    (runs[1] / "manifest.json").unlink()  # an unfinished run
    with pytest.warns(UserWarning, match="is not the run its name says"):
        s = merge([tmp_path / "b"], tmp_path / "new")
    assert (s.copied, s.unfinished) == (0, 2) and not (tmp_path / "new" / "runs" / "0123456789ab").exists()

    # a reproduction's runs live in its runs/ subfolder: merging them into its root is refused (or, where it
    # may be meant, warned about) with the right path
    (tmp_path / "repro").mkdir()
    (tmp_path / "fresh").rename(tmp_path / "repro" / "runs")
    with pytest.warns(UserWarning, match="merge into .*archive.runs"):  # it may be meant (an archive of runs)
        merge([tmp_path / "repro" / "runs"], tmp_path / "archive")
    merge([tmp_path / "repro" / "runs"], tmp_path / "table" / "runs")
    with pytest.raises(ConfigError, match="is a reproduction's folder"):
        merge([tmp_path / "repro" / "runs"], tmp_path / "table")
    (tmp_path / "repro" / "runs").rename(tmp_path / "fresh")

    result = CliRunner().invoke(app, ["merge", str(tmp_path / "fresh"), "--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert "3 runs copied" in result.output and "0 already there" in result.output


def test_where_the_data_lies_is_not_part_of_a_run_or_an_experiment(tmp_path):
    """The same runs with the data in another folder (another machine) keep their ids and their results folder;
    a run saved under the id privdl gave it before (data folder included) is re-keyed by merge, not refused."""
    from privdl.experiment.run_identity import legacy_run_id, run_id
    from privdl.experiment.store import ResultStore, merge

    cfg = {"seed": 0, "iterations": 5, "task": {"name": "cnn", "dataset": "mnist_t10k", "data_dir": "../shared/data"}}
    moved = {**cfg, "task": {**cfg["task"], "data_dir": "/data/mnist"}}
    other = {**cfg, "task": {**cfg["task"], "dataset": "fashion_mnist"}}
    assert run_id(cfg) == run_id(moved) != run_id(other)
    assert legacy_run_id(cfg) != legacy_run_id(moved)
    store = ResultStore(tmp_path / "o")
    store.claim(cfg)
    (tmp_path / "o" / "runs" / "r").mkdir(parents=True)
    (tmp_path / "o" / "runs" / "r" / "metrics.csv").write_text("")  # a run under way: the folder is not free
    store.claim(moved)  # the same experiment: not refused
    with pytest.raises(ConfigError, match="different experiment.*task.dataset"):
        store.claim(other)

    base = {"iterations": 4, "eval_every": 2, "seeds": [0], "network": {"topology": "ring", "n": 4},
            "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.01}}
    run_experiment(base, tmp_path / "a", progress=False)
    (old_dir,) = (tmp_path / "a" / "runs").iterdir()
    man = json.loads((old_dir / "manifest.json").read_text())
    man["config"]["task"]["data_dir"] = "/old/place"  # as if made by a version that hashed the data folder
    legacy = legacy_run_id(man["config"])
    man["run_id"] = legacy
    (old_dir / "manifest.json").write_text(json.dumps(man))
    old_dir.rename(old_dir.parent / legacy)
    s = merge([tmp_path / "a"], tmp_path / "m")
    assert (s.copied, s.rekeyed) == (1, 1)
    again = json.loads((tmp_path / "m" / "runs" / old_dir.name / "manifest.json").read_text())
    assert again["run_id"] == old_dir.name and again["previous_run_id"] == legacy
