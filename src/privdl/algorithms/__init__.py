"""Decentralized and centralized optimisation algorithms on the agent axis."""

from privdl.algorithms import (  # noqa: F401  (register)
    central_sgd, cga, dinno, dpdl, dsgd, dsgt, exact_diffusion, pd_lms, psgt, rms, sgp,
)
from privdl.algorithms.base import ALGORITHMS, Algorithm, StepContext, per_round


def make_algorithm(name: str, **params: object) -> Algorithm:
    return ALGORITHMS.build(name, **params)


__all__ = ["ALGORITHMS", "Algorithm", "StepContext", "make_algorithm", "per_round"]
