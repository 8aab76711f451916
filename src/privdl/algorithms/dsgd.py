"""D-SGD (seeds 000/001, Algorithm 1): x^(t+1) = W (x^(t) − η_t (ĝ^(t) + v^(t))).

With the "none" mechanism this is non-private D-SGD; with "gaussian_ldp" it is LDP D-SGD; later correlated-noise
mechanisms (DECOR, Whisper) plug in unchanged.
"""

from __future__ import annotations

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext


@ALGORITHMS.register("dsgd")
def dsgd() -> Algorithm:
    def init(x0: torch.Tensor) -> torch.Tensor:
        return x0.clone()

    def step(x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return ctx.mix(x - ctx.eta * ctx.gradient(x))

    return Algorithm("dsgd", init, step, lambda x: x)
