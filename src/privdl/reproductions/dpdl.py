"""Our DPDL benchmark (seed 003's own experiments are not available), through the ordinary runner: ``dpdl.toml``
(DPDL as published, with self-noise, without calibration, with the prose reading of the calibration, DP-DSGD,
DP-DSGT; ε ∈ {1, 3, 10} and non-private), CGA (non-private), and DPDL's α / β sensitivity on one cell.

Outputs: ``dpdl_summary.csv`` (final test accuracy mean ± std per dataset, graph, split, ε and method, with each
run's privacy statement), ``dpdl_vs_baselines.md`` (DPDL minus the better of DP-DSGD and DP-DSGT per cell, in
points), ``dpdl_sensitivity.csv``. Runs resume; ``--shard I/K`` splits the grid over processes.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np

from privdl.errors import ValidationError
from privdl.privacy.ledger import Ledger
from privdl.reproductions.common import (
    REPRODUCTIONS, collecting, finished_runs, packaged_config, run, with_overrides, write_csv,
)
from privdl.reproductions.dp_dec import parse_shard

ALPHAS = (0.0, 0.5, 1.0, 2.0)
BETAS = (0.0, 0.5, 0.9)


def _epsilon_label(r) -> str:
    if r.config.get("mechanism", {}).get("name", "none") == "none":
        return "inf"
    return f"{float(r.config['mechanism']['epsilon']):g}"


def _statement(r) -> str:
    led = r.ledger
    eps = led.get("epsilon")
    if isinstance(eps, (int, float)) and math.isfinite(eps):
        return f"({eps:.3g}, {led['delta']:g})-DP per example"
    if led.get("unit") not in (None, "none"):  # a DP mechanism ran, but some accesses were not noised
        alone = Ledger.from_dict(led).protected_only().epsilon
        if alone is not None and math.isfinite(alone):
            return f"none (un-noised self-gradient; cross-gradients alone ε = {alone:.3g})"
    return led.get("guarantee", "none")


def summarise(done, keys: tuple[str, ...]) -> list[dict]:
    """Final test accuracy mean ± std over seeds per cell (``keys`` of the sweep) and method."""
    groups: dict[tuple, list] = {}
    for r in done:
        cell = tuple(_epsilon_label(r) if k == "epsilon" else r.sweep.get(k) for k in keys)
        groups.setdefault(cell, []).append(r)
    rows = []
    for cell, runs in sorted(groups.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        acc = np.array([r.final.get("test_accuracy", math.nan) for r in runs], dtype=float)
        rows.append({**dict(zip(keys, cell)), "runs": len(runs), "accuracy_mean": float(np.nanmean(acc)),
                     "accuracy_std": float(np.nanstd(acc)), "privacy": _statement(runs[0])})
    return rows


def _versus(rows: list[dict]) -> list[str]:
    """Per cell: DPDL (published and with self-noise) minus the best of DP-DSGD and DP-DSGT (at η and at DPDL's
    effective 10 η), in points."""
    cells: dict[tuple, dict[str, float]] = {}
    for r in rows:
        cells.setdefault((r["data"], r["graph"], r["split"], r["epsilon"]), {})[r["method"]] = r["accuracy_mean"]
    lines = ["| dataset | graph | split | ε | DPDL | DPDL self-noise | best baseline | Δ published | Δ self-noise |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (ds, graph, split, eps), m in sorted(cells.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        baselines = [k for k in ("DP-DSGD", "DP-DSGT", "DP-DSGD 10eta", "DP-DSGT 10eta") if k in m]
        base = max((m[k], k) for k in baselines) if baselines else (math.nan, "—")
        pub, sn = m.get("DPDL", math.nan), m.get("DPDL self-noise", math.nan)
        lines.append(f"| {ds} | {graph} | {split} | {eps} | {100 * pub:.1f} | {100 * sn:.1f} | "
                     f"{100 * base[0]:.1f} ({base[1]}) | {100 * (pub - base[0]):+.1f} | {100 * (sn - base[0]):+.1f} |")
    return lines


@REPRODUCTIONS.register("dpdl")
def dpdl(out: Path, *, seeds: int = 3, iterations: int | None = None, dataset: str | None = None,
         epsilons: tuple[float, ...] | None = None, methods: tuple[str, ...] | None = None, device: str = "cpu",
         shard: str | None = None, progress: bool = False, graphs: tuple[str, ...] | None = None,
         splits: tuple[str, ...] | None = None, collect: bool = False, **_: object) -> list[dict]:
    """The benchmark grid of ``dpdl.toml`` (options restrict it: ``dataset``, ``epsilons``, ``methods``, ``graphs``,
    ``splits`` by label), CGA non-private, and — when ``methods`` is not restricted — DPDL's α/β sensitivity on the
    first dataset, graph and split at ε = 3. ``collect``: start no run, write the tables from the finished
    ones."""
    with collecting(collect):
        return _dpdl(Path(out), seeds=seeds, iterations=iterations, dataset=dataset, epsilons=epsilons,
                     methods=methods, device=device, shard=shard, progress=progress, graphs=graphs, splits=splits)


def _dpdl(out: Path, *, seeds: int, iterations: int | None, dataset: str | None, epsilons: tuple[float, ...] | None,
          methods: tuple[str, ...] | None, device: str, shard: str | None, progress: bool,
          graphs: tuple[str, ...] | None, splits: tuple[str, ...] | None) -> list[dict]:
    out = Path(out)
    cfg = packaged_config("dpdl")
    over: dict[str, object] = {"seeds": int(seeds), "device": device}
    if iterations:
        over |= {"iterations": int(iterations), "eval_every": max(1, int(iterations) // 4)}
    if dataset:
        data = [b for b in cfg["sweep"]["data"] if b["task"]["dataset"] == dataset]
        if not data:
            raise ValidationError(f"unknown dataset {dataset!r} for dpdl; choose from "
                                  f"{[b['task']['dataset'] for b in cfg['sweep']['data']]}")
        over["sweep.data"] = data
    if epsilons:
        over["sweep.mechanism.epsilon"] = [float(e) for e in epsilons]
    if methods:
        known = [m["label"] for m in cfg["sweep"]["method"]] + ["CGA"]
        unknown = sorted(set(methods) - set(known))
        if unknown:
            raise ValidationError(f"unknown method(s) {unknown} for dpdl; choose from {known}")
        over["sweep.method"] = [m for m in cfg["sweep"]["method"] if m["label"] in methods]
    for axis, wanted in (("graph", graphs), ("split", splits)):
        if wanted:
            labels = [b["label"] for b in cfg["sweep"][axis]]
            if set(wanted) - set(labels):
                raise ValidationError(f"unknown {axis}(s) {sorted(set(wanted) - set(labels))}; choose from {labels}")
            over[f"sweep.{axis}"] = [b for b in cfg["sweep"][axis] if b["label"] in wanted]
    cfg = with_overrides(cfg, over)
    part = parse_shard(shard)
    if cfg["sweep"]["method"]:
        run(cfg, out / "runs_dpdl", progress=progress, shard=part)
    if not methods or "CGA" in methods:
        cga = copy.deepcopy(cfg)
        cga["mechanism"] = {"name": "none"}  # non-private: no DP keys, no ε axis
        for axis in ("mechanism.name", "mechanism.epsilon"):
            cga["sweep"].pop(axis, None)
        cga["sweep"]["method"] = [{"label": "CGA", "algorithm": {"name": "cga"}}]
        run(cga, out / "runs_cga", progress=progress, shard=part)
    if not methods:
        _sensitivity(cfg, out, progress, part)
    keys = ("data", "graph", "split", "epsilon", "method")
    done = [r for d in ("runs_dpdl", "runs_cga") if (out / d).is_dir() for r in finished_runs(out / d)]
    rows = summarise(done, keys)
    write_csv(out / "dpdl_summary.csv", rows)
    (out / "dpdl_vs_baselines.md").write_text("\n".join(_versus(rows)) + "\n")
    if (out / "runs_dpdl_sensitivity").is_dir():
        write_csv(out / "dpdl_sensitivity.csv", summarise(finished_runs(out / "runs_dpdl_sensitivity"), keys))
    return rows


def _sensitivity(cfg: dict, out: Path, progress: bool, part) -> None:
    sens = copy.deepcopy(cfg)
    sens["sweep"] = {"data": [cfg["sweep"]["data"][0]], "mechanism.name": ["dp_sgd"],
                     "mechanism.epsilon": [3.0], "graph": [cfg["sweep"]["graph"][0]],
                     "split": [cfg["sweep"]["split"][0]],
                     "method": [{"label": f"DPDL alpha={a:g} beta={b:g}", "algorithm": {"name": "dpdl", "alpha": a,
                                                                                       "beta": b}}
                                for a in ALPHAS for b in BETAS]}
    run(sens, out / "runs_dpdl_sensitivity", progress=progress, shard=part)


__all__ = ["dpdl", "summarise"]
