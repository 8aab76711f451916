"""Correlated Gaussian noise across agents: the LDP, DECOR, Whisper/CorN and honest-but-curious designs of seeds
000/001 as one mechanism (SPEC §3), plugged into any algorithm unchanged.

Each agent clips its gradient to C and adds v_i = σ_mix·u_i + Σ_{k ∋ i} [F_k]_i s_k: u_i is drawn from the agent's
own key (purpose, access, agent), s_k (one row per column of the factor F_k, F_k F_kᵀ = R_cor^(k)) from the shared
key of seed k, which exactly the agents of H_k hold (:meth:`privdl.keys.KeySource.shared`). DECOR's component for
edge (i, j) has factor σ_cor·(+1, −1): both endpoints draw the same term with opposite signs and nobody else can.
``gaussian_ldp`` and ``ldp`` are one design (R = σ²I: own draws only); ``gaussian_ldp`` also takes σ directly.

``clipping="batch"`` (default; the papers' text, agent-level DP) clips each agent's mini-batch gradient to C and adds
v_i to it. ``clipping="per_example"`` is what the seed-001 authors' code runs: clip every example of the batch to C,
sum, add v_i, divide by the batch size B — B× less noise on the update, and the privacy unit becomes **one example**
(replace-one sensitivity 2C on the sum; with ``sampling="poisson"`` lots, add/remove sensitivity C and the
subsampled-Gaussian accountant ``example_accountant`` — PLD by default, or RDP — with effective noise multiplier
1/(C√[R⁻¹]_ii)). The ledger then states, beside
the example-level ε, the agent-level ε of the same noise (sensitivity 2·C·(examples in the batch)), which at the
authors' settings is four orders of magnitude larger.

The noise itself (``generation``: per agent or by matrix products) is drawn by
:class:`privdl.mechanisms.correlated_noise.CorrelatedNoise`. This module holds the mechanism every design shares
(:class:`CorrelatedGaussian`: clipping, calibration, accounting), LDP and user-given covariances; DECOR and Whisper
are in :mod:`privdl.mechanisms.decor` and :mod:`privdl.mechanisms.whisper`.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import TYPE_CHECKING, Annotated

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.mechanisms.base import (
    MECHANISMS, Access, ClippedSum, GradientMechanism, MechanismEnv, Sensitivity, clip_rows, obfuscation,
)
from privdl.mechanisms.correlated_noise import GENERATIONS, CorrelatedNoise
from privdl.network.network import Network
from privdl.privacy.agent_accountant import check_budget, get_accountant
from privdl.privacy.accountants import AGENT_ACCOUNTANTS
from privdl.privacy.events import GaussianEvent, PrivacyEvent, SubsampledGaussianEvent
from privdl.privacy.example_accountant import (
    DEFAULT_EXAMPLE_ACCOUNTANT, EXAMPLE_ACCOUNTANTS, calibrate_noise_multiplier, check_example_accountant,
    check_example_params,
)
from privdl.privacy.ledger import Ledger
from privdl.registry import OneOf, Recorded, one_of

if TYPE_CHECKING:
    from privdl.covariance.problem import CovarianceDesign
    from privdl.covariance.seeds import SeedComponent
# privdl.covariance (and the scipy.linalg, scipy.optimize it loads) is imported where a design is made or checked,
# not with this module: a process that runs another mechanism never loads it (docs/backends.md, what a worker imports)

CLIPPINGS = ("batch", "per_example")
SAMPLINGS = ("uniform", "poisson")


def _poisson_lots(params: dict) -> bool:
    return params.get("clipping") == "per_example" and params.get("sampling") == "poisson"


#: ``example_accountant``: the subsampled-Gaussian accountant of Poisson lots, written into the config of every run
#: that has them (runs made before the key existed used "rdp": :class:`privdl.registry.Recorded`)
ExampleAccountant_ = Annotated[str, one_of(*EXAMPLE_ACCOUNTANTS), Recorded(legacy="rdp", applies=_poisson_lots)]


class CorrelatedGaussian(GradientMechanism):
    """Clip to C and add correlated noise whose covariance R satisfies [R⁻¹]_ii ≤ b (agent-level DP, SPEC §2).

    b comes from (epsilon, delta) through ``accountant`` over ``steps`` (the most any agent makes), or directly as
    ``precision_bound``. ``clip = 0`` disables clipping (then the noise has no sensitivity bound: chain a ``clip``
    before it). Each agent's ε in the ledger comes from its own precision [R⁻¹]_ii (worst over coalitions of size
    ≤ ``coalition_size``) of the noise actually generated.

    ``clipping = "per_example"`` (needs the task; B = its batch size) clips each example, adds v_i to the sum and
    divides by B: example-level DP (module doc). ``sampling`` picks the batch: ``uniform`` (B distinct examples, as
    the authors' shuffled loader; accounted with ``accountant``, no amplification claimed) or ``poisson`` (each
    example joins with rate B/m_i; b is calibrated with the subsampled-Gaussian accountant ``example_accountant``:
    ``"pld"``, the default of new configs, or ``"rdp"``; ``accountant`` then states the agent-level ε beside it).
    ``per_example`` picks the per-example gradient path (closed form for linear models, ghost clipping or
    torch.func).
    """

    design_name = "custom"
    #: the law of W(t) a design follows round by round (DECOR, Whisper on a time-varying graph); None: one W
    dynamics_ = None

    @property
    def follows_dynamics(self) -> bool:
        """Whether this mechanism designs its noise per round's W(t) (built on a time-varying graph)."""
        return self.dynamics_ is not None

    def __init__(self, *, steps: int | torch.Tensor, network: Network, clip: float = 1.0,
                 epsilon: float | None = None, delta: float = 1e-5,
                 accountant: Annotated[str, OneOf(AGENT_ACCOUNTANTS)] = "tight",
                 precision_bound: float | None = None,
                 generation: Annotated[str, one_of(*GENERATIONS)] = "per_agent",
                 coalition_size: int = 0,
                 clipping: Annotated[str, one_of(*CLIPPINGS)] = "batch",
                 sampling: Annotated[str, one_of(*SAMPLINGS)] = "uniform",
                 per_example: Annotated[str, one_of("auto", "closed_form", "ghost", "vmap")] = "auto",
                 task: object | None = None,
                 example_accountant: ExampleAccountant_ = DEFAULT_EXAMPLE_ACCOUNTANT) -> None:
        super().__init__(steps=steps, n=network.n)
        if clip != 0:
            check_budget(clip=clip)
        check_budget(delta=delta)
        if generation not in GENERATIONS:
            raise ValidationError(f"generation must be one of {GENERATIONS}, got {generation!r}")
        self.accountant = get_accountant(accountant)
        self.accountant_name = self.accountant.name
        self.clip, self.delta = float(clip), float(delta)
        self.example_accountant = check_example_accountant(example_accountant, key="example_accountant",
                                                           owner=self.name)
        self._per_example(clipping, sampling, per_example, task, network.n)
        worst_steps = int(self.steps.max()) if self.steps.numel() else 0
        if (epsilon is None) == (precision_bound is None):
            raise ValidationError(f"{self.name} needs exactly one of epsilon (calibrate) or precision_bound (b)")
        if epsilon is not None:
            if not clip:
                raise ValidationError(f"{self.name}: calibrating to epsilon needs a clip > 0 (the sensitivity)")
            check_budget(epsilon=epsilon, steps=max(worst_steps, 1))
            if self.sampling == "poisson":  # the largest b whose subsampled RDP meets ε for every owner
                self.bound = self._poisson_bound(float(epsilon), float(delta))
            else:
                self.bound = self.accountant.bound(epsilon=epsilon, delta=delta, clip=clip,
                                                   steps=max(worst_steps, 1))
        else:
            check_budget(bound=precision_bound)
            self.bound = float(precision_bound)
        self.target_epsilon = epsilon
        self.network_ = network
        self.coalition_size = int(coalition_size)
        self.generation = generation
        self.variance_scale = 1.0  # > 1 only by rounding: see precisions
        self.design = self.make_design(network.dense(f"the {self.name} covariance design", copies=8), self.bound)
        if self.worst_ratio > 1 + 1e-9:
            i = int(np.argmax(self.precisions))
            raise ValidationError(
                f"{self.name} noise does not protect agent {i} against coalitions of size {self.coalition_size}: "
                f"[(R^(I))⁻¹]_ii / b = {self.worst_ratio:.4g} > 1")

    def _per_example(self, clipping: str, sampling: str, method: str, task: object | None, n: int) -> None:
        if clipping not in CLIPPINGS:
            raise ValidationError(f"clipping must be one of {CLIPPINGS}, got {clipping!r}")
        if sampling not in SAMPLINGS:
            raise ValidationError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        self.clipping, self.sampling = clipping, sampling
        self.batch: int | None = None
        self.rates: torch.Tensor | None = None
        self.batch_sizes: torch.Tensor | None = None
        if self.example_accountant != DEFAULT_EXAMPLE_ACCOUNTANT and sampling != "poisson":
            raise ValidationError(f"{self.name}: example_accountant applies to sampling = 'poisson' (Poisson lots) "
                                  f"only; sampling = {sampling!r} is accounted with accountant = "
                                  f"{self.accountant.name!r}")
        if clipping == "batch":
            if sampling != "uniform":
                raise ValidationError(f"{self.name}: sampling = {sampling!r} applies to clipping = 'per_example' "
                                      "only (batch clipping draws uniform mini-batches)")
            return
        counts = getattr(task, "counts", None)
        if task is None or counts is None or not getattr(task, "examples", True):
            raise ValidationError(f"{self.name}: clipping = 'per_example' needs a task with examples to clip "
                                  f"(got {getattr(task, 'name', task)!r})")
        if counts.numel() != n:
            raise ValidationError(f"{self.name}: the task has {counts.numel()} agents, the network {n}")
        if not self.clip:
            raise ValidationError(f"{self.name}: clipping = 'per_example' needs clip > 0")
        self.batch = int(task.batch_size)  # type: ignore[attr-defined]
        m = counts.to(torch.float64)
        if sampling == "poisson":
            self.rates = (self.batch / m).clamp(max=1.0)
            self.need = ClippedSum(self.clip, rates=self.rates, method=method)
            self.batch_sizes = m  # a lot may hold the whole data: the agent-level sensitivity's worst case
            self.accountant_name = self.example_accountant
        else:
            self.need = ClippedSum(self.clip, method=method, batch=self.batch)
            self.batch_sizes = m.clamp(max=self.batch)

    def _poisson_bound(self, epsilon: float, delta: float) -> float:
        """min over owners of 1/(C z_j)², z_j the noise multiplier calibrated with ``example_accountant`` at rate q_j
        for T_j accesses."""
        assert self.rates is not None
        bounds: dict[tuple[float, int], float] = {}
        for q, t in zip(self.rates.tolist(), self.steps.expand(self.rates.numel()).tolist()):
            if t > 0 and (q, t) not in bounds:
                check_example_params(sample_rate=q, steps=t, delta=delta, epsilon=epsilon)
                z = calibrate_noise_multiplier(epsilon=epsilon, sample_rate=q, steps=t, delta=delta,
                                               accountant=self.example_accountant)
                bounds[(q, t)] = 1.0 / (self.clip * z) ** 2
        if not bounds:
            raise ValidationError(f"{self.name}: no agent makes a noisy access; nothing to calibrate")
        return min(bounds.values())

    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        from privdl.covariance.designs import design_covariance

        return design_covariance(self.design_name, w, bound=b)

    def components(self) -> list[SeedComponent]:
        return list(self.design.components or [])

    @cached_property
    def noise(self) -> CorrelatedNoise:
        """The noise generator (built when first needed: large designs are cheap to account, costly to expand)."""
        noise = CorrelatedNoise(self.design.sigma_mix2, self.components(), self.network_.n, self.generation)
        if self.variance_scale != 1.0:
            noise.rescale(self.variance_scale)
        return noise

    def _precisions(self) -> np.ndarray:
        from privdl.covariance.problem import precision_diagonal
        from privdl.covariance.seeds import coalition_precisions

        n = self.network_.n
        generated = "noise" in self.__dict__ or n <= 400
        if self.coalition_size == 0:
            if generated:
                return precision_diagonal(self.noise.covariance())
            verified = self.design.precisions  # finish_design's verification already computed it
            return (precision_diagonal(self.design.R) if verified is None else verified) / self.variance_scale
        comps, mix2 = ((self.noise.generated_components(), self.noise.sigma_mix**2) if generated
                       else (self.components(), self.design.sigma_mix2))
        p = coalition_precisions(mix2, comps, n, coalition_size=self.coalition_size)
        return p if generated else p / self.variance_scale

    @cached_property
    def precisions(self) -> np.ndarray:
        """Every agent's precision [R⁻¹]_ii (worst over coalitions of size ≤ q) of the noise actually generated
        (its factors); for a large design that was never expanded (an accounting-only run), of the design's R.
        Factoring an ill-conditioned R (singular W: cond ≈ 10⁷) can leave the generated precision a few 1e-9 above
        b by rounding alone; the generator is then scaled up by that excess (``variance_scale``, in the ledger) so
        the noise actually added never overshoots. A larger excess is a real violation and is refused."""
        p = self._precisions()
        for _ in range(8):
            worst = float(np.max(p)) / self.bound
            if worst <= 1.0 or worst > 1 + 1e-6:
                return p
            self.variance_scale *= worst * (1 + 1e-12)
            if "noise" in self.__dict__:
                self.noise.rescale(worst * (1 + 1e-12))
            p = self._precisions()
        return p

    @property
    def worst_ratio(self) -> float:
        return float(np.max(self.precisions) / self.bound)

    @property
    def precision_ratio(self) -> float:
        return self.worst_ratio

    @property
    def achieved_epsilon(self) -> float:
        return self.ledger().epsilon  # type: ignore[return-value]

    def bind(self, env: MechanismEnv) -> None:
        super().bind(env)
        if env.rows != self.network_.n:
            raise ValidationError(f"{self.name} was built for {self.network_.n} agents, the run has {env.rows} rows "
                                  "(stack replicas with privdl.mechanisms.stack)")
        self.noise.bind(env.keys, env.scope)

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        n = self.network_.n
        everyone = access.owners.numel() == n and access.all_rows
        if not everyone and not access.is_self:
            raise ValidationError(f"{self.name}: correlated noise is drawn for every agent's own gradient "
                                  "(owners = requesters); cross-gradients need an independent-noise mechanism")
        # per-example: the value is already the clipped sum of the batch; the noise goes on the sum, then / B
        g = clip_rows(value, self.clip) if self.clip and self.batch is None else value
        flat = g.reshape(value.shape[0], -1)
        noise = self.noise_at(access)
        if everyone:
            drawn = noise.network(access.call, flat.shape[1], flat.dtype)
        else:  # some agents' own gradients (an engine that holds only them: the held frame)
            drawn = noise.rows(access.owners, access.call, flat.shape[1], flat.dtype)
        out = flat + drawn.to(flat.device)
        return (out if self.batch is None else out / self.batch).reshape(value.shape)

    def noise_at(self, access: Access) -> CorrelatedNoise:
        """The correlated noise this access draws from (one R; DECOR on a time-varying graph: its round's)."""
        return self.noise

    def sensitivity_after(self, before: Sensitivity | None) -> Sensitivity | None:
        if self.batch is not None:  # replace one example (uniform batch) / add or remove one (Poisson lot)
            return Sensitivity(self.clip if self.sampling == "poisson" else 2 * self.clip, "example")
        return Sensitivity(2 * self.clip, "agent") if self.clip else before

    def step_events(self, before: Sensitivity | None) -> tuple[list[PrivacyEvent], Sensitivity | None]:
        sens = self.sensitivity_after(before)
        if sens is None:
            return obfuscation(self.name, "Gaussian noise on a gradient with no sensitivity bound (no clip before "
                                          "it): no DP guarantee")
        if self.rates is not None:  # the subsampled Gaussian with the effective multiplier 1/(C√[R⁻¹]_ii)
            return [SubsampledGaussianEvent(noise_multiplier=1.0 / (sens.value * math.sqrt(float(m))),
                                            sample_rate=float(q))
                    for m, q in zip(self.precisions, self.rates.tolist())], sens
        return [GaussianEvent(precision=float(m), sensitivity=sens.value) for m in self.precisions], sens

    def beside(self, counts: torch.Tensor) -> list[Ledger]:
        """Per-example clipping: the agent-level ε of the same noise (replace one agent's whole data: the clipped
        sum moves by up to 2·C·(examples in its batch) — min(B, m_i) for uniform batches, m_i for Poisson lots)."""
        if self.batch_sizes is None:
            return []
        n = self.network_.n
        events = [[GaussianEvent(precision=float(self.precisions[i % n]),
                                 sensitivity=2 * self.clip * float(self.batch_sizes[i % n]), count=int(c))]
                  if c else [] for i, c in enumerate(counts.tolist())]
        return [Ledger.build(unit="agent", mechanism=self.name, accountant=self.accountant.name, delta=self.delta,
                             events=events, note="the same noise accounted for one agent's whole data: "
                                                 "sensitivity 2·C·(examples in its batch)")]

    def noise_facts(self) -> dict:
        facts = {k: v for k, v in self.design.summary().items() if k not in ("design", "seconds")}
        sens = self.sensitivity_after(None)
        out = {"clip": self.clip, "sensitivity": sens.value if sens else None, "precision_bound": self.bound,
               "coalition_size": self.coalition_size, "worst_precision_ratio": self.worst_ratio,
               "generation": self.generation, "variance_scale": self.variance_scale, "clipping": self.clipping,
               **facts}
        if self.batch is not None:
            out.update({"sampling": self.sampling, "batch": self.batch, "per_example": self.need.method})
        return out

    def note(self) -> str:
        text = (f"correlated Gaussian noise ({self.design.design}); each agent's ε from its own [R⁻¹]_ii over "
                f"coalitions of size ≤ {self.coalition_size}; ")
        if self.batch is None:
            return text + self.accountant.reference
        if self.rates is not None:
            return text + ("per-example clipping to C, Poisson lots of expected size B, noise on the lot sum "
                           f"(example level; {self.example_accountant.upper()} of the subsampled Gaussian with "
                           "multiplier 1/(C√[R⁻¹]_ii))")
        return text + (f"per-example clipping to C, uniform batches of B = {self.batch} distinct examples, noise on "
                       f"the batch sum (example level, replace-one sensitivity 2C, no subsampling amplification "
                       f"claimed); {self.accountant.reference}")

    def describe(self) -> dict[str, object]:
        """Facts of the design (the metrics of an accounting-only run)."""
        extra = {k: v for k, v in self.design.extra.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return {"name": self.name, "clip": self.clip, "clipping": self.clipping, "precision_bound": self.bound,
                "accountant": self.accountant_name, "trace": self.design.trace, "trace_ldp": self.design.trace_ldp,
                "cdp_lower_bound": self.design.cdp_lower_bound, "sigma_mix2": self.design.sigma_mix2,
                "max_precision_ratio": self.worst_ratio, "design_seconds": self.design.seconds, **extra}


#: why DECOR and Whisper need an algorithm that mixes linearly (``needs_combination``)
W_MIXING_REASON = ("its noise is correlated across agents so that it cancels in W's mixing (designed for Tr(W R Wᵀ)); "
                   "noise that reaches the models otherwise keeps its full per-agent variance, which can be far above "
                   "LDP's at the same ε")


@MECHANISMS.register("ldp")
class LDPNoise(CorrelatedGaussian):
    """R = σ²I with σ² = 1/b: independent noise, drawn per agent from its own key. ``sigma`` gives σ directly
    instead of ``epsilon`` / ``precision_bound`` (the ledger then reports the ε it achieves)."""

    name = design_name = "ldp"

    def __init__(self, *, steps: int | torch.Tensor, network: Network, sigma: float | None = None,
                 **kwargs: object) -> None:
        if sigma is not None:
            if not (isinstance(sigma, (int, float)) and sigma > 0 and math.isfinite(sigma)):
                raise ValidationError(f"sigma must be > 0, got {sigma}")
            if kwargs.get("epsilon") is not None or kwargs.get("precision_bound") is not None:
                raise ValidationError(f"{self.name} takes one of epsilon, precision_bound or sigma")
            try:
                kwargs["precision_bound"] = 1.0 / sigma**2  # the formula every calibration used: same bits
            except OverflowError:  # σ² beyond double precision
                kwargs["precision_bound"] = 0.0
            if kwargs["precision_bound"] == 0.0:
                raise ValidationError(f"sigma = {sigma:g} is too large: its precision bound 1/σ² underflows to 0 "
                                      f"(no information at all is released; use mechanism \"none\" with no "
                                      f"training, or a finite noise level)")
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    @property
    def sigma(self) -> float:
        """The noise std actually generated, √(σ_mix²) of the design (1/√b up to rounding)."""
        return math.sqrt(self.design.sigma_mix2)

    def noise_facts(self) -> dict:
        return {**super().noise_facts(), "sigma": self.sigma, "variance": self.sigma**2}


@MECHANISMS.register("gaussian_ldp")
class GaussianLDP(LDPNoise):
    """The LDP design under its first name (clip to C, add N(0, σ²) per coordinate from each agent's own key)."""

    name = "gaussian_ldp"
    design_name = "ldp"


@MECHANISMS.register("covariance")
class FileCovarianceNoise(CorrelatedGaussian):
    """A user-given covariance R (.npy) with one global seed; it is verified against b before use."""

    name = design_name = "covariance"

    def __init__(self, *, steps: int | torch.Tensor, network: Network, file: str, **kwargs: object) -> None:
        self.file = file
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        from privdl.covariance.problem import check_square, finish_design, verify_covariance

        try:
            r = check_square(np.load(self.file), f"covariance file {self.file}")
        except (OSError, ValueError) as exc:
            raise ValidationError(f"cannot read covariance file {self.file}: {exc}") from None
        if r.shape != w.shape:
            raise ValidationError(f"covariance file {self.file} is {r.shape}, the network has n = {w.shape[0]}")
        verify_covariance(r, bound=b, what=f"covariance file {self.file}")
        return finish_design("file", w, r, b)
