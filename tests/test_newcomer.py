"""What a newcomer meets first: the numbers of the README and of the docs pages it leads to, the shipped attack
example, progress off a terminal, readable plots, a clear word on an empty results.csv, the audit's self-test, and
committed summaries that have the columns their reproductions write today."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from privdl.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
#: the pages the README's walk-through moved to (issue 45): every number they print is checked like the README's
GETTING_STARTED = (DOCS / "getting-started.md").read_text()
CLI_PAGE = (DOCS / "cli.md").read_text()
CORRELATED = (DOCS / "recipes" / "correlated-noise.md").read_text()
EXAMPLE_LEVEL = (DOCS / "recipes" / "example-level-dp.md").read_text()
ATTACKS = (DOCS / "recipes" / "dual-protection.md").read_text()
BENCHMARKS_PAGE = (DOCS / "benchmarks.md").read_text()


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


# ---- privdl plot on a results.csv with no row -------------------------------------------------------------------
@pytest.mark.parametrize("text, what", [("", "nothing (an empty file)"),
                                        ("run_id,iteration,metric,value,seed\n", "only a header line")])
def test_plot_on_a_results_file_without_rows_says_so_and_names_it(tmp_path, text, what):
    (tmp_path / "results.csv").write_text(text)
    res = _cli("plot", str(tmp_path))
    assert res.exit_code == 2, res.output
    message = " ".join(res.output.split())
    assert f"{tmp_path / 'results.csv'} holds {what}" in message and "nothing to plot" in message
    assert "Traceback" not in res.output and not (tmp_path / "plots").exists()


# ---- plots a reader can read --------------------------------------------------------------------------------------
def _inside(inner, outer, slack: float = 1.0) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack and inner.x1 <= outer.x1 + slack
            and inner.y1 <= outer.y1 + slack)


def test_many_series_put_the_legend_beside_the_data_and_long_titles_wrap_inside_the_figure():
    """Ten series: the legend is right of the axes (not over the data) and inside the figure; a title and a y label
    longer than the figure are wrapped, and stay inside it."""
    from privdl.experiment.plot import figure

    xs = list(range(20))
    series = [(f"mechanism=gaussian_ldp, ε={10 * k}, a long label of a swept setting", xs,
               [k + 0.1 * x for x in xs], None) for k in range(10)]
    title = "final local optimality gap (1/n)Σ f_i(x_i) − F* vs ε — quadratic (mean ± std over seeds)"
    ylabel = "final local optimality gap (1/n)Σ f_i(x_i) − F* (iteration 1000)"
    fig = figure(series, xlabel="iteration", ylabel=ylabel, title=title)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    page = fig.bbox
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.x0 >= ax.bbox.x1, "the legend covers the axes"
    assert _inside(legend, page)
    assert "\n" in ax.get_title() and _inside(ax.title.get_window_extent(renderer), page)
    assert "\n" in ax.get_ylabel() and _inside(ax.yaxis.label.get_window_extent(renderer), page)
    assert all(len(t.get_text().split("\n")[0]) <= 32 for t in ax.get_legend().get_texts())
    few = figure([("ε=10", xs, xs, None), ("ε=30", xs, xs[::-1], None)], xlabel="x", ylabel="y", title="short")
    few.canvas.draw()
    assert _inside(few.axes[0].get_legend().get_window_extent(few.canvas.get_renderer()), few.axes[0].bbox)


@pytest.mark.parametrize("low, high", [(120.0, 350.0), (2.0, 90.0), (0.3, 0.9)])
def test_a_log_axis_shows_at_least_three_labelled_ticks(low, high):
    """matplotlib labels only powers of ten: a log axis spanning under a decade or two showed one label or none."""
    from privdl.experiment.plot import figure

    xs = [0, 1, 2, 3]
    fig = figure([("a", xs, list(np.geomspace(low, high, 4)), None)], xlabel="x", ylabel="y", title="t", logy=True)
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.yaxis.get_major_ticks() if lo <= t.get_loc() <= hi and t.label1.get_text()]
    assert len(shown) >= 3, [t.label1.get_text() for t in shown]
    for tick in shown:  # each label is the number at its tick
        assert float(tick.label1.get_text()) == pytest.approx(tick.get_loc(), rel=1e-2)


# ---- the audit's self-test ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["central", "dsgd", "dsgt", "dinno"])
def test_the_audit_self_test_flags_the_broken_noise_for_every_algorithm(algorithm):
    """The self-test's broken noise (σ/30) must be a VIOLATION for every algorithm the audit runs by default — the
    README's promise, broken for DP-DSGD and DP-DiNNO at σ/10 with a canary the models soon fit. Here on
    scikit-learn's digits (8×8, seconds); the documented MNIST command is measured in REPRODUCTION.md. The bound
    is a Clopper–Pearson lower bound from 80 + 80 test models: above the nominal ε = 1 only if the scores of the
    systems trained with the canary really separate from the others'."""
    from privdl.audit import AuditSetup, membership_audit
    from privdl.audit.membership import NOISE_DIVISOR

    setup = AuditSetup(algorithm=algorithm, model="softmax", dataset="digits", per_class=30, iterations=60,
                       canary="bright", broken="noise")
    res = membership_audit(setup, models=100, batch=200)
    assert res.violation and res.threshold.epsilon_lower > 1.0, res.threshold
    assert res.ledger[0]["noise"]["unsafe_noise_scale"] == pytest.approx(1 / NOISE_DIVISOR)
    assert "BROKEN" in res.ledger[0]["note"]


def test_the_bright_canary_is_labelled_with_a_class_the_models_never_see():
    """With D's own first class the models soon fit z, its gradient vanishes and only the first rounds leak; a class
    D lacks keeps z's clipped gradient at C in every round. Seed 004's blank canary keeps its label."""
    from privdl.audit.membership import AuditSetup, _audit_data, canary_label
    from privdl.errors import ValidationError

    bright = AuditSetup(dataset="digits", canary="bright", per_class=5)
    ds, parts, _ = _audit_data(bright)
    assert int(ds.y_train[-1]) == canary_label(bright, ds.n_classes) == 3
    assert 3 not in {int(ds.y_train[i]) for p in parts for i in p}
    assert float(ds.X_train[-1].min()) == float(ds.X_train[-1].max()) == 10.0
    assert canary_label(AuditSetup(canary="blank"), 10) == 0
    with pytest.raises(ValidationError, match="needs a class D lacks"):
        canary_label(AuditSetup(canary="bright", classes=tuple(range(10))), 10)


def test_the_audit_score_keeps_its_order_where_float32_loss_rounds_to_zero():
    """The score is z's log-odds from float64 logits: the order of minus the loss, which alone decides a threshold
    test — but a sure model's float32 loss is exactly 0, and ties would hide the members."""
    import torch

    from privdl.audit.membership import log_odds

    class Linear:
        class model:  # noqa: N801 - the attribute a SupervisedTask has
            @staticmethod
            def predict(theta, X):
                return X @ theta.reshape(3, -1).T

    margins = torch.tensor([20.0, 25.0, 30.0])  # logit of class 0 above the two others
    models = torch.stack([torch.tensor([m, 0.0, 0.0]) for m in margins]).to(torch.float32)
    X, y = torch.ones(1, 1), torch.tensor([0])
    score = log_odds(Linear, models, X, y)[:, 0]
    loss = torch.nn.functional.cross_entropy(models, y.repeat(3), reduction="none")
    assert (loss == 0).all()  # float32 cannot tell these models apart by their loss
    # the logits are the model's float32 ones (a few units in the last place of 30), the rest is float64
    assert score.tolist() == pytest.approx((margins - math.log(2)).tolist(), abs=1e-5)
    assert score[0] < score[1] < score[2]


def test_privdl_audit_reports_progress_off_a_terminal_and_keeps_json_clean():
    res = _cli("audit", "--algorithm", "dsgd", "--model", "softmax", "--dataset", "digits", "--per-class", "10",
               "--iterations", "5", "--models", "10", "--format", "json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert set(report["results"]) == {"dsgd"}
    lines = res.stderr.splitlines()
    assert lines[0].startswith("audit dsgd: ") and lines[-1].startswith("audit dsgd: 20/20 models (100 %)"), lines


# ---- the shipped attack example ----------------------------------------------------------------------------------
def test_the_shipped_attack_example_runs_through_privdl_attack(tmp_path):
    """examples/attack.toml (the `privdl attack` command of docs/recipes/dual-protection.md), cut to 40 L-BFGS iterations and one image: it
    runs, reports its progress off a terminal on stderr, prints the JSON contract and writes a captioned grid."""
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "mnist").is_dir():
        pytest.skip(f"MNIST digits not present under {SHARED_DATA}")
    import tomllib

    example = tomllib.loads((ROOT / "examples" / "attack.toml").read_text())
    assert (f"{example['network']['n']} agents, D-SGD, {example['iterations']} rounds" in ATTACKS
            and example["algorithm"]["name"] == "dsgd")
    command = next(line for line in ATTACKS.splitlines() if line.startswith("privdl attack idlg --config examples/"))
    args = command.split("#")[0].split()[1:]
    assert args[3] == "examples/attack.toml" and (ROOT / args[3]).is_file()
    args[3] = str(ROOT / args[3])
    res = _cli(*args, "--iterations", "40", "--images", "1", "--out", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["algorithm"] == "dsgd" and out["label_correct"] == 1.0 and len(out["images"]) == 1
    assert Path(out["grid"]).is_file() and Path(out["grid"]).parent == tmp_path
    assert any(line.startswith("attack: training the run: 10/10 rounds") for line in res.stderr.splitlines())
    assert any(line.startswith("attack: idlg (L-BFGS): 40/40 iterations") for line in res.stderr.splitlines())


# ---- committed summaries have the columns their reproductions write today ----------------------------------------
DOCS = ROOT / "docs" / "reproduction"
#: every committed CSV under docs/reproduction → (the reproduction that writes it, the file it writes there). Renamed
#: copies (one setting's table, one cell's summary) name the file they are a copy of.
PROVENANCE = {
    "seed002/rms_localization_summary.csv": ("rms_localization", "rms_localization_summary.csv"),
    "seed002/rms_filtering_summary.csv": ("rms_filtering", "rms_filtering_summary.csv"),
    "seed002/rms_dlg_summary.csv": ("rms_dlg", "rms_dlg_summary.csv"),
    "seed002/rms_dlg_curves.csv": ("rms_dlg", "rms_dlg_curves.csv"),
    "seed002/rms_localization_a.csv": ("rms_localization", "rms_localization_a.csv"),
    "seed002/rms_remark3.csv": ("rms_remarks", "rms_remark3.csv"),
    "seed002/rms_remark4.csv": ("rms_remarks", "rms_remark4.csv"),
    "seed003/dpdl_full_horizon_mnist_ring_dirichlet01_3seeds_gpu.csv": ("dpdl", "dpdl_summary.csv"),
    "seed003/dpdl_full_horizon_mnist_er03_missing_seed0_gpu.csv": ("dpdl", "dpdl_summary.csv"),
    "attacks/attack_table.csv": ("attack_table", "attack_table.csv"),
    "designs/a9a_designs.csv": ("designs", "designs.csv"),
    "designs/a9a_designs_summary.csv": ("designs", "designs_summary.csv"),
    "designs/a9a_designs_search.csv": ("designs", "designs_search.csv"),
    "designs/mnist_designs.csv": ("designs", "designs.csv"),
    "designs/mnist_designs_summary.csv": ("designs", "designs_summary.csv"),
    "designs/mnist_designs_search.csv": ("designs", "designs_search.csv"),
    "seed003/dpdl_summary.csv": ("dpdl", "dpdl_summary.csv"),
    "seed003/dpdl_fair_step.csv": ("dpdl", "dpdl_summary.csv"),
    "seed003/dpdl_full_horizon_mnist_ring_dirichlet01_seed0.csv": ("dpdl", "dpdl_summary.csv"),
    "seed003/dpdl_same_effective_step_3seeds.csv": ("dpdl", "dpdl_summary.csv"),
    "seed003/dpdl_same_effective_step_more_cells.csv": ("dpdl", "dpdl_summary.csv"),
    "seed004/table1.csv": ("table1", "table1.csv"),
    "seed004/noise_linearity.csv": ("noise_linearity", "noise_linearity.csv"),
    "seed004/neighbourhood_bound.csv": ("neighbourhood_bound", "neighbourhood_bound.csv"),
    "seed004/noise_linearity_fit.csv": ("noise_linearity", "noise_linearity_fit.csv"),
    "seed004/table1_summary.csv": ("table1", "table1_summary.csv"),
    "seed004/table1_authors_settings_seed0.csv": ("table1", "table1.csv"),
    "seed004/table1_mnist_digits_seed0.csv": ("table1", "table1.csv"),
    "seed004/table2.csv": ("table2", "table2.csv"),
    "seed004/table2_summary.csv": ("table2", "table2_summary.csv"),
    "seed004/table2_authors_settings_seed0.csv": ("table2", "table2.csv"),
    "seed004/table1_authors_settings_3seeds.csv": ("table1", "table1.csv"),
    "seed004/table1_authors_settings_3seeds_summary.csv": ("table1", "table1_summary.csv"),
    "seed004/table2_authors_settings_3seeds.csv": ("table2", "table2.csv"),
    "seed004/table2_authors_settings_3seeds_summary.csv": ("table2", "table2_summary.csv"),
}
#: committed CSVs no reproduction writes: hand-made tables of REPRODUCTION.md (and the runs' own metrics files)
NOT_A_REPRODUCTIONS_OUTPUT = {
    "seed004/lr_search.csv": "REPRODUCTION's step-size search table, gathered from the --tune runs",
    "seed004/table1_tuned_lr.csv": "the 21 re-run cells with their chosen scale, gathered by hand",
    "seed004/ablation_steps_normalisation_seed0.csv": "an ablation's rows from three run folders, gathered by hand",
}
#: made by an earlier version of the code whose grid cannot be re-run here: the command that regenerates each
STALE = {
    "seed004/table1.csv": "the H100 grid (285 runs with table2): privdl reproduce table1 --seeds 3 --device cuda "
                          "--shard I/12 (I = 0..11; Fashion-MNIST), then --collect",
    "seed004/table2.csv": "the H100 grid: privdl reproduce table2 --seeds 3 --device cuda --shard I/12, then --collect",
    "seed003/dpdl_summary.csv": "the dpdl grid before the Dirichlet min_size (c8e0bed): privdl reproduce dpdl",
    "seed003/dpdl_fair_step.csv": "a dpdl cell before c8e0bed: privdl reproduce dpdl with its cell's options",
}


def test_every_committed_csv_is_accounted_for():
    """A new committed table must say where it comes from, so the next test checks it."""
    committed = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.csv") if "runs" not in p.parts}
    assert committed == set(PROVENANCE) | set(NOT_A_REPRODUCTIONS_OUTPUT)


def _header(path: Path) -> list[str]:
    import csv

    with path.open(newline="") as fh:
        return next(csv.reader(fh), [])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The header of each file the reproductions of PROVENANCE write today, from tiny runs of the code that writes
    them (a round or two, one seed, one image, one L-BFGS step; of a grid only what changes no column: the MNIST
    digits (Fashion-MNIST is not on every machine), one method of rms_dlg and of attack_table (every method's row
    has the same keys), dpdl's non-private CGA cell (no σ to calibrate)); seed 004's tables
    from their committed runs (collected: nothing runs)."""
    from privdl.experiment.store import merge
    from privdl.reproductions import REPRODUCTIONS, attacks
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "mnist").is_dir():
        pytest.skip(f"MNIST digits not present under {SHARED_DATA}")
    out = tmp_path_factory.mktemp("reproductions")
    mp = pytest.MonkeyPatch()
    packaged = attacks.packaged_config

    def small(name: str) -> dict:
        cfg = packaged(name)
        if "task.dataset" in cfg["sweep"]:
            cfg["sweep"]["task.dataset"] = ["mnist_t10k"]
        keep = {"rms_dlg": "EDSG-RMS", "attack_table": "LDP D-SGD e=1"}[name]  # one method: the most kinds / a DP ε
        cfg["sweep"]["method"] = [m for m in cfg["sweep"]["method"] if m["label"] == keep]
        return cfg

    mp.setattr(attacks, "packaged_config", small)
    tiny = {"rms_localization": dict(seeds=1, iterations=10), "rms_filtering": dict(seeds=1, iterations=10),
            "rms_remarks": dict(seeds=1, iterations=20),
            "noise_linearity": dict(seeds=1, iterations=5, sigmas=(0.01, 0.1)),
            "neighbourhood_bound": dict(seeds=1, iterations=5, sigmas=(0.1,)),
            "rms_dlg": dict(iterations=1, images=1, round=1, attack_iterations=1),
            "attack_table": dict(iterations=1, images=1, round=1, attack_iterations=1),
            "dpdl": dict(seeds=1, iterations=1, dataset="mnist_t10k", methods=("CGA",), graphs=("ring",),
                         splits=("Dirichlet 0.5",)),
            "designs": dict(dataset="breast_cancer", seeds=1, iterations=2, epsilons=(3.0,), methods=("LDP",),
                            graphs=("ring",), etas=(0.1,), batch_size=4, canaries=4, images=1, round=1,
                            attack_iterations=1, overrides={"task.partition": "iid"})}
    try:
        for name, options in tiny.items():
            REPRODUCTIONS.get(name)(out / name, **options)
    finally:
        mp.undo()
    for name, folders, opts in (("table1", ("mnist_digits",), dict(fiedlers=(1.0, 0.06), dataset="mnist_t10k")),
                                ("table2", ("fashion_mnist_table2", "fashion_mnist"), {})):
        REPRODUCTIONS.get(name)(out / name, seeds=1, collect=True, **opts)  # binds the folder to the grid
        merge([DOCS / "seed004" / "runs" / f for f in folders], out / name / "runs", other_experiments=True)
        REPRODUCTIONS.get(name)(out / name, seeds=1, collect=True, **opts)
    return {(name, file): _header(out / name / file) for name, file in set(PROVENANCE.values())}


@pytest.mark.parametrize("committed", [pytest.param(
    path, marks=pytest.mark.xfail(strict=True, reason=f"made by earlier code; regenerate with {STALE[path]}"))
    if path in STALE else path for path in sorted(PROVENANCE)])
@pytest.mark.slow
def test_every_committed_summary_has_the_columns_its_reproduction_writes_today(written, committed):
    """docs/reproduction/seed002/rms_localization_summary.csv lacked final_msd_db, which the code writes: a table
    the README and REPRODUCTION.md cite must be what the reproduction makes today (the column order aside)."""
    today = written[PROVENANCE[committed]]
    assert today, PROVENANCE[committed]
    assert set(_header(DOCS / committed)) == set(today), (committed, today)


# ---- every number the README and its docs pages print ----------------------------------------------------------
# Checked here: the accountants' numbers (recomputed), the grids' sizes (expanded from the shipped configs), the
# quickstart's facts and plot count, the audit's defaults, the mutation count (against docs/MUTATION.md). Regenerated
# by hand and compared when they changed (minute-long runs): the quickstart's table and the correlated-noise test
# losses. Timings, and the benchmark ratios and sizes of BENCHMARKS.md, are not checked.
def _number(pattern: str, page: str) -> re.Match:
    match = re.search(pattern, " ".join(page.split()))
    assert match, pattern
    return match


def test_readme_example_level_epsilon_is_what_privdl_account_prints():
    m = _number(r"q = ([\d.]+), σ = ([\d.]+), T = (\d+), δ = ([\de.-]+) prints ε = ([\d.]+) with PLD.*?the same q, σ, "
                r"T, δ prints ε = ([\d.]+) \(order ([\d.]+)\)", CLI_PAGE)
    q, sigma, steps, delta, pld, eps, order = m.groups()
    args = ("account", "--unit", "example", "--noise-multiplier", sigma, "--sample-rate", q, "--steps", steps,
            "--delta", delta, "--format", "json")
    res = _cli(*args)  # the default: PLD
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["accountant"] == "pld" and f"{got['epsilon']:.4f}" == pld
    res = _cli(*args, "--accountant", "rdp")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert f"{got['epsilon']:.4f}" == eps and f"{got['order']:.1f}" == order


def test_readme_pld_against_rdp_noise_is_what_privdl_account_prints():
    m = _number(r"`privdl account --unit example --accountant pld --epsilon ([\d.]+) --sample-rate ([\d.]+) --steps "
                r"(\d+)` prints σ = ([\d.]+) where `--accountant rdp` prints (\d+\.\d+)", CLI_PAGE)
    eps, q, steps, pld, rdp = m.groups()
    for name, want in (("pld", pld), ("rdp", rdp)):
        res = _cli("account", "--unit", "example", "--accountant", name, "--epsilon", eps, "--sample-rate", q,
                   "--steps", steps, "--format", "json")
        assert res.exit_code == 0, res.output
        assert f"{json.loads(res.stdout)['noise_multiplier']:.{len(want.split('.')[1])}f}" == want


def test_readme_tight_over_paper_noise_ratios_are_what_privdl_account_prints():
    m = _number(r"at C = ([\d.]+), T = (\d+), δ = ([\de.-]+) it allows ([\d.]+)× \(ε = (\d+)\) to ([\d.]+)× "
                r"\(ε = (\d+)\) larger b", CLI_PAGE)
    clip, steps, delta = m.group(1), m.group(2), m.group(3)

    def bound(accountant: str, eps: str) -> float:
        res = _cli("account", "--unit", "agent", "--accountant", accountant, "--epsilon", eps, "--delta", delta,
                   "--clip", clip, "--steps", steps, "--format", "json")
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["bound"]

    for ratio, eps in ((m.group(4), m.group(5)), (m.group(6), m.group(7))):
        assert f"{bound('tight', eps) / bound('paper', eps):.2f}" == ratio, eps


def test_readme_agent_level_epsilon_of_the_authors_per_example_noise():
    """The ledger's agent-level ε beside the example-level one for the seed-001 authors' setting."""
    import torch

    from privdl.mechanisms import make_mechanism
    from privdl.network import Network

    m = _number(r"\(ε = (\d+), T = (\d+), C = ([\d.]+), B = (\d+)\) that agent-level ε is ([\d.]+)·10⁴", CORRELATED)
    eps, steps, clip, batch, agent = float(m[1]), int(m[2]), float(m[3]), int(m[4]), float(m[5]) * 1e4
    n = 20

    class Data:  # enough examples per agent that every batch holds B
        counts = torch.full((n,), 4 * batch)
        batch_size = batch
        examples = True
        name = "stand-in"

    mech = make_mechanism("ldp", steps=steps, network=Network.from_topology("erdos_renyi", n, p=0.5, seed=0),
                          task=Data(), clip=clip, epsilon=eps, accountant="paper", clipping="per_example")
    assert f"{mech.ledger().beside[0].epsilon / 1e4:.2f}" == f"{agent / 1e4:.2f}"


def _runs(path: Path) -> int:
    from privdl.experiment.config import expand, load_config

    return len(expand(load_config(path, validate=False))[0])


def test_readme_grid_sizes_and_the_quickstarts_facts():
    import tomllib

    from privdl.reproductions.common import packaged_config

    quick = tomllib.loads((ROOT / "examples" / "quickstart.toml").read_text())
    assert _number(r"(\d+) runs \((\d+) executed, 0 already done\)", GETTING_STARTED).groups() == (str(_runs(ROOT / "examples" /
                                                                                          "quickstart.toml")),) * 2
    for page in (README, GETTING_STARTED):
        assert f"{quick['network']['n']} agents" in page and len(quick["seeds"]) == 3
        assert len(quick["sweep"]["mechanism.epsilon"]) == 3 and "three ε, three seeds" in page
    steps, delta = _number(r"accountant over T = (\d+) steps at δ = ([\de.-]+);", GETTING_STARTED).groups()
    assert (int(steps), float(delta)) == (quick["iterations"], quick["mechanism"]["delta"])
    assert quick["mechanism"]["accountant"] == "tight" and f"at iteration {quick['iterations']}" in GETTING_STARTED
    assert int(_number(r"correlated_noise.toml` \((\d+) runs", CORRELATED)[1]) == _runs(ROOT / "examples" /
                                                                             "correlated_noise.toml")
    quadratic = packaged_config("quadratic")
    grid = [len(quadratic["sweep"][k]) for k in ("mechanism.epsilon", "network.p")]
    m = _number(r"\((\d+) ε × (\d+) p × (\d+) seeds × (\d+) designs × (\d+) accountants \+ non-private, "
                r"(\d+) runs of T = (\d+)\)", BENCHMARKS_PAGE)
    assert [int(m[1]), int(m[2])] == grid and int(m[3]) == quadratic["seeds"] and int(m[7]) == quadratic["iterations"]
    designs = [d for d in quadratic["sweep"]["mechanism.name"] if d != "none"]
    assert [int(m[4]), int(m[5])] == [len(designs), len(quadratic["sweep"]["mechanism.accountant"])]
    from privdl.experiment.config import expand

    assert int(m[6]) == len(expand(quadratic)[0])


def test_readme_quickstart_plot_count(tmp_path, monkeypatch):
    """The quickstart's plots, counted by the code that draws them (on a results.csv of the quickstart's grid cut to
    two rounds; drawing is skipped)."""
    from privdl.experiment import plot, run_experiment
    from privdl.experiment.config import load_config

    cfg = load_config(ROOT / "examples" / "quickstart.toml", ["iterations=2", "eval_every=1"])
    run_experiment(cfg, tmp_path, progress=False)
    monkeypatch.setattr(plot, "draw", lambda path, *a, **k: path)
    assert f"{len(plot.plot_experiment(tmp_path))} plots in results/quickstart/plots" in GETTING_STARTED


def test_readme_mutation_count_is_docs_mutation_mds():
    doc = (ROOT / "docs" / "MUTATION.md").read_text()
    killed = re.search(r"\*\*Result: (\d+)/(\d+) killed\*\*", doc)
    assert killed and f"{killed[1]}/{killed[2]} mutants killed" in README


def test_readme_audit_numbers_are_the_audits_defaults():
    import inspect

    from privdl.audit.membership import BRIGHT, NOISE_DIVISOR, AuditSetup, canary_label, membership_audit

    setup = AuditSetup()
    words = {0: "0", 1: "1", 2: "2"}
    assert (f"D = {setup.per_class} images of each of the digits "
            f"{', '.join(words[c] for c in setup.classes)}") in " ".join(EXAMPLE_LEVEL.split())
    assert f"z = a blank image labelled {canary_label(setup, 10)})" in " ".join(EXAMPLE_LEVEL.split())
    assert f"(noise σ/{NOISE_DIVISOR}, or no clipping)" in " ".join(EXAMPLE_LEVEL.split())
    assert f"canary: every pixel {BRIGHT:g} and a label D lacks" in " ".join(EXAMPLE_LEVEL.split())
    command = next(line for line in EXAMPLE_LEVEL.splitlines() if "--broken noise" in line)
    models = int(re.search(r"--models (\d+)", command)[1])
    assert "VIOLATION" in command
    held_out = inspect.signature(membership_audit).parameters["held_out"].default
    test = models - int(held_out * models)  # the models the bound is computed from, the rest chose the threshold
    assert f"its {test} + {test} test models" in " ".join(EXAMPLE_LEVEL.split())


def _mean_std(cell: str) -> tuple[float, float]:
    mean, std = cell.split("±")
    return float(mean), float(std)


@pytest.mark.slow
def test_readme_quickstart_table_is_what_the_quickstart_prints(tmp_path):
    """`privdl run examples/quickstart.toml` (≈ 4 s), its final-metrics table against docs/getting-started.md's, cell
    by cell. Means are printed to 4 significant digits and compared to 1e-3 (rounding, and the last bits of another
    CPU's BLAS); a std printed to one digit within a tenth of a unit of that digit, or both at rounding level (three equal
    values: 1e-16 here, 0 elsewhere)."""
    readme = GETTING_STARTED[GETTING_STARTED.index("## What the main job prints"):]
    block = readme[readme.index("```") + 3:]
    block = block[:block.index("```")]
    want = [line for line in block.splitlines() if line.startswith("│")]
    res = _cli("run", str(ROOT / "examples" / "quickstart.toml"), "--out", str(tmp_path), "--no-plot", "--quiet")
    assert res.exit_code == 0, res.output
    got = [line for line in res.stdout.splitlines() if line.startswith("│")]
    assert len(got) == len(want) == 8
    for w, g in zip(want, got):
        cells = [(a.strip(), b.strip()) for a, b in zip(w.strip("│").split("│"), g.strip("│").split("│"))]
        for a, b in cells:
            if "±" not in a:
                assert a == b, (w, g)
                continue
            (wm, ws), (gm, gs) = _mean_std(a), _mean_std(b)
            assert gm == pytest.approx(wm, rel=1e-3), (w, g)
            digit = 10 ** math.floor(math.log10(ws)) if ws > 0 else 0.0
            assert abs(gs - ws) <= 0.6 * digit or max(gs, ws) <= 1e-12 * abs(wm), (w, g)


@pytest.mark.slow
def test_readme_correlated_noise_losses_are_what_the_example_prints(tmp_path):
    """The ε = 10 cells of examples/correlated_noise.toml and its non-private runs (12 of its 30; each run draws its
    own keyed numbers whatever else runs beside it): mean test loss over the three seeds, to the digits printed."""
    from collections import defaultdict

    from privdl.experiment import run_experiment
    from privdl.experiment.config import load_config
    from privdl.experiment.store import read_results

    m = _number(r"at ε = (\d+) it prints test loss LDP ([\d.]+), DECOR ([\d.]+), Whisper ([\d.]+) \(non-private "
                r"([\d.]+);", CORRELATED)
    cfg = load_config(ROOT / "examples" / "correlated_noise.toml")
    cfg["sweep"]["mechanism.epsilon"] = [float(m[1])]
    run_experiment(cfg, tmp_path, progress=False)
    _, rows = read_results(tmp_path / "results.csv")
    last = max(int(r["iteration"]) for r in rows)
    loss: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if int(r["iteration"]) == last and r["metric"] == "test_loss":
            loss[r["mechanism.name"]].append(float(r["value"]))
    for name, printed in (("ldp", m[2]), ("decor", m[3]), ("whisper", m[4]), ("none", m[5])):
        assert len(loss[name]) == 3
        decimals = len(printed.split(".")[1])
        assert f"{np.mean(loss[name]):.{decimals}f}" == printed, (name, np.mean(loss[name]))
