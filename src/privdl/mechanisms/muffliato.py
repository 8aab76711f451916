"""Muffliato (Cyffers, Even, Bellet & Massoulié, NeurIPS 2022; arXiv 2206.05091; BASELINES.md §7.1): noise once,
then gossip.

Per D-SGD step every agent clips its gradient to C and adds N(0, σ² I) once, from its own key (exactly
``gaussian_ldp``'s noise: ``sigma`` is the same absolute std); the averaging is then ``gossip_rounds`` = K rounds of
gossip with no further noise, each a real transmission on the wire:

* plain:        x^{r+1} = W x^r;
* accelerated:  x¹ = W x⁰, x^{r+1} = ω W x^r + (1 − ω) x^{r−1}, ω = 2(1 − √(λ(1 − λ/4)))/(1 − λ/2)², λ the spectral
  gap (second-smallest eigenvalue of I − W), as the authors' ``gamma_tcheb``. x^r = P_r(W) x⁰ with P_0 = I,
  P_1 = W, P_{r+1} = ω W P_r + (1 − ω) P_{r−1} (:func:`gossip_matrices`).

**What the authors' code (totilas/muffliato @ b72cc1a/35e52ca) does**, read for this module: ``simulation`` and
``acceleratedsimulation`` accumulate, for every observer v, Σ_{t=1..T} Σ_{w∈N(v), w≠v} contrib(W^t, u, w), with
``contrib`` the term (W^t_{w,u})²/‖W^t_{w,·}‖² (BASELINES.md §7.1; ``graphutils.py`` itself was not in the stored
copy), times α/(2σ²) for sensitivity 1 — the powers W^1 … W^T, **also in the accelerated simulation** (its privacy
loop multiplies plain powers while the values follow the Chebyshev recursion). ``ERsampled.eps_random`` caps direct
neighbours at the local-DP value α/(2σ²). Their vector gossip (``gossip_vector``, used by the learning experiments)
starts the recursion from x_old = 0, so its first round is ω W x⁰, not W x⁰; we follow ``acceleratedsimulation``
(x¹ = W x⁰). Their learning code adds the noise *before* clipping (``private.py``) with std 0.5σ; we clip, then
noise (so the sensitivity is bounded).

**Our pairwise bound** (per step, observer v ≠ u): the matrices that carry what v receives are those of the values
sent in rounds 0 … K − 1, P_0 … P_{K−1}, and conservatively P_K too (the gossiped result reaches v in the next
step's first round, there mixed with fresh noise; counted here as seen in the clear); the accelerated case uses the
effective P_r, not W^r. With sensitivity Δ = 2C (replace one agent's clipped gradient),

    ε_{u→v}(α) = α Δ² / (2σ²) · min(1, S_{u,v}),   S_{u,v} = Σ_{r=0..K} Σ_{w∈N(v), w≠v} (P_r[w,u])² / ‖P_r[w,·]‖²,

the cap 1 being the local-DP value α Δ²/(2σ²), which always holds (everything v sees is post-processing of the
noised updates) and which direct neighbours reach (the r = 0 term with w = u is 1). Composed over the run's steps
(each step's noise is fresh; the per-step bound treats the earlier models as known, as the authors accumulate it) and
converted to (ε, δ) with dp_accounting's RDP conversion (``rdp``). The ledger states every agent's worst observer,
and in its noise facts the worst pair, the worst neighbour pair, the worst non-neighbour pair and the local-DP value.
Beside it, against an eavesdropper on every link: the Gaussian mechanism on the clipped update composed over steps,
i.e. ``gaussian_ldp``'s agent-level (ε, δ) with the agent-level accountant (``accountant``, default tight GDP).

``epsilon`` calibrates σ so that the worst pair meets (ε, δ) (never overshooting; ``calibration = "worst_pair"``, the
default); since a direct neighbour always falls back to local DP, that is the local-DP noise under the RDP conversion.

``calibration = "mean_pair"`` calibrates σ the way the authors report privacy instead: their figures (``figa.py``,
``fig3.py``: for a source u, every observer's accumulated Rényi loss clipped at the local-DP value, then the mean — with
min and max — over the observers at each shortest-path distance; ``draw.py``: the histogram of the nodes' losses
relative to LDP) average the pairwise losses. Here S̄ = the mean over ordered pairs u ≠ v of the capped per-step
coefficient min(1, S_{u,v}) — the pairwise Rényi loss averaged over pairs, i.e. over every distance weighted by its
number of pairs — and σ = 2C·z·√S̄, z the noise multiplier whose Gaussian mechanism composed over the steps meets
(ε, δ) (the worst-pair formula with S̄ for the worst S). Then the *mean* pair meets (ε, δ) and every pair closer than
average does not: the ledger still states each agent's worst observer (the guarantee), and its noise facts add
``mean_pair`` (S̄ and its ε) and ``mean_pair_by_distance`` (the authors' per-distance means). S̄ ≤ the worst S, so
the mean-pair σ is never larger than the worst-pair σ.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Annotated

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.keys import Keys
from privdl.mechanisms.base import MECHANISMS
from privdl.mechanisms.correlated import GaussianLDP
from privdl.mechanisms.peers import AveragesTheModel, OncePerRound, check_unit, refuse_sliced, symmetric_w
from privdl.network.network import Network
from privdl.privacy.accountants import AGENT_ACCOUNTANTS
from privdl.privacy.agent_accountant import check_budget
from privdl.privacy.events import GaussianEvent
from privdl.privacy.example_accountant import RdpAccountant, calibrate_noise_multiplier
from privdl.privacy.ledger import Ledger
from privdl.registry import OneOf, one_of

#: which pair's pairwise network DP ``epsilon`` calibrates σ for (module doc)
CALIBRATIONS = ("worst_pair", "mean_pair")
NOTION = "pairwise network DP against one curious non-colluding agent (its worst observer)"
EAVESDROPPER = "against an eavesdropper on every link (local DP of the noised update)"


def chebyshev_omega(w: np.ndarray) -> tuple[float, float]:
    """(ω, λ): λ the second-smallest eigenvalue of I − W (symmetric W), ω the authors' ``gamma_tcheb(λ)``."""
    ev = np.sort(np.linalg.eigvalsh(0.5 * (w + w.T)))
    lam = float(1.0 - ev[-2]) if len(ev) > 1 else 1.0
    lam = min(max(lam, 0.0), 1.0)
    return 2 * (1 - math.sqrt(lam * (1 - lam / 4))) / (1 - lam / 2) ** 2, lam


def gossip_matrices(w: np.ndarray, rounds: int, *, accelerated: bool, omega: float | None = None) -> list[np.ndarray]:
    """[P_0 = I, P_1 = W, …, P_rounds]: x^r = P_r x⁰ under plain or Chebyshev-accelerated gossip."""
    n = w.shape[0]
    if accelerated and omega is None:
        omega = chebyshev_omega(w)[0]
    out = [np.eye(n), w.copy()]
    for _ in range(2, rounds + 1):
        nxt = w @ out[-1] if not accelerated else omega * (w @ out[-1]) + (1 - omega) * out[-2]
        out.append(nxt)
    return out[:rounds + 1]


def shortest_paths(w: np.ndarray) -> np.ndarray:
    """Hop distances between agents on W's support (∞ where unreachable; 0 on the diagonal)."""
    from scipy.sparse.csgraph import shortest_path

    adj = (w != 0).astype(np.float64)
    np.fill_diagonal(adj, 0.0)
    return shortest_path(adj, method="D", unweighted=True, directed=False)


def pairwise_sums(w: np.ndarray, matrices: list[np.ndarray]) -> np.ndarray:
    """S[u, v] = Σ_{P in matrices} Σ_{w∈N(v), w≠v} P[w,u]² / ‖P[w,·]‖² (N(v) from W's support)."""
    adj = (w != 0).astype(np.float64)
    np.fill_diagonal(adj, 0.0)
    s = np.zeros_like(w)
    for p in matrices:
        rn = np.sum(p * p, axis=1)
        q = (p * p) / np.where(rn > 0, rn, 1.0)[:, None]  # q[w, u]
        s += q.T @ adj  # Σ_w q[w, u] adj[w, v]
    return s


class GossipComm(OncePerRound):
    """``mix`` as K rounds of plain or accelerated gossip, every round a real ``mix`` on the wire."""

    def __init__(self, inner, *, rounds: int, accelerated: bool, omega: float, owner: str) -> None:
        super().__init__(inner, owner=owner)
        self.rounds, self.accelerated, self.omega = rounds, accelerated, omega

    def average_step(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        prev, cur = x, self.inner.mix(x, tag=tag)
        for _ in range(1, self.rounds):
            nxt = self.inner.mix(cur, tag=tag)
            if self.accelerated:
                nxt = self.omega * nxt + (1 - self.omega) * prev
            prev, cur = cur, nxt
        return cur


@MECHANISMS.register("muffliato")
class Muffliato(AveragesTheModel, GaussianLDP):
    """Muffliato: clip to C, add N(0, σ²) once (``gaussian_ldp``'s noise), then ``gossip_rounds`` rounds of plain or
    ``accelerated`` gossip (module doc). ``epsilon`` targets the pairwise notion (worst pair); ``sigma`` gives σ."""

    name = "muffliato"
    directed_ok = False
    directed_reason = ("its gossip and its privacy analysis assume a symmetric, doubly stochastic W (Muffliato, "
                       "Cyffers et al.), which a directed graph's push-sum A is not")
    design_name = "ldp"
    wraps_comm = True
    #: it runs in the held frame (:func:`privdl.simulator.sliced.held_frame_refusal`): its noise is
    #: ``gaussian_ldp``'s, each agent's own row; its gossip rounds are the Comm's ``mix`` (:class:`GossipComm`)
    held_reason = None

    def __init__(self, *, steps: int | torch.Tensor, network: Network, gossip_rounds: int = 1,
                 accelerated: bool = False, clip: float = 1.0, epsilon: float | None = None, delta: float = 1e-5,
                 sigma: float | None = None, accountant: Annotated[str, OneOf(AGENT_ACCOUNTANTS)] = "tight",
                 clipping: Annotated[str, one_of("batch", "per_example")] = "batch",
                 generation: Annotated[str, one_of("per_agent", "matmul")] = "per_agent",
                 calibration: Annotated[str, one_of(*CALIBRATIONS)] = "worst_pair",
                 task: object | None = None) -> None:  # (the runner passes the task; batch clipping needs none)
        if isinstance(gossip_rounds, bool) or not isinstance(gossip_rounds, (int, np.integer)) or gossip_rounds < 1:
            raise ValidationError(f"muffliato needs gossip_rounds >= 1 (an integer: the gossip rounds after the "
                                  f"noise of every step), got {gossip_rounds!r}")
        if not isinstance(accelerated, bool):
            raise ValidationError(f"muffliato: accelerated must be true or false, got {accelerated!r}")
        if calibration not in CALIBRATIONS:
            raise ValidationError(f"muffliato: calibration must be one of {', '.join(CALIBRATIONS)} (the pair whose "
                                  f"pairwise network DP meets epsilon: the worst, or the mean over pairs), got "
                                  f"{calibration!r}")
        check_unit("muffliato", clipping)
        check_budget(clip=clip, delta=delta)
        if (epsilon is None) == (sigma is None):
            raise ValidationError("muffliato needs exactly one of epsilon (calibrate) or sigma (the noise std)")
        self.gossip_rounds, self.accelerated = int(gossip_rounds), accelerated
        w = symmetric_w(network, "muffliato")
        self.omega, self.lam = chebyshev_omega(w)
        self.matrices = gossip_matrices(w, self.gossip_rounds, accelerated=accelerated, omega=self.omega)
        s = pairwise_sums(w, self.matrices)
        self.pair_sums = s  # S[u, v] per step, uncapped
        self.capped = np.minimum(s, 1.0)
        np.fill_diagonal(self.capped, 0.0)  # an agent does not observe itself
        self.adjacent = (w != 0) & ~np.eye(network.n, dtype=bool)
        self.worst_observer = self.capped.max(axis=1) if network.n > 1 else np.zeros(network.n)
        off = ~np.eye(network.n, dtype=bool)
        self.mean_pair = float(self.capped[off].mean()) if network.n > 1 else 1.0
        self.distance = shortest_paths(w)
        self.calibration = calibration
        worst_steps = max(int(torch.as_tensor(steps).max()), 1) if torch.as_tensor(steps).numel() else 1
        target = None
        if epsilon is not None:
            check_budget(epsilon=epsilon)
            z = calibrate_noise_multiplier(epsilon=float(epsilon), sample_rate=1.0, steps=worst_steps,
                                           delta=float(delta))
            worst = float(self.worst_observer.max()) if network.n > 1 else 1.0
            pair = self.mean_pair if calibration == "mean_pair" else worst
            sigma = 2.0 * float(clip) * z * math.sqrt(max(pair, 1e-300)) * (1 + 1e-12)
            target = float(epsilon)
        super().__init__(steps=steps, network=network, sigma=sigma, clip=clip, delta=delta, accountant=accountant,
                         generation=generation)
        self.target_epsilon = target

    def wrap_comm(self, comm, *, keys: Keys, eta, algorithm: str):
        refuse_sliced(comm, self.name)
        return GossipComm(comm, rounds=self.gossip_rounds, accelerated=self.accelerated, omega=self.omega,
                          owner=self.name)

    # ---- privacy ------------------------------------------------------------------------------------------------
    def _pair_epsilon(self, s: float, count: int) -> float:
        if s <= 0 or count <= 0:
            return 0.0
        return RdpAccountant().account([GaussianEvent(precision=s / self.sigma**2, sensitivity=2 * self.clip,
                                                      count=count)], delta=self.delta)

    def ledger(self, accesses: torch.Tensor | None = None) -> Ledger:
        counts = (self.accesses() if accesses is None else accesses).tolist()
        n = self.network_.n
        events = [[GaussianEvent(precision=float(self.worst_observer[i % n]) / self.sigma**2,
                                 sensitivity=2 * self.clip, count=int(c))]
                  if c and self.worst_observer[i % n] > 0 else [] for i, c in enumerate(counts)]
        ldp = super().ledger(accesses)
        eaves = replace(ldp, notion=EAVESDROPPER, beside=[])
        note = ("Muffliato (Cyffers et al.): noise once on the clipped update, then "
                f"{self.gossip_rounds} {'accelerated' if self.accelerated else 'plain'} gossip round(s); pairwise "
                "network DP, agent u's ε against its worst observer v: per step α(2C)²/(2σ²)·min(1, S_uv), "
                "S_uv = Σ_{r=0..K} Σ_{w∈N(v)\\{v}} P_r[w,u]²/‖P_r[w,·]‖² (the authors' formula with the effective "
                "gossip matrices, r = 0 and r = K included), composed over steps, RDP → (ε, δ) (dp_accounting); "
                "direct neighbours fall back to local DP. Against an eavesdropper on every link: local DP (beside)")
        if self.calibration == "mean_pair":
            note += ("; σ calibrated so that the MEAN over pairs meets the target (the authors' way of reporting, "
                     "mean_pair in the noise facts): the worst observer's ε stated here exceeds it")
        return Ledger.build(unit="agent", mechanism=self.name, accountant="rdp", delta=self.delta, events=events,
                            noise=self.noise_facts(), note=note, target_epsilon=self.target_epsilon,
                            beside=[eaves], notion=NOTION)

    def pair_report(self, count: int | None = None) -> dict:
        """The worst pair, worst neighbour pair, worst non-neighbour pair (per-step S and ε over ``count`` steps)
        and the local-DP value."""
        count = int(self.accesses().max()) if count is None else int(count)
        n = self.network_.n
        out: dict = {"ldp_rdp_per_step": (2 * self.clip) ** 2 / (2 * self.sigma**2),
                     "ldp_epsilon": self._pair_epsilon(1.0, count), "calibration": self.calibration,
                     "mean_pair": {"S_per_step": self.mean_pair,
                                   "rdp_per_step": (2 * self.clip) ** 2 * self.mean_pair / (2 * self.sigma**2),
                                   "epsilon": self._pair_epsilon(self.mean_pair, count)},
                     "mean_pair_by_distance": self.mean_by_distance()}
        off = ~np.eye(n, dtype=bool)
        for label, mask in (("worst_pair", off), ("worst_neighbour_pair", self.adjacent),
                            ("worst_non_neighbour_pair", off & ~self.adjacent)):
            if not mask.any():
                continue
            vals = np.where(mask, self.capped, -1.0)
            u, v = np.unravel_index(int(np.argmax(vals)), vals.shape)
            sv = float(self.capped[u, v])
            out[label] = {"u": int(u), "v": int(v), "S_per_step": sv, "S_uncapped": float(self.pair_sums[u, v]),
                          "rdp_per_step": (2 * self.clip) ** 2 * sv / (2 * self.sigma**2),
                          "epsilon": self._pair_epsilon(sv, count)}
        return out

    def mean_by_distance(self) -> dict[str, float]:
        """The authors' report: the mean capped per-step S_{u,v} over the pairs at each shortest-path distance
        (keys "1", "2", …; unreachable pairs, distance ∞, left out)."""
        out: dict[str, float] = {}
        finite = self.distance[np.isfinite(self.distance)]
        for dist in sorted({int(x) for x in finite.ravel().tolist() if x > 0}):
            out[str(dist)] = float(self.capped[self.distance == dist].mean())
        return out

    def noise_facts(self) -> dict:
        base = super().noise_facts()
        return {**base, "gossip_rounds": self.gossip_rounds, "accelerated": self.accelerated,
                "omega": self.omega, "spectral_gap_I_minus_W": self.lam, **self.pair_report()}

    def note(self) -> str:
        return "muffliato: clip to C, Gaussian noise once, then gossip"


__all__ = ["CALIBRATIONS", "GossipComm", "Muffliato", "chebyshev_omega", "gossip_matrices", "pairwise_sums",
           "shortest_paths"]
