"""Name -> implementation registries (one per concept), so configs and the CLI stay declarative."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, TypeVar

from privdl.errors import UnknownNameError, ValidationError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from string names to implementations of one concept (topology, mixing rule, task, ...).

    Lookups of unknown names raise :class:`UnknownNameError` listing the valid names.
    """

    def __init__(self, concept: str) -> None:
        self.concept = concept
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator registering its object under ``name``. A second object under one name (two plug-ins, or a
        plug-in and a built-in) is a :class:`ValidationError` naming both, by module and name."""
        def decorator(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValidationError(f"{self.concept} {name!r} is registered twice: by {origin(self._items[name])} "
                                      f"and by {origin(obj)} (a config names it by its name alone; register one of "
                                      "them under another name)")
            self._items[name] = obj
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        if not isinstance(name, str):
            raise UnknownNameError(f"{self.concept} must be a name (a string), got {name!r}; valid names: "
                                   f"{', '.join(sorted(self._items))}")
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.concept} {name!r}; valid names: {', '.join(sorted(self._items))}"
            ) from None

    def build(self, name: str, *args: object, **kwargs: object) -> object:
        """Call the implementation ``name``; parameters that do not fit its signature (an unknown keyword, a
        missing one, too many) become a ValidationError naming the concept. They are checked against the signature
        before the call, so a TypeError raised inside the implementation propagates unchanged."""
        fn = self.get(name)
        try:
            _check_fits(fn, args, kwargs)
        except TypeError as exc:
            raise ValidationError(f"bad parameters for {self.concept} {name!r}: {exc}") from None
        return fn(*args, **kwargs)  # type: ignore[operator]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def origin(obj: object) -> str:
    """Where a registered object comes from: ``module.qualname`` (of its class for an instance)."""
    named = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


def _check_fits(fn: object, args: tuple, kwargs: dict) -> None:
    """Raise TypeError (as a call would) when ``args`` and ``kwargs`` do not fit ``fn``'s signature, without
    calling it. A class whose ``__init__`` takes ``**kwargs`` hands them to its bases' ``__init__``: a keyword that
    none of those up the MRO (to the first without ``**kwargs``) names is unexpected too (if every one takes
    ``**kwargs``, only the class's own signature is checked). A callable without an introspectable signature (a
    builtin) is not checked: its call reports."""
    try:
        signature = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    signature.bind(*args, **kwargs)
    if not (inspect.isclass(fn) and _takes_var_keyword(signature)):
        return
    named: set[str] = set()
    for cls in fn.__mro__:
        if cls is object or "__init__" not in vars(cls):
            continue
        try:
            init = inspect.signature(vars(cls)["__init__"])
        except (TypeError, ValueError):
            return
        named |= {p.name for p in init.parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not _takes_var_keyword(init):
            break
    else:
        return  # every __init__ takes **kwargs: where they end up cannot be told from the signatures
    unexpected = [k for k in kwargs if k not in named]
    if unexpected:
        raise TypeError(f"got an unexpected keyword argument {unexpected[0]!r}")


def _takes_var_keyword(signature: inspect.Signature) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())


@dataclass(frozen=True)
class OneOf:
    """Config metadata for a string parameter: its value must be a registered name (``Annotated[str,
    OneOf(REGISTRY)]``), one of fixed names, or pass ``pattern`` (a predicate, described by ``describe``). A dict
    value (an optimizer table) is checked by its ``name``. Config validation checks it at load time."""

    choices: "Registry | tuple[str, ...]" = ()
    pattern: Callable[[str], bool] | None = None
    describe: str = ""

    def names(self) -> list[str]:
        return self.choices.names() if isinstance(self.choices, Registry) else sorted(self.choices)

    def concept(self) -> str:
        """What the names name: the registry's concept ("dataset", "accountant", ...), else "name"."""
        return self.choices.concept if isinstance(self.choices, Registry) else "name"

    def accepts(self, value: object) -> bool:
        if isinstance(value, dict):
            value = value.get("name")
        if not isinstance(value, str):
            return True  # the type check reports it
        return value in self.names() or (self.pattern is not None and self.pattern(value))

    def valid(self) -> str:
        return ", ".join([*self.names(), *([self.describe] if self.describe else [])])


def one_of(*choices: str) -> OneOf:
    return OneOf(tuple(choices))


def annotated_choices(annotation: object) -> list[OneOf]:
    """The :class:`OneOf` markers of an ``Annotated`` type (empty for any other type)."""
    return [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, OneOf)]


@dataclass(frozen=True)
class Recorded:
    """Config metadata for a parameter whose default changed after runs were made without it (``dp_sgd``'s
    ``accountant``: RDP, then PLD). Config resolution writes its default into every run's effective config where it
    applies (``applies``: a predicate on the component's other resolved keys; None: always), so a manifest and a run's
    id say which value the run used; ``legacy``, the value every run made before the key existed used, is left out
    of run ids, so those runs keep theirs and a config naming ``legacy`` explicitly finds them."""

    legacy: object
    applies: Callable[[dict], bool] | None = None


def annotated_recorded(annotation: object) -> Recorded | None:
    """The :class:`Recorded` marker of an ``Annotated`` type, if any."""
    return next((m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Recorded)), None)


__all__ = ["OneOf", "Recorded", "Registry", "annotated_choices", "annotated_recorded", "one_of", "origin"]
