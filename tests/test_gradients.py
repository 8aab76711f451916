"""Per-example clipping through the per-layer registry (ghost clipping for Linear and Conv2d by layer type, any
architecture built from them), checked against per-example gradients from torch.func; the generic path for
everything else; registering a rule for a new layer type."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privdl.data.datasets import Dataset
from privdl.gradients import GHOST_RULES, clipped_example_sum, ghost_clipped_sum, register_ghost, supports_ghost
from privdl.tasks.models import ModuleModel
from privdl.tasks.supervised import SupervisedTask
from tests.conftest import assert_ghost_matches_per_example, draw_lot


def _task(module: torch.nn.Module, shape=(1, 9, 9), n=3, classes=4, l2=0.0) -> SupervisedTask:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, *shape)).astype(np.float32)
    y = rng.integers(0, classes, 60)
    ds = Dataset("toy", X, y, X[:4], y[:4], classes)
    return SupervisedTask("toy", ds, ModuleModel("toy", module, shape), n, partition_name="iid", partition_params={},
                          batch_size=8, l2=l2, zero_init=False, rng=np.random.default_rng(1), dtype=torch.float64,
                          eval_train_samples=5)


class StridedNet(torch.nn.Module):
    """Not the paper's CNN: two convolutions with stride, padding, dilation and no bias, pooling, two linears."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 3, 3, stride=2, padding=1)
        self.c2 = torch.nn.Conv2d(3, 2, 2, dilation=2, bias=False)
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 1 * 1, 5), torch.nn.Tanh(),
                                        torch.nn.Linear(5, 4, bias=False))

    def forward(self, x):
        return self.head(torch.nn.functional.max_pool2d(torch.relu(self.c2(torch.relu(self.c1(x)))), 2))


@pytest.mark.parametrize("clip", [0.2, None])
def test_ghost_clipping_matches_per_example_gradients_on_any_linear_conv_architecture(clip):
    assert_ghost_matches_per_example(_task(StridedNet()), seed=3, rate=0.4, spread=0.5, clip=clip)


def test_unregistered_parameterised_layers_fall_back_to_the_generic_path():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.GroupNorm(1, 2), torch.nn.Flatten(),
                              torch.nn.Linear(2 * 7 * 7, 4))
    assert not supports_ghost(_task(net))
    assert not supports_ghost(_task(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(81, 4)), l2=0.1))
    grouped = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 3, groups=2), torch.nn.Flatten(), torch.nn.Linear(98, 4))
    assert not supports_ghost(_task(grouped, shape=(2, 9, 9)))


class Scale(torch.nn.Module):
    """A layer privdl has no rule for: y = a ⊙ x (a learnable vector)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.ones(k))

    def forward(self, x):
        return self.a * x


def _scale_rule(layer, h, d):
    g = h * d  # per-example ∂/∂a of Σ_out δ·(a ⊙ h)
    return (g * g).sum(-1), lambda w: [torch.einsum("rb,rbk->rk", w, g)]


def test_a_rule_registered_for_a_new_layer_type_is_used():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(81, 6), Scale(6), torch.nn.Tanh(),
                              torch.nn.Linear(6, 4))
    task = _task(net)
    assert not supports_ghost(task)
    register_ghost(Scale, _scale_rule)
    try:
        assert supports_ghost(task)
        gen = torch.Generator().manual_seed(5)
        x = task.init_params(gen).expand(3, -1).clone() + 0.3 * torch.randn(3, task.dim, generator=gen,
                                                                              dtype=torch.float64)
        batch, mask = draw_lot(task, torch.full((3,), 0.5, dtype=torch.float64))
        assert torch.allclose(ghost_clipped_sum(task, x, batch, mask, 0.5),
                              clipped_example_sum(task, x, batch, mask, 0.5), atol=1e-10)
    finally:
        GHOST_RULES.pop(Scale)


@pytest.mark.parametrize("filters", [2, 8])
def test_small_cnn_per_example_clipping_is_torchs_mish_network(filters):
    """Seed 004's CNN with privdl's Mish and max-pool gives the clipped lot sums of the same network written with
    torch's (per-example gradients by torch.func on the latter): the faster layers change no number beyond rounding.
    With 8 filters the 3 rows' 24 channels take the channels-last pooling path, with 2 the plain one."""
    from privdl.tasks import models

    class TorchMishCNN(models.SmallCNN):
        def forward(self, x):
            h = torch.nn.functional.max_pool2d(torch.nn.functional.mish(self.conv(x)), 2)
            return self.fc2(torch.nn.functional.mish(self.fc1(h.flatten(1))))

    ours, ref = _task(models.SmallCNN(1, 9, filters, 3, 6, 4)), _task(TorchMishCNN(1, 9, filters, 3, 6, 4))
    x = ours.init_params(torch.Generator().manual_seed(0)).expand(3, -1).clone()
    x += 0.3 * torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    batch, mask = draw_lot(ours, torch.full((3,), 0.5, dtype=torch.float64), seed=2)
    assert mask.sum() > 10
    torch.testing.assert_close(ghost_clipped_sum(ours, x, batch, mask, 0.3),
                               clipped_example_sum(ref, x, batch, mask, 0.3, 4), rtol=1e-10, atol=1e-12)


@pytest.mark.exact
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_closed_forms_are_the_textbook_residuals_bit_for_bit(dtype):
    """Softmax regression's closed-form gradient and clipped sum take the residuals softmax(z) − onehot(y) (the
    engine subtracts 1 at each example's class in place): the same bits as the formula written out with
    F.one_hot, z = X Wᵀ + b, in float32 and float64, for mini-batches and padded lots of other shapes."""
    from privdl.tasks.models import linear

    f, k, n = 5, 4, 3
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, f)).astype(np.float32)
    y = rng.integers(0, k, 40)
    ds = Dataset("toy", X, y, X[:4], y[:4], k)
    task = SupervisedTask("softmax", ds, linear(f, k), n, partition_name="iid", partition_params={}, batch_size=7,
                          l2=0.0, zero_init=False, rng=np.random.default_rng(1), dtype=dtype, eval_train_samples=5)
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(n, task.dim, generator=gen, dtype=torch.float64) * 3).to(dtype)
    W, b = x[:, : k * f].reshape(n, k, f), x[:, k * f:]

    def residuals(Xb, yb):
        z = torch.baddbmm(b[:, None, :], Xb, W.transpose(1, 2))
        return torch.softmax(z, dim=-1) - torch.nn.functional.one_hot(yb, k).to(dtype)

    for B in (7, 1, 12, 7):  # shapes change and come back (the engine keeps its −1 tensor per shape)
        index = torch.randint(0, 13, (n, B), generator=gen)
        Xb, yb = task.gather(torch.arange(n), index)
        r = residuals(Xb, yb)
        rb = r / B
        want = torch.cat([torch.bmm(rb.transpose(1, 2), Xb).reshape(n, k * f), rb.sum(dim=1)], dim=1)
        assert torch.equal(task.batched_grad(x, (Xb, yb)), want)
        mask = (torch.rand(n, B, generator=gen) < 0.7).to(dtype)
        sq = (r * r).sum(-1) * (torch.linalg.vector_norm(Xb, dim=-1) ** 2 + 1.0)
        c = mask * torch.clamp(0.5 / sq.sqrt().clamp_min(torch.finfo(dtype).tiny), max=1.0)
        rc = r * c[..., None]
        want = torch.cat([torch.bmm(rc.transpose(1, 2), Xb).reshape(n, k * f), rc.sum(dim=1)], dim=1)
        assert torch.equal(task.clipped_sum(x, (Xb, yb), mask, 0.5), want)
