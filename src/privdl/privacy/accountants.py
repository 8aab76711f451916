"""The accountants, by name: ``tight`` and ``paper`` (agent-level Gaussian events), ``rdp`` and ``pld`` (Rényi DP,
privacy loss distributions: Gaussian, Poisson-subsampled Gaussian and Laplace events, and any registered event type
whose DpEvent dp_accounting's accountant of that name composes; at δ = 0 the basic composition of pure-DP events).
Each says which events it supports (``supports``) and composes a list of them (``account(events, delta=...)``). A
ledger names the accountant it was accounted with, and ``privdl account --manifest`` re-accounts it with that one."""

from __future__ import annotations

from typing import Protocol, Sequence

from privdl.privacy.agent_accountant import AGENT_ACCOUNTANTS, PAPER, TIGHT
from privdl.privacy.events import PrivacyEvent
from privdl.privacy.example_accountant import (
    DEFAULT_EXAMPLE_ACCOUNTANT, EXAMPLE_ACCOUNTANTS, PldAccountant, RdpAccountant,
)
from privdl.registry import Registry


class Accountant(Protocol):
    name: str
    reference: str

    def supports(self, event: PrivacyEvent) -> bool: ...

    def account(self, events: Sequence[PrivacyEvent], *, delta: float) -> float: ...


#: the agent-level accountant privdl calibrates with unless told otherwise (mechanisms, ``privdl account``, ``privdl
#: covariance``): the exact Gaussian-DP composition, tighter than the paper's zCDP bound at every (ε, δ, T)
DEFAULT_AGENT_ACCOUNTANT = "tight"
#: every accountant (:data:`AGENT_ACCOUNTANTS`, defined beside them in :mod:`privdl.privacy.agent_accountant`, holds
#: the agent-level ones)
ACCOUNTANTS: Registry[Accountant] = Registry("accountant")
for _acc in (TIGHT, PAPER):
    ACCOUNTANTS.add(_acc.name, _acc)
ACCOUNTANTS.add("rdp", RdpAccountant())
ACCOUNTANTS.add("pld", PldAccountant())


def get(name: str) -> Accountant:
    return ACCOUNTANTS.get(name)


__all__ = ["ACCOUNTANTS", "AGENT_ACCOUNTANTS", "Accountant", "DEFAULT_AGENT_ACCOUNTANT", "DEFAULT_EXAMPLE_ACCOUNTANT",
           "EXAMPLE_ACCOUNTANTS", "get"]
