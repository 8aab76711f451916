"""Plots of an experiment directory: metric vs iteration, and final metric vs each swept parameter (mean ± std
over seeds). Runs where a swept parameter does not apply (e.g. ε of a non-private run) are drawn as a horizontal
reference line on the parameter plots."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from privdl.errors import ConfigError  # noqa: E402
from privdl.experiment.store import read_results  # noqa: E402


def _num(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


def axis_title(axis: str) -> str:
    """Short name of a sweep axis: 'mechanism.name' -> 'mechanism', 'mechanism.epsilon' -> 'epsilon'."""
    section, _, key = axis.rpartition(".")
    return section if key == "name" and section else key


def _label(keys: list[str], values: tuple[str, ...]) -> str:
    return ", ".join(f"{axis_title(k)}={'n/a' if v == '' else v}" for k, v in zip(keys, values)) or "all runs"


def _mean_std(vals: list[float]) -> tuple[float, float]:
    a = np.asarray(vals, dtype=float)
    return float(a.mean()), float(a.std(ddof=0))


def plot_experiment(out: str | Path) -> list[Path]:
    """Draw PNGs under DIR/plots/ from DIR/results.csv; returns the files written."""
    out = Path(out)
    path = out / "results.csv"
    if not path.is_file():
        raise ConfigError(f"{path} not found: run the experiment first (privdl run CONFIG --out {out})")
    fields, rows = read_results(path)
    axes = [f for f in fields if f not in ("run_id", "iteration", "metric", "value")]
    groups = [a for a in axes if a != "seed"]
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    written: list[Path] = []
    metrics = sorted({r["metric"] for r in rows})
    final_iter = max(int(r["iteration"]) for r in rows)
    log_metrics = {"optimality_gap", "consensus_distance"}
    for metric in metrics:
        mrows = [r for r in rows if r["metric"] == metric]
        # --- metric vs iteration, one curve per combination of non-seed axes
        curves: dict[tuple[str, ...], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in mrows:
            curves[tuple(r[a] for a in groups)][int(r["iteration"])].append(float(r["value"]))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key in sorted(curves):
            its = sorted(curves[key])
            ms = np.array([_mean_std(curves[key][t]) for t in its])
            ax.plot(its, ms[:, 0], label=_label(groups, key))
            ax.fill_between(its, ms[:, 0] - ms[:, 1], ms[:, 0] + ms[:, 1], alpha=0.2)
        ax.set_xlabel("iteration")
        ax.set_ylabel(metric)
        if metric in log_metrics and all(float(r["value"]) > 0 for r in mrows):
            ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.set_title(f"{metric} vs iteration (mean ± std over seeds)")
        fig.tight_layout()
        p = plots / f"{metric}_vs_iteration.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
        # --- final metric vs each numeric swept axis
        final = [r for r in mrows if int(r["iteration"]) == final_iter]
        for axis in groups:
            xs = [_num(r[axis]) for r in final if r[axis] != ""]
            if not xs or any(x is None for x in xs) or len(set(xs)) < 2:
                continue
            others = [a for a in groups if a != axis]
            series: dict[tuple[str, ...], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
            flat: dict[tuple[str, ...], list[float]] = defaultdict(list)
            for r in final:
                key = tuple(r[a] for a in others)
                if r[axis] == "":
                    flat[key].append(float(r["value"]))
                else:
                    series[key][float(r[axis])].append(float(r["value"]))
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for key in sorted(series):
                xv = sorted(series[key])
                ms = np.array([_mean_std(series[key][x]) for x in xv])
                ax.errorbar(xv, ms[:, 0], yerr=ms[:, 1], marker="o", capsize=3, label=_label(others, key))
            for key in sorted(flat):
                m, s = _mean_std(flat[key])
                line = ax.axhline(m, linestyle="--", label=_label(others, key) + f" ({axis.split('.')[-1]} n/a)")
                ax.axhspan(m - s, m + s, color=line.get_color(), alpha=0.1)
            ax.set_xlabel(axis)
            ax.set_ylabel(f"final {metric} (iteration {final_iter})")
            if max(xs) / max(min(xs), 1e-300) > 20 and min(xs) > 0:
                ax.set_xscale("log")
            if metric in log_metrics and all(float(r["value"]) > 0 for r in final):
                ax.set_yscale("log")
            ax.legend(fontsize=7)
            ax.set_title(f"final {metric} vs {axis} (mean ± std over seeds)")
            fig.tight_layout()
            p = plots / f"{metric}_vs_{axis.replace('.', '_')}.png"
            fig.savefig(p, dpi=110)
            plt.close(fig)
            written.append(p)
    return written


__all__ = ["plot_experiment"]
