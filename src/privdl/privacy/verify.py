"""Tamper evidence for a manifest's privacy ledger (``privdl account --manifest``): a ledger read back from a file is
checked before any ε is printed, so that a field edited by hand is an error that names it — never a quiet new number.

Two checks, in order:

1. **Fields** (:func:`check_fields`): every field the ledger writes has its type and range — counts integers ≥ 1,
   precisions, sensitivities and noise multipliers finite and > 0, sample rates in (0, 1], δ in [0, 1), ε a number
   ≥ 0, ``"inf"`` or null — and no NaN anywhere; every event of a registered kind
   (:data:`privdl.privacy.events.EVENTS`: a user's event type too, its fields checked by their declared types); a
   finite ε at δ = 0 (pure DP) only over pure-DP events; a schema version (``"schema"``) this privdl reads
   (absent: an older ledger, read as version 1). A bad one is a :class:`LedgerFieldError` naming it by its JSON path,
   e.g. ``privacy_ledger[0].per_agent[3].events[1].count``.
2. **Agreement** (:func:`verify_ledger`): the manifest states, per agent, its accesses, noise multiplier(s), sample
   rate(s), δ and ε beside the events they came from, and the worst ε and the steps for the whole run. Every stated
   number is compared with what the events give; the events are re-accounted with the ledger's accountant at its δ.
   A disagreement is a :class:`LedgerMismatch` listing each one with its path: the event (index, kind) and field when
   a summary pins it (a sample rate or count edited in an event no longer matches the agent's row), the agent and its
   events when only the re-accounted ε tells (an event and its row edited together). Statements beside the ledger
   (``beside``: the same noise at another unit) are checked the same way.

**Tolerance.** Re-accounting is deterministic: the same events with the same library give the stated ε bit for bit
(JSON keeps a float's every bit), and the summaries (Σ counts, z = 1/(Δ√m)) are correctly rounded operations, equal on
any IEEE machine. :data:`REL_TOL` = 1e-9 only absorbs another release of scipy / dp_accounting re-accounting a
manifest written elsewhere: the tight accountant's root finders stop at 1e-13 to 1e-14 relative, the RDP accountant
is a closed form on a fixed grid of orders, the PLD accountant's discretisation interval is a function of the events
alone (:func:`privdl.privacy.example_accountant.pld_interval`), so the same events give the same distribution. Hand
edits move ε far more: one access more in 10⁵ changes ε by ~5e-6 relative, a noise multiplier edited in its 6th
digit by ~1e-6.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Callable

from privdl.errors import ValidationError
from privdl.privacy.events import EVENTS, GaussianEvent, SubsampledGaussianEvent, accesses, event_from_dict, \
    pure_epsilon
from privdl.privacy.ledger import Ledger, check_schema

#: relative tolerance of every comparison of a stated number with the re-accounted one (module doc: why)
REL_TOL = 1e-9
#: the units a ledger states
UNITS = ("agent", "example", "none")


class LedgerFieldError(ValidationError):
    """A ledger field that no privdl ledger writes: NaN, negative, out of range, of the wrong type or missing."""


@dataclass(frozen=True)
class Mismatch:
    """One stated number that the events do not give: where (JSON path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class LedgerMismatch(ValidationError):
    """The manifest's stated numbers disagree with its events re-accounted (``mismatches``)."""

    def __init__(self, mismatches: list[Mismatch], shown: int = 12) -> None:
        self.mismatches = mismatches
        lines = [str(m) for m in mismatches[:shown]]
        if len(mismatches) > shown:
            lines.append(f"... and {len(mismatches) - shown} more")
        super().__init__("the privacy ledger does not re-account to what it states (a field edited by hand, or "
                         "another accountant version); refusing to print a new ε:\n  " + "\n  ".join(lines))


# ---- 1. fields ------------------------------------------------------------------------------------------------------
def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fail(path: str, value: object, want: str) -> LedgerFieldError:
    return LedgerFieldError(f"{path} = {value!r}: must be {want}")


def _require(ok: Callable[[float], bool], want: str) -> Callable[[str, object], None]:
    def check(path: str, value: object) -> None:
        if not _number(value) or math.isnan(value):  # type: ignore[arg-type]
            raise _fail(path, value, f"a number ({want})")
        if not ok(value):  # type: ignore[arg-type]
            raise _fail(path, value, want)
    return check


def _text(path: str, value: object) -> None:
    if not isinstance(value, str):
        raise _fail(path, value, "a string")


def _flag(path: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _fail(path, value, "true or false")


def _epsilon(path: str, value: object) -> None:
    if value is None or value == "inf":
        return
    _require(lambda v: 0 <= v < math.inf, "a number >= 0, \"inf\" or null")(path, value)


def _optional(check: Callable[[str, object], None]) -> Callable[[str, object], None]:
    def run(path: str, value: object) -> None:
        if value is not None:
            check(path, value)
    return run


def _one_or_list(check: Callable[[str, object], None]) -> Callable[[str, object], None]:
    def run(path: str, value: object) -> None:
        for k, v in enumerate(value) if isinstance(value, list) else [(None, value)]:
            check(path if k is None else f"{path}[{k}]", v)
    return run


_positive = _require(lambda v: 0 < v < math.inf, "a finite number > 0")
_rate = _require(lambda v: 0 < v <= 1, "a sample rate in (0, 1]")
_nonnegative = _require(lambda v: 0 <= v < math.inf, "a finite number >= 0")
_accesses = _require(lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
_count = _require(lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 (accesses of this event)")
#: how each event field is checked, by name first, then by its declared type
_BY_NAME = {"count": _count, "sample_rate": _rate, "variance": _nonnegative}
_BY_TYPE = {"float": _positive, "int": _count, "str": _text, "bool": _flag}


#: how a ledger's own event types and accountants become known (privdl.plugins)
PLUGIN_HINT = ("import the module that registers it: a plug-in its run's config names is imported by privdl account "
               "--manifest, another is given with --plugin MODULE")


def _check_event(path: str, event: object) -> None:
    if not isinstance(event, dict):
        raise _fail(path, event, "an event object")
    kind = event.get("kind")
    if kind not in EVENTS:
        raise _fail(f"{path}.kind", kind, f"a registered event kind: one of {', '.join(EVENTS.names())} (an event "
                                          f"type of your own: {PLUGIN_HINT})")
    declared = {f.name: f for f in fields(EVENTS.get(kind))}
    for key in event:
        if key != "kind" and key not in declared:
            raise LedgerFieldError(f"{path}.{key}: a {kind} event has no field {key!r} (fields: "
                                   f"{', '.join(declared)})")
    for name, f in declared.items():
        if name not in event:  # a default (count = 1) would quietly stand in for the missing field
            if f.default is MISSING or name == "count":
                raise LedgerFieldError(f"{path}.{name} is missing (a {kind} event states it)")
            continue
        check = _BY_NAME.get(name) or _BY_TYPE.get(getattr(f.type, "__name__", str(f.type)), _positive)
        check(f"{path}.{name}", event[name])


def _pure(path: str, where: str, event: dict) -> None:
    """A ledger stating a finite ε at δ = 0 (pure DP) holds pure-DP events only (a Gaussian's ε at δ = 0 is ∞)."""
    try:
        pure = pure_epsilon(event_from_dict(event))
    except (TypeError, ValueError) as exc:
        raise LedgerFieldError(f"{where}: {exc}") from None
    if pure is None:
        raise LedgerFieldError(f"{path}.delta = 0 states pure DP, but {where} ({event['kind']}) is not a pure-DP "
                               "event (its ε at δ = 0 is infinite): δ or the event was edited")


def _no_nan(path: str, value: object) -> None:
    """NaN is never a ledger value: refused wherever it stands (noise facts included)."""
    if isinstance(value, float) and math.isnan(value):
        raise _fail(path, value, "a number (NaN is never a ledger value)")
    if isinstance(value, dict):
        for k, v in value.items():
            _no_nan(f"{path}.{k}", v)
    elif isinstance(value, list):
        for k, v in enumerate(value):
            _no_nan(f"{path}[{k}]", v)


def check_fields(data: object, path: str = "privacy_ledger[0]") -> None:
    """Every field of a ledger's manifest form (:meth:`Ledger.to_dict`) has its type and range; raises
    :class:`LedgerFieldError` naming the first that does not by its JSON path."""
    from privdl.privacy.accountants import ACCOUNTANTS

    if not isinstance(data, dict):
        raise _fail(path, type(data).__name__, "a ledger object")
    try:
        check_schema(data.get("schema"), path)
    except ValueError as exc:
        raise LedgerFieldError(str(exc)) from None
    _no_nan(path, data)
    for key in ("unit", "mechanism", "accountant", "delta", "epsilon", "per_agent"):
        if key not in data:
            raise LedgerFieldError(f"{path}.{key} is missing (every ledger states it)")
    if data["unit"] not in UNITS:
        raise _fail(f"{path}.unit", data["unit"], f"one of {', '.join(UNITS)}")
    _text(f"{path}.mechanism", data["mechanism"])
    if data["accountant"] != "none" and data["accountant"] not in ACCOUNTANTS.names():
        raise _fail(f"{path}.accountant", data["accountant"], f"one of none, {', '.join(ACCOUNTANTS.names())} (an "
                                                              f"accountant of your own: {PLUGIN_HINT})")
    _epsilon(f"{path}.epsilon", data["epsilon"])
    if data["unit"] == "none":
        _require(lambda v: v == 0, "0 (a ledger without DP states no δ)")(f"{path}.delta", data["delta"])
    else:  # δ = 0 with a finite ε states pure DP: checked against the events below
        _require(lambda v: 0 <= v < 1, "a δ in [0, 1)")(f"{path}.delta", data["delta"])
    _optional(_positive)(f"{path}.target_epsilon", data.get("target_epsilon"))
    _optional(_accesses)(f"{path}.steps", data.get("steps"))
    rows = data["per_agent"]
    if not isinstance(rows, list):
        raise _fail(f"{path}.per_agent", type(rows).__name__, "a list (one object per agent)")
    for i, row in enumerate(rows):
        where = f"{path}.per_agent[{i}]"
        if not isinstance(row, dict):
            raise _fail(where, row, "an object (one agent's statement)")
        for key in ("agent", "epsilon", "delta", "accesses", "events"):
            if key not in row:
                raise LedgerFieldError(f"{where}.{key} is missing (every agent's row states it)")
        _accesses(f"{where}.agent", row["agent"])
        _epsilon(f"{where}.epsilon", row["epsilon"])
        _require(lambda v: 0 <= v < 1, "a δ in [0, 1)")(f"{where}.delta", row["delta"])
        _accesses(f"{where}.accesses", row["accesses"])
        for key, check in (("noise_multiplier", _positive), ("sample_rate", _rate)):
            if key in row:
                _one_or_list(check)(f"{where}.{key}", row[key])
        if not isinstance(row["events"], list):
            raise _fail(f"{where}.events", type(row["events"]).__name__, "a list of events")
        for k, event in enumerate(row["events"]):
            _check_event(f"{where}.events[{k}]", event)
            if data["unit"] != "none" and data["delta"] == 0 and data["epsilon"] not in (None, "inf"):
                _pure(path, f"{where}.events[{k}]", event)
    beside = data.get("beside", [])
    if not isinstance(beside, list):
        raise _fail(f"{path}.beside", type(beside).__name__, "a list of ledgers")
    for k, other in enumerate(beside):
        check_fields(other, f"{path}.beside[{k}]")


# ---- 2. agreement ---------------------------------------------------------------------------------------------------
def _same(stated: object, again: float | None) -> bool:
    if stated is None or again is None:
        return stated is None and again is None
    a = _stated(stated)
    assert a is not None
    if math.isinf(a) or math.isinf(again):
        return a == again
    return abs(a - again) <= REL_TOL * max(abs(a), abs(again))


def _show(value: float | None) -> str:
    return "null (no DP guarantee)" if value is None else ("inf" if math.isinf(value) else f"{value:.10g}")


def _values(stated: object) -> list[float]:
    return sorted(float(v) for v in (stated if isinstance(stated, list) else [stated]))  # type: ignore[union-attr]


def _agent(path: str, row: dict, events: list, delta: float, noise: dict, same_delta: bool) -> list[Mismatch]:
    """The summaries of one agent's row against its events: δ (unless ``same_delta``: every row states one other δ,
    reported once for the ledger), accesses, noise multipliers, sample rates."""
    out = []
    kinds = [f"events[{k}] ({e['kind']})" for k, e in enumerate(row["events"])]
    if row["delta"] != delta and not same_delta:
        out.append(Mismatch(f"{path}.delta", f"states δ = {row['delta']:g}, the ledger's δ is {delta:g} (one of the "
                                             "two was edited)"))
    if row["accesses"] != accesses(events):
        counts = " + ".join(f"{kinds[k]}.count = {e.count}" for k, e in enumerate(events))
        out.append(Mismatch(f"{path}.accesses" if len(events) != 1 else f"{path}.events[0].count",
                            f"the row states {row['accesses']} accesses, its events count {counts or 0}"))
    dp = [(k, e) for k, e in enumerate(events) if isinstance(e, (GaussianEvent, SubsampledGaussianEvent))]
    for key in ("noise_multiplier", "sample_rate"):
        got = sorted({getattr(e, key) for _, e in dp})
        if key not in row:
            if got:
                out.append(Mismatch(f"{path}.{key}", f"missing; its events state {got}"))
            continue
        said = _values(row[key])
        if len(said) == len(got) and all(_same(a, b) for a, b in zip(said, got)):
            continue
        for k, e in dp:
            value = getattr(e, key)
            if any(_same(s, value) for s in said):
                continue
            field, what = f".{key}", ""
            if isinstance(e, GaussianEvent):  # z = 1/(Δ√m): which of the two, when the noise facts state Δ
                said_sens = noise.get("sensitivity")
                field, what = (("", " (its precision or its sensitivity was edited)") if not _number(said_sens) else
                               (".sensitivity", "") if not _same(said_sens, e.sensitivity) else (".precision", ""))
            out.append(Mismatch(f"{path}.events[{k}]{field}",
                                f"{kinds[k]} gives {key} {value!r}, the agent's row states {row[key]!r}{what}"))
        if not any(m.path.startswith(f"{path}.events") for m in out):
            out.append(Mismatch(f"{path}.{key}", f"states {row[key]!r}, its events give {got}"))
    return out


def verify_ledger(data: dict, path: str = "privacy_ledger[0]") -> Ledger:
    """The ledger of a manifest (:meth:`Ledger.to_dict` form), its fields checked (:func:`check_fields`), its events
    re-accounted and every stated number compared with them; returns the re-accounted ledger, or raises
    :class:`LedgerFieldError` / :class:`LedgerMismatch` (module doc)."""
    check_fields(data, path)
    mismatches: list[Mismatch] = []
    again = _verify(data, path, mismatches)
    if mismatches:
        raise LedgerMismatch(mismatches)
    return again


def _verify(data: dict, path: str, out: list[Mismatch]) -> Ledger:
    try:
        again = Ledger.from_dict(data).reaccount()
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerFieldError(f"{path}: {exc}") from None
    rows, noise = data["per_agent"], data.get("noise") or {}
    differ, first = [], len(out)
    deltas = {row["delta"] for row in rows}
    same_delta = len(rows) > 1 and len(deltas) == 1 and again.delta not in deltas
    if same_delta:
        out.append(Mismatch(f"{path}.delta", f"the ledger states δ = {again.delta:g}, every agent's row δ = "
                                             f"{rows[0]['delta']:g} (one of them was edited)"))
    for i, (row, events, eps) in enumerate(zip(rows, again.events, again.epsilons)):
        where = f"{path}.per_agent[{i}]"
        if row["agent"] != i:
            out.append(Mismatch(f"{where}.agent", f"states agent {row['agent']} at position {i}"))
        local = _agent(where, row, events, again.delta, noise, same_delta)
        out.extend(local)
        if not _same(row["epsilon"], eps):
            differ.append(i)
            if not local:  # the summaries agree: an event was edited together with its row
                kinds = ", ".join(f"events[{k}] ({e['kind']})" for k, e in enumerate(row["events"]))
                out.append(Mismatch(f"{where}.epsilon", f"states ε = {_show(_stated(row['epsilon']))}; its events "
                                                        f"re-account to ε = {_show(eps)} at δ = {again.delta:g} "
                                                        f"({again.accountant} accountant): one of "
                                                        f"{kinds or 'its (no) events'} was edited, or δ"))
    read = sum(1 for events in again.events if events)  # an agent whose data was never read has ε = 0 at any δ
    if len(differ) == read > 1:
        out.insert(first, Mismatch(f"{path}.delta", f"every agent's ε differs from the stated one: δ = "
                                                    f"{again.delta:g} or the accountant ({again.accountant!r}) was "
                                                    "edited, or the accounting library is another version"))
    if not _same(data["epsilon"], again.epsilon):
        out.append(Mismatch(f"{path}.epsilon", f"states ε = {_show(_stated(data['epsilon']))}, the events "
                                               f"re-account to {_show(again.epsilon)} (the worst agent's)"))
    if "steps" in data and data["steps"] != again.steps:
        out.append(Mismatch(f"{path}.steps", f"states {data['steps']} steps, the events' most accesses of one agent "
                                             f"are {again.steps}"))
    for k, said in enumerate(data.get("beside", [])):
        _verify(said, f"{path}.beside[{k}]", out)
    return again


def _stated(eps: object) -> float | None:
    return math.inf if eps == "inf" else (None if eps is None else float(eps))  # type: ignore[arg-type]


__all__ = ["LedgerFieldError", "LedgerMismatch", "Mismatch", "REL_TOL", "check_fields", "verify_ledger"]
