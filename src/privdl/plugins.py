"""Plug-ins: modules imported before any name is checked, so that what they register with privdl's public
registries (an algorithm in ``ALGORITHMS``, a mechanism in ``MECHANISMS``, a dataset in ``DATASETS``, an
accountant, a privacy event type with :func:`privdl.privacy.register_event`, ...) can be named by a config.

Three routes, all imported by :func:`load_plugins` (docs/plugins.md):

* a config's top-level ``plugins = ["my_module", ...]`` (imported when the config is expanded, in every process
  that expands it: ``--jobs`` helpers, ``--procs`` workers, ``privdl merge``);
* ``--plugin my_module`` on the command line (``privdl run``, ``attack``, ``reproduce``, ``account --manifest``;
  ``privdl run`` adds them to the config's ``plugins``, so the runs' manifests record them and
  ``privdl account --manifest`` imports them again);
* the entry-point group :data:`ENTRY_POINT_GROUP` (``privdl.plugins``) of installed packages, imported once per
  process by the first call.

A module that fails to import is a :class:`PluginError` naming the module and its error; two plug-ins registering
one name are refused by the registry, which names both (:meth:`privdl.registry.Registry.register`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from typing import Iterable

from privdl.errors import ConfigError

#: the entry-point group whose entries (``name = "module"`` or ``"module:object"``) are imported as plug-ins
ENTRY_POINT_GROUP = "privdl.plugins"

_lock = threading.Lock()
_entry_points_loaded = False
#: the plug-ins this process imported, in order (module names; entry points as "group:name")
LOADED: list[str] = []


class PluginError(ConfigError):
    """A plug-in could not be imported (not found, or its import raised): names the module and the error."""


def check_names(plugins: object, where: str = "plugins") -> list[str]:
    """``plugins`` as a list of module names: a list of non-empty strings (dotted module paths), else a
    :class:`~privdl.errors.ConfigError` naming ``where``."""
    if plugins is None:
        return []
    if isinstance(plugins, str) or not isinstance(plugins, (list, tuple)):
        raise ConfigError(f"{where} must be a list of module names, e.g. [\"my_module\"], got {plugins!r}")
    for name in plugins:
        if not isinstance(name, str) or not name.strip() or not all(
                part.isidentifier() for part in name.strip().split(".")):
            raise ConfigError(f"{where}: {name!r} is not a module name (dotted Python identifiers, e.g. "
                              "\"mylab.plugins\")")
    return [name.strip() for name in plugins]


def _import(name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise PluginError(f"plug-in {name!r} could not be imported: no module named {exc.name!r} (is its "
                              "folder on PYTHONPATH, or its package installed?)") from exc
        raise PluginError(f"plug-in {name!r} could not be imported: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - whatever the module raised, named with it
        raise PluginError(f"plug-in {name!r} could not be imported: {type(exc).__name__}: {exc}") from exc


def entry_point_plugins() -> list[importlib.metadata.EntryPoint]:
    """The installed packages' entry points of :data:`ENTRY_POINT_GROUP`."""
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def load_plugins(names: Iterable[str] | None = (), *, entry_points: bool = True) -> list[str]:
    """Import the plug-in modules ``names`` (each once per process; already imported ones are not imported again)
    and, the first time (``entry_points``), every entry point of :data:`ENTRY_POINT_GROUP`. Returns the module
    names given. A module that cannot be imported is a :class:`PluginError` naming it and its error."""
    modules = check_names(list(names or []))
    global _entry_points_loaded
    with _lock:
        if entry_points and not _entry_points_loaded:
            _entry_points_loaded = True
            for ep in entry_point_plugins():
                try:
                    ep.load()
                except Exception as exc:  # noqa: BLE001
                    raise PluginError(f"plug-in {ep.value!r} (entry point {ep.name!r} of group "
                                      f"{ENTRY_POINT_GROUP!r}) could not be imported: {type(exc).__name__}: "
                                      f"{exc}") from exc
                LOADED.append(f"{ENTRY_POINT_GROUP}:{ep.name}")
        for name in modules:
            if name not in LOADED:
                _import(name)
                LOADED.append(name)
    return modules


def merged(*lists: Iterable[str] | None) -> list[str]:
    """The module names of ``lists`` in order, each once (a config's ``plugins`` and ``--plugin`` flags)."""
    return list(dict.fromkeys(n for names in lists for n in check_names(list(names or []))))


__all__ = ["ENTRY_POINT_GROUP", "LOADED", "PluginError", "check_names", "entry_point_plugins", "load_plugins",
           "merged"]
