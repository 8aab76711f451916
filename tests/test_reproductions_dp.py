"""Seed 004's table reproductions run end to end (tiny settings) and survive interruption."""

import inspect
import json
import math

import pytest

from privdl.errors import ValidationError
from privdl.reproductions import REPRODUCTIONS
from privdl.reproductions.common import read_csv


@pytest.mark.slow
def test_table1_cells_ledgers_and_resume(tmp_path):
    opts = dict(seeds=1, iterations=3, epsilons=(math.inf, 2.0), fiedlers=(1.0,), methods=("central", "dsgt", "dinno"),
                dataset="digits", lot=32)
    summary = REPRODUCTIONS.get("table1")(tmp_path, **opts)
    rows = read_csv(tmp_path / "table1.csv")
    assert len(rows) == 2 + 4  # central per ε, then 2 methods × 2 ε
    private = [r for r in rows if r["epsilon"] == "2.0"]
    assert all(r["unit"] == "example" and float(r["epsilon_achieved"]) <= 2.0 for r in private)
    dsgt = next(r for r in private if r["method"] == "dsgt")
    assert int(dsgt["noisy_accesses"]) == 4  # T + 1: DSGT's initial tracking gradient is accounted
    assert {s["method"] for s in summary} == {"central", "dsgt", "dinno"}
    # seed 004's Fig. 1: one figure per decentralized method that ran (accuracy against the Fiedler value, per ε)
    assert sorted(p.name for p in tmp_path.glob("table1_fiedler_*.png")) == ["table1_fiedler_dinno.png",
                                                                            "table1_fiedler_dsgt.png"]
    # side by side with the paper: "ours (paper)" in the right column, "—" where nothing ran
    md = (tmp_path / "table1_vs_paper.md").read_text().splitlines()
    central = next(line for line in md if line.startswith("| Central"))
    ours = next(s for s in summary if s["method"] == "central" and math.isinf(float(s["epsilon"])))
    assert central.split("|")[2].strip() == f"{ours['accuracy_mean']:.2f} ± 0.00 (98.22)"
    dsgd = next(line for line in md if line.startswith("| DP-DSGD"))
    assert dsgd.split("|")[2].strip() == "— (95.38)"
    manifests = sorted((tmp_path / "runs" / "runs").glob("*/manifest.json"))
    assert len(manifests) == 6
    stamps = [m.stat().st_mtime_ns for m in manifests]
    before = (tmp_path / "table1.csv").read_text()
    REPRODUCTIONS.get("table1")(tmp_path, **opts)  # everything done: nothing reruns, the same table
    assert [m.stat().st_mtime_ns for m in manifests] == stamps
    assert (tmp_path / "table1.csv").read_text() == before
    # every cell is an ordinary run: a manifest whose ledger re-accounts to the ε it states
    from privdl.privacy.ledger import Ledger
    import json

    for m in manifests:
        stated = json.loads(m.read_text())["privacy_ledger"][0]
        again = Ledger.from_dict(stated).reaccount()
        assert again.to_dict()["epsilon"] == stated["epsilon"]


def test_table2_shards_cover_the_grid_once(tmp_path):
    """K processes with --shard I/K run disjoint runs into one folder; together they are exactly the unsharded
    table, and an unsharded resume over them runs nothing."""
    opts = dict(seeds=1, iterations=2, epsilons=(math.inf,), ts=(0.0, 1.0), methods=("dsgd", "dsgt"),
                dataset="digits", lot=32)
    runs = tmp_path / "sharded" / "runs" / "runs"
    seen: set[str] = set()
    sizes = []
    for i in range(3):
        REPRODUCTIONS.get("table2")(tmp_path / "sharded", shard=f"{i}/3", **opts)
        now = {p.parent.name for p in runs.glob("*/manifest.json")}
        sizes.append(len(now - seen))
        seen = now
    assert sorted(sizes) == [1, 1, 2] and len(seen) == 4  # disjoint shares of the 4 runs
    full = REPRODUCTIONS.get("table2")(tmp_path / "whole", **opts)
    key = lambda r: (r["method"], r["t"])  # noqa: E731
    sharded_rows = sorted(read_csv(tmp_path / "sharded" / "table2.csv"), key=key)
    whole_rows = sorted(read_csv(tmp_path / "whole" / "table2.csv"), key=key)
    assert [key(r) for r in sharded_rows] == [key(r) for r in whole_rows]
    assert [r["accuracy"] for r in sharded_rows] == [r["accuracy"] for r in whole_rows]  # the same runs
    summary = read_csv(tmp_path / "sharded" / "table2_summary.csv")
    assert [float(r["accuracy_mean"]) for r in summary] == pytest.approx([r["accuracy_mean"] for r in full])
    stamps = {p: p.stat().st_mtime_ns for p in runs.glob("*/manifest.json")}
    REPRODUCTIONS.get("table2")(tmp_path / "sharded", **opts)
    assert {p: p.stat().st_mtime_ns for p in runs.glob("*/manifest.json")} == stamps


@pytest.mark.parametrize("shard", ["3/3", "1", "a/b", "-1/2"])
def test_bad_shard_is_refused(tmp_path, shard):
    with pytest.raises(ValidationError, match="shard"):
        REPRODUCTIONS.get("table2")(tmp_path, shard=shard, seeds=1, iterations=1, dataset="digits")


def test_unknown_method_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="unknown method"):
        REPRODUCTIONS.get("table2")(tmp_path, methods=("central",), seeds=1, iterations=1, dataset="digits")


def test_cli_refuses_options_a_reproduction_would_ignore(tmp_path):
    """An option the reproduction does not take is an error naming it (never silently dropped), and an option it
    does take reaches it (fmnist's --iterations sets its rounds)."""
    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.reproductions import corn

    res = CliRunner().invoke(app, ["reproduce", "fig1", "--device", "cuda", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--device does not apply to 'fig1'" in res.output
    res = CliRunner().invoke(app, ["reproduce", "fmnist", "--tune-seeds", "2", "--clip", "1", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--tune-seeds, --clip do not apply to 'fmnist'" in res.output
    assert "--iterations" in res.output  # what it does take
    seen = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(REPRODUCTIONS._items, "fmnist", lambda out, *, iterations=1000, seeds=1, progress=False:
                   seen.update(iterations=iterations, seeds=seeds) or [])
        res = CliRunner().invoke(app, ["reproduce", "fmnist", "--iterations", "7", "--seeds", "2", "--out",
                                       str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert seen == {"iterations": 7, "seeds": 2}
    assert "iterations" in inspect.signature(corn.fmnist).parameters


@pytest.mark.slow
def test_a9a_authors_protocol_runs_with_their_step_sizes_and_honest_units(tmp_path, shared_data):
    """Seed 001 as the authors' code runs it: every (ε, design) at their η, per-example clipping, the example-level
    ε at the target and the agent-level ε of the same noise beside it (orders of magnitude larger)."""
    from privdl.reproductions.papers import AUTHORS_A9A_ETA_BY_EPSILON, AUTHORS_A9A_ETA_BY_P

    rows = REPRODUCTIONS.get("a9a_authors")(tmp_path, seeds=1, iterations=2, data_dir=str(shared_data))
    private = [r for r in rows if r["design"] != "none"]
    got = {(r["epsilon"], r["design"]): r["eta"] for r in private if r["p"] == 0.5}
    assert got == AUTHORS_A9A_ETA_BY_EPSILON
    assert {(r["p"], r["design"]): r["eta"] for r in private
            if r["epsilon"] == 10.0 and r["p"] != 0.5} == AUTHORS_A9A_ETA_BY_P
    for r in private:
        assert r["unit"] == "example" and r["epsilon_example_level"] == pytest.approx(r["epsilon"], rel=1e-6)
        assert r["epsilon_agent_level"] > 100 * r["epsilon"]
    assert {r["p"] for r in rows if r["design"] == "none"} == {0.2, 0.4, 0.5, 0.6, 0.8, 1.0}
    csv = read_csv(tmp_path / "a9a_authors.csv")
    assert len(csv) == len(rows) and (tmp_path / "a9a_authors_vs_epsilon.png").is_file()


@pytest.mark.slow
def test_table1_with_the_authors_gossip_and_resize(tmp_path):
    """--gossip authors runs DP-DSGD and DP-DSGT with seed 004's in-place averaging (recorded per row; DP-DSGT then
    makes T accesses, y⁰ = 0); DiNNO stays synchronous, as in their code; a bad value is refused."""
    rows = REPRODUCTIONS.get("table1")(tmp_path, seeds=1, iterations=2, epsilons=(1.0,), fiedlers=(0.7,),
                                       methods=("dsgd", "dsgt", "dinno"), dataset="digits", lot=32,
                                       gossip="authors", resize=10)
    csv = {r["method"]: r for r in read_csv(tmp_path / "table1.csv")}
    assert rows and all(r["resize"] == "10" for r in csv.values())
    assert csv["dsgd"]["gossip"] == csv["dsgt"]["gossip"] == "authors" and csv["dinno"]["gossip"] == "synchronous"
    assert int(csv["dsgt"]["noisy_accesses"]) == 2
    with pytest.raises(ValidationError, match="gossip must be"):
        REPRODUCTIONS.get("table1")(tmp_path / "b", seeds=1, iterations=2, methods=("dsgt",), dataset="digits",
                                    gossip="sideways")


def test_table1_with_central_alone_runs_once_per_epsilon(tmp_path):
    """Central DP-SGD has no graph: asked for alone (with or without the step-size search) it runs once per ε
    instead of refusing the Fiedler axis."""
    for tune in (False, True):
        out = tmp_path / str(tune)
        REPRODUCTIONS.get("table1")(out, seeds=1, iterations=2, epsilons=(math.inf, 2.0), fiedlers=(1.0, 0.06),
                                    methods=("central",), dataset="digits", lot=32, tune=tune)
        rows = read_csv(out / "table1.csv")
        assert sorted((r["method"], r["epsilon"]) for r in rows) == [("central", "2.0"), ("central", "inf")]
    # a table grows in place: another ε into the same folder runs only the new cell
    out = tmp_path / "False"
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs" / "runs").glob("*/manifest.json")}
    REPRODUCTIONS.get("table1")(out, seeds=1, iterations=2, epsilons=(math.inf, 2.0, 1.0), methods=("central",),
                                dataset="digits", lot=32)
    assert sorted(r["epsilon"] for r in read_csv(out / "table1.csv")) == ["1.0", "2.0", "inf"]
    assert len(stamps) == 2 and all(p.stat().st_mtime_ns == t for p, t in stamps.items())
    # and shrinks: the table is the grid asked for, never every run the folder holds (no run reruns)
    REPRODUCTIONS.get("table1")(out, seeds=1, iterations=2, epsilons=(1.0,), methods=("central",), dataset="digits",
                                lot=32)
    assert [r["epsilon"] for r in read_csv(out / "table1.csv")] == ["1.0"]
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())


@pytest.mark.slow
def test_table1_ablation_switches_for_step_sizes_and_normalisation(tmp_path, monkeypatch):
    """--steps nearest gives ε = 100 the ε = 10 cell's step sizes (the tables before the fidelity issue), --steps
    authors its own; --no-normalize leaves the pixels raw. The rows record both, so an ablation reads off its CSV."""
    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.reproductions import dp_dec
    from privdl.reproductions.common import packaged_config

    monkeypatch.setitem(dp_dec.NORMALIZE, "digits", [0.3, 0.4])  # sklearn's digits have no authors' constants
    cells = {b["label"]: b["schedule"] for b in packaged_config("table1")["sweep"]["cell"]}
    own, nearest = cells["dsgd eps=100.0"], cells["dsgd eps=10.0"]
    assert own["eta_start"] != nearest["eta_start"]
    opts = dict(seeds=1, iterations=2, epsilons=(100.0,), fiedlers=(1.0,), methods=("dsgd",), dataset="digits",
                lot=32)
    REPRODUCTIONS.get("table1")(tmp_path / "a", **opts)
    REPRODUCTIONS.get("table1")(tmp_path / "b", **opts, steps="nearest", normalize=False)
    a, b = read_csv(tmp_path / "a" / "table1.csv")[0], read_csv(tmp_path / "b" / "table1.csv")[0]
    assert float(a["eta_start"]) == own["eta_start"] and float(b["eta_start"]) == nearest["eta_start"]
    assert a["epsilon"] == b["epsilon"] == "100.0" and float(b["epsilon_achieved"]) <= 100.0
    assert a["normalize"] == "0.3 0.4" and b["normalize"] == ""
    with pytest.raises(ValidationError, match="steps must be one of"):
        REPRODUCTIONS.get("table1")(tmp_path / "c", **opts, steps="closest")
    seen = {}
    monkeypatch.setattr(dp_dec, "_table", lambda *a, **kw: seen.update(kw) or [])
    for name in ("table1", "table2"):
        res = CliRunner().invoke(app, ["reproduce", name, "--out", str(tmp_path / "d"), "--steps", "nearest",
                                       "--no-normalize"])
        assert res.exit_code == 0 and (seen["steps"], seen["normalize"]) == ("nearest", False), res.output
        CliRunner().invoke(app, ["reproduce", name, "--out", str(tmp_path / "d")])
        assert (seen["steps"], seen["normalize"]) == ("authors", True)


def test_collect_writes_the_table_from_finished_runs_and_starts_none(tmp_path):
    """--collect: a long grid's table from what has finished (here 2 of 3 ε), with no run started; the finished rows
    are the ones a full run writes; collecting a tuned table is refused (its cells depend on the search)."""
    opts = dict(seeds=1, iterations=2, fiedlers=(1.0,), methods=("central",), dataset="digits", lot=32)
    REPRODUCTIONS.get("table1")(tmp_path, epsilons=(math.inf, 2.0), **opts)
    done = read_csv(tmp_path / "table1.csv")
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs" / "runs").glob("*/manifest.json")}
    said: list[str] = []
    REPRODUCTIONS.get("table1")(tmp_path, epsilons=(math.inf, 2.0, 1.0), collect=True, **{**opts,
                                                                                        "progress": said.append})
    assert read_csv(tmp_path / "table1.csv") == done
    # how far the grid has come, and the rest at the finished runs' pace (3 central runs of equal cost: 1 left)
    seconds = [json.loads(p.read_text())["seconds"] for p in stamps]
    assert said[0].startswith("seed004-table1: 2 of 3 runs of this grid finished in ")
    from privdl.experiment.runner import format_duration

    pace = format_duration(sum(seconds) / 2)
    assert said[0].endswith(f"the 1 left ≈ {pace} of one core at the finished runs' pace")
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs" / "runs").glob("*/manifest.json")} == stamps
    assert not any((tmp_path / "runs" / "runs").glob("*/.lock"))
    REPRODUCTIONS.get("table1")(tmp_path / "empty", epsilons=(1.0,), collect=True, **opts)  # nothing yet: no rows
    assert read_csv(tmp_path / "empty" / "table1.csv") == []
    with pytest.raises(ValidationError, match="collect reads"):
        REPRODUCTIONS.get("table1")(tmp_path, epsilons=(1.0,), collect=True, tune=True, **opts)
    import inspect as _inspect

    assert "collect" in _inspect.signature(REPRODUCTIONS.get("dpdl")).parameters


@pytest.mark.parametrize("folders, name, table, runs, opts", [
    (("mnist_digits",), "table1", "table1_mnist_digits_seed0.csv", 27,
     dict(fiedlers=(1.0, 0.06), dataset="mnist_t10k", data_dir="/anywhere/the/digits/lie")),  # not in a run's id
    (("fashion_mnist",), "table1", "table1_authors_settings_seed0.csv", 65, dict(fiedlers=(1.0, 0.7, 0.39, 0.06))),
    # Table 2's own runs, and its t = 1 column from Table 1's λ = 0.06 runs (merge takes only what its grid holds)
    (("fashion_mnist_table2", "fashion_mnist"), "table2", "table2_authors_settings_seed0.csv", 30, {}),
    # seeds 1-2 of both tables, computed on one H200 GPU, merged with seed 0's CPU runs (one grid, two devices)
    (("fashion_mnist", "fashion_mnist_seeds12_h200"), "table1", "table1_authors_settings_3seeds.csv", 195,
     dict(fiedlers=(1.0, 0.7, 0.39, 0.06), seeds=3)),
    (("fashion_mnist_table2", "fashion_mnist_table2_seeds12_h200", "fashion_mnist", "fashion_mnist_seeds12_h200"),
     "table2", "table2_authors_settings_3seeds.csv", 90, dict(seeds=3)),
])
@pytest.mark.slow
def test_the_committed_runs_rebuild_the_committed_tables(tmp_path, folders, name, table, runs, opts):
    """docs/reproduction/seed004/runs holds the runs behind REPRODUCTION.md's CPU tables; merged into a results
    folder and collected (nothing is run, no data is read), they give the committed CSV's accuracies, and a run's
    ledger at each ε re-accounts from its events alone to the ε it states."""
    from pathlib import Path

    from privdl.experiment.store import merge
    from privdl.privacy.ledger import Ledger

    docs = Path(__file__).resolve().parents[1] / "docs" / "reproduction" / "seed004"
    opts = {"seeds": 1, **opts}
    REPRODUCTIONS.get(name)(tmp_path / "t", collect=True, **opts)  # binds the folder to the table's grid
    s = merge([docs / "runs" / f for f in folders], tmp_path / "t" / "runs", other_experiments=True)  # Table 1 runs in Table 2
    assert s.copied == runs
    REPRODUCTIONS.get(name)(tmp_path / "t", collect=True, **opts)
    key = ("method", "epsilon", "fiedler_target", "t", "seed")
    got = {tuple(str(r[k]) for k in key): r for r in read_csv(tmp_path / "t" / f"{name}.csv")}
    want = {tuple(r[k] for k in key): r for r in read_csv(docs / table)}
    assert len(got) == runs and set(got) == set(want)
    for k, r in got.items():
        assert float(r["accuracy"]) == float(want[k]["accuracy"]), k
    checked = set()
    for path in sorted((tmp_path / "t" / "runs" / "runs").glob("*/manifest.json")):
        stated = json.loads(path.read_text())["privacy_ledger"][0]
        target = stated.get("target_epsilon") or stated.get("epsilon")
        eps = stated.get("epsilon")
        if not isinstance(eps, float) or math.isinf(eps) or target in checked:  # non-private: no ε to re-account
            continue
        checked.add(target)  # one run per ε: the ledger's events alone give its ε again
        assert Ledger.from_dict(stated).reaccount().epsilon == pytest.approx(stated["epsilon"], rel=1e-9)
    assert checked == {float(k[1]) for k in want} - {math.inf}


def test_grid_status_counts_a_stacked_run_as_its_share_of_the_batch(tmp_path):
    """Runs stacked k at a time each record their batch's seconds; the pace of the rest counts a k-th of it."""
    from privdl.experiment import run_experiment
    from privdl.reproductions.common import grid_status

    cfg = {"iterations": 3000, "eval_every": 3000, "seeds": 3, "network": {"topology": "ring", "n": 4},
           "task": {"name": "quadratic"}, "schedule": {"name": "constant", "eta": 0.01}}
    run_experiment(cfg, tmp_path / "o", progress=False)
    manifests = sorted((tmp_path / "o" / "runs").glob("*/manifest.json"))
    batch = [json.loads(p.read_text())["batch"] for p in manifests]
    assert [b["replicas"] for b in batch] == [3, 3, 3]
    manifests[0].unlink()
    for p in manifests[1:]:  # as if the batch had taken 5 minutes: each of its runs took 100 s of it
        man = json.loads(p.read_text())
        p.write_text(json.dumps({**man, "seconds": 300.0, "batch": {**man["batch"], "seconds": 300.0}}))
    line = grid_status(tmp_path / "o")
    assert "2 of 3 runs of this grid finished" in line
    assert line.endswith("the 1 left ≈ 1m40s of one core at the finished runs' pace")


def test_noise_linearity_error_is_linear_in_sigma_and_the_optimum_is_stationary(tmp_path):
    """noise_linearity (once ``theorem51``) at a small size: the deviation the noise causes grows as σ (fitted
    log-log slope 1 ± 0.05: a noise scaled as σ² or √σ would fail), a σ near 0 changes nothing but the noise (the
    noiseless run draws the same mini-batches), and θ* (L-BFGS on our own NumPy objective) zeroes the task's own
    full-data gradient."""
    import numpy as np
    import torch

    from privdl.reproductions.noise_linearity import AGENTS, optimum
    from privdl.tasks import make_task

    rows = REPRODUCTIONS.get("noise_linearity")(tmp_path, seeds=1, iterations=100, sigmas=(1e-6, 0.01, 0.1))
    fits = {r["algorithm"]: r for r in rows if "slope_deviation" in r}
    assert set(fits) == {"DP-DSGD", "DP-DSGT"}
    assert all(abs(f["slope_deviation"] - 1) < 0.05 for f in fits.values())
    tiny = [r for r in rows if r.get("sigma") == 1e-6]
    assert all(r["deviation_from_noiseless"] < 1e-4 for r in tiny)
    assert (tmp_path / "noise_linearity.png").stat().st_size > 10_000
    task = make_task("logistic", AGENTS, dataset="breast_cancer", partition="iid", l2=0.1)
    star = torch.as_tensor(optimum(task))
    grads = []
    for i, m in enumerate(task.counts.tolist()):
        batch = task.gather(torch.tensor([i]), torch.arange(m)[None])
        grads.append(task.batched_grad(star[None], batch)[0])
    assert float(torch.linalg.norm(torch.stack(grads).mean(0))) < 1e-8
    assert float(torch.linalg.norm(torch.stack(grads).mean(0) - grads[0])) > 1e-3  # (heterogeneous: not trivial)


def test_theorem51_is_refused_naming_its_new_names(tmp_path):
    """The old name runs nothing: it names noise_linearity (what it was) and neighbourhood_bound (the check that can
    fail), from the library and from the CLI (with the options the old command took)."""
    from typer.testing import CliRunner

    from privdl.cli import app

    with pytest.raises(ValidationError, match="renamed noise_linearity.*neighbourhood_bound"):
        REPRODUCTIONS.get("theorem51")(tmp_path, seeds=1)
    res = CliRunner().invoke(app, ["reproduce", "theorem51", "--seeds", "1", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "noise_linearity" in res.output and "neighbourhood_bound" in res.output
    assert not (tmp_path / "o").exists()


def test_appendix_a_bound_holds_for_dsgt_and_fails_for_dsgd_outside_its_premise():
    """Seed 004's Appendix A constant (Eq. 23) with exact ρ, K, C_σD on seed 001's quadratic, against the ordinary
    simulator. Independent facts: (1) the linear system the constants come from predicts the runs — the measured
    root mean square of ‖θ_T − 𝟙⊗x*‖ agrees with the exactly propagated one (tolerance: 8 seeds of a χ-like norm,
    ≈ 3 standard errors); (2) DSGT (premise holds: it converges to θ*) stays below the bound; (3) D-SGD at a constant
    step converges to a biased point (premise fails), so the O(σ) bound must fail at small σ — and it does, by the
    bias, which the exact propagation also gives; (4) the neighbourhood term is linear in σ; (5) above DSGT's
    step-size limit the premise fails the other way: no contraction, no bound, and the runs diverge."""
    import numpy as np

    from privdl.network import Network
    from privdl.reproductions.neighbourhood_bound import (
        AGENTS, ETA, appendix_a_bound, exact_rms, linear_system, measured,
    )
    from privdl.tasks import make_task

    task, net, T, seeds = make_task("quadratic", AGENTS), Network.from_topology("ring", AGENTS), 150, 8
    w = net.dense()
    for name, sigma, holds in (("dsgt", 1.0, True), ("dsgd", 0.1, False)):
        system = linear_system(task, w, name, ETA, sigma)
        b = appendix_a_bound(system, T)
        errs = measured(task, net, name, sigma, eta=ETA, iterations=T, seeds=seeds)
        exact = exact_rms(system, T)
        assert abs(float(np.sqrt(np.mean(errs ** 2))) / exact - 1) < 0.25, (name, errs, exact)
        assert 0 < b["rho"] < 1
        assert (float(errs.mean()) <= b["bound"]) is holds, (name, errs.mean(), b)
        ten = appendix_a_bound(linear_system(task, w, name, ETA, 10 * sigma), T)
        assert ten["neighbourhood"] == pytest.approx(10 * b["neighbourhood"], rel=1e-9)
    bias = exact_rms(linear_system(task, w, "dsgd", ETA, 0.0), T)
    assert bias > 10 and appendix_a_bound(linear_system(task, w, "dsgd", ETA, 0.0), T)["neighbourhood"] == 0
    # (5) the step-size condition: at η = 0.07 DSGT's iteration no longer contracts (ρ > 1), there is no bound, and
    # the runs grow as ρ^T predicts
    unstable = appendix_a_bound(linear_system(task, w, "dsgt", 0.07, 1.0), T)
    assert unstable["rho"] > 1.05 and unstable["bound"] == math.inf
    assert float(measured(task, net, "dsgt", 1.0, eta=0.07, iterations=T, seeds=2).min()) > 1e3
