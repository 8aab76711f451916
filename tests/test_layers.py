"""privdl's fast layers for seed 004's CNN (``privdl.tasks.layers``) against torch's own: Mish's values and
derivatives against float64 truth and torch's Mish under autograd; max pooling's values, argmax (ties included),
gradients, second derivatives and forward mode against ``F.max_pool2d``, on both of its paths."""

from __future__ import annotations

import pytest
import torch

from privdl.tasks.layers import _CHANNELS_LAST_FROM, max_pool2d, mish

F = torch.nn.functional


def test_mish_float32_is_as_accurate_as_atens_kernels():
    """Against float64 truth on [−100, 100] (and densely around mish′'s zero at x ≈ −1.19): the forward within 2.5
    ulp of |mish| everywhere (ATen's float32 kernel: 2.2) and the derivative within 2.5e-7 absolute (ATen's: 9.7e-7);
    float64 agrees with ATen's float64 to 1e-14; ±inf and nan behave as ATen's forward."""
    x64 = torch.cat([torch.linspace(-100, 100, 400_001, dtype=torch.float64),
                     torch.linspace(-1.3, -1.1, 20_001, dtype=torch.float64)])
    x = x64.float()
    truth = F.mish(x.double())
    ones = torch.ones_like(x.double())
    d_truth = torch.ops.aten.mish_backward(ones, x.double())
    ulp = torch.finfo(torch.float32).eps * truth.abs().clamp_min(1e-30)
    assert ((mish(x).double() - truth).abs() / ulp).max() < 2.5
    xr = x.clone().requires_grad_()
    d, = torch.autograd.grad(mish(xr), xr, torch.ones_like(x))
    assert (d.double() - d_truth).abs().max() < 2.5e-7
    torch.testing.assert_close(mish(x64), F.mish(x64), rtol=1e-14, atol=1e-14)
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -200.0, 0.0])
    torch.testing.assert_close(mish(special), F.mish(special), equal_nan=True)


def test_mish_matches_torch_mish_in_every_derivative_under_torch_func():
    """First and second derivatives against torch's Mish differentiated by autograd: plain autograd, per-example
    gradients under nested vmap, Hessians through forward mode — including far tails where softplus saturates."""
    x = torch.randn(4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    x[0, :3] = torch.tensor([50.0, -50.0, 0.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(mish, (x.clone().requires_grad_(),), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(mish, (x.clone().requires_grad_(),))
    xr, g, gg = x.clone().requires_grad_(), torch.randn_like(x), torch.randn_like(x)
    ours, = torch.autograd.grad(mish(xr), xr, g, create_graph=True)
    ref, = torch.autograd.grad(F.mish(xr), xr, g, create_graph=True)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.autograd.grad(ours, xr, gg)[0], torch.autograd.grad(ref, xr, gg)[0],
                               rtol=1e-12, atol=1e-14)
    w = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    per_example = [torch.func.vmap(torch.func.vmap(torch.func.grad(lambda w, xi, act=act: act(w * xi).sum()),
                                                   (None, 0)), (None, 0))(w, x.reshape(2, 2, 7)) for act in (mish, F.mish)]
    torch.testing.assert_close(per_example[0], per_example[1], rtol=1e-12, atol=1e-14)
    hessians = [torch.func.vmap(torch.func.hessian(lambda w, xi, act=act: act(w * xi).sum()), (None, 0))(w, x)
                for act in (mish, F.mish)]
    torch.testing.assert_close(hessians[0], hessians[1], rtol=1e-12, atol=1e-13)


def _tied(*shape: int) -> torch.Tensor:
    """Values on a coarse grid, so that many windows hold tied maxima (ATen takes the first in scan order)."""
    return torch.randint(-2, 3, shape, generator=torch.Generator().manual_seed(0)).double()


@pytest.mark.parametrize("channels", [2, 2 * _CHANNELS_LAST_FROM])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.exact
def test_max_pool_values_argmax_and_gradients_are_atens(channels, k):
    """Values and the gradient (which routes to ATen's argmax, ties included) equal F.max_pool2d's bit for bit, on
    the plain and the channels-last path, for planes the windows do not divide (9 × 7), and for an input whose
    memory order is not its axis order (as vmap hands it over). Exact by construction: a maximum selects one of its
    inputs (no rounding) and its gradient routes each output's gradient to one input."""
    base = _tied(channels, 5, 9, 7)
    for x in (base, base.transpose(0, 1).contiguous().transpose(0, 1)):
        assert torch.equal(max_pool2d(x, k), F.max_pool2d(x, k))
        g = torch.randn(F.max_pool2d(x, k).shape, dtype=x.dtype)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours, = torch.autograd.grad(max_pool2d(xa, k), xa, g)
        ref, = torch.autograd.grad(F.max_pool2d(xb, k), xb, g)
        assert torch.equal(ours, ref)


@pytest.mark.exact
def test_max_pool_under_torch_func_and_higher_derivatives():
    """Per-example gradients under vmap (the vmapped axis inside the channels), Hessians through a Mish network,
    forward mode and second derivatives by gradcheck, against F.max_pool2d; and a clear error for a flat input."""
    x = torch.randn(6, 3, 8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.randn(3, 1, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    per_example = [torch.func.vmap(torch.func.grad(lambda w, xi, pool=pool: (pool(w * xi, 2) ** 2).sum()),
                                   (None, 0))(w, x) for pool in (max_pool2d, F.max_pool2d)]
    torch.testing.assert_close(per_example[0], per_example[1], rtol=0, atol=0)
    rows = torch.randn(20, 3, 1, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    batched = [torch.func.vmap(lambda w, pool=pool: torch.func.grad(
        lambda w: (mish(pool(mish(w * x), 2)) ** 2).sum())(w))(rows) for pool in (max_pool2d, F.max_pool2d)]
    torch.testing.assert_close(batched[0], batched[1], rtol=1e-13, atol=1e-13)
    hessians = [torch.func.hessian(lambda w, pool=pool: (pool(mish(w * x[0]), 2) ** 2).sum())(w)
                for pool in (max_pool2d, F.max_pool2d)]
    torch.testing.assert_close(hessians[0], hessians[1], rtol=1e-12, atol=1e-12)
    xr = torch.randn(2, 3, 6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: max_pool2d(t, 2), (xr,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(lambda t: max_pool2d(t, 2), (xr,))
    with pytest.raises(ValueError, match="C, H, W"):
        max_pool2d(torch.zeros(4, 4), 2)
