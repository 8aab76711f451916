"""DSG-RMS and EDSG-RMS (seed 002 eq. (5), (6) with SPEC §5's fix of (6d)), and Remark 2's gradient-tracking variant,
built from two reusable parts around an unchanged base algorithm:

* gradient side — every gradient the base algorithm asks for is replaced by M_k(n)·ĝ, with M_k(n) the agent's own
  random matrix step-size (:class:`privdl.mechanisms.rms.RandomMatrixStepSize`, keyed per agent and call);
* message side — every transmission carries the agent's protection vector, which the agent removes from its own
  combination (:class:`privdl.mechanisms.protection.Protection`; the network average is unchanged).

``with_rms(base, rms=, protection=, lag=)`` wraps any (init, step) algorithm; the recipes are

* ``dsg_rms``   = D-SGD (adapt then combine) + RMS + protection from w_k(n−1) (lag 1, eq. (5b));
* ``edsg_rms``  = exact diffusion + RMS + protection from w'_k(n−2) (lag 2, eq. (6c)); the first round uses a random
  reference c'(−1) ~ N(0, I_L) drawn from the agent's own key;
* ``dsgt_rms``  = DSGT + RMS + protection (Remark 2: both of its messages are protected, two rounds per iteration).

σ_μ = σ_z = 0 with μ = 1 and τ = 0 gives the base algorithm bit for bit. Defaults are seed 002 Fig. 1's: μ = 1,
σ_z = 0.01 (σ_z² = 1e-4; σ_μ defaults to σ_z), τ = 1, the norm law, a dense M. Neither part gives a DP guarantee: the
run's ledger says "obfuscation, no DP guarantee"; chained after a DP mechanism (``[mechanism]``) they are
post-processing and the mechanism's guarantee stands.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, NamedTuple

import torch

from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, frame_of
from privdl.algorithms.dsgd import dsgd
from privdl.algorithms.dsgt import dsgt
from privdl.algorithms.exact_diffusion import exact_diffusion_parts
from privdl.comm.base import MESSAGE_KINDS
from privdl.errors import ValidationError
from privdl.mechanisms.protection import LAWS as PROTECTIONS, PROTECTION_REASON, Protection
from privdl.mechanisms.rms import LAWS, RMS_REASON, STRUCTURES, RandomMatrixStepSize
from privdl.privacy.events import ObfuscationEvent
from privdl.registry import one_of


class RMSState(NamedTuple):
    inner: Any
    calls: int  # gradient calls so far (the counter of the next M draw is calls + 1)
    pending: torch.Tensor | None  # lag 2: the protection vector of the next round


def with_rms(base: Algorithm, *, name: str, rms: RandomMatrixStepSize | None, protection: Protection | None,
             lag: int = 1) -> Algorithm:
    """``base`` with its gradients multiplied by random matrix step-sizes and its transmissions protected; the
    protection vector of round n comes from the agent's model of round n − ``lag``."""
    if lag not in (1, 2):
        raise ValidationError(f"protection lag must be 1 or 2, got {lag}")
    protect = protection is not None and protection.active
    scale = rms is not None and not rms.identity  # M = I exactly draws nothing

    def wrapped(s_calls: int, ctx: StepContext, vector: torch.Tensor | None) -> tuple[StepContext, list[int]]:
        made = [0]
        gradient = ctx.gradient

        def grad(models: torch.Tensor, **kw: Any) -> torch.Tensor:
            g = gradient(models, **kw)
            made[0] += 1
            if not scale:
                return g
            who = kw.get("requesters", kw.get("owners"))
            if who is None:  # every row of the engine, each its own agent's M (the held frame: its agents' only)
                who = frame_of(ctx.comm).agents
            rows = None if who is None else torch.as_tensor(who).reshape(-1).cpu().numpy()
            flat = g.reshape(g.shape[0], -1)
            return rms.apply(flat, ctx.keys, s_calls + made[0], rows).reshape(g.shape)

        comm = protection.protect(ctx.comm, vector) if protect and vector is not None else ctx.comm
        return replace(ctx, gradient=grad, comm=comm), made

    def init(x0: torch.Tensor, ctx: StepContext) -> RMSState:
        inner_ctx, made = wrapped(0, ctx, None)
        inner = base.init(x0, inner_ctx)
        pending = None
        if protect and lag == 2:  # c'(−1): a random reference, the agent's own draw
            agents = frame_of(ctx.comm).agents
            ref = ctx.keys.normal("protection/init", 0, x0.shape[1], rows=None if agents is None else agents.numpy())
            ref = ref.to(dtype=x0.dtype, device=x0.device)
            pending = protection.vector(ref)
        return RMSState(inner, made[0], pending)

    def step(s: RMSState, ctx: StepContext) -> RMSState:
        vector, pending = None, None
        if protect:
            current = protection.vector(base.params(s.inner))  # from w(n−1)
            vector, pending = (current, None) if lag == 1 else (s.pending, current)
        inner_ctx, made = wrapped(s.calls, ctx, vector)
        return RMSState(base.step(s.inner, inner_ctx), s.calls + made[0], pending)

    names, reasons = [], []  # one event per access: both parts act on the same gradient and its message
    if scale:
        names.append(f"random_matrix_step_size({rms.structure}, {rms.law})")
        reasons.append(RMS_REASON)
    if protect:
        names.append(f"protection({protection.law})")
        reasons.append(PROTECTION_REASON)
    parts = [ObfuscationEvent(" + ".join(names), "; ".join(reasons))] if names else []
    facts = {**(rms.describe() if rms is not None else {}),
             **(protection.describe() if protection is not None else {}), "protection_lag": lag}
    # what is sent is the base's message, obfuscated when either part acts; how it combines is the base's
    sent = {tag: f"obfuscated_{kind}" if (scale or protect) and f"obfuscated_{kind}" in MESSAGE_KINDS else kind
            for tag, kind in base.transmits.items()}
    # the held frame: the base's reason; both parts act on each row alone (its own keys' M, its own vector)
    return Algorithm(name, init, step, lambda s: base.params(s.inner), base.accesses, tuple(parts), base.requires,
                     protection if protect else None, facts, rms=rms, combines=base.combines, transmits=sent,
                     held_reason=base.held_reason)


def _parts(mu: float, sigma_mu: float | None, sigma_z: float, structure: str, law: str, protection: str,
           tau: float) -> tuple[RandomMatrixStepSize, Protection]:
    sigma_mu = sigma_z if sigma_mu is None else sigma_mu
    return (RandomMatrixStepSize(mu=mu, sigma_mu=sigma_mu, sigma_z=sigma_z, structure=structure, law=law),
            Protection(protection, tau))


Structure = Annotated[str, one_of(*STRUCTURES)]
Law = Annotated[str, one_of(*LAWS)]
ProtectionLaw = Annotated[str, one_of(*PROTECTIONS)]


@ALGORITHMS.register("dsg_rms")
def dsg_rms(*, mu: float = 1.0, sigma_mu: float | None = None, sigma_z: float = 0.01, tau: float = 1.0,
            structure: Structure = "dense", law: Law = "gaussian", protection: ProtectionLaw = "norm") -> Algorithm:
    """DSG-RMS (seed 002 eq. (5))."""
    rms, prot = _parts(mu, sigma_mu, sigma_z, structure, law, protection, tau)
    return with_rms(dsgd(form="atc"), name="dsg_rms", rms=rms, protection=prot, lag=1)


@ALGORITHMS.register("edsg_rms")
def edsg_rms(*, mu: float = 1.0, sigma_mu: float | None = None, sigma_z: float = 0.01, tau: float = 1.0,
             structure: Structure = "dense", law: Law = "gaussian", protection: ProtectionLaw = "norm") -> Algorithm:
    """EDSG-RMS (seed 002 eq. (6), combination as SPEC §5 fixes (6d)); needs a positive-definite A."""
    rms, prot = _parts(mu, sigma_mu, sigma_z, structure, law, protection, tau)
    return with_rms(exact_diffusion_parts(), name="edsg_rms", rms=rms, protection=prot, lag=2)


@ALGORITHMS.register("dsgt_rms")
def dsgt_rms(*, mu: float = 1.0, sigma_mu: float | None = None, sigma_z: float = 0.01, tau: float = 1.0,
             structure: Structure = "dense", law: Law = "gaussian", protection: ProtectionLaw = "norm") -> Algorithm:
    """Gradient tracking with both parts (seed 002 Remark 2; two protected messages per iteration)."""
    rms, prot = _parts(mu, sigma_mu, sigma_z, structure, law, protection, tau)
    return with_rms(dsgt(), name="dsgt_rms", rms=rms, protection=prot, lag=1)
