"""Agent-level accounting of the (correlated) Gaussian mechanism (SPEC §2).

An agent clips its mini-batch gradient to C (replace-one sensitivity 2C) and its noise has effective precision
m = [R⁻¹]_ii per step (m = 1/σ² for independent noise). Over T adaptive steps:

* ``paper`` (seed 001, Theorem 2, Eq. 7): ε = 2C²Tm + 2C√(2TmL), L = log(1/δ). Exactly inverted, the largest
  admissible precision is b = (√(L + ε) − √L)² / (2TC²).
* ``tight`` (privdl's default): the T-fold composition is μ-GDP with μ = 2C√(Tm) (Dong, Roth, Su 2022), and
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) exactly.

Calibration (budget → b) never overshoots: the returned b re-accounts to ε ≤ target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from scipy.optimize import brentq
from scipy.special import log_ndtr

from privdl.errors import ValidationError
from privdl.registry import Registry


def check_budget(*, epsilon: float | None = None, delta: float | None = None, clip: float | None = None,
                 steps: int | None = None, bound: float | None = None) -> None:
    """Validate accounting inputs with specific messages."""
    if epsilon is not None and not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValidationError(f"epsilon must be a finite number > 0, got {epsilon}")
    if delta is not None and not 0.0 < delta < 1.0:
        raise ValidationError(f"delta must be in (0, 1), got {delta}")
    if clip is not None and not (clip > 0 and math.isfinite(clip)):
        raise ValidationError(f"clipping norm C must be > 0, got {clip}")
    if steps is not None and (int(steps) != steps or steps < 1):
        raise ValidationError(f"number of steps T must be an integer >= 1, got {steps}")
    if bound is not None and not (bound > 0 and math.isfinite(bound)):
        raise ValidationError(f"precision bound b must be > 0, got {bound}")


# ---- paper accountant (seed 001, Theorem 2) ---------------------------------------------------------------------
def paper_epsilon(bound: float, delta: float, clip: float, steps: int) -> float:
    """ε = 2C²Tb + 2C√(2TbL) (Theorem 2 of seed 001 with max_i [R⁻¹]_ii = b)."""
    L = math.log(1.0 / delta)
    return 2 * clip**2 * steps * bound + 2 * clip * math.sqrt(2 * steps * bound * L)


def paper_bound(epsilon: float, delta: float, clip: float, steps: int) -> float:
    """b = (√(L + ε) − √L)² / (2TC²): exact inversion of Theorem 2."""
    L = math.log(1.0 / delta)
    # (√(L+ε) − √L) = ε / (√(L+ε) + √L) avoids cancellation for small ε
    root = epsilon / (math.sqrt(L + epsilon) + math.sqrt(L))
    return root**2 / (2 * steps * clip**2)


def paper_simplified_bound(epsilon: float, delta: float, clip: float, steps: int) -> float:
    """The bound printed in seeds 000/001, ε²/(16C²TL). NOT a valid guarantee for ε > 2.34·L: only for
    reproducing a figure that used it."""
    return epsilon**2 / (16 * clip**2 * steps * math.log(1.0 / delta))


# ---- tight accountant (Gaussian DP) ------------------------------------------------------------------------------
def gdp_mu(bound: float, clip: float, steps: int) -> float:
    """μ = 2C√(T b): T adaptive Gaussian steps of sensitivity 2C and precision b."""
    return 2.0 * clip * math.sqrt(steps * bound)


def gdp_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth, Su, Cor. 2.13), in log space."""
    if mu <= 0:
        return 0.0
    a = float(log_ndtr(-epsilon / mu + mu / 2))
    b = epsilon + float(log_ndtr(-epsilon / mu - mu / 2))
    if b >= a:
        return 0.0
    return math.exp(a) * -math.expm1(b - a)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ delta under μ-GDP (rounded up, never below the true value)."""
    if gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
    eps = brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-14, rtol=1e-14)
    while gdp_delta(eps, mu) > delta:  # make sure the reported ε is valid
        eps = math.nextafter(eps, math.inf) * (1 + 1e-15)
    return eps


def gdp_mu_for(epsilon: float, delta: float) -> float:
    """The largest μ with δ(ε; μ) ≤ delta (δ is increasing in μ)."""
    hi = 1.0
    while gdp_delta(epsilon, hi) < delta:
        hi *= 2.0
    mu = brentq(lambda m: gdp_delta(epsilon, m) - delta, 0.0, hi, xtol=1e-15, rtol=1e-15)
    while gdp_delta(epsilon, mu) > delta:  # never overshoot
        mu *= 1 - 1e-15
    return mu


def tight_bound(epsilon: float, delta: float, clip: float, steps: int) -> float:
    mu = gdp_mu_for(epsilon, delta)
    return mu**2 / (4 * clip**2 * steps)


def tight_epsilon(bound: float, delta: float, clip: float, steps: int) -> float:
    return gdp_epsilon(gdp_mu(bound, clip, steps), delta)


# ---- accountants as objects ---------------------------------------------------------------------------------------
class AgentAccountant(Protocol):
    name: str

    def bound(self, epsilon: float, delta: float, clip: float, steps: int) -> float: ...

    def epsilon(self, bound: float, delta: float, clip: float, steps: int) -> float: ...


@dataclass(frozen=True)
class _Accountant:
    name: str
    _bound: object
    _epsilon: object
    reference: str

    def epsilon(self, bound: float, delta: float, clip: float, steps: int) -> float:
        """ε achieved after ``steps`` steps when every agent's precision is at most ``bound``."""
        check_budget(delta=delta, clip=clip, steps=steps, bound=bound)
        return self._epsilon(bound, delta, clip, steps)  # type: ignore[operator]

    def bound(self, epsilon: float, delta: float, clip: float, steps: int) -> float:
        """Largest per-agent precision b on [R⁻¹]_ii meeting (ε, δ); re-accounts to ≤ ε (never overshoots)."""
        check_budget(epsilon=epsilon, delta=delta, clip=clip, steps=steps)
        b = self._bound(epsilon, delta, clip, steps)  # type: ignore[operator]
        while self._epsilon(b, delta, clip, steps) > epsilon:  # type: ignore[operator]
            b *= 1 - 1e-12
        return b


AGENT_ACCOUNTANTS: Registry[_Accountant] = Registry("accountant")
AGENT_ACCOUNTANTS.add("paper", _Accountant("paper", paper_bound, paper_epsilon, "seed 001, Theorem 2 (Eq. 7)"))
AGENT_ACCOUNTANTS.add("tight", _Accountant("tight", tight_bound, tight_epsilon,
                                           "Gaussian DP composition (Dong, Roth, Su 2022, Cor. 2.13)"))


def get_accountant(name: str) -> _Accountant:
    return AGENT_ACCOUNTANTS.get(name)
