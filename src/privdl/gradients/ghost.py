"""DP-SGD's clipped lot sums without materialising per-example gradients of the whole model ("ghost clipping";
Goodfellow 2015, Li et al. 2022), through a registry of per-layer rules (as Opacus registers grad samplers per
layer type).

For a model whose parameterised layers are all of registered types (``nn.Linear`` and ``nn.Conv2d`` here; any
other layer without parameters — activations, pooling, flatten — is free), one forward and one backward pass give,
for every layer ℓ, its input h_ℓ and the per-example gradient of the loss sum with respect to its output δ_ℓ: a
forward hook records h_ℓ and adds a zero perturbation e_ℓ to the output, and ∂(Σ loss)/∂e_ℓ = δ_ℓ. That pass runs
under ``vmap`` over the rows (agents), so rows with different parameters share one batched computation. Then each
layer's rule turns (h_ℓ, δ_ℓ) into per-example squared norms of its parameters' gradients and, given the clip
weights c_b = mask_b·min(1, C/‖g_b‖), their clipped sum:

- ``Linear`` z = W h + c: ∇_W = δ hᵀ, so ‖∇_W‖² = ‖δ‖²‖h‖², ‖∇_c‖² = ‖δ‖² (no (B, out, in) tensor), and
  Σ_b c_b ∇_W = (c ⊙ δ)ᵀ h;
- ``Conv2d`` (groups = 1): ∇_W = δ Uᵀ with U the unfolded input, per example F × C·k² numbers, computed as one
  grouped convolution of the inputs with the output gradients as kernels (3–5× faster than im2col); ∇_c = Σ δ.

Exactly the numbers of the generic torch.func path (tested). Register a rule for a new layer type with
:func:`register_ghost`; models with any unregistered parameterised layer use the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

#: numbers of the largest per-group intermediate held at once (rows are processed in groups)
GROUP_BUDGET = 2**25

Rule = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, Callable[[torch.Tensor],
                                                                                               list[torch.Tensor]]]]


@dataclass(frozen=True)
class GhostRule:
    """``rule(layer, h, delta)`` with h, δ of shape (rows, B, ...) returns the per-example squared norms (rows, B) of
    the layer's parameter gradients and a function mapping clip weights (rows, B) to the clipped sums, one tensor
    (rows, *shape) per parameter in ``named_parameters(recurse=False)`` order."""

    rule: Rule
    supports: Callable[[torch.nn.Module], bool] = lambda layer: True


GHOST_RULES: dict[type, GhostRule] = {}


def register_ghost(layer_type: type, rule: Rule, supports: Callable[[torch.nn.Module], bool] | None = None) -> None:
    """Register the ghost-clipping rule of a layer type."""
    GHOST_RULES[layer_type] = GhostRule(rule, supports or (lambda layer: True))


def _linear_rule(layer: torch.nn.Linear, h: torch.Tensor, d: torch.Tensor):
    rows, B = h.shape[:2]
    if h.ndim == 3:
        dd = (d * d).sum(-1)
        sq = dd * (h * h).sum(-1) + (dd if layer.bias is not None else 0.0)

        def sums(w: torch.Tensor) -> list[torch.Tensor]:
            wd = d * w[..., None]
            out = [torch.bmm(wd.transpose(1, 2), h)]
            return out + ([wd.sum(dim=1)] if layer.bias is not None else [])
        return sq, sums
    hf, df = h.reshape(rows, B, -1, h.shape[-1]), d.reshape(rows, B, -1, d.shape[-1])  # extra positions
    g = torch.einsum("rbto,rbti->rboi", df, hf)
    gb = df.sum(2)
    sq = (g * g).sum((-2, -1)) + ((gb * gb).sum(-1) if layer.bias is not None else 0.0)

    def sums_general(w: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.einsum("rb,rboi->roi", w, g)]
        return out + ([torch.einsum("rb,rbo->ro", w, gb)] if layer.bias is not None else [])
    return sq, sums_general


def _conv_weight_grads(x: torch.Tensor, delta: torch.Tensor, layer: torch.nn.Conv2d) -> torch.Tensor:
    """Per-example weight gradients (N, F, C·k·k): G[b,f,c,i,j] = Σ_p δ[b,f,p]·x_pad[b,c,p·s+(i,j)·dil], as one
    grouped convolution of the inputs with the output gradients as kernels."""
    N, C, H, W = x.shape
    nf, P, Q = delta.shape[1:]
    kernels = delta[:, None].expand(N, C, nf, P, Q).reshape(N * C * nf, 1, P, Q)
    out = F.conv2d(x.reshape(1, N * C, H, W), kernels, padding=layer.padding, stride=layer.dilation,
                   dilation=layer.stride, groups=N * C)  # (1, N·C·F, ≥k, ≥k)
    kh, kw = layer.kernel_size
    out = out[..., :kh, :kw]
    return out.reshape(N, C, nf, kh, kw).transpose(1, 2).reshape(N, nf, C * kh * kw)


def _conv_rule(layer: torch.nn.Conv2d, h: torch.Tensor, d: torch.Tensor):
    rows, B = h.shape[:2]
    g = _conv_weight_grads(h.reshape(rows * B, *h.shape[2:]), d.reshape(rows * B, *d.shape[2:]), layer)
    g = g.reshape(rows, B, -1)
    gb = d.sum(dim=(-2, -1))  # (rows, B, F)
    sq = (g * g).sum(-1) + ((gb * gb).sum(-1) if layer.bias is not None else 0.0)

    def sums(w: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.einsum("rb,rbp->rp", w, g).reshape(rows, *layer.weight.shape)]
        return out + ([torch.einsum("rb,rbf->rf", w, gb)] if layer.bias is not None else [])
    return sq, sums


register_ghost(torch.nn.Linear, _linear_rule)
register_ghost(torch.nn.Conv2d, _conv_rule,
               lambda c: c.groups == 1 and c.padding_mode == "zeros" and isinstance(c.padding, tuple))


def _parameterised(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(name, m) for name, m in module.named_modules() if any(True for _ in m.parameters(recurse=False))]


def supports_ghost(task: object) -> bool:
    """Whether :func:`ghost_clipped_sum` handles this task: a supervised loss with no L2 term and a module model whose
    parameterised layers all have a registered rule that accepts them."""
    model = getattr(task, "model", None)
    module = getattr(model, "module", None)
    if getattr(task, "l2", 1.0) or module is None or not hasattr(task, "data_loss_sum"):
        return False
    layers = _parameterised(module)
    for _, layer in layers:
        rule = GHOST_RULES.get(type(layer))
        if rule is None or not rule.supports(layer):
            return False
    # every parameter belongs to one of those layers, in the model's own order
    names = [f"{ln}.{pn}" if ln else pn for ln, layer in layers for pn, _ in layer.named_parameters(recurse=False)]
    return sorted(names) == sorted(model.names)


class _Taps:
    """Forward hooks on the parameterised layers: record each layer's input, add a perturbation to its output."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        self.layers, self.perturb, self.inputs, self.shapes = layers, None, None, None
        self.handles = [m.register_forward_hook(self._hook(k)) for k, m in enumerate(layers)]

    def _hook(self, k: int):
        def hook(module, inp, out):
            if self.shapes is not None:  # probing the output shapes
                self.shapes.append(tuple(out.shape))
                return out
            self.inputs.append(inp[0])
            return out + self.perturb[k]
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _probe(model, taps: _Taps, blocks_one, X_one) -> list[tuple[int, ...]]:
    taps.shapes = []
    try:
        with torch.no_grad():
            model.predict_blocks(blocks_one, X_one)
        return taps.shapes
    finally:
        taps.shapes = None


def _output_shapes(model, taps: _Taps, blocks_one, X_one) -> list[tuple[int, ...]]:
    """Every tapped layer's output shape for one row's batch X_one: probed on two examples and scaled to the batch
    where each output leads with the example axis (a tenth of a forward pass saved per lot), else on the batch."""
    B = X_one.shape[0]
    if B > 2:
        shapes = _probe(model, taps, blocks_one, X_one[:2])
        if all(s and s[0] == 2 for s in shapes):
            return [(B, *s[1:]) for s in shapes]
    return _probe(model, taps, blocks_one, X_one)


def _group(task, taps: _Taps, blocks, X, y, mask, clip):
    model = task.model

    def loss_with_taps(perturb, blocks_one, X_one, y_one):
        taps.perturb, taps.inputs = perturb, []
        logits = model.predict_blocks(blocks_one, X_one)
        return task.data_loss_sum(logits, y_one), taps.inputs

    shapes = _output_shapes(model, taps, tuple(b[0] for b in blocks), X[0])

    def one(blocks_one, X_one, y_one):
        perturb = [torch.zeros(s, dtype=X_one.dtype, device=X_one.device) for s in shapes]
        return torch.func.grad(loss_with_taps, has_aux=True)(perturb, blocks_one, X_one, y_one)

    with torch.enable_grad():
        deltas, inputs = torch.func.vmap(one)(blocks, X, y)
    sq = torch.zeros(mask.shape, dtype=X.dtype, device=X.device)
    finishers = []
    for layer, h, d in zip(taps.layers, inputs, deltas):
        s, fin = GHOST_RULES[type(layer)].rule(layer, h.detach(), d.detach())
        sq = sq + s
        finishers.append(fin)
    if clip is None:
        weight = mask
    else:
        clip_t = clip if isinstance(clip, torch.Tensor) else torch.tensor(clip, dtype=X.dtype, device=X.device)
        weight = mask * torch.clamp(clip_t.reshape(-1, 1) / sq.sqrt().clamp_min(torch.finfo(X.dtype).tiny), max=1.0)
    per_param = [t for fin in finishers for t in fin(weight)]
    return per_param


def ghost_clipped_sum(task: object, x: torch.Tensor, batch: tuple[torch.Tensor, ...], mask: torch.Tensor,
                      clip: float | torch.Tensor | None) -> torch.Tensor:
    """Σ_b mask_rb · min(1, C/‖g_rb‖) · g_rb for every row r, (m, d), for tasks where :func:`supports_ghost`."""
    model = task.model  # type: ignore[attr-defined]
    layers = [m for _, m in _parameterised(model.module)]
    order = [f"{ln}.{pn}" if ln else pn for ln, layer in _parameterised(model.module)
             for pn, _ in layer.named_parameters(recurse=False)]
    position = {name: k for k, name in enumerate(order)}
    X, y = batch
    m, B = y.shape
    per_example = int(X[0, 0].numel()) * 8
    group = max(1, min(m, GROUP_BUDGET // max(1, B * per_example)))
    taps = _Taps(layers)
    try:
        out = []
        for s in range(0, m, group):
            blocks = task.blocks(x[s:s + group])  # type: ignore[attr-defined]
            c = clip[s:s + group] if isinstance(clip, torch.Tensor) and clip.numel() > 1 else clip
            sums = _group(task, taps, blocks, X[s:s + group], y[s:s + group], mask[s:s + group], c)
            ordered = [sums[position[name]] for name in model.names]
            out.append(torch.cat([t.reshape(t.shape[0], -1) for t in ordered], dim=1))
    finally:
        taps.close()
    return torch.cat(out, dim=0)


__all__ = ["GHOST_RULES", "GhostRule", "ghost_clipped_sum", "register_ghost", "supports_ghost"]
