"""CGA, cross-gradient aggregation (Esfandiari et al., ICML 2021; BASELINES.md §6.2): DPDL's non-private predecessor.

Per round, for every agent j (π = the mixing matrix W):

* j's model goes to every neighbour l (``pull``, tag ``model``); l evaluates ∇F_l(x^j) on **its own** mini-batch and
  sends it back (``push``, tag ``cross_gradient``) — the real flow, model out and gradient back (the authors' code
  all-gathers raw batches instead; same maths, another data flow); j computes its self-gradient g^{jj}.
* Projection, per parameter tensor (GEM style): G has rows π_jl ∇F_l(x^j) for the neighbours l ≠ j (all-zero rows
  dropped), g = π_jj g^{jj}; the dual QP min_v ½ vᵀ(GGᵀ + εI)v + gᵀGᵀv s.t. v ≥ m (margin m = 0.5, ε = 1e-12, solved
  with ``quadprog`` as the authors do) gives ĝ = Gᵀv + g. If the solver fails, the agent's previous v for that tensor
  is reused (the authors' choice; the margin vector in the first round).
* Consensus and Nesterov momentum (the authors' code): b ← β b + ĝ; x^j ← Σ_l π_jl x^l − η (ĝ + β b).

"Per parameter tensor" uses the task model's tensors; a task without a model (the quadratic) is one tensor. The QP
is solved agent by agent and tensor by tensor in Python (deg ≤ a few variables each): CGA is a non-private baseline,
not a hot path. Accesses per owner l in T rounds: T·deg(l) cross-gradients + T self-gradients (``mechanism = "none"``:
CGA has no DP guarantee).
"""

from __future__ import annotations

from typing import Annotated, NamedTuple

import numpy as np
import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, cross_gradients, frame_of
from privdl.errors import ValidationError
from privdl.network.edges import Edges
from privdl.registry import one_of

QP_EPSILON = 1e-12


class CGAState(NamedTuple):
    x: torch.Tensor
    momentum: torch.Tensor
    duals: torch.Tensor  # (rows, tensors, max degree): the last QP solution v per agent and tensor (NaN-padded)


def project(g: np.ndarray, G: np.ndarray, *, margin: float, previous: np.ndarray | None = None) -> tuple:
    """ĝ = Gᵀv + g with v = argmin ½ vᵀ(GGᵀ + εI)v + gᵀGᵀv s.t. v ≥ margin (rows of G: the neighbours' weighted
    cross-gradients; all-zero rows must be dropped by the caller). Returns (ĝ, v, solved)."""
    import quadprog

    k = G.shape[0]
    if k == 0:
        return g, np.zeros(0), True
    P = G @ G.T + QP_EPSILON * np.eye(k)
    q = -(G @ g)  # quadprog minimises ½ vᵀPv − qᵀv subject to Cᵀv ≥ b
    try:
        v = quadprog.solve_qp(P, q, np.eye(k), np.full(k, margin))[0]
        solved = True
    except ValueError:
        usable = previous is not None and previous.shape == (k,) and bool(np.isfinite(previous).all())
        v = previous if usable else np.full(k, margin)
        solved = False
    return G.T @ v + g, v, solved


@ALGORITHMS.register("cga")
def cga(*, beta: float = 0.9, margin: float = 0.5,
        per_tensor: Annotated[str, one_of("model", "whole")] = "model") -> Algorithm:
    """CGA (non-private). ``per_tensor = "whole"`` projects the whole parameter vector at once."""
    if not (isinstance(beta, (int, float)) and 0 <= beta < 1):
        raise ValidationError(f"cga beta (momentum) must be in [0, 1), got {beta!r}")
    if not (isinstance(margin, (int, float)) and margin >= 0):
        raise ValidationError(f"cga margin must be >= 0, got {margin!r}")
    if per_tensor not in ("model", "whole"):
        raise ValidationError(f"cga per_tensor must be 'model' or 'whole', got {per_tensor!r}")

    def tensors(ctx: StepContext, dim: int) -> list[slice]:
        model = getattr(getattr(ctx.gradient, "task", None), "model", None)
        if per_tensor == "whole" or model is None:
            return [slice(0, dim)]
        out, start = [], 0
        for shape in model.shapes:
            size = int(np.prod(shape))
            out.append(slice(start, start + size))
            start += size
        return out

    def init(x0: torch.Tensor, ctx: StepContext) -> CGAState:
        lonely = (ctx.comm.edges.degree == 0).nonzero(as_tuple=True)[0]
        if lonely.numel():
            raise ValidationError(f"cga needs a neighbour for every agent; agent {int(lonely[0])} has none")
        width = int(ctx.comm.edges.degree.max())
        duals = torch.full((x0.shape[0], len(tensors(ctx, x0.shape[1])), width), float(margin), dtype=torch.float64)
        return CGAState(x0.clone(), torch.zeros_like(x0), duals)

    def step(s: CGAState, ctx: StepContext) -> CGAState:
        comm = ctx.comm
        e, frame = comm.edges, frame_of(comm)  # per-edge rows: the edges the engine's agents receive
        back = cross_gradients(ctx, s.x)
        back = back.reshape(back.shape[0], -1)  # at dst(e): src(e)'s data at x_dst
        own = ctx.gradient(s.x, tag="self_gradient").reshape(s.x.shape[0], -1)
        weighted = (back * frame.on_received(e.weight).to(back)[:, None]).cpu().double().numpy()
        own_w = (own * frame.rows(e.self_weight).to(own)[:, None]).cpu().double().numpy()
        dst = frame.received_by.cpu().numpy()  # each received edge's receiver: a row of the engine's tensors
        out = np.empty_like(own_w)
        duals = s.duals.clone()
        blocks = tensors(ctx, own_w.shape[1])
        for j in range(own_w.shape[0]):
            rows = weighted[dst == j]
            for b, sl in enumerate(blocks):
                G = rows[:, sl]
                G = G[np.abs(G).sum(axis=1) > 0]
                last = duals[j, b, :G.shape[0]].numpy()
                out[j, sl], v, _ = project(own_w[j, sl], G, margin=float(margin), previous=last)
                duals[j, b] = float("nan")
                duals[j, b, :len(v)] = torch.as_tensor(v)
        g = torch.as_tensor(out, dtype=s.x.dtype, device=s.x.device).reshape(s.x.shape)
        momentum = beta * s.momentum + g
        return CGAState(comm.mix(s.x, tag="x") - ctx.eta * (g + beta * momentum), momentum, duals)

    def accesses(iterations: int, edges: Edges) -> torch.Tensor:
        return edges.degree.to(torch.int64) * iterations + iterations

    return Algorithm("cga", init, step, lambda s: s.x, accesses,
                     facts={"beta": float(beta), "margin": float(margin), "per_tensor": per_tensor}, stackable=False,
                     cross=True, transmits={"model": "other", "cross_gradient": "other", "x": "other"},
                     requires=("neighbour_every_round: its cross-gradients weigh what each neighbour returns, so "
                               "every agent needs a neighbour in every round",), held_reason=None)


__all__ = ["CGAState", "cga", "project"]
