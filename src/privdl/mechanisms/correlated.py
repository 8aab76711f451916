"""Correlated Gaussian noise across agents: the LDP, DECOR, Whisper/CorN and honest-but-curious designs of seeds
000/001 as one mechanism (SPEC §3), plugged into any algorithm unchanged.

Each agent clips its gradient to C and adds v_i = σ_mix·u_i + Σ_{k ∋ i} [F_k]_i s_k, where u_i comes from the
agent's own key (seed, "noise", "own", i, t) and s_k (one row per column of the factor F_k, F_k F_kᵀ = R_cor^(k))
from the shared key (seed, "noise", label_k, j, t) that only the agents of H_k hold. DECOR's component for edge
(i, j) has factor σ_cor·(+1, −1), so its key is (seed, "noise", "edge:i-j", 0, t): both endpoints draw the same
term with opposite signs and nobody else can.

``generation="per_agent"`` (default) accumulates every agent's sum in a fixed order with elementwise operations, so
the whole network's noise equals, bit for bit, what each agent computes alone (:meth:`CorrelatedNoise.agent`).
``generation="matmul"`` uses one matrix product per component: same draws, same distribution, faster for large d,
but rounding differs in the last bits.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from privdl.covariance.designs import design_covariance
from privdl.covariance.hbc import solve_hbc
from privdl.covariance.problem import CovarianceDesign, check_square, finish_design, verify_covariance
from privdl.covariance.seeds import SeedComponent, coalition_worst_ratio, seed_groups
from privdl.errors import ValidationError
from privdl.mechanisms.base import MECHANISMS, Mechanism, clip_rows
from privdl.network.network import Network
from privdl.privacy.agent_accountant import check_budget, get_accountant
from privdl.privacy.ledger import LedgerEntry
from privdl.rng import Streams

GENERATIONS = ("per_agent", "matmul")
#: Components with at least this many members are added column by column (see CorrelatedNoise.network).
DENSE_COMPONENT = 8


def component_factor(c: SeedComponent) -> np.ndarray:
    """A factor F with F Fᵀ = cov (columns for the non-negligible eigenvalues only); exact ±σ for an edge term."""
    cov = c.cov
    if cov.shape == (2, 2) and np.isclose(cov[0, 1], -cov[0, 0]) and np.isclose(cov[1, 1], cov[0, 0]):
        s = math.sqrt(max(cov[0, 0], 0.0))
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
        parts = [(c.label, list(c.members), component_factor(c)) for c in components]
        self.parts = [p for p in parts if p[2].shape[1] > 0]
        self.draw_keys: list[tuple[str, int]] = []  # one shared draw per (component, factor column)
        targets, draws, coeffs = [], [], []
        for label, members, f in self.parts:
            for j in range(f.shape[1]):
                self.draw_keys.append((label, j))
                for row, agent in enumerate(members):
                    targets.append(agent)
                    draws.append(len(self.draw_keys) - 1)
                    coeffs.append(f[row, j])
        self.targets = torch.as_tensor(targets, dtype=torch.long)
        self.term_draws = torch.as_tensor(draws, dtype=torch.long)
        self.coeffs = np.asarray(coeffs, dtype=np.float64)
        self.agent_terms: list[list[int]] = [[] for _ in range(n)]
        for k, agent in enumerate(targets):
            self.agent_terms[agent].append(k)
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
        self._factors: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # factor tensors, converted once
        self.start(Streams(0))

    def start(self, streams: Streams) -> None:
        """Derive every key's base seed once (sha256); each round folds in t cheaply (:func:`fold_seed`)."""
        self.streams = streams
        self.own_bases = [streams.seed("noise", "own", i) for i in range(self.n)]
        self.draw_bases = [streams.seed("noise", label, j) for label, j in self.draw_keys]

    def covariance(self) -> np.ndarray:
        """The covariance actually generated: σ_mix² I + Σ_k F_k F_kᵀ (embedded)."""
        r = self.sigma_mix**2 * np.eye(self.n)
        for _, members, f in self.parts:
            r[np.ix_(members, members)] += f @ f.T
        return r

    def generated_components(self) -> list[SeedComponent]:
        return [SeedComponent(tuple(members), f @ f.T, label) for label, members, f in self.parts]

    def dense_factor(self) -> np.ndarray:
        """F (n × n) with F Fᵀ equal to :meth:`covariance` (for the batched-replica engine)."""
        mu, q = np.linalg.eigh(self.covariance())
        return q * np.sqrt(np.clip(mu, 0.0, None))

    def _coeff(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._coeffs:
            self._coeffs[dtype] = torch.as_tensor(self.coeffs, dtype=dtype)
        return self._coeffs[dtype]

    def _draw(self, base: int, t: int, d: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(d, generator=self.streams.torch_step(base, t), dtype=dtype)

    def agent(self, i: int, t: int, d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Agent i's noise at step t, drawn only from its own key and the shared keys it holds."""
        coeff = self._coeff(dtype)
        v = self.sigma_mix * self._draw(self.own_bases[i], t, d, dtype)
        for k in self.agent_terms[i]:
            v = v + coeff[k] * self._draw(self.draw_bases[int(self.term_draws[k])], t, d, dtype)
        return v

    def network(self, t: int, d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """All agents' noise at step t (n, d)."""
        v = self.sigma_mix * torch.stack([self._draw(b, t, d, dtype) for b in self.own_bases])
        if not self.draw_bases:
            return v
        s = torch.stack([self._draw(b, t, d, dtype) for b in self.draw_bases])
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


class CorrelatedGaussian(Mechanism):
    """Clip to C and add correlated noise whose covariance R satisfies [R⁻¹]_ii ≤ b (agent-level DP, SPEC §2).

    b comes from (epsilon, delta) through ``accountant`` over ``steps``, or directly as ``precision_bound``.
    """

    design_name = "custom"

    def __init__(self, *, steps: int, network: Network, clip: float = 1.0, epsilon: float | None = None,
                 delta: float = 1e-5, accountant: str = "tight", precision_bound: float | None = None,
                 generation: str = "per_agent", coalition_size: int = 0) -> None:
        check_budget(clip=clip, steps=steps, delta=delta)
        self.accountant = get_accountant(accountant)
        self.clip, self.delta, self.steps = float(clip), float(delta), int(steps)
        if (epsilon is None) == (precision_bound is None):
            raise ValidationError(f"{self.name} needs exactly one of epsilon (calibrate) or precision_bound (b)")
        if epsilon is not None:
            check_budget(epsilon=epsilon)
            self.bound = self.accountant.bound(epsilon, delta, clip, steps)
        else:
            self.bound = float(precision_bound)
        self.target_epsilon = epsilon
        self.network_ = network
        self.coalition_size = int(coalition_size)
        self.design = self.make_design(network.W, self.bound)
        self.noise = CorrelatedNoise(self.design.sigma_mix2, self.components(), network.n, generation)
        # Re-account the noise actually generated (its factors), not the design's claim.
        self.precision_ratio, self.worst_where = coalition_worst_ratio(
            self.noise.sigma_mix**2, self.noise.generated_components(), network.n, self.coalition_size, self.bound)
        if self.precision_ratio > 1 + 1e-9:
            raise ValidationError(
                f"{self.name} noise does not protect agent {self.worst_where.get('agent')} against coalitions of "
                f"size {self.coalition_size}: [(R^(I))⁻¹]_ii / b = {self.precision_ratio:.4g} > 1")
        self.achieved_epsilon = self.accountant.epsilon(self.bound * self.precision_ratio, delta, clip, steps)

    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        return design_covariance(self.design_name, w, b)

    def components(self) -> list[SeedComponent]:
        return list(self.design.components or [])

    def start(self, streams: Streams) -> None:
        super().start(streams)
        self.noise.start(streams)

    def privatize(self, g: torch.Tensor, t: int, generator: torch.Generator) -> torch.Tensor:
        return clip_rows(g, self.clip) + self.noise.network(t, g.shape[1], g.dtype).to(g.device)

    def ledger(self) -> list[LedgerEntry]:
        facts = {k: v for k, v in self.design.summary().items() if k not in ("design", "seconds")}
        return [LedgerEntry(
            unit="agent", mechanism=self.name, accountant=self.accountant.name, epsilon=self.achieved_epsilon,
            delta=self.delta, steps=self.steps,
            noise={"clip": self.clip, "sensitivity": 2 * self.clip, "precision_bound": self.bound,
                   "target_epsilon": self.target_epsilon, "coalition_size": self.coalition_size,
                   "worst_precision_ratio": self.precision_ratio, "generation": self.noise.generation, **facts},
            note=f"correlated Gaussian noise ({self.design.design}); ε from max_i [R⁻¹]_ii over coalitions of "
                 f"size ≤ {self.coalition_size}; {self.accountant.reference}",
        )]

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "clip": self.clip, "precision_bound": self.bound,
                "accountant": self.accountant.name, "trace": self.design.trace,
                "trace_ldp": self.design.trace_ldp, "sigma_mix2": self.design.sigma_mix2}


@MECHANISMS.register("ldp")
class LDPNoise(CorrelatedGaussian):
    """R = I/b: independent noise, drawn per agent from its own key."""

    name = design_name = "ldp"


@MECHANISMS.register("decor")
class DecorNoise(CorrelatedGaussian):
    """DECOR: σ_pair² I + σ_cor² L, one canceling term per edge drawn by both endpoints (seed 000)."""

    name = design_name = "decor"


@MECHANISMS.register("whisper")
class WhisperNoise(CorrelatedGaussian):
    """Whisper D-SGD / CorN-DSGD: R solves problem (P) (seed 001). With ``seeds`` other than ``global`` or
    ``coalition_size`` > 0 it solves problem (10) for those seed groups instead (needs ``privdl[reference]``)."""

    name = design_name = "whisper"

    def __init__(self, *, steps: int, network: Network, seeds: str = "global", **kwargs: object) -> None:
        self.seeds = seeds
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        if self.seeds == "global" and self.coalition_size == 0:
            return design_covariance("whisper", w, b)
        return solve_hbc(w, b, seed_groups(self.seeds, w), self.coalition_size, label=self.seeds)


MECHANISMS.add("corn", WhisperNoise)


@MECHANISMS.register("covariance")
class FileCovarianceNoise(CorrelatedGaussian):
    """A user-given covariance R (.npy) with one global seed; it is verified against b before use."""

    name = design_name = "covariance"

    def __init__(self, *, steps: int, network: Network, file: str, **kwargs: object) -> None:
        self.file = file
        super().__init__(steps=steps, network=network, **kwargs)  # type: ignore[arg-type]

    def make_design(self, w: np.ndarray, b: float) -> CovarianceDesign:
        try:
            r = check_square(np.load(self.file), f"covariance file {self.file}")
        except (OSError, ValueError) as exc:
            raise ValidationError(f"cannot read covariance file {self.file}: {exc}") from None
        if r.shape != w.shape:
            raise ValidationError(f"covariance file {self.file} is {r.shape}, the network has n = {w.shape[0]}")
        verify_covariance(r, b, what=f"covariance file {self.file}")
        return finish_design("file", w, r, b)
