"""Example-level accounting (SPEC §2): Rényi DP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar,
Zhang 2019) composed over steps and converted to (ε, δ) with the improved conversion (Balle et al. 2020), via
Google's ``dp_accounting`` (tested against an independent closed form at integer orders and the published vector
q = 0.04, σ = 1.5, T = 2250, δ = 1e-5 → ε ≈ 7.329).

Count every noisy access to the data as a step (inner iterations, accumulated sub-batches).
"""

from __future__ import annotations

import functools
import logging
import math

import dp_accounting
from dp_accounting import mechanism_calibration
from dp_accounting.rdp import RdpAccountant as _DpRdpAccountant

from privdl.errors import ValidationError
from privdl.privacy.agent_accountant import UnsupportedEventError
from privdl.privacy.events import GaussianEvent, PrivacyEvent, SubsampledGaussianEvent

#: Orders used by the accountant (Opacus' default set: 1.1 … 10.9 in steps of 0.1, then 12 … 63).
DEFAULT_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
# dp_accounting logs (through absl) every fractional order whose series fails to converge for tiny σ during the
# calibration search; such orders are excluded, which can only make ε larger (conservative). Keep the log quiet.
logging.getLogger("absl").setLevel(logging.ERROR)

#: Noise multipliers the calibration searches over.
SIGMA_RANGE = (1e-2, 1e4)


def check_example_params(*, sample_rate: float, steps: int, delta: float,
                         noise_multiplier: float | None = None, epsilon: float | None = None) -> None:
    if not (0 < sample_rate <= 1):
        raise ValidationError(f"sample rate q must be in (0, 1], got {sample_rate}")
    if not (isinstance(steps, int) and steps >= 1):
        raise ValidationError(f"steps must be an integer >= 1, got {steps!r}")
    if not (0 < delta < 1):
        raise ValidationError(f"delta must be in (0, 1), got {delta}")
    if noise_multiplier is not None and not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValidationError(f"noise multiplier must be > 0, got {noise_multiplier}")
    if epsilon is not None and not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValidationError(f"epsilon must be > 0, got {epsilon}")


def _event(noise_multiplier: float, sample_rate: float, steps: int) -> dp_accounting.DpEvent:
    return SubsampledGaussianEvent(noise_multiplier, sample_rate, steps).to_dp_event()


@functools.lru_cache(maxsize=4096)  # pure in its arguments; sweeps and seeds repeat the same (σ, q, T, δ)
def _rdp(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
         orders: tuple[float, ...]) -> tuple[float, float]:
    accountant = _DpRdpAccountant(list(orders))
    accountant.compose(_event(noise_multiplier, sample_rate, steps))
    eps, order = accountant.get_epsilon_and_optimal_order(delta)
    return float(eps), float(order)


def rdp_epsilon(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                orders: tuple[float, ...] = DEFAULT_ORDERS) -> tuple[float, float]:
    """(ε, best order) of ``steps`` Poisson-subsampled Gaussian steps (noise σ·C on a sum of C-clipped terms)."""
    check_example_params(sample_rate=sample_rate, steps=steps, delta=delta, noise_multiplier=noise_multiplier)
    return _rdp(float(noise_multiplier), float(sample_rate), int(steps), float(delta), tuple(orders))


@functools.lru_cache(maxsize=1024)
def _calibrate(epsilon: float, sample_rate: float, steps: int, delta: float, orders: tuple[float, ...]) -> float:
    lo, hi = SIGMA_RANGE
    if _rdp(hi, sample_rate, steps, delta, orders)[0] > epsilon:
        raise ValidationError(
            f"no noise multiplier up to {hi:g} reaches ε = {epsilon} at δ = {delta} (q = {sample_rate}, "
            f"T = {steps}); raise ε or δ, or lower q or T")
    if _rdp(lo, sample_rate, steps, delta, orders)[0] <= epsilon:
        return lo
    sigma = mechanism_calibration.calibrate_dp_mechanism(
        lambda: _DpRdpAccountant(list(orders)), lambda s: _event(s, sample_rate, steps), epsilon, delta,
        mechanism_calibration.ExplicitBracketInterval(lo, hi), tol=1e-7)
    step = 1e-6
    while _rdp(sigma, sample_rate, steps, delta, orders)[0] > epsilon:  # guard: never overshoot
        sigma *= 1 + step
        step *= 2  # a search that ended far off is corrected in a few dozen accountings, not thousands
    return float(sigma)


def calibrate_noise_multiplier(*, epsilon: float, sample_rate: float, steps: int, delta: float,
                               orders: tuple[float, ...] = DEFAULT_ORDERS) -> float:
    """The smallest noise multiplier (to 1e-6 relative) whose re-accounted ε is ≤ ``epsilon``; never overshoots."""
    check_example_params(sample_rate=sample_rate, steps=steps, delta=delta, epsilon=epsilon)
    return _calibrate(float(epsilon), float(sample_rate), int(steps), float(delta), tuple(orders))


class RdpAccountant:
    """Rényi-DP accountant of Gaussian and Poisson-subsampled Gaussian events (dp_accounting), orders
    :data:`DEFAULT_ORDERS`, Balle et al.'s conversion to (ε, δ)."""

    name = "rdp"
    reference = ("RDP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019), conversion of Balle et al. "
                 "2020, via dp_accounting")

    def supports(self, event: PrivacyEvent) -> bool:
        return isinstance(event, (GaussianEvent, SubsampledGaussianEvent))

    def account(self, events: list[PrivacyEvent], *, delta: float) -> float:
        """ε at ``delta`` of the composition of ``events``."""
        if not 0 < delta < 1:
            raise ValidationError(f"delta must be in (0, 1), got {delta}")
        for e in events:
            if not self.supports(e):
                raise UnsupportedEventError(f"the rdp accountant supports Gaussian and subsampled Gaussian events; "
                                            f"got {e.kind}")
        if len(events) == 1 and isinstance(events[0], SubsampledGaussianEvent):
            e = events[0]
            return _rdp(float(e.noise_multiplier), float(e.sample_rate), int(e.count), float(delta),
                        DEFAULT_ORDERS)[0]
        accountant = _DpRdpAccountant(list(DEFAULT_ORDERS))
        for e in events:
            accountant.compose(e.to_dp_event())
        return float(accountant.get_epsilon(delta))
