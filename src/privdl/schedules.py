"""Step-size schedules η_t for t = 1, 2, ..., T."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from privdl.errors import ValidationError
from privdl.registry import Registry

SCHEDULES: Registry[Callable[..., "Schedule"]] = Registry("schedule")


@dataclass(frozen=True)
class Schedule:
    """η_t for t = 1, 2, ...; two schedules are equal when their name and parameters are."""

    name: str
    fn: Callable[[int], float] = field(compare=False)
    params: tuple = ()

    def __call__(self, t: int) -> float:
        return self.fn(t)


def _positive(name: str, value: float) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise ValidationError(f"step size {name} must be > 0, got {value}")
    return float(value)


@SCHEDULES.register("constant")
def constant(*, eta: float, iterations: int = 1) -> Schedule:
    """η_t = η."""
    eta = _positive("eta", eta)
    return Schedule("constant", lambda t: eta, (eta,))


@SCHEDULES.register("inv_sqrt")
def inv_sqrt(*, eta: float, iterations: int = 1) -> Schedule:
    """η_t = η₁ / √t (seed 001's quadratic)."""
    eta = _positive("eta", eta)
    return Schedule("inv_sqrt", lambda t: eta / math.sqrt(t), (eta,))


@SCHEDULES.register("inv_t")
def inv_t(*, eta: float, iterations: int = 1) -> Schedule:
    """η_t = η₁ / t."""
    eta = _positive("eta", eta)
    return Schedule("inv_t", lambda t: eta / t, (eta,))


@SCHEDULES.register("geometric")
def geometric(*, eta_start: float, eta_end: float, iterations: int) -> Schedule:
    """η_t = η_start · (η_end / η_start)^((t − 1)/(T − 1)): geometric from η_start (t = 1) to η_end (t = T)."""
    a, b = _positive("eta_start", eta_start), _positive("eta_end", eta_end)
    span = max(iterations - 1, 1)
    return Schedule("geometric", lambda t: a * (b / a) ** ((t - 1) / span), (a, b, span))


def make_schedule(name: str, *, iterations: int, **params: float) -> Schedule:
    return SCHEDULES.build(name, iterations=iterations, **params)
