"""PD-LMS: privatized ATC diffusion (Rizk, Vlaski & Sayed, TSP 2023; BASELINES.md §1.1–1.2; seed 002's baseline):

    ψ_k(n) = w_k(n−1) − γ ∇̂J_k(w_k(n−1))                                   (adapt; LMS for a quadratic loss)
    agent ℓ sends ψ_ℓ(n) + g_ℓk(n) to each neighbour k                       (one per-edge ``send``, tag ``psi``)
    w_k(n) = a_kk (ψ_k(n) + g_kk(n)) + Σ_{ℓ≠k} a_ℓk (ψ_ℓ(n) + g_ℓk(n))       (combine)

with Laplace perturbations g of variance σ_g² (seed 002: 1e-4) from one of three schemes
(:func:`privdl.mechanisms.perturbation.pd_lms_noise`): ``independent``, ``nullspace`` (graph-homomorphic: invisible to
the network centroid) or ``edge`` (local graph-homomorphic: antisymmetric per edge). The [R] details of BASELINES.md
(one draw per sender for the nullspace scheme, the self-term −((1 − a_kk)/a_kk)·g_k, per-edge shared keys with the
sign from the smaller agent index) are the choices named here and parameters where they can vary (``scheme``,
``variance``).
"""

from __future__ import annotations

from typing import Annotated, NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, frame_of
from privdl.errors import ValidationError
from privdl.mechanisms.perturbation import SCHEMES, pd_lms_noise
from privdl.privacy.events import LaplaceEvent
from privdl.registry import one_of


class PDLMSState(NamedTuple):
    w: torch.Tensor


@ALGORITHMS.register("pd_lms")
def pd_lms(*, scheme: Annotated[str, one_of(*SCHEMES)] = "nullspace", variance: float = 1e-4) -> Algorithm:
    if scheme not in SCHEMES:
        raise ValidationError(f"pd_lms scheme must be one of {SCHEMES}, got {scheme!r}")
    if not variance >= 0:
        raise ValidationError(f"pd_lms variance (σ_g²) must be >= 0, got {variance}")

    def step(s: PDLMSState, ctx: StepContext) -> PDLMSState:
        psi = s.w - ctx.eta * ctx.gradient(s.w)
        comm = ctx.comm
        frame = frame_of(comm)  # the engine's rows and the edges its agents send along (every edge: network frame)
        per_edge, own = pd_lms_noise(scheme, comm, ctx.keys, ctx.t, psi.shape[1], variance, psi.dtype,
                                     rows=frame.agents, edges=frame.sent)
        e = comm.edges
        received = comm.send(psi[frame.sent_from] + per_edge.to(psi.device), tag="psi")
        self_weight = frame.rows(e.self_weight).to(dtype=psi.dtype, device=psi.device)[:, None]
        return PDLMSState(self_weight * (psi + own.to(psi.device)) + comm.reduce(received, weight="mixing"))

    privacy = (LaplaceEvent(f"pd_lms({scheme})", variance),) if variance > 0 else ()
    return Algorithm("pd_lms", lambda x0, ctx: PDLMSState(x0.clone()), step, lambda s: s.w, privacy=privacy,
                     facts={"scheme": scheme, "variance": variance}, transmits={"psi": "model_per_edge"},
                     held_reason=None)  # its sent edges' values and noise, its received edges' sum (Frame)
