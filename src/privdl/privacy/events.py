"""Privacy events (dp_accounting style): what each data owner's data went through, as data that any accountant can
re-account later (DESIGN.md, "privacy accounting").

Mechanisms emit events per data owner and noisy access; the ledger stores them (merged into counts) with the
achieved (ε, δ) per agent, so a finished run can be re-accounted from its manifest alone
(``privdl account --manifest``).

* :class:`GaussianEvent` — a Gaussian mechanism on a query of L2 sensitivity Δ whose noise has precision m per
  coordinate (agent level: Δ = 2C for a clipped mini-batch gradient, m = [R⁻¹]_ii for correlated noise, seed 001
  Thm. 2); its noise multiplier is z = 1/(Δ√m).
* :class:`SubsampledGaussianEvent` — DP-SGD's step: Poisson sampling at rate q, then Gaussian noise σC on a sum of
  C-clipped terms (example level; z = σ).
* :class:`PureLaplaceEvent` — the Laplace mechanism on a query of L1 sensitivity Δ with noise scale b: ε₀ = Δ/b-DP
  per release, pure (δ = 0; Dwork & Roth 2014, Thm. 3.6), so a ledger of such events states (count·Δ/b, 0)-DP by
  basic composition (Thm. 3.16) and, at δ > 0, the PLD or RDP accountant's tighter ε.
* :class:`ObfuscationEvent` — the data went through a mechanism that claims no DP guarantee (random step sizes,
  protection vectors, noise without a sensitivity bound): accountants never print an ε for it.
* :class:`LaplaceEvent` — transmitted values perturbed by (possibly decaying) Laplace noise with no sensitivity
  bound (PD-LMS, PSGT on unclipped losses): stated, never turned into an ε.
* :class:`NonPrivateEvent` — the data was used with no protection at all (ε = ∞).

**An event type** (the protocol; :func:`register_event` checks it) is a frozen dataclass with

* ``kind: ClassVar[str]`` — the name a manifest stores it under (one kind, one class, process-wide: prefix your own
  with your package's name, e.g. ``"mylab.randomized_response"``);
* ``count: int`` — how many releases it stands for (the ledger merges equal events by adding their counts, and every
  accountant composes the event ``count`` times);
* fields of type ``float`` (finite, > 0 — ``sample_rate`` in (0, 1], ``variance`` ≥ 0), ``int`` (≥ 1), ``str`` or
  ``bool`` only: JSON keeps them exactly, and :mod:`privdl.privacy.verify` checks each by its type;
* ``to_dp_event() -> dp_accounting.DpEvent`` — what it means to an accountant, for all ``count`` releases. Its
  DpEvent also says what the ledger states: one containing ``NonPrivateDpEvent`` is a use without protection
  (ε = ∞), one containing ``UnsupportedDpEvent`` a mechanism that claims no DP guarantee (ε is never a number), a
  composition of ``LaplaceDpEvent`` / ``DiscreteLaplaceDpEvent`` / ``NoOpDpEvent`` is pure DP (accounted at δ = 0,
  :func:`pure_epsilon`), anything else goes to the ledger's accountant (``rdp`` and ``pld`` take every DpEvent
  dp_accounting's accountant of that name supports).

Register it with ``@register_event`` (the built-in types are registered the same way, in :data:`EVENTS`); a second
class under one kind is refused, naming both. Registered in the module that defines it, a user's event type is
known wherever that module is imported — import it before re-accounting a manifest that stores it.

**Stability contract** (what a manifest stores must re-account to the same ε for as long as privdl reads it; the
model is dp_accounting's ``dp_event.py``):

* an event kind and its field names are never renamed, removed or given a new meaning: a mechanism whose privacy
  differs gets a new kind (:class:`PureLaplaceEvent` beside :class:`LaplaceEvent`, not a new field of it);
* a field is added to an existing kind only with a default that keeps the old meaning, so that a manifest written
  without it reads back and re-accounts to what it stated;
* ``count`` always counts releases composed adaptively, and ``to_dp_event`` of a kind changes only to fix a mistake
  in it (a manifest that re-accounts differently then fails verification, naming the agents, rather than quietly
  printing a new ε);
* the ledger's JSON form carries a schema version (:data:`privdl.privacy.ledger.LEDGER_SCHEMA`, ``"schema"`` in every
  ledger a manifest stores); it is raised only when that form changes in a way an older privdl cannot read, every
  earlier version is still read (a ledger without ``"schema"``, written before versions were recorded, is read as
  version 1, whose form it has), and a ledger of a newer version is refused with both versions named.

User event types are held to the same contract by whoever owns them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, TypeVar, Union

from privdl.errors import ValidationError
from privdl.lazy_module import lazy
from privdl.registry import Registry, origin

# dp_accounting (and the scipy.stats, scipy.signal it loads) only when an event is accounted: a process that only
# records events — a worker of the distributed runtime — never loads it (privdl.lazy_module)
dp_accounting = lazy("dp_accounting")
dp_event = lazy("dp_accounting.dp_event")

#: every event type, by its ``kind`` (the built-in ones and those registered with :func:`register_event`)
EVENTS: Registry[type] = Registry("privacy event")
#: the field types an event may declare (module doc: JSON keeps them exactly, verify checks each by its type)
FIELD_TYPES = ("float", "int", "str", "bool")

E = TypeVar("E", bound=type)


def _type_name(annotation: object) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))


def register_event(cls: E) -> E:
    """Register an event type under its ``kind`` (a class decorator; the protocol is in the module doc): a frozen
    dataclass with a ``kind`` class variable, a ``count`` field, fields of type float, int, str or bool and a
    ``to_dp_event()`` method. Anything else, or a second class under a registered kind, is a
    :class:`~privdl.errors.ValidationError` naming the class (and the class already registered)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValidationError(f"a privacy event type must be a frozen dataclass; {cls!r} is not a dataclass")
    name = origin(cls)
    if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise ValidationError(f"privacy event {name} must be a frozen dataclass (@dataclass(frozen=True)): the "
                              "ledger merges equal events, so they must be hashable values")
    declared = {f.name: f for f in fields(cls)}
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind or "kind" in declared:
        raise ValidationError(f"privacy event {name} needs a class variable kind: ClassVar[str] = \"...\" (the "
                              f"name manifests store it under), got {kind!r}")
    if "count" not in declared:
        raise ValidationError(f"privacy event {name} ({kind!r}) needs a field count: int (the releases it stands "
                              "for: the ledger adds up the counts of equal events)")
    if not callable(getattr(cls, "to_dp_event", None)):
        raise ValidationError(f"privacy event {name} ({kind!r}) needs a method to_dp_event() returning a "
                              "dp_accounting.DpEvent (what it means to an accountant)")
    odd = [f"{f.name}: {_type_name(f.type)}" for f in declared.values() if _type_name(f.type) not in FIELD_TYPES]
    if odd:
        raise ValidationError(f"privacy event {name} ({kind!r}): field {odd[0]} is not one of {', '.join(FIELD_TYPES)} "
                              "(a manifest stores events as JSON, and the ledger's checks know these types)")
    if kind in EVENTS:
        raise ValidationError(f"privacy event kind {kind!r} is registered twice: by {origin(EVENTS.get(kind))} "
                              f"and by {name} (a manifest names an event by its kind alone; give one of them "
                              "another kind)")
    EVENTS.add(kind, cls)
    return cls


@register_event
@dataclass(frozen=True)
class GaussianEvent:
    """``count`` releases of a Gaussian mechanism: sensitivity Δ = ``sensitivity``, noise precision m = ``precision``
    per coordinate (noise multiplier z = 1/(Δ√m))."""

    precision: float
    sensitivity: float
    count: int = 1
    kind: ClassVar[str] = "gaussian"

    @property
    def noise_multiplier(self) -> float:
        return 1.0 / (self.sensitivity * math.sqrt(self.precision))

    @property
    def sample_rate(self) -> float:
        return 1.0

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(self.noise_multiplier), self.count)


@register_event
@dataclass(frozen=True)
class SubsampledGaussianEvent:
    """``count`` steps of the Poisson-subsampled Gaussian: rate q = ``sample_rate``, noise multiplier σ."""

    noise_multiplier: float
    sample_rate: float
    count: int = 1
    kind: ClassVar[str] = "subsampled_gaussian"

    def to_dp_event(self) -> dp_accounting.DpEvent:
        step: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sample_rate < 1:
            step = dp_accounting.PoissonSampledDpEvent(self.sample_rate, step)
        return dp_accounting.SelfComposedDpEvent(step, self.count)


@register_event
@dataclass(frozen=True)
class PureLaplaceEvent:
    """``count`` releases of the Laplace mechanism on a query of L1 sensitivity Δ = ``sensitivity`` with noise of
    scale b = ``scale`` per coordinate (density e^(−|x|/b)/2b): each is ε₀ = Δ/b-DP with δ = 0 (Dwork & Roth 2014,
    Thm. 3.6), so ``count`` of them are (count·Δ/b, 0)-DP (basic composition, Thm. 3.16; exact at δ = 0 for the
    Laplace mechanism, whose privacy loss reaches ε₀ with positive probability). dp_accounting's ``LaplaceDpEvent``
    with noise multiplier b/Δ: at δ > 0 the PLD and RDP accountants give a smaller ε."""

    scale: float
    sensitivity: float
    count: int = 1
    kind: ClassVar[str] = "pure_laplace"

    @property
    def noise_multiplier(self) -> float:
        """b/Δ (dp_accounting's parametrisation)."""
        return self.scale / self.sensitivity

    @property
    def epsilon(self) -> float:
        """ε₀ = Δ/b of one release."""
        return self.sensitivity / self.scale

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(self.noise_multiplier), self.count)


@register_event
@dataclass(frozen=True)
class ObfuscationEvent:
    """``count`` accesses through ``mechanism``, which gives no DP guarantee (``reason`` says why)."""

    mechanism: str
    reason: str
    count: int = 1
    kind: ClassVar[str] = "obfuscation"

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.UnsupportedDpEvent()


@register_event
@dataclass(frozen=True)
class LaplaceEvent:
    """``count`` transmissions perturbed by Laplace noise of variance ``variance`` at the first one, scaled by
    ``decay`` per round (PD-LMS: decay 1; PSGT: a decaying schedule, ``root``: the variance is the square root of
    variance·decayᵗ). ``mechanism`` names it. Without a sensitivity bound on what is perturbed (unclipped losses)
    no ε follows: accountants treat it like an obfuscation and the ledger says so (with a bound, the release is
    a :class:`PureLaplaceEvent`)."""

    mechanism: str
    variance: float
    decay: float = 1.0
    root: bool = False
    reason: str = "Laplace perturbation of transmitted values; sensitivity unbounded (unclipped loss): no ε"
    count: int = 1
    kind: ClassVar[str] = "laplace"

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.UnsupportedDpEvent()


@register_event
@dataclass(frozen=True)
class NonPrivateEvent:
    """``count`` accesses with no protection."""

    reason: str = "no privacy protection"
    count: int = 1
    kind: ClassVar[str] = "non_private"

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()


#: the built-in event types (any registered type is an event too: :data:`EVENTS`)
PrivacyEvent = Union[GaussianEvent, SubsampledGaussianEvent, PureLaplaceEvent, ObfuscationEvent, LaplaceEvent,
                     NonPrivateEvent]


def _leaves(event: dp_accounting.DpEvent) -> list[dp_accounting.DpEvent]:
    """The elementary DpEvents a composition, a sampling or a selection is made of."""
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return [leaf for e in event.events for leaf in _leaves(e)]
    inner = getattr(event, "event", None)  # self-composed, Poisson- or fixed-batch-sampled, repeat-and-select
    return _leaves(inner) if isinstance(inner, dp_accounting.DpEvent) else [event]


def is_non_private(event: Any) -> bool:
    """The event is a use of the data without protection (its DpEvent contains a ``NonPrivateDpEvent``): ε = ∞.
    A :class:`NonPrivateEvent` is one without its DpEvent: a run with no mechanism does not load dp_accounting
    (scipy.stats, scipy.optimize …) to learn it (its process 0 writes the manifest's ledger)."""
    if isinstance(event, NonPrivateEvent):
        return True
    return any(isinstance(e, dp_accounting.NonPrivateDpEvent) for e in _leaves(event.to_dp_event()))


def claims_no_guarantee(event: Any) -> bool:
    """The event's mechanism claims no DP guarantee (its DpEvent contains an ``UnsupportedDpEvent``: obfuscations,
    Laplace noise without a sensitivity bound): ε is never a number for it."""
    return any(isinstance(e, dp_accounting.UnsupportedDpEvent) for e in _leaves(event.to_dp_event()))


def _pure(event: dp_accounting.DpEvent) -> float | None:
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return 1.0 / event.noise_multiplier if event.noise_multiplier > 0 else None
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):  # DLap(a) on sensitivity s: ε₀ = a·s
        return float(event.noise_parameter) * float(event.sensitivity)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        one = _pure(event.event)
        return None if one is None else event.count * one
    if isinstance(event, dp_accounting.ComposedDpEvent):
        parts = [_pure(e) for e in event.events]
        return None if any(p is None for p in parts) else math.fsum(parts)  # type: ignore[arg-type]
    return None


def pure_epsilon(event: Any) -> float | None:
    """The ε at δ = 0 of all ``count`` releases of ``event`` — the sum of its parts' ε₀ (basic composition, Dwork &
    Roth 2014, Thm. 3.16) — or None if it is not pure DP (a Gaussian's ε at δ = 0 is infinite). Read from its
    DpEvent, so a registered event type whose DpEvent composes Laplace mechanisms is pure too."""
    return _pure(event.to_dp_event())


def pure_composition(events: list) -> float | None:
    """ε at δ = 0 of the composition of ``events`` (every one pure), or None if one is not pure DP."""
    parts = [pure_epsilon(e) for e in events]
    return None if any(p is None for p in parts) else math.fsum(parts)  # type: ignore[arg-type]


def account_pure(events: list, name: str) -> float:
    """The ε an accountant named ``name`` states at δ = 0: the basic composition of ``events`` (every one must be
    pure DP; any other is refused, naming its kind: its ε at δ = 0 is infinite, give δ > 0)."""
    for e in events:
        if pure_epsilon(e) is None:
            raise ValidationError(f"δ = 0 states pure DP, but a {e.kind} event is not pure DP (its ε at δ = 0 is "
                                  f"infinite; the {name} accountant needs δ in (0, 1) for it)")
    return pure_composition(events)  # type: ignore[return-value]


def event_to_dict(event: Any) -> dict:
    return {"kind": event.kind, **{f.name: getattr(event, f.name) for f in fields(event)}}


def event_from_dict(data: dict) -> Any:
    """The event a ledger stored (``kind`` and its fields); an unregistered kind is an error listing the known ones
    (a user's event type: import the module that registers it first)."""
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in EVENTS:
        raise ValueError(f"unknown privacy event kind {kind!r}; known: {', '.join(EVENTS.names())} (an event type of "
                         "your own: import the module that registers it, see privdl.privacy.events.register_event)")
    return EVENTS.get(kind)(**data)


def merge(events: list) -> list:
    """Add up the counts of equal events (same kind and parameters), keeping first-seen order."""
    if len(events) <= 1:
        return list(events)
    out: dict[Any, int] = {}
    for e in events:
        key = replace(e, count=1)
        out[key] = out.get(key, 0) + e.count
    return [replace(k, count=c) for k, c in out.items()]


def accesses(events: list) -> int:
    return sum(e.count for e in events)


__all__ = ["EVENTS", "FIELD_TYPES", "GaussianEvent", "LaplaceEvent", "NonPrivateEvent", "ObfuscationEvent",
           "PrivacyEvent", "PureLaplaceEvent", "SubsampledGaussianEvent", "account_pure", "accesses",
           "claims_no_guarantee", "event_from_dict", "event_to_dict", "is_non_private", "merge", "pure_composition",
           "pure_epsilon", "register_event"]
