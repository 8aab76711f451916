"""Reproductions of seed 004 (DP-DSGD, DP-DSGT, DP-DiNNO versus central DP-SGD; SPEC §4): Table 1 (accuracy versus
ε and normalized Fiedler value, one class per agent) and Table 2 (accuracy versus the A(t) split on a sparse graph).

Protocol: N = 10 agents, lot L = 256 (Poisson, q_i = L/m_i), δ = 1e-5, C = 10 (1 for central DP-SGD), the small
CNN, geometric step sizes from the authors' tuned values (their Ray population-based search, their configs), with
an optional ×{½, 1, 2} search around them (``tune``). MNIST's training images are not available here, so
Fashion-MNIST stands in by default (``dataset``). Rows are appended to CSV as they finish; a rerun skips them.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.experiment.build import build
from privdl.reproductions.common import REPRODUCTIONS, read_csv, write_csv
from privdl.simulator import simulate

INF = math.inf
#: the authors' tuned learning rates for MNIST (configs/mnist/*/): (start, end) of the geometric schedule per ε;
#: ε = 100 and 0.5 use their ε = 10 and ε = 1 values (nearest tuned budget we read)
AUTHORS_LR = {
    "central": {INF: (0.05, 0.05), 10.0: (0.317, 0.317), 1.0: (0.194, 0.194)},
    "dsgd": {INF: (0.1, 0.0005), 10.0: (0.113, 0.005), 1.0: (0.0365, 0.005)},
    "dsgt": {INF: (0.0792, 0.005), 10.0: (0.174, 0.005), 1.0: (0.0602, 0.005)},
    "dinno": {INF: (0.005, 0.0005), 10.0: (0.0075, 0.0005), 1.0: (0.01, 0.0005)},
}
ALGORITHM = {
    "central": {"name": "dsgd", "form": "cta",
                "optimizer": {"name": "sgd", "momentum": 0.9, "weight_decay": 1e-4}},
    "dsgd": {"name": "dsgd", "form": "cta", "optimizer": {"name": "sgd", "weight_decay": 1e-4}},
    "dsgt": {"name": "dsgt"},
    # the authors' code re-creates Adam every round; with their step sizes a persistent Adam state makes the ADMM
    # consensus oscillate (consensus distance 28 → 42 in 100 rounds, chance accuracy): see REPRODUCTION.md
    "dinno": {"name": "dinno", "rho": 0.5, "rho_scale": 1.0003, "primal_steps": 1, "optimizer": "adam",
              "reset_optimizer": True},
}
METHOD_LABEL = {"central": "Central", "dsgd": "DP-DSGD", "dsgt": "DP-DSGT", "dinno": "DP-DiNNO"}

#: seed 004's published accuracies (MNIST, mean over 5 trials), for the side-by-side files: Table 1 by
#: (method, normalized Fiedler value) over ε = ∞, 100, 10, 1, 0.5; Table 2 by (method, ε) over t = 0 … 1.
PAPER_EPSILONS = (INF, 100.0, 10.0, 1.0, 0.5)
PAPER_TABLE1 = {
    ("central", 1.0): (98.22, 96.16, 94.73, 92.04, 90.82),
    ("dsgd", 1.0): (95.38, 92.34, 91.27, 87.26, 84.07), ("dsgt", 1.0): (98.13, 96.13, 96.54, 89.24, 85.41),
    ("dinno", 1.0): (97.81, 95.41, 93.21, 89.66, 86.22),
    ("dsgd", 0.7): (95.19, 92.03, 91.27, 87.16, 84.09), ("dsgt", 0.7): (97.76, 96.16, 96.62, 89.75, 84.98),
    ("dinno", 0.7): (97.94, 95.51, 93.41, 89.13, 85.7),
    ("dsgd", 0.39): (94.77, 91.56, 90.61, 87.68, 85.22), ("dsgt", 0.39): (97.36, 96.28, 96.42, 89.84, 84.79),
    ("dinno", 0.39): (97.91, 95.6, 93.25, 89.02, 85.91),
    ("dsgd", 0.06): (90.55, 88.36, 84.12, 82.49, 80.57), ("dsgt", 0.06): (97.73, 95.97, 96.26, 89.16, 84.53),
    ("dinno", 0.06): (97.73, 95.03, 91.99, 85.68, 78.44),
}
PAPER_TS = (0.0, 0.25, 0.5, 0.75, 1.0)
PAPER_TABLE2 = {
    ("dsgd", 0.5): (88.9, 88.3, 87.65, 86.06, 80.57), ("dsgt", 0.5): (85.78, 86.0, 85.79, 85.3, 84.53),
    ("dinno", 0.5): (86.76, 86.19, 85.28, 83.55, 78.44),
    ("dsgd", 10.0): (94.08, 93.89, 93.63, 92.56, 84.92), ("dsgt", 10.0): (95.97, 96.04, 95.72, 96.1, 96.06),
    ("dinno", 10.0): (93.42, 93.34, 93.28, 93.03, 92.0),
}


def learning_rate(method: str, epsilon: float) -> tuple[float, float]:
    table = AUTHORS_LR[method]
    if epsilon in table:
        return table[epsilon]
    return table[10.0] if epsilon > 5 else table[1.0]


def run_config(method: str, epsilon: float, *, fiedler: float, t: float, seed: int, iterations: int,
               dataset: str, data_dir: str | None, lr_scale: float = 1.0, lot: int = 256) -> dict:
    """The effective run config of one table cell."""
    central = method == "central"
    start, end = learning_rate(method, epsilon)
    network = {"topology": "complete", "n": 1} if central else \
        {"topology": "fiedler", "n": 10, "fiedler": fiedler, "tol": 0.05, "seed": seed}
    task = {"name": "cnn", "dataset": dataset, "partition": "iid" if central else "a_t", "t": t, "seed": seed,
            "batch_size": lot, **({"data_dir": data_dir} if data_dir else {})}
    mechanism = {"name": "none"} if math.isinf(epsilon) else \
        {"name": "dp_sgd", "epsilon": epsilon, "delta": 1e-5, "clip": 1.0 if central else 10.0, "lot_size": lot}
    return {"network": network, "task": task, "algorithm": dict(ALGORITHM[method]), "mechanism": mechanism,
            "schedule": {"name": "geometric", "eta_start": start * lr_scale, "eta_end": end * lr_scale},
            "iterations": iterations, "dtype": "float32"}


def run_cell(cfg: dict, seed: int, device: str = "cpu") -> dict:
    c = build(cfg)
    start = time.perf_counter()
    res = simulate(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism,
                   schedule=c.schedule, iterations=cfg["iterations"], seed=seed, metrics=False, device=device)
    seconds = time.perf_counter() - start
    accs = []
    with torch.no_grad():
        for theta in res.final.to(c.task.X_test.device):
            pred = c.task.model.predict(theta, c.task.X_test).argmax(-1)
            accs.append(float((pred == c.task.y_test).double().mean()))
    ledger = c.mechanism.ledger()[0]
    return {"accuracy": float(np.mean(accs)), "accuracy_std_agents": float(np.std(accs)),
            "fiedler": c.network.normalized_fiedler_value if c.network.n > 1 else "",  # central: no graph
            "epsilon_achieved": ledger.epsilon, "unit": ledger.unit, "accountant": ledger.accountant,
            "noise_multiplier": ledger.noise.get("noise_multiplier", 0.0), "noisy_accesses": ledger.steps,
            "seconds": seconds, "device": str(c.task.device)}


def _check_methods(methods: tuple[str, ...], known) -> None:
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValidationError(f"unknown method(s) {unknown}; choose from {sorted(known)}")


def parse_shard(shard: str | None) -> tuple[int, int]:
    """"I/K" → (I, K) with 0 ≤ I < K: this process runs every K-th cell starting at I."""
    if not shard:
        return 0, 1
    try:
        i, k = (int(v) for v in shard.split("/"))
    except ValueError:
        raise ValidationError(f"shard must look like I/K (e.g. 0/4), got {shard!r}") from None
    if not 0 <= i < k:
        raise ValidationError(f"shard I/K needs 0 <= I < K, got {shard!r}")
    return i, k


def _grid(out: Path, name: str, cells: list[dict], *, iterations: int, dataset: str, data_dir: str | None,
          tune: bool, progress, lot: int = 256, device: str = "cpu", shard: str | None = None) -> list[dict]:
    """Run every cell (method, epsilon, fiedler, t, seed) not yet in ``name``.csv (or any shard's CSV); with
    ``tune`` each cell first tries lr × {½, 1, 2} on seed 0 and keeps the best for all seeds (documented search).
    ``shard`` "I/K" runs only cells I, I+K, ... into ``name``.shardIofK.csv, so K processes (or machines) share a
    table; the summary is over every CSV present."""
    index, count = parse_shard(shard)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"{name}.csv" if count == 1 else f"{name}.shard{index}of{count}.csv")

    def all_rows() -> list[dict]:
        return [r for p in sorted({path, out / f"{name}.csv", *out.glob(f"{name}.shard*.csv")}) for r in read_csv(p)]

    rows = read_csv(path)
    done = {(r["method"], r["epsilon"], r["fiedler_target"], r["t"], r["seed"]) for r in all_rows()}
    scales: dict[tuple, float] = {}
    for position, cell in enumerate(cells):
        if position % count != index:
            continue
        key = (cell["method"], str(cell["epsilon"]), str(cell["fiedler"]), str(cell["t"]), str(cell["seed"]))
        if key in done:
            continue
        skey = (cell["method"], cell["epsilon"], cell["fiedler"], cell["t"])
        if tune and skey not in scales:
            trials = {}
            for s in (0.5, 1.0, 2.0):
                cfg = run_config(cell["method"], cell["epsilon"], fiedler=cell["fiedler"], t=cell["t"], seed=0,
                                 iterations=iterations, dataset=dataset, data_dir=data_dir, lr_scale=s, lot=lot)
                trials[s] = run_cell(cfg, seed=10_000, device=device)["accuracy"]  # a tuning seed never reported
            scales[skey] = max(trials, key=trials.get)
        scale = scales.get(skey, 1.0)
        cfg = run_config(cell["method"], cell["epsilon"], fiedler=cell["fiedler"], t=cell["t"], seed=cell["seed"],
                         iterations=iterations, dataset=dataset, data_dir=data_dir, lr_scale=scale, lot=lot)
        result = run_cell(cfg, seed=cell["seed"], device=device)
        rows.append({"method": cell["method"], "epsilon": cell["epsilon"], "fiedler_target": cell["fiedler"],
                     "t": cell["t"], "seed": cell["seed"], "lr_scale": scale, "iterations": iterations,
                     "dataset": dataset, **result})
        write_csv(path, rows)  # survive interruption: every finished cell is on disk
        if progress:
            progress(f"{name}: {cell['method']} ε={cell['epsilon']} λ={cell['fiedler']} t={cell['t']} "
                     f"seed={cell['seed']}: {result['accuracy']:.4f} ({result['seconds']:.0f} s)")
    summary = summarise(all_rows())
    write_csv(out / f"{name}_summary.csv", summary)
    (out / f"{name}_vs_paper.md").write_text(compare_markdown(name, summary))
    return summary


def _fmt_eps(e: float) -> str:
    return "non-private" if math.isinf(e) else f"ε = {e:g}"


def compare_markdown(name: str, summary: list[dict]) -> str:
    """Our accuracies (mean ± sd over seeds, %) beside the paper's, as Markdown tables: one table per normalized
    Fiedler value (table1) or per ε (table2); a cell reads "ours (paper)"; "—" where a setting was not run."""
    ours = {(r["method"], float(r["epsilon"]), float(r["fiedler_target"]), float(r["t"])):
            (float(r["accuracy_mean"]), float(r["accuracy_std"]), int(r["seeds"])) for r in summary}

    def cell(key: tuple, paper: float | None) -> str:
        got = ours.get(key)
        text = "—" if got is None else f"{got[0]:.2f} ± {got[1]:.2f}"
        return text + ("" if paper is None else f" ({paper:g})")

    lines: list[str] = []
    if name == "table1":
        for f in sorted({k[2] for k in ours if k[0] != "central"} | {1.0}, reverse=True):
            lines += [f"Normalized Fiedler value {f:g}", "",
                      "| method | " + " | ".join(_fmt_eps(e) for e in PAPER_EPSILONS) + " |",
                      "|---" * (len(PAPER_EPSILONS) + 1) + "|"]
            for m in METHOD_LABEL:
                paper = PAPER_TABLE1.get((m, 1.0 if m == "central" else f))
                fk = 1.0 if m == "central" else f
                lines.append(f"| {METHOD_LABEL[m]} | " + " | ".join(
                    cell((m, e, fk, 1.0), None if paper is None else paper[j])
                    for j, e in enumerate(PAPER_EPSILONS)) + " |")
            lines.append("")
    else:
        fiedlers = {k[2] for k in ours}
        f = min(fiedlers) if fiedlers else 0.06
        for e in sorted({k[1] for k in ours} | {0.5, 10.0}):
            lines += [f"{_fmt_eps(e)}, normalized Fiedler value {f:g}", "",
                      "| method | " + " | ".join(f"t = {t:g}" for t in PAPER_TS) + " |",
                      "|---" * (len(PAPER_TS) + 1) + "|"]
            for m in ("dsgd", "dsgt", "dinno"):
                paper = PAPER_TABLE2.get((m, e))
                lines.append(f"| {METHOD_LABEL[m]} | " + " | ".join(
                    cell((m, e, f, t), None if paper is None else paper[j]) for j, t in enumerate(PAPER_TS)) + " |")
            lines.append("")
    return "\n".join(lines)


def summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["method"], str(r["epsilon"]), str(r["fiedler_target"]), str(r["t"])), []).append(
            float(r["accuracy"]))
    return [{"method": m, "epsilon": e, "fiedler_target": f, "t": t, "seeds": len(v),
             "accuracy_mean": 100 * float(np.mean(v)), "accuracy_std": 100 * float(np.std(v))}
            for (m, e, f, t), v in sorted(groups.items())]


@REPRODUCTIONS.register("table1")
def table1(out: Path, *, seeds: int = 3, iterations: int = 2000, epsilons: tuple[float, ...] = (INF, 100, 10, 1, 0.5),
           fiedlers: tuple[float, ...] = (1.0, 0.7, 0.39, 0.06),
           methods: tuple[str, ...] = ("central", "dsgd", "dsgt", "dinno"),
           dataset: str = "fashion_mnist", data_dir: str | None = None, tune: bool = False, progress=None,
           lot: int = 256, device: str = "cpu", shard: str | None = None, **_: object) -> list[dict]:
    """Seed 004 Table 1: accuracy versus ε and normalized Fiedler value, one class per agent (A(1)); central DP-SGD
    on the pooled data is the same for every graph and is run once per ε."""
    out = Path(out)
    _check_methods(methods, ALGORITHM)
    cells = [{"method": "central", "epsilon": e, "fiedler": 1.0, "t": 1.0, "seed": s}
             for e in epsilons for s in range(seeds)] if "central" in methods else []
    cells += [{"method": m, "epsilon": e, "fiedler": f, "t": 1.0, "seed": s}
              for f in fiedlers for e in epsilons for m in methods if m != "central" for s in range(seeds)]
    return _grid(out, "table1", cells, iterations=iterations, dataset=dataset, data_dir=data_dir, tune=tune,
                 progress=progress, lot=lot, device=device, shard=shard)


@REPRODUCTIONS.register("table2")
def table2(out: Path, *, seeds: int = 3, iterations: int = 2000, epsilons: tuple[float, ...] = (0.5, 10),
           ts: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0), fiedler: float = 0.06,
           methods: tuple[str, ...] = ("dsgd", "dsgt", "dinno"), dataset: str = "fashion_mnist",
           data_dir: str | None = None, tune: bool = False, progress=None, lot: int = 256, device: str = "cpu",
           shard: str | None = None, **_: object) -> list[dict]:
    """Seed 004 Table 2: accuracy versus the A(t) split at ε ∈ {0.5, 10} on a graph of normalized Fiedler value
    0.06."""
    _check_methods(methods, [m for m in ALGORITHM if m != "central"])
    cells = [{"method": m, "epsilon": e, "fiedler": fiedler, "t": t, "seed": s}
             for e in epsilons for t in ts for m in methods for s in range(seeds)]
    return _grid(Path(out), "table2", cells, iterations=iterations, dataset=dataset, data_dir=data_dir, tune=tune,
                 progress=progress, lot=lot, device=device, shard=shard)
