"""Name -> implementation registries (one per concept), so configs and the CLI stay declarative."""

from __future__ import annotations

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
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.concept} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.concept} {name!r}; valid names: {', '.join(sorted(self._items))}"
            ) from None

    def build(self, name: str, *args: object, **kwargs: object) -> object:
        """Call the implementation ``name``; a bad keyword becomes a ValidationError naming the concept."""
        fn = self.get(name)
        try:
            return fn(*args, **kwargs)  # type: ignore[operator]
        except TypeError as exc:
            if "argument" not in str(exc):
                raise
            raise ValidationError(f"bad parameters for {self.concept} {name!r}: {exc}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
