"""Zip-DL (Biswas et al., "Low-cost privacy-preserving decentralized learning", PoPETs; arXiv 2403.11795;
BASELINES.md §7.2): per-sender zero-sum noise on every outgoing edge, one averaging per D-SGD step.

Algorithm 1, for sender a with closed neighbourhood Γ_a (itself included, d_a = |Γ_a|) and its row W_{a,·}:

    Y_{a→v} ~ N(0, s_a² I) for v ∈ Γ_a,        s_a = η_t·ς_a (the noise scales with the step size, as the paper's
                                                 γ²ς_a²; the model's change from one clipped gradient is η_t·2C)
    Z_{a→v} = Y_{a→v} − (1/(d_a W_{a,v})) Σ_{j∈Γ_a} W_{a,j} Y_{a→j}       so that Σ_v W_{a,v} Z_{a→v} = 0 exactly
    a sends x_a + Z_{a→v} to v (one distinct payload per edge, ``comm.send``); it keeps x_a + Z_{a→a}
    a combines Σ_{v∈Γ_a} W_{a,v} (x_v + Z_{v→a}).

With symmetric W the network average is untouched by the noise (Corollary 3.2). Every Y is keyed by its sender's own
key, the receiver and the round (``keys.normal("zip_dl", t, ...)``), like every other draw of a run. So in a split
run's held frame (:class:`privdl.comm.held.HeldComm`) each engine draws its own agents' Y — their own copies and
the edges they send along, from their own keys — and a sender's correction needs nothing but its own draws: each
engine's noise, messages and combination are its agents' entries of the simulator's, bit for bit.

**Per-message variance** (Lemma 3.3): σ²_{a→v} = c_{a→v}·s_a² with
c_{a→v} = (d_a − 1)²/d_a² + Σ_{j∈Γ_a, j≠v} W_{a,j}² / (d_a W_{a,v})². This is the **weighted** construction of the
paper. The authors' decentralizepy fork (``ZeroSumSharing.py``) subtracts the *unweighted* mean and draws std
√(d/(d−1))·σ, adding noise on averaging round 0 only; the two agree only for uniform weights (k-regular graphs with
W_{a,·} = 1/d_a, where c = (d − 1)/d, Remark 3.4). A zero weight W_{a,v} on Γ_a (a zero self-weight) makes
1/(d_a W_{a,v}) undefined: refused.

**Ledger** (notion: pairwise network DP against one curious, non-colluding agent). A neighbour v of a sees
x_a + Z_{a→v}; treating, per step, the one clipped gradient as what is unknown to v (the model it was added to as
known), that is a Gaussian mechanism of sensitivity η_t·2C and noise variance c_{a→v}·η_t²ς_a²: Rényi
α·(2C)²/(2 c_{a→v} ς_a²) per step, added over the T steps (adaptive composition) and converted to (ε, δ) with
dp_accounting's RDP conversion (the ``rdp`` accountant). This per-step bound is **our derivation** (the paper's
Theorem 5.9 could not be read here); agent a's ε is that of its worst neighbour (smallest c_{a→v}), the ledger's ε the
worst pair. Against an eavesdropper on every link it gives **no DP at all**: Σ_{v∈Γ_a} W_{a,v}(x_a + Z_{a→v}) = x_a.
The eavesdropper sees the d_a − 1 copies on the wire, not the kept one x_a + Z_{a→a}; but under the very assumption
of the per-step analysis (the model is known to the observer) it knows a's next model x_a' and every value a received,
so it knows W_{a,a}(x_a + Z_{a→a}) = x_a' − Σ received, and the weighted sum of all d_a copies gives x_a exactly. That
statement is "none", never a number. ``epsilon`` calibrates each ς_a so
that a's worst neighbour meets (ε, δ) (never overshooting); ``sigma`` gives ς directly (the same for every agent).

**Directed networks** (issue 46; algorithm ``sgp`` on a column-stochastic push-sum A): the same construction over
each sender's closed out-neighbourhood Γ_a = out(a) ∪ {a}, weighted by what the receivers apply, A[v, a] (the plan
reads W_{a,v} = Aᵀ[a, v]): Σ_{v∈Γ_a} A[v, a] Z_{a→v} = 0, so Σ_v (A(x + Z))_v = Σ_a x_a — the network sum of SGP's
numerators, hence the running average its de-biased iterates track, is untouched. Push-sum splits a's mass
uniformly (A[v, a] = 1/d_a), so Z = Y − the mean of the Y over Γ_a and c_{a→v} = (d_a − 1)/d_a (Remark 3.4's
uniform case) on every out-edge. The push-sum weights w go unperturbed (they depend on the graph only). The ledger's
per-step bound is the same derivation (SGP's numerator changes by η times one clipped gradient).
"""

from __future__ import annotations

import math
from typing import Annotated, Callable

import numpy as np
import torch

from privdl.comm.base import PUSH_SUM_WEIGHT_TAG
from privdl.comm.frame import frame_of
from privdl.errors import ValidationError
from privdl.keys import Keys
from privdl.mechanisms.base import MECHANISMS, Access, GradientMechanism, Sensitivity, clip_rows
from privdl.mechanisms.message import MessageMechanism
from privdl.mechanisms.peers import AveragesTheModel, OncePerRound, check_unit, refuse_sliced, symmetric_w
from privdl.network.network import Network
from privdl.privacy.agent_accountant import check_budget
from privdl.privacy.events import GaussianEvent, ObfuscationEvent
from privdl.privacy.example_accountant import calibrate_noise_multiplier
from privdl.privacy.ledger import Ledger
from privdl.registry import one_of

NOTION = "pairwise network DP against one curious non-colluding neighbour"
EAVESDROPPER = "against an eavesdropper on every link"
EAVESDROPPER_REASON = ("Zip-DL's noise is zero-sum per sender, Σ_{v∈Γ_a} W_{a,v}(x_a + Z_{a→v}) = x_a: an eavesdropper "
                       "on every link sees the d_a − 1 sent copies and, with the model the agent goes on to send "
                       "(known to the observer in the per-step analysis), its kept copy x_a + Z_{a→a} = (x_a' − Σ "
                       "received)/W_{a,a}, hence x_a exactly; no DP guarantee against it")


def zip_dl_plan(w: np.ndarray, src: np.ndarray, dst: np.ndarray) -> dict[str, np.ndarray]:
    """Per edge (src → dst, the sender's weight W_{src,dst}) and per sender: the factors 1/(d_a W_{a,v}) of the
    zero-sum correction and Lemma 3.3's variance coefficients c_{a→v}. Refuses a zero weight on Γ_a."""
    n = w.shape[0]
    w_edge = w[src, dst]
    w_self = np.diag(w).copy()
    d = np.bincount(src, minlength=n).astype(np.float64) + 1.0
    zero_edge = np.nonzero(w_edge == 0)[0]
    if zero_edge.size:
        e = int(zero_edge[0])
        raise ValidationError(f"zip_dl needs W_{{a,v}} > 0 on every edge of the closed neighbourhood Γ_a (the "
                              f"correction 1/(d_a W_{{a,v}})); W[{int(src[e])}, {int(dst[e])}] = 0")
    zero_self = np.nonzero(w_self <= 0)[0]
    if zero_self.size:
        a = int(zero_self[0])
        raise ValidationError(f"zip_dl needs W_{{a,a}} > 0 (agent a is in its own closed neighbourhood Γ_a and the "
                              f"correction divides by d_a W_{{a,a}}); agent {a} has W[{a}, {a}] = {w_self[a]:g}: use "
                              f"a mixing rule with positive self-weights (metropolis_hastings, or lazy = true)")
    sumsq = w_self**2 + np.bincount(src, weights=w_edge**2, minlength=n)
    base = (d - 1.0) ** 2 / d**2
    c_edge = base[src] + (sumsq[src] - w_edge**2) / (d[src] * w_edge) ** 2
    c_self = base + (sumsq - w_self**2) / (d * w_self) ** 2
    return {"w_edge": w_edge, "w_self": w_self, "d": d, "inv_edge": 1.0 / (d[src] * w_edge),
            "inv_self": 1.0 / (d * w_self), "c_edge": c_edge, "c_self": c_self}


def zip_dl_noise(plan: dict[str, np.ndarray], src: torch.Tensor, y_edge: torch.Tensor,
                 y_self: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Z per edge, Z per sender's own copy) from the draws Y (float64): Z = Y − M_a/(d_a W_{a,v}) with
    M_a = Σ_{j∈Γ_a} W_{a,j} Y_{a→j}."""
    w_edge = torch.as_tensor(plan["w_edge"], dtype=y_edge.dtype)
    w_self = torch.as_tensor(plan["w_self"], dtype=y_self.dtype)
    m = (w_self[:, None] * y_self).index_add_(0, src, w_edge[:, None] * y_edge)
    z_edge = y_edge - torch.as_tensor(plan["inv_edge"], dtype=y_edge.dtype)[:, None] * m[src]
    z_self = y_self - torch.as_tensor(plan["inv_self"], dtype=y_self.dtype)[:, None] * m
    return z_edge, z_self


class ZipDLEncoding(MessageMechanism):
    """The per-edge encoding of one run: draws Y keyed by (sender, receiver, round), scaled by s_a = η_t ς_a."""

    name = "zip_dl"

    def __init__(self, plan: dict[str, np.ndarray], sigma: np.ndarray, keys: Keys,
                 eta: Callable[[int], object]) -> None:
        self.plan, self.keys, self.eta = plan, keys, eta
        self.sigma = torch.as_tensor(sigma, dtype=torch.float64)
        self._held: tuple | None = None  # (edges, agents, the plan's entries of those edges and agents)

    def encode(self, x: torch.Tensor, *, tag: str, t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise ValidationError("zip_dl sends a different value on every edge; it has no broadcast encoding")

    def _subplan(self, edges: torch.Tensor, agents: torch.Tensor) -> dict[str, np.ndarray]:
        """The plan's entries of edges ``edges`` (per-edge arrays) and of agents ``agents`` (per-sender arrays),
        made once per (edges, agents) pair."""
        held = self._held
        if held is not None and held[0] is edges and held[1] is agents:
            return held[2]
        e, a = edges.cpu().numpy(), agents.cpu().numpy()
        plan = {k: v[e] if k in ("w_edge", "inv_edge", "c_edge") else v[a] for k, v in self.plan.items()}
        self._held = (edges, agents, plan)
        return plan

    def noise(self, src: torch.Tensor, dst: torch.Tensor, t: int, dim: int, *, edges: torch.Tensor | None = None,
              agents: torch.Tensor | None = None, sender: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Z per edge (E, dim), Z of every sender's own copy (rows, dim)) at round t, float64; ``src``, ``dst``:
        the edges' global senders and receivers.

        An engine that holds some agents (the held frame, :class:`privdl.comm.frame.Frame`) gives ``agents``
        (its agents, global rows), ``edges`` (the ids of the edges they send along, whose ``src``/``dst`` these
        are: every edge out of each of its agents, so each sender's zero-sum correction is complete) and ``sender``
        (each edge's sender's local row): only its agents' draws, from their own keys, each the whole network's
        entry bit for bit (keyed draws are row-independent, and each sender's correction adds its own edges' terms
        in the same order, elementwise). None: every row and edge."""
        if (edges is None) != (agents is None):
            raise ValidationError("zip_dl: a held engine's noise needs both its agents and the edges they send along")
        plan = self.plan if agents is None else self._subplan(edges, agents)
        s_np, d_np = src.cpu().numpy(), dst.cpu().numpy()
        y_edge = self.keys.normal("zip_dl", t, dim, rows=s_np, requesters=d_np)
        if agents is None:
            y_self, sigma = self.keys.normal("zip_dl", t, dim), self.sigma
        else:
            mine = agents.cpu()
            y_self, sigma = self.keys.normal("zip_dl", t, dim, rows=mine.numpy()), self.sigma[mine]
        eta = torch.as_tensor(self.eta(t), dtype=torch.float64).reshape(-1).cpu()
        scale = (eta * sigma) if eta.numel() in (1, sigma.numel()) else None
        if scale is None:
            raise ValidationError(f"zip_dl: a step size with {eta.numel()} entries for {sigma.numel()} rows")
        rows = (src if sender is None else sender).cpu().long()
        z_edge, z_self = zip_dl_noise(plan, rows, y_edge, y_self)
        return z_edge * scale[rows][:, None], z_self * scale[:, None]


class ZipDLComm(OncePerRound):
    """``mix`` as Algorithm 1: every edge carries x_src + Z_{src→dst} (``send``, seen by the wire's observers),
    every row combines its own noised copy and what it received with its own weights. In the held frame
    (:func:`privdl.comm.frame.frame_of`: an engine's rows are its agents) each engine draws its agents' noise on
    the edges they send along and sends those edges' values; each of its agents combines what it receives."""

    def average_step(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        e, frame = self.inner.edges, frame_of(self.inner)
        flat = x.reshape(x.shape[0], -1)
        z_edge, z_self = self.mechanism.noise(  # type: ignore[attr-defined]
            frame.on_sent(e.src), frame.on_sent(e.dst), self.inner.t, flat.shape[1], edges=frame.sent,
            agents=frame.agents, sender=None if frame.agents is None else frame.sent_from)
        z_edge = z_edge.to(dtype=flat.dtype, device=flat.device)
        z_self = z_self.to(dtype=flat.dtype, device=flat.device)
        received = self.inner.send(flat[frame.sent_from.to(flat.device)] + z_edge, tag=tag)
        own = frame.rows(e.self_weight).to(dtype=flat.dtype, device=flat.device)[:, None] * (flat + z_self)
        return (own + self.inner.reduce(received, weight="mixing")).reshape(x.shape)


class PushSumZipDLComm(ZipDLComm):
    """Zip-DL on a directed network under SGP: the numerator's ``mix`` carries the zero-sum noise over the sender's
    out-edges (once a round, as :class:`ZipDLComm`); the push-sum weight's ``mix`` (tag
    :data:`privdl.comm.base.PUSH_SUM_WEIGHT_TAG`) carries no data and goes through unperturbed — noise on w would not
    hide anything and could make it negative."""

    def mix(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        if tag == PUSH_SUM_WEIGHT_TAG:
            return self.inner.mix(x, tag=tag)
        return super().mix(x, tag=tag)


@MECHANISMS.register("zip_dl")
class ZipDL(AveragesTheModel, GradientMechanism):
    """Zip-DL: clip each agent's gradient to C (agent level); the averaging adds per-sender zero-sum noise
    (module doc). Give ``epsilon`` (calibrated per agent to its worst neighbour) or ``sigma`` (ς: the std of each
    draw Y per unit step size)."""

    name = "zip_dl"
    #: on a directed network (push-sum A, algorithm ``sgp``): zero-sum noise over each sender's out-edges, weighted by
    #: the receivers' weights A[v, a] (module doc, "Directed networks")
    directed_ok = True
    wraps_comm = True
    #: it runs in the held frame (:func:`privdl.simulator.sliced.held_frame_refusal`): each engine draws its agents'
    #: noise on the edges they send along and sends those edges' values (:class:`ZipDLComm`)
    held_reason = None
    accountant_name = "rdp"

    def __init__(self, *, steps: int | torch.Tensor, network: Network, clip: float = 1.0,
                 epsilon: float | None = None, delta: float = 1e-5, sigma: float | None = None,
                 clipping: Annotated[str, one_of("batch", "per_example")] = "batch") -> None:
        super().__init__(steps=steps, n=network.n)
        check_unit(self.name, clipping)
        check_budget(clip=clip, delta=delta)
        if (epsilon is None) == (sigma is None):
            raise ValidationError("zip_dl needs exactly one of epsilon (calibrate) or sigma (the noise level ς)")
        self.clip, self.delta, self.network_ = float(clip), float(delta), network
        self.directed = bool(getattr(network, "directed", False))
        if self.directed:  # sender a's weight on v is the receiver's A[v, a]: the plan reads W_{a,v} = Aᵀ[a, v]
            w = np.ascontiguousarray(np.asarray(network.W, dtype=np.float64).T)
            self.needs_transmission = ("push_sum_numerator", "push_sum_weight")
        else:
            w = symmetric_w(network, self.name)
        e = network.edges
        self.src, self.dst = e.src.cpu().numpy(), e.dst.cpu().numpy()
        self.plan = zip_dl_plan(w, self.src, self.dst)
        n = network.n
        # a's worst neighbour: the smallest per-message variance coefficient among its outgoing edges
        self.c_worst = np.full(n, np.inf)
        np.minimum.at(self.c_worst, self.src, self.plan["c_edge"])
        self.worst_steps = max(int(self.steps.max()) if self.steps.numel() else 0, 1)
        if epsilon is not None:
            check_budget(epsilon=epsilon)
            self.noise_multiplier = calibrate_noise_multiplier(epsilon=float(epsilon), sample_rate=1.0,
                                                               steps=self.worst_steps, delta=self.delta)
            c = np.where(np.isfinite(self.c_worst), self.c_worst, 1.0)
            self.sigma = 2.0 * self.clip * self.noise_multiplier / np.sqrt(c) * (1 + 1e-12)
            self.target_epsilon = float(epsilon)
        else:
            if not (isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and sigma > 0
                    and math.isfinite(sigma)):
                raise ValidationError(f"sigma must be a finite number > 0, got {sigma!r}")
            self.sigma = np.full(n, float(sigma))
            self.noise_multiplier = None
            self.target_epsilon = None
        with np.errstate(all="ignore"):
            prec = 1.0 / (self.plan["c_edge"] * self.sigma[self.src] ** 2)
            msg = self.plan["c_edge"] * self.sigma[self.src] ** 2
        if prec.size and not (np.all(np.isfinite(prec)) and np.all(prec > 0) and np.all(np.isfinite(msg))):
            raise ValidationError(f"zip_dl: sigma = {float(self.sigma.max()):g} gives a per-message variance "
                                  f"c·ς² that double precision cannot hold (0 or ∞); use a noise level between "
                                  f"about 1e-150 and 1e150")

    # ---- the gradient side: clip only -----------------------------------------------------------------------------
    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        return clip_rows(value, self.clip)

    def sensitivity_after(self, before: Sensitivity | None) -> Sensitivity | None:
        return Sensitivity(2 * self.clip, "agent")

    def wrap_comm(self, comm, *, keys: Keys, eta, algorithm: str):
        refuse_sliced(comm, self.name)
        if comm.rows != self.network_.n * comm.groups or len(comm.edges) != len(self.src) * comm.groups:
            raise ValidationError(f"zip_dl was built for a network of {self.network_.n} agents; the comm differs")
        plan, sigma = self.plan, self.sigma
        if comm.groups > 1:  # independent copies (an audit): the same plan on every copy
            plan = {k: np.tile(v, comm.groups) for k, v in plan.items()}
            sigma = np.tile(sigma, comm.groups)
        encoding = ZipDLEncoding(plan, sigma, keys, eta)
        if self.directed:
            return PushSumZipDLComm(comm, encoding, owner=self.name)
        return ZipDLComm(comm, encoding, owner=self.name)

    # ---- privacy ------------------------------------------------------------------------------------------------
    def pair_precisions(self) -> np.ndarray:
        """Per edge a → v: the precision 1/(c_{a→v} ς_a²) of what v sees, in gradient units (per step)."""
        return 1.0 / (self.plan["c_edge"] * self.sigma[self.src] ** 2)

    def ledger(self, accesses: torch.Tensor | None = None) -> Ledger:
        counts = (self.accesses() if accesses is None else accesses).tolist()
        n = self.network_.n
        events = []
        for i, c in enumerate(counts):
            a = i % n
            if not c or not math.isfinite(self.c_worst[a]):
                events.append([])
                continue
            m = 1.0 / (self.c_worst[a] * self.sigma[a] ** 2)
            events.append([GaussianEvent(precision=float(m), sensitivity=2 * self.clip, count=int(c))])
        eaves = Ledger.build(unit="agent", mechanism=self.name, accountant="none", delta=0.0,
                             events=[[ObfuscationEvent(self.name, EAVESDROPPER_REASON, int(c))] if c else []
                                     for c in counts],
                             note=EAVESDROPPER_REASON, notion=EAVESDROPPER)
        note = ("Zip-DL (Biswas et al., Algorithm 1, weighted zero-sum noise, Lemma 3.3's per-message variance); "
                "pairwise network DP: agent a's ε is that of its worst neighbour v (smallest c_{a→v}), per step a "
                "Gaussian mechanism of sensitivity η·2C and variance c_{a→v}·η²ς_a² (our derivation, treating the "
                "model the clipped gradient is added to as known to v), composed over the steps, RDP → (ε, δ) "
                "(dp_accounting); against an eavesdropper on every link: none (the copies' weighted sum is x_a)")
        return Ledger.build(unit="agent", mechanism=self.name, accountant="rdp", delta=self.delta, events=events,
                            noise=self.noise_facts(), note=note, target_epsilon=self.target_epsilon,
                            beside=[eaves], notion=NOTION)

    def noise_facts(self) -> dict:
        c = self.plan["c_edge"]
        prec = self.pair_precisions()
        k = int(np.argmax(prec)) if prec.size else None
        out = {"clip": self.clip, "sensitivity": 2 * self.clip, "sigma_min": float(self.sigma.min()),
               "sigma_max": float(self.sigma.max()), "noise_scales_with": "step size (s_a = eta_t * sigma_a)",
               "variance_coefficient_min": float(c.min()) if c.size else None,
               "variance_coefficient_max": float(c.max()) if c.size else None,
               "construction": "weighted zero-sum (paper); the authors' fork subtracts the unweighted mean"}
        if k is not None:
            out["worst_pair"] = {"sender": int(self.src[k]), "receiver": int(self.dst[k]),
                                 "variance_coefficient": float(c[k]),
                                 "message_std_per_unit_step": float(math.sqrt(c[k]) * self.sigma[self.src[k]]),
                                 "noise_multiplier": float(math.sqrt(c[k]) * self.sigma[self.src[k]]
                                                           / (2 * self.clip))}
        if self.noise_multiplier is not None:
            out["calibrated_noise_multiplier"] = self.noise_multiplier
        return out

    def note(self) -> str:
        return "zip_dl: clip to C; per-sender zero-sum Gaussian noise on every outgoing edge"

    def describe(self) -> dict[str, object]:
        return {"name": self.name, **{k: v for k, v in self.noise_facts().items() if not isinstance(v, dict)}}


__all__ = ["PushSumZipDLComm", "ZipDL", "ZipDLComm", "ZipDLEncoding", "zip_dl_noise", "zip_dl_plan"]
