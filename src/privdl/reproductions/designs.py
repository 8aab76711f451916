"""Every design side by side (issue 34, part 4; ``privdl reproduce designs``): LDP, DECOR, Whisper, Zip-DL,
Muffliato (1 and 10 gossip rounds, worst pair; 1 round calibrated on the mean pair as its authors report, issue 46)
and DP-DSGT with DP-SGD on the same tasks — logistic regression on a9a and seed
004's small CNN on MNIST digits, 20 agents on a ring and on ER(0.3) — through the ordinary runner
(``configs/designs_a9a.toml``, ``configs/designs_mnist.toml``: accuracy, ledgers, byte counts in the manifests), each
run then attacked twice from real views and audited once.

**Matched nominal guarantees.** Every design is calibrated to the same (ε, δ) target, at each ε of a small grid
(default {1, 3, 10}, δ = 1e-5), *in its own notion*: LDP — agent-level (ε, δ)-DP of every message (local DP);
DECOR and Whisper — agent-level (ε, δ)-DP against an eavesdropper on every link who holds no shared seed (the ledger's
"coalitions of size ≤ 0"); DP-DSGT — example-level (ε, δ)-DP (RDP of the subsampled Gaussian); Zip-DL and Muffliato
— pairwise network DP (what their ledgers state, and the (ε, δ) they imply, or none). The numbers in the ``epsilon``
column are therefore *not* one guarantee: the ``unit``, ``notion``, ``accountant``, ``achieved_epsilon`` and
``ledger_statement`` columns say what each one is, and only rows with the same notion compare as guarantees.

**Matched attack outcomes.** Because the notions differ, every run is also attacked, and the attack outcomes are what
compares across designs: ``audit_epsilon_lb`` — the one-run membership audit's ε lower bound
(:func:`privdl.audit.membership.config_membership_audit`: mislabelled test examples put in agent 1's data with
probability 1/2 in a separate run of the same config, scored on agent 1's final model, which an eavesdropper on
every link can recompute); ``psnr_neighbour`` / ``psnr_eavesdropper`` — the gradient inversion of agent 1's
single-sample gradients of rounds ``round`` … ``round + images − 1`` from a curious neighbour's (agent 1's
lowest-numbered neighbour) and from an eavesdropper's real view (:func:`privdl.attacks.views.attack_run`, on the same
config at batch size 1 — the inversion needs one sample per gradient — with the same calibration: same T, C, ε; the
analytic inversion x = ∇_W/∇_b for the linear a9a model, iDLG for the CNN; reconstructions scored clamped to the data's
range). ``psnr_baseline`` is what an attacker
who learned nothing gets: the PSNR of the training data's mean input against the same samples. We do not invent a
single "ε-equivalent": the table is the full grid with accuracy beside every attack outcome, and ``designs.md`` adds,
per design, the largest ε of the grid whose mean attack outcomes all stay at or below fixed levels (audit bound ≤
``audit_level``; both PSNRs ≤ ``psnr_baseline`` + ``psnr_margin`` dB) and its accuracy — the design that trains best
under the same measured leakage.

**A fair step size.** Every design gets the same search: each (design, graph, ε) runs once per step size of
``ETAS`` (a constant η) on a tuning seed (:data:`TUNE_SEED`, whose graph, split and noise are not the table's seeds'),
and the table's seeds run at the η with the best final test accuracy there (chosen on the test set, as seed 004's
``--tune``; no validation split). ``tune = False`` runs every design at the config's η (0.01) instead.

**What is approximate, stated.** The step-size search is one seed and picks by test accuracy; the audit is a single run with
a few hundred canaries, so its bound is weak (it can show leakage, never prove privacy); DP-SGD draws Poisson lots,
which hold no single sample to invert, so DP-DSGT's PSNR columns are empty (NaN, with the reason in ``notes``); a
design whose mechanism is not registered in this privdl (``MECHANISMS``) is skipped with a message, not run.

Outputs: ``designs.csv`` (one row per run), ``designs_summary.csv`` (mean and sd over seeds), ``designs.md`` (the
table and the matched-attack view), ``designs_search.csv`` (every run of the step-size search: accuracy and loss
per η), and the runs (manifests, ledgers) under ``runs_<task>/``; attacks and audits are
cached per run in ``cells/`` (an interrupted reproduction resumes). ``designs.md`` ends with the accumulated
noise-to-signal ratio of the network average — the closed forms 2√d/(μ√n) (independent noise) and 2√d/(μn) (any
agent-level Gaussian design), whatever T and η, beside each design's own calibrated ratio
(:mod:`privdl.reproductions.noise_signal`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from privdl.errors import PrivdlError, ValidationError
from privdl.experiment.config import expand
from privdl.experiment.loop_steps import distinct_runs
from privdl.reproductions import noise_signal
from privdl.reproductions.common import (
    REPRODUCTIONS, collecting, collecting_only, finished_runs, packaged_config, run, with_overrides, write_csv,
)

#: the step sizes every design is searched over, per task (a9a: seed 001's Fig. 4 grid widened to DP-SGD's larger
#: steps; the CNN: from seed 004's DP-SGD step sizes down to where the agent-level designs, which diverged at
#: 0.003 … 0.3 in the first MNIST cell, stay finite)
ETAS = {"logistic": (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0), "cnn": (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)}
#: the seed of the step-size search (none of the table's seeds)
TUNE_SEED = 10_000

#: the CSV's columns, in order (a contract); extra columns follow them
COLUMNS = ("task", "graph", "method", "epsilon", "delta", "unit", "notion", "accountant", "achieved_epsilon",
           "accuracy", "bytes_per_round", "audit_epsilon_lb", "psnr_neighbour", "psnr_eavesdropper",
           "ledger_statement", "seed")
EXTRA = ("eta", "psnr_baseline", "victim", "neighbour", "mechanism", "notes")
NUMERIC = ("achieved_epsilon", "accuracy", "bytes_per_round", "audit_epsilon_lb", "psnr_neighbour",
           "psnr_eavesdropper", "psnr_baseline")
#: task label → packaged config
TASKS = {"a9a": "designs_a9a", "mnist_t10k": "designs_mnist"}
#: binary datasets run the a9a config (logistic regression); any other dataset the CNN one
LOGISTIC = ("a9a", "breast_cancer")
#: what each mechanism's guarantee means, where its ledger does not say (a ledger's own "notion" wins)
NOTIONS = {
    "ldp": "local DP: agent-level (ε, δ) of every message, against anyone who sees it",
    "gaussian_ldp": "local DP: agent-level (ε, δ) of every message, against anyone who sees it",
    "decor": "agent-level (ε, δ) against an eavesdropper on every link holding no shared seed (network DP)",
    "whisper": "agent-level (ε, δ) against an eavesdropper on every link holding no shared seed (network DP)",
    "dp_sgd": "example-level (ε, δ) of every message, against anyone who sees it (Poisson-subsampled Gaussian)",
    "zip_dl": "pairwise network DP (Rényi), as its ledger states",
    "muffliato": "pairwise network DP (Rényi), as its ledger states",
}
DP_SGD_NOTE = "DP-SGD's Poisson lots hold no single sample to invert: no gradient-inversion attack"
#: how a cached cell's PSNRs were scored: reconstructions clamped to the data's range (:func:`attack_run`); an iDLG
#: cell without it predates the clamp and is computed again (under ``--collect``: shown with :data:`STALE_NOTE`)
SCORING = "clamped to the data range"
STALE_NOTE = "PSNRs scored before reconstructions were clamped to the data range: run again to rescore"


def registered(methods: list[dict]) -> tuple[list[dict], list[str]]:
    """The sweep's methods whose mechanism is registered in this privdl, and one message per method that is not."""
    from privdl.mechanisms import MECHANISMS

    kept, skipped = [], []
    for m in methods:
        name = m.get("mechanism", {}).get("name", "none")
        if name in MECHANISMS:
            kept.append(m)
        else:
            skipped.append(f"designs: skipped {m['label']!r}: mechanism {name!r} is not registered in this privdl "
                           f"(its rows appear once it is)")
    return kept, skipped


def task_config(dataset: str, *, seeds: int | None = None, iterations: int | None = None,
                epsilons: tuple[float, ...] | None = None, graphs: tuple[str, ...] | None = None,
                methods: tuple[str, ...] | None = None, batch_size: int | None = None,
                overrides: dict | None = None, device: str | None = None) -> dict:
    """The packaged config of ``dataset``'s task with the reproduction's overrides (every method, registered or
    not: :func:`registered` filters); ``overrides`` are further dotted keys (e.g. ``{"task.partition": "iid"}``)."""
    cfg = packaged_config(TASKS.get(dataset, "designs_a9a" if dataset in LOGISTIC else "designs_mnist"))
    over: dict[str, object] = {}
    if dataset not in TASKS:
        over["task.dataset"] = dataset
        if "train_size" in cfg["task"]:
            cfg["task"].pop("train_size")
    if seeds:
        over["seeds"] = int(seeds)
    if iterations:
        over.update({"iterations": int(iterations), "eval_every": int(iterations)})
    if epsilons:
        over["sweep.mechanism.epsilon"] = [float(e) for e in epsilons]
    if batch_size:
        over.update({"task.batch_size": int(batch_size), "task.min_size": int(batch_size)})
    if device:
        over["device"] = device
    cfg = with_overrides(cfg, {**over, **(overrides or {})})
    if batch_size:
        for m in cfg["sweep"]["method"]:
            if "lot_size" in m.get("mechanism", {}):
                m["mechanism"]["lot_size"] = int(batch_size)
    for axis, chosen in (("graph", graphs), ("method", methods)):
        if chosen:
            known = [g["label"] for g in cfg["sweep"][axis]]
            unknown = [c for c in chosen if c not in known]
            if unknown:
                raise ValidationError(f"designs: unknown {axis} {unknown}; valid: {', '.join(known)}")
            cfg["sweep"][axis] = [g for g in cfg["sweep"][axis] if g["label"] in chosen]
    return cfg


def _num(value: object) -> float:
    if value is None or value == "":
        return math.nan
    if value == "inf":
        return math.inf
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _bytes_per_round(manifest: dict, iterations: int) -> float:
    sent = sum(int(v.get("bytes_sent", 0)) for v in manifest.get("bytes_per_tag", {}).values())
    return sent / max(int(iterations), 1)


def _neighbour(cfg: dict, victim: int) -> int:
    from privdl.experiment.build import build_network

    net = build_network(cfg["network"], int(cfg["seed"]), cfg.get("base_dir"))
    return min(net.neighbours(victim))


_MEANS: dict[str, np.ndarray] = {}


def _psnr_baseline(cfg: dict, originals) -> float:
    """PSNR of the training data's mean input against the attacked samples: an attacker who learned nothing."""
    from privdl.attacks.gradient_inversion import reconstruction_metrics
    from privdl.experiment.build import build_task

    import torch

    key = json.dumps(cfg["task"], sort_keys=True, default=str)
    if key not in _MEANS:
        _MEANS[key] = build_task({**cfg, "task": {**cfg["task"], "batch_size": 1}}, 1).dataset.X_train.mean(0)
    mean = torch.as_tensor(_MEANS[key], dtype=originals.dtype).reshape(originals.shape[1:])
    return float(np.mean([m["psnr"] for m in reconstruction_metrics(originals, mean.expand_as(originals).clone())]))


def _cell(out: Path, task: str, cfg: dict, spec, *, victim: int, images: int, round: int, attack_iterations: int,
          canaries: int) -> dict | None:
    """The attacks and the audit of one run (cached in ``cells/``); under ``--collect`` only what is cached."""
    from privdl.attacks.views import attack_run
    from privdl.audit.membership import config_membership_audit

    path = out / "cells" / f"{task}_{spec.run_id}.json"
    linear = spec.config["task"]["name"] in ("logistic",)
    if path.is_file():
        cached = json.loads(path.read_text())
        if linear or cached.get("scoring") == SCORING:  # the analytic inversion was always scored clamped
            return cached
        if collecting_only():  # an iDLG cell scored before the clamp: shown, and said so
            return {**cached, "notes": f"{cached.get('notes', '')} || {STALE_NOTE}"}
    if collecting_only():
        return None
    start = time.perf_counter()
    notes: list[str] = []
    cell: dict[str, object] = {"victim": victim, "scoring": SCORING}
    try:
        audit = config_membership_audit(spec.config, canaries=canaries, victim=victim, seed=int(spec.config["seed"]))
        cell["audit_epsilon_lb"] = audit.audit.epsilon_lower
        notes.append(audit.note)
    except PrivdlError as exc:
        cell["audit_epsilon_lb"] = math.nan
        notes.append(f"audit: {exc}")
    attack_cfg = with_overrides(cfg, {"task.batch_size": 1})
    where = {k: v for k, v in spec.sweep.items()}
    iterations = int(spec.config["iterations"])
    extra = 1 if spec.config["algorithm"]["name"] == "dsgt" else 0
    first = max(1, min(round, iterations - images - extra + 1))
    neighbour = _neighbour(spec.config, victim)
    cell["neighbour"] = neighbour
    if spec.config["mechanism"]["name"] == "dp_sgd":
        cell.update(psnr_neighbour=math.nan, psnr_eavesdropper=math.nan, psnr_baseline=math.nan)
        notes.append(DP_SGD_NOTE)
    else:
        for kind, column in (("curious_neighbour", "psnr_neighbour"), ("eavesdropper", "psnr_eavesdropper")):
            try:
                res = attack_run(attack_cfg, attacker=neighbour, victim=victim, round=first, images=images,
                                 kind=kind, method="analytic" if linear else "idlg", iterations=attack_iterations,
                                 loss="cosine", where=where)
                cell[column] = res["psnr"]
                if "psnr_baseline" not in cell:
                    cell["psnr_baseline"] = _psnr_baseline(attack_cfg, res["originals"])
                if res["notes"] != ["exact"]:
                    notes.append(f"{kind}: " + " | ".join(res["notes"]))
            except PrivdlError as exc:
                cell[column] = math.nan
                notes.append(f"{kind}: {exc}")
        cell.setdefault("psnr_baseline", math.nan)
    cell["notes"] = " || ".join(notes)
    cell["seconds"] = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cell, indent=2))
    return cell


def _row(task: str, spec, r, cell: dict) -> dict:
    ledger = r.ledger
    mech = spec.config["mechanism"]
    name = mech["name"]
    eps = ledger.get("epsilon")
    method, graph = _labels(spec)
    row = {"task": task, "graph": graph, "method": method, "eta": _num(spec.config["schedule"].get("eta")),
           "epsilon": _num(mech.get("epsilon")), "delta": _num(ledger.get("delta", mech.get("delta"))),
           "unit": ledger.get("unit", ""), "notion": ledger.get("notion") or NOTIONS.get(name, "see the ledger"),
           "accountant": ledger.get("accountant", ""), "achieved_epsilon": _num(eps),
           "accuracy": _num(r.final.get("test_accuracy")),
           "bytes_per_round": _bytes_per_round(r.manifest, int(spec.config["iterations"])),
           "audit_epsilon_lb": _num(cell.get("audit_epsilon_lb")), "psnr_neighbour": _num(cell.get("psnr_neighbour")),
           "psnr_eavesdropper": _num(cell.get("psnr_eavesdropper")),
           "ledger_statement": " ".join(str(ledger.get(k) or "") for k in ("guarantee", "note")).strip(),
           "seed": int(spec.config["seed"]), "psnr_baseline": _num(cell.get("psnr_baseline")),
           "victim": cell.get("victim"), "neighbour": cell.get("neighbour"), "mechanism": name,
           "notes": cell.get("notes", "")}
    return row


def summarise(rows: list[dict]) -> list[dict]:
    """Mean and sd over seeds per (task, graph, method, ε): ``X_mean`` / ``X_sd`` for every numeric column."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["graph"], r["method"], r["epsilon"]), []).append(r)
    out = []
    for (task, graph, method, eps), rs in groups.items():
        first = rs[0]
        s = {"task": task, "graph": graph, "method": method, "epsilon": eps, "delta": first["delta"],
             "unit": first["unit"], "notion": first["notion"], "accountant": first["accountant"],
             "seeds": len(rs), "eta": first.get("eta", math.nan)}
        for k in NUMERIC:
            a = np.array([_num(r[k]) for r in rs], dtype=float)
            ok = a[np.isfinite(a)]
            s[f"{k}_mean"] = float(ok.mean()) if ok.size else math.nan
            s[f"{k}_sd"] = float(ok.std()) if ok.size else math.nan
        s["ledger_statement"] = first["ledger_statement"]
        out.append(s)
    return out


def _pm(s: dict, k: str, digits: int = 2) -> str:
    m, sd = s[f"{k}_mean"], s[f"{k}_sd"]
    if not math.isfinite(m):
        return "—"
    return f"{m:.{digits}f} ± {sd:.{digits}f}" if s["seeds"] > 1 else f"{m:.{digits}f}"


def matched(summary: list[dict], *, audit_level: float, psnr_margin: float) -> list[dict]:
    """Per (task, graph, method): the largest ε of the grid whose mean audit bound is ≤ ``audit_level`` and whose
    mean PSNRs (those measured) are ≤ the no-information baseline + ``psnr_margin`` dB, with its accuracy."""
    groups: dict[tuple, list[dict]] = {}
    for s in summary:
        groups.setdefault((s["task"], s["graph"], s["method"]), []).append(s)
    out = []
    for (task, graph, method), ss in groups.items():
        ok = []
        for s in ss:
            base = s["psnr_baseline_mean"]
            psnrs = [s[f"{k}_mean"] for k in ("psnr_neighbour", "psnr_eavesdropper") if math.isfinite(s[f"{k}_mean"])]
            psnr_ok = all(p <= base + psnr_margin for p in psnrs) if math.isfinite(base) else not psnrs
            if s["audit_epsilon_lb_mean"] <= audit_level and psnr_ok:
                ok.append(s)
        best = max(ok, key=lambda s: s["epsilon"]) if ok else None
        out.append({"task": task, "graph": graph, "method": method,
                    "epsilon": best["epsilon"] if best else None,
                    "accuracy": _pm(best, "accuracy", 3) if best else "none of the grid",
                    "psnr_measured": "no" if best and not any(
                        math.isfinite(best[f"{k}_mean"]) for k in ("psnr_neighbour", "psnr_eavesdropper")) else
                    ("yes" if best else "")})
    return out


def _ratio_lines(ratios: list[dict]) -> list[str]:
    """The noise-to-signal note of ``designs.md``: the closed forms per (task, ε) and each agent-level Gaussian
    design's calibrated ratio (:mod:`privdl.reproductions.noise_signal`)."""
    if not ratios:
        return []
    lines = ["the accumulated noise-to-signal ratio of the network average, whatever T and η: "
             "≥ 2√d/(μ√n) for independent agent-level noise, ≥ 2√d/(μn) for any agent-level Gaussian design "
             "(μ the GDP parameter of (ε, δ); REPRODUCTION.md derives both)", "",
             "| task | graph | method | ε | d | n | 2√d/(μ√n) | 2√d/(μn) | calibrated |", "|" + "---|" * 9]
    for r in sorted(ratios, key=lambda r: (r["task"], r["graph"], r["epsilon"], r["method"])):
        cal = "—" if not math.isfinite(r["calibrated"]) else f"{r['calibrated']:.3g}"
        lines.append(f"| {r['task']} | {r['graph']} | {r['method']} | {r['epsilon']:g} | {r['d']} | {r['n']} | "
                     f"{r['bound_independent']:.3g} | {r['bound_any_gaussian']:.3g} | {cal} |")
    return lines


def _markdown(summary: list[dict], skipped: list[str], *, audit_level: float, psnr_margin: float,
              ratios: list[dict] | None = None) -> str:
    head = ["task", "graph", "method", "ε", "η", "unit", "notion", "accountant", "achieved ε", "accuracy",
            "bytes/round", "audit ε lb", "PSNR neighbour", "PSNR eavesdropper", "PSNR no-info"]
    lines = ["# Every design side by side", "",
             "Each ε is calibrated in the design's own notion (see `notion`): equal numbers are equal guarantees "
             "only where the notions are the same. Mean ± sd over seeds.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in sorted(summary, key=lambda s: (s["task"], s["graph"], s["epsilon"], s["method"])):
        lines.append("| " + " | ".join([
            s["task"], str(s["graph"]), str(s["method"]), f"{s['epsilon']:g}", f"{_num(s.get('eta')):g}", s["unit"],
            s["notion"],
            s["accountant"], _pm(s, "achieved_epsilon", 3), _pm(s, "accuracy", 3), _pm(s, "bytes_per_round", 0),
            _pm(s, "audit_epsilon_lb"), _pm(s, "psnr_neighbour", 1), _pm(s, "psnr_eavesdropper", 1),
            _pm(s, "psnr_baseline", 1)]) + " |")
    lines += ["", f"## At matched attack outcome (audit ε lower bound ≤ {audit_level:g}; both PSNRs ≤ the "
                  f"no-information PSNR + {psnr_margin:g} dB)", "",
              "The largest ε of the grid at which the design's measured leakage stays at these levels, and its "
              "accuracy there (PSNR not measured: the audit alone decides).", "",
              "| task | graph | method | ε | accuracy | PSNR measured |", "|---|---|---|---|---|---|"]
    for m in matched(summary, audit_level=audit_level, psnr_margin=psnr_margin):
        lines.append(f"| {m['task']} | {m['graph']} | {m['method']} | "
                     f"{'—' if m['epsilon'] is None else format(m['epsilon'], 'g')} | {m['accuracy']} | "
                     f"{m['psnr_measured']} |")
    if ratios:
        note = _ratio_lines(ratios)
        lines += ["", "## Accumulated noise-to-signal (closed form)", "", note[0][0].upper() + note[0][1:] + ".",
                  "A ratio above 1 means the noise the network average accumulates exceeds the largest displacement "
                  "all clipped gradients together can cause; `calibrated` is each agent-level design's own (— for "
                  "Zip-DL, whose zero-sum noise leaves the average; example-level DP-SGD is not listed).", ""] + note[2:]
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in skipped]
    return "\n".join(lines) + "\n"


@REPRODUCTIONS.register("designs")
def designs(out: Path, *, dataset: str | None = None, seeds: int | None = None, iterations: int | None = None,
            epsilons: tuple[float, ...] | None = None, graphs: tuple[str, ...] | None = None,
            methods: tuple[str, ...] | None = None, images: int = 4, round: int = 10,
            attack_iterations: int = 100, canaries: int = 200, batch_size: int | None = None,
            audit_level: float = 1.0, psnr_margin: float = 1.0, collect: bool | None = None,
            overrides: dict | None = None, progress: object = False, tune: bool = True,
            etas: tuple[float, ...] | None = None, device: str | None = None, shard: str | None = None,
            **_: object) -> list[dict]:
    """The designs table for ``dataset`` (a9a, mnist_t10k, or both when None; another dataset runs the a9a config
    if binary — breast_cancer — else the CNN one). ``collect``: start nothing, tabulate the finished runs and the
    cached attacks (``privdl reproduce --collect``). ``tune``: search every design's step size first (:func:`tuned`;
    ``etas`` overrides the grid). ``device``: where the runs, audits and attacks compute (cpu, cuda, auto).
    ``shard`` "I/K": K processes share one ``out`` (one GPU, or machines gathering their folders): each runs every
    K-th run of the search from I; a shard that finds the whole search finished then runs every K-th final run and
    its attacks and audit, else it stops after its share of the search, saying so — run every shard again once all
    have finished it. Sharded processes write no tables (``--collect`` on the folder writes them). Returns the rows
    of ``designs.csv``."""
    from privdl.reproductions.dp_dec import parse_shard

    shards = None if collect else parse_shard(shard)  # collecting reads the whole folder, whoever filled it
    with collecting(bool(collect)):
        return _designs(Path(out), dataset=dataset, seeds=seeds, iterations=iterations, epsilons=epsilons,
                        graphs=graphs, methods=methods, images=images, round=round,
                        attack_iterations=attack_iterations, canaries=canaries, batch_size=batch_size,
                        audit_level=audit_level, psnr_margin=psnr_margin, overrides=overrides, progress=progress,
                        tune=tune, etas=etas, device=device, shard=shards)


def _merged(*bundles: dict) -> dict:
    """The bundles' override tables merged section by section (later ones win), without their labels."""
    out: dict = {}
    for b in bundles:
        for k, v in b.items():
            if k == "label":
                continue
            out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


def tuned(cfg: dict, out: Path, *, etas: tuple[float, ...] | None = None, progress: object = False,
          shard: tuple[int, int] | None = None) -> tuple[dict, list[dict], int]:
    """``cfg`` with every (design, graph, ε) at its best constant step size: each runs once per η of ``etas``
    (default :data:`ETAS` of the task's model) on :data:`TUNE_SEED` into ``out``; the best final test accuracy wins
    (ties: the smaller η). The returned config sweeps one ``cell`` axis labelled "method | graph | eps=ε | eta=η";
    with it, one row per finished search run (design, graph, ε, η, final test accuracy and loss: ``designs_search.csv``)
    and how many runs the search has (``shard``: this process runs only its share of them, and the config holds only
    the cells whose search is complete)."""
    etas = tuple(sorted({float(e) for e in (etas or ETAS["logistic" if cfg["task"]["name"] == "logistic" else
                                                         "cnn"])}))
    trial = with_overrides(cfg, {"seeds": [TUNE_SEED], "sweep.schedule.eta": [float(e) for e in etas]})
    total = len({spec.run_id for spec in expand(trial)[0]})
    done = finished_runs(run(trial, out, progress=progress, shard=shard))
    scores: dict[tuple, list[tuple[float, float]]] = {}
    searched = []
    for r in done:
        key = (r.sweep["method"], r.sweep["graph"], float(r.config["mechanism"]["epsilon"]))
        acc = r.final.get("test_accuracy")
        acc = float(acc) if acc is not None and math.isfinite(float(acc)) else -math.inf
        scores.setdefault(key, []).append((acc, -float(r.config["schedule"]["eta"])))
        searched.append({"task": cfg["task"].get("dataset"), "graph": key[1], "method": key[0], "epsilon": key[2],
                         "eta": float(r.config["schedule"]["eta"]), "accuracy": _num(r.final.get("test_accuracy")),
                         "test_loss": _num(r.final.get("test_loss")), "seed": TUNE_SEED, "run_id": r.run_id})
    cells = []
    for m in cfg["sweep"]["method"]:
        for g in cfg["sweep"]["graph"]:
            for e in cfg["sweep"]["mechanism.epsilon"]:
                tried = scores.get((m["label"], g["label"], float(e)))
                if not tried or len(tried) < len(etas):  # its search has not finished: no step size yet
                    continue
                eta = -max(tried)[1]
                cell = _merged(m, g, {"mechanism": {"epsilon": float(e)}, "schedule": {"eta": eta}})
                cells.append({"label": f"{m['label']} | {g['label']} | eps={float(e):g} | eta={eta:g}", **cell})
    final = {k: v for k, v in cfg.items() if k != "sweep"}
    final["sweep"] = {"cell": cells}
    return final, searched, total


def _labels(spec) -> tuple[str, str]:
    """(method, graph) of a run, from a product sweep or a tuned ``cell``."""
    if "cell" in spec.sweep:
        method, graph = spec.sweep["cell"].split(" | ")[:2]
        return method, graph
    return spec.sweep.get("method"), spec.sweep.get("graph")


def _designs(out: Path, *, dataset, seeds, iterations, epsilons, graphs, methods, images, round, attack_iterations,
             canaries, batch_size, audit_level, psnr_margin, overrides, progress, tune=False, etas=None, device=None,
             shard: tuple[int, int] | None = None) -> list[dict]:
    say = progress if callable(progress) else print
    datasets = [dataset] if dataset else list(TASKS)
    rows: list[dict] = []
    searched: list[dict] = []  # every finished run of the step-size searches
    skipped_all: list[str] = []
    ratio_specs: dict[tuple, tuple] = {}  # (task, graph, method, ε) → one run's config and d: the noise-to-signal note
    victim = 1
    for ds in datasets:
        cfg = task_config(ds, seeds=seeds, iterations=iterations, epsilons=epsilons, graphs=graphs,
                          methods=methods, batch_size=batch_size, overrides=overrides, device=device)
        kept, skipped = registered(cfg["sweep"]["method"])
        for line in skipped:
            say(line)
        skipped_all += [f"{ds}: {s}" for s in skipped]
        if not kept:
            continue
        cfg["sweep"]["method"] = kept
        if tune:
            cfg, found, total = tuned(cfg, out / f"tuning_{ds}", etas=etas, progress=progress, shard=shard)
            searched += found
            if shard is not None and len(found) < total:
                say(f"designs {ds}: shard {shard[0]}/{shard[1]} ran its share of the step-size search; {len(found)} of "
                    f"{total} search runs are finished in {out / f'tuning_{ds}'}: run every shard again once the "
                    "search is complete (the final runs need every step size)")
                continue
            if not cfg["sweep"]["cell"]:  # no (design, graph, ε) has its whole search finished yet
                say(f"designs {ds}: {len(found)} of {total} step-size search runs are finished in "
                    f"{out / f'tuning_{ds}'}; no design has every step size yet: no final runs")
                continue
        runs_dir = run(cfg, out / f"runs_{ds}", progress=progress, shard=shard)
        trained = {r.run_id: r for r in finished_runs(runs_dir)}
        grid = expand(cfg)[0]
        specs = distinct_runs(grid, None)
        mine = {spec.run_id for spec in distinct_runs(grid, shard)}  # the runs the runner gave this shard
        unattacked = 0
        for spec in specs:
            r = trained.get(spec.run_id)
            if r is None:
                continue
            with collecting(collecting_only() or spec.run_id not in mine):  # another shard's: only if cached
                cell = _cell(out, ds, cfg, spec, victim=victim, images=images, round=round,
                             attack_iterations=attack_iterations, canaries=canaries)
            if cell is None:
                unattacked += 1
                continue
            rows.append(_row(ds, spec, r, cell))
            method, graph = _labels(spec)
            key = (ds, graph, method, float(spec.config["mechanism"].get("epsilon", math.nan)))
            if key not in ratio_specs and "dim" in r.manifest.get("task", {}):
                ratio_specs[key] = (ds, graph, method, spec.config, int(r.manifest["task"]["dim"]))
        if unattacked and shard is None:  # (a shard leaves the others' runs to them)
            say(f"designs {ds}: {unattacked} finished run(s) have no audit and attacks in {out / 'cells'} yet: "
                "not in the table until they have")
    rows = [{**{k: r[k] for k in COLUMNS}, **{k: r[k] for k in EXTRA}} for r in rows]
    if shard is not None:  # K processes share the folder: the tables come from `--collect` once all have ended
        say(f"designs: shard {shard[0]}/{shard[1]} done; `privdl reproduce designs --collect --out {out}` writes "
            "the tables")
        return rows
    write_csv(out / "designs.csv", rows)
    if searched:
        write_csv(out / "designs_search.csv", sorted(searched, key=lambda r: (r["task"], r["graph"], r["method"],
                                                                               r["epsilon"], r["eta"])))
    summary = summarise(rows)
    write_csv(out / "designs_summary.csv", summary)
    ratios = noise_signal.design_ratios(list(ratio_specs.values()))
    for line in _ratio_lines(ratios)[:1]:
        say(f"designs: {line}")
    (out / "designs.md").write_text(_markdown(summary, skipped_all, audit_level=audit_level,
                                              psnr_margin=psnr_margin, ratios=ratios))
    return rows


__all__ = ["COLUMNS", "ETAS", "NOTIONS", "TASKS", "designs", "matched", "registered", "summarise", "task_config", "tuned"]
