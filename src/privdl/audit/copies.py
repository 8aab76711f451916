"""Independent copies of one network on a single agent axis: k systems of n₀ agents trained at once as one
(k·n₀, d) tensor. Copy c's agent i is row c·n₀ + i; mixing and neighbour sums act block by block (never an
(k·n₀)² matrix), so thousands of audit models train in one vectorised run."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from privdl.network.network import Network


@dataclass(frozen=True)
class CopiesNeighbours:
    adjacency: torch.Tensor  # (n₀, n₀)
    base_degree: torch.Tensor  # (n₀, 1)
    copies: int

    @property
    def degree(self) -> torch.Tensor:
        return self.base_degree.repeat(self.copies, 1)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        n0 = self.adjacency.shape[0]
        return torch.einsum("ij,cjd->cid", self.adjacency, x.reshape(self.copies, n0, -1)).reshape(x.shape)

    def disagreement(self, x: torch.Tensor) -> torch.Tensor:
        return self.degree * x - self.sum(x)


class Copies:
    """``copies`` independent replicas of ``base`` (the interface :func:`privdl.simulator.simulate` uses)."""

    def __init__(self, base: Network, copies: int) -> None:
        self.base, self.copies = base, int(copies)
        self.n = base.n * self.copies
        self.description = f"{self.copies} independent copies of {base.description}"

    def mix(self, x: torch.Tensor, *, sparse: bool | None = None) -> torch.Tensor:
        w = torch.as_tensor(self.base.W, dtype=x.dtype, device=x.device)
        return torch.einsum("ij,cjd->cid", w, x.reshape(self.copies, self.base.n, -1)).reshape(x.shape)

    def neighbour_operator(self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
                           ) -> CopiesNeighbours:
        nb = self.base.neighbour_operator(dtype, device)
        return CopiesNeighbours(nb.adjacency, nb.degree, self.copies)
