"""Privacy mechanisms (clip + noise on the agent axis)."""

from privdl.errors import ValidationError
from privdl.mechanisms import gaussian_ldp  # noqa: F401  (register)
from privdl.mechanisms.base import MECHANISMS, Mechanism, NoPrivacy, clip_rows
from privdl.mechanisms.gaussian_ldp import GaussianLDP


def make_mechanism(name: str, *, steps: int, **params: object) -> Mechanism:
    try:
        return MECHANISMS.get(name)(steps=steps, **params)
    except TypeError as exc:
        raise ValidationError(f"bad parameters for mechanism {name!r}: {exc}") from None


__all__ = ["MECHANISMS", "GaussianLDP", "Mechanism", "NoPrivacy", "clip_rows", "make_mechanism"]
