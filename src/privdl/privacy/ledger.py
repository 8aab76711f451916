"""The privacy ledger of a run: per data owner, the events its data went through and the (ε, δ) they give.

Written into every manifest (``privacy_ledger``), it can be re-accounted from its events alone
(:meth:`Ledger.reaccount`, ``privdl account --manifest``). ε per agent:

* ∞ if the agent's data was used without protection (:class:`NonPrivateEvent`, or any event whose DpEvent is
  non-private: :func:`~privdl.privacy.events.is_non_private`);
* ``None`` — *no DP guarantee*, never a number — if it went through a mechanism that claims none
  (:class:`~privdl.privacy.events.ObfuscationEvent`, :class:`~privdl.privacy.events.LaplaceEvent`:
  :func:`~privdl.privacy.events.claims_no_guarantee`);
* 0 if its data was never read;
* otherwise the accountant's ε of the composition of its events — at δ = 0 (pure DP: every event pure, e.g.
  :class:`~privdl.privacy.events.PureLaplaceEvent`) the basic composition Σ count·ε₀, which every accountant that
  takes the events states.

Any registered event type (:func:`privdl.privacy.events.register_event`) can stand in a ledger, and its manifest form
(:meth:`Ledger.to_dict`) carries the schema version :data:`LEDGER_SCHEMA`.

A ledger may state a ``notion`` other than plain DP of everything the agent sends (Zip-DL's and Muffliato's pairwise
network DP: against one curious, non-colluding agent); its guarantee then names it, and statements beside it name
theirs (e.g. "DP against an eavesdropper on every link", which may be "none").

A ledger may carry statements *beside* its own (``beside``): the same noise accounted for another privacy unit —
e.g. per-example clipping protects one example (the ledger's unit) and, with a much larger sensitivity, the agent's
whole data; that agent-level ε is stated next to the example-level one so that neither is read for the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from privdl.privacy.events import (
    GaussianEvent, NonPrivateEvent, PrivacyEvent, SubsampledGaussianEvent, accesses,
    claims_no_guarantee, event_from_dict, event_to_dict, is_non_private, merge,
)

#: the version of the ledger's JSON form (:meth:`Ledger.to_dict`, ``"schema"``; the stability contract is in
#: :mod:`privdl.privacy.events`): raised only when that form changes in a way an older privdl cannot read. A ledger
#: without it was written before versions were recorded and has version 1's form.
LEDGER_SCHEMA = 1


def _epsilons(accountant: str, delta: float, events: Sequence[list[PrivacyEvent]]) -> list[float | None]:
    from privdl.privacy.accountants import ACCOUNTANTS
    from privdl.privacy.agent_accountant import AgentAccountant

    out: list[float | None] = [0.0] * len(events)
    todo = []
    for i, evs in enumerate(events):
        if any(is_non_private(e) for e in evs):
            out[i] = math.inf
        elif any(claims_no_guarantee(e) for e in evs):
            out[i] = None
        elif evs:
            todo.append(i)
    if not todo:
        return out
    acc = ACCOUNTANTS.get(accountant)
    if isinstance(acc, AgentAccountant):  # vectorised over agents
        from privdl.privacy.agent_accountant import _gaussian_terms

        terms = np.array([_gaussian_terms(events[i], acc.name) for i in todo])
        uniq, inverse = np.unique(terms, return_inverse=True)
        eps = acc.account_many(uniq, delta=delta)[inverse]
        for i, e in zip(todo, eps.tolist()):
            out[i] = e
        return out
    cache: dict[tuple, float] = {}
    for i in todo:
        key = tuple(events[i])
        if key not in cache:
            cache[key] = acc.account(events[i], delta=delta)
        out[i] = cache[key]
    return out


@dataclass
class Ledger:
    """A run's privacy statement. ``events[i]`` are agent i's events (merged into counts); ``epsilons[i]`` its ε
    (see the module doc). ``unit``: "agent", "example" or "none"."""

    unit: str
    mechanism: str
    accountant: str
    delta: float
    events: list[list[PrivacyEvent]]
    noise: dict = field(default_factory=dict)
    note: str = ""
    target_epsilon: float | None = None
    epsilons: list[float | None] = field(default_factory=list)
    beside: list["Ledger"] = field(default_factory=list)
    #: what the (ε, δ) protects against, when not plain DP of everything sent ("" = plain DP)
    notion: str = ""

    @classmethod
    def build(cls, *, unit: str, mechanism: str, accountant: str, delta: float,
              events: Sequence[Sequence[PrivacyEvent]], noise: dict | None = None, note: str = "",
              target_epsilon: float | None = None, beside: Sequence["Ledger"] = (),
              notion: str = "") -> "Ledger":
        merged = [merge(list(e)) for e in events]
        return cls(unit, mechanism, accountant, float(delta), merged, dict(noise or {}), note, target_epsilon,
                   _epsilons(accountant, delta, merged), list(beside), notion)

    def reaccount(self, accountant: str | None = None) -> "Ledger":
        """The same events accounted afresh (with ``accountant``, default the ledger's own); the statements beside
        it are re-accounted with their own accountants."""
        name = accountant or self.accountant
        return Ledger(self.unit, self.mechanism, name, self.delta, self.events, self.noise, self.note,
                      self.target_epsilon, _epsilons(name, self.delta, self.events),
                      [b.reaccount() for b in self.beside], self.notion)

    def with_parts(self, parts: Sequence[PrivacyEvent], name: str) -> "Ledger":
        """This statement for a run whose algorithm adds protections of its own (``parts``: random matrix step sizes,
        protection vectors, Laplace perturbations of what is sent; one template event each). With a DP mechanism
        the parts act on its output — post-processing, the guarantee stands and the note says so; without one they
        are the whole story: every agent's events become the parts (no DP guarantee, no ε). Give one event per
        access (several parts acting on one access are one event), so the ledger's access counts stay right."""
        from dataclasses import replace

        if not parts:
            return self
        names = ", ".join(getattr(p, "mechanism", p.kind) for p in parts)
        if self.unit != "none":
            note = "; ".join(x for x in (self.note, f"{name} adds {names} after the DP mechanism (post-processing: "
                                                     "the guarantee above stands)") if x)
            return Ledger(self.unit, f"{self.mechanism} + {name}", self.accountant, self.delta, self.events,
                          self.noise, note, self.target_epsilon, self.epsilons, self.beside, self.notion)
        events = [[replace(p, count=accesses(evs)) for p in parts] if evs else [] for evs in self.events]
        return Ledger.build(unit="none", mechanism=f"{self.mechanism} + {name}", accountant="none", delta=0.0,
                            events=events, noise=self.noise,
                            note=f"{name}: {names}; no DP mechanism reads the data, so no ε is stated")

    def with_unprotected(self, counts: Sequence[int], reason: str, name: str) -> "Ledger":
        """This statement for a run whose algorithm also reads agent i's data ``counts[i]`` times **without** noise
        (seed 003's published DPDL self-gradient): those accesses are non-private events, so no ε covers the agent;
        the note keeps what the noisy accesses alone would give."""
        if not any(int(c) for c in counts):
            return self
        alone = self.epsilon  # this ledger has only the noisy accesses yet: what :meth:`protected_only` gives back
        events = [list(evs) + ([NonPrivateEvent(reason=reason, count=int(c))] if int(c) else [])
                  for evs, c in zip(self.events, counts)]
        said = (f"the noisy accesses alone: ε = {alone:.6g} per agent at δ = {self.delta:g} ({self.unit} level)"
                if alone is not None and math.isfinite(alone) else "")
        note = "; ".join(x for x in (self.note, f"{name}: {reason} — no overall ε", said) if x)
        return Ledger.build(unit=self.unit, mechanism=self.mechanism, accountant=self.accountant, delta=self.delta,
                            events=events, noise=self.noise, note=note, target_epsilon=self.target_epsilon,
                            notion=self.notion)

    def protected_only(self) -> "Ledger":
        """The same statement without its non-private events: what the noisy accesses alone would give (seed 003's
        published DPDL: the cross-gradients without the un-noised self-gradient), re-accounted."""
        events = [[e for e in evs if not isinstance(e, NonPrivateEvent)] for evs in self.events]
        return Ledger.build(unit=self.unit, mechanism=self.mechanism, accountant=self.accountant, delta=self.delta,
                            events=events, noise=self.noise, target_epsilon=self.target_epsilon,
                            notion=self.notion)

    @property
    def epsilon(self) -> float | None:
        """The worst agent's ε (``None``: some agent has no DP guarantee; ∞: some agent is not protected)."""
        if any(e is not None and math.isinf(e) for e in self.epsilons):
            return math.inf
        if any(e is None for e in self.epsilons):
            return None
        return max(self.epsilons, default=0.0)

    @property
    def guarantee(self) -> str:
        eps = self.epsilon
        if eps is None:
            return "none: obfuscation, no DP guarantee"
        if math.isinf(eps):
            unnoised = {e.reason for evs in self.events for e in evs if isinstance(e, NonPrivateEvent)}
            if self.unit != "none" and unnoised - {NonPrivateEvent.reason}:
                return "none: some accesses to the data are not noised (see note)"
            return "none: non-private"
        text = f"({eps:.6g}, {self.delta:g})-DP per agent, {self.unit} level"
        if self.notion:
            text += f", {self.notion}"
        for b in self.beside:
            other = b.epsilon
            if other is not None and math.isfinite(other):
                text += f"; the same noise is ({other:.6g}, {b.delta:g})-DP at {b.unit} level"
                text += f", {b.notion}" if b.notion else ""
            elif b.notion:
                text += f"; {b.notion}: none (no DP guarantee, see note)"
        return text

    @property
    def steps(self) -> int:
        """The largest number of noisy accesses of any agent."""
        return max((accesses(e) for e in self.events), default=0)

    def per_agent(self) -> list[dict]:
        rows = []
        for i, (evs, eps) in enumerate(zip(self.events, self.epsilons)):
            row: dict = {"agent": i, "epsilon": _num(eps), "delta": self.delta, "accesses": accesses(evs)}
            dp = [e for e in evs if isinstance(e, (GaussianEvent, SubsampledGaussianEvent))]
            if dp:
                zs = sorted({e.noise_multiplier for e in dp})
                qs = sorted({e.sample_rate for e in dp})
                row["noise_multiplier"] = zs[0] if len(zs) == 1 else zs
                row["sample_rate"] = qs[0] if len(qs) == 1 else qs
            row["events"] = [event_to_dict(e) for e in evs]
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return {"schema": LEDGER_SCHEMA, "unit": self.unit, "mechanism": self.mechanism, "accountant": self.accountant,
                "epsilon": _num(self.epsilon), "delta": self.delta, "steps": self.steps,
                "guarantee": self.guarantee, "target_epsilon": self.target_epsilon, "noise": self.noise,
                "note": self.note, "per_agent": self.per_agent(),
                **({"notion": self.notion} if self.notion else {}),
                **({"beside": [b.to_dict() for b in self.beside]} if self.beside else {})}

    @classmethod
    def from_dict(cls, data: dict) -> "Ledger":
        """A ledger from its manifest form (the stored ε's are kept as stated; :meth:`reaccount` recomputes them).
        A ledger of a newer schema than :data:`LEDGER_SCHEMA` is refused, naming both."""
        check_schema(data.get("schema"))
        rows = data.get("per_agent")
        if rows is None:
            raise ValueError("this ledger has no per-agent events (written by privdl < 0.2); it cannot be "
                             "re-accounted")
        events = [[event_from_dict(e) for e in r["events"]] for r in rows]
        eps = [_from_num(r["epsilon"]) for r in rows]
        return cls(data["unit"], data["mechanism"], data["accountant"], float(data["delta"]), events,
                   data.get("noise", {}), data.get("note", ""), data.get("target_epsilon"), eps,
                   [cls.from_dict(b) for b in data.get("beside", [])], data.get("notion", ""))


def check_schema(schema: object, path: str = "privacy_ledger[0]") -> int:
    """The schema version of a stored ledger (absent: written before versions were recorded, read as 1); one this
    privdl cannot read (newer, or not a version) is a ValueError naming both."""
    if schema is None:
        return 1
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise ValueError(f"{path}.schema = {schema!r}: must be a ledger schema version (an integer >= 1)")
    if schema > LEDGER_SCHEMA:
        raise ValueError(f"{path}.schema = {schema}: this ledger was written by a newer privdl (ledger schema "
                         f"{schema}); this privdl reads schema {LEDGER_SCHEMA} and earlier: upgrade privdl to "
                         "re-account it")
    return schema


def _num(v: float | None) -> float | str | None:
    return "inf" if v is not None and math.isinf(v) else v


def _from_num(v: object) -> float | None:
    return math.inf if v == "inf" else (None if v is None else float(v))  # type: ignore[arg-type]


def non_private(mechanism: str, n: int, accesses_per_agent: Sequence[int] | int) -> Ledger:
    counts = [accesses_per_agent] * n if isinstance(accesses_per_agent, int) else list(accesses_per_agent)
    return Ledger.build(unit="none", mechanism=mechanism, accountant="none", delta=0.0,
                        events=[[NonPrivateEvent(count=int(c))] if c else [] for c in counts],
                        note="no privacy protection")



def statement(mechanism, algorithm, *, iterations: int, edges, accesses=None) -> Ledger:
    """A run's whole privacy statement: the mechanism's ledger over ``accesses`` (default: those it counted), the
    algorithm's own parts (:meth:`Ledger.with_parts`) and its declared un-noised accesses
    (:meth:`Ledger.with_unprotected`)."""
    ledger = mechanism.ledger(accesses).with_parts(algorithm.privacy, algorithm.name)
    if algorithm.unprotected is not None:
        counts, reason = algorithm.unprotected
        ledger = ledger.with_unprotected(counts(iterations, edges).tolist(), reason, algorithm.name)
    return ledger


__all__ = ["LEDGER_SCHEMA", "Ledger", "check_schema", "non_private", "statement"]
