"""Models on flat parameter vectors: a ``torch.nn.Module`` evaluated at θ (d,) with ``functional_call``.

Flat vectors keep the agent axis trivial (x is (n, d)): clipping, noise and mixing act on rows. The parameter layout
is the module's ``named_parameters`` order (for a linear model: the weight (out × in), then the bias).
"""

from __future__ import annotations

import math

import torch

from privdl.tasks.layers import max_pool2d, mish


def split_blocks(theta: torch.Tensor, shapes: tuple[tuple[int, ...], ...]) -> tuple[torch.Tensor, ...]:
    """Views of the consecutive blocks of flat parameter vectors θ (..., d) with the given shapes (..., *shape)."""
    out, k, lead = [], 0, theta.shape[:-1]
    for s in shapes:
        size = math.prod(s)
        out.append(theta[..., k:k + size].reshape(*lead, *s))
        k += size
    return tuple(out)


#: Layers whose output for one example depends on the other examples of the batch (or on hidden randomness):
#: per-example gradients under ``vmap`` are undefined or wrong for them.
UNSUPPORTED_LAYERS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.Dropout, torch.nn.Dropout2d,
                      torch.nn.AlphaDropout, torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)


def check_per_example_support(module: torch.nn.Module) -> None:
    """Refuse models with layers that per-example gradients do not support, naming the first such layer."""
    from privdl.errors import ValidationError

    for name, layer in module.named_modules():
        if isinstance(layer, UNSUPPORTED_LAYERS):
            kind = type(layer).__name__
            hint = " (use GroupNorm instead)" if "BatchNorm" in kind else ""
            raise ValidationError(f"layer {name or '<root>'!r} ({kind}) does not support per-example gradients{hint}")
    for name, buf in module.named_buffers():
        raise ValidationError(f"buffer {name!r}: models with running statistics do not support per-example gradients")


class ModuleModel:
    """A ``torch.nn.Module`` evaluated at a flat parameter vector with ``torch.func.functional_call`` (so vmap can
    batch it over agents and examples). ``squeeze`` drops a trailing output axis of size 1 (binary logits)."""

    def __init__(self, name: str, module: torch.nn.Module, input_shape: tuple[int, ...], *,
                 squeeze: bool = False) -> None:
        check_per_example_support(module)
        self.name, self.module, self.input_shape, self.squeeze = name, module, tuple(input_shape), squeeze
        self.names = [k for k, _ in module.named_parameters()]
        self.shapes = tuple(tuple(p.shape) for _, p in module.named_parameters())

    @property
    def dim(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def split(self, theta: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return split_blocks(theta, self.shapes)

    #: a fixed law for the initial parameters instead of the layers' own: (low, high) of a uniform (DLG's ±0.5)
    uniform_init: tuple[float, float] | None = None

    def init(self, generator: torch.Generator, dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
        """The layers' own default initialisation (or ``uniform_init``), drawn from ``generator`` (reproducible)."""
        if zero:
            return torch.zeros(self.dim, dtype=dtype)
        if self.uniform_init is not None:
            lo, hi = self.uniform_init
            return (lo + (hi - lo) * torch.rand(self.dim, generator=generator, dtype=torch.float64)).to(dtype)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for layer in self.module.modules():
                if hasattr(layer, "reset_parameters") and layer is not self.module:
                    layer.reset_parameters()
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).to(dtype)

    def predict(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return self.predict_blocks(self.split(theta), X)

    def predict_blocks(self, blocks: tuple[torch.Tensor, ...], X: torch.Tensor) -> torch.Tensor:
        X = X.reshape(X.shape[0], *self.input_shape).to(blocks[0].dtype)
        out = torch.func.functional_call(self.module, dict(zip(self.names, blocks)), (X,))
        return out.squeeze(-1) if self.squeeze else out


def linear(n_features: int, n_outputs: int) -> ModuleModel:
    """Affine map (weights then bias); n_outputs = 1 for logistic regression (its logits are squeezed)."""
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(n_features, n_outputs))
    return ModuleModel("linear", module, (n_features,), squeeze=n_outputs == 1)


def mlp(n_features: int, hidden: tuple[int, ...], n_outputs: int) -> ModuleModel:
    """Fully connected ReLU network, e.g. 784 → 128 → 10 (seed 001's shallow network)."""
    sizes = (n_features, *hidden, n_outputs)
    layers: list[torch.nn.Module] = [torch.nn.Flatten()]
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if k < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return ModuleModel("mlp", torch.nn.Sequential(*layers), (n_features,), squeeze=n_outputs == 1)


class SmallCNN(torch.nn.Module):
    """Seed 004's MNIST model (after DiNNO): conv k×k with ``filters`` channels, Mish, 2×2 max-pool, a hidden linear
    layer of ``width`` units with Mish, a linear classifier."""

    def __init__(self, channels: int = 1, side: int = 28, filters: int = 3, kernel: int = 5, width: int = 64,
                 classes: int = 10) -> None:
        super().__init__()
        pooled = (side - kernel + 1) // 2
        self.conv = torch.nn.Conv2d(channels, filters, kernel)
        self.fc1 = torch.nn.Linear(filters * pooled * pooled, width)
        self.fc2 = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = max_pool2d(mish(self.conv(x)), 2)
        h = mish(self.fc1(h.flatten(1)))
        return self.fc2(h)


class SigmoidCNN(torch.nn.Module):
    """Seed 002 §5.2's CNN (the DLG paper's LeNet variant): three 5×5 convolutions with 12 filters and sigmoid
    activations (padding 2; strides 2, 2, 1), then one linear layer to the classes. Smooth everywhere (sigmoid), so
    gradient-inversion attacks can differentiate its gradients."""

    def __init__(self, channels: int = 1, side: int = 28, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, 12, 5, padding=2, stride=2)
        self.conv2 = torch.nn.Conv2d(12, 12, 5, padding=2, stride=2)
        self.conv3 = torch.nn.Conv2d(12, 12, 5, padding=2, stride=1)
        out = (side + 1) // 2
        out = (out + 1) // 2
        self.fc = torch.nn.Linear(12 * out * out, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.conv1(x))
        h = torch.sigmoid(self.conv2(h))
        h = torch.sigmoid(self.conv3(h))
        return self.fc(h.flatten(1))


def _conv_block(c_in: int, c_out: int, pool: bool = False, groups: int = 32) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                                     torch.nn.GroupNorm(min(groups, c_out), c_out), torch.nn.ReLU()]
    if pool:
        layers.append(torch.nn.MaxPool2d(2))
    return torch.nn.Sequential(*layers)


class _Residual(torch.nn.Module):
    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResNet9(torch.nn.Module):
    """ResNet-9 (Page's DAWNBench network) with GroupNorm in place of BatchNorm, as seed 004 uses on CIFAR-100
    (GroupNorm keeps examples independent, so per-example gradients are defined)."""

    def __init__(self, channels: int = 3, classes: int = 100, width: int = 64, groups: int = 32) -> None:
        super().__init__()
        w = width
        self.net = torch.nn.Sequential(
            _conv_block(channels, w, groups=groups), _conv_block(w, 2 * w, pool=True, groups=groups),
            _Residual(torch.nn.Sequential(_conv_block(2 * w, 2 * w, groups=groups),
                                          _conv_block(2 * w, 2 * w, groups=groups))),
            _conv_block(2 * w, 4 * w, pool=True, groups=groups), _conv_block(4 * w, 8 * w, pool=True, groups=groups),
            _Residual(torch.nn.Sequential(_conv_block(8 * w, 8 * w, groups=groups),
                                          _conv_block(8 * w, 8 * w, groups=groups))),
            torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8 * w, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def cnn(input_shape: tuple[int, ...], n_outputs: int, *, filters: int = 3, kernel: int = 5,
        width: int = 64) -> ModuleModel:
    """The small CNN of seed 004 for (C, H, H) or (H, H) images."""
    shape = tuple(input_shape) if len(input_shape) == 3 else (1, *input_shape)
    return ModuleModel("cnn", SmallCNN(shape[0], shape[1], filters, kernel, width, n_outputs), shape)


def sigmoid_cnn(input_shape: tuple[int, ...], n_outputs: int, *, init: str = "dlg") -> ModuleModel:
    """Seed 002's CNN for (C, H, H) or (H, H) images. ``init = "dlg"``: every parameter uniform on [−0.5, 0.5], as
    the DLG authors initialise this network (with PyTorch's default initialisation the sigmoids sit near ½ and the
    gradient barely depends on the input: gradient inversion then fails); ``"default"``: the layers' own."""
    if init not in ("dlg", "default"):
        raise ValueError(f"sigmoid_cnn init must be 'dlg' or 'default', got {init!r}")
    shape = tuple(input_shape) if len(input_shape) == 3 else (1, *input_shape)
    model = ModuleModel("sigmoid_cnn", SigmoidCNN(shape[0], shape[1], n_outputs), shape)
    model.uniform_init = (-0.5, 0.5) if init == "dlg" else None
    return model


def resnet9(input_shape: tuple[int, ...], n_outputs: int, *, width: int = 64, groups: int = 32) -> ModuleModel:
    shape = tuple(input_shape) if len(input_shape) == 3 else (1, *input_shape)
    return ModuleModel("resnet9", ResNet9(shape[0], n_outputs, width, groups), shape)
