"""A module imported on its first use: ``dp_accounting = lazy("dp_accounting")`` at the top of a module reads as the
import it stands for, but loads nothing until an attribute is asked for (``dp_accounting.GaussianDpEvent``).

What it is for: a process imports only what it runs. dp_accounting loads scipy.stats, scipy.signal and
scipy.optimize (about 0.8 s on a laptop core, more than ``import torch.distributed`` takes again), yet a worker
of the distributed runtime, or any run that does not account, never composes an event; accounting code is
unchanged and loads it when it first accounts (docs/backends.md, "What a worker imports")."""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """Stands for the module ``name``; the first attribute access imports it (``importlib.import_module``: the
    module then lives in ``sys.modules`` as usual) and every access reads, sets or deletes the module's
    attribute."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def _load(self) -> ModuleType:
        module = self._module
        if module is None:
            module = importlib.import_module(self._name)
            object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attr: str) -> object:
        return getattr(self._load(), attr)

    def __setattr__(self, attr: str, value: object) -> None:  # monkeypatching the module through it
        setattr(self._load(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._load(), attr)

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy(name: str) -> LazyModule:
    """The module ``name``, imported when first used (:class:`LazyModule`)."""
    return LazyModule(name)


__all__ = ["LazyModule", "lazy"]
