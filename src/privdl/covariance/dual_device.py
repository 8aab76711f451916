"""Where the dual solver's eigendecompositions run: None (LAPACK through SciPy on the CPU) or a torch device, and the
run-wide default a run with ``device = "cuda"`` sets around its mechanism (:func:`eigh_device`).

Separate from the solver (:mod:`privdl.covariance.dual`) because it is a concern of the run, not of the mathematics:
the experiment builder and the CLI resolve and set the device without touching the solver, and only Newton (from
``NEWTON_MIN_N`` agents on) follows the run's device — the fixed point and a singular W's tie-break keep LAPACK, so
a design is the same on every machine.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from privdl.errors import ValidationError

#: The device a run asked for (``device = "cuda"``): the eigendecompositions of the designs it builds go there when
#: the caller names none (set by :func:`eigh_device` around a run's mechanism; None: LAPACK on the CPU).
_RUN_DEVICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("privdl_eigh_device", default=None)


@contextlib.contextmanager
def eigh_device(run_device: str | None) -> Iterator[None]:
    """Inside this block, designs solved without a ``device`` put their eigendecompositions on the run's GPU when
    ``run_device`` is one ("cuda", "cuda:1", or "auto" where torch sees one); on the CPU they stay with LAPACK."""
    token = _RUN_DEVICE.set(gpu_of(run_device))
    try:
        yield
    finally:
        _RUN_DEVICE.reset(token)


def _device_for(method: str, device: str | None) -> str | None:
    """The device the eigendecompositions use: the one named, else — for Newton only — the run's GPU. The fixed
    point (below NEWTON_MIN_N agents) keeps its original LAPACK path on every machine, so a run's design, and with
    it its noise, is the same on a GPU as on the CPU (a singular W's recovery differs between the two paths)."""
    if device is not None:
        return device
    return _RUN_DEVICE.get() if method == "newton" else None


def gpu_of(run_device: str | None) -> str | None:
    """The CUDA device a run's ``device`` names (``"auto"``: cuda where torch sees one), or None."""
    if run_device is None:
        return None
    run_device = str(run_device)
    if run_device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else None
    return run_device if run_device.startswith("cuda") else None


def check_device(device: str | None) -> str | None:
    """None (NumPy/SciPy LAPACK) or a torch device string, resolved as a run's ``device`` is ("auto": cuda where torch
    sees one; a CUDA device torch does not see is refused)."""
    if device is None:
        return None
    from privdl.device import resolve_device  # (torch only once a device is named)

    try:
        dev = resolve_device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValidationError(f"device {device!r} is not a torch device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValidationError(f"device {device!r}: the eigendecompositions run on 'cpu' or 'cuda' only")
    return str(dev)
