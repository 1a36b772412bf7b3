"""Hypothesis profiles, chosen by HYPOTHESIS_PROFILE (default: dev).

dev: quick local runs. ci: derandomised (same examples every run), print_blob for reproduction.
thorough: many examples, for a nightly or a pre-release run.
"""
import os

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, **_common)
settings.register_profile("ci", max_examples=25, derandomize=True, print_blob=True, **_common)
settings.register_profile("thorough", max_examples=400, **_common)


def load() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    settings.load_profile(name)
    return name
