"""Privacy ledger entries written into every run's manifest (unit, mechanism, accountant, achieved (ε, δ))."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class LedgerEntry:
    """One privacy statement about a run.

    ``unit`` is "agent" or "example" ("none" for non-private runs); ``epsilon`` is the ε achieved per agent
    (re-accounted from the noise actually used, not the target).
    """

    unit: str
    mechanism: str
    accountant: str
    epsilon: float
    delta: float
    steps: int
    noise: dict = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        if math.isinf(self.epsilon):
            d["epsilon"] = "inf"
        return d


def non_private(mechanism: str, steps: int) -> LedgerEntry:
    return LedgerEntry("none", mechanism, "none", math.inf, 0.0, steps, {}, "no privacy protection")
