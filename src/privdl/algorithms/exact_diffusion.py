"""Exact diffusion (EDSG; seed 002 eq. (3), BASELINES.md §5.2; Yuan, Ying, Zhao & Sayed 2019):

    ψ_k(n) = w_k(n−1) − γ ∇̂J_k(w_k(n−1))            (adapt)
    φ_k(n) = ψ_k(n) + w_k(n−1) − ψ_k(n−1)            (correct)
    w_k(n) = Σ_ℓ a_ℓk φ_ℓ(n)                          (combine; one ``mix``, tag ``phi``)

with ψ_k(0) = w_k(0). The correction removes D-SGD's O(γ) bias under heterogeneous data (with exact gradients it
converges to w* itself). It needs a symmetric, doubly stochastic and **positive-definite** A — the lazy rule
(I + A)/2 gives one (``[network] lazy = true``); a run with any other A is refused when it is built.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext
from privdl.comm.base import LINEAR_MIXING


class ExactDiffusionState(NamedTuple):
    w: torch.Tensor
    psi: torch.Tensor  # ψ(n−1)


def exact_diffusion_parts() -> Algorithm:
    def init(x0: torch.Tensor, ctx: StepContext) -> ExactDiffusionState:
        return ExactDiffusionState(x0.clone(), x0.clone())

    def step(s: ExactDiffusionState, ctx: StepContext) -> ExactDiffusionState:
        psi = s.w - ctx.eta * ctx.gradient(s.w)
        phi = psi + s.w - s.psi
        return ExactDiffusionState(ctx.comm.mix(phi, tag="phi"), psi)

    #: (privdl.network.dynamics.fixed_mixing_reason) why a time-varying W is refused
    FIXED = ("fixed_mixing: exact diffusion's correction φ = ψ + w − ψ_prev cancels its bias only at the fixed point "
             "of one combination matrix A, and A must be positive definite; W(t) changes that fixed point every round "
             "(and a matching's W(t) is singular)")
    return Algorithm("exact_diffusion", init, step, lambda s: s.w, requires=("positive_definite", FIXED),
                     combines=LINEAR_MIXING, transmits={"phi": "exact_diffusion"}, held_reason=None)


@ALGORITHMS.register("exact_diffusion")
def exact_diffusion() -> Algorithm:
    return exact_diffusion_parts()
