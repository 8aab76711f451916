"""Gradient-side mechanisms: what an agent does to what it computes from its data before anything leaves it
(clip + noise, DP-SGD's per-example clipping and lot noise), with the privacy events they cause.

A mechanism **declares what it needs** — :class:`BatchGradient` (the mean gradient of a uniform mini-batch) or
:class:`ClippedSum` (Σ over a Poisson lot of per-example gradients clipped to C) — and the engine does the data
access (``privdl.simulator.access``), keyed per data owner. ``privatize(value, access)`` then transforms that value
for the rows of the access: ``access.owners`` are the rows whose data was read, ``access.requesters`` the rows whose
models it was evaluated at (a cross-gradient: agent j's data at agent i's model), ``access.call`` the index of the
noisy access (1, 2, …), which keys the noise together with the owner and the requester.

Mechanisms never see the algorithm, the network's W or the data; algorithms never see the mechanism
(DESIGN.md: adding one must not touch the other). They compose with :func:`chain` (optax style): the first member
reads the data, later members transform its output, and the events follow the sensitivity along the chain — noise
added to a quantity with no sensitivity bound (e.g. before clipping) is an obfuscation with no DP guarantee.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from privdl.errors import ValidationError
from privdl.keys import Keys
from privdl.privacy.events import NonPrivateEvent, ObfuscationEvent, PrivacyEvent
from privdl.privacy.ledger import Ledger
from privdl.registry import Registry


# ---- what a mechanism needs from the data -------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchGradient:
    """The mean gradient of a mini-batch of the task's batch size, drawn uniformly with replacement from the owner's
    data (one draw per owner, requester and access)."""


@dataclass(frozen=True, eq=False)
class ClippedSum:
    """Σ_{b ∈ lot} min(1, C/‖∇l(θ; b)‖)·∇l(θ; b) over a lot of the owner's data. By default a Poisson lot: every
    example joins with probability ``rates[owner]`` (1: the whole data). With ``batch = B`` instead a uniform batch
    of min(B, m) distinct examples (a shuffled loader's first batch, as the seed-001 authors' code draws it; the
    first example is the one :class:`BatchGradient` would draw from the same key). ``clip=None`` sums unclipped
    gradients (audits of a broken mechanism). ``method``: "closed_form", "ghost", "vmap" or "auto" (per-example
    path); ``chunk`` bounds memory."""

    clip: float | None
    rates: torch.Tensor | None = None
    method: str = "auto"
    chunk: int | None = None
    batch: int | None = None

    def __post_init__(self) -> None:
        if (self.rates is None) == (self.batch is None):
            raise ValidationError("ClippedSum needs exactly one of rates (Poisson lots) or batch (uniform batches)")

    def signature(self) -> tuple:
        """What two needs must share to be computed in one access (stacked replicas)."""
        rates = None if self.rates is None else tuple(self.rates.reshape(-1).tolist())
        return ("clipped_sum", self.clip, rates, self.method, self.chunk, self.batch)


Need = BatchGradient | ClippedSum


@dataclass(frozen=True)
class Sensitivity:
    """A bound on how much one unit's data changes a quantity (L2): ``value`` for the privacy ``unit``."""

    value: float
    unit: str  # "agent" (replace one agent's data) | "example" (add/remove one example)


@dataclass(frozen=True)
class Access:
    """One noisy access: the models of ``requesters`` evaluated on the data of ``owners`` (global rows, one per
    row of the value), the ``call``-th access of the run, made in round ``t`` (0: the algorithm's init)."""

    owners: torch.Tensor
    requesters: torch.Tensor
    call: int
    everyone: bool = False  # every row of the run, each on its own data at its own model
    t: int = 0  # the round (a time-varying graph's mechanism picks W(t)'s design by it)

    @property
    def is_self(self) -> bool:
        return self.everyone or bool(torch.equal(self.owners, self.requesters))

    @property
    def all_rows(self) -> bool:
        """Every row of the run, each for itself (in row order)."""
        return self.everyone or (self.is_self and bool(
            (self.owners.cpu() == torch.arange(self.owners.numel())).all()))


@dataclass
class MechanismEnv:
    """What the engine gives a mechanism at the start of a run: the run's keys, the number of rows (replicas ×
    agents) and the purpose prefix of its keyed draws."""

    keys: Keys
    scope: str = "noise"

    @property
    def rows(self) -> int:
        return self.keys.rows


class AccessBudgetExceeded(ValidationError):
    """More noisy data accesses than the privacy accounting covers."""


def clip_rows(g: torch.Tensor, clip: float | torch.Tensor) -> torch.Tensor:
    """ĝ_i = min(1, C/‖g_i‖)·g_i for every row i; ``clip`` may be a per-row (rows, 1) tensor."""
    norms = torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).reshape(-1, *([1] * (g.ndim - 1)))
    return g * torch.clamp(clip / norms.clamp_min(torch.finfo(g.dtype).tiny), max=1.0)


def per_owner(steps: int | Sequence[int] | torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Noisy accesses per data owner as an int64 tensor (an int is the same for every owner)."""
    if isinstance(steps, torch.Tensor):
        out = steps.to(torch.int64).reshape(-1)
    elif isinstance(steps, (list, tuple)):
        out = torch.as_tensor([int(s) for s in steps], dtype=torch.int64)
    else:
        if isinstance(steps, bool) or int(steps) != steps:
            raise ValidationError(f"steps must be an integer or one integer per agent, got {steps!r}")
        out = torch.full((1 if n is None else n,), int(steps), dtype=torch.int64)
    if n is not None and out.numel() == 1 and n > 1:
        out = out.expand(n).clone()
    if n is not None and out.numel() != n:
        raise ValidationError(f"steps has {out.numel()} entries for {n} agents")
    if out.numel() and int(out.min()) < 0:
        raise ValidationError("steps must be >= 0")
    return out


class GradientMechanism(ABC):
    """Base class. ``steps`` (per owner) is what the accounting covers; a run that reads more is stopped."""

    name: str = "mechanism"
    need: Need = BatchGradient()

    def __init__(self, *, steps: int | Sequence[int] | torch.Tensor, n: int | None = None) -> None:
        self.steps = per_owner(steps, n)
        self.calls = torch.zeros_like(self.steps)
        self.env: MechanismEnv | None = None

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def bind(self, env: MechanismEnv) -> None:
        """Called by the engine before the first access: keep the keys, reset the access counts."""
        if self.steps.numel() not in (1, env.rows):
            reps, rem = divmod(env.rows, self.steps.numel())
            if rem:
                raise ValidationError(f"mechanism {self.name!r} covers {self.steps.numel()} agents, the run has "
                                      f"{env.rows} rows")
        self.env = env
        self.calls = torch.zeros(env.rows, dtype=torch.int64)
        self._budget: torch.Tensor | None = None
        self._headroom = int(self.budget().min()) if env.rows else 0
        self._repeat = None  # (owners, their counts, the largest): count's repeated access, of this run only

    @property
    def calls(self) -> torch.Tensor:
        """The accesses made per row (int64): the counts so far plus the repeated increments still pending."""
        pending = getattr(self, "_pending", None)
        if pending is not None:
            self._pending = None
            self._calls = self._calls + pending[0] * pending[1]
        return self._calls

    @calls.setter
    def calls(self, value: torch.Tensor) -> None:
        self._calls, self._pending = value, None

    def _add(self, added: torch.Tensor | int) -> None:
        """Count ``added`` more accesses per row (a checked access). The same ``added`` object as the last one (an
        access of every row, or the held frame's agents, every round) is one more pending repeat, added to the
        counts when they are read (:attr:`calls`): the same integers, without a tensor op per access."""
        pending = getattr(self, "_pending", None)
        if pending is not None and pending[0] is added:
            self._pending = (added, pending[1] + 1)
            return
        if pending is not None:
            self._calls = self._calls + pending[0] * pending[1]
        self._pending = (added, 1)

    def count(self, access: Access) -> None:
        """Count one access per row of ``access`` against its owner's budget; refuse (and count nothing) beyond it."""
        if access.everyone and getattr(self, "_headroom", 0) >= 1:  # one access per row, known to fit
            self._add(1)
            self._headroom -= 1
            return
        # the same owners tensor as the last access (a held frame's agents, every round): its counts are known and
        # ``_headroom`` (a lower bound of every row's remaining budget) says whether they fit
        repeat = getattr(self, "_repeat", None)
        if repeat is not None and repeat[0] is access.owners and getattr(self, "_headroom", 0) >= repeat[2]:
            self._add(repeat[1])
            self._headroom -= repeat[2]
            return
        added = torch.bincount(access.owners.cpu(), minlength=self.calls.numel())
        after = self.calls + added
        budget = self.budget()
        over = (after > budget).nonzero(as_tuple=True)[0]
        if over.numel():
            i = int(over[0])
            raise AccessBudgetExceeded(
                f"noisy access {int(after[i])} to the data of agent {i} exceeds the {int(budget[i])} accesses "
                f"the privacy accounting of {self.name!r} covers (an algorithm that reads the data more often than "
                f"it declares?)")
        self.calls = after
        self._headroom = int((budget - after).min())
        self._repeat = (access.owners, added, int(added.max()) if added.numel() else 0)

    def restore_calls(self, calls: torch.Tensor) -> None:
        """Continue a run (a checkpoint): the accesses already made per row."""
        if calls.shape != self.calls.shape:
            raise ValidationError(f"mechanism {self.name!r}: a checkpoint with {calls.numel()} access counts for "
                                  f"{self.calls.numel()} rows")
        self.calls = calls.to(torch.int64).clone()
        self._headroom = int((self.budget() - self.calls).min()) if self.calls.numel() else 0

    def budget(self) -> torch.Tensor:
        """Accesses covered per row (the per-owner steps, repeated over replicas), built once per run."""
        rows = self.calls.numel()
        if getattr(self, "_budget", None) is None or self._budget.numel() != rows:
            self._budget = (self.steps if self.steps.numel() == rows else
                            self.steps.repeat(rows // max(self.steps.numel(), 1)))
        return self._budget

    def accesses(self) -> torch.Tensor:
        """Accesses per owner to state in the ledger: those made, or the declared budget if none was made yet."""
        return self.calls if int(self.calls.sum()) else self.budget()

    # ---- the transformation -------------------------------------------------------------------------------------
    @abstractmethod
    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        """The protected value of the access's rows (what the agents use and share)."""

    def unprotected(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        """What :meth:`privatize` returns without its noise (an access the algorithm declares unprotected, e.g. seed
        003's published DPDL self-gradient). Mechanisms without such a release refuse."""
        raise ValidationError(f"mechanism {self.name!r} has no un-noised release; an algorithm that reads the data "
                              "without noise (dpdl with self_noise = false) needs 'dp_sgd' or 'none'")

    # ---- privacy --------------------------------------------------------------------------------------------------
    def sensitivity_after(self, before: Sensitivity | None) -> Sensitivity | None:
        """The sensitivity bound of this mechanism's output given its input's (default: unchanged)."""
        return before

    def step_events(self, before: Sensitivity | None) -> tuple[list[PrivacyEvent], Sensitivity | None] | None:
        """One access's event for every owner (row) given the input's sensitivity, with the sensitivity the noise was
        calibrated against (None: unbounded, the events are obfuscations); None if this mechanism adds no noise."""
        return None

    @property
    def unit(self) -> str:
        return "example" if isinstance(self.need, ClippedSum) else "agent"

    def input_sensitivity(self) -> Sensitivity | None:
        need = self.need
        if isinstance(need, ClippedSum) and need.clip is not None:
            return Sensitivity(float(need.clip), "example")
        return None

    accountant_name: str = "tight"
    delta: float = 0.0
    target_epsilon: float | None = None

    def noise_facts(self) -> dict:
        return {}

    def note(self) -> str:
        return ""

    def beside(self, counts: torch.Tensor) -> list[Ledger]:
        """Statements of the same noise for another privacy unit, for ``counts[i]`` accesses of owner i (e.g. the
        agent-level ε of per-example clipping); none by default."""
        return []

    def ledger(self, accesses: torch.Tensor | None = None) -> Ledger:
        """The run's privacy statement: every owner's events (one per access), accounted."""
        return _ledger(self, [self], accesses)

    def describe(self) -> dict[str, object]:
        return {"name": self.name}

    # ---- what it needs of the algorithm ---------------------------------------------------------------------------
    #: the combination the algorithm must declare (``Algorithm.combines``; :data:`privdl.comm.base.LINEAR_MIXING`
    #: for noise designed for W's mixing, or averaging that stands in for it), None: any; refused otherwise, with
    #: ``combination_reason`` (:func:`privdl.algorithms.base.check_combination`)
    needs_combination: str | None = None
    combination_reason: str = ""
    #: the kinds of message the algorithm must send each round, exactly (``Algorithm.transmits``), None: any
    needs_transmission: tuple[str, ...] | None = None
    #: False when it cannot run on a directed network (:class:`privdl.network.directed.DirectedNetwork`: a
    #: column-stochastic A, no reverse edges), with ``directed_reason`` (:func:`privdl.algorithms.base.check_directed`);
    #: True for noise that never reads W (per agent: none, clip, dp_sgd, ldp)
    directed_ok: bool = True
    directed_reason: str = ""

    # ---- what is sent ---------------------------------------------------------------------------------------------
    #: True for a mechanism that also acts on what agents send (Zip-DL's per-edge zero-sum noise, Muffliato's
    #: gossip rounds): the engine then wraps the run's Comm with :meth:`wrap_comm` once, after :meth:`bind`. Such a
    #: mechanism never stacks (:func:`privdl.mechanisms.stack.stack`) nor chains.
    wraps_comm: bool = False

    def wrap_comm(self, comm, *, keys: Keys, eta: Callable[[int], object], algorithm: str):
        """The Comm the algorithm talks through (default: ``comm`` itself). ``eta`` is the run's step-size schedule,
        ``algorithm`` its name (a mechanism valid with some algorithms only refuses the others here)."""
        return comm


def chain_events(mechs: Sequence[GradientMechanism], counts: torch.Tensor) -> tuple[list[list[PrivacyEvent]], str]:
    """Per owner, the events of ``counts[i]`` accesses through the chain ``mechs`` (the first member reads the data),
    and the privacy unit. The first noise step whose input has a sensitivity bound gives the DP event (later members
    are post-processing); a noise step without one is an obfuscation; no noise at all is a non-private use."""
    sens = mechs[0].input_sensitivity()
    found: tuple[list[PrivacyEvent], Sensitivity] | None = None
    obfuscation: list[PrivacyEvent] | None = None
    for m in mechs:
        step = m.step_events(sens)
        if step is not None:
            events, used = step
            if used is not None:
                found = (events, used)
                break
            obfuscation = obfuscation or events
        sens = m.sensitivity_after(sens)
    template = found[0] if found else obfuscation
    out = []
    for i, c in enumerate(counts.tolist()):
        if c == 0:
            out.append([])
        elif template is None:
            out.append([NonPrivateEvent(count=int(c))])
        else:
            out.append([_with_count(template[i % len(template)], int(c))])
    unit = found[1].unit if found else ("none" if template is None else mechs[0].unit)
    return out, unit


def _ledger(top: GradientMechanism, mechs: Sequence[GradientMechanism], accesses: torch.Tensor | None) -> Ledger:
    counts = top.accesses() if accesses is None else accesses
    events, unit = chain_events(mechs, counts)
    if len(mechs) == 1:
        noise, note = top.noise_facts(), top.note()
    else:
        noise = {m.name: m.noise_facts() for m in mechs if m.noise_facts()}
        note = "; ".join(n for n in (m.note() for m in mechs) if n)
    beside = [b for m in mechs for b in m.beside(counts)] if unit != "none" else []
    return Ledger.build(unit=unit, mechanism=top.name, accountant=top.accountant_name if unit != "none" else "none",
                        delta=top.delta if unit != "none" else 0.0, events=events, noise=noise, note=note,
                        target_epsilon=top.target_epsilon, beside=beside)


def _with_count(e: PrivacyEvent, count: int) -> PrivacyEvent:
    from dataclasses import replace

    return replace(e, count=count)


def obfuscation(name: str, reason: str) -> tuple[list[PrivacyEvent], None]:
    """The step events of a noise mechanism whose input has no sensitivity bound."""
    return [ObfuscationEvent(name, reason)], None


class NoPrivacy(GradientMechanism):
    """Gradients pass unchanged (non-private baselines)."""

    name = "none"

    def __init__(self, *, steps: int | Sequence[int] | torch.Tensor) -> None:
        super().__init__(steps=steps)

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        return value

    def unprotected(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        return value


class Clip(GradientMechanism):
    """Clip each agent's value to norm C (agent level: replace-one sensitivity 2C). Adds no noise: alone it is no
    protection; chained before a noise mechanism it bounds that mechanism's sensitivity."""

    name = "clip"

    def __init__(self, *, steps: int | Sequence[int] | torch.Tensor, clip: float = 1.0) -> None:
        super().__init__(steps=steps)
        if not (clip > 0 and math.isfinite(clip)):
            raise ValidationError(f"clip must be > 0, got {clip}")
        self.clip = float(clip)

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        return clip_rows(value, self.clip)

    def sensitivity_after(self, before: Sensitivity | None) -> Sensitivity | None:
        if before is not None and before.unit == "example":  # clipping a clipped sum: min of the two
            return Sensitivity(min(before.value, 2 * self.clip), before.unit)
        return Sensitivity(2 * self.clip, "agent")

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "clip": self.clip}


class Chain(GradientMechanism):
    """Members applied in order; the first reads the data (its ``need``), the others transform."""

    def __init__(self, members: Sequence[GradientMechanism]) -> None:
        members = list(members)
        if not members:
            raise ValidationError("chain needs at least one mechanism")
        first = members[0]
        wrapping = [m.name for m in members if m.wraps_comm]
        if wrapping:
            raise ValidationError(f"mechanism {wrapping[0]!r} acts on what is sent (it wraps the Comm) and cannot be "
                                  "chained; use it alone")
        super().__init__(steps=first.steps)
        self.members = members
        self.name = "chain(" + ", ".join(m.name for m in members) + ")"
        self.need = first.need
        # the members that add noise state the chain's DP (accountant, δ, target ε) — not those with a δ > 0: a
        # pure-DP member's δ is 0
        dp = [m for m in members if type(m).step_events is not GradientMechanism.step_events]
        self.delta = dp[0].delta if dp else 0.0
        self.accountant_name = dp[0].accountant_name if dp else "none"
        self.target_epsilon = dp[0].target_epsilon if dp else None

    def bind(self, env: MechanismEnv) -> None:
        super().bind(env)
        for k, m in enumerate(self.members):
            m.bind(MechanismEnv(env.keys, env.scope if k == 0 else f"{env.scope}/{k}"))

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        for m in self.members:
            value = m.privatize(value, access)
        return value

    def input_sensitivity(self) -> Sensitivity | None:
        return self.members[0].input_sensitivity()

    def ledger(self, accesses: torch.Tensor | None = None) -> Ledger:
        return _ledger(self, self.members, accesses)

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "members": [m.describe() for m in self.members]}


def chain(*members: GradientMechanism) -> Chain:
    """Compose mechanisms: ``chain(a, b)`` applies a, then b (a reads the data)."""
    return Chain(members)


MECHANISMS: Registry[Callable[..., GradientMechanism]] = Registry("mechanism")
MECHANISMS.add("none", NoPrivacy)
MECHANISMS.add("clip", Clip)

#: the old name of the base class
Mechanism = GradientMechanism

__all__ = ["Access", "AccessBudgetExceeded", "BatchGradient", "Chain", "Clip", "ClippedSum", "GradientMechanism",
           "MECHANISMS", "Mechanism", "MechanismEnv", "Need", "NoPrivacy", "Sensitivity", "chain", "clip_rows",
           "per_owner"]
