"""Seed 002 (dual privacy protection): Fig. 1, adaptive filtering, and Fig. 3, target localization — through the
ordinary runner (configs ``rms_filtering.toml``, ``rms_localization.toml``), 50 / 100 runs per curve stacked on the
replica axis.

Outputs: ``*_curves.csv`` (mean MSD in dB per recorded round, method and panel, and the eavesdroppers' errors),
``*_summary.csv`` (steady-state MSD in dB per method before and after the switch, eavesdropper errors at the end),
one PNG per panel, and for Fig. 1(c) one run's ψ_{1,1}(n), w_{1,1}(n−1), ψ^c_{1,1}(n) at agent 1 beside the
eavesdroppers' sliding averages (``rms_filtering_c.csv`` / ``.png``); for Fig. 3, (a) the field — anchors, target,
the agents' final estimates and what an eavesdropper places there (``rms_localization_a``) — and (c) the values at
agent 1 beside DSG-RMS's and PD-LMS's eavesdroppers (``rms_localization_c.csv``, one PNG per coordinate).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from privdl.comm.eavesdropper import Eavesdropper
from privdl.comm.observers import Transcript
from privdl.experiment.build import build
from privdl.experiment.config import expand
from privdl.experiment.plot import draw, scatter
from privdl.experiment.store import ResultStore
from privdl.reproductions.common import (
    REPRODUCTIONS, finished_runs, packaged_config, run, with_overrides, write_csv,
)
from privdl.simulator import simulate
from privdl.tasks.streaming import decibels as _db

METHODS = ("DSG", "EDSG", "DSG-RMS", "EDSG-RMS", "PD-LMS", "PSGT")


def _curves(out: Path, done, panel_keys: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """Per (panel, method): the mean over runs of every metric per recorded round, and the steady-state summary."""
    store = ResultStore(out)
    groups: dict[tuple, list] = {}
    for r in done:
        groups.setdefault(tuple(r.sweep.get(k) for k in panel_keys) + (r.sweep["method"],), []).append(r)
    curves, summary = [], []
    for key, runs in groups.items():
        series: dict[str, dict[int, list[float]]] = {}
        for r in runs:
            for t, m, v in store.load_rows(r.run_id):
                series.setdefault(m, {}).setdefault(t, []).append(v)
        iterations = sorted(series["msd"])
        label = dict(zip(panel_keys + ("method",), key))
        for t in iterations:
            row = {**label, "iteration": t, "runs": len(series["msd"][t])}
            for m in ("msd", "eavesdropper_msd", "adaptive_eavesdropper_msd", "grad_norm_sq_avg"):
                if m in series and t in series[m]:
                    row[m] = float(np.mean(series[m][t]))
            row["msd_db"] = _db(row["msd"])
            curves.append(row)
        cfg = runs[0].config
        T, switch = cfg["iterations"], cfg["task"].get("switch_at", 0)

        def steady(lo: int, hi: int, metric: str = "msd") -> float:
            vals = [np.mean(series[metric][t]) for t in iterations if lo < t <= hi and t in series.get(metric, {})]
            return _db(float(np.mean(vals))) if vals else math.nan

        tail = max(1, (switch or T) // 5)
        row = {**label, "runs": len(runs),
               "steady_msd_db": steady(T - tail, T),
               "eavesdropper_msd_db": steady(T - tail, T, "eavesdropper_msd"),
               "adaptive_eavesdropper_msd_db": steady(T - tail, T, "adaptive_eavesdropper_msd"),
               "guarantee": runs[0].ledger["guarantee"]}
        row["final_msd_db"] = _db(float(np.mean(series["msd"][iterations[-1]])))
        if switch:
            row["steady_msd_db_before_switch"] = steady(switch - tail, switch)
            row["msd_db_at_switch"] = _db(float(np.mean(series["msd"][max(t for t in iterations if t <= switch)])))
        summary.append(row)
    return curves, summary


def _plots(out: Path, name: str, curves: list[dict], panel_keys: tuple[str, ...], title: str) -> None:
    panels = sorted({tuple(c[k] for k in panel_keys) for c in curves}, key=str)
    for panel in panels:
        sel = [c for c in curves if tuple(c[k] for k in panel_keys) == panel]
        series = []
        for m in METHODS:
            pts = [c for c in sel if c["method"] == m]
            if pts:
                series.append((m, [c["iteration"] for c in pts], [c["msd_db"] for c in pts], None))
        tag = "_".join(f"{k.split('.')[-1]}={v}" for k, v in zip(panel_keys, panel))
        draw(out / f"{name}_{tag}.png", series, xlabel="iteration n", ylabel="MSD (dB)",
             title=f"{title} ({tag})", markers=False, size=(6.4, 4.0))


@REPRODUCTIONS.register("rms_filtering")
def rms_filtering(out: Path, *, seeds: int = 50, iterations: int | None = None, progress: bool = False,
                  **_: object) -> list[dict]:
    """Seed 002 Fig. 1 (a) homogeneous and (b) heterogeneous MSD curves for DSG, EDSG, DSG-RMS, EDSG-RMS, PD-LMS,
    PSGT with stochastic and exact gradients, and (c) one run's values at agent 1 with the eavesdroppers'."""
    out = Path(out)
    overrides: dict[str, object] = {"seeds": int(seeds)}
    if iterations:
        overrides |= {"iterations": int(iterations), "task.switch_at": int(iterations) // 2}
    cfg = with_overrides(packaged_config("rms_filtering"), overrides)
    runs_dir = run(cfg, out / "runs_rms_filtering", progress=progress)
    keys = ("task.heterogeneous", "task.exact_gradient")
    curves, summary = _curves(runs_dir, finished_runs(runs_dir), keys)
    write_csv(out / "rms_filtering_curves.csv", curves)
    write_csv(out / "rms_filtering_summary.csv", summary)
    _plots(out, "rms_filtering", curves, keys, "seed 002 Fig. 1")
    _panel_c(out, cfg)
    return summary


def _trace(cfg: dict, select: dict, method: str, agent: int = 0) -> tuple[list[dict], dict]:
    """One run (seed 0) of ``method`` in the panel ``select`` (sweep overrides), watched every round: per round, at
    agent k = ``agent``, w_k(n−1), the plain and the adaptive eavesdropper's sliding averages of k's transmissions
    and w*(n) (full vectors), and for the RMS methods ψ_k(n) (eq. (5c) solved for it) and the sent ψ^c_k(n); and at
    the end every agent's model and every sender's eavesdropper estimate."""
    one = with_overrides(cfg, {"seeds": [0], "eval_every": 1, **select,
                               "sweep.method": [m for m in cfg["sweep"]["method"] if m["label"] == method]})
    spec = expand(one)[0][0]
    c = build(spec.config)
    transcript = Transcript()
    window = spec.config.get("eavesdropper_window", 100)
    spy = Eavesdropper(c.network.n, window=window, target=c.task.optimum, wire=c.algorithm.wire)
    w: dict[int, torch.Tensor] = {}
    estimates: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def on_record(t: int, x: torch.Tensor) -> None:
        w[t] = x.clone()
        if t:
            estimates[t] = (spy.estimate(False).clone(), None if c.algorithm.wire is None else spy.estimate(True))

    T = spec.config["iterations"]
    simulate(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism, schedule=c.schedule,
             iterations=T, seed=spec.config["seed"], eval_every=1, metrics=False, observers=[transcript, spy],
             on_record=on_record)
    rms = c.algorithm.rms is not None
    W = torch.as_tensor(c.network.W)
    sent = {}
    for m in transcript.messages:  # ψ^c of every sender per round (the first transmission of the round)
        if m.t not in sent:
            per = torch.zeros(c.network.n, m.payload.shape[1], dtype=torch.float64)
            sent[m.t] = per.index_copy(0, m.src.long(), m.payload.to(torch.float64))
    rows = []
    nan = torch.full_like(w[0][agent], math.nan, dtype=torch.float64)
    for t in range(1, T + 1):
        row = {"iteration": t, "w_prev": w[t - 1][agent].to(torch.float64), "eavesdropper": estimates[t][0][agent],
               "adaptive_eavesdropper": nan if estimates[t][1] is None else estimates[t][1][agent],
               "w_star": c.task.optimum(t).to(torch.float64)}
        if rms:
            psi_c = sent[t]
            row["psi"] = w[t][agent] - W[agent] @ psi_c + psi_c[agent]  # eq. (5c) solved for ψ_k(n)
            row["psi_c"] = psi_c[agent]
        rows.append(row)
    final = {"models": w[T].to(torch.float64), "eavesdropper": estimates[T][0], "w_star": c.task.optimum(T)}
    return rows, final


def _panel_c(out: Path, cfg: dict, method: str = "DSG-RMS", agent: int = 0) -> None:
    """Fig. 1(c): one run (heterogeneous, stochastic gradients) of ``method``: ψ_{k,1}(n), w_{k,1}(n−1) and
    ψ^c_{k,1}(n) at agent k = 1, the plain and the adaptive eavesdropper's sliding averages of ψ^c_{k,1}, and w*_1."""
    trace, _ = _trace(cfg, {"sweep.task.heterogeneous": [True], "sweep.task.exact_gradient": [False]}, method,
                      agent)
    T = len(trace)
    step = max(1, T // 2000)
    keys = ("psi", "w_prev", "psi_c", "eavesdropper", "adaptive_eavesdropper", "w_star")
    rows = [{"iteration": r["iteration"], **{k: float(r[k][0]) for k in keys}} for r in trace
            if r["iteration"] % step == 0 or r["iteration"] == T]
    write_csv(out / "rms_filtering_c.csv", rows)
    xs = [r["iteration"] for r in rows]
    draw(out / "rms_filtering_c.png",
         [(f"{name} (agent 1, coordinate 1)", xs, [r[key] for r in rows], None)
          for name, key in (("ψ(n)", "psi"), ("w(n−1)", "w_prev"), ("ψᶜ(n) sent", "psi_c"),
                            ("eavesdropper's sliding average", "eavesdropper"),
                            ("adaptive eavesdropper (knows the law and τ)", "adaptive_eavesdropper"),
                            ("w*", "w_star"))],
         xlabel="iteration n", ylabel="value", title=f"seed 002 Fig. 1(c): {method}, one run", markers=False,
         size=(6.4, 4.0))


def _localization_panels(out: Path, cfg: dict, agent: int = 0) -> None:
    """Fig. 3(a): the field — anchors, target, every agent's final estimate and what the eavesdropper's sliding
    averages place there, for DSG-RMS, EDSG-RMS and PD-LMS (one run, stochastic gradients); Fig. 3(c): at agent 1,
    DSG-RMS's ψ, w and sent ψ^c, its eavesdroppers' averages, and PD-LMS's eavesdropper average, against w*
    (both coordinates)."""
    select = {"sweep.task.exact_gradient": [False]}
    traces = {m: _trace(cfg, select, m, agent) for m in ("DSG-RMS", "EDSG-RMS", "PD-LMS")}
    task = build(expand(with_overrides(cfg, {"seeds": [0], **select}))[0][0].config).task
    points = [("anchors (agents)", task.anchors[:, 0].tolist(), task.anchors[:, 1].tolist(), "s"),
              ("target w°", [float(task.target[0])], [float(task.target[1])], "*")]
    field_rows = [{"kind": "anchor", "agent": k + 1, "x": float(a[0]), "y": float(a[1])}
                  for k, a in enumerate(task.anchors)]
    field_rows.append({"kind": "target", "x": float(task.target[0]), "y": float(task.target[1])})
    for m, (_, final) in traces.items():
        for kind, key, marker in (("final estimates", "models", "o"), ("eavesdropper's averages", "eavesdropper",
                                                                        "x")):
            xy = final[key]
            points.append((f"{m}: {kind}", xy[:, 0].tolist(), xy[:, 1].tolist(), marker))
            field_rows += [{"kind": f"{m} {kind}", "agent": k + 1, "x": float(p[0]), "y": float(p[1])}
                           for k, p in enumerate(xy)]
    write_csv(out / "rms_localization_a.csv", field_rows)
    scatter(out / "rms_localization_a.png", points, xlabel="x", ylabel="y",
            title="seed 002 Fig. 3(a): anchors, target, estimates and what an eavesdropper places there (one run)",
            caption="eavesdropper: sliding average of each agent's transmissions (window "
                    f"{cfg.get('eavesdropper_window', 100)} rounds); DSG-RMS / EDSG-RMS's norm protection moves "
                    "theirs off the field")
    T = len(traces["DSG-RMS"][0])
    step = max(1, T // 1000)
    rows = []
    for k in range(T):
        r, p = traces["DSG-RMS"][0][k], traces["PD-LMS"][0][k]
        if r["iteration"] % step and r["iteration"] != T:
            continue
        row = {"iteration": r["iteration"]}
        for c in (0, 1):
            row |= {f"dsg_rms_{key}_{c + 1}": float(r[key][c]) for key in
                    ("psi", "w_prev", "psi_c", "eavesdropper", "adaptive_eavesdropper", "w_star")}
            row[f"pd_lms_eavesdropper_{c + 1}"] = float(p["eavesdropper"][c])
        rows.append(row)
    write_csv(out / "rms_localization_c.csv", rows)
    xs = [r["iteration"] for r in rows]
    for c in (1, 2):  # one figure per coordinate (the seed draws the values at agent 1)
        series = [(name, xs, [r[f"{key}_{c}"] for r in rows], None)
                  for name, key in (("DSG-RMS ψ(n)", "dsg_rms_psi"), ("DSG-RMS ψᶜ(n) sent", "dsg_rms_psi_c"),
                                    ("DSG-RMS: eavesdropper's average", "dsg_rms_eavesdropper"),
                                    ("DSG-RMS: adaptive eavesdropper (knows the law and τ)",
                                     "dsg_rms_adaptive_eavesdropper"),
                                    ("PD-LMS: eavesdropper's average", "pd_lms_eavesdropper"),
                                    ("w*", "dsg_rms_w_star"))]
        draw(out / f"rms_localization_c_x{c}.png", series, xlabel="iteration n", ylabel=f"coordinate {c} at agent 1",
             title=f"seed 002 Fig. 3(c): agent 1's values and what an eavesdropper infers (coordinate {c}, one run)",
             markers=False, size=(6.4, 4.0))


@REPRODUCTIONS.register("rms_localization")
def rms_localization(out: Path, *, seeds: int = 100, iterations: int | None = None, progress: bool = False,
                     **_: object) -> list[dict]:
    """Seed 002 Fig. 3 (b): MSD curves of target localization (4 anchors) for the six methods, 100 runs each."""
    out = Path(out)
    overrides: dict[str, object] = {"seeds": int(seeds)}
    if iterations:
        overrides["iterations"] = int(iterations)
    runs_dir = run(with_overrides(packaged_config("rms_localization"), overrides), out / "runs_rms_localization",
                   progress=progress)
    curves, summary = _curves(runs_dir, finished_runs(runs_dir), ("task.exact_gradient",))
    write_csv(out / "rms_localization_curves.csv", curves)
    write_csv(out / "rms_localization_summary.csv", summary)
    _plots(out, "rms_localization", curves, ("task.exact_gradient",), "seed 002 Fig. 3(b)")
    _localization_panels(out, with_overrides(packaged_config("rms_localization"), overrides))
    return summary


__all__ = ["rms_filtering", "rms_localization"]
