"""Privacy mechanisms (clip + noise on the agent axis)."""

from privdl.mechanisms import gaussian_ldp  # noqa: F401  (register)
from privdl.mechanisms.base import MECHANISMS, Mechanism, NoPrivacy, clip_rows
from privdl.mechanisms.gaussian_ldp import GaussianLDP


def make_mechanism(name: str, *, steps: int, **params: object) -> Mechanism:
    return MECHANISMS.build(name, steps=steps, **params)


__all__ = ["MECHANISMS", "GaussianLDP", "Mechanism", "NoPrivacy", "clip_rows", "make_mechanism"]
