"""Plots: one drawing function (:func:`draw`: series of mean ± std, horizontal reference lines) used by experiment
plots and by every reproduction figure.

:func:`plot_experiment` draws, from DIR/results.csv, each metric versus iteration and each final metric versus every
numeric sweep axis (mean ± std over seeds). Runs where a swept parameter does not apply (e.g. ε of a non-private run)
are drawn as a horizontal reference line on the parameter plots."""

from __future__ import annotations

import json
import math
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from privdl.errors import ConfigError
from privdl.experiment.store import read_results
from privdl.experiment.summary import mean_std, number, sort_key

if TYPE_CHECKING:
    import matplotlib.figure

#: whether this process selected matplotlib's Agg backend (:func:`_pyplot`)
_AGG = False


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files, no display), imported when something is first drawn — not
    when this module is: the run command's table of final metrics reads this module's names, and ``privdl run
    --no-plot`` never draws (matplotlib is 0.4–1 s of its launcher's start). The backend is selected once, before
    the first figure, as the module's import did."""
    global _AGG
    import matplotlib

    if not _AGG:
        matplotlib.use("Agg")
        _AGG = True
    import matplotlib.pyplot as plt

    return plt


#: communication cost (payload bytes since the start): in results.csv and the manifest, not drawn or tabled
COST_METRICS = ("bytes_sent", "bytes_received")
#: metrics drawn on a log scale when positive
LOG_METRICS = {"optimality_gap", "consensus_distance", "trace", "msd"}

#: human names of sweep axes and metrics (anything else: its last key, underscores as spaces)
LABELS = {
    "mechanism.epsilon": "ε", "mechanism.delta": "δ", "mechanism.clip": "clipping norm C",
    "mechanism.lot_size": "lot size", "mechanism.name": "mechanism", "mechanism.design": "design",
    "mechanism.p": "p", "schedule.eta": "step size η", "schedule.name": "schedule", "network.n": "agents n",
    "network.p": "edge probability p", "network.topology": "topology", "algorithm.name": "algorithm",
    "task.name": "task", "iterations": "iterations T", "seed": "seed", "iteration": "iteration",
    "optimality_gap": "optimality gap (1/n)Σ F(x_i) − F*", "local_optimality_gap": "local optimality gap (1/n)Σ f_i(x_i) − F*",
    "consensus_distance": "consensus distance", "test_accuracy": "test accuracy", "test_loss": "test loss",
    "train_loss": "training loss", "msd": "MSD", "msd_db": "MSD (dB)", "eavesdropper_msd": "eavesdropper MSD",
}
#: series styles: colour, line style and marker all change, so series that lie on top of each other stay visible
STYLES = [("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 1)), "P")]
REFERENCE_STYLES = [("black", (0, (6, 3))), ("dimgray", (0, (2, 2))), ("gray", (0, (6, 2, 1, 2)))]
#: a legend with more entries than this, or with an entry longer than LEGEND_LABEL characters, goes right of the axes
#: (it would cover the data inside them); its labels are wrapped to LEGEND_LABEL characters a line
LEGEND_INSIDE, LEGEND_LABEL = 2, 32
#: characters of title (12 pt) per inch of figure width, of axis label (10 pt) per inch of its side
TITLE_CHARS, LABEL_CHARS = 9.5, 11.0


def label(key: str) -> str:
    """The human name of a sweep axis or metric ('mechanism.epsilon' -> 'ε')."""
    if key in LABELS:
        return LABELS[key]
    return axis_title(key).replace("_", " ")


def _coinciding(series: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[float] | None]]) -> dict[int, int]:
    """Series k → an earlier series j with the same x values and means (to 1e-9 relative): drawn on top of it."""
    same: dict[int, int] = {}
    for k, (_, xs, ms, _) in enumerate(series):
        for j in range(k):
            _, xj, mj, _ = series[j]
            if list(xs) == list(xj) and all(abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)
                                            for a, b in zip(ms, mj)):
                same[k] = same.get(j, j)
                break
    return same


def _caption(fig, caption: str, height: float) -> None:
    """``caption`` in 7 pt under the axes (about 16 characters an inch), then the layout above it."""
    bottom = 0.0
    if caption:
        text = textwrap.fill(caption, int(fig.get_size_inches()[0] * 16))
        fig.text(0.01, 0.01, text, fontsize=7, ha="left", va="bottom")
        bottom = ((text.count("\n") + 1) * 7 * 1.25 / 72 + 0.1) / height
    fig.tight_layout(rect=(0, bottom, 1, 1))


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def draw(path: Path, series: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[float] | None]], *,
         xlabel: str, ylabel: str, title: str, logx: bool = False, logy: bool = False,
         references: Sequence[tuple[str, float, float]] = (), band: bool = True, markers: bool = True,
         size: tuple[float, float] = (7, 4.5), caption: str = "") -> Path:
    """One figure: each series (label, xs, means, stds or None) as a line (with a ±std band, or error bars when
    ``band`` is false) in its own colour, line style and marker; each reference (label, mean, std) as a grey dashed
    horizontal line with its band (never a series' colour). A series that coincides with an earlier one says so in
    the legend. ``caption`` is written under the axes (δ, unit, accountant)."""
    return _save(figure(series, xlabel=xlabel, ylabel=ylabel, title=title, logx=logx, logy=logy,
                        references=references, band=band, markers=markers, size=size, caption=caption), path)


def scatter(path: Path, groups: Sequence[tuple[str, Sequence[float], Sequence[float], str]], *, xlabel: str,
            ylabel: str, title: str, caption: str = "", size: tuple[float, float] = (6.4, 5.0)) -> Path:
    """Points: each group (label, xs, ys, marker) in its own colour, equal axis scales (a map)."""
    fig, ax = _pyplot().subplots(figsize=size)
    for name, xs, ys, marker in groups:
        ax.scatter(xs, ys, marker=marker, s=40 if marker in "s*" else 22, label=name)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_title(textwrap.fill(title, int(size[0] * TITLE_CHARS)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.set_size_inches(size[0] + 2.6, size[1])
    _caption(fig, caption, size[1])
    return _save(fig, path)


def histograms(path: Path, panels: Sequence[tuple[str, Sequence[tuple[str, Sequence[float]]]]], *, xlabel: str,
               title: str, caption: str = "", bins: int = 40) -> Path:
    """One panel per (title, [(label, values), ...]): the groups' histograms (densities) overlaid on shared bins."""
    import numpy as np

    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    fig, axes = _pyplot().subplots(rows, cols, figsize=(3.4 * cols, 2.9 * rows + 0.6), squeeze=False)
    for ax, (name, groups) in zip(axes.flat, panels):
        values = np.concatenate([np.asarray(v, dtype=float) for _, v in groups])
        values = values[np.isfinite(values)]
        edges = np.histogram_bin_edges(values, bins=bins) if values.size else bins
        for label, v in groups:
            v = np.asarray(v, dtype=float)
            ax.hist(v[np.isfinite(v)], bins=edges, density=True, alpha=0.5, label=label)
        ax.set_title(textwrap.fill(name, 40), fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(textwrap.fill(title, int(3.4 * cols * TITLE_CHARS)), fontsize=10)
    _caption(fig, caption, 2.9 * rows + 0.6)
    return _save(fig, path)


def figure(series: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[float] | None]], *,
           xlabel: str, ylabel: str, title: str, logx: bool = False, logy: bool = False,
           references: Sequence[tuple[str, float, float]] = (), band: bool = True, markers: bool = True,
           size: tuple[float, float] = (7, 4.5), caption: str = "") -> "matplotlib.figure.Figure":
    """The figure :func:`draw` saves (the caller closes it)."""
    fig, ax = _pyplot().subplots(figsize=size)
    same = _coinciding(series)
    every = None
    for k, (name, xs, ms, ss) in enumerate(series):
        ls, mk = STYLES[k % len(STYLES)]
        if len(xs) > 30:
            every = max(1, len(xs) // 12)
        if k in same:
            name = f"{name} (coincides with {series[same[k]][0]})"
        if band or ss is None:
            line, = ax.plot(xs, ms, linestyle=ls, marker=mk if markers or len(series) > 1 else None, ms=3.5,
                            markevery=every, label=name)
            if ss is not None:
                ax.fill_between(xs, [m - s for m, s in zip(ms, ss)], [m + s for m, s in zip(ms, ss)],
                                color=line.get_color(), alpha=0.15)
        else:
            ax.errorbar(xs, ms, yerr=ss, linestyle=ls, marker=mk, ms=3.5, capsize=3, label=name)
    for k, (name, m, s) in enumerate(references):
        color, ls = REFERENCE_STYLES[k % len(REFERENCE_STYLES)]
        ax.axhline(m, color=color, linestyle=ls, linewidth=1.2, label=name)
        ax.axhspan(m - s, m + s, color=color, alpha=0.08)
    handles, names = ax.get_legend_handles_labels()
    outside = len(names) > LEGEND_INSIDE or any(len(n) > LEGEND_LABEL for n in names)
    if outside:  # room for the legend right of the axes (7 pt: ≈ 0.065 in a character), the axes keep their size
        fig.set_size_inches(size[0] + 0.6 + 0.065 * min(LEGEND_LABEL, max(map(len, names))), size[1])
    ax.set_title(textwrap.fill(title, int(size[0] * TITLE_CHARS)))  # centred over the axes: their width
    ax.set_xlabel(textwrap.fill(xlabel, int(size[0] * LABEL_CHARS)))
    ax.set_ylabel(textwrap.fill(ylabel, int(size[1] * LABEL_CHARS)))
    if logx:
        ax.set_xscale("log")
        _log_ticks(ax.xaxis, ax.get_xlim())
    if logy:
        ax.set_yscale("log")
        _log_ticks(ax.yaxis, ax.get_ylim())
    ax.grid(alpha=0.3)
    if outside:
        ax.legend(handles, [textwrap.fill(n, LEGEND_LABEL) for n in names], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    elif names:
        ax.legend(fontsize=7)
    _caption(fig, caption, size[1])
    return fig


def _log_ticks(axis, limits: tuple[float, float]) -> None:
    """At least three labelled ticks on a log axis: matplotlib labels only powers of ten, so an axis spanning less
    than about three decades shows one or two labels, or none; there 1-2-5 of each decade are labelled (below one
    decade: evenly spaced round numbers), as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    lo, hi = sorted(limits)
    if not lo > 0:
        return
    decades = math.log10(hi / lo)
    if decades >= 3.0:
        return
    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)) if decades >= 1.0
                           else MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10], min_n_ticks=3))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
    axis.set_minor_formatter(NullFormatter())


def axis_title(axis: str) -> str:
    """Short name of a sweep axis: 'mechanism.name' -> 'mechanism', 'mechanism.epsilon' -> 'epsilon'."""
    section, _, key = axis.rpartition(".")
    return section if key == "name" and section else key


def _label(keys: list[str], values: tuple[str, ...]) -> str:
    return ", ".join(f"{label(k)}={'n/a' if v == '' else v}" for k, v in zip(keys, values)) or "all runs"


def privacy_caption(out: Path) -> str:
    """What the runs under ``out`` guarantee, from their manifests' ledgers: unit, accountant and δ of the private
    runs, and whether some runs have no DP guarantee."""
    kinds: set[tuple[str, str, str]] = set()
    none: set[str] = set()
    for man_path in sorted((out / "runs").glob("*/manifest.json")):
        try:
            man = json.loads(man_path.read_text())
        except (OSError, ValueError):
            continue
        for led in man.get("privacy_ledger") or []:
            eps = led.get("epsilon")
            if eps is None or not math.isfinite(float(eps)):
                none.add(str(led.get("mechanism", "none")))
            else:
                kinds.add((str(led.get("unit", "?")), str(led.get("accountant", "?")), f"{float(led['delta']):g}"))
    parts = [f"{unit}-level (ε, δ)-DP, accountant {acc}, δ = {delta}" for unit, acc, delta in sorted(kinds)]
    if none:
        parts.append(f"no DP guarantee for the runs with mechanism {', '.join(sorted(none))}")
    return "privacy: " + "; ".join(parts) if parts else ""


def plot_experiment(out: str | Path) -> list[Path]:
    """Draw PNGs under DIR/plots/ from DIR/results.csv; returns the files written. An experiment that sweeps the
    task gets one set of plots per task (their metrics do not share an axis)."""
    out = Path(out)
    path = out / "results.csv"
    if not path.is_file():
        raise ConfigError(f"{path} not found: run the experiment first (privdl run CONFIG --out {out})")
    fields, rows = read_results(path)
    if not rows:
        what = "only a header line" if fields else "nothing (an empty file)"
        raise ConfigError(f"{path} holds {what}: no run has finished there yet, so there is nothing to plot — "
                          f"`privdl run CONFIG --out {out}` runs (or resumes) the experiment and rewrites it")
    axes = [f for f in fields if f not in ("run_id", "iteration", "metric", "value")]
    caption = privacy_caption(out)
    task_axis = next((a for a in ("task", "task.name") if a in axes and len({r[a] for r in rows}) > 1), None)
    if task_axis is None:
        return _plot_rows(out / "plots", rows, [a for a in axes if a != "seed"], caption, "")
    written: list[Path] = []
    for task in sorted({r[task_axis] for r in rows}):
        written += _plot_rows(out / "plots", [r for r in rows if r[task_axis] == task],
                              [a for a in axes if a not in ("seed", task_axis)], caption, task)
    return written


def _plot_rows(plots: Path, rows: list[dict[str, str]], groups: list[str], caption: str, task: str) -> list[Path]:
    written: list[Path] = []
    prefix, where = (f"{task}_", f" — {task}") if task else ("", "")
    final_iter = max(int(r["iteration"]) for r in rows)
    for metric in sorted({r["metric"] for r in rows} - set(COST_METRICS)):
        mrows = [r for r in rows if r["metric"] == metric]
        positive = all(float(r["value"]) > 0 for r in mrows)
        logy = metric in LOG_METRICS and positive
        curves: dict[tuple[str, ...], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in mrows:
            curves[tuple(r[a] for a in groups)][int(r["iteration"])].append(float(r["value"]))
        if len({t for c in curves.values() for t in c}) > 1:
            series = []
            for key in sorted(curves, key=sort_key):
                its = sorted(curves[key])
                ms = [mean_std(curves[key][t]) for t in its]
                series.append((_label(groups, key), its, [m for m, _ in ms], [s for _, s in ms]))
            written.append(draw(plots / f"{prefix}{metric}_vs_iteration.png", series, xlabel="iteration",
                                ylabel=label(metric), title=f"{label(metric)} vs iteration{where} (mean ± std over seeds)",
                                logy=logy, markers=False, caption=caption))
        final = [r for r in mrows if int(r["iteration"]) == final_iter]
        for axis in groups:
            xs = [number(r[axis]) for r in final if r[axis] != ""]
            if not xs or any(x is None for x in xs) or len(set(xs)) < 2:
                continue
            others = [a for a in groups if a != axis]
            at: dict[tuple[str, ...], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
            flat: dict[tuple[str, ...], list[float]] = defaultdict(list)
            for r in final:
                key = tuple(r[a] for a in others)
                (flat[key] if r[axis] == "" else at[key][float(r[axis])]).append(float(r["value"]))
            series = []
            for key in sorted(at, key=sort_key):
                xv = sorted(at[key])
                ms = [mean_std(at[key][x]) for x in xv]
                series.append((_label(others, key), xv, [m for m, _ in ms], [s for _, s in ms]))
            refs = [(_label(others, key) + f" ({label(axis)} n/a)", *mean_std(v))
                    for key, v in sorted(flat.items(), key=lambda kv: sort_key(kv[0]))]
            written.append(draw(plots / f"{prefix}{metric}_vs_{axis.replace('.', '_')}.png", series, references=refs,
                                band=False, xlabel=label(axis), ylabel=f"final {label(metric)} (iteration {final_iter})",
                                title=f"final {label(metric)} vs {label(axis)}{where} (mean ± std over seeds)",
                                logx=max(xs) / max(min(xs), 1e-300) > 20 and min(xs) > 0,
                                logy=metric in LOG_METRICS and all(float(r["value"]) > 0 for r in final),
                                caption=caption))
    return written


__all__ = ["axis_title", "draw", "figure", "label", "plot_experiment", "privacy_caption"]
