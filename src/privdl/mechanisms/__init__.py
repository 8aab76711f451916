"""Privacy mechanisms: gradient side (clip + noise, DP-SGD; they declare what they need and the engine reads the
data) and message side (encodings of what is sent, wrapping the Comm)."""

import functools
import inspect

from privdl.errors import ValidationError
from privdl.mechanisms import correlated, decor, dp_sgd, muffliato, whisper, zip_dl  # noqa: F401  (register)
from privdl.mechanisms.base import (
    MECHANISMS, Access, AccessBudgetExceeded, BatchGradient, Chain, Clip, ClippedSum, GradientMechanism, Mechanism,
    MechanismEnv, NoPrivacy, Sensitivity, chain, clip_rows,
)
from privdl.mechanisms.correlated import CorrelatedGaussian, GaussianLDP, LDPNoise
from privdl.mechanisms.correlated_noise import CorrelatedNoise
from privdl.mechanisms.dp_sgd import DPSGD
from privdl.mechanisms.message import MESSAGE_MECHANISMS, IdentityEncoding, MessageMechanism, ProtectedComm, protect
from privdl.mechanisms.stack import stack


@functools.lru_cache(maxsize=None)
def _builder_parameters(name: str) -> tuple[inspect.Parameter, ...]:
    fn = MECHANISMS.get(name)
    targets = [c.__init__ for c in fn.__mro__ if "__init__" in vars(c)] if inspect.isclass(fn) else [fn]
    return tuple(p for t in targets for p in inspect.signature(t).parameters.values())


def injected(name: str) -> frozenset[str]:
    """The builder parameters of mechanism ``name`` that the runner supplies (never the user)."""
    return frozenset({"steps"} | ({"network", "task"} & {p.name for p in _builder_parameters(name)}))


def _optional(name: str) -> frozenset[str]:
    """The injected parameters mechanism ``name`` can do without (they have a default)."""
    return frozenset(p.name for p in _builder_parameters(name)
                     if p.name in ("network", "task") and p.default is not inspect.Parameter.empty)


def make_mechanism(name: str, *, steps, network=None, task=None, **params: object) -> GradientMechanism:
    """Build mechanism ``name`` covering ``steps`` noisy accesses (an int, or one per agent); the network
    (correlated designs) and the task (example-level DP) are passed when the mechanism needs them."""
    for what, value in (("network", network), ("task", task)):
        if what in injected(name):
            if value is None:
                if what in _optional(name):
                    continue
                raise ValidationError(f"mechanism {name!r} needs the {what}")
            params[what] = value
    return MECHANISMS.build(name, steps=steps, **params)


__all__ = ["DPSGD", "MECHANISMS", "MESSAGE_MECHANISMS", "Access", "AccessBudgetExceeded", "BatchGradient", "Chain",
           "Clip", "ClippedSum", "CorrelatedGaussian", "CorrelatedNoise", "GaussianLDP", "GradientMechanism",
           "IdentityEncoding", "LDPNoise", "Mechanism", "MechanismEnv", "MessageMechanism", "NoPrivacy",
           "ProtectedComm", "Sensitivity", "chain", "clip_rows", "make_mechanism", "protect", "stack"]
