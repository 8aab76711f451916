"""Flat-parameter models: a model is (dim, init, predict(theta, X) -> logits) with theta a flat (d,) vector.

Flat vectors keep the agent axis trivial (x is (n, d)): clipping, noise and mixing act on rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlatModel:
    """A model whose parameters are the consecutive blocks ``shapes`` of a flat vector."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    fan_ins: tuple[int, ...]

    @property
    def dim(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def unflatten(self, theta: torch.Tensor) -> list[torch.Tensor]:
        out, k = [], 0
        for s in self.shapes:
            size = math.prod(s)
            out.append(theta[k:k + size].reshape(s))
            k += size
        return out

    def init(self, generator: torch.Generator, dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
        """PyTorch's default Linear init, U(−1/√fan_in, 1/√fan_in) per block (or zeros)."""
        if zero:
            return torch.zeros(self.dim, dtype=dtype)
        parts = [(torch.rand(math.prod(s), generator=generator, dtype=dtype) * 2 - 1) / math.sqrt(f)
                 for s, f in zip(self.shapes, self.fan_ins)]
        return torch.cat(parts)

    def predict(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        p = self.unflatten(theta)
        h = X.reshape(X.shape[0], -1)
        n_layers = len(p) // 2
        for layer in range(n_layers):
            w, b = p[2 * layer], p[2 * layer + 1]
            h = h @ w.T + b
            if layer < n_layers - 1:
                h = torch.relu(h)
        return h.squeeze(-1) if self.shapes[-1] == (1,) else h


def linear(n_features: int, n_outputs: int) -> FlatModel:
    """Affine map (weights then bias); n_outputs = 1 for logistic regression."""
    return FlatModel("linear", ((n_outputs, n_features), (n_outputs,)), (n_features, n_features))


def mlp(n_features: int, hidden: tuple[int, ...], n_outputs: int) -> FlatModel:
    """Fully connected ReLU network, e.g. 784 → 128 → 10 (seed 001's shallow network)."""
    sizes = (n_features, *hidden, n_outputs)
    shapes: list[tuple[int, ...]] = []
    fans: list[int] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        shapes += [(b, a), (b,)]
        fans += [a, a]
    return FlatModel("mlp", tuple(shapes), tuple(fans))
