"""Which torch device a run's ``device`` names: a room of its own below everything that places tensors (the
covariance solver, the simulator, the runner's batch sizing)."""

from __future__ import annotations

import torch

from privdl.errors import ValidationError


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` → cuda when torch sees one, else cpu; anything else as given, checked to exist."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValidationError(f"device {str(device)!r} asked for, but this torch ({torch.__version__}) sees no CUDA "
                              "device; use device 'cpu' or 'auto'")
    return dev


__all__ = ["resolve_device"]
