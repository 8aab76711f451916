"""Stacking mechanisms of independent runs onto one row axis (the replicas of a sweep, DESIGN.md).

Replica r's rows r·n … r·n + n − 1 get exactly its own mechanism's transformation with its own keys: the same
own draws u (keyed by replica r's root) and the same shared draws s as its single run. The correlated part is
combined as one sparse product F s over every replica, so a replica agrees with its single run to rounding (the
single run adds the same terms elementwise).

Stackable today: ``none`` and the correlated Gaussian family (gaussian_ldp, ldp, decor, whisper/corn, covariance)
with batch clipping, in any mix; or members of that family that all clip per example with the same need (clip,
batch, sampling) — the engine then computes every row's clipped sum in one access and the noise is added to the sum
before dividing by B. :func:`stack` returns None for anything else; the runner then runs those singly.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.keys import fold, normal
from privdl.mechanisms.base import Access, GradientMechanism, MechanismEnv, NoPrivacy, clip_rows
from privdl.mechanisms.correlated import CorrelatedGaussian


class StackedCorrelated(GradientMechanism):
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
            draw_keys = np.array([env.keys.shared(f"{env.scope}:{label}:{j}", members, r)
                                  for label, j, members in noise.draw_keys], dtype=np.uint64)
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
        rows = value.shape[0]
        if not (rows == self.calls.numel() and access.all_rows):
            raise ValidationError("stacked replicas take every row's own gradient in one access")
        if self.silent:
            return value
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

    def member_accesses(self, r: int) -> torch.Tensor:
        return self.accesses()[r * self.n:(r + 1) * self.n]


def stack(mechs: Sequence[GradientMechanism], n: int) -> GradientMechanism | None:
    """One mechanism for R replicas of ``n`` rows each, or None when these mechanisms cannot be stacked."""
    if all(type(m) is NoPrivacy or isinstance(m, CorrelatedGaussian) for m in mechs):
        if any(isinstance(m, CorrelatedGaussian) and m.network_.n != n for m in mechs):
            return None
        if len({need_signature(m.need) for m in mechs}) != 1:  # batch and per-example clipping read differently
            return None
        return StackedCorrelated(mechs, n)
    return None


def may_stack(name: object) -> bool:
    """Whether runs with mechanism ``name`` can ever share a replica axis, decided from the name before anything is
    built (the runner plans with it): ``none`` and the correlated Gaussian family may (:func:`stack` decides on the
    built mechanisms); any other registered mechanism class (``dp_sgd``, ``clip``) never does. An unregistered name
    says yes: building it reports the error."""
    from privdl.mechanisms.base import MECHANISMS

    if not isinstance(name, str) or name not in MECHANISMS:
        return True
    cls = MECHANISMS.get(name)
    return not isinstance(cls, type) or cls is NoPrivacy or issubclass(cls, CorrelatedGaussian)


def need_signature(need: object) -> tuple:
    """What mechanisms must share to read the data in one access (see :class:`privdl.mechanisms.base.ClippedSum`)."""
    sig = getattr(need, "signature", None)
    return sig() if callable(sig) else (type(need).__name__,)


__all__ = ["StackedCorrelated", "may_stack", "need_signature", "stack"]
