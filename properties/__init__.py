"""Hypothesis strategies and property suites: every fast path against the oracle."""
