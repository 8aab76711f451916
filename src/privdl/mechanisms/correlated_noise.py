"""The noise process of a correlated design (SPEC §3): v_i = σ_mix·u_i + Σ_{k ∋ i} [F_k]_i s_k, drawn from keys.

u_i is drawn from agent i's own key (purpose, access, agent), s_k (one row per column of the factor F_k,
F_k F_kᵀ = R_cor^(k)) from the shared key of seed k, which exactly the agents of H_k hold
(:meth:`privdl.keys.KeySource.shared`). The mechanisms that add this noise to clipped gradients are in
:mod:`privdl.mechanisms.correlated` (LDP, file covariances), :mod:`privdl.mechanisms.decor` and
:mod:`privdl.mechanisms.whisper`.

``generation="per_agent"`` (default) accumulates every agent's sum in a fixed order with elementwise operations, so
the whole network's noise equals, bit for bit, what each agent computes alone (:meth:`CorrelatedNoise.agent`) and
what an engine holding some agents draws for them (:meth:`CorrelatedNoise.rows`). ``generation="matmul"`` uses one
matrix product per component: same draws, same distribution, faster for large d, rounding differs in the last bits.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.keys import Keys, as_keys, fold, normal

if TYPE_CHECKING:
    from privdl.covariance.seeds import SeedComponent

GENERATIONS = ("per_agent", "matmul")
#: Components with at least this many members are added column by column (see CorrelatedNoise.network).
DENSE_COMPONENT = 8


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


__all__ = ["DENSE_COMPONENT", "GENERATIONS", "CorrelatedNoise", "component_factor"]
