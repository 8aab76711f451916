"""Plots: one drawing function (:func:`draw`: series of mean ± std, horizontal reference lines) used by experiment
plots and by every reproduction figure.

:func:`plot_experiment` draws, from DIR/results.csv, each metric versus iteration and each final metric versus every
numeric sweep axis (mean ± std over seeds). Runs where a swept parameter does not apply (e.g. ε of a non-private run)
are drawn as a horizontal reference line on the parameter plots."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from privdl.errors import ConfigError  # noqa: E402
from privdl.experiment.store import read_results  # noqa: E402
from privdl.experiment.summary import mean_std, number, sort_key  # noqa: E402

#: metrics drawn on a log scale when positive
LOG_METRICS = {"optimality_gap", "consensus_distance", "trace", "msd"}


def draw(path: Path, series: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[float] | None]], *,
         xlabel: str, ylabel: str, title: str, logx: bool = False, logy: bool = False,
         references: Sequence[tuple[str, float, float]] = (), band: bool = True, markers: bool = True,
         size: tuple[float, float] = (7, 4.5)) -> Path:
    """One figure: each series (label, xs, means, stds or None) as a line (with a ±std band, or error bars when
    ``band`` is false), each reference (label, mean, std) as a dashed horizontal line with its band."""
    fig, ax = plt.subplots(figsize=size)
    for label, xs, ms, ss in series:
        if band or ss is None:
            line, = ax.plot(xs, ms, marker="o" if markers else None, ms=3, label=label)
            if ss is not None:
                ax.fill_between(xs, [m - s for m, s in zip(ms, ss)], [m + s for m, s in zip(ms, ss)],
                                color=line.get_color(), alpha=0.2)
        else:
            ax.errorbar(xs, ms, yerr=ss, marker="o", ms=3, capsize=3, label=label)
    for label, m, s in references:
        line = ax.axhline(m, linestyle="--", label=label)
        ax.axhspan(m - s, m + s, color=line.get_color(), alpha=0.1)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def axis_title(axis: str) -> str:
    """Short name of a sweep axis: 'mechanism.name' -> 'mechanism', 'mechanism.epsilon' -> 'epsilon'."""
    section, _, key = axis.rpartition(".")
    return section if key == "name" and section else key


def _label(keys: list[str], values: tuple[str, ...]) -> str:
    return ", ".join(f"{axis_title(k)}={'n/a' if v == '' else v}" for k, v in zip(keys, values)) or "all runs"


def plot_experiment(out: str | Path) -> list[Path]:
    """Draw PNGs under DIR/plots/ from DIR/results.csv; returns the files written."""
    out = Path(out)
    path = out / "results.csv"
    if not path.is_file():
        raise ConfigError(f"{path} not found: run the experiment first (privdl run CONFIG --out {out})")
    fields, rows = read_results(path)
    if not rows:
        return []
    axes = [f for f in fields if f not in ("run_id", "iteration", "metric", "value")]
    groups = [a for a in axes if a != "seed"]
    plots = out / "plots"
    written: list[Path] = []
    final_iter = max(int(r["iteration"]) for r in rows)
    for metric in sorted({r["metric"] for r in rows}):
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
            written.append(draw(plots / f"{metric}_vs_iteration.png", series, xlabel="iteration", ylabel=metric,
                                title=f"{metric} vs iteration (mean ± std over seeds)", logy=logy, markers=False))
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
            refs = [(_label(others, key) + f" ({axis_title(axis)} n/a)", *mean_std(v))
                    for key, v in sorted(flat.items(), key=lambda kv: sort_key(kv[0]))]
            written.append(draw(plots / f"{metric}_vs_{axis.replace('.', '_')}.png", series, references=refs,
                                band=False, xlabel=axis, ylabel=f"final {metric} (iteration {final_iter})",
                                title=f"final {metric} vs {axis} (mean ± std over seeds)",
                                logx=max(xs) / max(min(xs), 1e-300) > 20 and min(xs) > 0,
                                logy=metric in LOG_METRICS and all(float(r["value"]) > 0 for r in final)))
    return written


__all__ = ["axis_title", "draw", "plot_experiment"]
