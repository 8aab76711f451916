"""What an attacker really sees, turned into the (model, gradient) pair a gradient-inversion attack needs (seed 002
§3.2, §5.2). Every view of every supported algorithm is defined here, in one place.

**Attackers.** Each has a view and nothing else:

* ``eavesdropper`` — taps every link: the whole transcript (every message of every round), the public W, the step
  sizes γ(n), the public initial model w(0) (all agents start from one w(0)) and nothing of any agent's state;
* ``curious_neighbour`` — agent a: the messages addressed to it and those it sent (``Transcript.view_of(a)``), its
  own models w_a(t), the public W, γ(n) and the public protection law and τ;
* ``generous`` — not a view: the victim's true model and the gradient it really used (after its mechanism's noise
  and its random matrix step-size), seed 002 §5.2's assumption for EDSG-RMS ("we applied w'_2(n−1) and
  M_2(n)∇J_2(w'_2(n−1); x_2(n))"). An upper bound on what any view can give; labelled as such in every result.

**Views per algorithm family** (victim v, attacked round n; values a view lacks are replaced as stated, and the
replacement is written in the observation's ``note``). An algorithm's family is read from what it declares it sends
(``Algorithm.transmits``, :data:`FAMILY_OF`): a ``model`` message (plain or ``obfuscated_``), a ``model_per_edge``,
an ``exact_diffusion`` φ, a ``tracking_model`` beside its ``tracker``; any other algorithm has no view here.

* **diffusion** — ``dsgd`` (adapt then combine; under any gradient mechanism: LDP / DECOR / Whisper / DP-SGD noise
  is part of what is sent), ``dsg_rms``, ``pd_lms``. v sends ψ_v(n) (+ its protection p_v(n), + PD-LMS's per-edge
  Laplace term). Model w_v(n−1) = Σ_ℓ a_ℓv (value ℓ sent to v in round n − 1) (own term: v's value sent to the
  attacker), minus p̂_v(n−1); gradient (w_v(n−1) − value v sent in round n + p̂_v(n))/γ(n) (seed 002 §3.2.2). The
  curious neighbour uses its own transmission for a neighbour of v it cannot hear, and removes the protection it
  cannot see with its own: p̂_v(t) = p(w_a(t − 1)) (seed 002 §5.2's (τ/√L)‖w_1(n−1)‖·1); the eavesdropper has no
  model of its own and removes none.
* **exact diffusion** — ``exact_diffusion``, ``edsg_rms`` (tag ``phi``). v sends φ^c_v(t) = φ_v(t) + p_v(t) with
  φ_v(t) = ψ_v(t) + w_v(t−1) − ψ_v(t−1), ψ_v(0) = w_v(0). The view rebuilds w_v(t) = Σ_ℓ a_ℓv φ^c_ℓ(t) − p̂_v(t)
  and ψ_v(t) = φ^c_v(t) − p̂_v(t) − w_v(t−1) + ψ_v(t−1) from round 1 on, then the gradient (w_v(n−1) − ψ_v(n))/γ(n).
  Exact for an eavesdropper on unprotected exact diffusion. Under EDSG-RMS the protection is from w'_v(t−2) and
  c'_v(−1) is random, so p̂_v(t) = p(w_a(max(t − 2, 0))) is a guess — but the guesses' errors telescope: ψ_v(t)'s
  error is p_v(t) − p̂_v(t) and w_v(t)'s the same, so the gradient of round n is off by only
  ((p − p̂)_v(n−1) − (p − p̂)_v(n))/γ, as under DSG-RMS. Seed 002 says agent 1 "is unable to estimate ψ'_2(n)" and
  attacks EDSG-RMS under the ``generous`` assumption instead; measured here (norm law, seed 002 Fig. 2's
  parameters), the curious neighbour's estimate of M·ĝ is within 1 % of the truth from round 3 on (round 2 carries
  c'(−1)) and the eavesdropper's within 1 % too, with a model off by the protection vector.
* **tracking** — ``dsgt`` (synchronous gossip). In round n agents send u(n) = θ(n−1) − η y(n−1) (tag ``theta``) and
  y(n−1) (tag ``y``); θ_v(n) = Σ_j w_vj u_j(n) and g_v(n) (the gradient at θ_v(n), noise included) telescopes:
  g_v(0) = y_v(0), g_v(t) = y_v(t) − Σ_j w_vj y_j(t−1) + g_v(t−1) — the difference of consecutive messages, summed.
  Attacking round n therefore reads the y messages up to round n + 1. The curious neighbour uses its own y_a and
  u_a for neighbours of v it cannot hear.

What any view recovers is, at best, the gradient as sent: M_v(n)·ĝ_v(n) under a random matrix step-size (never
visible), and the noisy gradient under a DP mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from privdl.comm.observers import Message
from privdl.errors import ValidationError
from privdl.network.edges import Edges

KINDS = ("eavesdropper", "curious_neighbour", "generous")
#: the kind of message a view reads first (``Algorithm.transmits``) → (view family, whether values differ per edge)
FAMILY_OF = {"model": ("diffusion", False), "obfuscated_model": ("diffusion", False),
             "model_per_edge": ("diffusion", True), "exact_diffusion": ("exact", False),
             "obfuscated_exact_diffusion": ("exact", False), "tracking_model": ("tracking", False)}


def family_of(algorithm: Any) -> tuple[str, str, bool]:
    """(view family, the tag of the message the view reads first, whether values differ per edge) of an
    :class:`~privdl.algorithms.base.Algorithm` (or a registered algorithm's name, with its default parameters), from
    the messages it declares; an algorithm that sends none a view reads is refused, naming what it sends."""
    if isinstance(algorithm, str):
        from privdl.algorithms import make_algorithm

        algorithm = make_algorithm(algorithm)
    for tag, kind in algorithm.transmits.items():
        if kind in FAMILY_OF:
            family, per_edge = FAMILY_OF[kind]
            return family, tag, per_edge
    sends = dict(algorithm.transmits) or "nothing it declares"
    raise ValidationError(f"views read messages of kinds {', '.join(FAMILY_OF)} (what an algorithm declares it "
                          f"transmits); algorithm {algorithm.name!r} sends {sends} (D-SGD adapt then combine, exact "
                          "diffusion, PD-LMS, DSGT with synchronous gossip, and the RMS forms of the first two, have "
                          "views)")


GENEROUS_NOTE = ("generous assumption (seed 002 §5.2): the victim's true model and the gradient it used (M·ĝ), "
                 "not a view")


@dataclass(frozen=True)
class Observation:
    model: torch.Tensor  # the attacker's estimate of the model the victim's gradient was computed at (d,)
    gradient: torch.Tensor  # its estimate of that gradient (d,)
    note: str


class _View:
    """The attacker's messages indexed by (tag, round) and (sender, receiver), with the replacements a partial view
    needs, each recorded as a note."""

    def __init__(self, messages: Sequence[Message], edges: Edges, *, kind: str, victim: int, attacker: int | None,
                 own: dict[int, torch.Tensor] | None, protection: Any, lag: int, per_edge: bool) -> None:
        self.pairs: dict[tuple[str, int], dict[tuple[int, int], torch.Tensor]] = {}
        self.first: dict[tuple[str, int], dict[int, torch.Tensor]] = {}
        for m in messages:
            pairs = self.pairs.setdefault((m.tag, m.t), {})
            first = self.first.setdefault((m.tag, m.t), {})
            for k, (s, d) in enumerate(zip(m.src.tolist(), m.dst.tolist())):
                pairs.setdefault((int(s), int(d)), m.payload[k])
                first.setdefault(int(s), m.payload[k])
        self.edges, self.kind, self.v, self.a = edges, kind, int(victim), attacker
        self.own, self.per_edge, self.lag = own, per_edge, lag
        self.protection = protection if kind == "curious_neighbour" else None
        into = (edges.dst == self.v).nonzero(as_tuple=True)[0]
        self.neighbours = {int(edges.src[e]): float(edges.weight[e]) for e in into}
        self.notes: set[str] = set()
        if kind == "eavesdropper" and protection is not None:
            self.notes.add("protected values used as they are (an eavesdropper has no model to guess the "
                           "protection from)")

    def value(self, tag: str, t: int, src: int, dst: int | None) -> torch.Tensor | None:
        """What ``src`` sent to ``dst`` in round t on ``tag`` as the view has it (a broadcast: any of its links)."""
        if dst is not None and (src, dst) in self.pairs.get((tag, t), {}):
            return self.pairs[(tag, t)][(src, dst)].to(torch.float64)
        got = self.first.get((tag, t), {}).get(src)
        if got is not None and self.per_edge and dst is not None:
            self.notes.add(f"per-edge values sent to another agent stand in for those sent to agent {dst}")
        return None if got is None else got.to(torch.float64)

    def victim_sent(self, tag: str, t: int) -> torch.Tensor:
        got = self.value(tag, t, self.v, self.a if self.kind == "curious_neighbour" else None)
        if got is None:
            raise ValidationError(f"the view has no message of agent {self.v} on {tag!r} in round {t}"
                                  + (f": agent {self.a} is not its neighbour" if self.kind == "curious_neighbour"
                                     else ""))
        if self.per_edge and self.kind == "eavesdropper":
            self.notes.add("the victim's per-edge values differ: the first tapped link's value is used")
        elif self.kind == "eavesdropper":
            mixed = self._weighted_copies(tag, t)
            if mixed is not None:
                return mixed
        return got

    def _weighted_copies(self, tag: str, t: int) -> torch.Tensor | None:
        """When a broadcast algorithm's victim sent different values on its links (a per-edge message mechanism:
        Zip-DL), the eavesdropper's best linear estimate of the value: the W-weighted mean of the tapped copies,
        Σ_{d≠v} w_dv (x_v + Z_{v→d}) / (1 − w_vv). Under Zip-DL's zero sum (Σ_d w_vd Z_{v→d} = 0, symmetric W) it is
        x_v − w_vv Z_{v→v} / (1 − w_vv): only the unsent own term's noise is left. None when the copies agree."""
        copies = {d: p for (src, d), p in self.pairs.get((tag, t), {}).items() if src == self.v}
        if len(copies) < 2:
            return None
        first = next(iter(copies.values()))
        if all(torch.equal(p, first) for p in copies.values()):
            return None
        out = (self.edges.src == self.v).nonzero(as_tuple=True)[0]
        weights = {int(self.edges.dst[e]): float(self.edges.weight[e]) for e in out}
        total = sum(weights[d] for d in copies)
        self.notes.add("the victim's per-edge values differ: the W-weighted mean of its tapped copies is used "
                       "(it cancels zero-sum per-edge noise up to the unsent own term)")
        return sum(weights[d] * p.to(torch.float64) for d, p in copies.items()) / total

    def combine(self, tag: str, t: int) -> torch.Tensor:
        """Σ_ℓ a_ℓv (value ℓ sent to v in round t) + a_vv (the victim's own transmission)."""
        out = float(self.edges.self_weight[self.v]) * self.victim_sent(tag, t)
        if self.per_edge:
            self.notes.add("the victim's own (unsent) term: its transmission stands in")
        for ell, weight in self.neighbours.items():
            got = self.value(tag, t, ell, self.v)
            if got is None:  # only a curious neighbour lacks one: its own transmission stands in
                got = self.value(tag, t, int(self.a), None)
                if got is None:
                    raise ValidationError(f"agent {self.a} sent nothing in round {t} on {tag!r}")
                self.notes.add(f"unheard neighbours of agent {self.v}: agent {self.a}'s own transmission used")
            out = out + weight * got
        return out

    def protection_of_victim(self, t: int) -> torch.Tensor | float:
        """p̂_v(t): the curious neighbour's guess from its own w_a(t − lag); 0 for anyone who cannot guess."""
        if self.protection is None:
            return 0.0
        if self.own is None:
            raise ValidationError("a curious neighbour of a protected algorithm needs its own models (own_models)")
        self.notes.add("victim's protection estimated from the attacker's own models (seed 002 §5.2)")
        ref = self.own[max(t - self.lag, 0)]
        return self.protection.vector(ref[None].to(torch.float64))[0]


def _diffusion(view: _View, tag: str, n: int, eta: Callable[[int], float], initial) -> tuple[torch.Tensor, ...]:
    model = _initial(initial) if n == 1 else view.combine(tag, n - 1) - view.protection_of_victim(n - 1)
    sent = view.victim_sent(tag, n) - view.protection_of_victim(n)
    return model, (model - sent) / eta(n)


def _exact(view: _View, tag: str, n: int, eta: Callable[[int], float], initial) -> tuple[torch.Tensor, ...]:
    w = _initial(initial)
    psi = w
    for t in range(1, n + 1):
        p = view.protection_of_victim(t)
        psi_t = view.victim_sent(tag, t) - p - w + psi
        if t < n:
            w = view.combine(tag, t) - p
        psi = psi_t
    return w, (w - psi) / eta(n)


def _tracking(view: _View, tag: str, n: int, eta: Callable[[int], float], initial) -> tuple[torch.Tensor, ...]:
    model = view.combine(tag, n)  # θ_v(n) = Σ_j w_vj (θ_j(n−1) − η y_j(n−1))
    g = view.victim_sent("y", 1)  # y_v(0) = g_v(0)
    for t in range(1, n + 1):  # y_v(t) travels in round t + 1; round t's y messages carry y(t − 1)
        g = view.victim_sent("y", t + 1) - view.combine("y", t) + g
    return model, g


_VIEWS = {"diffusion": _diffusion, "exact": _exact, "tracking": _tracking}


def _initial(initial: torch.Tensor | None) -> torch.Tensor:
    if initial is None:
        raise ValidationError("this view starts from the public initial model: pass initial=w(0)")
    return initial.to(torch.float64)


def observe(kind: str, messages: Sequence[Message], edges: Edges, *, victim: int, round: int,
            eta: float | Callable[[int], float], attacker: int | None = None,
            own_models: dict[int, torch.Tensor] | None = None, protection: Any = None, algorithm: Any = "dsgd",
            initial: torch.Tensor | None = None, lag: int = 1) -> Observation:
    """The (model, gradient) estimate of ``victim``'s gradient of ``round`` from ``messages`` — the attacker's view:
    the whole transcript for an eavesdropper, ``Transcript.view_of(attacker)`` for a curious neighbour.
    ``own_models[t]`` is the curious neighbour's own w_a(t); ``protection`` the public law of a protected algorithm
    (``Algorithm.wire``) and ``lag`` the round lag of its reference model; ``initial`` the public w(0); ``eta`` γ(n)
    (a number or a function of n); ``algorithm`` the run's :class:`~privdl.algorithms.base.Algorithm` or its name
    (its family: :func:`family_of`). See the module's docstring for each family's formulas."""
    return observe_rounds(kind, messages, edges, victim=victim, rounds=[round], eta=eta, attacker=attacker,
                          own_models=own_models, protection=protection, algorithm=algorithm, initial=initial,
                          lag=lag)[0]


def observe_rounds(kind: str, messages: Sequence[Message], edges: Edges, *, victim: int, rounds: Sequence[int],
                   eta: float | Callable[[int], float], attacker: int | None = None,
                   own_models: dict[int, torch.Tensor] | None = None, protection: Any = None,
                   algorithm: Any = "dsgd", initial: torch.Tensor | None = None, lag: int = 1) -> list[Observation]:
    """:func:`observe` for several rounds from one indexing of the view."""
    if kind not in KINDS:
        raise ValidationError(f"attacker kind must be one of {KINDS}, got {kind!r}")
    if kind == "generous":
        raise ValidationError("'generous' is not a view of the wire: attack_run(kind='generous') reads the victim's "
                              "state")
    if min(rounds) < 1:
        raise ValidationError(f"round must be >= 1, got {min(rounds)}")
    if kind == "curious_neighbour" and attacker is None:
        raise ValidationError("a curious neighbour view needs the attacker's index")
    family, tag, per_edge = family_of(algorithm)
    step = eta if callable(eta) else (lambda _n, e=float(eta): e)
    view = _View(messages, edges, kind=kind, victim=victim, attacker=attacker, own=own_models,
                 protection=protection, lag=lag, per_edge=per_edge)
    start = set(view.notes)  # what holds for every round (an eavesdropper on protected values)
    out = []
    for n in rounds:
        view.notes = set(start)
        model, gradient = _VIEWS[family](view, tag, int(n), step, initial)
        out.append(Observation(model, gradient, "; ".join(sorted(view.notes)) or "exact"))
    return out


def _recording(algorithm, victim: int, calls: list) -> Any:
    """``algorithm`` with every gradient call's victim row recorded as (counter, keys, model, gradient) — the
    generous assumption's oracle; the run itself is unchanged."""
    def step(s, ctx):
        raw = ctx.gradient

        def grad(models: torch.Tensor, **kw: Any) -> torch.Tensor:
            g = raw(models, **kw)
            calls.append((len(calls) + 1, ctx.keys, models[victim].detach().clone(), g[victim].detach().clone()))
            return g
        return algorithm.step(s, replace(ctx, gradient=grad))
    return algorithm._replace(step=step)


def _generous(algorithm, calls: list, victim: int, rounds: range) -> list[Observation]:
    """The victim's true model and M_v(n)·ĝ_v(n) (the run's own draw of M, from its keys) for each round."""
    rms = algorithm.rms
    out = []
    for n in rounds:
        counter, keys, model, g = calls[n - 1]
        g = g.reshape(1, -1).to(torch.float64)
        if rms is not None and not rms.identity:
            g = rms.apply(g, keys, counter, np.array([victim]))
        out.append(Observation(model.to(torch.float64), g[0], GENEROUS_NOTE))
    return out


@dataclass(frozen=True)
class Observed:
    """What :func:`observations` returns: one observation per attacked round, the victim's true samples, the run."""

    algorithm: str
    observations: list[Observation]
    inputs: torch.Tensor  # (K, *input_shape)
    labels: torch.Tensor  # (K,)
    task: Any


def _select(cfg: dict, where: dict | None):
    """The run of ``cfg`` whose sweep values include ``where`` (default: the first run)."""
    from privdl.experiment.config import expand

    specs = expand(cfg)[0]
    if where:
        specs = [s for s in specs if all(s.sweep.get(k) == v for k, v in where.items())]
        if not specs:
            raise ValidationError(f"no run of this config has sweep values {where}")
    return specs[0]


def observations(cfg: dict, *, attacker: int, victim: int, round: int, images: int = 1,
                 kind: str = "curious_neighbour", where: dict | None = None,
                 on_round: Callable[[int, int], None] | None = None) -> Observed:
    """Run one run of an ordinary config (the first, or the first whose sweep values include ``where``) as far as
    the attack needs and return ``attacker``'s estimates of ``victim``'s gradients of rounds ``round`` …
    ``round + images − 1`` beside the samples they were computed on. ``on_round(t, rounds)`` follows the run."""
    from privdl.comm.observers import Transcript
    from privdl.experiment.build import build
    from privdl.mechanisms.base import BatchGradient
    from privdl.simulator import simulate

    if kind not in KINDS:
        raise ValidationError(f"attacker kind must be one of {KINDS}, got {kind!r}")
    spec = _select(cfg, where)
    c = build(spec.config)
    name = spec.config["algorithm"]["name"]
    n = c.network.n
    family = family_of(c.algorithm)[0]
    if kind == "generous" and family == "tracking":
        raise ValidationError("the generous assumption is defined for one gradient per round (D-SGD, exact "
                              "diffusion families), not for dsgt")
    need = c.mechanism.need
    if c.task.batch_size != 1 or not hasattr(c.task, "model") or not (
            isinstance(need, BatchGradient) or getattr(need, "batch", None) == 1):
        raise ValidationError("the attack inverts single-sample gradients of a model task: set [task] batch_size = 1 "
                              "(and, for dp_sgd, uniform batches of 1: Poisson lots have no single sample)")
    for who, value in (("attacker", attacker), ("victim", victim)):
        if not 0 <= value < n:
            raise ValidationError(f"{who} must be an agent 0..{n - 1}, got {value}")
    if attacker == victim:
        raise ValidationError("attacker and victim must be different agents")
    if c.network.dynamics is not None:
        raise ValidationError(f"the {kind} view undoes one W's weights to read the victim's update; [network] "
                              f"dynamics = {c.network.dynamics.name!r} changes W every round (attacks on time-varying "
                              "graphs are not implemented)")
    if kind == "curious_neighbour" and attacker not in c.network.neighbours(victim):
        raise ValidationError(f"agent {attacker} is not a neighbour of agent {victim} (neighbours: "
                              f"{sorted(c.network.neighbours(victim))}); it sees none of its messages — use "
                              "--kind eavesdropper, or a neighbour")
    if images < 1:
        raise ValidationError("images must be >= 1")
    held = int(c.task.counts[victim]) if hasattr(c.task, "counts") else images
    if images > held:
        raise ValidationError(f"--images {images} is more than agent {victim}'s {held} samples: K consecutive rounds "
                              "would attack some samples twice")
    if round < 1:
        raise ValidationError(f"round must be >= 1, got {round}")
    extra = 1 if family == "tracking" else 0  # g_v(n) of DSGT is read from round n + 1's y message
    last = round + images - 1
    if last + extra > spec.config["iterations"]:
        raise ValidationError(f"rounds {round}..{last} (+{extra} to read them) go beyond the run's "
                              f"{spec.config['iterations']} iterations")
    transcript, own, calls, drawn = Transcript(), {}, [], {}

    def seen(t: int, access, batch) -> None:  # the engine's record of the victim's samples, by round
        examples = batch[0] if isinstance(batch[0], tuple) else batch
        rows = (access.owners == victim).nonzero().reshape(-1)
        if t not in drawn and rows.numel():
            drawn[t] = tuple(x[rows[0]].clone() for x in examples)

    algorithm = _recording(c.algorithm, victim, calls) if kind == "generous" else c.algorithm
    simulate(task=c.task, network=c.network, algorithm=algorithm, mechanism=c.mechanism, schedule=c.schedule,
             iterations=last + extra, seed=spec.config["seed"], metrics=False, eval_every=1,
             observers=[] if kind == "generous" else [transcript],
             on_record=lambda t, x: own.__setitem__(t, x[attacker].clone()), on_access=seen,
             on_step=None if on_round is None else lambda t: on_round(t, last + extra))
    rounds = range(round, last + 1)
    if kind == "generous":
        obs = _generous(c.algorithm, calls, victim, rounds)
    else:
        view = transcript.messages if kind == "eavesdropper" else transcript.view_of(attacker)
        obs = observe_rounds(kind, view, c.network.edges, victim=victim, rounds=rounds,
                             eta=lambda t: float(c.schedule(t)), attacker=attacker, own_models=own,
                             protection=c.algorithm.wire, algorithm=c.algorithm, initial=own[0],
                             lag=int(c.algorithm.facts.get("protection_lag", 1)))
    truth = [drawn[r] for r in rounds]  # the samples of the victim's access in round r (the observed gradient's)
    x = torch.cat([t[0] for t in truth]).reshape(images, *c.task.model.input_shape).to(torch.float64)
    y = torch.cat([t[1] for t in truth]).long()
    return Observed(name, obs, x, y, c.task)


def attack_run(cfg: dict, *, attacker: int, victim: int, round: int, images: int = 1, kind: str = "curious_neighbour",
               method: str = "idlg", iterations: int = 300, loss: str = "l2", restarts: int = 1,
               progress=None, where: dict | None = None, on_round: Callable[[int, int], None] | None = None) -> dict:
    """:func:`observations`, then DLG/iDLG on all K of them as one batched optimisation (``method = "analytic"``:
    the exact inversion of a linear model with a bias, :func:`privdl.attacks.gradient_inversion.linear_inversion`,
    clamped to the training data's range). Every reconstruction is scored clamped to the training data's (public)
    range, as an attacker who knows the domain reads it; ``clamped_fraction`` (per image and mean) is the share of
    its entries the optimisation had left outside — near 1 when the attack diverged. Returns the per-image and
    mean metrics, the originals and the (clamped) reconstructions. ``on_round(t, rounds)`` follows the run,
    ``progress(done, total)`` the L-BFGS iterations."""
    from privdl.attacks.gradient_inversion import dlg, idlg, linear_inversion, reconstruction_metrics

    if method not in ("dlg", "idlg", "analytic"):
        raise ValidationError(f"attack method must be 'dlg', 'idlg' or 'analytic' (linear models), got {method!r}")
    got = observations(cfg, attacker=attacker, victim=victim, round=round, images=images, kind=kind, where=where,
                       on_round=on_round)
    theta = torch.stack([o.model for o in got.observations])
    grads = torch.stack([o.gradient for o in got.observations])
    ds = got.task.dataset
    bounds = (float(ds.X_train.min()), float(ds.X_train.max()))  # the data's public range
    if method == "analytic":  # x = ∇_W/∇_b
        rec = linear_inversion(got.task.model, grads)
    else:
        fn = idlg if method == "idlg" else dlg
        rec = fn(got.task.model, theta, grads, classes=int(got.task.dataset.n_classes), iterations=iterations,
                 loss=loss, restarts=restarts, progress=progress)
    # scored as an attacker who knows the data's domain reads it: what the inversion put outside the range is clamped
    # into it; `outside` says how much of each image that was
    flat = rec.inputs.detach().reshape(rec.inputs.shape[0], -1)
    outside = ((flat < bounds[0]) | (flat > bounds[1])).to(torch.float64).mean(dim=1)
    rec = replace(rec, inputs=rec.inputs.clamp(*bounds))
    per = reconstruction_metrics(got.inputs, rec.inputs)
    for m, guess, truth_label, out in zip(per, rec.labels.tolist(), got.labels.tolist(), outside.tolist()):
        m["label_correct"] = bool(guess == truth_label)
        m["label"], m["true_label"] = int(guess), int(truth_label)
        m["clamped_fraction"] = float(out)
    mean = {k: float(np.mean([m[k] for m in per])) for k in ("mse", "psnr", "ssim", "label_correct",
                                                             "clamped_fraction")}
    return {"algorithm": got.algorithm, "kind": kind, "attacker": attacker, "victim": victim,
            "rounds": [round, round + images - 1], "method": method, "iterations": iterations,
            "notes": sorted({o.note for o in got.observations}), **mean, "images": per, "originals": got.inputs,
            "reconstructions": rec.inputs}


def save_rows(path, rows: Sequence[tuple[str, torch.Tensor]], *, captions: Sequence[Sequence[str] | None] = (),
              title: str = "") -> None:
    """Rows of K images each (label, (K, C, H, W)), one row per label, as one PNG: each row's label above it in a
    readable size, ``captions[i][j]`` (e.g. PSNR and the guessed label) under image j of row i, ``title`` on top
    (wrapped to the figure's width)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = max(int(r[1].shape[0]) for r in rows)
    below = 0.45 if any(captions) else 0.0  # room for two lines of caption under a row
    width = max(1.7 * k, 5.5)
    fig, axes = plt.subplots(len(rows), k, figsize=(width, (1.75 + below) * len(rows) + (0.5 if title else 0.0)),
                             squeeze=False)
    for i, (label, imgs) in enumerate(rows):
        words = captions[i] if i < len(captions) and captions[i] else ()
        for j in range(k):
            ax = axes[i][j]
            ax.axis("off")
            if j < imgs.shape[0]:
                a = imgs[j].detach().cpu().to(torch.float64)
                ax.imshow((a[0] if a.shape[0] == 1 else a.permute(1, 2, 0).clamp(0, 1)).numpy(), cmap="gray")
            if j < len(words):
                ax.text(0.5, -0.04, words[j], transform=ax.transAxes, ha="center", va="top", fontsize=8)
        axes[i][0].set_title(label, fontsize=10, fontweight="bold", loc="left")
    if title:
        fig.suptitle(textwrap.fill(title, width=int(width * 11)), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def image_captions(images: Sequence[dict]) -> tuple[list[str], list[str]]:
    """Captions of an attack's originals (the true label) and reconstructions (PSNR, SSIM, the label read off the
    gradient and whether it is right), from its per-image metrics."""
    truth = [f"label {m['true_label']}" for m in images]
    rec = [f"PSNR {m['psnr']:.1f} dB, SSIM {m['ssim']:.2f}\nlabel {m['label']} "
           f"{'(right)' if m['label_correct'] else '(wrong)'}" for m in images]
    return truth, rec


def save_grid(path, originals: torch.Tensor, reconstructions: torch.Tensor, *, images: Sequence[dict] = (),
              title: str = "") -> None:
    """Originals (top row) above their reconstructions (bottom row), as one PNG; with the attack's per-image metrics
    (``images``) each image carries its label and each reconstruction its PSNR, SSIM and guessed label."""
    save_rows(path, [("original", originals), ("reconstruction", reconstructions)],
              captions=image_captions(images) if images else (), title=title)


__all__ = ["FAMILY_OF", "GENEROUS_NOTE", "KINDS", "Observation", "Observed", "attack_run", "family_of", "observations",
           "observe", "observe_rounds", "image_captions", "save_grid", "save_rows"]
