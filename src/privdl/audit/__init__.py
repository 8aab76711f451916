"""Privacy audits: empirical ε lower bounds from membership inference (multi-run and one-run)."""

from privdl.audit.estimators import (
    OneRunAudit, ThresholdAudit, clopper_pearson, one_run_audit, one_run_epsilon, one_run_p_value, threshold_audit,
)
from privdl.audit.membership import AuditSetup, MembershipAuditResult, membership_audit, one_run_membership_audit

__all__ = ["AuditSetup", "MembershipAuditResult", "OneRunAudit", "ThresholdAudit", "clopper_pearson",
           "membership_audit", "one_run_audit", "one_run_epsilon", "one_run_membership_audit", "one_run_p_value",
           "threshold_audit"]
