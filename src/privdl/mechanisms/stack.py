"""Stacking mechanisms of independent runs onto one row axis (the replicas of a sweep, DESIGN.md).

Replica r's rows r·n … r·n + n − 1 get exactly its own mechanism's transformation with its own keys: the same
own draws u (keyed by replica r's root) and the same shared draws s as its single run. The correlated part is
combined as one sparse product F s over every replica, so a replica agrees with its single run to rounding (the
single run adds the same terms elementwise).

Stackable today: ``none`` and the correlated Gaussian family (gaussian_ldp, ldp, decor, whisper/corn, covariance)
with batch clipping, in any mix; or members of that family that all clip per example with the same need (clip,
batch, sampling) — the engine then computes every row's clipped sum in one access and the noise is added to the sum
before dividing by B; or example-level DP-SGD runs (``dp_sgd``) that share their need (clip, sampling rates,
per-example path): :class:`StackedDPSGD`, each replica with its own σ per owner, lot size, noise keys and access
budget, for any access — cross-gradients included (DPDL). :func:`stack` returns None for anything else; the runner
then runs those singly.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.keys import as_keys, fold, normal
from privdl.mechanisms.base import Access, AccessBudgetExceeded, GradientMechanism, MechanismEnv, NoPrivacy, clip_rows
from privdl.mechanisms.correlated import CorrelatedGaussian
from privdl.mechanisms.dp_sgd import DPSGD


class _Replicas:
    """What every stacked mechanism shares: R member mechanisms of ``n`` rows each, row r·n + j agent j of replica
    r; its accesses per replica, and a refused access named by replica and agent."""

    members: list
    n: int

    def member_accesses(self, r: int) -> torch.Tensor:
        return self.accesses()[r * self.n:(r + 1) * self.n]

    def count(self, access: Access) -> None:
        try:
            super().count(access)
        except AccessBudgetExceeded:
            after = self.calls + torch.bincount(access.owners.cpu(), minlength=self.calls.numel())
            row = int((after > self.budget()).nonzero(as_tuple=True)[0][0])
            r, j = divmod(row, self.n)
            raise AccessBudgetExceeded(
                f"noisy access {int(after[row])} to the data of agent {j} of replica {r} exceeds the "
                f"{int(self.budget()[row])} accesses the privacy accounting of its mechanism "
                f"{self.members[r].name!r} covers (an algorithm that reads the data more often than it "
                "declares?)") from None


class StackedCorrelated(_Replicas, GradientMechanism):
    """R replicas of ``none`` / correlated Gaussian mechanisms on R·n rows.

    Every distinct key is drawn once per access: replicas with the same root seed share their own keys (and, on the
    same graph, their shared keys), exactly as their single runs would. The noise is one sparse product F z: z has
    one draw per distinct key, F holds every row's σ_mix (on its own key) and its factor coefficients (on the
    shared keys it holds)."""

    name = "stacked"

    def __init__(self, mechs: Sequence[GradientMechanism], n: int) -> None:
        self.members, self.n = list(mechs), int(n)
        steps = torch.cat([m.steps.expand(n) if m.steps.numel() == 1 else m.steps for m in self.members])
        super().__init__(steps=steps)
        self.need = self.members[0].need
        self.divide = getattr(self.members[0], "batch", None)  # per-example members: noise on the sum, then / B
        clips, sig = [], []
        for m in self.members:
            private = isinstance(m, CorrelatedGaussian)
            clips.append(m.clip if private and m.clip else math.inf)
            sig.append(m.noise.sigma_mix if private else 0.0)
        self.clip = torch.tensor(clips, dtype=torch.float64).repeat_interleave(n)[:, None]
        self.clips_any = any(math.isfinite(c) for c in clips)
        self.silent = not self.clips_any and not any(sig) and self.divide is None  # every member is ``none``
        self.sigma = torch.tensor(sig, dtype=torch.float64).repeat_interleave(n)[:, None]
        self._cast: dict[tuple, tuple] = {}

    def bind(self, env: MechanismEnv) -> None:
        super().bind(env)
        if env.rows != len(self.members) * self.n:
            raise ValidationError(f"stacked mechanism covers {len(self.members) * self.n} rows, the run has "
                                  f"{env.rows}")
        n = self.n
        own, inverse = env.keys.distinct(env.scope)
        own_col = np.arange(env.rows) if inverse is None else inverse
        sigma = self.sigma[:, 0].numpy()
        live = sigma > 0
        rows, cols, vals = [np.flatnonzero(live)], [own_col[live]], [sigma[live]]
        sparse_rows, sparse_keys, sparse_coeffs = [], [], []
        dense: list[tuple[int, np.ndarray, np.ndarray]] = []  # (replica, factor (n, k), keys (k,))
        for r, m in enumerate(self.members):
            if not isinstance(m, CorrelatedGaussian) or not m.noise.draw_keys:
                continue
            noise = m.noise
            draw_keys = as_keys([env.keys.shared(f"{env.scope}:{label}:{j}", members, r)
                                 for label, j, members in noise.draw_keys])
            if len(noise.parts) == 1 and len(noise.parts[0][1]) == n:  # one seed held by everyone: a dense block
                dense.append((r, noise.dense_factor(), draw_keys))
                continue
            sparse_rows.append(noise.targets.numpy() + r * n)
            sparse_keys.append(draw_keys[noise.term_draws.numpy()])
            sparse_coeffs.append(noise.coeffs)
        keys = [own]
        if sparse_rows:
            distinct, column = np.unique(np.concatenate(sparse_keys), return_inverse=True)
            rows.append(np.concatenate(sparse_rows))
            cols.append(column + len(own))
            vals.append(np.concatenate(sparse_coeffs))
            keys.append(distinct)
        width = sum(len(k) for k in keys)
        self.dense = None
        if dense:  # replicas × (n, K) factors, K the widest; their shared draws gathered from the distinct keys
            k_max = max(f.shape[1] for _, f, _ in dense)
            factors = np.zeros((len(dense), n, k_max))
            gather = np.full((len(dense), k_max), -1, dtype=np.int64)
            distinct, column = np.unique(np.concatenate([k for _, _, k in dense]), return_inverse=True)
            pos = 0
            for g, (_, f, k) in enumerate(dense):
                factors[g, :, :f.shape[1]] = f
                gather[g, :len(k)] = column[pos:pos + len(k)] + width
                pos += len(k)
            keys.append(distinct)
            gather[gather < 0] = width  # padding reads any draw; its factor column is zero
            self.dense = (torch.as_tensor([r for r, _, _ in dense]), torch.as_tensor(factors),
                          torch.as_tensor(gather.reshape(-1)))
        # every row's noise = F z (+ the dense blocks): z one draw per distinct key, F sparse
        self.keys = np.concatenate(keys)
        coo = torch.sparse_coo_tensor(torch.as_tensor(np.stack([np.concatenate(rows), np.concatenate(cols)])),
                                      torch.as_tensor(np.concatenate(vals)), (env.rows, len(self.keys)),
                                      check_invariants=False).coalesce()
        with warnings.catch_warnings():  # torch flags CSR as beta; a CSR @ dense product is what we use
            warnings.simplefilter("ignore", UserWarning)
            self.factor = coo.to_sparse_csr()
        self._cast.clear()

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        if self.silent:  # every member is ``none``: any access (cross-gradients too) passes unchanged
            return value
        rows = value.shape[0]
        if not (rows == self.calls.numel() and access.all_rows):
            raise ValidationError("stacked replicas take every row's own gradient in one access")
        key = (value.dtype, value.device)
        if key not in self._cast:
            dense = None if self.dense is None else (self.dense[0], self.dense[1].to(value.dtype), self.dense[2])
            self._cast[key] = (self.clip.to(dtype=value.dtype, device=value.device), self.factor.to(dtype=value.dtype),
                               dense)
        clip, factor, dense = self._cast[key]
        flat = value.reshape(rows, -1)
        d = flat.shape[1]
        out = clip_rows(flat, clip) if self.clips_any and self.divide is None else flat
        z = normal(fold(self.keys, access.call), d, flat.dtype)
        noise = factor @ z
        if dense is not None:
            reps, f, gather = dense
            block = torch.bmm(f, z[gather].view(f.shape[0], f.shape[2], d))
            noise.view(-1, self.n, d).index_add_(0, reps, block)
        out = out + noise.to(flat.device)
        if self.divide is not None:
            out = out / self.divide
        return out.reshape(value.shape)

    def unprotected(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        if self.silent:
            return value
        return super().unprotected(value, access)



class StackedDPSGD(_Replicas, GradientMechanism):
    """R replicas of example-level DP-SGD on R·n rows (:class:`privdl.mechanisms.dp_sgd.DPSGD`): one access computes
    every row's clipped lot sum (the engine draws each row's Poisson lot from its replica's keys); row r·n + j then
    gets replica r's σ_j·C, its noise from replica r's key of owner j (and requester: a cross-gradient's noise is
    keyed as in its single run) and its division by replica r's lot size — exactly :meth:`DPSGD.privatize` of its
    single run, elementwise. Each row's accesses count against its replica's budget (σ was calibrated for it)."""

    name = "stacked_dp_sgd"

    def __init__(self, mechs: Sequence[DPSGD], n: int) -> None:
        self.members, self.n = list(mechs), int(n)
        super().__init__(steps=torch.cat([m.steps.expand(n) if m.steps.numel() == 1 else m.steps
                                          for m in self.members]))
        self.need = self.members[0].need
        # σ_j·C per row, in float64 as each single run computes it before casting to the gradient's dtype
        self.scale = torch.cat([(m.sigmas * m.clip * m.noise_scale).expand(n) for m in self.members])
        self.lot = torch.tensor([m.lot_size for m in self.members], dtype=torch.float64).repeat_interleave(n)
        self._cast: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def bind(self, env: MechanismEnv) -> None:
        if env.rows != len(self.members) * self.n:
            raise ValidationError(f"stacked mechanism covers {len(self.members) * self.n} rows, the run has "
                                  f"{env.rows}")
        super().bind(env)

    def _per_row(self, value: torch.Tensor, owners: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (value.dtype, value.device)
        if key not in self._cast:
            self._cast[key] = (self.scale.to(dtype=value.dtype, device=value.device),
                               self.lot.to(dtype=value.dtype, device=value.device))
        scale, lot = self._cast[key]
        where = owners.to(value.device)
        return scale.index_select(0, where)[:, None], lot.index_select(0, where)[:, None]

    def privatize(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        flat = value.reshape(value.shape[0], -1)
        owners = access.owners.cpu()
        everyone = owners.numel() == self.env.rows and access.all_rows
        noise = (self.env.keys.normal(self.env.scope, access.call, flat.shape[1], dtype=flat.dtype) if everyone else
                 self.env.keys.normal(self.env.scope, access.call, flat.shape[1], rows=owners,
                                      requesters=access.requesters.cpu(), dtype=flat.dtype)).to(flat.device)
        scale, lot = self._per_row(flat, owners)
        return ((flat + scale * noise) / lot).reshape(value.shape)

    def unprotected(self, value: torch.Tensor, access: Access) -> torch.Tensor:
        flat = value.reshape(value.shape[0], -1)
        return (flat / self._per_row(flat, access.owners.cpu())[1]).reshape(value.shape)



def stack(mechs: Sequence[GradientMechanism], n: int, *, cross: bool = False) -> GradientMechanism | None:
    """One mechanism for R replicas of ``n`` rows each, or None when these mechanisms cannot be stacked.
    ``cross``: the algorithm also reads data at other agents' models (cross-gradients), which only independent noise
    keyed per (owner, requester) — DP-SGD — or no noise serves."""
    if any(m.wraps_comm for m in mechs):  # a comm-side part (Zip-DL, Muffliato) runs singly
        return None
    if len({need_signature(m.need) for m in mechs}) != 1:  # batch and per-example clipping read differently
        return None
    if all(type(m) is NoPrivacy or isinstance(m, CorrelatedGaussian) for m in mechs):
        if any(isinstance(m, CorrelatedGaussian) and m.network_.n != n for m in mechs):
            return None
        out = StackedCorrelated(mechs, n)
        return out if out.silent or not cross else None
    if all(type(m) is DPSGD for m in mechs):
        if any(m.sigmas.numel() != n for m in mechs):
            return None
        return StackedDPSGD(mechs, n)
    return None


def may_stack(name: object) -> bool:
    """Whether runs with mechanism ``name`` can ever share a replica axis, decided from the name before anything is
    built (the runner plans with it): ``none`` and the correlated Gaussian family may (:func:`stack` decides on the
    built mechanisms), and so does ``dp_sgd``; any other registered mechanism class (``clip``, message mechanisms)
    never does. An unregistered name says yes: building it reports the error."""
    from privdl.mechanisms.base import MECHANISMS

    if not isinstance(name, str) or name not in MECHANISMS:
        return True
    cls = MECHANISMS.get(name)
    if isinstance(cls, type) and getattr(cls, "wraps_comm", False):
        return False
    return not isinstance(cls, type) or cls is NoPrivacy or cls is DPSGD or issubclass(cls, CorrelatedGaussian)


def need_signature(need: object) -> tuple:
    """What mechanisms must share to read the data in one access (see :class:`privdl.mechanisms.base.ClippedSum`)."""
    sig = getattr(need, "signature", None)
    return sig() if callable(sig) else (type(need).__name__,)


__all__ = ["StackedCorrelated", "StackedDPSGD", "may_stack", "need_signature", "stack"]
