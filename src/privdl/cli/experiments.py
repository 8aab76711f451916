"""Commands that run experiments and attack them: run, plot, merge, attack, reproduce, audit."""

from __future__ import annotations

import inspect
import json
import time
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.table import Table

from privdl.cli.common import (
    PLUGIN, Format, _Command, _device, _fail, _load_plugins, _print_facts, _progress_mode, app, console, err,
)
from privdl.errors import PrivdlError, ValidationError


@app.command(cls=_Command)
def run(
    config: Path = typer.Argument(..., help="experiment TOML file"),
    set_: list[str] = typer.Option([], "--set", help="override a key: --set mechanism.epsilon=5 (repeatable)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output directory (default results/<config name>)"),
    no_plot: bool = typer.Option(False, "--no-plot", help="do not draw plots at the end"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    jobs: int = typer.Option(1, "--jobs", min=1, help="processes sharing the runs (stacked groups; unstackable runs "
                                                      "one by one) on this machine"),
    resume: bool = typer.Option(False, "--resume", help="continue interrupted runs from their last checkpoint "
                                                        "(runtime.checkpoint_every); without it they start over"),
    procs: Optional[int] = typer.Option(None, "--procs", min=1, help="run every run's agents split over this many "
                                        "processes on this machine (the distributed runtime, gloo)"),
    plugin: list[str] = PLUGIN,
) -> None:
    """Run (or resume) every run of an experiment's sweep; write results.csv, manifests and plots. Finished runs
    are always kept; with --resume, unfinished ones continue from the last round every agent checkpointed."""
    from privdl.runtime_spec import RuntimeSpec

    try:
        # --procs K selects the distributed runtime (before the config is checked: its [runtime] keys need it)
        set_ = [*set_, "runtime.backend=\"dist\""] if procs is not None else list(set_)
        out = out or Path("results") / config.stem
        if procs is not None and not plugin:  # the workers start at once, before this process loads torch and
            from privdl.runtime import launch  # the config's registries: launch checks the config meanwhile

            summary = launch(config, procs=procs, out=out, overrides=[*set_, f"runtime.procs={procs}"],
                             resume=resume, progress=not quiet)
        else:
            from privdl.experiment import load_config, run_experiment  # plot_experiment (matplotlib) where it plots

            cfg = load_config(config, set_, plugins=plugin)  # --plugin joins the config's plugins (and manifests')
            runtime = RuntimeSpec.of(cfg)
            if procs is not None or runtime.backend == "dist":
                from privdl.runtime import launch
                from privdl.runtime.launch import processes_for

                k = procs or runtime.procs or processes_for(cfg) or 2
                given = [f"plugins={json.dumps(cfg['plugins'])}"] if plugin else []  # the workers import them too
                summary = launch(config, procs=k, out=out, overrides=[*set_, *given, f"runtime.procs={k}"],
                                 resume=resume, progress=not quiet)
            else:
                summary = run_experiment(cfg, out, progress=False if quiet else _progress_mode(), jobs=jobs,
                                         resume=resume)
        console.print(summary.line())
        if summary.nonfinite:
            first, metrics = next(iter(summary.nonfinite.items()))
            err.print(f"[bold yellow]warning:[/] {len(summary.nonfinite)} run(s) ended with nan or inf metrics "
                      f"(diverged or overflowed; recorded as nonfinite_metrics in their manifests), e.g. run {first}: "
                      f"{', '.join(metrics)} — lower the step size or check the scale of the inputs", markup=True)
        if _print_final(summary.out) and not no_plot:  # no finished run yet (all held elsewhere): nothing to draw
            from privdl.experiment import plot_experiment

            try:
                files = plot_experiment(summary.out)
            except OSError as exc:
                raise PrivdlError(f"the runs are saved ({summary.results}), but the plots could not be written: "
                                  f"{exc}") from None
            console.print(f"{len(files)} plots in {summary.out / 'plots'}")
    except PrivdlError as exc:
        _fail(exc)


def _print_final(out: Path) -> bool:
    """A table of final metrics, mean ± std over seeds, per combination of the other sweep axes; False (and no
    table) while results.csv holds no row."""
    from collections import defaultdict

    from privdl.experiment.plot import COST_METRICS, axis_title
    from privdl.experiment.store import read_results
    from privdl.experiment.summary import mean_std, sort_key

    fields, rows = read_results(out / "results.csv")
    if not rows:
        return False
    axes = [f for f in fields if f not in ("run_id", "iteration", "metric", "value", "seed")]
    last = max(int(r["iteration"]) for r in rows)
    metrics = sorted({r["metric"] for r in rows} - {"consensus_distance", "train_loss", "local_optimality_gap",
                                                     *COST_METRICS})
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if int(r["iteration"]) == last and r["metric"] in metrics:
            cells[tuple(r[a] for a in axes)][r["metric"]].append(float(r["value"]))
    table = Table(title=f"final metrics at iteration {last} (mean ± std over seeds)")
    for a in axes:
        table.add_column(axis_title(a), no_wrap=True)
    for m in metrics:
        table.add_column(m, justify="right", no_wrap=True)
    for key in sorted(cells, key=sort_key):
        vals = []
        for m in metrics:
            v = cells[key].get(m)
            mean, std = mean_std(v) if v else (0.0, 0.0)
            vals.append("" if not v else f"{mean:.4g} ± {std:.1g}")
        table.add_row(*[k if k != "" else "n/a" for k in key], *vals)
    console.print(table)
    return True


@app.command(cls=_Command)
def plot(out: Path = typer.Argument(..., help="experiment output directory")) -> None:
    """Draw metric-vs-iteration and final-metric-vs-parameter plots (PNG) from DIR/results.csv."""
    from privdl.experiment import plot_experiment

    try:
        files = plot_experiment(out)
    except OSError as exc:
        _fail(PrivdlError(f"could not write the plots: {exc}"))
    except PrivdlError as exc:
        _fail(exc)
    for f in files:
        console.print(str(f))


@app.command(cls=_Command)
def merge(
    sources: list[Path] = typer.Argument(..., help="experiment folders to gather runs from (for a reproduction, "
                                                   "its runs/ subfolder)"),
    out: Path = typer.Option(..., "--out", help="the experiment folder that receives them (created if absent)"),
    other_experiments: bool = typer.Option(False, "--other-experiments",
                                           help="take from folders of another experiment (refused otherwise, "
                                                "naming the keys that differ) the runs --out's grid also holds"),
) -> None:
    """Gather the finished runs of shard folders (other machines, earlier slices of a long grid) into one folder of
    the same experiment; the next run / reproduce over it skips them."""
    from privdl.experiment.store import merge as merge_runs

    try:
        s = merge_runs(sources, out, other_experiments=other_experiments)
    except PrivdlError as exc:
        _fail(exc)
    console.print(f"{s.copied} runs copied into {s.dest}, {s.present} already there"
                  + (f", {s.unfinished} unfinished or damaged left behind" if s.unfinished else "")
                  + (f", {s.busy} being run there by another process (left to it)" if s.busy else "")
                  + (f"; {s.rekeyed} of them under their id of today (made before run ids left out the data "
                     "folder)" if s.rekeyed else ""))
    for other in s.other_experiments:
        console.print(f"another experiment: {other}; only its runs this folder's grid holds were taken")
    if s.foreign:
        console.print(f"{s.foreign} finished runs of another experiment are not in this folder's grid: not copied")
    if len(s.sources) > 1:
        made = ", ".join(f"{code} ({k})" for code, k in sorted(s.sources.items()))
        err.print(f"[bold yellow]note:[/] the copied runs were made by {len(s.sources)} versions of privdl's source: "
                  f"{made}", markup=True)
    if len(s.devices) > 1:  # a grid filled on a GPU and on CPUs: the same runs, said where each ran
        ran = ", ".join(f"{k} on {where}" for where, k in sorted(s.devices.items()))
        console.print(f"the copied runs ran on {len(s.devices)} devices: {ran}", markup=False, highlight=False)
    if s.outside_grid:
        console.print(f"{s.outside_grid} finished runs lie outside the grid {s.dest / 'experiment.json'} names; a "
                      "run or reproduce over a grid that holds them (e.g. more --seeds) uses them")
    if s.dest.name == "runs":
        console.print(f"tables: `privdl reproduce NAME … --collect --out {s.dest.parent}` over the grid you want (it "
                      f"runs nothing); results.csv of a plain experiment: `privdl run CONFIG --out {s.dest}`")
    else:
        console.print(f"results.csv: `privdl run CONFIG --out {s.dest}`; a reproduction's tables read its OUT/runs: "
                      f"`privdl merge {s.dest} --out OUT/runs`, then `privdl reproduce NAME … --collect --out OUT`")


class _Progress:
    """Progress of a command whose result goes to stdout (a table, or JSON for tools), shown on stderr so the result
    stays clean: a live bar where stderr is a terminal; in a log, a plain line for each part of the work when it
    starts and at most one every ``every`` seconds after, with the share done, the time spent and what is left."""

    def __init__(self, every: float = 15.0) -> None:
        from rich.progress import Progress

        self.every = every
        self.bar = Progress(console=err, transient=True) if err.is_terminal else None

    def __enter__(self) -> "_Progress":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def part(self, label: str, unit: str) -> Callable[[float, float], None]:
        """The ``(done, total)`` callback of one part of the work, shown as ``label`` (counts in ``unit``)."""
        from privdl.experiment.runner import format_duration

        if self.bar is not None:
            task = self.bar.add_task(label, total=None)
            return lambda done, total: self.bar.update(task, completed=done, total=total)
        start = last = first = None  # the clock starts at the first report: the part's own time

        def show(done: float, total: float) -> None:
            nonlocal start, last, first
            now = time.perf_counter()
            if start is None:
                start, first = now, done
            elif now - last < self.every and done < total:
                return
            last, spent = now, now - start
            rate = (done - first) / spent if spent > 0 else 0.0
            left = f", ≈ {format_duration((total - done) / rate)} left" if rate > 0 and done < total else ""
            err.print(f"{label}: {done:.0f}/{total:.0f} {unit} ({100 * done / max(total, 1):.0f} %), "
                      f"{format_duration(spent)} elapsed{left}", markup=False, highlight=False, soft_wrap=True)

        return show


def _choices(name: str, *values: str) -> type[Enum]:
    """A command-line choice type (a str Enum whose members are ``values``)."""
    return Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


AttackMethod = _choices("AttackMethod", "dlg", "idlg")
AttackerKind = _choices("AttackerKind", "curious_neighbour", "eavesdropper", "generous")


@app.command(cls=_Command)
def attack(
    method: AttackMethod = typer.Argument(..., help="dlg (input and soft label) or idlg (label from the gradient)"),
    config: Path = typer.Option(..., "--config", help="an ordinary run config with a model task and batch_size = 1 "
                                                      "(its first run is attacked), e.g. examples/attack.toml"),
    attacker: int = typer.Option(..., "--attacker", help="the attacking agent (a curious neighbour's index)"),
    victim: int = typer.Option(..., "--victim", help="the agent whose samples are reconstructed"),
    round_: int = typer.Option(..., "--round", help="the first attacked round (≥ 1)"),
    images: int = typer.Option(1, "--images", min=1, help="K: attack the victim's samples of K consecutive rounds"),
    kind: AttackerKind = typer.Option(AttackerKind.curious_neighbour, "--kind",
                                      help="whose view; generous = the victim's true model and gradient (seed 002's "
                                           "assumption for EDSG-RMS, not a view)"),
    iterations: int = typer.Option(300, "--iterations", min=1, help="L-BFGS iterations"),
    restarts: int = typer.Option(1, "--restarts", min=1, help="restarts from new dummies (the best match is kept)"),
    loss: str = typer.Option("l2", "--loss", help="gradient matching: l2 or cosine"),
    out: Path = typer.Option(Path("results/attack"), "--out", help="folder for the PNG grid and the JSON"),
    overrides: list[str] = typer.Option([], "--set", help="config override key=value (repeatable)"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
    plugin: list[str] = PLUGIN,
) -> None:
    """Gradient inversion from what an attacker really sees (seed 002 §5.2): reconstruct a victim's training samples
    from the transcript of a run; prints MSE, PSNR, SSIM and label accuracy, writes originals and reconstructions as
    one PNG grid. Example: privdl attack idlg --config examples/attack.toml --attacker 0 --victim 1 --round 10
    --images 3 (≈ 20 s). Progress goes to stderr."""
    from privdl.attacks.views import attack_run, save_grid
    from privdl.experiment.config import load_config

    try:
        cfg = load_config(config, overrides, plugins=plugin)
        with _Progress() as shown:
            result = attack_run(cfg, attacker=attacker, victim=victim, round=round_, images=images, kind=kind.value,
                                method=method.value, iterations=iterations, loss=loss, restarts=restarts,
                                on_round=shown.part("attack: training the run", "rounds"),
                                progress=shown.part(f"attack: {method.value} (L-BFGS)", "iterations"))
    except PrivdlError as exc:
        _fail(exc)
    out.mkdir(parents=True, exist_ok=True)
    grid = out / f"{method.value}_{kind.value}_victim{victim}_round{round_}.png"
    save_grid(grid, result["originals"], result["reconstructions"], images=result["images"],
              title=f"{method.value} by agent {attacker} ({kind.value.replace('_', ' ')}) on agent {victim}, rounds "
                    f"{round_}–{round_ + images - 1}")
    del result["originals"], result["reconstructions"]
    result["grid"] = str(grid)
    (out / grid.with_suffix(".json").name).write_text(json.dumps(result, indent=2))
    if fmt is Format.json:
        typer.echo(json.dumps(result, indent=2))
        return
    _print_facts({k: v for k, v in result.items() if k not in ("images", "notes")}, fmt,
                 f"{method.value} by agent {attacker} ({kind.value}) on agent {victim}")


#: ``privdl reproduce`` options: keyword of the reproduction function → command-line flag
REPRODUCE_FLAGS = {"seeds": "--seeds", "tune_seeds": "--tune-seeds", "clip": "--clip", "data_dir": "--data-dir",
                   "iterations": "--iterations", "epsilons": "--epsilon", "fiedlers": "--fiedler", "ts": "--t",
                   "dataset": "--dataset", "tune": "--tune", "methods": "--method", "device": "--device",
                   "shard": "--shard", "gossip": "--gossip", "resize": "--resize", "images": "--images",
                   "round": "--round", "attack_iterations": "--attack-iterations", "graphs": "--graph",
                   "splits": "--split", "normalize": "--no-normalize", "steps": "--steps", "collect": "--collect",
                   "canaries": "--canaries"}


@app.command(cls=_Command)
def reproduce(
    name: str = typer.Argument(..., help="fig1, fig2, quadratic, quadratic_at_optimum, a9a, fmnist (seed 001, "
                                         "the paper's text); mnist_authors, a9a_authors (seed 001 as the authors' "
                                         "code runs it: per-example clipping, example-level DP); table1, table2 "
                                         "(seed 004); rms_filtering, rms_localization, rms_dlg (seed 002); "
                                         "attack_table (gradient inversion under every method); dpdl (seed 003, our "
                                         "benchmark); designs (every design side by side: LDP, DECOR, Whisper, "
                                         "Zip-DL, Muffliato, DP-DSGT; accuracy, bytes, ledgers, audit and attacks)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output directory (default results/reproduce/NAME)"),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="seeds per setting (default: the paper's 10)"),
    tune_seeds: Optional[int] = typer.Option(None, "--tune-seeds", help="seeds for the step-size search"),
    clip: Optional[float] = typer.Option(None, "--clip", help="quadratic: clipping norm (SPEC: 0.1)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="where a9a / Fashion-MNIST files are"),
    iterations: Optional[int] = typer.Option(None, "--iterations", help="fmnist, *_authors, table1/table2, designs: "
                                                                "rounds (papers: 5000 / 1000 / 2000; designs: "
                                                                "1000 a9a, 500 MNIST)"),
    epsilon: list[float] = typer.Option([], "--epsilon", help="a9a, fmnist, table1/table2, designs: ε values "
                                                              "(repeatable; inf = non-private in tables; designs: "
                                                              "1, 3, 10)"),
    fiedler: list[float] = typer.Option([], "--fiedler", help="table1: normalized Fiedler targets (repeatable)"),
    t: list[float] = typer.Option([], "--t", help="table2: A(t) splits (repeatable)"),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="table1/table2/dpdl: image dataset "
                                                                  "(default fashion_mnist; mnist where present); "
                                                                  "designs: the task, a9a or mnist_t10k (default "
                                                                  "both)"),
    tune: bool = typer.Option(False, "--tune", help="table1/table2: try lr × {½, 1, 2} per cell first"),
    method: list[str] = typer.Option([], "--method", help="table1/table2: methods to run (repeatable; central, "
                                                          "dsgd, dsgt, dinno); dpdl: method labels (DPDL, "
                                                          "'DPDL self-noise', …, CGA); designs: LDP, DECOR, "
                                                          "Whisper, Zip-DL, 'Muffliato (1 round)', 'Muffliato (1 "
                                                          "round, mean pair)', 'Muffliato (10 rounds)', "
                                                          "'DP-DSGT (DP-SGD)'"),
    device: Optional[str] = typer.Option(None, "--device", callback=_device, help="table1/table2, designs: cpu, cuda or auto"),
    shard: Optional[str] = typer.Option(None, "--shard", help="table1/table2, designs: I/K runs every K-th cell "
                                                              "from I (K processes share one table; designs: run "
                                                              "each shard again once the step-size search is done)"),
    gossip: Optional[str] = typer.Option(None, "--gossip", help="table1/table2: synchronous (default) or authors "
                                                                "(DP-DSGD, DP-DSGT with seed 004's in-place averaging)"),
    resize: Optional[int] = typer.Option(None, "--resize", help="table1/table2: resize images (the authors: 32)"),
    no_normalize: bool = typer.Option(False, "--no-normalize", help="table1/table2: raw pixels, not normalised as "
                                                                    "the authors' inputs"),
    steps: Optional[str] = typer.Option(None, "--steps", help="table1/table2: authors (default: their step sizes "
                                                              "at every ε) or nearest (ε = 100 / 0.5 take the "
                                                              "ε = 10 / 1 values, as our tables before)"),
    images: Optional[int] = typer.Option(None, "--images", help="rms_dlg, attack_table, designs: victim samples "
                                                                "attacked (default 8; designs 4)"),
    round_: Optional[int] = typer.Option(None, "--round", help="rms_dlg, attack_table, designs: first attacked "
                                                                "round (default 10)"),
    attack_iterations: Optional[int] = typer.Option(None, "--attack-iterations",
                                                    help="rms_dlg, attack_table, designs: L-BFGS iterations "
                                                         "(default 300; designs 100)"),
    canaries: Optional[int] = typer.Option(None, "--canaries", help="designs: canaries of the one-run membership "
                                                                    "audit (default 200)"),
    graph: list[str] = typer.Option([], "--graph", help="dpdl, designs: graph labels to run (repeatable: ring, "
                                                        "'ER(0.3)')"),
    split: list[str] = typer.Option([], "--split", help="dpdl: split labels to run (repeatable: 'Dirichlet 0.1', "
                                                        "'Dirichlet 0.5', 'missing classes')"),
    jobs: int = typer.Option(1, "--jobs", min=1, help="processes sharing each sweep's runs on this machine"),
    collect: bool = typer.Option(False, "--collect", help="table1/table2/dpdl/designs: start no run; write the tables from "
                                                          "the runs already finished in --out (a long grid's "
                                                          "progress, or shard folders gathered from machines)"),
    plugin: list[str] = PLUGIN,
) -> None:
    """Reproduce a figure or table of the source papers: writes CSV files (and plots) (see REPRODUCTION.md)."""
    from privdl.reproductions import REPRODUCTIONS, parallel

    options = {k: v for k, v in {"seeds": seeds, "tune_seeds": tune_seeds, "clip": clip, "data_dir": data_dir,
                                 "iterations": iterations, "epsilons": tuple(epsilon) or None,
                                 "fiedlers": tuple(fiedler) or None, "ts": tuple(t) or None, "dataset": dataset,
                                 "tune": tune or None, "methods": tuple(method) or None, "device": device,
                                 "shard": shard, "gossip": gossip, "resize": resize, "images": images,
                                 "round": round_, "attack_iterations": attack_iterations,
                                 "graphs": tuple(graph) or None, "splits": tuple(split) or None,
                                 "normalize": False if no_normalize else None, "steps": steps,
                                 "collect": collect or None, "canaries": canaries}.items()
               if v is not None}
    try:
        _load_plugins(plugin)  # a plug-in may register a reproduction, or the components one names
        fn = REPRODUCTIONS.get(name)
    except PrivdlError as exc:
        _fail(exc)
    accepted = inspect.signature(fn).parameters
    ignored = [REPRODUCE_FLAGS[k] for k in options if k not in accepted]
    if ignored:
        takes = ", ".join(REPRODUCE_FLAGS[k] for k in REPRODUCE_FLAGS if k in accepted) or "no option but --out"
        _fail(ValidationError(f"{', '.join(ignored)} do{'es' if len(ignored) == 1 else ''} not apply to {name!r}; "
                              f"it takes {takes}"))
    options["progress"] = _progress_mode()
    if collect:  # nothing runs: its lines (how far each grid has come) are the output
        options["progress"] = lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)
    target = out or Path("results") / "reproduce" / name
    try:
        with parallel(jobs):
            rows = fn(target, **options)
    except PrivdlError as exc:
        _fail(exc)
    if name == "designs" and shard and not collect:  # a shard writes no tables (it said so): nothing to add
        return
    console.print(f"{name}: {len(rows)} rows written to {target} (runs, manifests and ledgers in its "
                  f"subfolders)")


class AuditAlgorithm(str, Enum):
    dsgd = "dsgd"
    dsgt = "dsgt"
    dinno = "dinno"
    central = "central"
    dsg_rms = "dsg_rms"
    edsg_rms = "edsg_rms"
    pd_lms = "pd_lms"
    dpdl = "dpdl"
    dpdl_self_noise = "dpdl_self_noise"


#: seed 004's Table 5: its ε lower bounds at nominal (ε, δ) = (1, 1e-2) (shallow CNN, 5000 + 5000 models, 1000 of
#: them for the threshold, blank canary labelled 0)
SEED004_TABLE5 = {"central": 0.230, "dsgd": 0.173, "dsgt": 0.129, "dinno": 0.165}


def _score_figure(path: Path, rows: list, *, epsilon: float, delta: float, canary: str, broken: str) -> None:
    """Seed 004's Fig. 3: the distributions of the attack's score on the canary z over models trained with z (in)
    and without (out), one panel per audited algorithm."""
    from privdl.experiment.plot import histograms

    panels = [(f"{name}: ε lower bound {res.threshold.epsilon_lower:.2f}",
               [("with z (in)", res.scores_in), ("without z (out)", res.scores_out)]) for name, res in rows]
    what = "correct mechanism" if broken == "none" else f"mechanism broken on purpose ({broken})"
    histograms(path, panels, xlabel="score on z (log-odds of its label)",
               title=f"seed 004 Fig. 3: scores on the canary z, nominal ({epsilon:g}, {delta:g}), {canary} canary, "
                     f"{what}",
               caption="separable distributions are what a membership attack exploits; entangled ones are what DP "
                       "promises")


@app.command(cls=_Command)
def audit(
    algorithm: list[AuditAlgorithm] = typer.Option(
        [AuditAlgorithm.central, AuditAlgorithm.dsgd, AuditAlgorithm.dsgt, AuditAlgorithm.dinno], "--algorithm",
        help="algorithms to audit (repeatable; central = DP-SGD on the pooled data)"),
    models: int = typer.Option(1000, "--models", min=1, help="models trained with, and as many without, the canary"),
    held_out: float = typer.Option(0.2, "--held-out", help="fraction of models used to choose the threshold"),
    epsilon: float = typer.Option(1.0, "--epsilon", help="nominal ε the training is calibrated to"),
    delta: float = typer.Option(1e-2, "--delta", help="δ of the audited (ε, δ) claim"),
    clip: float = typer.Option(10.0, "--clip", help="clipping norm C of the audited runs"),
    iterations: int = typer.Option(100, "--iterations", min=1, help="rounds of each audited run"),
    model: str = typer.Option("cnn", "--model", help="cnn (seed 004's) or softmax (fast)"),
    dataset: str = typer.Option("mnist_t10k", "--dataset", help="image dataset D is drawn from"),
    per_class: int = typer.Option(100, "--per-class", min=1, help="images of each of the three classes in D"),
    canary: str = typer.Option("blank", "--canary", help="blank (seed 004) or bright (exposes disabled clipping)"),
    broken: str = typer.Option("none", "--broken", help="none, noise (σ/30) or clip (no clipping): the self-test, "
                                                        "with --canary bright --model softmax --models 100"),
    one_run: int = typer.Option(0, "--one-run", min=0, help="also run Steinke et al.'s one-run audit with this many "
                                                   "canaries (0: skip)"),
    batch: int = typer.Option(200, "--batch", min=1, help="systems trained at once (memory)"),
    device: str = typer.Option("cpu", "--device", callback=_device, help="cpu, cuda or auto: where the systems "
                                                                          "train"),
    seed: int = typer.Option(0, "--seed", min=0, help="root seed of the audit"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="folder with the MNIST files (default: the "
                                                                    "usual search)"),
    out: Optional[Path] = typer.Option(None, "--out", help="write audit.json and the scores here"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
) -> None:
    """Membership-inference audit (seed 004 App. D): empirical ε lower bounds (Clopper–Pearson 95%) beside the
    nominal ε for each algorithm, and optionally the one-run bound. A lower bound above the nominal ε means the
    implementation does not deliver its guarantee. Self-test (every algorithm must say VIOLATION): privdl audit
    --model softmax --canary bright --broken noise --models 100. Progress goes to stderr."""
    import numpy as np

    from privdl.audit import AuditSetup, membership_audit, one_run_membership_audit

    rows, report = [], {"unit": "example", "mechanism": "dp_sgd", "accountant": "rdp (dp_accounting)",
                        "delta": delta, "nominal_epsilon": epsilon, "results": {}}
    # seed 004's Table 5 was measured with its CNN and blank canary at nominal (1, 1e-2), correct mechanisms, C = 10,
    # 100 rounds: shown beside ours in that setting only
    paper_setting = (epsilon == 1.0 and delta == 1e-2 and broken == "none" and model == "cnn" and canary == "blank"
                     and clip == 10.0 and iterations == 100)
    try:
        with _Progress() as shown:
            for alg in algorithm:
                setup = AuditSetup(algorithm=alg.value, epsilon=epsilon, delta=delta, clip=clip,
                                   iterations=iterations, model=model, dataset=dataset, per_class=per_class,
                                   canary=canary, broken=broken, data_dir=data_dir)
                show = shown.part(f"audit {alg.value}", "models")
                res = membership_audit(setup, models, held_out=held_out, batch=batch, seed=seed, device=device,
                                       progress=lambda done, total: show(done / iterations, total / iterations))
                entry = {"threshold_audit": res.threshold.to_dict(), "violation": res.violation,
                         "nominal_epsilon": None if setup.claims_none else epsilon,
                         "guarantee": "none (no DP mechanism; the bound is what membership inference shows)"
                         if setup.claims_none else f"({epsilon:g}, {delta:g})-DP per example",
                         "seconds": res.seconds, "ledger": res.ledger}
                if one_run:
                    one, _ = one_run_membership_audit(setup, one_run, seed=seed, device=device)
                    entry["one_run_audit"] = one.to_dict()
                report["results"][alg.value] = entry
                if out:
                    out.mkdir(parents=True, exist_ok=True)
                    np.savez(out / f"scores_{alg.value}.npz", scores_in=res.scores_in, scores_out=res.scores_out)
                rows.append((alg.value, res))
                if paper_setting:
                    entry["seed004_table5_epsilon_lower"] = SEED004_TABLE5.get(alg.value)
    except (PrivdlError, ValueError) as exc:
        _fail(exc)
    if out:
        (out / "audit.json").write_text(json.dumps(report, indent=2, default=str))
        _score_figure(out / "scores.png", rows, epsilon=epsilon, delta=delta, canary=canary, broken=broken)
    if fmt is Format.json:
        typer.echo(json.dumps(report, default=str))
        return
    from privdl.audit.membership import NOISE_DIVISOR

    what = {"none": "correct mechanism", "noise": f"mechanism broken on purpose: noise σ/{NOISE_DIVISOR}",
            "clip": "mechanism broken on purpose: no clipping"}[broken]
    table = Table(title=f"membership audit: nominal (ε, δ) = ({epsilon}, {delta}), example level, "
                        f"{models} + {models} models, {canary} canary, {what}")
    for col in ("method", "nominal ε", "ε lower bound (95%)", "point", "TPR", "FPR", "one-run ε lb",
                "seed 004 Table 5"):
        table.add_column(col)
    table.add_column("verdict", no_wrap=True)
    for name, res in rows:
        t = res.threshold
        one = report["results"][name].get("one_run_audit", {}).get("epsilon_lower")
        paper = report["results"][name].get("seed004_table5_epsilon_lower")
        table.add_row(name, "none" if res.setup.claims_none else f"{epsilon:g}", f"{t.epsilon_lower:.3f}", f"{t.epsilon_point:.3f}", f"{t.tpr:.3f}",
                      f"{t.fpr:.3f}", "—" if one is None else f"{one:.3f}", "—" if paper is None else f"{paper:.3f}",
                      "[red]VIOLATION[/red]" if res.violation else
                      ("claims none" if res.setup.claims_none else "none found"))
    console.print(table)
