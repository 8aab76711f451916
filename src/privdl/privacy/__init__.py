"""Privacy accounting: events (a public registry, :data:`EVENTS`; your own type with :func:`register_event`),
accountants (agent level: paper/tight; example level and any dp_accounting event: RDP/PLD), and the ledger.

Every numeric function is keyword-only: ``rdp_epsilon(noise_multiplier=..., sample_rate=..., steps=...,
delta=...)``, ``get_accountant("tight").bound(epsilon=..., delta=..., clip=..., steps=...)``.
"""

from privdl.privacy.accountants import ACCOUNTANTS, AGENT_ACCOUNTANTS
from privdl.privacy.agent_accountant import (
    AgentAccountant,
    UnsupportedEventError,
    check_budget,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    get_accountant,
    paper_bound,
    paper_epsilon,
    paper_simplified_bound,
    tight_bound,
    tight_epsilon,
)
from privdl.privacy.events import (
    EVENTS, GaussianEvent, LaplaceEvent, NonPrivateEvent, ObfuscationEvent, PrivacyEvent, PureLaplaceEvent,
    SubsampledGaussianEvent, register_event,
)
from privdl.privacy.example_accountant import (
    PldAccountant, RdpAccountant, calibrate_noise_multiplier, example_epsilon, pld_epsilon, rdp_epsilon,
)
from privdl.privacy.ledger import Ledger, non_private

__all__ = [
    "ACCOUNTANTS", "AGENT_ACCOUNTANTS", "AgentAccountant", "EVENTS", "GaussianEvent", "LaplaceEvent", "Ledger",
    "NonPrivateEvent", "ObfuscationEvent", "PldAccountant", "PrivacyEvent", "PureLaplaceEvent", "RdpAccountant",
    "SubsampledGaussianEvent", "register_event",
    "UnsupportedEventError", "calibrate_noise_multiplier", "check_budget", "example_epsilon", "gdp_delta",
    "gdp_epsilon", "gdp_mu", "get_accountant", "non_private", "paper_bound", "paper_epsilon",
    "paper_simplified_bound", "pld_epsilon", "rdp_epsilon", "tight_bound",
    "tight_epsilon",
]
