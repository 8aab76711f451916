"""Decentralized and centralized optimisation algorithms on the agent axis."""

from privdl.algorithms import central_sgd, dsgd  # noqa: F401  (register)
from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext
from privdl.errors import ValidationError


def make_algorithm(name: str, **params: object) -> Algorithm:
    try:
        return ALGORITHMS.get(name)(**params)
    except TypeError as exc:
        raise ValidationError(f"bad parameters for algorithm {name!r}: {exc}") from None


__all__ = ["ALGORITHMS", "Algorithm", "StepContext", "make_algorithm"]
