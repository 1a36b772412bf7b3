"""Measurement and the audit: per-node leak metrics against the oracle, their aggregation into leak tables,
the one comparison helper and its tolerance table, the throughput model, what an audit is asked to do
(AuditConfig), the audit itself (references, chain, generations per budget and mode, the report's
content), prompt sharding under torchrun, and the recheck that re-runs a sample of a report's audit.
"""
