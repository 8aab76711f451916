"""Reproductions of seed 001 (Whisper D-SGD / CorN-DSGD) and its DECOR / LDP baselines (SPEC §3): the packaged
configs ``fig1_*``, ``fig2``, ``quadratic``, ``a9a_*`` and ``fmnist`` run through the ordinary runner, and this thin
layer summarises their runs into the CSV files and figures REPRODUCTION.md quotes.

Protocol: n = 20, ER(p) with Metropolis–Hastings weights, δ = 1e-5, C = 0.1, T = 5000, the paper accountant as the
authors' code uses, privdl's tight accountant beside it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from privdl.experiment.plot import draw
from privdl.experiment.summary import mean_std, summarise
from privdl.reproductions.common import (
    REPRODUCTIONS, FinishedRun, finished_runs, packaged_config, run, with_overrides, write_csv,
)

EPSILONS = [3, 5, 7, 10, 15, 20, 25, 30, 40]
PS = [0.2, 0.4, 0.6, 0.8, 1.0]
DESIGNS = ["ldp", "decor", "whisper"]
ETAS = [0.1, 0.05, 0.01, 0.005, 0.001]


def _eps(cfg: dict) -> float:
    return float(cfg["mechanism"].get("epsilon", math.inf)) if cfg["mechanism"]["name"] != "none" else math.inf


def _series(rows: list[dict], x: str, y: str, by: str, order: Sequence[str] | None = None) -> list:
    names = list(dict.fromkeys(r[by] for r in rows))
    names = [n for n in (order or names) if n in names]
    out = []
    for name in names:
        pts = sorted((r[x], r[y], r.get(f"{y}_std", 0.0)) for r in rows if r[by] == name)
        out.append((str(name), [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]))
    return out


# ---- Fig. 1: noise variance of the designs -----------------------------------------------------------------------
@REPRODUCTIONS.register("fig1")
def fig1(out: Path, *, graphs: int = 10, sizes: tuple[int, ...] = (10, 20, 50, 100, 200, 500, 1000, 2000),
         progress: bool = False, **_: object) -> list[dict]:
    """Tr(W R Wᵀ) of LDP / DECOR / Whisper versus ε (p = 0.5), versus p (ε = 10), versus n (p = 0.5, ε = 10)."""
    out = Path(out)
    rows: list[dict] = []
    panels = {"epsilon": ({"sweep.network.seed": list(range(graphs))}, lambda c: float(c["mechanism"]["epsilon"])),
              "p": ({"sweep.network.seed": list(range(graphs))}, lambda c: float(c["network"]["p"])),
              "n": ({"sweep.network.n": list(sizes)}, lambda c: int(c["network"]["n"]))}
    for panel, (overrides, x_of) in panels.items():
        done = finished_runs(run(with_overrides(packaged_config(f"fig1_{panel}"), overrides),
                                 out / f"fig1_{panel}", progress=progress))
        points = [{"panel": panel, "x": x_of(r.config), "design": r.sweep["design"],
                   "accountant": r.config["mechanism"]["accountant"], "epsilon": _eps(r.config),
                   "trace": r.final["trace"], "seconds": r.final.get("design_seconds", 0.0)} for r in done]
        for s in summarise(points, by=["panel", "x", "design", "accountant", "epsilon"], value="trace",
                           count="graphs"):
            s["seconds_per_graph"] = mean_std(p["seconds"] for p in points if (p["x"], p["design"]) ==
                                              (s["x"], s["design"]))[0]
            rows.append(s)
    write_csv(out / "fig1_traces.csv", rows)
    for panel, xlabel, logx in (("epsilon", "ε", False), ("p", "edge probability p", False), ("n", "n", True)):
        sel = [r for r in rows if r["panel"] == panel]
        draw(out / f"fig1_{panel}.png", _series(sel, "x", "trace", "design"), xlabel=xlabel, ylabel="Tr(W R Wᵀ)",
             title=f"seed 001 Fig. 1 ({panel})", logx=logx, logy=True, size=(5.2, 3.6))
    return rows


# ---- Fig. 2: number of independent seeds -------------------------------------------------------------------------
@REPRODUCTIONS.register("fig2")
def fig2(out: Path, *, graph_seed: int = 0, epsilon: float = 10.0, progress: bool = False, **_: object) -> list[dict]:
    """Tr(W R Wᵀ) versus the number m of independent seeds held by disjoint groups (q = 0), n = 20, p = 0.5; plus
    the q = 1 designs for the other seed constructions."""
    out = Path(out)
    cfg = with_overrides(packaged_config("fig2"), {"network.seed": graph_seed, "mechanism.epsilon": float(epsilon)})
    done = {r.sweep["design"]: r for r in finished_runs(run(cfg, out / "fig2", progress=progress))}
    ldp, whisper = done["ldp"].final["trace"], done["whisper"].final["trace"]
    rows = []
    for label, r in done.items():
        if label in ("ldp", "whisper"):
            continue
        mech = r.config["mechanism"]
        rows.append({"seeds": mech["seeds"], "m": int(r.final.get("m", 0)),
                     "coalition_size": int(mech.get("coalition_size", 0)), "trace": r.final["trace"],
                     "trace_ldp": ldp, "trace_whisper_global": whisper,
                     "worst_ratio": r.final["max_precision_ratio"], "seconds": r.final.get("design_seconds", 0.0)})
    rows.sort(key=lambda r: (r["coalition_size"], r["m"], r["seeds"]))
    write_csv(out / "fig2_seeds.csv", rows)
    groups = [r for r in rows if r["coalition_size"] == 0]
    draw(out / "fig2_seeds.png", [("disjoint groups, q=0", [r["m"] for r in groups], [r["trace"] for r in groups],
                                   None)],
         references=[("LDP", ldp, 0.0), ("Whisper (one global seed)", whisper, 0.0)],
         xlabel="number of independent seeds m", ylabel="Tr(W R Wᵀ)", title="seed 001 Fig. 2", size=(5.2, 3.6))
    return rows


# ---- training sweeps ------------------------------------------------------------------------------------------------
def _design(r: FinishedRun) -> str:
    return r.config["mechanism"]["name"]


def _setting(r: FinishedRun) -> dict:
    mech = r.config["mechanism"]
    private = mech["name"] != "none"
    return {"design": mech["name"], "epsilon": _eps(r.config), "p": float(r.config["network"]["p"]),
            "eta": float(r.config["schedule"]["eta"]), "accountant": mech.get("accountant", "tight") if private
            else "none"}


def _summarise_runs(done: list[FinishedRun], keys: Sequence[str]) -> list[dict]:
    points = []
    for r in done:
        p = _setting(r)
        p.update({k: r.final[k] for k in keys})
        p["epsilon_achieved"] = r.ledger["epsilon"]
        points.append(p)
    rows: dict[tuple, dict] = {}
    for k in keys:
        for s in summarise(points, by=["design", "epsilon", "p", "eta", "accountant"], value=k):
            rows.setdefault(tuple(s[c] for c in ("design", "epsilon", "p", "eta", "accountant")), {}).update(s)
    return list(rows.values())


def _panels(out: Path, rows: list[dict], metric: str, label: str, name: str, logy: bool) -> None:
    ref = {r["p"]: (r[metric], r.get(f"{metric}_std", 0.0)) for r in rows if r["design"] == "none"}
    at_half = [dict(r, x=r["epsilon"]) for r in rows if r["design"] != "none" and r["p"] == 0.5]
    refs = [("non-private", *ref[0.5])] if 0.5 in ref else []
    draw(out / f"{name}_vs_epsilon.png", _series(at_half, "x", metric, "design", DESIGNS), references=refs,
         xlabel="ε", ylabel=label, title=f"{name}: p = 0.5", logy=logy, size=(5.2, 3.6))
    at_ten = [dict(r, x=r["p"]) for r in rows if r["design"] != "none" and r["epsilon"] == 10]
    at_ten += [{"x": p, metric: v[0], f"{metric}_std": v[1], "design": "non-private"} for p, v in ref.items()]
    draw(out / f"{name}_vs_p.png", _series(at_ten, "x", metric, "design", [*DESIGNS, "non-private"]),
         xlabel="edge probability p", ylabel=label, title=f"{name}: ε = 10", logy=logy, size=(5.2, 3.6))


@REPRODUCTIONS.register("quadratic")
def quadratic(out: Path, *, seeds: int = 10, clip: float = 0.1, start: str = "zero", progress: bool = False,
              **_: object) -> list[dict]:
    """Seed 001 Fig. 3: optimality gap of the rotated quadratic for every (design, ε, p, seed) of SPEC §3 — the
    full 9 ε × 6 p grid, both accountants — stacked on the replica axis (η_t = 1e-2/√t, T = 5000).
    ``start = "optimum"`` starts every agent at x*, so the gap is the privacy noise's alone (Theorem 1)."""
    out = Path(out)
    cfg = with_overrides(packaged_config("quadratic"), {"seeds": int(seeds), "mechanism.clip": float(clip),
                                                        "task.start": start})
    done = finished_runs(run(cfg, out / "runs_quadratic", progress=progress))
    rows = _summarise_runs(done, ["optimality_gap", "local_optimality_gap"])
    batches = {r.manifest["batch"].get("replicas", 1) for r in done}
    seconds = sum({r.manifest["batch"].get("seconds", r.manifest["seconds"]) for r in done})
    rows = [dict(r, clip=clip, replicas_in_batch=max(batches), batch_seconds=seconds) for r in rows]
    write_csv(out / "quadratic.csv", rows)
    _panels(out, [r for r in rows if r["accountant"] in ("paper", "none")], "optimality_gap", "optimality gap",
            "quadratic", logy=True)
    return rows


@REPRODUCTIONS.register("quadratic_at_optimum")
def quadratic_at_optimum(out: Path, *, seeds: int = 10, clip: float = 0.1, progress: bool = False,
                         **_: object) -> list[dict]:
    """The quadratic sweep started at x*: what remains after T steps is the noise designs' doing."""
    return quadratic(out, seeds=seeds, clip=clip, progress=progress, start="optimum")


def _tuned(out: Path, name: str, *, metric: str, keys: list[str], seeds: int, tune_seeds: int, etas: list[float],
           epsilons: list[float], data_dir: str | None, progress: bool) -> list[dict]:
    """Tune η per (design, ε, p) on seeds 100.. over ``etas``, then run ``seeds`` fresh seeds at the chosen η with
    the paper accountant and the tight one."""
    rows: list[dict] = []
    for panel in ("epsilon", "p"):
        base = packaged_config(f"{name}_{panel}")
        extra = {"task.data_dir": data_dir} if data_dir else {}
        if panel == "epsilon":
            extra["sweep.mechanism.epsilon"] = [float(e) for e in epsilons]
        tune_cfg = with_overrides(base, {**extra, "seeds": list(range(100, 100 + tune_seeds)),
                                         "sweep.schedule.eta": list(etas)})
        tuned = _summarise_runs(finished_runs(run(tune_cfg, out / f"{name}_tuning_{panel}", progress=progress)),
                                [metric])
        write_csv(out / f"{name}_tuning_{panel}.csv", tuned)
        best: dict[tuple, float] = {}
        for r in sorted(tuned, key=lambda r: r[metric]):
            best.setdefault((r["design"], r["epsilon"], r["p"]), r["eta"])
        bundles = []
        for (design, eps, p), eta in sorted(best.items(), key=str):
            for acc in (("paper", "tight") if design != "none" else (None,)):
                mech = {"name": design, **({"epsilon": eps, "accountant": acc} if acc else {})}
                bundles.append({"label": f"{design} eps={eps} p={p} {acc or ''}".strip(), "mechanism": mech,
                                "network": {"p": p}, "schedule": {"eta": eta}})
        final_cfg = with_overrides(base, {**extra, "seeds": list(range(seeds))})
        final_cfg["sweep"] = {"setting": bundles}
        done = finished_runs(run(final_cfg, out / f"{name}_{panel}", progress=progress))
        rows += [r for r in _summarise_runs(done, keys) if panel == "epsilon" or r["p"] != 0.5]
    write_csv(out / f"{name}.csv", rows)
    _panels(out, [r for r in rows if r["accountant"] in ("paper", "none")], metric, metric.replace("_", " "), name,
            logy=False)
    return rows


@REPRODUCTIONS.register("a9a")
def a9a(out: Path, *, seeds: int = 10, tune_seeds: int = 1, etas: list[float] = ETAS,
        epsilons: list[float] = EPSILONS, data_dir: str | None = None, progress: bool = False,
        **_: object) -> list[dict]:
    """Seed 001 Fig. 4: logistic regression on a9a (Dirichlet(10) over 20 agents, batch 128, L2 1e-4), test loss
    versus ε (p = 0.5) and versus p (ε = 10), η tuned per setting over SPEC §3's grid."""
    return _tuned(Path(out), "a9a", metric="test_loss", keys=["test_loss", "test_accuracy"], seeds=seeds,
                  tune_seeds=tune_seeds, etas=etas, epsilons=epsilons, data_dir=data_dir, progress=progress)


@REPRODUCTIONS.register("fmnist")
def fmnist(out: Path, *, seeds: int = 1, epsilons: Sequence[float] = (10.0,), etas: Sequence[float] = (0.05, 0.01, 0.001),
           iterations: int = 1000, data_dir: str | None = None, progress: bool = False, **_: object) -> list[dict]:
    """Seed 001 Fig. 5 stand-in: the shallow network on Fashion-MNIST, p = 0.5, every η of ``etas`` (the best per
    design is plotted); reduced protocol: ``iterations`` rounds and ε ∈ ``epsilons``."""
    out = Path(out)
    cfg = with_overrides(packaged_config("fmnist"), {
        "seeds": int(seeds), "iterations": int(iterations), "sweep.mechanism.epsilon": [float(e) for e in epsilons],
        "sweep.schedule.eta": [float(e) for e in etas], **({"task.data_dir": data_dir} if data_dir else {})})
    rows = _summarise_runs(finished_runs(run(cfg, out / "runs_fmnist", progress=progress)),
                           ["test_accuracy", "test_loss"])
    rows = [dict(r, steps=iterations) for r in rows]
    write_csv(out / "fmnist.csv", rows)
    best: dict[tuple, dict] = {}
    for r in sorted(rows, key=lambda r: -r["test_accuracy"]):
        best.setdefault((r["design"], r["epsilon"]), r)
    sel = [dict(r, x=r["epsilon"]) for r in best.values() if r["design"] != "none"]
    refs = [("non-private", r["test_accuracy"], r["test_accuracy_std"]) for r in best.values() if r["design"] == "none"]
    draw(out / "fmnist_vs_epsilon.png", _series(sel, "x", "test_accuracy", "design", DESIGNS), references=refs,
         xlabel="ε", ylabel="test accuracy", title="Fashion-MNIST, shallow net, p = 0.5 (best η)", size=(5.2, 3.6))
    return rows


# ---- the authors' code: per-example clipping, example-level DP, their protocols ------------------------------------
def _authors_rows(done: list[FinishedRun], keys: list[str]) -> list[dict]:
    """Summaries per setting with the privacy unit and both ε's: the example-level ε the run is calibrated to and
    the agent-level ε of the same noise (the worst over the setting's runs)."""
    rows = _summarise_runs(done, keys)
    facts: dict[tuple, dict] = {}
    for r in done:
        s = _setting(r)
        key = tuple(s[c] for c in ("design", "epsilon", "p", "eta", "accountant"))
        led = r.ledger
        agent = (led.get("beside") or [{}])[0].get("epsilon")
        f = facts.setdefault(key, {"unit": led["unit"], "epsilon_example_level": None, "epsilon_agent_level": None})
        if led["unit"] == "example":
            f["epsilon_example_level"] = max(f["epsilon_example_level"] or 0.0, float(led["epsilon"]))
            f["epsilon_agent_level"] = max(f["epsilon_agent_level"] or 0.0, float(agent))
    for row in rows:
        row.update(facts[tuple(row[c] for c in ("design", "epsilon", "p", "eta", "accountant"))])
    return rows


def _bundle(design: str, eps: float | None, p: float, eta: float) -> dict:
    mech = {"name": design, **({"epsilon": eps} if design != "none" else {})}
    return {"label": f"{design} eps={eps} p={p} eta={eta}", "mechanism": mech, "network": {"p": p},
            "schedule": {"eta": eta}}


@REPRODUCTIONS.register("mnist_authors")
def mnist_authors(out: Path, *, seeds: int = 3, iterations: int = 1000, data_dir: str | None = None,
                  progress: bool = False, **_: object) -> list[dict]:
    """Seed 001's image experiment as the authors' code runs it: softmax regression on MNIST digits, per-example
    clipping (example-level DP), η = 0.1, T = 1000; ε ∈ {10, 20, 30, 40} at p = 0.5 and p ∈ {0.6, 0.8, 1.0} at
    ε = 10, for LDP, DECOR, Whisper and non-private (the packaged config ``mnist_authors``)."""
    from privdl.reproductions.papers import AUTHORS_MNIST_EPSILONS, AUTHORS_MNIST_PS

    out = Path(out)
    base = packaged_config("mnist_authors")
    eta = float(base["schedule"]["eta"])
    settings = [_bundle(d, e, 0.5, eta) for d in DESIGNS for e in AUTHORS_MNIST_EPSILONS]
    settings += [_bundle(d, 10.0, p, eta) for d in DESIGNS for p in AUTHORS_MNIST_PS]
    settings += [_bundle("none", None, p, eta) for p in (0.5, *AUTHORS_MNIST_PS)]
    return _run_authors(out, "mnist_authors", base, settings, seeds=seeds, iterations=iterations,
                        data_dir=data_dir, progress=progress, metrics=["test_accuracy", "test_loss"])


@REPRODUCTIONS.register("a9a_authors")
def a9a_authors(out: Path, *, seeds: int = 3, iterations: int = 5000, data_dir: str | None = None,
                progress: bool = False, **_: object) -> list[dict]:
    """Seed 001 Fig. 4 as the authors' code runs it: per-example clipping (example-level DP), no weight decay, their
    step size per (ε, design) at p = 0.5 and per (p, design) at ε = 10 (the packaged config ``a9a_authors``)."""
    from privdl.reproductions.papers import AUTHORS_A9A_ETA_BY_EPSILON, AUTHORS_A9A_ETA_BY_P

    out = Path(out)
    base = packaged_config("a9a_authors")
    none_eta = float(base["schedule"]["eta"])
    settings = [_bundle(d, e, 0.5, eta) for (e, d), eta in AUTHORS_A9A_ETA_BY_EPSILON.items()]
    settings += [_bundle(d, 10.0, p, eta) for (p, d), eta in AUTHORS_A9A_ETA_BY_P.items() if p != 0.5]
    settings += [_bundle("none", None, p, none_eta) for p in sorted({p for p, _ in AUTHORS_A9A_ETA_BY_P} | {0.5})]
    return _run_authors(out, "a9a_authors", base, settings, seeds=seeds, iterations=iterations,
                        data_dir=data_dir, progress=progress, metrics=["test_loss", "test_accuracy"])


def _run_authors(out: Path, name: str, base: dict, settings: list[dict], *, seeds: int, iterations: int,
                 data_dir: str | None, progress: bool, metrics: list[str]) -> list[dict]:
    """Run the settings of an authors'-code protocol through the runner, summarise (first metric plotted)."""
    cfg = with_overrides(base, {"seeds": int(seeds), "iterations": int(iterations),
                                **({"task.data_dir": data_dir} if data_dir else {})})
    cfg["sweep"] = {"setting": settings}
    rows = _authors_rows(finished_runs(run(cfg, out / f"runs_{name}", progress=progress)), metrics)
    rows = [dict(r, steps=iterations) for r in rows]
    write_csv(out / f"{name}.csv", rows)
    _panels(out, rows, metrics[0], metrics[0].replace("_", " "), name, logy=False)
    return rows
