"""Privacy mechanisms (clip + noise on the agent axis)."""

import inspect

from privdl.errors import ValidationError

from privdl.mechanisms import correlated, dp_sgd, gaussian_ldp  # noqa: F401  (register)
from privdl.mechanisms.base import MECHANISMS, Mechanism, NoPrivacy, clip_rows
from privdl.mechanisms.correlated import CorrelatedGaussian, CorrelatedNoise
from privdl.mechanisms.dp_sgd import DPSGD
from privdl.mechanisms.gaussian_ldp import GaussianLDP
from privdl.network.network import Network


def _accepts(name: str, what: str) -> bool:
    return what in inspect.signature(MECHANISMS.get(name)).parameters


def make_mechanism(name: str, *, steps: int, network: Network | None = None, task: object | None = None,
                   **params: object) -> Mechanism:
    """Build mechanism ``name``; the network (correlated designs) and the task (example-level DP) are injected
    when the mechanism needs them."""
    for what, value in (("network", network), ("task", task)):
        if _accepts(name, what):
            if value is None:
                raise ValidationError(f"mechanism {name!r} needs the {what}")
            params[what] = value
    return MECHANISMS.build(name, steps=steps, **params)


__all__ = ["MECHANISMS", "CorrelatedGaussian", "CorrelatedNoise", "DPSGD", "GaussianLDP", "Mechanism", "NoPrivacy", "clip_rows", "make_mechanism"]
