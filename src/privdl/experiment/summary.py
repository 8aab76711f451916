"""Mean ± standard deviation over seeds: the one summary every table, plot and reproduction uses."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof = 0), as the papers report over seeds."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        return math.nan, math.nan
    return float(a.mean()), float(a.std(ddof=0))


def summarise(rows: Sequence[dict], *, by: Sequence[str], value: str | Callable[[dict], float],
              name: str | None = None, count: str = "seeds") -> list[dict]:
    """Group ``rows`` by the keys ``by`` (first-seen order) and give each group the mean of ``value`` (a key, or a
    function of a row) as ``name``, its standard deviation as ``name_std`` and the group size as ``count``."""
    get = (lambda r: float(r[value])) if isinstance(value, str) else value
    label = name or (value if isinstance(value, str) else "value")
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(get(r))
    out = []
    for key, vals in groups.items():
        m, s = mean_std(vals)
        out.append({**dict(zip(by, key)), label: m, f"{label}_std": s, count: len(vals)})
    return out


def number(text: str) -> float | None:
    """A CSV cell as a number, or None."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def sort_key(values: Sequence[str]) -> tuple:
    """Numbers first in numeric order, then text (so ε sorts 1, 10, 100, not 1, 10, 100 as text)."""
    return tuple((0, v, "") if (v := number(x)) is not None else (1, 0.0, x) for x in values)


__all__ = ["mean_std", "number", "sort_key", "summarise"]
