"""DPDL (seed 003; SPEC §6; BASELINES.md §6.1): noisy cross-gradients calibrated by cosine similarity, a momentum
step, and gossip of both models and velocities.

Per round t, for every agent i and every neighbour j ∈ N(i) (j ≠ i):

* i's model goes to j (``pull``, tag ``model``); j evaluates **its own data** at x_i — per-example gradients of a lot
  of j's examples, each clipped to C, summed, plus N(0, σ_j²C²I), divided by the (expected) lot size B — and sends
  the result g̈^{ij} back to i (``push``, tag ``cross_gradient``). This is ``ctx.gradient(models, owners=j,
  requesters=i)``: one noisy access to j's data, keyed by (access, owner j, requester i); all E edges of a round are
  one batched call over the edge axis. Nobody ever computes a gradient on another agent's data (CGA's published code
  all-gathers raw batches; this does not).
* i's clipped self-gradient ĝ^{ii} (the same clipped lot mean on i's own data at x_i). In seed 003's equations it is
  **not noised**, yet it enters x^i, which is sent every round: the published form (``self_noise = false``) makes an
  un-noised access per round, declared in ``Algorithm.unprotected`` so the ledger names it and states no overall ε.
  ``self_noise = true`` noises it like a cross-gradient (one more noisy access per round, accounted).
* calibration c^{ij} = 1/(1 + exp(S(g̈^{ij}, ĝ^{ii}))), S the cosine similarity — in (1/(1+e), 1/(1+e⁻¹)), smaller
  for aligned contributions; ``calibration = false`` fixes c^{ij} = ½ (the ablation);
* g̃^{ij} = g̈^{ij}/(√w_ij · N) + α w_ij c^{ij} ĝ^{ii} (``calibration = "formula"``, the default, = true: the seed's
  equation, where c^{ij} weights only the α-term), g̃^i = Σ_{j ∈ N(i)} g̃^{ij};
* ``calibration = "prose"``: the seed's prose instead ("each received cross-gradient is weighted by a sigmoid of its
  cosine similarity to the agent's own self-gradient"), g̃^{ij} = c^{ij} g̈^{ij}/(√w_ij · N) + α w_ij ĝ^{ii} — the
  weight moves to the received cross-gradient and the α-term is left unweighted; ``"prose_half"`` is that form with
  c^{ij} = ½ (the prose reading's ablation);
* ṽ^i = β v^i + g̃^i, x̃^i = x^i − η ṽ^i; then v^i = Σ_j w_ij ṽ^j (tag ``v``) and x^i = Σ_j w_ij x̃^j (tag ``x``).

Choices where seed 003 is silent (named here and parameters where they can vary): N(i) excludes i in the sums of
g̃^i (the self term enters through α); ĝ^{ii} is the mechanism's clipped lot mean (``dp_sgd``: Σ clip / B over a
Poisson lot of expected size B; ``none``: the plain mini-batch mean); v⁰ = 0; α = 1, β = 0.9 by default (seed 003
gives no values). Accesses per owner j in T rounds: T·deg(j) cross-gradients (+ T self-gradients with self_noise).

With σ = 0, C = ∞ (``mechanism = "none"``), α = 0 and β = 0 one round is the closed form
x^i ← Σ_j w_ij (x^j − (η/N) Σ_{k ∈ N(j)} ∇f_k(x^j)/√w_jk).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, cross_gradients, frame_of
from privdl.errors import ValidationError
from privdl.network.edges import Edges

#: The readings of the calibration: the seed's equation (c^{ij} on the α-term), its prose (c^{ij} on the received
#: cross-gradient), and the ablations (c^{ij} = ½, in the equation's form and in the prose's: the latter separates
#: what the cosine weighting does from the halving of the received terms that comes with it).
CALIBRATIONS = {True: "formula", "formula": "formula", "prose": "prose", "prose_half": "prose_half", False: "off",
                "off": "off"}
UNPROTECTED_REASON = ("seed 003's published form: the clipped self-gradient ĝ^{ii} (one per round) enters x^i without "
                      "noise, and x^i is sent every round")


class DPDLState(NamedTuple):
    x: torch.Tensor
    v: torch.Tensor  # velocities


def calibration_weights(received: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """c = 1/(1 + exp(S(received, own))) row by row, S the cosine similarity (0 for a zero vector)."""
    cos = torch.nn.functional.cosine_similarity(received, own, dim=1, eps=1e-30)
    return torch.sigmoid(-cos)


@ALGORITHMS.register("dpdl")
def dpdl(*, alpha: float = 1.0, beta: float = 0.9, self_noise: bool = False,
         calibration: bool | str = "formula") -> Algorithm:
    """DPDL (seed 003). ``self_noise``: also noise the self-gradient (fully accounted); ``calibration``: "formula"
    (= true, the default: c^{ij} weights the α-term, as the seed's equation), "prose" (c^{ij} weights the received
    cross-gradient, as the seed's text), or false (c^{ij} = ½ in the formula: the ablation "DPDL without
    calibration"), or "prose_half" (the prose's form with c^{ij} = ½: its ablation)."""
    if not (isinstance(alpha, (int, float)) and alpha >= 0):
        raise ValidationError(f"dpdl alpha must be >= 0, got {alpha!r}")
    if not (isinstance(beta, (int, float)) and 0 <= beta < 1):
        raise ValidationError(f"dpdl beta (momentum) must be in [0, 1), got {beta!r}")
    alpha, beta = float(alpha), float(beta)
    mode = CALIBRATIONS.get(calibration) if isinstance(calibration, (bool, str)) else None
    if mode is None:
        raise ValidationError(f"dpdl calibration must be \"formula\" (or true), \"prose\", \"prose_half\" or false "
                              f"(\"off\"), "
                              f"got {calibration!r}")

    def init(x0: torch.Tensor, ctx: StepContext) -> DPDLState:
        e = ctx.comm.edges
        lonely = (e.degree == 0).nonzero(as_tuple=True)[0]
        if lonely.numel():
            raise ValidationError(f"dpdl needs a neighbour for every agent (cross-gradients); agent "
                                  f"{int(lonely[0])} has none")
        if bool((e.weight <= 0).any()):
            k = int((e.weight <= 0).nonzero(as_tuple=True)[0][0])
            raise ValidationError(f"dpdl divides by √w_ij: edge {int(e.src[k])} → {int(e.dst[k])} has weight "
                                  f"{float(e.weight[k])}")
        return DPDLState(x0.clone(), torch.zeros_like(x0))

    def step(s: DPDLState, ctx: StepContext) -> DPDLState:
        comm = ctx.comm
        e, frame = comm.edges, frame_of(comm)  # per-edge rows: the edges the engine's agents receive
        # each received edge's receiver, a row of the engine's tensors (index_add_ is slower with int32 indices)
        dst = frame.received_by.to(device=s.x.device, dtype=torch.int64)
        back = cross_gradients(ctx, s.x)  # at dst(e) = i: src(e)'s data at x_i, noisy
        own = ctx.gradient(s.x, tag="self_gradient", protect=self_noise)  # ĝ^{ii}
        flat = back.reshape(back.shape[0], -1)
        own_e = own.reshape(own.shape[0], -1).index_select(0, dst)
        c = (calibration_weights(flat, own_e) if mode in ("formula", "prose")
             else torch.full((flat.shape[0],), 0.5, dtype=flat.dtype, device=flat.device))
        w = frame.on_received(e.weight).to(dtype=flat.dtype, device=flat.device)
        agents = comm.n  # N: the network's agents
        if mode in ("prose", "prose_half"):  # c^{ij} weights the received cross-gradient, not the α-term
            terms = (c / (w.sqrt() * agents))[:, None] * flat + (alpha * w)[:, None] * own_e
        else:
            terms = flat / (w.sqrt()[:, None] * agents) + (alpha * w * c)[:, None] * own_e
        g = torch.zeros_like(own.reshape(own.shape[0], -1)).index_add_(0, dst, terms).reshape(s.x.shape)
        v_new = beta * s.v + g
        x_new = s.x - ctx.eta * v_new
        return DPDLState(comm.mix(x_new, tag="x"), comm.mix(v_new, tag="v"))

    def accesses(iterations: int, edges: Edges) -> torch.Tensor:
        return edges.degree.to(torch.int64) * iterations + (iterations if self_noise else 0)

    def unprotected(iterations: int, edges: Edges) -> torch.Tensor:
        return torch.full((edges.rows,), iterations, dtype=torch.int64)

    facts = {"alpha": alpha, "beta": beta, "self_noise": bool(self_noise), "calibration": mode}
    return Algorithm("dpdl", init, step, lambda s: s.x, accesses, facts=facts,
                     unprotected=None if self_noise else (unprotected, UNPROTECTED_REASON), cross=True,
                     transmits={"model": "other", "cross_gradient": "other", "x": "other", "v": "other"},
                     requires=("neighbour_every_round: its cross-gradients weigh what each neighbour returns, so "
                               "every agent needs a neighbour in every round",), held_reason=None)


__all__ = ["CALIBRATIONS", "DPDLState", "UNPROTECTED_REASON", "calibration_weights", "dpdl"]
