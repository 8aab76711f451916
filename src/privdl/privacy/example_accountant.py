"""Example-level accounting (SPEC §2) of the Poisson-subsampled Gaussian mechanism, with two accountants of
Google's ``dp_accounting``:

* ``rdp`` — Rényi DP (Mironov, Talwar, Zhang 2019) composed over steps and converted to (ε, δ) with the improved
  conversion (Balle et al. 2020) (tested against an independent closed form at integer orders and the published
  vector q = 0.04, σ = 1.5, T = 2250, δ = 1e-5 → ε ≈ 7.329);
* ``pld`` — privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022: dp_accounting's
  ``PLDAccountant``, add/remove neighbours, pessimistic "connect the dots" discretisation), a numerical upper bound
  that is tight up to its discretisation: the same σ, q, T give a smaller ε than RDP (8–23 % at seed 004's and
  DPDL's configurations, up to 94 % at a few steps with small q), so the same target needs less noise (4–8 % less σ
  there). Tested against RDP as an upper bound and, at q = 1, against the exact ε of the Gaussian mechanism (Balle &
  Wang 2018).

Count every noisy access to the data as a step (inner iterations, accumulated sub-batches).

**The PLD's discretisation** (:func:`pld_interval`). The PLD accountant rounds privacy losses up to multiples of its
``value_discretization_interval``; its ε is an upper bound at any interval, looser the coarser it is, and its cost
grows as the interval shrinks. No fixed interval suits every ε (1e-4 takes 2.4 s per ε at σ = 0.5, q = 0.043,
T = 2000; 1e-2 is 70 % loose at ε = 0.5), so it is chosen from the events themselves: their RDP ε at
:data:`SCALE_ORDERS` (an upper bound of the PLD's, milliseconds to compute) times a relative interval of
:data:`PLD_RELATIVE_INTERVAL` = 2e-4 at T = :data:`PLD_REFERENCE_STEPS` = 2000 events, scaled as 1/√T (the
discretisation error grows as T × interval²) and clipped to :data:`PLD_RELATIVE_RANGE`; the interval is then
clipped to :data:`PLD_INTERVAL_RANGE`. Measured against a 10× finer interval over T ∈ {1 … 10⁴}, q ∈ {0.01 … 1},
σ ∈ {0.5 … 15}, that keeps the PLD ε within 8e-4 relative of its limit wherever ε < 30 (1e-4 would keep it within
1e-4 for 1.6–1.7× the time; the error grows at ε in the hundreds, where the RDP scale overstates ε) at 0.003–0.3 s
per ε. Chosen from the events alone, it is the same when a manifest's ledger is re-accounted, so a PLD ledger
re-accounts bit for bit. An explicit interval can be given to :func:`pld_epsilon` and
:func:`calibrate_noise_multiplier` (and ``privdl account --pld-interval``); one too coarse to reach a target ε is
refused, saying so.

**Calibration** (:func:`calibrate_noise_multiplier` with ``accountant="pld"``): bracketed at the σ where the RDP
scale meets the target (PLD's ε is below it there) and 10 % below, searched with dp_accounting's
``mechanism_calibration`` on the PLD accountant, then guarded like RDP's: the returned σ re-accounts to ε ≤ target.
At seed 004's and DPDL's configurations it takes 0.36–1.35× the time of RDP's calibration (BENCHMARKS.md, "PLD
against RDP").

**The default** (:data:`DEFAULT_EXAMPLE_ACCOUNTANT`): PLD for new configs — tighter than RDP at every (σ, q, T)
tested and as fast to calibrate (well below the 2 s per calibration the issue set as the bar); every reproduction
names ``accountant = "rdp"``, the accountant its seed's committed numbers were made with, and a run's config records
the accountant it used (:class:`privdl.registry.Recorded`).

**Other events.** As accountants of ledgers (:class:`RdpAccountant`, :class:`PldAccountant`) both take every event
whose DpEvent dp_accounting's accountant of their name composes — the Laplace mechanism
(:class:`~privdl.privacy.events.PureLaplaceEvent`) and a registered event type of a user's among them — and at
δ = 0 (pure DP) both state the basic composition Σ count·ε₀ of pure events, refusing any other (its ε at δ = 0 is
infinite; the RDP conversion would say ∞ for every event, the PLD's a discretised upper bound of the same sum).
"""

from __future__ import annotations

import functools
import logging
import math

from privdl.errors import ValidationError
from privdl.lazy_module import lazy
from privdl.privacy.agent_accountant import UnsupportedEventError
from privdl.privacy.events import (
    PrivacyEvent, SubsampledGaussianEvent, account_pure, claims_no_guarantee, is_non_private,
)

# dp_accounting and scipy.optimize are loaded when something is first accounted or calibrated, not when this module
# is imported (privdl.lazy_module: a worker of the distributed runtime that only records events never loads them)
dp_accounting = lazy("dp_accounting")
mechanism_calibration = lazy("dp_accounting.mechanism_calibration")
optimize = lazy("scipy.optimize")
_dp_pld = lazy("dp_accounting.pld")
_dp_rdp = lazy("dp_accounting.rdp")


def _DpPldAccountant(*args, **kwargs):  # noqa: N802 - dp_accounting's PLDAccountant, imported on first use
    return _dp_pld.PLDAccountant(*args, **kwargs)


def _DpRdpAccountant(*args, **kwargs):  # noqa: N802 - dp_accounting's RdpAccountant, imported on first use
    return _dp_rdp.RdpAccountant(*args, **kwargs)


#: Orders used by the accountant (Opacus' default set: 1.1 … 10.9 in steps of 0.1, then 12 … 63).
DEFAULT_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
# dp_accounting logs (through absl) every fractional order whose series fails to converge for tiny σ during the
# calibration search; such orders are excluded, which can only make ε larger (conservative). Keep the log quiet.
logging.getLogger("absl").setLevel(logging.ERROR)

#: Noise multipliers the calibration searches over.
SIGMA_RANGE = (1e-2, 1e4)
#: The example-level accountants (names in :data:`privdl.privacy.accountants.ACCOUNTANTS`).
EXAMPLE_ACCOUNTANTS = ("rdp", "pld")
#: The accountant new example-level configs calibrate with (``dp_sgd``, DPDL / DP-DSGT / DP-DiNNO through it, the
#: correlated mechanisms' Poisson per-example path, ``privdl account --unit example``): PLD, tighter than RDP at
#: every (σ, q, T) tested and as fast to calibrate (module doc; BENCHMARKS.md, "PLD against RDP"). Every
#: reproduction names ``accountant = "rdp"`` explicitly, the accountant its seed's numbers were made with.
DEFAULT_EXAMPLE_ACCOUNTANT = "pld"
#: The PLD's value discretisation interval relative to the RDP ε of the same events, at :data:`PLD_REFERENCE_STEPS`
#: steps; it scales as 1/√T (the discretisation error grows as T × interval²), clipped to
#: :data:`PLD_RELATIVE_RANGE` (module doc).
PLD_RELATIVE_INTERVAL = 2e-4
PLD_REFERENCE_STEPS = 2000
PLD_RELATIVE_RANGE = (2.5e-5, 3e-3)
#: The RDP orders of that scale: 21 orders up to 256, 3–5× cheaper than the 150 of :data:`DEFAULT_ORDERS` (from
#: under a millisecond to tens of ms per ε); its ε is within 2 % of theirs below ε = 100 (it only sets a resolution)
#: and above the PLD's at every point tested.
SCALE_ORDERS = (1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 256)
#: The adaptive interval's clip, and the finest explicit interval accepted (finer ones take minutes and gigabytes).
PLD_INTERVAL_RANGE = (1e-6, 1.0)


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


def check_example_accountant(accountant: str, *, key: str = "example-level accountant", owner: str = "") -> str:
    """``accountant`` if it names an example-level accountant; else the error names the ``owner`` (a mechanism),
    its ``key`` and the valid names."""
    if accountant not in EXAMPLE_ACCOUNTANTS:
        raise ValidationError(f"{owner + ': ' if owner else ''}unknown {key} {accountant!r}; valid names: "
                              f"{', '.join(EXAMPLE_ACCOUNTANTS)}")
    return accountant


def check_pld_interval(interval: float | None) -> None:
    if interval is None:
        return
    lo = PLD_INTERVAL_RANGE[0]
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) \
            or interval <= 0:
        raise ValidationError(f"the PLD discretisation interval must be a finite number > 0, got {interval!r}")
    if interval < lo:
        raise ValidationError(f"the PLD discretisation interval {interval:g} is finer than {lo:g}: the distribution "
                              "would take minutes and gigabytes; leave it adaptive (the default) or give >= "
                              f"{lo:g}")


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
                               orders: tuple[float, ...] = DEFAULT_ORDERS, accountant: str = "rdp",
                               value_discretization_interval: float | None = None) -> float:
    """The smallest noise multiplier (to 1e-6 relative) whose ε re-accounted with ``accountant`` is ≤ ``epsilon``;
    never overshoots. ``accountant``: "rdp" (this function's default since before PLD; mechanisms pass theirs) or
    "pld" (dp_accounting's bracketed search on the PLD accountant, then the same guard; ``orders`` are RDP's,
    ``value_discretization_interval`` the PLD's — None: adaptive, see the module doc)."""
    check_example_params(sample_rate=sample_rate, steps=steps, delta=delta, epsilon=epsilon)
    if check_example_accountant(accountant) == "pld":
        check_pld_interval(value_discretization_interval)
        return _calibrate_pld(float(epsilon), float(sample_rate), int(steps), float(delta),
                              None if value_discretization_interval is None else float(value_discretization_interval))
    if value_discretization_interval is not None:
        raise ValidationError("value_discretization_interval applies to the pld accountant only")
    return _calibrate(float(epsilon), float(sample_rate), int(steps), float(delta), tuple(orders))


def example_epsilon(*, accountant: str, noise_multiplier: float, sample_rate: float, steps: int,
                    delta: float) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian steps with the named example-level accountant ("rdp" or "pld")."""
    if check_example_accountant(accountant) == "pld":
        return pld_epsilon(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=delta)[0]
    return rdp_epsilon(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=delta)[0]


# ---- PLD ------------------------------------------------------------------------------------------------------------
def pld_interval(rdp_epsilon_value: float, steps: int = PLD_REFERENCE_STEPS) -> float:
    """The PLD discretisation interval for ``steps`` events whose RDP ε is ``rdp_epsilon_value``: that ε times
    :data:`PLD_RELATIVE_INTERVAL` · √(:data:`PLD_REFERENCE_STEPS` / T) (clipped to :data:`PLD_RELATIVE_RANGE`), the
    whole clipped to :data:`PLD_INTERVAL_RANGE` (module doc)."""
    lo, hi = PLD_INTERVAL_RANGE
    if not math.isfinite(rdp_epsilon_value):
        return hi
    relative = PLD_RELATIVE_INTERVAL * math.sqrt(PLD_REFERENCE_STEPS / max(int(steps), 1))
    relative = min(max(relative, PLD_RELATIVE_RANGE[0]), PLD_RELATIVE_RANGE[1])
    return min(max(relative * rdp_epsilon_value, lo), hi)


def _steps(event: dp_accounting.DpEvent) -> int:
    """How many elementary mechanisms a DpEvent composes."""
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return event.count * _steps(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return sum(_steps(e) for e in event.events)
    return 1


@functools.lru_cache(maxsize=4096)
def _scale(events: tuple[dp_accounting.DpEvent, ...], delta: float) -> float:
    """The RDP ε of ``events`` at :data:`SCALE_ORDERS`: the scale of the PLD's adaptive interval (∞, hence the
    coarsest interval, for a DpEvent the RDP accountant does not take)."""
    accountant = _DpRdpAccountant(list(SCALE_ORDERS))
    if not all(accountant.supports(e) for e in events):  # a DpEvent only the PLD takes: the coarsest interval
        return math.inf
    for e in events:
        accountant.compose(e)
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)  # pure in its arguments (DpEvents are frozen, hashable values)
def _pld_of(events: tuple[dp_accounting.DpEvent, ...], delta: float, interval: float | None) -> tuple[float, float]:
    """(ε, interval used) of the composition of ``events`` with dp_accounting's PLD accountant; ``interval`` None:
    :func:`pld_interval` of their RDP ε at :data:`SCALE_ORDERS` (always called with these three arguments, by
    position: one cache entry per distinct composition)."""
    if interval is None:
        interval = pld_interval(_scale(events, delta), sum(_steps(e) for e in events))
    accountant = _DpPldAccountant(value_discretization_interval=interval)
    for e in events:
        accountant.compose(e)
    return float(accountant.get_epsilon(delta)), float(interval)


def _subsampled(noise_multiplier: float, sample_rate: float, steps: int) -> tuple[dp_accounting.DpEvent, ...]:
    return (_event(noise_multiplier, sample_rate, steps),)


@functools.cache
def _adaptive_pld() -> type:
    """The class :class:`_AdaptivePld` (defined on first use: it subclasses a dp_accounting class)."""

    class _AdaptivePld(dp_accounting.PrivacyAccountant):
        """dp_accounting's PLD accountant (add/remove neighbours) whose discretisation interval is fixed
        (``interval``) or chosen from the events composed (:func:`pld_interval`) when ε is asked: what
        :func:`mechanism_calibration.calibrate_dp_mechanism` calls for each candidate σ."""

        def __init__(self, interval: float | None = None) -> None:
            super().__init__(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
            self.interval = interval
            self._events: list[dp_accounting.DpEvent] = []

        def _maybe_compose(self, event: dp_accounting.DpEvent, count: int,
                           do_compose: bool) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
            error = _DpPldAccountant()._maybe_compose(event, count, False)
            if error is None and do_compose:
                self._events.append(event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count))
            return error

        def get_epsilon(self, target_delta: float) -> float:
            return _pld_of(tuple(self._events), float(target_delta), self.interval)[0]

    return _AdaptivePld


def pld_epsilon(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                value_discretization_interval: float | None = None) -> tuple[float, float]:
    """(ε, discretisation interval used) of ``steps`` Poisson-subsampled Gaussian steps with the PLD accountant;
    the interval is adaptive (module doc) unless given."""
    check_example_params(sample_rate=sample_rate, steps=steps, delta=delta, noise_multiplier=noise_multiplier)
    check_pld_interval(value_discretization_interval)
    return _pld_of(_subsampled(float(noise_multiplier), float(sample_rate), int(steps)), float(delta),
                   None if value_discretization_interval is None else float(value_discretization_interval))


def _scale_sigma(epsilon: float, sample_rate: float, steps: int, delta: float) -> float:
    """σ at which the RDP ε at :data:`SCALE_ORDERS` meets ``epsilon`` (to 1e-3 relative, from above; milliseconds
    per try, bracketed by doubling from σ = 1): where the PLD calibration starts."""
    lo, hi = SIGMA_RANGE

    def gap(sigma: float) -> float:
        return _scale(_subsampled(sigma, sample_rate, steps), delta) - epsilon

    a = b = 1.0
    if gap(1.0) > 0:
        while gap(b) > 0:
            if b >= hi:
                return hi
            a, b = b, min(2 * b, hi)
    else:
        while gap(a) <= 0:
            if a <= lo:
                return lo
            a, b = max(a / 2, lo), a
    root = optimize.brentq(lambda u: gap(math.exp(u)), math.log(a), math.log(b), xtol=1e-3)
    return min(math.exp(root + 1e-3), hi)


def _unreachable(epsilon: float, sample_rate: float, steps: int, delta: float, interval: float | None,
                 top: float) -> ValidationError:
    """Why no σ in :data:`SIGMA_RANGE` meets ``epsilon`` (``top``: the PLD ε at the largest)."""
    hi = SIGMA_RANGE[1]
    if interval is not None and _pld_of(_subsampled(hi, sample_rate, steps), delta, None)[0] <= epsilon:
        return ValidationError(
            f"the PLD discretisation interval {interval:g} cannot reach ε = {epsilon} at δ = {delta} (q = "
            f"{sample_rate}, T = {steps}): it rounds every privacy loss up to a multiple of {interval:g}, so even "
            f"σ = {hi:g} accounts to ε = {top:.4g} > {epsilon}; give a finer interval, or none (adaptive)")
    return ValidationError(
        f"no noise multiplier up to {hi:g} reaches ε = {epsilon} at δ = {delta} (q = {sample_rate}, T = {steps}; "
        f"PLD accountant{'' if interval is None else f', discretisation interval {interval:g}'}: ε >= {top:.4g}); "
        "raise ε or δ, or lower q or T")


@functools.lru_cache(maxsize=1024)
def _calibrate_pld(epsilon: float, sample_rate: float, steps: int, delta: float, interval: float | None) -> float:
    def eps_at(sigma: float) -> float:
        return _pld_of(_subsampled(sigma, sample_rate, steps), delta, interval)[0]

    lo, hi = SIGMA_RANGE
    # bracket the root: the RDP scale's σ (an upper bound: its ε bounds the PLD's) and 10 % below it (PLD saves 4-9 %
    # of σ at the configurations measured), widened where that does not bracket: ε(a) > target >= ε(b)
    b = _scale_sigma(epsilon, sample_rate, steps, delta)
    while eps_at(b) > epsilon:
        if b >= hi:
            raise _unreachable(epsilon, sample_rate, steps, delta, interval, eps_at(hi))
        b = min(2 * b, hi)
    a = max(0.9 * b, lo)
    while eps_at(a) <= epsilon:
        if a <= lo:
            return lo
        a, b = max(a * 0.7, lo), a
    sigma = mechanism_calibration.calibrate_dp_mechanism(
        lambda: _adaptive_pld()(interval), lambda s: _event(float(s), sample_rate, steps), epsilon, delta,
        mechanism_calibration.ExplicitBracketInterval(a, b), tol=1e-5 * b)
    sigma = b if sigma is None else float(sigma)
    step = 1e-6
    while eps_at(sigma) > epsilon:  # guard: never overshoot (the adaptive interval moves with σ)
        sigma *= 1 + step
        step *= 2
    return sigma


@functools.lru_cache(maxsize=4096)  # DpEvents are frozen, hashable values; a ledger asks once per agent
def _dp_supports(name: str, event: dp_accounting.DpEvent) -> bool:
    """Whether dp_accounting's accountant ``name`` ("rdp" or "pld") can compose ``event``."""
    accountant = _DpRdpAccountant(list(DEFAULT_ORDERS)) if name == "rdp" else _DpPldAccountant()
    return accountant.supports(event)


class _ExampleAccountant:
    """What both example-level accountants share: the events they take — every event whose DpEvent dp_accounting's
    accountant of the same name supports (Gaussian, Poisson-subsampled Gaussian, Laplace, a registered event type's
    own; never one that claims no guarantee or is non-private: the ledger states those without an accountant) —,
    the checks on a composition's input, and δ = 0: pure DP, the basic composition of pure events
    (:func:`privdl.privacy.events.account_pure`; any other event is refused there, its ε being infinite)."""

    name = ""

    def supports(self, event: PrivacyEvent) -> bool:
        if claims_no_guarantee(event) or is_non_private(event):
            return False
        return _dp_supports(self.name, event.to_dp_event())

    def _check(self, events: list[PrivacyEvent], delta: float) -> None:
        if not 0 <= delta < 1:
            raise ValidationError(f"delta must be in [0, 1) (0: pure DP), got {delta!r}")
        for e in events:
            if not self.supports(e):
                raise UnsupportedEventError(f"the {self.name} accountant supports the events dp_accounting's "
                                            f"{self.name.upper()} accountant supports (Gaussian, subsampled "
                                            f"Gaussian, Laplace, ...); got {e.kind}")


class RdpAccountant(_ExampleAccountant):
    """Rényi-DP accountant of Gaussian and Poisson-subsampled Gaussian events (dp_accounting), orders
    :data:`DEFAULT_ORDERS`, Balle et al.'s conversion to (ε, δ)."""

    name = "rdp"
    reference = ("RDP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019), conversion of Balle et al. "
                 "2020, via dp_accounting")

    def account(self, events: list[PrivacyEvent], *, delta: float) -> float:
        """ε at ``delta`` of the composition of ``events`` (δ = 0: pure DP, the basic composition)."""
        self._check(events, delta)
        if delta == 0:
            return account_pure(events, self.name)
        if len(events) == 1 and isinstance(events[0], SubsampledGaussianEvent):
            e = events[0]
            return _rdp(float(e.noise_multiplier), float(e.sample_rate), int(e.count), float(delta),
                        DEFAULT_ORDERS)[0]
        accountant = _DpRdpAccountant(list(DEFAULT_ORDERS))
        for e in events:
            accountant.compose(e.to_dp_event())
        return float(accountant.get_epsilon(delta))


class PldAccountant(_ExampleAccountant):
    """Privacy-loss-distribution accountant of Gaussian and Poisson-subsampled Gaussian events (dp_accounting's
    ``PLDAccountant``, add/remove neighbours, its discretisation interval chosen from the events: module doc).
    Tighter than :class:`RdpAccountant` at every (σ, q, T) tested; whether new configs use it by default:
    :data:`DEFAULT_EXAMPLE_ACCOUNTANT`."""

    name = "pld"
    reference = ("privacy loss distribution of the Poisson-subsampled Gaussian (Koskela et al. 2020; Doroshenko et "
                 "al. 2022), pessimistic discretisation adapted to the events' RDP ε, via dp_accounting")

    def account(self, events: list[PrivacyEvent], *, delta: float) -> float:
        """ε at ``delta`` of the composition of ``events`` (δ = 0: pure DP, the basic composition — the PLD's own
        ε at δ = 0 is the same, rounded up to its discretisation)."""
        self._check(events, delta)
        if delta == 0:
            return account_pure(events, self.name)
        return _pld_of(tuple(e.to_dp_event() for e in events), float(delta), None)[0]
