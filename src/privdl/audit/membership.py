"""Membership-inference audit of example-level DP training (seed 004 App. D; SPEC §4, §8).

D: ``per_class`` images of each of three classes, one class per agent (3 agents, complete graph); the canary z is
held by agent 0 in the "in" world: seed 004's blank image labelled with D's first class, or the self-test's bright
image (every pixel = :data:`BRIGHT`) labelled with a class D lacks. Many systems are trained on D and on D ∪ {z}, all
as independent copies on one agent axis (a block-diagonal :class:`privdl.comm.StackedComm`); the score of a system
is the log-odds log(p/(1 − p)) of z's label under agent 0's model, from its logits in float64 (Carlini et al.'s
logit scaling: the order of minus the loss, which alone decides a threshold test, without float32's loss rounding
to 0 when the model is sure). The threshold is chosen on held-out models and ε is bounded from the rest
(:mod:`privdl.audit.estimators`). The noise is calibrated with a public, fixed sampling rate, so it is the same in
both worlds.

**Why the bright canary has a label D lacks.** A model trained on D never predicts that class for z, so in the "in"
world z's gradient stays at the clipping norm C in every round (the worst case the DP bound is tight for) and only
the mechanism's noise hides it; with a class D has, the models soon fit z, its gradient vanishes and there is
nothing left to detect. Even so, a final-model attack on agent 0 sees a fraction of what the mechanism leaks: the
noise of all three agents reaches agent 0's model, the step sizes decay, and DiNNO's Adam steps (reset every round)
keep only the sign of each noisy coordinate. Measured at σ/10 (100 + 100 softmax models, MNIST; separation of the
in and out scores in pooled standard deviations): central 4.0, DP-DSGD 2.1, DP-DSGT 1.9, DP-DiNNO 1.2 — too little
for DiNNO to be flagged reliably with fewer than thousands of models. The self-test's broken noise is therefore σ/30
(separations 8.2, 5.8, 5.9 and 3.5: about three times those at σ/10), which 100 + 100 models flag every time
(REPRODUCTION.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from privdl.algorithms import make_algorithm
from privdl.audit.estimators import OneRunAudit, ThresholdAudit, one_run_audit, threshold_audit
from privdl.data import load_dataset
from privdl.comm import StackedComm
from privdl.data.datasets import Dataset
from privdl.errors import ValidationError
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.privacy.ledger import statement
from privdl.keys import derive_seed
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.tasks.models import cnn, linear
from privdl.tasks.supervised import SupervisedTask, _image_shape

#: seed 004's learning rates at ε = 1 (their configs), used as audit defaults: (algorithm params, schedule)
DEFAULTS: dict[str, tuple[dict, dict]] = {
    "dsgd": ({"name": "dsgd", "form": "cta"}, {"name": "geometric", "eta_start": 0.0365, "eta_end": 0.005}),
    "dsgt": ({"name": "dsgt"}, {"name": "geometric", "eta_start": 0.0602, "eta_end": 0.005}),
    "dinno": ({"name": "dinno", "rho": 0.5, "rho_scale": 1.0003, "optimizer": "adam", "reset_optimizer": True},
              {"name": "geometric", "eta_start": 0.01, "eta_end": 0.0005}),
    "central": ({"name": "dsgd", "form": "cta", "optimizer": {"name": "sgd", "momentum": 0.9, "weight_decay": 1e-4}},
                {"name": "constant", "eta": 0.194}),
    # seed 003 (our step sizes: D-SGD's schedule): the published form's ε is that of its cross-gradients only (its
    # self-gradient is un-noised); the audit shows whether it leaks beyond it. With self-noise: fully accounted.
    "dpdl": ({"name": "dpdl"}, {"name": "geometric", "eta_start": 0.0365, "eta_end": 0.005}),
    "dpdl_self_noise": ({"name": "dpdl", "self_noise": True}, {"name": "geometric", "eta_start": 0.0365,
                                                                "eta_end": 0.005}),
}
#: methods that claim no DP guarantee (seed 002's obfuscations, PD-LMS's unbounded Laplace perturbations), audited
#: without a DP mechanism: each step uses a uniform mini-batch of the agent's whole data size (with replacement); the
#: audit's ε lower bound is then what membership inference shows against a method that states none (D-SGD's schedule)
NO_CLAIM: dict[str, tuple[dict, dict]] = {
    "dsg_rms": ({"name": "dsg_rms", "sigma_z": 0.1, "tau": 0.1, "structure": "sparse"}, DEFAULTS["dsgd"][1]),
    "edsg_rms": ({"name": "edsg_rms", "sigma_z": 0.1, "tau": 0.1, "structure": "sparse"}, DEFAULTS["dsgd"][1]),
    "pd_lms": ({"name": "pd_lms", "scheme": "nullspace", "variance": 1e-4}, DEFAULTS["dsgd"][1]),
}
#: pixel value of the "bright" canary: its gradient norm exceeds C = 10 many times over, so disabled clipping shows
BRIGHT = 10.0
#: the self-test's deliberately broken mechanisms: noise σ/30 (see the module's docstring for why not σ/10), or none
#: of the per-example clipping
NOISE_DIVISOR = 30
BROKEN = {"none": {}, "noise": {"unsafe_noise_scale": 1.0 / NOISE_DIVISOR}, "clip": {"unsafe_no_clip": True}}


@dataclass
class AuditSetup:
    algorithm: str = "dsgd"  # dsgd | dsgt | dinno | central | dpdl | dpdl_self_noise, or a method claiming no DP:
    # dsg_rms | edsg_rms | pd_lms
    epsilon: float = 1.0
    delta: float = 1e-2
    clip: float = 10.0
    iterations: int = 100
    model: str = "cnn"  # cnn | softmax
    dataset: str = "mnist_t10k"
    classes: tuple[int, ...] = (0, 1, 2)
    per_class: int = 100
    canary: str = "blank"  # blank (seed 004) | bright (every pixel = BRIGHT, a class D lacks: a gradient at the clip)
    broken: str = "none"  # none | noise (σ/30) | clip (no clipping)
    data_dir: str | None = None
    eta_scale: float = 1.0

    def check(self) -> None:
        if self.algorithm not in DEFAULTS and self.algorithm not in NO_CLAIM:
            raise ValidationError(f"unknown audit algorithm {self.algorithm!r}; valid: "
                                  f"{', '.join([*DEFAULTS, *NO_CLAIM])}")
        if self.broken not in BROKEN:
            raise ValidationError(f"unknown broken mode {self.broken!r}; valid: {', '.join(BROKEN)}")
        if self.claims_none and self.broken != "none":
            raise ValidationError(f"{self.algorithm} has no DP mechanism to break (broken = {self.broken!r})")
        if self.canary not in ("blank", "bright"):
            raise ValidationError(f"unknown canary {self.canary!r}; valid: blank, bright")
        if self.model not in ("cnn", "softmax"):
            raise ValidationError(f"unknown audit model {self.model!r}; valid: cnn, softmax")


    @property
    def claims_none(self) -> bool:
        """True for methods that state no DP guarantee (nominal ε = ∞)."""
        return self.algorithm in NO_CLAIM

    @property
    def nominal_epsilon(self) -> float:
        return float("inf") if self.claims_none else self.epsilon


def _audit_data(setup: AuditSetup, extra: int = 0, seed: int = 0) -> tuple[Dataset, list[np.ndarray], list[int]]:
    """D (``per_class`` examples of each class, in dataset order), the canary appended as the last training example,
    and ``extra`` further candidate canaries (other images with random labels) before it."""
    ds = load_dataset(setup.dataset, **({"data_dir": setup.data_dir} if setup.data_dir else {}))
    groups = []
    for c in setup.classes:
        idx = np.flatnonzero(ds.y_train == c)[: setup.per_class]
        if len(idx) < setup.per_class:
            raise ValidationError(f"{setup.dataset} has only {len(idx)} training images of class {c}")
        groups.append(idx)
    used = np.concatenate(groups)
    rng = np.random.default_rng(seed)
    others = rng.choice(np.setdiff1d(np.arange(len(ds.y_train)), used), size=extra, replace=False)
    z = np.zeros_like(ds.X_train[:1]) + (BRIGHT if setup.canary == "bright" else 0.0)
    X = np.concatenate([ds.X_train[used], ds.X_train[others], z])
    y = np.concatenate([ds.y_train[used], rng.integers(0, ds.n_classes, size=extra),
                        [canary_label(setup, ds.n_classes)]])
    sub = Dataset(f"{setup.dataset}-audit", X, y.astype(np.int64), ds.X_test[:1000], ds.y_test[:1000], ds.n_classes)
    offsets = np.cumsum([0] + [len(g) for g in groups])
    parts = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(groups))]
    canaries = list(range(len(used), len(used) + extra))
    return sub, parts, canaries


def canary_label(setup: AuditSetup, classes: int) -> int:
    """z's label: D's first class for seed 004's blank canary; for the bright canary the first class D lacks (so
    no model fits z and its gradient stays at the clipping norm: see the module's docstring)."""
    if setup.canary == "blank":
        return setup.classes[0]
    absent = [c for c in range(classes) if c not in setup.classes]
    if not absent:
        raise ValidationError(f"the bright canary needs a class D lacks, but D holds all {classes} classes "
                              f"({setup.classes})")
    return absent[0]


def _model(setup: AuditSetup, ds: Dataset):
    if setup.model == "cnn":
        return cnn(_image_shape(ds), ds.n_classes)
    return linear(int(np.prod(ds.feature_shape)), ds.n_classes)


def _train(setup: AuditSetup, ds: Dataset, agent_parts: list[list[np.ndarray]], seed: int,
           init_seed: int, device: str = "cpu", on_step: Callable[[int], None] | None = None,
           ) -> tuple[SupervisedTask, torch.Tensor, int, list[dict]]:
    """Train len(agent_parts) independent systems at once; returns the task, final models (copies·n₀, d), n₀ and
    what the training guarantees (the run's whole statement: mechanism, the algorithm's parts, un-noised accesses)."""
    central = setup.algorithm == "central"
    n0 = len(agent_parts[0])
    copies = len(agent_parts)
    flat_parts = [p for system in agent_parts for p in system]
    model = _model(setup, ds)
    lot = setup.per_class * (len(setup.classes) if central else 1)
    task = SupervisedTask("audit", ds, model, copies * n0, partition_name="explicit",
                          partition_params={"parts": flat_parts}, batch_size=lot if setup.claims_none else 1,
                          l2=0.0, zero_init=False, rng=np.random.default_rng(0), dtype=torch.float32,
                          eval_train_samples=1)
    alg_params, sched = NO_CLAIM[setup.algorithm] if setup.claims_none else DEFAULTS[setup.algorithm]
    algorithm = make_algorithm(alg_params["name"], **{k: v for k, v in alg_params.items() if k != "name"})
    base = Network.from_topology("complete", n0, lazy="positive_definite" in algorithm.requires)
    comm = StackedComm.copies(base, copies)
    calls = algorithm.accesses(setup.iterations, comm.edges)
    if setup.claims_none:
        mechanism = make_mechanism("none", steps=calls)
    else:
        # the RDP accountant, as seed 004's audit (App. D, Table 5) and the audits REPRODUCTION.md reports
        mechanism = make_mechanism("dp_sgd", steps=calls, task=task, clip=setup.clip, lot_size=lot,
                                   sample_rate=1.0, epsilon=setup.epsilon, delta=setup.delta, accountant="rdp",
                                   **BROKEN[setup.broken])
    sched_params = {k: (v * setup.eta_scale if k.startswith("eta") else v) for k, v in sched.items() if k != "name"}
    schedule = make_schedule(sched["name"], iterations=setup.iterations, **sched_params)
    x0 = model.init(torch.Generator().manual_seed(init_seed), torch.float32).expand(copies * n0, -1).clone()
    res = simulate(task=task, comm=comm, algorithm=algorithm, mechanism=mechanism, schedule=schedule,
                   iterations=setup.iterations, seed=seed, x0=x0, metrics=False, device=device, on_step=on_step)
    return task, res.final, n0, [statement(mechanism, algorithm, iterations=setup.iterations,
                                           edges=comm.edges).to_dict()]


def log_odds(task: SupervisedTask, models: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each model's log-odds log(p_y/(1 − p_y)) = logit_y − logsumexp_{j≠y} logit_j on each example, in float64:
    (models, examples). Higher = more member-like; the same order as minus the cross-entropy."""
    with torch.no_grad():
        logits = torch.vmap(lambda th: task.model.predict(th, X))(models).to(torch.float64)
    own = logits.gather(-1, y.expand(len(models), -1)[..., None])[..., 0]
    others = logits.scatter(-1, y.expand(len(models), -1)[..., None], float("-inf"))
    return own - torch.logsumexp(others, dim=-1)


@dataclass
class MembershipAuditResult:
    setup: AuditSetup
    threshold: ThresholdAudit
    nominal_epsilon: float
    scores_in: np.ndarray = field(repr=False)
    scores_out: np.ndarray = field(repr=False)
    seconds: float = 0.0
    ledger: list = field(default_factory=list)

    @property
    def violation(self) -> bool:
        return self.threshold.epsilon_lower > self.nominal_epsilon


def membership_audit(setup: AuditSetup, models: int = 1000, *, held_out: float = 0.2, batch: int = 200,
                     seed: int = 0, confidence: float = 0.95,
                     progress: Callable[[int, int], None] | None = None, device: str = "cpu") -> MembershipAuditResult:
    """Train ``models`` systems with and ``models`` without the canary (vectorised ``batch`` at a time, on
    ``device``) and bound ε from agent 0's log-odds of z's label. ``progress(done, total)`` counts rounds of systems
    trained (2 · models · iterations in all), after every round."""
    setup.check()
    if models < 2:
        raise ValidationError(f"models must be >= 2, got {models}")
    start = time.perf_counter()
    ds, parts, _ = _audit_data(setup, seed=seed)
    z = len(ds.y_train) - 1
    if setup.algorithm == "central":
        parts = [np.concatenate(parts)]
    with_z = [np.append(parts[0], z)] + parts[1:]
    scores = {True: [], False: []}
    ledger: list = []
    done, total = 0, 2 * models
    chunk = 0
    while done < total:
        k = min(batch, total - done)
        worlds = [(done + c) % 2 == 0 for c in range(k)]  # alternate in/out inside every batch
        systems = [with_z if w else parts for w in worlds]
        rounds = setup.iterations * done
        task, final, n0, ledger = _train(
            setup, ds, systems, seed=derive_seed(seed, "audit", chunk), init_seed=seed, device=device,
            on_step=None if progress is None else lambda t: progress(rounds + k * t, total * setup.iterations))
        agent0 = final.reshape(k, n0, -1)[:, 0]
        score = log_odds(task, agent0, torch.as_tensor(ds.X_train[z:z + 1]), torch.as_tensor(ds.y_train[z:z + 1]))
        for w, s in zip(worlds, score[:, 0].tolist()):
            scores[w].append(s)
        done += k
        chunk += 1
    s_in, s_out = np.array(scores[True]), np.array(scores[False])
    audit = threshold_audit(s_in, s_out, setup.delta, held_out=held_out, confidence=confidence, seed=seed)
    return MembershipAuditResult(setup, audit, setup.nominal_epsilon, s_in, s_out, time.perf_counter() - start,
                                 ledger)


def one_run_membership_audit(setup: AuditSetup, canaries: int = 200, *, seed: int = 0,
                             confidence: float = 0.95, device: str = "cpu") -> tuple[OneRunAudit, list]:
    """Steinke et al.'s one-run audit: ``canaries`` extra images with random labels, each put in agent 0's data
    with probability 1/2, one training run, scores = agent 0's log-odds of each canary's label."""
    setup.check()
    ds, parts, cands = _audit_data(setup, extra=canaries, seed=seed)
    rng = np.random.default_rng(derive_seed(seed, "one-run"))
    included = rng.random(canaries) < 0.5
    if setup.algorithm == "central":
        parts = [np.concatenate(parts)]
    system = [np.concatenate([parts[0], np.array(cands)[included]])] + parts[1:]
    task, final, n0, ledger = _train(setup, ds, [system], seed=derive_seed(seed, "one-run", "train"), init_seed=seed,
                                     device=device)
    X = torch.as_tensor(ds.X_train[cands])
    y = torch.as_tensor(ds.y_train[cands])
    result = one_run_audit(log_odds(task, final[:1], X, y)[0].numpy(), included, setup.delta, confidence=confidence)
    return result, ledger


def membership_scores(model, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Membership scores of examples (X, y) under one model θ, in float64: the log-odds of each example's label —
    (2y − 1)·z for a binary model's logit z, logit_y − logsumexp_{j≠y} logit_j otherwise (:func:`log_odds`).
    Higher = more member-like."""
    with torch.no_grad():
        logits = model.predict(theta.to(torch.float64), X.to(torch.float64)).to(torch.float64)
    y = y.to(torch.int64)
    if logits.ndim == 1:
        return ((2.0 * y.to(torch.float64) - 1.0) * logits).numpy()
    own = logits.gather(-1, y[:, None])[:, 0]
    others = logits.scatter(-1, y[:, None], float("-inf"))
    return (own - torch.logsumexp(others, dim=-1)).numpy()


@dataclass
class ConfigAudit:
    """:func:`config_membership_audit`'s result: the one-run bound, what was audited and how long it took."""

    audit: OneRunAudit
    victim: int
    canaries: int
    included: int
    seconds: float
    note: str


def config_membership_audit(cfg: dict, *, canaries: int = 200, victim: int = 0, seed: int = 0,
                            confidence: float = 0.95) -> ConfigAudit:
    """Steinke et al.'s one-run audit of any ordinary single-run config (``RunSpec.config``): ``canaries`` test
    examples, each with a wrong label (true label + a uniform non-zero shift, mod the classes), each put in
    ``victim``'s training data with probability 1/2 (the rest of the data, the network, the algorithm, the
    mechanism — calibrated on the augmented data — the schedule and the length are the config's); one run; the
    scores are the log-odds of each canary's label under the victim's final model (:func:`membership_scores`).

    Every design here lets an eavesdropper on all links recompute the victim's model from what it received, so the
    score is computable from that view; the bound is on example-level ε (adding or removing one canary), which any
    agent-level (ε, δ) guarantee also bounds. It is a lower bound: weak with few canaries, never a proof of privacy."""
    from privdl.experiment.build import build, build_network, build_task

    start = time.perf_counter()
    network = build_network(cfg["network"], int(cfg["seed"]), cfg.get("base_dir"))
    task = build_task(cfg, network.n)
    if not isinstance(task, SupervisedTask):
        raise ValidationError(f"the membership audit needs a supervised task with a dataset, not {task.name!r}")
    if not 0 <= victim < task.n:
        raise ValidationError(f"victim must be an agent 0..{task.n - 1}, got {victim}")
    ds = task.dataset
    if canaries < 2 or canaries > len(ds.y_test):
        raise ValidationError(f"canaries must be between 2 and the {len(ds.y_test)} test examples of "
                              f"{ds.name!r}, got {canaries}")
    rng = np.random.default_rng(derive_seed(seed, "config-audit", int(cfg["seed"])))
    picked = rng.choice(len(ds.y_test), size=canaries, replace=False)
    X_c = ds.X_test[picked]
    y_c = ((ds.y_test[picked] + rng.integers(1, ds.n_classes, size=canaries)) % ds.n_classes).astype(np.int64)
    included = rng.random(canaries) < 0.5
    rest = np.setdiff1d(np.arange(len(ds.y_test)), picked)
    aug = Dataset(f"{ds.name}-canaries", np.concatenate([ds.X_train, X_c]), np.concatenate([ds.y_train, y_c]),
                  ds.X_test[rest], ds.y_test[rest], ds.n_classes, source=ds.source)
    parts = [np.asarray(p) for p in task.parts]
    parts[victim] = np.concatenate([parts[victim], len(ds.y_train) + np.flatnonzero(included)])
    audited = SupervisedTask(task.name, aug, task.model, task.n, partition_name="explicit",
                             partition_params={"parts": parts}, batch_size=task.batch_size, l2=task.l2,
                             zero_init=task.zero_init, rng=np.random.default_rng(0), dtype=task.dtype,
                             eval_train_samples=1)
    c = build(cfg, task=audited)
    res = simulate(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism,
                   schedule=c.schedule, iterations=int(cfg["iterations"]), seed=int(cfg["seed"]), metrics=False,
                   sparse=c.sparse)
    scores = membership_scores(task.model, res.final[victim], torch.as_tensor(X_c), torch.as_tensor(y_c))
    delta = float(cfg.get("mechanism", {}).get("delta", 1e-5))
    audit = one_run_audit(scores, included, delta, confidence=confidence)
    return ConfigAudit(audit, victim, canaries, int(included.sum()), time.perf_counter() - start,
                       f"one-run audit (Steinke et al.): {canaries} mislabelled test examples, each in agent "
                       f"{victim}'s data with probability 1/2, scored on its final model")
