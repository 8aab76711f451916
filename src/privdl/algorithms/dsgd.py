"""D-SGD in its two orders.

- ``form = "atc"`` (adapt then combine; seeds 000/001, Algorithm 1): x ← W (x − η_t (ĝ + v)).
- ``form = "cta"`` (combine then adapt; seed 004's DP-DSGD, SPEC §4): θ_i ← Σ_j w_ij θ_j − η_k G̃_i(θ_i); the
  gradient step may go through an optimizer (momentum) whose state persists across rounds.
- ``gossip = "authors"`` (with ``cta``): what seed 004's code runs instead — agents average their own and their
  neighbours' current models one after the other, in place (:meth:`privdl.comm.Comm.average_in_place`: weights
  1/(deg + 1), not doubly stochastic, not synchronous), then take the gradient step at the averaged model:
  θ_i ← θ̄_i − η_k G̃_i(θ̄_i). For comparison with the published numbers only; the guarantees of the synchronous,
  doubly stochastic form do not carry over.

With the "none" mechanism this is non-private D-SGD; with "gaussian_ldp"/"ldp", LDP D-SGD; with correlated-noise
mechanisms (DECOR, Whisper) CorN-DSGD; with "dp_sgd", DP-DSGD — all unchanged. One ``mix`` (tag ``x``) per round.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, GOSSIPS, HELD_AUTHORS, Algorithm, StepContext, check_gossip
from privdl.algorithms.optimizers import OptState, make_optimizer
from privdl.comm.base import LINEAR_MIXING
from privdl.errors import ValidationError
from privdl.registry import one_of


class DSGDState(NamedTuple):
    x: torch.Tensor


class DSGDCTAState(NamedTuple):
    x: torch.Tensor
    opt: OptState


@ALGORITHMS.register("dsgd")
def dsgd(*, form: Annotated[str, one_of("atc", "cta")] = "atc",
         optimizer: Annotated[Any, one_of("sgd", "adam")] = None,
         gossip: Annotated[str, one_of(*GOSSIPS)] = "synchronous") -> Algorithm:
    if form not in ("atc", "cta"):
        raise ValidationError(f"dsgd form must be 'atc' (adapt then combine) or 'cta' (combine then adapt), got {form!r}")
    check_gossip("dsgd", gossip)
    if gossip == "authors" and form != "cta":
        raise ValidationError("gossip = 'authors' (seed 004's code) is the combine-then-adapt form: set form = 'cta'")
    opt = make_optimizer(optimizer)
    if form == "atc":
        if opt.name != "sgd" or opt.momentum or opt.weight_decay:
            raise ValidationError("dsgd form 'atc' is plain SGD; use form = 'cta' for an optimizer")

        def step(s: DSGDState, ctx: StepContext) -> DSGDState:
            # (g * eta: Tensor.__rmul__ calls the same mul(g, eta) through one more dispatch; the same product)
            return DSGDState(ctx.comm.mix(s.x - ctx.gradient(s.x) * ctx.eta, tag="x"))

        return Algorithm("dsgd", lambda x0, ctx: DSGDState(x0.clone()), step, lambda s: s.x,
                         combines=LINEAR_MIXING, transmits={"x": "model"}, held_reason=None)

    def init(x0: torch.Tensor, ctx: StepContext) -> DSGDCTAState:
        return DSGDCTAState(x0.clone(), opt.init(x0))

    def step_cta(s: DSGDCTAState, ctx: StepContext) -> DSGDCTAState:
        u, opt_state = opt.update(s.opt, ctx.gradient(s.x), ctx.eta, s.x)
        return DSGDCTAState(ctx.comm.mix(s.x, tag="x") + u, opt_state)

    def step_authors(s: DSGDCTAState, ctx: StepContext) -> DSGDCTAState:
        # seed 004's code: in-place neighbour averaging agent by agent, then the gradient at the averaged model
        mixed = ctx.comm.average_in_place(s.x, tag="x")
        u, opt_state = opt.update(s.opt, ctx.gradient(mixed), ctx.eta, mixed)
        return DSGDCTAState(mixed + u, opt_state)

    # the gradient step follows the mix (or in-place averaging): what is sent is the model before it
    return Algorithm("dsgd", init, step_authors if gossip == "authors" else step_cta, lambda s: s.x,
                     transmits={"x": "other"}, held_reason=HELD_AUTHORS if gossip == "authors" else None)
