"""Gradient inversion: DLG (Zhu, Liu & Han, NeurIPS 2019) and iDLG (Zhao, Mopuri & Bilen, 2020), batched.

Given a model θ and an observed gradient g of the loss of one example (x, y), DLG optimises a dummy input x' and a
dummy soft label y' (softmax of free logits) with L-BFGS so that ∇_θ ℓ(θ; x', y') matches g:

    min_{x', y'}  D(∇_θ ℓ(θ; x', softmax(y')), g),   D = ‖·‖²/‖g‖² ("l2", DLG's distance, scale-free) or 1 − cos
    ("cosine", Geiping et al.).

iDLG first reads the label off the gradient — for cross-entropy on one example the last layer's bias gradient is
p − e_y, negative only at the true class (its weight rows are (p − e_y)·h: with h > 0, as after sigmoid, the same
sign pattern) — and then optimises x' alone.

K attacks run as **one** optimisation over stacked dummies (K, ...): the per-example gradients of the K dummies come
from ``torch.func.vmap(grad(loss))``, the K matching losses are summed (each depends only on its own dummy, so the sum
separates), and L-BFGS steps all of them at once. ``restarts`` repeats from new dummies and keeps, per attack, the
reconstruction with the lowest matching loss.

:func:`reconstruction_metrics` scores reconstructions with scikit-image's PSNR and SSIM (and MSE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.tasks.models import ModuleModel

LOSSES = ("l2", "cosine")


@dataclass
class Reconstruction:
    inputs: torch.Tensor  # (K, *input_shape)
    labels: torch.Tensor  # (K,) the attack's label (argmax of its soft label, or iDLG's)
    matching_loss: torch.Tensor  # (K,)
    iterations: int


def _ce_soft(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -(target * torch.log_softmax(logits, dim=-1)).sum(-1)


def example_gradient(model: ModuleModel, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇_θ of the cross-entropy of one example per row: x (K, *shape), y (K, classes) soft labels → (K, d), at one
    model θ (d,) or at one model per row (K, d)."""

    def one(th: torch.Tensor, xk: torch.Tensor, yk: torch.Tensor) -> torch.Tensor:
        def loss(bs: tuple[torch.Tensor, ...]) -> torch.Tensor:
            return _ce_soft(model.predict_blocks(bs, xk[None])[0], yk)

        grads = torch.func.grad(loss)(model.split(th))
        return torch.cat([g.reshape(-1) for g in grads])

    return torch.func.vmap(one, in_dims=(0 if theta.ndim == 2 else None, 0, 0))(theta, x, y)


def idlg_labels(model: ModuleModel, gradients: torch.Tensor) -> torch.Tensor:
    """iDLG's labels from single-example cross-entropy gradients (K, d): the class whose last-layer bias gradient
    (or, without a bias, the sum of its weight row's gradient) is smallest."""
    names, shapes = model.names, model.shapes
    offsets = np.cumsum([0] + [math.prod(s) for s in shapes])
    last = len(names) - 1
    if names[last].endswith("bias") and len(shapes[last]) == 1:
        return gradients[:, offsets[last]:offsets[last + 1]].argmin(dim=1)
    w = gradients[:, offsets[last]:offsets[last + 1]].reshape(gradients.shape[0], *shapes[last])
    return w.sum(dim=-1).argmin(dim=1)


def _matching(dummy_grads: torch.Tensor, target: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "l2":  # relative to ‖g‖² (scale-free: L-BFGS's tolerances then mean the same for every model)
        return ((dummy_grads - target) ** 2).sum(dim=1) / (target**2).sum(dim=1).clamp_min(1e-300)
    cos = torch.nn.functional.cosine_similarity(dummy_grads, target, dim=1, eps=1e-12)
    return 1.0 - cos


def _check_twice_differentiable(model: ModuleModel, closure, x: torch.Tensor) -> None:
    """DLG differentiates the gradient-matching loss, a function of ∇_θ loss, with respect to the input: the model
    must be differentiable twice, and the input must reach the matched gradient."""
    try:
        closure()
    except RuntimeError as exc:
        raise ValidationError(f"model {model.name!r} cannot be differentiated twice, which DLG needs (it "
                              f"differentiates ∇_θ loss with respect to the input): {exc}") from None
    if x.grad is None or not bool(torch.isfinite(x.grad).all()) or not bool((x.grad != 0).any()):
        raise ValidationError(f"model {model.name!r}: the gradient-matching loss has no usable derivative with "
                              "respect to the input (its second derivative vanishes or is not finite), so DLG "
                              "cannot move the dummy input")
    x.grad = None


def invert(model: ModuleModel, theta: torch.Tensor, gradients: torch.Tensor, *, classes: int,
           labels: torch.Tensor | None = None, loss: str = "l2", iterations: int = 300, restarts: int = 1,
           seed: int = 0, lr: float = 1.0, progress=None) -> Reconstruction:
    """Reconstruct one example per row of ``gradients`` (K, d), observed at model ``theta`` (d,) or at one model per
    row (K, d) (different rounds of a run). ``labels`` given
    (iDLG): only the inputs are optimised; else the soft labels too (DLG). ``iterations`` L-BFGS iterations per
    restart; ``progress(done, total)`` is called after each."""
    if loss not in LOSSES:
        raise ValidationError(f"gradient-matching loss must be one of {LOSSES}, got {loss!r}")
    if gradients.ndim != 2 or gradients.shape[1] != model.dim:
        raise ValidationError(f"gradients must be (K, {model.dim}) for this model, got {tuple(gradients.shape)}")
    if iterations < 1 or restarts < 1:
        raise ValidationError("iterations and restarts must be >= 1")
    dtype = theta.dtype
    theta = theta.detach()
    target = gradients.detach().to(dtype)
    K = target.shape[0]
    gen = torch.Generator().manual_seed(int(seed))
    best_x = torch.zeros(K, *model.input_shape, dtype=dtype)
    best_y = torch.zeros(K, dtype=torch.int64)
    best_loss = torch.full((K,), math.inf, dtype=dtype)
    fixed = None if labels is None else torch.nn.functional.one_hot(labels.to(torch.int64), classes).to(dtype)
    total = iterations * restarts
    for r in range(restarts):
        x = torch.rand(K, *model.input_shape, generator=gen, dtype=dtype).requires_grad_(True)
        params = [x]
        if fixed is None:
            y_logits = torch.randn(K, classes, generator=gen, dtype=dtype).requires_grad_(True)
            params.append(y_logits)
        opt = torch.optim.LBFGS(params, lr=lr, max_iter=1, history_size=100, line_search_fn=None,
                                tolerance_grad=0.0, tolerance_change=0.0)

        def soft() -> torch.Tensor:
            return fixed if fixed is not None else torch.softmax(y_logits, dim=-1)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            value = _matching(example_gradient(model, theta, x, soft()), target, loss).sum()
            value.backward()
            return value

        if r == 0:
            _check_twice_differentiable(model, closure, x)
        for it in range(iterations):
            opt.step(closure)
            if progress is not None:
                progress(r * iterations + it + 1, total)
        with torch.no_grad():
            final = _matching(example_gradient(model, theta, x, soft()), target, loss)
            final = torch.nan_to_num(final, nan=math.inf)
            better = final < best_loss
            best_loss = torch.where(better, final, best_loss)
            best_x[better] = x.detach()[better]
            guess = labels.to(torch.int64) if labels is not None else soft().argmax(dim=1)
            best_y[better] = guess[better]
    return Reconstruction(best_x, best_y, best_loss, iterations)


def dlg(model: ModuleModel, theta: torch.Tensor, gradients: torch.Tensor, *, classes: int, **kw) -> Reconstruction:
    """DLG: inputs and soft labels optimised together."""
    return invert(model, theta, gradients, classes=classes, **kw)


def idlg(model: ModuleModel, theta: torch.Tensor, gradients: torch.Tensor, *, classes: int, **kw) -> Reconstruction:
    """iDLG: labels read from the gradients, then the inputs alone."""
    return invert(model, theta, gradients, classes=classes, labels=idlg_labels(model, gradients), **kw)


def linear_inversion(model: ModuleModel, gradients: torch.Tensor, *, bounds: tuple[float, float] | None = None
                     ) -> Reconstruction:
    """The exact inversion of a linear model with a bias (logistic or softmax regression) from single-example
    gradients (K, d): ∇_W ℓ = r·xᵀ and ∇_b ℓ = r for the residual r (σ(z) − y, or p − e_y), so x = ∇_W[k]/∇_b[k]
    for any output k with ∇_b[k] ≠ 0 (the one with the largest |∇_b[k]| is used: the least amplified noise). No
    optimisation: on a noise-free gradient it is exact. ``bounds`` (the data's public range, e.g. (0, 1) for binary
    features) clamps what noise pushes outside it, as any attacker who knows the domain would. Labels: the binary
    residual σ(z) − y is negative only for y = 1; the multiclass ones as iDLG reads them."""
    names, shapes = model.names, model.shapes
    if model.name != "linear" or len(shapes) != 2 or not names[-1].endswith("bias"):
        raise ValidationError(f"the analytic inversion needs a linear model with a bias, not {model.name!r}")
    if gradients.ndim != 2 or gradients.shape[1] != model.dim:
        raise ValidationError(f"gradients must be (K, {model.dim}) for this model, got {tuple(gradients.shape)}")
    outputs, features = shapes[0]
    g = gradients.detach()
    w = g[:, : outputs * features].reshape(-1, outputs, features)
    b = g[:, outputs * features:]
    k = b.abs().argmax(dim=1)
    rows = torch.arange(g.shape[0])
    pivot = b[rows, k]
    x = w[rows, k] / torch.where(pivot == 0, torch.full_like(pivot, torch.finfo(g.dtype).tiny), pivot)[:, None]
    if bounds is not None:
        x = x.clamp(float(bounds[0]), float(bounds[1]))
    labels = (b[:, 0] < 0).to(torch.int64) if outputs == 1 else b.argmin(dim=1)
    return Reconstruction(x.reshape(g.shape[0], *model.input_shape), labels, torch.zeros(g.shape[0], dtype=g.dtype), 0)


def reconstruction_metrics(original: torch.Tensor, reconstruction: torch.Tensor, *,
                           data_range: float | None = None) -> list[dict[str, float]]:
    """MSE, PSNR and SSIM (scikit-image) of each reconstruction against its original, images (K, C, H, W) or
    (K, H, W); ``data_range`` defaults to the originals' range (max − min over the batch)."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    a = original.detach().cpu().to(torch.float64).numpy()
    b = reconstruction.detach().cpu().to(torch.float64).numpy()
    if a.shape != b.shape:
        raise ValidationError(f"original {a.shape} and reconstruction {b.shape} differ in shape")
    if a.ndim == 4 and a.shape[1] == 1:
        a, b = a[:, 0], b[:, 0]
    rng = float(a.max() - a.min()) if data_range is None else float(data_range)
    out = []
    for x, z in zip(a, b):
        mse = float(((x - z) ** 2).mean())
        channel = {"channel_axis": 0} if x.ndim == 3 else {}
        out.append({"mse": mse, "psnr": float(peak_signal_noise_ratio(x, z, data_range=rng)),
                    "ssim": float(structural_similarity(x, z, data_range=rng, **channel))})
    return out


__all__ = ["LOSSES", "Reconstruction", "dlg", "example_gradient", "idlg", "idlg_labels", "invert", "linear_inversion",
           "reconstruction_metrics"]
