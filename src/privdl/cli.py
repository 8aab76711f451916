"""The ``privdl`` command line: run, plot, account, covariance."""

from __future__ import annotations

import inspect
import json
import math
import sys
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from privdl.errors import PrivdlError, ValidationError


def _plain_flags(params: list) -> list:
    """Boolean flags take no value, so their help shows none (typer would print ``<bool>``)."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    return params


class _Command(TyperCommand):
    def get_params(self, ctx):  # noqa: D102 - typer hook
        return _plain_flags(super().get_params(ctx))

    def invoke(self, ctx):  # noqa: D102 - typer hook
        try:
            return super().invoke(ctx)
        except OverflowError as exc:  # e.g. --clip 1e300: its square is beyond double precision
            given = ", ".join(f"{k.rstrip('_')} = {v}" for k, v in ctx.params.items()
                              if v not in (None, False, [], ()))
            _fail(ValidationError(f"a value is too large to compute with in double precision ({exc}); given: "
                                  f"{given}"))


class _Group(TyperGroup):
    command_class = _Command

    def get_params(self, ctx):  # noqa: D102 - typer hook
        return _plain_flags(super().get_params(ctx))


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=_Group,
                  help="privdl: privacy-preserving decentralized learning (simulator, accountants, experiments).")
console = Console(width=None if sys.stdout.isatty() else 160)  # no truncated tables in logs
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        import privdl

        typer.echo(f"privdl {privdl.__version__} (source {privdl.source_hash()})")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print privdl's version and the hash of its source, and exit")) -> None:
    """privdl: privacy-preserving decentralized learning (simulator, accountants, experiments)."""


def _print_facts(facts: dict, fmt: "Format", title: str) -> None:
    """A flat dict of results as JSON or as a two-column table."""
    if fmt is Format.json:
        typer.echo(json.dumps(facts, indent=2, default=str))
        return
    table = Table(title=title)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for k, v in facts.items():
        table.add_row(k, "" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v)))
    console.print(table)


def _device(value: Optional[str]) -> Optional[str]:
    """--device: the values the config's ``device`` key takes (checked here, not deep inside torch)."""
    from privdl.experiment.config import DEVICE

    if value is not None and not DEVICE.fullmatch(value):
        raise typer.BadParameter(f"must be cpu, cuda, cuda:N or auto, got {value!r}")
    return value


def _network(mixing: Optional[Path], topology: str, n: int, p: float, graph_seed: int, rule: str,
             lazy: bool = False):
    """The network of a command's --mixing file, or of its --topology/--n/--p/--graph-seed/--rule options."""
    from privdl.network import Network, load_network_file

    if not 0.0 < p <= 1.0:  # checked whichever topology reads it: a value no topology could take is a typo
        raise ValidationError(f"--p is an edge probability in (0, 1], got {p}")

    if mixing is not None:
        return load_network_file(mixing, kind="mixing")
    return Network.from_topology(topology, n, mixing=rule, lazy=lazy, seed=graph_seed,
                                 **({"p": p} if topology == "erdos_renyi" else {}))


def _fail(exc: Exception) -> None:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(str(exc))}")  # messages name [sections] and 'pkg[extra]' literally
    raise typer.Exit(code=2)


@app.command(cls=_Command)
def run(
    config: Path = typer.Argument(..., help="experiment TOML file"),
    set_: list[str] = typer.Option([], "--set", help="override a key: --set mechanism.epsilon=5 (repeatable)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output directory (default results/<config name>)"),
    no_plot: bool = typer.Option(False, "--no-plot", help="do not draw plots at the end"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
) -> None:
    """Run (or resume) every run of an experiment's sweep; write results.csv, manifests and plots."""
    from privdl.experiment import load_config, plot_experiment, run_experiment

    try:
        cfg = load_config(config, set_)
        out = out or Path("results") / config.stem
        summary = run_experiment(cfg, out, progress=False if quiet else _progress_mode())
        console.print(f"{summary.runs} runs ({summary.executed} executed, {summary.skipped} already done"
                      + (f", {summary.busy} being run by another process: run the command again when it has "
                         "finished to collect them" if summary.busy else "")
                      + f") in {summary.seconds:.1f} s → {summary.results}")
        if summary.nonfinite:
            first, metrics = next(iter(summary.nonfinite.items()))
            err.print(f"[bold yellow]warning:[/] {len(summary.nonfinite)} run(s) ended with nan or inf metrics "
                      f"(diverged or overflowed; recorded as nonfinite_metrics in their manifests), e.g. run {first}: "
                      f"{', '.join(metrics)} — lower the step size or check the scale of the inputs", markup=True)
        _print_final(summary.out)
        if not no_plot:
            try:
                files = plot_experiment(summary.out)
            except OSError as exc:
                raise PrivdlError(f"the runs are saved ({summary.results}), but the plots could not be written: "
                                  f"{exc}") from None
            console.print(f"{len(files)} plots in {summary.out / 'plots'}")
    except PrivdlError as exc:
        _fail(exc)


def _print_final(out: Path) -> None:
    """A table of final metrics, mean ± std over seeds, per combination of the other sweep axes."""
    from collections import defaultdict

    from privdl.experiment.plot import axis_title
    from privdl.experiment.store import read_results
    from privdl.experiment.summary import mean_std, sort_key

    fields, rows = read_results(out / "results.csv")
    axes = [f for f in fields if f not in ("run_id", "iteration", "metric", "value", "seed")]
    last = max(int(r["iteration"]) for r in rows)
    metrics = sorted({r["metric"] for r in rows} - {"consensus_distance", "train_loss", "local_optimality_gap"})
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


class Unit(str, Enum):
    agent = "agent"
    example = "example"


class AccountantName(str, Enum):
    paper = "paper"
    tight = "tight"


class Format(str, Enum):
    json = "json"
    table = "table"


@app.command(cls=_Command)
def account(
    manifest: Optional[Path] = typer.Option(None, "--manifest", help="re-account a finished run from the events in "
                                                                     "its manifest.json (nothing else is needed)"),
    unit: Unit = typer.Option(Unit.agent, "--unit", help="privacy unit"),
    accountant: AccountantName = typer.Option(AccountantName.tight, "--accountant", help="agent level only"),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="target ε (calibrate the noise)"),
    precision_bound: Optional[float] = typer.Option(None, "--precision-bound",
                                                    help="agent level: precision bound b on [R⁻¹]_ii (account ε)"),
    noise_multiplier: Optional[float] = typer.Option(None, "--noise-multiplier",
                                                     help="example level: σ (noise std σC on the clipped sum)"),
    sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="example level: Poisson rate q"),
    delta: float = typer.Option(1e-5, "--delta", help="δ of the (ε, δ) guarantee"),
    clip: Optional[float] = typer.Option(None, "--clip", help="agent level: clipping norm C (sensitivity 2C)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="number of noisy steps T (every noisy data access)"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
) -> None:
    """Accounting. Agent level: (ε, δ) → per-agent precision bound b, or b → ε. Example level (DP-SGD, RDP of the
    Poisson-subsampled Gaussian): σ → (ε, order), or ε → the smallest σ that meets it. ``--manifest PATH``
    re-accounts a finished run from its privacy ledger's events alone: ε per agent and the worst."""
    if manifest is not None:
        _account_manifest(manifest, fmt)
        return
    try:
        if steps is None:
            raise PrivdlError("give --steps (or --manifest PATH to re-account a finished run)")
        wrong = [flag for flag, v, agent_only in (("--clip", clip, True), ("--precision-bound", precision_bound, True),
                                                  ("--noise-multiplier", noise_multiplier, False),
                                                  ("--sample-rate", sample_rate, False))
                 if v is not None and agent_only == (unit is Unit.example)]
        if wrong:
            raise ValidationError(
                f"{', '.join(wrong)} do{'es' if len(wrong) == 1 else ''} not apply at the {unit.value} level"
                + (" (example level is in units of the noise multiplier σ: noise std σ·C on the clipped sum, so C "
                   "does not change ε)" if unit is Unit.example else " (give --clip and --epsilon or "
                                                                      "--precision-bound)"))
        if unit is Unit.example:
            result = _account_example(epsilon, noise_multiplier, sample_rate, delta, steps)
            title = "example-level accounting (RDP, Poisson-subsampled Gaussian)"
        else:
            result = _account_agent(accountant, epsilon, precision_bound, delta, clip, steps)
            title = f"agent-level accounting ({result['accountant']} accountant)"
    except (PrivdlError, ValueError) as exc:
        _fail(exc)
    _print_facts(result, fmt, title)


def _account_agent(accountant: "AccountantName", epsilon: float | None, precision_bound: float | None,
                   delta: float, clip: float | None, steps: int) -> dict:
    from privdl.privacy import get_accountant

    if (epsilon is None) == (precision_bound is None):
        raise PrivdlError("give exactly one of --epsilon or --precision-bound")
    if clip is None:
        raise PrivdlError("agent-level accounting needs --clip")
    acc = get_accountant(accountant.value)
    b = acc.bound(epsilon=epsilon, delta=delta, clip=clip, steps=steps) if epsilon is not None else precision_bound
    eps = acc.epsilon(bound=b, delta=delta, clip=clip, steps=steps)  # validates b before 1/b below
    return {
        "unit": "agent", "accountant": acc.name, "mechanism": "Gaussian, sensitivity 2C, precision b per step",
        "target_epsilon": epsilon, "delta": delta, "clip": clip, "steps": steps,
        "bound": b, "ldp_variance": 1.0 / b, "ldp_sigma": 1.0 / math.sqrt(b),
        "epsilon": eps, "reference": acc.reference,
    }


def _account_example(epsilon: float | None, noise_multiplier: float | None, sample_rate: float | None,
                     delta: float, steps: int) -> dict:
    from privdl.privacy.example_accountant import calibrate_noise_multiplier, rdp_epsilon

    if (epsilon is None) == (noise_multiplier is None):
        raise PrivdlError("give exactly one of --epsilon or --noise-multiplier")
    if sample_rate is None:
        raise PrivdlError("example-level accounting needs --sample-rate")
    sigma = noise_multiplier if noise_multiplier is not None else \
        calibrate_noise_multiplier(epsilon=epsilon, sample_rate=sample_rate, steps=steps, delta=delta)
    eps, order = rdp_epsilon(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps, delta=delta)
    return {"unit": "example", "accountant": "rdp", "mechanism": "Poisson-subsampled Gaussian (DP-SGD)",
            "target_epsilon": epsilon, "noise_multiplier": sigma, "sample_rate": sample_rate, "steps": steps,
            "delta": delta, "epsilon": eps, "order": order,
            "reference": "RDP of the subsampled Gaussian (Mironov et al. 2019), conversion of Balle et al. 2020, "
                         "via dp_accounting"}


def _account_manifest(path: Path, fmt: "Format") -> None:
    """Re-account a finished run from the events its manifest's ledger stores."""
    from privdl.privacy.ledger import Ledger

    try:
        target = path / "manifest.json" if path.is_dir() else path
        if not target.is_file():
            raise PrivdlError(f"{target} does not exist (give a run's manifest.json or its folder)")
        try:
            data = json.loads(target.read_text())
            stated = data["privacy_ledger"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise PrivdlError(f"{target} is not a privdl run manifest with a privacy ledger ({exc})") from None
        try:
            ledger = Ledger.from_dict(stated)
        except (ValueError, KeyError, TypeError) as exc:
            raise PrivdlError(f"{target}: {exc}") from None
        again = ledger.reaccount()
    except PrivdlError as exc:
        _fail(exc)
    eps = again.epsilon
    per_agent = [{k: v for k, v in row.items() if k != "events"} for row in again.per_agent()]
    result = {"manifest": str(target), "unit": again.unit, "mechanism": again.mechanism,
              "accountant": again.accountant, "delta": again.delta,
              "epsilon": "inf" if eps is not None and math.isinf(eps) else eps, "guarantee": again.guarantee,
              "stated_epsilon": stated.get("epsilon"), "agents": len(per_agent), "per_agent": per_agent}
    for b, said in zip(again.beside, stated.get("beside", [])):  # the same noise for another unit
        other = b.epsilon
        result[f"{b.unit}_level_epsilon"] = "inf" if other is not None and math.isinf(other) else other
        result[f"{b.unit}_level_stated_epsilon"] = said.get("epsilon")
        result[f"{b.unit}_level_accountant"] = b.accountant
    if fmt is Format.json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    _print_facts({k: v for k, v in result.items() if k != "per_agent"}, fmt, "re-accounted from the manifest's events")
    table = Table(title="per agent")
    for col in ("agent", "epsilon", "delta", "accesses", "noise_multiplier", "sample_rate"):
        table.add_column(col, justify="right")
    for row in per_agent:
        table.add_row(*(("" if row.get(c) is None else (f"{row[c]:.6g}" if isinstance(row[c], float) else
                                                         str(row[c]))) for c in ("agent", "epsilon", "delta",
                                                                                  "accesses", "noise_multiplier",
                                                                                  "sample_rate")))
    console.print(table)


class DesignName(str, Enum):
    ldp = "ldp"
    decor = "decor"
    whisper = "whisper"


@app.command(cls=_Command)
def covariance(
    mixing: Optional[Path] = typer.Option(None, "--mixing", help="mixing matrix W (.npy/.csv/.txt)"),
    topology: str = typer.Option("erdos_renyi", "--topology", help="topology when no --mixing file is given"),
    n: int = typer.Option(20, "--n", help="number of agents"),
    p: float = typer.Option(0.5, "--p", help="edge probability (erdos_renyi)"),
    graph_seed: int = typer.Option(0, "--graph-seed", min=0, help="seed of the random graph"),
    rule: str = typer.Option("metropolis_hastings", "--rule", help="mixing rule for a generated topology"),
    design: DesignName = typer.Option(DesignName.whisper, "--design", help="covariance design (seed 001)"),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="target ε per agent"),
    precision_bound: Optional[float] = typer.Option(None, "--precision-bound", help="b directly instead of ε"),
    delta: float = typer.Option(1e-5, "--delta", help="δ of the (ε, δ) guarantee"),
    clip: float = typer.Option(0.1, "--clip", help="clipping norm C"),
    steps: int = typer.Option(5000, "--steps", min=1, help="number of noisy steps T"),
    accountant: AccountantName = typer.Option(AccountantName.paper, "--accountant", help="agent-level accountant: "
                                              "paper (seed 001, Theorem 2) or tight (exact Gaussian-DP)"),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="HBC seed groups: global, edges, neighbourhoods, "
                                                             "groups:M (whisper solves problem (10))"),
    coalition_size: int = typer.Option(0, "--coalition-size", min=0, help="q: coalitions of up to q curious agents"),
    save_covariance: Optional[Path] = typer.Option(None, "--save-covariance", help="write R to this .npy file"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
) -> None:
    """Design the noise covariance R for a network: Tr(W R Wᵀ) against LDP and the central-DP bound."""
    import numpy as np

    from privdl.covariance import design_covariance
    from privdl.covariance.hbc import solve_hbc
    from privdl.covariance.seeds import coalition_worst_ratio, seed_groups
    from privdl.privacy import get_accountant

    try:
        if (epsilon is None) == (precision_bound is None):
            raise PrivdlError("give exactly one of --epsilon or --precision-bound")
        if coalition_size < 0:
            raise ValidationError(f"--coalition-size must be >= 0 (0: no curious agents), got {coalition_size}")
        if save_covariance is not None and (save_covariance.is_dir() or not save_covariance.name):
            raise ValidationError(f"--save-covariance {str(save_covariance)!r} is a folder; give a file name "
                                  f"(e.g. R.npy)")
        if save_covariance is not None and not save_covariance.parent.is_dir():
            raise ValidationError(f"--save-covariance {save_covariance}: folder {save_covariance.parent} does not "
                                  "exist")
        if seeds is not None and not seeds.strip():
            raise ValidationError("--seeds is empty; give global, edges, neighbourhoods or groups:M")
        net = _network(mixing, topology, n, p, graph_seed, rule)
        acc = get_accountant(accountant.value)
        b = acc.bound(epsilon=epsilon, delta=delta, clip=clip, steps=steps) if epsilon is not None \
            else float(precision_bound)
        hbc = seeds is not None or coalition_size > 0
        if design is DesignName.whisper and hbc and not (seeds in (None, "global") and coalition_size == 0):
            w = net.dense("the HBC covariance design", copies=8)
            result = solve_hbc(w, bound=b, groups=seed_groups(seeds or "global", w),
                               coalition_size=coalition_size, label=seeds or "global")
        else:
            result = design_covariance(design.value, net.dense("the covariance design", copies=8), bound=b)
        facts = result.summary()
        if hbc:
            worst, where = coalition_worst_ratio(result.sigma_mix2, list(result.components or []), net.n,
                                                 coalition_size=coalition_size, bound=b)
            own = {"ldp": "none (independent noise)", "decor": "edges", "whisper": "global"}[design.value]
            facts.update({"seeds": seeds or own, "coalition_size": coalition_size,
                          "worst_coalition_ratio": worst, "worst_coalition": where,
                          "epsilon_against_coalitions": acc.epsilon(bound=b * worst, delta=delta, clip=clip,
                                                                    steps=steps)})
        facts.update({"accountant": acc.name, "epsilon": acc.epsilon(bound=b * result.max_precision_ratio,
                                                                     delta=delta, clip=clip, steps=steps),
                      "delta": delta, "clip": clip, "steps": steps, "network": net.description})
        if hbc:
            facts["design"] = f"{design.value}, HBC problem (10): seeds {facts['seeds']}, coalitions of up to " \
                              f"{coalition_size}"
            facts["guarantee"] = (f"({facts['epsilon_against_coalitions']:.6g}, {delta:g})-DP per agent against "
                                  f"coalitions of up to {coalition_size} curious agents; ({facts['epsilon']:.6g}, "
                                  f"{delta:g}) against an observer outside every coalition")
        else:
            facts["guarantee"] = f"({facts['epsilon']:.6g}, {delta:g})-DP per agent, agent level"
        if str(facts.get("solver", "")).lower() not in ("dual fixed point", ""):
            for key in ("duality_gap", "iterations", "relative_duality_gap"):  # the dual solver's, not a conic's
                facts.pop(key, None)
        if fmt is Format.table:
            facts.pop("worst_coalition", None)  # a nested dict: JSON only
        if save_covariance is not None:
            np.save(save_covariance, result.R)
            facts["saved"] = str(save_covariance)
    except (PrivdlError, ValueError, OSError) as exc:
        _fail(exc)
    _print_facts(facts, fmt, f"{design.value} covariance, n = {facts['n']} ({acc.name} accountant)")


def _choices(name: str, *values: str) -> type[Enum]:
    """A command-line choice type (a str Enum whose members are ``values``)."""
    return Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


AttackMethod = _choices("AttackMethod", "dlg", "idlg")
AttackerKind = _choices("AttackerKind", "curious_neighbour", "eavesdropper", "generous")


@app.command(cls=_Command)
def attack(
    method: AttackMethod = typer.Argument(..., help="dlg (input and soft label) or idlg (label from the gradient)"),
    config: Path = typer.Option(..., "--config", help="an ordinary run config (its first run is attacked)"),
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
) -> None:
    """Gradient inversion from what an attacker really sees (seed 002 §5.2): reconstruct a victim's training samples
    from the transcript of a run; prints MSE, PSNR, SSIM and label accuracy, writes originals and reconstructions as
    one PNG grid."""
    from rich.progress import Progress

    from privdl.attacks.views import attack_run, save_grid
    from privdl.experiment.config import load_config

    try:
        cfg = load_config(config, overrides)
        with Progress(transient=True, disable=fmt is Format.json) as bar:
            task = bar.add_task("L-BFGS", total=iterations * restarts)
            result = attack_run(cfg, attacker=attacker, victim=victim, round=round_, images=images, kind=kind.value,
                                method=method.value, iterations=iterations, loss=loss, restarts=restarts,
                                progress=lambda done, total: bar.update(task, completed=done, total=total))
    except PrivdlError as exc:
        _fail(exc)
    out.mkdir(parents=True, exist_ok=True)
    grid = out / f"{method.value}_{kind.value}_victim{victim}_round{round_}.png"
    save_grid(grid, result.pop("originals"), result.pop("reconstructions"))
    result["grid"] = str(grid)
    (out / grid.with_suffix(".json").name).write_text(json.dumps(result, indent=2))
    if fmt is Format.json:
        typer.echo(json.dumps(result, indent=2))
        return
    _print_facts({k: v for k, v in result.items() if k not in ("images", "notes")}, fmt,
                 f"{method.value} by agent {attacker} ({kind.value}) on agent {victim}")


@app.command("rms-bounds", cls=_Command)
def rms_bounds_command(
    mixing: Optional[Path] = typer.Option(None, "--mixing", help="combination matrix A (.npy/.csv/.txt)"),
    topology: str = typer.Option("erdos_renyi", "--topology", help="topology when no --mixing file is given"),
    n: int = typer.Option(5, "--n", help="number of agents"),
    p: float = typer.Option(0.5, "--p", help="edge probability (erdos_renyi)"),
    graph_seed: int = typer.Option(0, "--graph-seed", min=0, help="seed of the random graph"),
    rule: str = typer.Option("laplacian", "--rule", help="mixing rule for a generated topology (seed 002: laplacian)"),
    lazy: bool = typer.Option(False, "--lazy", help="use the lazy rule (I + A)/2 (positive definite, EDSG-RMS)"),
    dim: int = typer.Option(5, "--dim", min=1, help="L, the model dimension"),
    mu: float = typer.Option(1.0, "--mu", help="mean of the diagonal step-size factors"),
    sigma_mu: Optional[float] = typer.Option(None, "--sigma-mu", help="std of the diagonal entries (default σ_z)"),
    sigma_z: float = typer.Option(0.01, "--sigma-z", help="std of the off-diagonal entries"),
    smoothness: float = typer.Option(1.0, "--smoothness", help="δ: every J_k is δ-smooth"),
    strong_convexity: float = typer.Option(0.0, "--strong-convexity", help="ν: every J_k is ν-strongly convex"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
) -> None:
    """Seed 002 Theorems 1–2: admissible γ and τ of DSG-RMS / EDSG-RMS for a network and random matrix."""
    from privdl.algorithms.rms_bounds import rms_bounds

    try:
        net = _network(mixing, topology, n, p, graph_seed, rule, lazy)
        facts = rms_bounds(net.dense("seed 002's bounds", copies=3), dim=dim, mu=mu, sigma_mu=sigma_mu, sigma_z=sigma_z, smoothness=smoothness,
                           strong_convexity=strong_convexity)
    except PrivdlError as exc:
        _fail(exc)
    _print_facts(facts, fmt, f"seed 002 bounds, n = {net.n}, L = {dim}")


#: ``privdl reproduce`` options: keyword of the reproduction function → command-line flag
REPRODUCE_FLAGS = {"seeds": "--seeds", "tune_seeds": "--tune-seeds", "clip": "--clip", "data_dir": "--data-dir",
                   "iterations": "--iterations", "epsilons": "--epsilon", "fiedlers": "--fiedler", "ts": "--t",
                   "dataset": "--dataset", "tune": "--tune", "methods": "--method", "device": "--device",
                   "shard": "--shard", "gossip": "--gossip", "resize": "--resize", "images": "--images",
                   "round": "--round", "attack_iterations": "--attack-iterations", "graphs": "--graph",
                   "splits": "--split"}


@app.command(cls=_Command)
def reproduce(
    name: str = typer.Argument(..., help="fig1, fig2, quadratic, quadratic_at_optimum, a9a, fmnist (seed 001, "
                                         "the paper's text); mnist_authors, a9a_authors (seed 001 as the authors' "
                                         "code runs it: per-example clipping, example-level DP); table1, table2 "
                                         "(seed 004); rms_filtering, rms_localization, rms_dlg (seed 002); "
                                         "attack_table (gradient inversion under every method); dpdl (seed 003, our "
                                         "benchmark)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output directory (default results/reproduce/NAME)"),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="seeds per setting (default: the paper's 10)"),
    tune_seeds: Optional[int] = typer.Option(None, "--tune-seeds", help="seeds for the step-size search"),
    clip: Optional[float] = typer.Option(None, "--clip", help="quadratic: clipping norm (SPEC: 0.1)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="where a9a / Fashion-MNIST files are"),
    iterations: Optional[int] = typer.Option(None, "--iterations", help="fmnist, *_authors, table1/table2: rounds "
                                                                "(papers: 5000 / 1000 / 2000)"),
    epsilon: list[float] = typer.Option([], "--epsilon", help="a9a, fmnist, table1/table2: ε values "
                                                              "(repeatable; inf = non-private in tables)"),
    fiedler: list[float] = typer.Option([], "--fiedler", help="table1: normalized Fiedler targets (repeatable)"),
    t: list[float] = typer.Option([], "--t", help="table2: A(t) splits (repeatable)"),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="table1/table2/dpdl: image dataset "
                                                                  "(default fashion_mnist; mnist where present)"),
    tune: bool = typer.Option(False, "--tune", help="table1/table2: try lr × {½, 1, 2} per cell first"),
    method: list[str] = typer.Option([], "--method", help="table1/table2: methods to run (repeatable; central, "
                                                          "dsgd, dsgt, dinno); dpdl: method labels (DPDL, "
                                                          "'DPDL self-noise', …, CGA)"),
    device: Optional[str] = typer.Option(None, "--device", callback=_device, help="table1/table2: cpu, cuda or auto"),
    shard: Optional[str] = typer.Option(None, "--shard", help="table1/table2: I/K runs every K-th cell from I "
                                                              "(K processes share one table)"),
    gossip: Optional[str] = typer.Option(None, "--gossip", help="table1/table2: synchronous (default) or authors "
                                                                "(DP-DSGD, DP-DSGT with seed 004's in-place averaging)"),
    resize: Optional[int] = typer.Option(None, "--resize", help="table1/table2: resize images (the authors: 32)"),
    images: Optional[int] = typer.Option(None, "--images", help="rms_dlg, attack_table: victim samples attacked "
                                                                "(default 8)"),
    round_: Optional[int] = typer.Option(None, "--round", help="rms_dlg, attack_table: first attacked round "
                                                                "(default 10)"),
    attack_iterations: Optional[int] = typer.Option(None, "--attack-iterations",
                                                    help="rms_dlg, attack_table: L-BFGS iterations (default 300)"),
    graph: list[str] = typer.Option([], "--graph", help="dpdl: graph labels to run (repeatable: ring, 'ER(0.3)')"),
    split: list[str] = typer.Option([], "--split", help="dpdl: split labels to run (repeatable: 'Dirichlet 0.1', "
                                                        "'Dirichlet 0.5', 'missing classes')"),
) -> None:
    """Reproduce a figure or table of the source papers: writes CSV files (and plots) (see REPRODUCTION.md)."""
    from privdl.reproductions import REPRODUCTIONS

    options = {k: v for k, v in {"seeds": seeds, "tune_seeds": tune_seeds, "clip": clip, "data_dir": data_dir,
                                 "iterations": iterations, "epsilons": tuple(epsilon) or None,
                                 "fiedlers": tuple(fiedler) or None, "ts": tuple(t) or None, "dataset": dataset,
                                 "tune": tune or None, "methods": tuple(method) or None, "device": device,
                                 "shard": shard, "gossip": gossip, "resize": resize, "images": images,
                                 "round": round_, "attack_iterations": attack_iterations,
                                 "graphs": tuple(graph) or None, "splits": tuple(split) or None}.items()
               if v is not None}
    try:
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
    target = out or Path("results") / "reproduce" / name
    try:
        rows = fn(target, **options)
    except PrivdlError as exc:
        _fail(exc)
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
    broken: str = typer.Option("none", "--broken", help="none, noise (σ/10) or clip (no clipping): self-test"),
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
    implementation does not deliver its guarantee."""
    import json

    import numpy as np
    from rich.progress import Progress

    from privdl.audit import AuditSetup, membership_audit, one_run_membership_audit

    rows, report = [], {"unit": "example", "mechanism": "dp_sgd", "accountant": "rdp (dp_accounting)",
                        "delta": delta, "nominal_epsilon": epsilon, "results": {}}
    try:
        with Progress(transient=True, disable=fmt is Format.json) as bar:
            for alg in algorithm:
                setup = AuditSetup(algorithm=alg.value, epsilon=epsilon, delta=delta, clip=clip,
                                   iterations=iterations, model=model, dataset=dataset, per_class=per_class,
                                   canary=canary, broken=broken, data_dir=data_dir)
                task_id = bar.add_task(f"audit {alg.value}", total=2 * models)
                res = membership_audit(setup, models, held_out=held_out, batch=batch, seed=seed, device=device,
                                       progress=lambda done, total: bar.update(task_id, completed=done))
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
    except (PrivdlError, ValueError) as exc:
        _fail(exc)
    if out:
        (out / "audit.json").write_text(json.dumps(report, indent=2, default=str))
    if fmt is Format.json:
        typer.echo(json.dumps(report, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"membership audit: nominal (ε, δ) = ({epsilon}, {delta}), example level, "
                        f"{models} + {models} models, {broken if broken != 'none' else 'correct'} mechanism")
    for col in ("method", "nominal ε", "ε lower bound (95%)", "point", "TPR", "FPR", "one-run ε lb"):
        table.add_column(col)
    table.add_column("verdict", no_wrap=True)
    for name, res in rows:
        t = res.threshold
        one = report["results"][name].get("one_run_audit", {}).get("epsilon_lower")
        table.add_row(name, "none" if res.setup.claims_none else f"{epsilon:g}", f"{t.epsilon_lower:.3f}", f"{t.epsilon_point:.3f}", f"{t.tpr:.3f}",
                      f"{t.fpr:.3f}", "—" if one is None else f"{one:.3f}",
                      "[red]VIOLATION[/red]" if res.violation else
                      ("claims none" if res.setup.claims_none else "none found"))
    Console().print(table)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line on stderr (each distinct message once), e.g. an RMS run outside seed 002's bounds."""
    from rich.markup import escape

    err.print(f"[yellow]warning:[/] {escape(str(message))}", soft_wrap=True, highlight=False)


def _progress_mode() -> "bool | Callable[[str], None]":
    """A live bar on a terminal; in a log, plain lines with counts and the time left (every 30 s)."""
    if sys.stdout.isatty():
        return True
    return lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


def _progress_log() -> None:
    """Long builds (a network of 10⁶ agents) report their steps on stderr, one plain line each."""
    import logging

    class _Line(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            err.print(f"privdl: {record.getMessage()}", markup=False, highlight=False, soft_wrap=True)

    logger = logging.getLogger("privdl.network")
    if not logger.handlers:
        logger.addHandler(_Line())
        logger.setLevel(logging.INFO)


def main() -> None:
    import warnings

    warnings.showwarning = _warning_line
    _progress_log()
    app()


if __name__ == "__main__":
    main()
