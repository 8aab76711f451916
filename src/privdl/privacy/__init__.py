"""Privacy accounting (agent level; example level arrives with DP-SGD) and the privacy ledger."""

from privdl.privacy.agent_accountant import (
    AGENT_ACCOUNTANTS,
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
from privdl.privacy.ledger import LedgerEntry, non_private

__all__ = [
    "AGENT_ACCOUNTANTS", "LedgerEntry", "check_budget", "gdp_delta", "gdp_epsilon", "gdp_mu", "get_accountant",
    "non_private", "paper_bound", "paper_epsilon", "paper_simplified_bound", "tight_bound", "tight_epsilon",
]
