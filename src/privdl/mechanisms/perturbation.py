"""Additive Laplace perturbations of transmitted values: PD-LMS's three noise schemes and PSGT's decaying schedule
(BASELINES.md §1.2, §2.1; seed 002 §5.1 uses them as baselines).

Laplace with variance v has scale b = √(v/2) per coordinate. Every draw is keyed: an agent's own perturbation by its
own key (purpose, round, agent[, receiver]); an edge's shared perturbation by the key only its two endpoints hold.

PD-LMS schemes, as (per-edge noise g_ℓk on edge ℓ → k, self term g_kk) for a combination
w_k = a_kk (ψ_k + g_kk) + Σ_{ℓ ≠ k} a_ℓk (ψ_ℓ + g_ℓk):

* ``independent``  g_ℓk i.i.d. per link and round, g_kk = 0 (the standard baseline);
* ``nullspace``    one g_ℓ per sender and round sent on every link, g_ℓℓ = −((1 − a_ℓℓ)/a_ℓℓ)·g_ℓ, so that
                   Σ_k a_ℓk g_ℓk = 0 for every sender ℓ (Vlaski & Sayed 2021; needs a_ℓℓ > 0);
* ``edge``         g_kℓ = −g_ℓk per undirected edge from the edge's shared key, g_kk = 0, so that
                   Σ_{ℓ,k} a_ℓk g_ℓk = 0 for symmetric A (Rizk et al. 2023, "local graph-homomorphic").

Unclipped quadratic losses have no sensitivity bound, so these perturbations carry no ε here
(:class:`privdl.privacy.events.LaplaceEvent`): the papers' "DP with high probability" needs a bound on the data
that the task does not give.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from privdl.comm.base import Comm
from privdl.errors import ValidationError
from privdl.keys import Keys, as_keys, fold, uniform

SCHEMES = ("independent", "nullspace", "edge")


def laplace(u: torch.Tensor, variance: float | torch.Tensor) -> torch.Tensor:
    """Laplace draws of the given variance from uniforms u ∈ [0, 1) (inverse CDF)."""
    b = torch.sqrt(torch.as_tensor(variance, dtype=torch.float64) / 2.0)
    c = u - 0.5
    tail = (1.0 - 2.0 * c.abs()).clamp(min=torch.finfo(torch.float64).tiny)
    return -b * torch.sign(c) * torch.log(tail)


def pd_lms_noise(scheme: str, comm: Comm, keys: Keys, t: int, dim: int, variance: float,
                 dtype: torch.dtype = torch.float64, *, rows: torch.Tensor | None = None,
                 edges: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-edge noise (E, L) in the comm's edge order, self noise (rows, L)) of PD-LMS scheme ``scheme`` at round
    ``t``. ``rows`` (global rows) and ``edges`` (edge ids, whose senders are among ``rows``): only those rows' self
    noise and those edges' noise, each entry the whole network's (an engine that holds some agents: the held frame);
    None: every row, every edge."""
    e = comm.edges
    src, dst = e.src.cpu(), e.dst.cpu()
    if edges is not None:
        src, dst = src[edges.cpu()], dst[edges.cpu()]
    count = comm.rows if rows is None else int(rows.numel())
    if scheme == "independent":
        per_edge = laplace(keys.uniform("pd_lms", t, dim, rows=src.numpy(), requesters=dst.numpy()), variance)
        return per_edge.to(dtype), torch.zeros(count, dim, dtype=dtype)
    if scheme == "nullspace":
        a, at = _nullspace_plan(comm, keys, rows, edges, src)
        g = laplace(keys.uniform("pd_lms", t, dim, rows=None if rows is None else rows.cpu().long().numpy()),
                    variance)
        return g[at].to(dtype), (-(1.0 - a) / a)[:, None].mul(g).to(dtype)
    if scheme == "edge":
        edge_keys, sign = _edge_keys(comm, keys, edges)
        per_edge = sign[:, None] * laplace(uniform(fold(edge_keys, t), dim), variance)
        return per_edge.to(dtype), torch.zeros(count, dim, dtype=dtype)
    raise ValidationError(f"PD-LMS scheme must be one of {SCHEMES}, got {scheme!r}")


def _nullspace_plan(comm: Comm, keys: Keys, rows: torch.Tensor | None, edges: torch.Tensor | None,
                    src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The nullspace scheme's self-weights a_kk of ``rows`` (None: every row), checked positive, and each sent
    edge (``src``: the senders of the edge ids ``edges``) as a row of the drawn g (its place among ``rows``); built
    once per (comm edges, rows, edges, keys): the check and the index read the network's n self-weights, which a
    held engine should not redo every round."""
    e = comm.edges
    cached = getattr(comm, "_pd_lms_nullspace", None)
    if cached is not None and all(c is v for c, v in zip(cached[:4], (e, rows, edges, keys))):
        return cached[4], cached[5]
    a = e.self_weight.cpu().to(torch.float64)
    if bool((a <= 0).any()):
        k = int((a <= 0).nonzero()[0])
        raise ValidationError(f"PD-LMS's nullspace scheme needs a positive self-weight a_kk at every agent "
                              f"(agent {k % keys.n} has a_kk = {float(a[k]):g}); use a lazy or Metropolis rule")
    if rows is None:
        at = src.long()
    else:
        mine = rows.cpu().long()
        local = torch.full((comm.rows,), -1, dtype=torch.long)
        local[mine] = torch.arange(mine.numel())
        a, at = a[mine], local[src.long()]
    comm._pd_lms_nullspace = (e, rows, edges, keys, a, at)  # type: ignore[attr-defined]
    return a, at


def _edge_keys(comm: Comm, keys: Keys, edges: torch.Tensor | None = None) -> tuple[np.ndarray, torch.Tensor]:
    """Each edge's shared key (held by its two endpoints, in its replica) and its orientation sign (+1 from the
    smaller agent index to the larger), for the edges ``edges`` (ids; None: every edge); built once per (comm,
    keys, edges)."""
    cached = getattr(comm, "_pd_lms_edges", None)
    if cached is not None and cached[0] is keys and cached[1] is comm.edges and cached[2] is edges:
        return cached[3], cached[4]
    e = comm.edges
    src, dst = e.src.cpu().numpy(), e.dst.cpu().numpy()
    if edges is not None:
        src, dst = src[edges.cpu().numpy()], dst[edges.cpu().numpy()]
    n = keys.n
    out = as_keys([keys.shared("pd_lms/edge", (int(s) % n, int(d) % n), int(s) // n)
                   for s, d in zip(src, dst)])
    sign = torch.where(torch.as_tensor(src % n < dst % n), 1.0, -1.0).to(torch.float64)
    comm._pd_lms_edges = (keys, e, edges, out, sign)  # type: ignore[attr-defined]
    return out, sign


def psgt_variance(t: int, *, variance: float, decay: float, root: bool) -> float:
    """PSGT's perturbation variance at round t: (variance·decayᵗ)^½ with ``root`` (seed 002 §5.1's schedule
    √(0.1·0.8ⁿ)), else variance·decayᵗ."""
    v = variance * decay**t
    return math.sqrt(v) if root else v


__all__ = ["SCHEMES", "laplace", "pd_lms_noise", "psgt_variance"]
