"""Seed 004's CNN layers, made fast for the per-example paths (``torch.func.vmap`` over agents of ``torch.func.grad``
over a lot), where torch's own kernels are slow on CPU:

- :func:`mish`, Mish (Misra 2019) x·tanh(softplus(x)), evaluated as x·n/(n + 2) with n = eˣ(eˣ + 2) (one
  exponential instead of three transcendental functions), and its derivative
  mish′(x) = (n + 4x·eˣ(1 + eˣ)/(n + 2))/(n + 2) in the same way. Measured against float64 on [−100, 100], these are
  as accurate as ATen's float32 kernels (forward ≤ 2.3 ulp) and the derivative more so (max abs. error 1.9e-7
  against ATen's 9.7e-7). Without our own vmap rule torch.func would decompose Mish's backward into about ten
  elementwise passes; with it the backward is one batched evaluation of the formula;
- :func:`max_pool2d`, non-overlapping max pooling (kernel = stride, no padding). Under vmap over agents the
  agents' channels are pooled together by ATen's channels-last kernel, which for seed 004's lot (30 channels) is
  2.5× faster on CPU than its NCHW kernel, with the same values and the same argmax (ATen's own kernel); the
  backward scatters into the recorded positions.

Both are ``torch.autograd.Function`` s with vmap rules, first and second derivatives and forward-mode rules, so any
torch.func composition (per-example gradients, Hessians, jvp) works on them. The formulas make 2–3 fresh tensors
where ATen's kernels make one, so they pay off on huge pages (the privdl command's default,
``privdl.process_defaults``): a seed-004 run at one thread is 1.14× faster with them there, 0.96–1.08× on 4 KiB
pages. BENCHMARKS.md has the timings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: above this, eˣ would only round n/(n + 2) to 1 (float32 and float64 alike): the exponent is clamped there
_MISH_CLAMP = 20.0
_FAST_DTYPES = (torch.float32, torch.float64)


def _to_front(t: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
    """``t`` with its vmapped axis ``dim`` moved first (expanded to ``size`` where it has none)."""
    return t.unsqueeze(0).expand(size, *t.shape) if dim is None else t.movedim(dim, 0)


def _mish_values(x: torch.Tensor) -> torch.Tensor:
    if x.dtype not in _FAST_DTYPES:
        return F.mish(x)
    e = x.clamp(max=_MISH_CLAMP).exp_()
    n = e.add(2).mul_(e)  # eˣ(eˣ + 2) = (1 + eˣ)² − 1, so tanh(softplus(x)) = n/(n + 2)
    return n.div_(torch.add(n, 2, out=e)).mul_(x)  # e's memory reused: two fresh tensors in all


def _mish_grad_values(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """g·mish′(x)."""
    if x.dtype not in _FAST_DTYPES:
        return torch.ops.aten.mish_backward(g, x)
    e = x.clamp(max=_MISH_CLAMP).exp_()
    a = e.add(1).mul_(e)  # eˣ(1 + eˣ)
    n = e.add_(a)  # eˣ(eˣ + 2), in e's memory
    s = n + 2
    a.mul_(x).mul_(4).div_(s)
    return a.add_(n).div_(s).mul_(g)  # three fresh tensors in all (fresh memory costs page faults)


def _mish_derivatives(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mish′(x) = t + x·σ·(1 − t²) and mish″(x) = σ·(1 − t²)·(2 + x·(1 − σ − 2tσ)), t = tanh(softplus(x)),
    σ = sigmoid(x), in differentiable torch operations (for second and higher derivatives)."""
    t, s = torch.tanh(F.softplus(x)), torch.sigmoid(x)
    u = s * (1 - t * t)
    return t + x * u, u * (2 + x * (1 - s - 2 * t * s))


class _MishGrad(torch.autograd.Function):
    """g·mish′(x), batched by a vmap rule (ATen has none for Mish's backward)."""

    @staticmethod
    def forward(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return _mish_grad_values(g, x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def vmap(info, in_dims, g, x):
        return _MishGrad.apply(_to_front(g, in_dims[0], info.batch_size), _to_front(x, in_dims[1], info.batch_size)), 0

    @staticmethod
    def backward(ctx, gg):
        g, x = ctx.saved_tensors
        first, second = _mish_derivatives(x)
        return gg * first, gg * g * second

    @staticmethod
    def jvp(ctx, g_dot, x_dot):
        g, x = ctx.saved_tensors
        first, second = _mish_derivatives(x)
        return first * g_dot + g * second * x_dot


class _Mish(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _mish_values(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def vmap(info, in_dims, x):
        return _Mish.apply(x), in_dims[0]

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return _MishGrad.apply(g, x)

    @staticmethod
    def jvp(ctx, x_dot):
        (x,) = ctx.saved_tensors
        return _MishGrad.apply(x_dot, x)


def mish(x: torch.Tensor) -> torch.Tensor:
    """Mish, x·tanh(softplus(x)), for any shape; fast forward and backward under torch.func (module docstring)."""
    return _Mish.apply(x)


def _gather_windows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t (..., C, H, W) read at the flat positions ``index`` (..., C, h, w) of each H×W plane."""
    flat = t.reshape(*t.shape[:-2], -1)
    return flat.gather(-1, index.reshape(*index.shape[:-2], -1).expand(*flat.shape[:-1], -1)).reshape(index.shape)


class _PoolScatter(torch.autograd.Function):
    """The gradient of max pooling: g (..., C, h, w) put at the argmax positions ``index`` of planes H×W, zeros
    elsewhere (windows do not overlap, so every position receives at most one value)."""

    @staticmethod
    def forward(g: torch.Tensor, index: torch.Tensor, H: int, W: int) -> torch.Tensor:
        lead = index.shape[:-2]  # g's too: the vmap rule moves both batch axes first
        out = g.new_zeros(*lead, H * W)
        out.scatter_(-1, index.reshape(*lead, -1), g.reshape(*lead, -1))
        return out.reshape(*lead, H, W)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[1])
        ctx.save_for_forward(inputs[1])
        ctx.planes = tuple(inputs[2:])

    @staticmethod
    def vmap(info, in_dims, g, index, H, W):
        g, index = _to_front(g, in_dims[0], info.batch_size), _to_front(index, in_dims[1], info.batch_size)
        return _PoolScatter.apply(g, index, H, W), 0

    @staticmethod
    def backward(ctx, gg):
        (index,) = ctx.saved_tensors
        return _gather_windows(gg, index), None, None, None

    @staticmethod
    def jvp(ctx, g_dot, index_dot, H_dot, W_dot):
        (index,) = ctx.saved_tensors
        return _PoolScatter.apply(g_dot, index, *ctx.planes)


#: channels (all axes between the first and the planes, merged) from which the channels-last kernel is the faster
_CHANNELS_LAST_FROM = 16


def _pool_values_and_argmax(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and flat argmax positions of the k×k windows of x (..., H, W). The leading axes are taken in memory
    order and all but the outermost merged into channels (under vmap over agents, seed 004's lot is 3·agents
    channels of each of its examples), and where there are enough channels the planes are pooled by ATen's
    channels-last kernel after one copy to that order."""
    lead, (H, W) = x.shape[:-2], x.shape[-2:]
    order = sorted(range(len(lead)), key=lambda d: -x.stride(d))  # outermost first; a view when x is dense
    xp = x.permute(*order, -2, -1)
    x4 = xp.reshape(xp.shape[0], -1, H, W)
    if x4.shape[1] >= _CHANNELS_LAST_FROM:
        x4 = x4.contiguous(memory_format=torch.channels_last)
    y, index = F.max_pool2d(x4, k, return_indices=True)
    back = [order.index(d) for d in range(len(lead))] + [len(lead), len(lead) + 1]
    shape = (*xp.shape[:-2], *y.shape[-2:])
    # the values in the caller's order (forward-mode AD wants an output laid out like its tangent); the positions,
    # which only the backward reads through reshape, stay a view
    return y.reshape(shape).permute(*back).contiguous(), index.reshape(shape).permute(*back)


class _MaxPool(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _pool_values_and_argmax(x, k)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, _ = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])
        ctx.save_for_forward(output[1])
        ctx.planes = tuple(x.shape[-2:])

    @staticmethod
    def vmap(info, in_dims, x, k):
        # every axis but the planes is a batch axis here, so the vmapped one stays where it is (no copy)
        return _MaxPool.apply(x, k), (in_dims[0], in_dims[0])

    @staticmethod
    def backward(ctx, g, g_index):
        (index,) = ctx.saved_tensors
        return _PoolScatter.apply(g, index, *ctx.planes), None

    @staticmethod
    def jvp(ctx, x_dot, k_dot):
        (index,) = ctx.saved_tensors
        return _gather_windows(x_dot, index), None


def max_pool2d(x: torch.Tensor, k: int) -> torch.Tensor:
    """``F.max_pool2d(x, k)`` (windows k×k, stride k, no padding) for x (..., C, H, W), with its values and argmax
    but ATen's channels-last kernel (module docstring). Windows that do not fit at the right and bottom edges are
    dropped, as in ``F.max_pool2d``."""
    if x.ndim < 3:
        raise ValueError(f"max_pool2d needs (..., C, H, W), got shape {tuple(x.shape)}")
    return _MaxPool.apply(x, int(k))[0]


__all__ = ["max_pool2d", "mish"]
