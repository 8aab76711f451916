"""The checks of one config value, whatever its key: finite numbers within range, non-negative seeds, non-empty
paths, a value against its parameter's type annotation, a name against the names it must be one of.

Separate from the walk over a config's tables (:mod:`privdl.experiment.config_resolve`): these rules hold for every
key of every section, and for the top level, so they are stated once, apart from where each key is found.
"""

from __future__ import annotations

import inspect
import math
import sys
import types
import typing
from typing import Any

from privdl.errors import ConfigError
from privdl.experiment.config_schema import PATH_KEYS
from privdl.registry import OneOf

def _check_value(dotted: str, value: Any) -> None:
    """Rules every parameter obeys, whatever its builder checks: finite numbers (no parameter means anything by nan
    or ±inf; they would run and print nan), non-negative seeds (numpy's generators refuse the others deep inside a
    run) and non-empty paths."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"key {dotted!r} is {value}; give a finite number")
    if isinstance(value, float) and 0.0 < abs(value) < sys.float_info.min:
        raise ConfigError(f"key {dotted!r} is {value}, below the smallest normal double ({sys.float_info.min:.3g}): "
                          "no parameter means anything this small (its square is 0); give 0 or a larger value")
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        raise ConfigError(f"key {dotted!r} is {value}, beyond 64-bit integers (TOML's range, and the arrays')")
    if isinstance(value, list):
        for v in value:
            _check_value(dotted, v)
    name = dotted.rpartition(".")[2]
    if name in PATH_KEYS and value == "":
        raise ConfigError(f"key {dotted!r} is empty; give a path, or leave the key out")
    if (name == "seed" or name.endswith("_seed")) and isinstance(value, int) and not isinstance(value, bool) \
            and value < 0:
        raise ConfigError(f"key {dotted!r} is a random seed and must be >= 0, got {value}")


def _accepts(annotation: Any, value: Any) -> bool:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _accepts(typing.get_args(annotation)[0], value)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin in (list, tuple):  # list[float]: each element too
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return isinstance(value, (list, tuple)) and (len(args) != 1 or all(_accepts(args[0], v) for v in value))
    if annotation in (list, tuple):  # a bare list (anchors, target): numbers, or lists of numbers
        return isinstance(value, (list, tuple)) and _numbers(value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _numbers(value: Any) -> bool:
    """Whether ``value`` is a number or a (nested) list of numbers."""
    if isinstance(value, (list, tuple)):
        return all(_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _check_choice(dotted: str, value: Any, choices: list[OneOf]) -> None:
    for c in choices:
        if not c.accepts(value):
            shown = value.get("name") if isinstance(value, dict) else value
            raise ConfigError(f"key {dotted!r}: unknown {c.concept()} {shown!r}; valid names: {c.valid()}")
