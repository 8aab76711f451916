"""First-order optimizers on the agent axis with explicit state (every agent its own moments, one tensor (n, d)).

An optimizer turns a gradient g (n, d) into an update u (n, d) (to be *added* to the parameters) and new state:
``update(state, g, lr, x) -> (u, state)``. State persists across rounds (SPEC §4) unless an algorithm resets it.
Elementwise rules, so agents never interact; tested against ``torch.optim`` on the same gradient sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from privdl.errors import ValidationError


class SGDState(NamedTuple):
    k: int  # steps taken
    buf: torch.Tensor  # momentum buffer (zeros before the first step: β·0 + g = g, as torch.optim.SGD starts)


class AdamState(NamedTuple):
    k: int
    m: torch.Tensor
    v: torch.Tensor


OptState = SGDState | AdamState


@dataclass(frozen=True)
class Optimizer:
    """``sgd`` (optional heavy-ball ``momentum``, ``weight_decay`` added to the gradient as in torch.optim.SGD) or
    ``adam`` (``betas``, ``eps``, ``weight_decay`` as in torch.optim.Adam)."""

    name: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in ("sgd", "adam"):
            raise ValidationError(f"unknown optimizer {self.name!r}; valid: sgd, adam")
        if not 0 <= self.momentum < 1:
            raise ValidationError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValidationError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValidationError(f"Adam betas must be two numbers in [0, 1), got {self.betas}")

    def init(self, x: torch.Tensor) -> OptState:
        if self.name == "adam":
            return AdamState(0, torch.zeros_like(x), torch.zeros_like(x))
        return SGDState(0, torch.zeros_like(x))

    def update(self, state: OptState, g: torch.Tensor, lr: float | torch.Tensor,
               x: torch.Tensor | None = None) -> tuple[torch.Tensor, OptState]:
        if self.weight_decay:
            if x is None:
                raise ValidationError("weight decay needs the parameters")
            g = g + self.weight_decay * x
        k = state.k + 1
        if isinstance(state, SGDState):
            buf = state.buf
            if self.momentum:
                buf = g.clone() if state.k == 0 else self.momentum * buf + g
                g = buf
            return -lr * g, SGDState(k, buf)
        b1, b2 = self.betas
        m = b1 * state.m + (1 - b1) * g
        v = b2 * state.v + (1 - b2) * g * g
        m_hat = m / (1 - b1**k)
        denom = (v / (1 - b2**k)).sqrt() + self.eps
        return -lr * m_hat / denom, AdamState(k, m, v)


def make_optimizer(spec: str | dict | Optimizer | None, default: str = "sgd") -> Optimizer:
    """An :class:`Optimizer` from a name, a config table ({name = "adam", ...}) or None (the default)."""
    if isinstance(spec, Optimizer):
        return spec
    if spec is None:
        return Optimizer(default)
    if isinstance(spec, str):
        return Optimizer(spec)
    if not isinstance(spec, dict):
        raise ValidationError(f"optimizer must be a name (\"sgd\", \"adam\") or a table "
                              f"{{name = \"adam\", lr = …}}, got {spec!r}")
    params = dict(spec)
    try:
        if "betas" in params:
            params["betas"] = tuple(params["betas"])
        return Optimizer(**params)
    except TypeError as exc:
        raise ValidationError(f"bad optimizer table {spec}: {exc}") from None
