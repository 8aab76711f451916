"""Agent-level accounting of the (correlated) Gaussian mechanism (SPEC §2). Every numeric function is keyword-only.

An agent clips its mini-batch gradient to C (replace-one sensitivity 2C) and its noise has effective precision
m = [R⁻¹]_ii per step (m = 1/σ² for independent noise). Over T adaptive steps:

* ``paper`` (seed 001, Theorem 2, Eq. 7): ε = 2C²Tm + 2C√(2TmL), L = log(1/δ) — the zCDP conversion
  ε = ρ + 2√(ρL) of ρ = Σ_steps Δ²m/2. Exactly inverted, the largest admissible precision is
  b = (√(L + ε) − √L)² / (2TC²).
* ``tight`` (privdl's default): the composition is μ-GDP with μ² = Σ_steps Δ²m (= (2C)²Tm), and
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) exactly (Dong, Roth, Su 2022, Cor. 2.13).

As accountants of :mod:`privdl.privacy.events` both consume :class:`GaussianEvent` (and the subsampled Gaussian at
rate 1); calibration (budget → b) never overshoots: the returned b re-accounts to ε ≤ target.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from privdl.errors import ValidationError
from privdl.lazy_module import lazy
from privdl.privacy.events import GaussianEvent, PrivacyEvent, SubsampledGaussianEvent
from privdl.registry import Registry

# scipy's Gaussian tails and root finder, loaded when something is first accounted (privdl.lazy_module)
_special = lazy("scipy.special")
_optimize = lazy("scipy.optimize")


def check_budget(*, epsilon: float | None = None, delta: float | None = None, clip: float | None = None,
                 steps: int | None = None, bound: float | None = None) -> None:
    """Validate accounting inputs with specific messages."""
    for name, value in (("epsilon", epsilon), ("delta", delta), ("clip", clip), ("bound", bound)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.floating))):
            raise ValidationError(f"{name} must be a number, got {value!r}")
    if epsilon is not None and not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValidationError(f"epsilon must be a finite number > 0, got {epsilon}")
    if delta is not None and not 0.0 < delta < 1.0:
        raise ValidationError(f"delta must be in (0, 1), got {delta}")
    if clip is not None and not (clip > 0 and math.isfinite(clip)):
        raise ValidationError(f"clipping norm C must be a finite number > 0, got {clip}")
    if steps is not None and (isinstance(steps, bool) or int(steps) != steps or steps < 1):
        raise ValidationError(f"number of steps T must be an integer >= 1, got {steps}")
    if bound is not None and not (bound > 0 and math.isfinite(bound)):
        raise ValidationError(f"precision bound b must be a finite number > 0, got {bound}")


# ---- paper accountant (seed 001, Theorem 2) ---------------------------------------------------------------------
def paper_epsilon(*, bound: float, delta: float, clip: float, steps: int) -> float:
    """ε = 2C²Tb + 2C√(2TbL) (Theorem 2 of seed 001 with max_i [R⁻¹]_ii = b)."""
    return zcdp_epsilon(rho=2 * clip**2 * steps * bound, delta=delta)


def zcdp_epsilon(*, rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ log(1/δ)) (the conversion behind seed 001's Theorem 2)."""
    return rho + 2 * math.sqrt(rho * math.log(1.0 / delta))


def paper_bound(*, epsilon: float, delta: float, clip: float, steps: int) -> float:
    """b = (√(L+ε) − √L)² / (2TC²): exact inversion of Theorem 2."""
    L = math.log(1.0 / delta)
    root = epsilon / (math.sqrt(L + epsilon) + math.sqrt(L))  # (√(L+ε) − √L) without cancellation
    return root**2 / (2 * steps * clip**2)


def paper_simplified_bound(*, epsilon: float, delta: float, clip: float, steps: int) -> float:
    """The bound printed in seeds 000/001, ε²/(16C²TL). NOT a valid guarantee for ε > 2.34·L: only for
    reproducing a figure that used it."""
    return epsilon**2 / (16 * clip**2 * steps * math.log(1.0 / delta))


# ---- tight accountant (Gaussian DP) ------------------------------------------------------------------------------
def gdp_mu(*, bound: float, clip: float, steps: int) -> float:
    """μ = 2C√(T b): T adaptive Gaussian steps of sensitivity 2C and precision b."""
    return 2.0 * clip * math.sqrt(steps * bound)


def gdp_delta(*, epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth, Su, Cor. 2.13), in log space."""
    if mu <= 0:
        return 0.0
    a = float(_special.log_ndtr(-epsilon / mu + mu / 2))
    b = epsilon + float(_special.log_ndtr(-epsilon / mu - mu / 2))
    if b >= a:
        return 0.0
    return math.exp(a) * -math.expm1(b - a)


def _gdp_delta_many(eps: np.ndarray, mu: np.ndarray) -> np.ndarray:
    a = _special.log_ndtr(-eps / mu + mu / 2)
    b = eps + _special.log_ndtr(-eps / mu - mu / 2)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.exp(a) * -np.expm1(np.minimum(b - a, 0.0))
    return np.where(b >= a, 0.0, out)


def gdp_epsilon(*, mu: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ delta under μ-GDP (rounded up, never below the true value).

    Safeguarded Newton on log δ(ε) (δ'(ε) = −e^ε Φ(−ε/μ − μ/2)) inside a bisection bracket, to 1e-14 relative."""
    if gdp_delta(epsilon=0.0, mu=mu) <= delta:
        return 0.0
    lo, hi = 0.0, max(1.0, mu * mu)
    while gdp_delta(epsilon=hi, mu=mu) > delta:
        lo, hi = hi, 2.0 * hi
    target = math.log(delta)
    eps = 0.5 * (lo + hi)
    for _ in range(200):
        la = float(_special.log_ndtr(-eps / mu + mu / 2))
        lb = eps + float(_special.log_ndtr(-eps / mu - mu / 2))
        if lb >= la:  # δ(ε) = 0 here: ε is above the answer
            hi, eps = eps, 0.5 * (lo + eps)
            continue
        log_d = la + math.log(-math.expm1(lb - la))
        if log_d > target:
            lo = eps
        else:
            hi = eps
        slope = -math.exp(lb - log_d)  # d log δ / dε
        new = eps - (log_d - target) / slope if slope != 0.0 else math.nan  # flat (δ underflows): bisect
        if not lo < new < hi:
            new = 0.5 * (lo + hi)
        if abs(new - eps) <= 1e-14 * max(eps, 1e-300) or hi - lo <= 1e-14 * hi:
            eps = new
            break
        eps = new
    eps = max(eps, lo)
    while gdp_delta(epsilon=eps, mu=mu) > delta:  # make sure the reported ε is valid
        eps = math.nextafter(eps, math.inf) * (1 + 1e-15)
    return eps


def gdp_epsilon_many(*, mu: np.ndarray, delta: float) -> np.ndarray:
    """:func:`gdp_epsilon` for an array of μ at once (vectorised bisection to 1e-13 relative, then the same
    never-below-the-truth guard)."""
    mu = np.asarray(mu, dtype=np.float64)
    out = np.zeros_like(mu)
    live = _gdp_delta_many(np.zeros_like(mu), mu) > delta
    if not live.any():
        return out
    m = mu[live]
    lo, hi = np.zeros_like(m), np.maximum(1.0, m * m)
    while (grow := _gdp_delta_many(hi, m) > delta).any():
        hi = np.where(grow, 2 * hi, hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        over = _gdp_delta_many(mid, m) > delta
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
        if np.all(hi - lo <= 1e-13 * hi):
            break
    out[live] = [e if gdp_delta(epsilon=e, mu=u) <= delta else gdp_epsilon(mu=u, delta=delta)
                 for e, u in zip(hi.tolist(), m.tolist())]
    return out


def gdp_mu_for(*, epsilon: float, delta: float) -> float:
    """The largest μ with δ(ε; μ) ≤ delta (δ is increasing in μ)."""
    hi = 1.0
    while gdp_delta(epsilon=epsilon, mu=hi) < delta:
        hi *= 2.0
    mu = _optimize.brentq(lambda m: gdp_delta(epsilon=epsilon, mu=m) - delta, 0.0, hi, xtol=1e-15, rtol=1e-15)
    while gdp_delta(epsilon=epsilon, mu=mu) > delta:  # never overshoot
        mu *= 1 - 1e-15
    return mu


def tight_bound(*, epsilon: float, delta: float, clip: float, steps: int) -> float:
    return gdp_mu_for(epsilon=epsilon, delta=delta) ** 2 / (4 * clip**2 * steps)


def tight_epsilon(*, bound: float, delta: float, clip: float, steps: int) -> float:
    return gdp_epsilon(mu=gdp_mu(bound=bound, clip=clip, steps=steps), delta=delta)


# ---- accountants as objects -----------------------------------------------------------------------------------------
def _gaussian_terms(events: Sequence[PrivacyEvent], name: str) -> float:
    """Σ count / z² over the (non-subsampled) Gaussian events; refuses any other event."""
    total = 0.0
    for e in events:
        if isinstance(e, GaussianEvent) or (isinstance(e, SubsampledGaussianEvent) and e.sample_rate >= 1):
            total += e.count / e.noise_multiplier**2
        else:
            raise UnsupportedEventError(f"the {name} accountant supports Gaussian events (no subsampling); "
                                        f"got {e.kind}")
    return total


class UnsupportedEventError(ValidationError):
    """An accountant was given an event it cannot account."""


@dataclass(frozen=True)
class AgentAccountant:
    """An accountant of agent-level Gaussian events; ``name`` is ``paper`` or ``tight``. All numeric arguments are
    keyword-only."""

    name: str
    reference: str
    _from_terms: Callable[[np.ndarray, float], np.ndarray]  # Σ 1/z² → ε, vectorised
    _bound: Callable[..., float]

    def supports(self, event: PrivacyEvent) -> bool:
        return isinstance(event, GaussianEvent) or (
            isinstance(event, SubsampledGaussianEvent) and event.sample_rate >= 1)

    def account(self, events: Sequence[PrivacyEvent], *, delta: float) -> float:
        """ε at ``delta`` of the composition of ``events``."""
        check_budget(delta=delta)
        return float(self._from_terms(np.array([_gaussian_terms(events, self.name)]), delta)[0])

    def account_many(self, terms: np.ndarray, *, delta: float) -> np.ndarray:
        """ε for many compositions given their Σ count/z² (vectorised; the ledger's per-agent accounting)."""
        check_budget(delta=delta)
        return self._from_terms(np.asarray(terms, dtype=np.float64), delta)

    def epsilon(self, *, bound: float, delta: float, clip: float, steps: int) -> float:
        """ε achieved after ``steps`` steps when every agent's precision is at most ``bound``."""
        check_budget(delta=delta, clip=clip, steps=steps, bound=bound)
        return self.account([GaussianEvent(precision=bound, sensitivity=2 * clip, count=int(steps))], delta=delta)

    def bound(self, *, epsilon: float, delta: float, clip: float, steps: int) -> float:
        """Largest per-agent precision b on [R⁻¹]_ii meeting (ε, δ); re-accounts to ≤ ε (never overshoots)."""
        check_budget(epsilon=epsilon, delta=delta, clip=clip, steps=steps)
        return _calibrated(self, float(epsilon), float(delta), float(clip), int(steps))


@functools.lru_cache(maxsize=4096)  # pure; sweeps repeat the same budgets
def _calibrated(acc: AgentAccountant, epsilon: float, delta: float, clip: float, steps: int) -> float:
    b = acc._bound(epsilon=epsilon, delta=delta, clip=clip, steps=steps)
    while acc.epsilon(bound=b, delta=delta, clip=clip, steps=steps) > epsilon:
        b *= 1 - 1e-12
    return b


def _paper_from_terms(terms: np.ndarray, delta: float) -> np.ndarray:
    rho = terms / 2.0
    return rho + 2 * np.sqrt(rho * math.log(1.0 / delta))


def _tight_from_terms(terms: np.ndarray, delta: float) -> np.ndarray:
    if terms.size <= 64:  # a few: the scalar root finder is faster than the vectorised bisection
        return np.array([gdp_epsilon(mu=math.sqrt(t), delta=delta) for t in terms.tolist()])
    return gdp_epsilon_many(mu=np.sqrt(terms), delta=delta)


PAPER = AgentAccountant("paper", "seed 001, Theorem 2 (Eq. 7): zCDP, ε = ρ + 2√(ρ log 1/δ)", _paper_from_terms,
                        paper_bound)
TIGHT = AgentAccountant("tight", "Gaussian DP composition (Dong, Roth, Su 2022, Cor. 2.13)", _tight_from_terms,
                        tight_bound)


#: the accountants agent-level mechanisms calibrate with (closed-form inversion to a precision bound); also
#: registered, with the others, in :data:`privdl.privacy.accountants.ACCOUNTANTS` (which re-exports this one)
AGENT_ACCOUNTANTS: Registry[AgentAccountant] = Registry("accountant")
for _acc in (TIGHT, PAPER):
    AGENT_ACCOUNTANTS.add(_acc.name, _acc)
del _acc


def get_accountant(name: str) -> AgentAccountant:
    return AGENT_ACCOUNTANTS.get(name)
