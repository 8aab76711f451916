"""Supervised tasks on partitioned datasets: logistic regression, softmax regression, MLP (SPEC §3, §7).

Agent data lives in padded tensors X (n, m_max, ...), y (n, m_max) with true sizes ``counts``; the engine's keyed
draws pick positions in each agent's own data (:class:`privdl.tasks.base.Task`), all rows in one gather.
:meth:`SupervisedTask.to` moves the data to an accelerator; positions are still drawn on the CPU from the keyed
draws (``counts`` and the offsets stay there), so a run draws the same lots on every device.
"""

from __future__ import annotations

import copy
from typing import Annotated, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from privdl.data import DATASETS, PARTITIONERS, load_dataset, partition
from privdl.data.datasets import Dataset
from privdl.errors import ValidationError
from privdl.keys import Draws
from privdl.registry import OneOf, Registry, one_of
from privdl.tasks.base import TASKS, Batch, Task, consensus_distance
from privdl.tasks.models import ModuleModel, cnn, linear, mlp, resnet9, sigmoid_cnn


FILE_DATASETS = ("a9a", "mnist", "mnist_t10k", "fashion_mnist", "cifar100")
Dataset_ = Annotated[str, OneOf(DATASETS)]
Partition_ = Annotated[str, OneOf(PARTITIONERS)]


class SupervisedTask(Task):
    """A classification task: a flat model, a loss, and a dataset split over ``n`` agents."""

    def __init__(self, name: str, dataset: Dataset, model: ModuleModel, n: int, *, partition_name: str,
                 partition_params: dict, batch_size: int, l2: float, zero_init: bool, rng: np.random.Generator,
                 dtype: torch.dtype, eval_train_samples: int = 5000, grad_norm: bool = False) -> None:
        if batch_size < 1:
            raise ValidationError(f"batch_size must be >= 1, got {batch_size}")
        if l2 < 0:
            raise ValidationError(f"l2 must be >= 0, got {l2}")
        self.name, self.dataset, self.model, self.n = name, dataset, model, n
        self.dim, self.batch_size, self.l2, self.zero_init, self.dtype = model.dim, batch_size, l2, zero_init, dtype
        self.grad_norm = bool(grad_norm)
        self.binary = model.shapes[-1] == (1,)
        if self.binary and not model.squeeze:
            raise ValidationError(f"model {model.name!r} has one output but does not squeeze it (binary logits)")
        self.parts = partition(partition_name, dataset.y_train, n, rng, **partition_params)
        counts = np.array([len(p) for p in self.parts])
        m_max = counts.max()
        X = np.zeros((n, m_max, *dataset.feature_shape), dtype=np.float32)
        y = np.zeros((n, m_max), dtype=np.int64)
        for i, p in enumerate(self.parts):
            X[i, : len(p)] = dataset.X_train[p]
            y[i, : len(p)] = dataset.y_train[p]
        self.X = torch.as_tensor(X, dtype=dtype)
        self.y = torch.as_tensor(y)
        self._counts = torch.as_tensor(counts)
        # flat views for one index_select per batch (much faster than 2-D advanced indexing)
        self._X_flat = self.X.reshape(n * m_max, -1)
        if bool(((self._X_flat == 0) | (self._X_flat == 1)).all()):
            # binary features (a9a): gather bytes and convert after, 4-8x less memory traffic per batch
            self._X_flat = self._X_flat.to(torch.uint8)
        self._y_flat = self.y.reshape(-1)
        self._offsets = torch.arange(n) * int(m_max)
        self._last_columns: tuple | None = None  # _columns' last agents and their columns
        self.X_test = torch.as_tensor(dataset.X_test, dtype=dtype)
        self.y_test = torch.as_tensor(dataset.y_test)
        sub = rng.permutation(len(dataset.y_train))[:eval_train_samples]
        self.X_train_eval = torch.as_tensor(dataset.X_train[sub], dtype=dtype)
        self.y_train_eval = torch.as_tensor(dataset.y_train[sub])

    # ---- model & loss ---------------------------------------------------------------------------------------
    def init_params(self, generator: torch.Generator) -> torch.Tensor:
        return self.model.init(generator, self.dtype, zero=self.zero_init)

    @property
    def counts(self) -> torch.Tensor:
        return self._counts

    def _data_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.binary:
            return F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype))
        return F.cross_entropy(logits, y)

    def data_loss_sum(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Σ over the batch of the data loss (no L2 term): what ghost clipping differentiates per example."""
        if self.binary:
            return F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype), reduction="sum")
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")

    def loss(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.block_loss(self.model.split(theta), X, y)

    def blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.model.split(x)

    def block_loss(self, blocks: tuple[torch.Tensor, ...], X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self._data_loss(self.model.predict_blocks(blocks, X), y)
        if self.l2:
            out = out + 0.5 * self.l2 * sum((b * b).sum() for b in blocks)
        return out

    def to(self, device: str | torch.device) -> "SupervisedTask":
        """Move the data (training, test and evaluation tensors) to ``device``; returns self."""
        device = torch.device(device)
        for name in ("X", "y", "X_test", "y_test", "X_train_eval", "y_train_eval"):
            if getattr(self, name) is not None:  # a restricted copy (restrict) has no training-evaluation set
                setattr(self, name, getattr(self, name).to(device))
        # the flat views share X's and y's storage (unless X is gathered as bytes): keep one copy on the device
        self._X_flat = (self.X.reshape(self._X_flat.shape) if self._X_flat.dtype == self.X.dtype
                        else self._X_flat.to(device))
        self._y_flat = self.y.reshape(-1)
        self.device = device
        return self

    def restrict(self, agents: Sequence[int]) -> "SupervisedTask":
        """A copy holding only ``agents``' training examples (the other agents' rows of the data and the rest of the
        training set are dropped; the test set, for metrics, is kept); it gathers only for those agents."""
        out = copy.copy(self)
        out.model = copy.deepcopy(self.model)  # its own module: torch.func transforms are not thread-safe on one
        held = torch.as_tensor(sorted(int(a) for a in agents), dtype=torch.int64)
        m_max = self.X.shape[1]
        out.X, out.y = self.X.index_select(0, held).clone(), self.y.index_select(0, held).clone()
        flat = out.X.reshape(len(held) * m_max, -1)
        out._X_flat = flat.to(torch.uint8) if self._X_flat.dtype == torch.uint8 else flat
        out._y_flat = out.y.reshape(-1)
        out._offsets = torch.full((self.n,), -(1 << 40), dtype=torch.int64)  # another agent's: out of range
        out._offsets[held] = torch.arange(len(held)) * int(m_max)
        out.X_train_eval = out.y_train_eval = None
        out.dataset = copy.copy(self.dataset)
        out.dataset.X_train, out.dataset.y_train = self.dataset.X_train[:0], self.dataset.y_train[:0]
        return out

    def sample(self, draws: Draws, agents: torch.Tensor) -> Batch:
        """:meth:`Task.sample` (example ⌊u·m_agent⌋ for each keyed uniform u), gathered as :meth:`gather` does, with
        the rows' counts and offsets taken once for the agents of consecutive accesses (:meth:`_columns`). The flat
        positions ⌊u·count⌋ + offset come from the keys as a function of the uniforms (``Draws.uniform(then=)``):
        a block of counters at once when the keys draw ahead — elementwise integer arithmetic on the same products
        (u·count in float64 is correctly rounded wherever it is computed), so the same indices."""
        flat = draws.uniform(self.batch_size, then=self._columns(agents))
        return self._take(flat, *flat.shape)

    def _columns(self, agents: torch.Tensor) -> tuple:
        """(f, f) with f(u) = ⌊u·count⌋ + offset for the agents' example counts (float64) and offsets (int64) in the
        flat data as (m, 1) columns: ``Draws.uniform``'s ``then`` (f is its own token). Kept with a copy of the
        agents and reused while an access asks for the same agents (the held frame: every round) of the same tables
        (a restricted copy has its own offsets); the last few agent sets are kept by value, so accesses that
        alternate between them keep their tokens (and the keys' blocks drawn ahead)."""
        last = self._last_columns
        if (last is not None and last[1] is self._counts and last[2] is self._offsets
                and agents.dtype == torch.int64 and agents.shape == last[0].shape
                and torch.equal(agents.cpu(), last[0])):
            return last[3]
        agents = agents.cpu()
        known = getattr(self, "_known_columns", None)
        if known is None or known[0] is not self._counts or known[1] is not self._offsets or len(known[2]) >= 64:
            known = self._known_columns = (self._counts, self._offsets, {})
        key = (str(agents.dtype), tuple(agents.shape), agents.numpy().tobytes())
        then = known[2].get(key)
        if then is None:
            # counts as float64, the dtype u·count is computed in anyway (exact below 2⁵³): no cast in every product
            counts = self._counts.index_select(0, agents).to(torch.float64)[:, None]
            offsets = self._offsets.index_select(0, agents)[:, None]

            def positions(u: torch.Tensor) -> torch.Tensor:
                return (u * counts).long() + offsets

            then = known[2][key] = (positions, positions)
        self._last_columns = (agents.clone(), self._counts, self._offsets, then)
        return then

    def gather(self, agents: torch.Tensor, index: torch.Tensor) -> Batch:
        """Examples ``index`` (m, K) of each row's agent, in one gather of the flat data."""
        m, k = index.shape
        return self._take(index.cpu() + self._offsets.index_select(0, agents.cpu())[:, None], m, k)

    def _take(self, flat: torch.Tensor, m: int, k: int) -> Batch:
        """The examples at positions ``flat`` (m, K) of the flat data (offset included): X (m, K, ...), y (m, K)."""
        if self.device.type != "cpu":
            flat = flat.to(self.device)
        # torch.embedding is index_select of the rows at flat.reshape(-1), viewed as (m, K, features), and
        # torch.take gathers y in flat's shape: the same copies in two ops, not five (≈ 5 µs an access)
        X = torch.embedding(self._X_flat, flat)
        if X.dtype != self.dtype:  # bytes (binary features): converted after the gather
            X = X.to(self.dtype)
        if self.X.dim() != 3:
            X = X.reshape(m, k, *self.X.shape[2:])
        return X, torch.take(self._y_flat, flat)

    def has_closed_form_gradient(self) -> bool:
        return self.model.name == "linear"

    def batched_grad(self, x: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        """Closed form for linear models: ∇ = [Xᵀ r, Σ r] / B + l2·θ with r = σ(z) − y or softmax(z) − onehot(y)."""
        if not self.has_closed_form_gradient():
            return None
        Xf, r = self._linear_residuals(x, batch)
        n, B, f = Xf.shape
        k = r.shape[-1]
        r = r / B
        gW = torch.bmm(r.transpose(1, 2), Xf).reshape(n, k * f)
        g = torch.cat([gW, r.sum(dim=1)], dim=1)
        return g + self.l2 * x if self.l2 else g

    def has_closed_form_clipped_sum(self) -> bool:
        return self.model.name == "linear" and not self.l2

    def clipped_sum(self, x: torch.Tensor, batch: Batch, mask: torch.Tensor,
                    clip: float | None) -> torch.Tensor | None:
        """Closed form for linear models without L2: example b's gradient is r_b [x_bᵀ, 1] (r_b = σ(z_b) − y_b or
        softmax(z_b) − onehot(y_b)), so ‖g_b‖² = ‖r_b‖²(‖x_b‖² + 1) and Σ_b c_b g_b = [(c ⊙ r)ᵀ X, Σ_b c_b r_b], with
        c_b = mask_b·min(1, C/‖g_b‖) — no per-example gradient is formed (BENCHMARKS.md: against ghost clipping)."""
        if not self.has_closed_form_clipped_sum():
            return None
        Xf, r = self._linear_residuals(x, batch)
        n, _, f = Xf.shape
        k = r.shape[-1]
        c = mask.to(r.dtype)
        if clip is not None:
            sq = (r * r).sum(-1) * (torch.linalg.vector_norm(Xf, dim=-1) ** 2 + 1.0)  # no (n, B, f) temporary
            c = c * torch.clamp(clip / sq.sqrt().clamp_min(torch.finfo(r.dtype).tiny), max=1.0)
        rc = r * c[..., None]
        return torch.cat([torch.bmm(rc.transpose(1, 2), Xf).reshape(n, k * f), rc.sum(dim=1)], dim=1)

    def _linear_residuals(self, x: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A linear model's flat inputs X (n, B, f) and per-example residuals r = ∂loss/∂logits (n, B, k): σ(z) − y
        (binary) or softmax(z) − onehot(y); example b's gradient is r_b [x_bᵀ, 1]."""
        X, y = batch
        n, B = y.shape
        Xf = X if X.dim() == 3 else X.reshape(n, B, -1)
        k = self.model.shapes[-1][0]
        f = Xf.shape[-1]
        # Wᵀ (n, f, k) and the bias (n, 1, k) as one view each: the very views x[:, :kf].reshape(n, k, f)
        # .transpose(1, 2) and x[:, None, kf:] (same sizes, strides and offsets, so baddbmm reads the same operands)
        # without their five view ops (≈ 9 µs an access)
        s0, s1 = x.stride()
        at = x.storage_offset()
        Wt = x.as_strided((n, f, k), (s0, s1, f * s1), at)
        z = torch.baddbmm(x.as_strided((n, 1, k), (s0, x.shape[1] * s1, s1), at + k * f * s1), Xf, Wt)  # (n, B, k)
        if self.binary:
            return Xf, torch.sigmoid(z) - y[..., None].to(z.dtype)
        # softmax(z) − onehot(y) as one op: −1 added at each example's class (p + (−1) is p − 1 and the other
        # entries are left as they are, p − 0 = p: the same bits as subtracting F.one_hot, without building it, its
        # range checks and its cast: ≈ 20 µs an access at d = 15); in place unless autograd records softmax
        p, minus = torch.softmax(z, dim=-1), self._minus_one((n, B, 1), z)
        return Xf, p.scatter_add(2, y[..., None], minus) if p.requires_grad else p.scatter_add_(2, y[..., None], minus)

    def _minus_one(self, shape: tuple[int, int, int], like: torch.Tensor) -> torch.Tensor:
        """A tensor of −1 of ``shape`` with ``like``'s dtype and device, kept for the next access of the same shape
        (the batch's shape does not change within a run); read only (scatter_add_'s source)."""
        minus = getattr(self, "_minus", None)
        if minus is None or minus.shape != shape or minus.dtype != like.dtype or minus.device != like.device:
            minus = self._minus = torch.full(shape, -1.0, dtype=like.dtype, device=like.device)
        return minus

    # ---- evaluation -----------------------------------------------------------------------------------------
    def _per_agent(self, x: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[list[float], list[float]]:
        """Each model's loss and accuracy on (X, y)."""
        losses, accs = [], []
        for theta in x.to(self.dtype):  # evaluation is off the hot path
            logits = self.model.predict(theta, X)
            losses.append(float(self._data_loss(logits, y)))
            pred = (logits > 0).long() if self.binary else logits.argmax(dim=-1)
            accs.append(float((pred == y).double().mean()))
        return losses, accs

    def _eval(self, x: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        losses, accs = self._per_agent(x, X, y)
        return float(np.mean(losses)), float(np.mean(accs))

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        with torch.no_grad():
            test_loss, test_acc = self._eval(x, self.X_test, self.y_test)
            train_loss, _ = self._eval(x, self.X_train_eval, self.y_train_eval)
        out = {"test_loss": test_loss, "test_accuracy": test_acc, "train_loss": train_loss,
               "consensus_distance": consensus_distance(x)}
        if self.grad_norm:
            out["grad_norm_sq"] = self.grad_norm_sq(x)
        return out

    def agent_terms(self, x: torch.Tensor, agents: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            test_loss, test_acc = self._per_agent(x, self.X_test, self.y_test)
            train_loss, _ = self._per_agent(x, self.X_train_eval, self.y_train_eval)
        f64 = torch.float64
        return {"test_loss": torch.tensor(test_loss, dtype=f64), "test_accuracy": torch.tensor(test_acc, dtype=f64),
                "train_loss": torch.tensor(train_loss, dtype=f64)}

    def mean_term_names(self) -> tuple[str, ...]:
        return ("grad_norm_sq",) if self.grad_norm else ()

    def mean_terms(self, mean: torch.Tensor) -> dict[str, float]:
        return {"grad_norm_sq": self.grad_norm_sq(mean[None])} if self.grad_norm else {}

    def join_metrics(self, means: dict[str, float], consensus: float, at_mean: dict[str, float]) -> dict[str, float]:
        return {"test_loss": means["test_loss"], "test_accuracy": means["test_accuracy"],
                "train_loss": means["train_loss"], "consensus_distance": consensus, **at_mean}

    def grad_norm_sq(self, x: torch.Tensor) -> float:
        """‖∇F(x̄)‖²: the squared norm of the training loss's gradient (on the training-evaluation subset) at the
        agents' average model — seed 002 Fig. 2(a)'s "squared gradient norm"."""
        mean = x.to(self.dtype).mean(dim=0)
        with torch.enable_grad():
            g = torch.func.grad(lambda th: self.loss(th, self.X_train_eval, self.y_train_eval))(mean)
        return float((g.to(torch.float64) ** 2).sum())

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "dataset": self.dataset.name, "model": self.model.name,
                "samples_per_agent": [len(p) for p in self.parts], "n_test": len(self.dataset.y_test),
                "batch_size": self.batch_size, "l2": self.l2}


def _features(ds: Dataset) -> int:
    return int(np.prod(ds.feature_shape))


def _image_shape(ds: Dataset) -> tuple[int, ...]:
    """(C, H, W) of an image dataset; flat features of square length s² (sklearn's 8×8 digits) read as (1, s, s)."""
    shape = ds.feature_shape
    if len(shape) == 1 and round(shape[0] ** 0.5) ** 2 == shape[0]:
        side = round(shape[0] ** 0.5)
        return (1, side, side)
    if len(shape) not in (2, 3):
        raise ValidationError(f"convolutional models need image data; {ds.name!r} has feature shape {shape}")
    return shape


#: the supervised tasks' models by name (the task names of the config): each builds its model for a dataset — its
#: feature shape and classes — with the task's model keys (``hidden``, ``width``, ...)
MODELS: Registry[Callable[..., ModuleModel]] = Registry("model")


@MODELS.register("logistic")
def _logistic_model(ds: Dataset) -> ModuleModel:
    """Binary logistic regression with bias: one logit."""
    if ds.n_classes != 2:
        raise ValidationError(f"logistic regression needs a binary dataset; {ds.name!r} has {ds.n_classes} classes")
    return linear(_features(ds), 1)


@MODELS.register("softmax")
def _softmax_model(ds: Dataset) -> ModuleModel:
    """Multinomial regression: one logit per class."""
    return linear(_features(ds), ds.n_classes)


@MODELS.register("mlp")
def _mlp_model(ds: Dataset, *, hidden: int = 128) -> ModuleModel:
    """One hidden ReLU layer of ``hidden`` units."""
    return mlp(_features(ds), (hidden,), ds.n_classes)


@MODELS.register("cnn")
def _cnn_model(ds: Dataset, *, filters: int = 3, kernel: int = 5, width: int = 64) -> ModuleModel:
    """Seed 004's small CNN on images."""
    return cnn(_image_shape(ds), ds.n_classes, filters=filters, kernel=kernel, width=width)


@MODELS.register("sigmoid_cnn")
def _sigmoid_cnn_model(ds: Dataset, *, init: str = "dlg") -> ModuleModel:
    """Seed 002's sigmoid CNN on images."""
    return sigmoid_cnn(_image_shape(ds), ds.n_classes, init=init)


@MODELS.register("resnet9")
def _resnet9_model(ds: Dataset, *, width: int = 64, groups: int = 32) -> ModuleModel:
    """The GroupNorm ResNet-9 on images."""
    return resnet9(_image_shape(ds), ds.n_classes, width=width, groups=groups)


def _common(n: int, dataset: str, data_dir: str | None, partition_name: str, alpha: float, t: float,
            seed: int, normalize: Sequence[float] | None = None, train_size: int | None = None,
            resize: int | None = None, min_size: int = 1) -> tuple[Dataset, dict, np.random.Generator]:
    # the partition keys are range-checked whichever partition is chosen (a sweep may set them for cells whose
    # partition does not read them; a value no partition could take is still a typo)
    if not alpha > 0:
        raise ValidationError(f"Dirichlet concentration alpha must be > 0, got {alpha}")
    if not 0.0 <= t <= 1.0:
        raise ValidationError(f"A(t) split needs 0 <= t <= 1, got {t}")
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
        raise ValidationError(f"Dirichlet min_size must be an integer >= 1, got {min_size!r}")
    kwargs: dict = {"data_dir": data_dir} if data_dir and dataset in FILE_DATASETS else {}
    if train_size is not None:
        if dataset != "mnist_t10k":
            raise ValidationError(f"train_size splits MNIST's test images (dataset 'mnist_t10k'); dataset "
                                  f"{dataset!r} has its own train/test split")
        kwargs["train_size"] = int(train_size)
    ds = load_dataset(dataset, **kwargs)
    if resize is not None:
        ds = resized(ds, resize)
    if normalize is not None:
        ds = normalized(ds, normalize)
    params = {"dirichlet": {"alpha": alpha, "min_size": min_size}, "a_t": {"t": t}}.get(partition_name, {})
    return ds, params, np.random.default_rng(seed)


def resized(ds: Dataset, side: int) -> Dataset:
    """Images resized to side × side by bilinear interpolation (seed 004's authors resize MNIST to 32 × 32)."""
    if not (isinstance(side, int) and side >= 1):
        raise ValidationError(f"resize takes an image side >= 1, got {side!r}")
    shape = _image_shape(ds)  # (C, H, W); flat square features read as one channel

    def one(X: np.ndarray) -> np.ndarray:
        images = torch.as_tensor(X).reshape(len(X), *shape)
        return F.interpolate(images, size=(side, side), mode="bilinear", align_corners=False).numpy()

    return Dataset(ds.name, one(ds.X_train), ds.y_train, one(ds.X_test), ds.y_test, ds.n_classes,
                   source=f"{ds.source}, resized to {side}×{side}")


def normalized(ds: Dataset, mean_std: Sequence[float]) -> Dataset:
    """The dataset with inputs (x − mean)/std, as torchvision's Normalize((mean,), (std,)) (e.g. MNIST's
    (0.1307, 0.3081), which the seed-001 and seed-004 authors use)."""
    if len(mean_std) != 2 or not float(mean_std[1]) > 0:
        raise ValidationError(f"normalize takes [mean, std] with std > 0, got {list(mean_std)}")
    mean, std = (np.float32(v) for v in mean_std)
    return Dataset(ds.name, (ds.X_train - mean) / std, ds.y_train, (ds.X_test - mean) / std, ds.y_test,
                   ds.n_classes, source=f"{ds.source}, normalised ({float(mean):g}, {float(std):g})")


@TASKS.register("logistic")
def logistic(n: int, *, dataset: Dataset_ = "a9a", partition: Partition_ = "iid", alpha: float = 10.0,
             min_size: int = 1, t: float = 0.5,
             batch_size: int = 128, l2: float = 0.0, data_dir: str | None = None, seed: int = 0,
             normalize: list[float] | None = None, train_size: int | None = None, resize: int | None = None,
             dtype: torch.dtype = torch.float64) -> SupervisedTask:
    """Binary logistic regression with bias (labels {0, 1}); optional L2 penalty (l2/2)‖θ‖²."""
    ds, params, rng = _common(n, dataset, data_dir, partition, alpha, t, seed, normalize, train_size,
                              resize, min_size=min_size)
    return SupervisedTask("logistic", ds, MODELS.build("logistic", ds), n, partition_name=partition,
                          partition_params=params, batch_size=batch_size, l2=l2, zero_init=True, rng=rng, dtype=dtype)


@TASKS.register("softmax")
def softmax(n: int, *, dataset: Dataset_ = "digits", partition: Partition_ = "iid", alpha: float = 10.0,
            min_size: int = 1, t: float = 0.5,
            batch_size: int = 128, l2: float = 0.0, data_dir: str | None = None, seed: int = 0,
            normalize: list[float] | None = None, train_size: int | None = None, resize: int | None = None,
            dtype: torch.dtype = torch.float64) -> SupervisedTask:
    """Multinomial (softmax) regression."""
    ds, params, rng = _common(n, dataset, data_dir, partition, alpha, t, seed, normalize, train_size,
                              resize, min_size=min_size)
    return SupervisedTask("softmax", ds, MODELS.build("softmax", ds), n, partition_name=partition,
                          partition_params=params, batch_size=batch_size, l2=l2, zero_init=True, rng=rng, dtype=dtype)


@TASKS.register("mlp")
def mlp_task(n: int, *, dataset: Dataset_ = "digits", partition: Partition_ = "iid", alpha: float = 10.0,
             min_size: int = 1, t: float = 0.5,
             batch_size: int = 128, l2: float = 0.0, hidden: int = 128, data_dir: str | None = None,
             seed: int = 0, normalize: list[float] | None = None, train_size: int | None = None,
             resize: int | None = None,
             dtype: torch.dtype = torch.float32) -> SupervisedTask:
    """One-hidden-layer ReLU network (784 → 128 → 10 on MNIST-like data: seed 001's shallow network)."""
    ds, params, rng = _common(n, dataset, data_dir, partition, alpha, t, seed, normalize, train_size,
                              resize, min_size=min_size)
    return SupervisedTask("mlp", ds, MODELS.build("mlp", ds, hidden=hidden), n, partition_name=partition,
                          partition_params=params, batch_size=batch_size, l2=l2, zero_init=False, rng=rng, dtype=dtype)


@TASKS.register("cnn")
def cnn_task(n: int, *, dataset: Dataset_ = "fashion_mnist", partition: Partition_ = "iid", alpha: float = 10.0,
             min_size: int = 1, t: float = 0.5,
             batch_size: int = 256, l2: float = 0.0, filters: int = 3, kernel: int = 5, width: int = 64,
             data_dir: str | None = None, seed: int = 0, normalize: list[float] | None = None,
             train_size: int | None = None, resize: int | None = None,
             dtype: torch.dtype = torch.float32) -> SupervisedTask:
    """Seed 004's small CNN (one 5×5 convolution with 3 filters, Mish, max-pool, 64 hidden units) on images."""
    ds, params, rng = _common(n, dataset, data_dir, partition, alpha, t, seed, normalize, train_size,
                              resize, min_size=min_size)
    model = MODELS.build("cnn", ds, filters=filters, kernel=kernel, width=width)
    return SupervisedTask("cnn", ds, model, n, partition_name=partition, partition_params=params,
                          batch_size=batch_size, l2=l2, zero_init=False, rng=rng, dtype=dtype)


@TASKS.register("sigmoid_cnn")
def sigmoid_cnn_task(n: int, *, dataset: Dataset_ = "mnist_t10k", partition: Partition_ = "iid", alpha: float = 10.0,
                     min_size: int = 1,
                     t: float = 0.5, batch_size: int = 1, l2: float = 0.0, data_dir: str | None = None, seed: int = 0,
                     normalize: list[float] | None = None, train_size: int | None = None, resize: int | None = None,
                     init: Annotated[str, one_of("dlg", "default")] = "dlg", grad_norm: bool = False,
                     dtype: torch.dtype = torch.float32) -> SupervisedTask:
    """Seed 002's CNN (three 5×5 convolutions with 12 filters and sigmoid, one linear layer; one sample per step by
    default, as seed 002 §5.2), the model its gradient-inversion experiment attacks; ``init = "dlg"`` draws every
    parameter uniform on [−0.5, 0.5] as the DLG authors do. ``grad_norm = true`` adds the metric ``grad_norm_sq``
    (‖∇F(x̄)‖² on the training-evaluation subset, seed 002 Fig. 2(a))."""
    ds, params, rng = _common(n, dataset, data_dir, partition, alpha, t, seed, normalize, train_size,
                              resize, min_size=min_size)
    model = MODELS.build("sigmoid_cnn", ds, init=init)
    return SupervisedTask("sigmoid_cnn", ds, model, n, partition_name=partition,
                          partition_params=params, batch_size=batch_size, l2=l2, zero_init=False, rng=rng,
                          dtype=dtype, grad_norm=grad_norm)


@TASKS.register("resnet9")
def resnet9_task(n: int, *, dataset: Dataset_ = "cifar100", partition: Partition_ = "iid", alpha: float = 10.0,
                 min_size: int = 1, t: float = 0.5,
                 batch_size: int = 50, l2: float = 0.0, width: int = 64, groups: int = 32,
                 data_dir: str | None = None, seed: int = 0, normalize: list[float] | None = None,
                 train_size: int | None = None, resize: int | None = None,
                 dtype: torch.dtype = torch.float32) -> SupervisedTask:
    """GroupNorm ResNet-9 (seed 004's CIFAR-100 model)."""
    ds, params, rng = _common(n, dataset, data_dir, partition, alpha, t, seed, normalize, train_size,
                              resize, min_size=min_size)
    model = MODELS.build("resnet9", ds, width=width, groups=groups)
    return SupervisedTask("resnet9", ds, model, n, partition_name=partition, partition_params=params,
                          batch_size=batch_size, l2=l2, zero_init=False, rng=rng, dtype=dtype)
