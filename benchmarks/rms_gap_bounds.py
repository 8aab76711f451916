"""Seed 002's average-gap bounds (14) and (19) against the exact running average (eval_every = 1, which
``privdl reproduce rms_remarks`` does not record), at the settings of rms_remarks, N = 20 000 rounds, 4 seeds:

    python benchmarks/rms_gap_bounds.py        # ≈ 10 min on 2 cores; one JSON line per setting

Quoted in REPRODUCTION.md (seed 002, "The error bounds of Theorems 1–2, measured")."""
import warnings, json
import numpy as np, torch
warnings.simplefilter("ignore")
from privdl.reproductions.common import packaged_config, with_overrides
from privdl.reproductions.rms_remarks import _admitted
from privdl.experiment.config import expand
from privdl.experiment.build import build
from privdl.algorithms.rms_bounds import with_error_bounds
from privdl.simulator import simulate

T, SEEDS = 20000, 4
out = []
def one(cfg, label):
    ratios = []
    for spec in expand(cfg)[0]:
        c = build(spec.config)
        res = simulate(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism, schedule=c.schedule,
                       iterations=T, seed=spec.config["seed"], eval_every=1)
        rows, acct = with_error_bounds(spec.config, c, res.records)
        d = {(t, m): v for t, m, v in rows}
        ratios.append((d[(T, "avg_gap")], d[(T, "gap_bound")]))
    a = np.array(ratios)
    r = {"setting": label, "avg_gap": a[:, 0].mean(), "gap_bound": a[:, 1].mean(), "ratio": a[:, 1].mean() / a[:, 0].mean()}
    print(json.dumps(r), flush=True)

c3 = packaged_config("rms_remark3")
g, tau = _admitted(c3, ("dsg_rms",))
for eta in (g, g / 4):
    for het in (True, False):
        cfg = with_overrides(c3, {"seeds": SEEDS, "iterations": T, "eval_every": 1, "algorithm.tau": tau,
                                  "sweep.schedule.eta": [eta], "sweep.task.heterogeneous": [het],
                                  "sweep.algorithm.sigma_z": [0.2]})
        one(cfg, f"remark3 dsg_rms het={het} gamma={eta:.3g} sigma_z=0.2")
c4 = packaged_config("rms_remark4")
g, tau = _admitted(c4, ("dsg_rms", "edsg_rms"))
for graph in ("ER(0.3)", "ring", "complete"):
    for alg in ("dsg_rms", "edsg_rms"):
        cfg = with_overrides(c4, {"seeds": SEEDS, "iterations": T, "eval_every": 1, "algorithm.tau": tau,
                                  "schedule.eta": g, "sweep.algorithm.name": [alg],
                                  "sweep.graph": [x for x in c4["sweep"]["graph"] if x["label"] == graph]})
        one(cfg, f"remark4 {alg} {graph} gamma={g:.3g}")
