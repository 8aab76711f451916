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

``generation="per_agent"`` (default) accumulates every agent's sum in a fixed order with elementwise operations, so
the whole network's noise equals, bit for bit, what each agent computes alone (:meth:`CorrelatedNoise.agent`).
``generation="matmul"`` uses one matrix product per component: same draws, same distribution, faster for large d,
rounding differs in the last bits.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import TYPE_CHECKING, Annotated

import numpy as np
import torch

from privdl.comm.base import LINEAR_MIXING
from privdl.errors import ValidationError
from privdl.keys import Keys, as_keys, fold, normal
from privdl.mechanisms.base import (
    MECHANISMS, Access, ClippedSum, GradientMechanism, MechanismEnv, Sensitivity, clip_rows, obfuscation,
)
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

GENERATIONS = ("per_agent", "matmul")
CLIPPINGS = ("batch", "per_example")
SAMPLINGS = ("uniform", "poisson")
Seeds_ = Annotated[str, OneOf(("global", "edges", "neighbourhoods", "neighborhoods"),
                              lambda v: v.startswith("groups:") and v[7:].isdigit(), "groups:M")]
#: Components with at least this many members are added column by column (see CorrelatedNoise.network).
DENSE_COMPONENT = 8


def _poisson_lots(params: dict) -> bool:
    return params.get("clipping") == "per_example" and params.get("sampling") == "poisson"


#: ``example_accountant``: the subsampled-Gaussian accountant of Poisson lots, written into the config of every run
#: that has them (runs made before the key existed used "rdp": :class:`privdl.registry.Recorded`)
ExampleAccountant_ = Annotated[str, one_of(*EXAMPLE_ACCOUNTANTS), Recorded(legacy="rdp", applies=_poisson_lots)]


def component_factor(c: SeedComponent) -> np.ndarray:
    """A factor F with F Fᵀ = cov (columns for the non-negligible eigenvalues only); exact ±σ for an edge term."""
    cov = c.cov
    if cov.shape == (2, 2):
        a, b, d = float(cov[0, 0]), float(cov[0, 1]), float(cov[1, 1])
        if math.isclose(b, -a, rel_tol=1e-9, abs_tol=0.0) and math.isclose(d, a, rel_tol=1e-9, abs_tol=0.0):
            s = math.sqrt(max(a, 0.0))
            return np.array([[s], [-s]])
    mu, q = np.linalg.eigh(0.5 * (cov + cov.T))
    keep = mu > max(mu[-1], 0.0) * 1e-13
    return q[:, keep] * np.sqrt(mu[keep])


class CorrelatedNoise:
    """The noise process of a design: σ_mix and the shared-seed components, with per-agent and network draws.

    The terms of every agent are listed once, in a fixed order (components in order, factor columns in order);
    both :meth:`agent` and :meth:`network` (``per_agent`` generation) add them in that order with the same
    elementwise operations, which is why they agree bit for bit.
    """

    def __init__(self, sigma_mix2: float, components: list[SeedComponent], n: int, generation: str = "per_agent"):
        if generation not in GENERATIONS:
            raise ValidationError(f"generation must be one of {GENERATIONS}, got {generation!r}")
        self.n, self.generation = n, generation
        self.sigma_mix = math.sqrt(max(sigma_mix2, 0.0))
        factors: dict[int, np.ndarray] = {}  # DECOR's edges share one 2×2 covariance object: factor it once
        parts = []
        for c in components:
            f = factors.get(id(c.cov))
            if f is None:
                f = factors[id(c.cov)] = component_factor(c)
            parts.append((c.label, list(c.members), f))
        self.parts = [p for p in parts if p[2].shape[1] > 0]
        self.draw_keys: list[tuple[str, int, tuple[int, ...]]] = []  # one shared draw per (component, column)
        targets, draws, coeffs = [], [], []
        for label, members, f in self.parts:  # terms in order: component, column, member
            first, k = len(self.draw_keys), f.shape[1]
            held = tuple(members)
            self.draw_keys.extend((label, j, held) for j in range(k))
            targets.append(np.tile(np.asarray(members, dtype=np.int64), k))
            draws.append(np.repeat(np.arange(first, first + k), len(members)))
            coeffs.append(f.T.reshape(-1))
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt)) if targets else (lambda xs, dt: np.zeros(0, dt))
        self.targets = torch.as_tensor(cat(targets, np.int64))
        self.term_draws = torch.as_tensor(cat(draws, np.int64))
        self.coeffs = cat(coeffs, np.float64)
        # Evaluation plan for the whole network, in term order: runs of small components go through one
        # index_add_ over their terms; a large component adds one factor column at a time to its members' rows.
        self.plan: list[tuple] = []
        term = 0
        for _, members, f in self.parts:
            size = len(members) * f.shape[1]
            if len(members) >= DENSE_COMPONENT and f.shape[1] > 1:
                first_draw = int(self.term_draws[term])
                self.plan.append(("dense", torch.as_tensor(members), f, first_draw, len(members) == n))
            elif self.plan and self.plan[-1][0] == "flat":
                self.plan[-1] = ("flat", self.plan[-1][1], term + size)
            else:
                self.plan.append(("flat", term, term + size))
            term += size
        self._coeffs: dict[torch.dtype, torch.Tensor] = {}
        self._factors: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self.keys: Keys | None = None

    def bind(self, keys: Keys, scope: str = "noise", replica: int = 0) -> None:
        """Take the run's keys: every agent's own key (qualified by itself: a self access) and every shared key."""
        self.keys, self.scope, self.replica = keys, scope, replica
        rows = np.arange(self.n) + replica * self.n
        self.own_keys = keys.own(scope, rows, rows)
        self.draw_bases = as_keys([keys.shared(f"{scope}:{label}:{j}", members, replica)
                                   for label, j, members in self.draw_keys])

    def rescale(self, variance: float) -> None:
        """Multiply the generated covariance by ``variance`` (σ_mix and every factor by its square root)."""
        root = math.sqrt(variance)
        self.sigma_mix *= root
        self.parts = [(label, members, f * root) for label, members, f in self.parts]
        self.coeffs = self.coeffs * root
        self.plan = [(step[0], step[1], step[2] * root, *step[3:]) if step[0] == "dense" else step
                     for step in self.plan]
        self._coeffs.clear()
        self._factors.clear()

    def covariance(self) -> np.ndarray:
        """The covariance actually generated: σ_mix² I + F Fᵀ, F the (n, m) matrix of every shared draw's
        coefficients (:meth:`dense_factor`)."""
        f = self.dense_factor()
        return self.sigma_mix**2 * np.eye(self.n) + f @ f.T

    def generated_components(self) -> list[SeedComponent]:
        from privdl.covariance.seeds import SeedComponent

        return [SeedComponent(tuple(members), f @ f.T, label) for label, members, f in self.parts]

    def dense_factor(self) -> np.ndarray:
        """(n, m) matrix F_cor with the network's shared part = F_cor s, s the m shared draws (column order)."""
        f = np.zeros((self.n, len(self.draw_keys)))
        f[self.targets.numpy(), self.term_draws.numpy()] = self.coeffs
        return f

    def _coeff(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._coeffs:
            self._coeffs[dtype] = torch.as_tensor(self.coeffs, dtype=dtype)
        return self._coeffs[dtype]

    def _bound(self) -> Keys:
        if self.keys is None:
            raise ValidationError("the noise generator has no keys yet: bind(keys) first (the engine does)")
        return self.keys

    @cached_property
    def agent_terms(self) -> list[list[int]]:
        """Every agent's terms (indices into targets / term_draws / coeffs), in order."""
        terms: list[list[int]] = [[] for _ in range(self.n)]
        for k, agent in enumerate(self.targets.tolist()):
            terms[agent].append(k)
        return terms

    def agent(self, i: int, counter: int, d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Agent i's noise at access ``counter``, drawn only from its own key and the shared keys it holds (asked of
        the key source afresh: nothing of the other agents is read)."""
        source = self._bound().sources[self.replica]
        own = source.own(self.scope, np.array([i]), np.array([i]))
        coeff = self._coeff(dtype)
        v = self.sigma_mix * normal(fold(own, counter), d, dtype)[0]
        for k in self.agent_terms[i]:
            label, j, members = self.draw_keys[int(self.term_draws[k])]
            key = source.shared(f"{self.scope}:{label}:{j}", members)
            v = v + coeff[k] * normal(fold(as_keys([key]), counter), d, dtype)[0]
        return v

    def rows(self, agents: torch.Tensor, counter: int, d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The noise of ``agents`` only (their rows of :meth:`network`, bit for bit: ``per_agent`` generation), each
        from its own key and the shared keys it holds — an engine holding some agents draws nothing for the
        others. ``matmul`` generation forms every agent's shared part in one product: refused."""
        agents = [int(a) % self.n for a in torch.as_tensor(agents).reshape(-1).tolist()]
        if not self.draw_keys:  # no shared component (LDP): the own draws, vectorised like network()'s
            self._bound()
            return self.sigma_mix * normal(fold(self.own_keys[agents], counter), d, dtype)
        if self.generation != "per_agent":
            raise ValidationError(f"noise generation {self.generation!r} draws the whole network's noise in one "
                                  "product; an engine holding only some agents (the held frame) needs generation = "
                                  "\"per_agent\"")
        if not agents:
            return torch.zeros(0, d, dtype=dtype)
        return torch.stack([self.agent(a, counter, d, dtype) for a in agents])

    def network(self, counter: int, d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """All agents' noise at access ``counter`` (n, d)."""
        self._bound()
        v = self.sigma_mix * normal(fold(self.own_keys, counter), d, dtype)
        if not self.draw_keys:
            return v
        s = normal(fold(self.draw_bases, counter), d, dtype)
        if self.generation == "matmul":
            for members, f, cols in self._dense_parts(dtype):
                v.index_add_(0, members, f @ s[cols])
            return v
        coeff = self._coeff(dtype)
        chunk = max(self.n, (1 << 22) // max(d, 1))
        for step in self.plan:
            if step[0] == "flat":
                _, start, stop = step
                for lo in range(start, stop, chunk):  # index_add_ on CPU adds the terms in index order
                    sl = slice(lo, min(lo + chunk, stop))
                    v.index_add_(0, self.targets[sl], coeff[sl, None] * s[self.term_draws[sl]])
            else:
                _, members, f, first_draw, everyone = step
                ft = self._tensor(f, dtype)
                part = v if everyone else v[members]
                block = max(1024, (1 << 16) // len(members))  # keep the (members × block) slab in cache
                for lo in range(0, d, block):
                    slab = part[:, lo:lo + block]
                    for j in range(f.shape[1]):  # the same mul-then-add per element as CorrelatedNoise.agent
                        slab.add_(ft[:, j:j + 1] * s[first_draw + j, lo:lo + block])
                if not everyone:
                    v[members] = part
        return v

    def _tensor(self, f: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        key = (id(f), dtype)
        if key not in self._factors:
            self._factors[key] = torch.as_tensor(f, dtype=dtype)
        return self._factors[key]

    def _dense_parts(self, dtype: torch.dtype) -> list:
        out, col = [], 0
        for _, members, f in self.parts:
            r = f.shape[1]
            out.append((torch.as_tensor(members), self._tensor(f, dtype), torch.arange(col, col + r)))
            col += r
        return out


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


class RoundW:
    """One round's W(t) of a time-varying graph, as a design reads a network (its n and dense W): unlike
    :class:`Network`, it may be disconnected (a matching), as a single W(t) of a law may."""

    directed = False
    dynamics = None

    def __init__(self, w: np.ndarray, description: str) -> None:
        self.W, self.description = np.asarray(w, dtype=np.float64), description

    @property
    def n(self) -> int:
        return self.W.shape[0]

    def dense(self, what: str = "", *, copies: int = 1) -> np.ndarray:
        return self.W


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


@MECHANISMS.register("decor")
class DecorNoise(CorrelatedGaussian):
    """DECOR: σ_pair² I + σ_cor² L, one canceling term per edge drawn by both endpoints (seed 000)."""

    name = design_name = "decor"
    needs_combination = LINEAR_MIXING
    combination_reason = W_MIXING_REASON
    directed_ok = False
    directed_reason = ("its canceling terms are drawn by both endpoints of every undirected edge (σ_cor² L, the "
                       "Laplacian of a symmetric graph), and a directed graph's edges have no reverse")

    def __init__(self, *, steps: int | torch.Tensor, network: Network, **kwargs: object) -> None:
        #: the law of W(t) whose rounds' edges carry the canceling terms (None: one W)
        self.dynamics_ = getattr(network, "dynamics", None)
        self._rounds: dict[str, CorrelatedNoise] = {}
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    # ---- a time-varying graph: the canceling terms of round t live on W(t)'s edges -------------------------------
    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        from privdl.covariance.designs import design_covariance

        if self.dynamics_ is None:
            return design_covariance("decor", w, bound=b)
        from privdl.covariance.designs import decor_common_ratio

        # one ratio c = σ_cor²/σ_pair² for every round: the best for the mean trace over one period (a random law:
        # its first 8 rounds, a sample of the law); the design recorded is W(0)'s at its own best ratio
        dyn = self.dynamics_
        self.ratio = decor_common_ratio([dyn.matrix(t) for t in range(dyn.period or 8)])
        return design_covariance("decor", dyn.matrix(0).toarray(), bound=b)

    def round_noise(self, t: int) -> CorrelatedNoise:
        """Round t's noise: R(t) = σ_pair²(t)(I + c·L(t)), L(t) the unweighted Laplacian of W(t)'s edges, one
        canceling term ±σ_cor(t) per edge of the round drawn by its two ends from their shared key (folded with the
        access: a fresh draw every round), σ_pair²(t) = h_t(c)/b with h_t(c) = max_i [(I + c·L(t))⁻¹]_ii, so that
        max_i [R(t)⁻¹]_ii = b in every round. Cached by W(t)'s fingerprint (a periodic law's period)."""
        from privdl.covariance.designs import decor_h
        from privdl.covariance.seeds import SeedComponent

        dyn = self.dynamics_
        fp = dyn.fingerprint(t)
        noise = self._rounds.get(fp)
        if noise is not None:
            return noise
        e = dyn.edges(t)
        src, dst = e.src.long().numpy(), e.dst.long().numpy()
        keep = src < dst
        pairs = list(zip(src[keep].tolist(), dst[keep].tolist()))
        h = decor_h(dyn.matrix(t), self.ratio)
        pair2 = h / self.bound
        cor2 = self.ratio * pair2
        cov = cor2 * np.array([[1.0, -1.0], [-1.0, 1.0]])
        comps = [SeedComponent((i, j), cov, f"edge:{i}-{j}") for i, j in pairs] if cor2 > 0 else []
        noise = CorrelatedNoise(pair2, comps, self.network_.n, self.generation)
        noise.bind(self.env.keys, self.env.scope)
        if len(self._rounds) >= 64:  # a random law: the last rounds' (slices may be a round apart)
            self._rounds.clear()
        self._rounds[fp] = noise
        return noise

    def _precisions(self) -> np.ndarray:
        if self.dynamics_ is None:
            return super()._precisions()
        # every round's R(t) is scaled so that its worst agent's precision is b: each agent is accounted at b
        return np.full(self.network_.n, self.bound)

    def bind(self, env: MechanismEnv) -> None:
        if self.dynamics_ is None:
            return super().bind(env)
        GradientMechanism.bind(self, env)
        if env.rows != self.network_.n:
            raise ValidationError(f"{self.name} was built for {self.network_.n} agents, the run has {env.rows} rows")
        self._rounds = {}
        if self.dynamics_.period is not None:  # a periodic law: every round's shared keys asked now (agreement)
            for k in range(self.dynamics_.period):
                self.round_noise(k)

    def noise_at(self, access: Access) -> CorrelatedNoise:
        return super().noise_at(access) if self.dynamics_ is None else self.round_noise(access.t)

    def noise_facts(self) -> dict:
        out = super().noise_facts()
        if self.dynamics_ is not None:
            out["round_terms"] = {"ratio": self.ratio, "accounting": "σ_pair²(t) = h_t(c)/b per round: "
                                  "max_i [R(t)⁻¹]_ii = b every round; each agent accounted at b"}
        return out

    def note(self) -> str:
        text = super().note()
        if self.dynamics_ is None:
            return text
        return (f"{text}; canceling terms drawn on each round's edges of dynamics {self.dynamics_.name!r} "
                f"(σ_cor²/σ_pair² = {self.ratio:.4g}), σ_pair²(t) set from round t's graph so that "
                "max_i [R(t)⁻¹]_ii = b every round; each agent accounted at b")


@MECHANISMS.register("whisper")
class WhisperNoise(CorrelatedGaussian):
    """Whisper D-SGD / CorN-DSGD: R solves problem (P) (seed 001). With ``seeds`` other than ``global`` or
    ``coalition_size`` > 0 it solves problem (10) for those seed groups instead (needs ``privdl[reference]``)."""

    name = design_name = "whisper"
    needs_combination = LINEAR_MIXING
    combination_reason = W_MIXING_REASON
    #: problem (P) is defined for any W and its dual solver reads W only through WᵀW (privdl.covariance.dual): on a
    #: directed network R minimises Tr(A R Aᵀ) for the push-sum A, what one SGP step adds (tests/test_directed.py
    #: checks it against cvxpy); the seed-group and coalition constructions (problem (10)) are undirected only
    directed_ok = True

    def __init__(self, *, steps: int | torch.Tensor, network: Network, seeds: Seeds_ = "global",
                 optimize_mixing: bool = False, min_spectral_gap: float | None = None,
                 **kwargs: object) -> None:
        if getattr(network, "directed", False) and (seeds != "global" or kwargs.get("coalition_size", 0)):
            raise ValidationError(f"whisper on a directed network solves problem (P) with one global seed only: "
                                  f"seeds = {seeds!r}, coalition_size = {kwargs.get('coalition_size', 0)!r} build "
                                  "seed groups on undirected edges and neighbourhoods (use seeds = \"global\", "
                                  "coalition_size = 0)")
        self.seeds = seeds
        #: the law of W(t) this mechanism designs for (None: one W); a periodic law gets one design per distinct W(t)
        self.dynamics_ = getattr(network, "dynamics", None)
        if self.dynamics_ is not None:
            from privdl.network.dynamics import whisper_refusal

            why = whisper_refusal(self.dynamics_)
            if why is not None:
                raise ValidationError(f"mechanism 'whisper' cannot run on a time-varying graph ([network] dynamics = "
                                      f"{self.dynamics_.name!r}): {why}")
            self._round_kwargs = {k: v for k, v in kwargs.items() if k not in ("epsilon", "precision_bound")}
        if optimize_mixing and getattr(network, "directed", False):
            raise ValidationError("whisper: optimize_mixing designs symmetric doubly stochastic weights; a directed "
                                  "network mixes with its push-sum A (use optimize_mixing = false)")
        if optimize_mixing and self.dynamics_ is not None:
            raise ValidationError("whisper: optimize_mixing designs one W together with R; a time-varying graph "
                                  f"([network] dynamics = {self.dynamics_.name!r}) mixes with its own W(t)")
        self.optimize_mixing = bool(optimize_mixing)
        #: with ``optimize_mixing``: the network whose W was designed together with R (the run mixes with it)
        self.mixing_network: Network | None = None
        if not optimize_mixing and min_spectral_gap is not None:
            raise ValidationError("whisper: min_spectral_gap applies with optimize_mixing = true only")
        if optimize_mixing:
            if seeds != "global" or kwargs.get("coalition_size", 0):
                raise ValidationError("whisper: optimize_mixing designs problem (P) with one global seed; it does "
                                      f"not combine with seeds = {seeds!r} or coalition_size > 0")
            from privdl.covariance.joint import design_joint

            # (the optimal W does not depend on b: problem (P) is homogeneous in it)
            joint = design_joint(network.dense("the joint mixing and covariance design", copies=8), 1.0,
                                 min_spectral_gap=min_spectral_gap)
            network = Network.from_matrix(joint.W, description=f"{network.description}, weights optimized with "
                                                               f"R (whisper optimize_mixing; spectral gap "
                                                               f"{joint.spectral_gap:.6g} ≥ {joint.min_spectral_gap:.6g})")
            self.mixing_network = network
            self.joint_facts = {k: v for k, v in joint.summary().items() if k in (
                "objective", "objective_fixed_mixing", "spectral_gap", "spectral_gap_fixed_mixing",
                "min_spectral_gap")}
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    # ---- a periodic time-varying graph: one design per distinct W(t) --------------------------------------------
    def round_mechanism(self, t: int) -> "WhisperNoise":
        """The design (a whisper mechanism for that one W) whose noise round t adds: R designed for W(t)."""
        return self.round_designs[self.round_fingerprints[int(t) % len(self.round_fingerprints)]]

    def _design_rounds(self, b: float) -> CovarianceDesign:
        """Solve problem (P) once per distinct W(t) of one period (cached by the matrix's fingerprint), every design
        calibrated to the same per-round bound b: each round's release then satisfies [R(t)⁻¹]_ii ≤ b, as one W's
        does, so the composition over the run — and the ε it is calibrated to — is unchanged."""
        dyn = self.dynamics_
        self.round_designs: dict[str, WhisperNoise] = {}
        self.round_fingerprints: list[str] = []
        for k in range(dyn.period):
            fp = dyn.fingerprint(k)
            if fp not in self.round_designs:
                w = RoundW(dyn.matrix(k).toarray(), f"W({k}) of dynamics {dyn.name!r}")
                self.round_designs[fp] = WhisperNoise(steps=self.steps, network=w, seeds=self.seeds,  # type: ignore
                                                      precision_bound=b, **self._round_kwargs)
            self.round_fingerprints.append(fp)
        return self.round_mechanism(0).design

    def _precisions(self) -> np.ndarray:
        if self.dynamics_ is None:
            return super()._precisions()
        # each agent's worst precision over the designs: every round's release is dominated by a Gaussian release
        # of that precision (post-processing), so accounting every access at it bounds the run's ε
        return np.max([m.precisions for m in self.round_designs.values()], axis=0)

    def bind(self, env: MechanismEnv) -> None:
        if self.dynamics_ is None:
            return super().bind(env)
        GradientMechanism.bind(self, env)
        if env.rows != self.network_.n:
            raise ValidationError(f"{self.name} was built for {self.network_.n} agents, the run has {env.rows} rows")
        for m in self.round_designs.values():  # same keys and scope: the draws of access c are keyed by c
            m.bind(env)

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        if self.dynamics_ is None:
            return super().privatize(value, access)
        return self.round_mechanism(access.t).privatize(value, access)

    def noise_facts(self) -> dict:
        out = super().noise_facts()
        if self.dynamics_ is not None:
            out["round_designs"] = self.round_facts()
        if self.optimize_mixing:  # (objective: Tr(W R Wᵀ) at b = 1, the joint design's and MH + optimal R's)
            out.update({"optimize_mixing": True, **{f"joint_{k}": v for k, v in self.joint_facts.items()}})
        return out

    def round_facts(self) -> dict:
        """What each distinct W(t)'s design is (a periodic time-varying graph)."""
        return {"period": len(self.round_fingerprints), "distinct": len(self.round_designs),
                "fingerprints": self.round_fingerprints,
                "trace": {fp: m.design.trace for fp, m in self.round_designs.items()},
                "accounting": "every design meets the same per-round bound b; each agent's ε composes its largest "
                              "[R(t)⁻¹]_ii over the designs"}

    def note(self) -> str:
        text = super().note()
        if self.dynamics_ is None:
            return text
        return (f"{text}; R designed for each of the {len(self.round_designs)} distinct W(t) of dynamics "
                f"{self.dynamics_.name!r}, all to the same bound b, each agent accounted at its largest "
                "[R(t)⁻¹]_ii over them")

    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        from privdl.covariance.designs import design_covariance
        from privdl.covariance.hbc import solve_hbc
        from privdl.covariance.seeds import seed_groups

        if self.dynamics_ is not None:
            return self._design_rounds(b)
        if self.seeds == "global" and self.coalition_size == 0:
            return design_covariance("whisper", w, bound=b)
        return solve_hbc(w, bound=b, groups=seed_groups(self.seeds, w), coalition_size=self.coalition_size,
                         label=self.seeds)


MECHANISMS.add("corn", WhisperNoise)


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
