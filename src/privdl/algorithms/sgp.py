"""Stochastic gradient push (SGP; Assran, Loizou, Ballas & Rabbat 2019, "Stochastic Gradient Push for Distributed
Deep Learning", Algorithm 1 with one gossip step per iteration): D-SGD for **directed** graphs.

With a column-stochastic push-sum matrix A (:mod:`privdl.network.directed`: each agent splits its mass over its
out-neighbours and itself), every agent i holds a numerator x_i and a push-sum weight w_i (w initialised to 1) and
evaluates its gradient at the de-biased iterate z_i = x_i / w_i:

    x ← A (x − η g̃(z)),     w ← A w,     z = x / w

(two ``mix`` calls a round, tags ``x`` and ``w``). A preserves Σ_i x_i and Σ_i w_i = n, and on a strongly connected
digraph A^t → π 1ᵀ, so w → n π and z_i → (Σ_j x_j) / n: the agents agree on the running average, and with exact
gradients and a diminishing (or small constant) step size that average converges to the minimiser of the AVERAGE
loss (1/n) Σ f_i — whereas D-SGD with the same A (x ← A(x − η g)) does not (its fixed point is biased by π).
The model evaluated and reported is z. On an undirected network with a doubly stochastic W, w stays 1 and SGP is
D-SGD adapt then combine (an extra ``mix`` of the constant weight a round).

``sgp`` is ``directed_ok``; it combines linearly (every privatised gradient reaches the models only through the
mixing of x), so per-agent noise (``ldp``, ``gaussian_ldp``, ``dp_sgd``) applies unchanged, Whisper's R solves
problem (P) for A, and Zip-DL adds its zero-sum noise to the numerator's messages over the out-edges.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext
from privdl.comm.base import LINEAR_MIXING, PUSH_SUM_WEIGHT_TAG


#: the tag of the push-sum weight's ``mix``: it carries no data (w_t = A^t 1 depends on the graph only), so a
#: mechanism that acts on what is sent (Zip-DL on a directed network) passes it through unperturbed
WEIGHT_TAG = PUSH_SUM_WEIGHT_TAG


class SGPState(NamedTuple):
    x: torch.Tensor  # numerators (rows, d)
    w: torch.Tensor  # push-sum weights (rows, 1)


def debiased(s: SGPState) -> torch.Tensor:
    """z = x / w: the agents' models."""
    return s.x / s.w


@ALGORITHMS.register("sgp")
def sgp() -> Algorithm:
    def init(x0: torch.Tensor, ctx: StepContext) -> SGPState:
        return SGPState(x0.clone(), torch.ones((x0.shape[0], 1), dtype=x0.dtype, device=x0.device))

    def step(s: SGPState, ctx: StepContext) -> SGPState:
        z = debiased(s)
        x = ctx.comm.mix(s.x - ctx.eta * ctx.gradient(z), tag="x")
        return SGPState(x, ctx.comm.mix(s.w, tag=WEIGHT_TAG))

    return Algorithm("sgp", init, step, debiased, combines=LINEAR_MIXING,
                     transmits={"x": "push_sum_numerator", WEIGHT_TAG: "push_sum_weight"}, directed_ok=True,
                     held_reason=None)  # two mixes and a row-wise division: each agent's own rows
