"""Gradient inversion from what attackers really see: seed 002 Fig. 2 (``rms_dlg``) and one attack table across every
method (``attack_table``), through the ordinary runner (training curves, final accuracy, ledgers) and
:func:`privdl.attacks.views.attack_run` (the attacks, from the transcript of the same config's run).

Outputs of ``rms_dlg``: ``rms_dlg_curves.csv`` (test accuracy and ‖∇F(x̄)‖² per recorded round, method and dataset),
one PNG per dataset for panel (a), ``rms_dlg_attacks.csv`` (per attacked image: MSE, PSNR, SSIM, label) and one PNG
grid per dataset for panel (b) (originals above each method's reconstructions).
Outputs of ``attack_table``: ``attack_table.csv`` / ``.md`` (per method and attacker: mean ± std of PSNR and SSIM,
label accuracy, the run's formal guarantee and unit, its final test accuracy) and ``attack_table_images.csv``.
Attacks are cached per (dataset, method, attacker) in ``attacks/*.json``: an interrupted reproduction resumes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from privdl.attacks.views import attack_run, image_captions, save_rows
from privdl.experiment.plot import draw
from privdl.experiment.store import ResultStore
from privdl.reproductions.common import REPRODUCTIONS, finished_runs, packaged_config, run, with_overrides, write_csv


def _attack(out: Path, cfg: dict, method: dict, dataset: str | None, kind: str, *, attacker: int, victim: int,
            round: int, images: int, iterations: int, loss: str) -> dict:
    """One cached attack: the JSON-able result (metrics per image and mean) plus the images as tensors."""
    tag = f"{dataset or 'data'}_{method['label']}_{kind}".replace(" ", "_").replace("=", "")
    path = out / "attacks" / f"{tag}.json"
    images_path = path.with_suffix(".pt")
    if path.is_file() and images_path.is_file():
        result = json.loads(path.read_text())
        if "clamped_fraction" in result:  # else scored before reconstructions were clamped: attacked again
            result.update(torch.load(images_path))
            return result
    where = {"method": method["label"], **({"task.dataset": dataset} if dataset is not None else {})}
    result = attack_run(cfg, attacker=attacker, victim=victim, round=round, images=images, kind=kind,
                        method="idlg", iterations=iterations, loss=loss, where=where)
    pictures = {"originals": result.pop("originals"), "reconstructions": result.pop("reconstructions")}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(pictures, images_path)
    path.write_text(json.dumps(result, indent=2))
    return {**result, **pictures}


def _algorithm(cfg: dict, method: dict) -> str:
    return method.get("algorithm", cfg.get("algorithm", {})).get("name", "dsgd")


def _series(store: ResultStore, run_id: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for t, m, v in store.load_rows(run_id):
        out.setdefault(m, {})[t] = v
    return out


@REPRODUCTIONS.register("rms_dlg")
def rms_dlg(out: Path, *, iterations: int | None = None, images: int = 8, round: int = 10, attack_iterations: int = 300,
            progress: bool = False, **_: object) -> list[dict]:
    """Seed 002 Fig. 2: (a) test accuracy and squared gradient norm of DSG, DSG-RMS and EDSG-RMS on MNIST digits and
    Fashion-MNIST; (b) agent 1's iDLG reconstructions of agent 2's samples of rounds ``round`` … — as a curious
    neighbour for DSG and DSG-RMS, and for EDSG-RMS under the seed's generous assumption (labelled) and from its
    real view."""
    out = Path(out)
    cfg = packaged_config("rms_dlg")
    if iterations:
        cfg = with_overrides(cfg, {"iterations": int(iterations), "eval_every": max(1, int(iterations) // 10)})
    runs_dir = run(cfg, out / "runs_rms_dlg", progress=progress)
    store = ResultStore(runs_dir)
    curves = []
    for r in finished_runs(runs_dir):
        s = _series(store, r.run_id)
        for t in sorted(s.get("test_accuracy", {})):
            curves.append({"dataset": r.sweep["task.dataset"], "method": r.sweep["method"], "iteration": t,
                           "test_accuracy": s["test_accuracy"][t], "grad_norm_sq": s.get("grad_norm_sq", {}).get(t)})
    write_csv(out / "rms_dlg_curves.csv", curves)
    methods = cfg["sweep"]["method"]
    datasets = cfg["sweep"]["task.dataset"]
    for ds in datasets:
        for metric, label, logy in (("test_accuracy", "test accuracy", False),
                                    ("grad_norm_sq", "‖∇F(w̄)‖²", True)):
            series = [(m["label"], [c["iteration"] for c in curves if c["dataset"] == ds and c["method"] == m["label"]],
                       [c[metric] for c in curves if c["dataset"] == ds and c["method"] == m["label"]], None)
                      for m in methods]
            draw(out / f"rms_dlg_a_{metric}_{ds}.png", series, xlabel="iteration n", ylabel=label, logy=logy,
                 title=f"seed 002 Fig. 2(a), {ds} (1 run)", markers=False, size=(6.4, 4.0))
    rows, summary = [], []
    for ds in datasets:
        grid, captions = [], []
        for m in methods:
            kinds = ("generous", "curious_neighbour") if _algorithm(cfg, m) == "edsg_rms" else ("curious_neighbour",)
            for kind in kinds:
                res = _attack(out, cfg, m, ds, kind, attacker=0, victim=1, round=round, images=images,
                              iterations=attack_iterations, loss="l2")
                truth, seen = image_captions(res["images"])
                if not grid:
                    grid.append(("original", res["originals"]))
                    captions.append(truth)
                grid.append((f"{m['label']} ({kind.replace('_', ' ')})", res["reconstructions"]))
                captions.append(seen)
                for i, im in enumerate(res["images"]):
                    rows.append({"dataset": ds, "method": m["label"], "kind": kind, "image": i, **im})
                summary.append({"dataset": ds, "method": m["label"], "kind": kind,
                                **{k: res[k] for k in ("mse", "psnr", "ssim", "label_correct")},
                                "notes": " | ".join(res["notes"])})
        save_rows(out / f"rms_dlg_b_{ds}.png", grid, captions=captions,
                  title=f"seed 002 Fig. 2(b), {ds}: agent 1's iDLG reconstructions of agent 2's samples (seed 002's "
                        f"numbering; indices 0 and 1), rounds {round}–{round + images - 1}")
    write_csv(out / "rms_dlg_attacks.csv", rows)
    write_csv(out / "rms_dlg_summary.csv", summary)
    return summary


def _guarantee(ledger: dict) -> tuple[str, str]:
    eps = ledger.get("epsilon")
    if not isinstance(eps, (int, float)) or not math.isfinite(eps):  # None (no DP mechanism) or "inf"
        return "none", ledger.get("guarantee", "none")
    return f"({eps:.3g}, {ledger['delta']:.0e})", ledger.get("unit", "")


def _mean_std(values: list[float]) -> str:
    a = np.asarray(values, dtype=float)
    return f"{a.mean():.2f} ± {a.std():.2f}"


@REPRODUCTIONS.register("attack_table")
def attack_table(out: Path, *, iterations: int | None = None, images: int = 8, round: int = 10,
                 attack_iterations: int = 300, loss: str = "cosine", progress: bool = False,
                 **_: object) -> list[dict]:
    """The same victim samples (agent 2's, rounds ``round`` …) attacked by an eavesdropper and by a curious
    neighbour (agent 1) under every method of ``attack_table.toml``, beside the method's formal guarantee and its
    test accuracy after training."""
    out = Path(out)
    cfg = packaged_config("attack_table")
    if iterations:
        cfg = with_overrides(cfg, {"iterations": int(iterations), "eval_every": int(iterations)})
    runs_dir = run(cfg, out / "runs_attack_table", progress=progress)
    trained = {r.sweep["method"]: r for r in finished_runs(runs_dir)}
    table, per_image = [], []
    for m in cfg["sweep"]["method"]:
        kinds = ["eavesdropper", "curious_neighbour"] + (["generous"] if _algorithm(cfg, m) == "edsg_rms" else [])
        r = trained[m["label"]]
        guarantee, unit = _guarantee(r.ledger)
        for kind in kinds:
            res = _attack(out, cfg, m, None, kind, attacker=0, victim=1, round=round, images=images,
                          iterations=attack_iterations, loss=loss)
            for i, im in enumerate(res["images"]):
                per_image.append({"method": m["label"], "kind": kind, "image": i, **im})
            table.append({"method": m["label"], "attacker": kind, "psnr": _mean_std([i["psnr"] for i in res["images"]]),
                          "ssim": _mean_std([i["ssim"] for i in res["images"]]),
                          "label_accuracy": f"{res['label_correct']:.2f}", "guarantee": guarantee, "unit": unit,
                          "test_accuracy": f"{r.final.get('test_accuracy', math.nan):.3f}",
                          "notes": " | ".join(res["notes"])})
    write_csv(out / "attack_table.csv", table)
    write_csv(out / "attack_table_images.csv", per_image)
    head = ["method", "attacker", "psnr", "ssim", "label_accuracy", "guarantee", "unit", "test_accuracy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(row[h]) for h in head) + " |" for row in table]
    (out / "attack_table.md").write_text("\n".join(lines) + "\n")
    return table


__all__ = ["attack_table", "rms_dlg"]
