"""Privacy accounting: events, accountants (agent level: paper/tight; example level: RDP/PLD), and the ledger.

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
    GaussianEvent, NonPrivateEvent, ObfuscationEvent, PrivacyEvent, SubsampledGaussianEvent,
)
from privdl.privacy.example_accountant import (
    PldAccountant, RdpAccountant, calibrate_noise_multiplier, example_epsilon, pld_epsilon, rdp_epsilon,
)
from privdl.privacy.ledger import Ledger, non_private

__all__ = [
    "ACCOUNTANTS", "AGENT_ACCOUNTANTS", "AgentAccountant", "GaussianEvent", "Ledger", "NonPrivateEvent",
    "ObfuscationEvent", "PldAccountant", "PrivacyEvent", "RdpAccountant", "SubsampledGaussianEvent",
    "UnsupportedEventError", "calibrate_noise_multiplier", "check_budget", "example_epsilon", "gdp_delta",
    "gdp_epsilon", "gdp_mu", "get_accountant", "non_private", "paper_bound", "paper_epsilon",
    "paper_simplified_bound", "pld_epsilon", "rdp_epsilon", "tight_bound",
    "tight_epsilon",
]
