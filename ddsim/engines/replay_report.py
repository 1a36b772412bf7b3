"""The typed model of a replay's report.json (format "ddsim-replay-report", version 4): what
`ddsim replay` and `ddsim gate --dump` write. Strict like the audit's report model (no extra keys, no
NaN/Inf), and self-consistent on load: the summary is recomputed from the steps and the noise bound, a step's
silent corruption from its emitted tokens and its rounding divergence, and a rounding divergence only where
every node's logits are within the noise. reports/replay-report.schema.json is generated from it.

Version 2 (from version 1): a step's ``rounding_divergence``, and the summary's ``rounding_divergence_steps``
and ``top1_disagreements_above_noise`` (a near-tie an engine's rounding turned is counted apart from silent
corruption and from a top-1 disagreement above noise).
Version 3 (from version 2): the diagnosis "state commit error" (the committed recurrent state or KV taken from
the wrong nodes: ddsim.engines.replay_commits).
Version 4 (from version 3): ``environment``, what the replay's reference ran under (ddsim.environment).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ddsim.verdict.report_model import Count, NonNeg, RunEnvironment, Sha256, _Strict

Diagnosis = Literal["within noise", "sibling leak", "position error", "mask error", "state commit error",
                    "state drift", "stale state", "unexplained", "bonus error", "acceptance error", "commit error"]


class NodeFigures(_Strict):
    node: Count
    order_exact: bool
    kl: NonNeg | None  # KL(oracle || engine); None for a top-k dump
    logprob_err: NonNeg  # max |log p_oracle - log p_engine| over the engine's reported tokens
    top1_agrees: bool
    oracle_margin: NonNeg  # the oracle's top-1 lead over its runner-up (logits)
    fast_path_kl: NonNeg  # KL(oracle || ddsim's exact fast path): ddsim's own noise here


class StepFigures(_Strict):
    step: Count
    request: str
    nodes: Annotated[list[NodeFigures], Field(min_length=1)]
    positions_as_expected: bool
    engine_accepted: Annotated[list[Count], Field(min_length=1)]
    exact_accepted: Annotated[list[Count], Field(min_length=1)]
    silent_corruption: bool
    diagnosis: Diagnosis
    evidence: str
    state_rel_max: NonNeg | None = None
    engine_emitted: Annotated[list[Count], Field(min_length=1)]
    exact_emitted: Annotated[list[Count], Field(min_length=1)]
    bonus_ok: bool
    commit_ok: bool
    rounding_divergence: bool  # emitted other than exact verification, by the engine's rule on logits within noise

    @model_validator(mode="after")
    def _consistent(self):
        differs = self.engine_emitted != self.exact_emitted
        if self.silent_corruption != (differs and not self.rounding_divergence):
            raise ValueError(f"step {self.step}: silent_corruption disagrees with the emitted tokens")
        if self.rounding_divergence and not (differs and self.bonus_ok):
            raise ValueError(f"step {self.step}: a rounding divergence where the engine emitted what exact verification "
                             "does, or not by its own rule")
        if len(self.exact_emitted) != len(self.exact_accepted) or len(self.engine_emitted) != len(self.engine_accepted):
            raise ValueError(f"step {self.step}: emitted tokens are not one per accepted node after the root plus a bonus")
        if self.diagnosis == "commit error" and self.commit_ok:
            raise ValueError(f"step {self.step}: diagnosed a commit error with commit_ok true")
        if not self.commit_ok and self.diagnosis != "commit error":
            raise ValueError(f"step {self.step}: commit_ok false without the commit error diagnosis")
        return self


class ReplaySummary(_Strict):
    steps: Count
    requests: Count
    nodes: Count
    silent_corruption_steps: Count
    rounding_divergence_steps: Count
    diagnosed_steps: Count
    diagnoses: dict[Diagnosis, Count]
    top1_disagreements: Count
    top1_disagreements_above_noise: Count
    kl_max: NonNeg | None
    logprob_err_max: NonNeg | None
    fast_path_kl_max: NonNeg | None
    positions_unexpected_steps: Count
    bonus_error_steps: Count
    commit_error_steps: Count


class ReplayProvenance(_Strict):
    ddsim_version: str
    model: str
    weights_sha256: Sha256
    dump: str
    dump_sha256: Sha256
    engine: dict[str, str | int | float | bool | None]  # the dump header's, as the engine wrote it
    compute_dtype: Literal["float32", "bfloat16", "float16", "float64"]
    logits: Literal["full", "topk"]
    acceptance: Literal["greedy"] | dict[str, str | float | dict[str, float]] = "greedy"  # the dump's rule


class ReplayReport(_Strict):
    format: Literal["ddsim-replay-report"]
    version: Literal[4]
    provenance: ReplayProvenance
    environment: RunEnvironment  # what the replay's reference (ddsim's model and oracle) ran under
    noise_kl: NonNeg
    summary: ReplaySummary
    steps: list[StepFigures]

    @model_validator(mode="after")
    def _consistent(self):
        from ddsim.engines.replay_verdict import node_within_noise, summarize
        want = ReplaySummary(**summarize(self.steps, self.noise_kl))
        if self.summary != want:
            bad = next(k for k in ReplaySummary.model_fields if getattr(self.summary, k) != getattr(want, k))
            raise ValueError(f"summary.{bad} is {getattr(self.summary, bad)!r}, the steps give {getattr(want, bad)!r}")
        if self.environment.ddsim != self.provenance.ddsim_version:
            raise ValueError(f"environment.ddsim is {self.environment.ddsim!r} but provenance.ddsim_version is "
                             f"{self.provenance.ddsim_version!r}")
        if [s.step for s in self.steps] != sorted(s.step for s in self.steps):
            raise ValueError("steps are not in step order")
        for s in self.steps:
            if s.rounding_divergence and not all(node_within_noise(n, self.noise_kl) for n in s.nodes):
                raise ValueError(f"step {s.step}: a rounding divergence with logits beyond the noise")
        return self
