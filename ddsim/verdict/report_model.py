"""report.json as one typed, validated record: the audit fills it, the writers serialise it, and the
gate, the terminal summary and report.html read it. report.schema.json is generated from it.

Loading validates completely and fails closed: every number typed, finite and in range; every
budget the configuration lists present once, with every verify mode; and the summaries the gate
reads recomputed from the report's own ``generations[]`` and leak tables and compared. A report
whose parts come from different runs, or that was edited by hand, does not load.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ddsim.measure.settings import AuditConfig
from ddsim.model.config import FAMILIES, LAYER_KINDS, STATEFUL_KINDS, WINDOWED_KINDS
from ddsim.trees.modes import VERIFY_MODES
from ddsim.values import is_int

SCHEMA_VERSION = 12  # 3: typed model, provenance (engine kernel too), leak coverage, noise floor over all nodes;
# 4: reference_fragility, a model drafter; 5: Mamba2 layer kinds, leak tables by recurrent family;
# 6: good and corrupted tokens per step; 7: the sampler at temperature > 0 and each step's exact law against exact's;
# 8: short-conv layers ('c', LFM2) and the conv family, whose window is its whole state (no state_rel); Mamba1
# layers ('s', Jamba) and the mamba1 family; lightning attention ('l', MiniMax), no conv (no conv_rel); Kimi Delta
# Attention ('k', Kimi Linear) and the kda family; 9: Zamba2's hybrid layers ('z', attention then Mamba2; mamba2 family);
# 10: precision.oracle_products (a full-size bf16 model's oracle takes its products in three bf16 parts);
# 11: provenance.engine.sources (the files an engine kernel's module reaches in its package, each one's sha256);
# 12: environment.triton (the Triton that compiled or interpreted the kernels; None where none is installed)

Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
NonNeg = Annotated[float, Field(ge=0.0)]
Rate = Annotated[float, Field(ge=0.0, le=1.0)]
Token = Annotated[int, Field(ge=0)]
Mode = Literal["exact", "leaky", "leaky-state", "leaky-conv"]
Dtype = Literal["float64", "float32", "bfloat16", "float16"]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]

REL_TOL = 1e-9  # recomputed means and rates agree with the stored ones to this relative tolerance


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-300)


def _need(cond: bool, where: str, why: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {why}")


# --- distributions -----------------------------------------------------------------------------

class Summary(_Strict):
    """Median / p90 / max / mean of non-negative values, with their count; all null when n = 0."""
    n: Count
    mean: NonNeg | None
    median: NonNeg | None
    p90: NonNeg | None
    max: NonNeg | None

    @model_validator(mode="after")
    def _ordered(self):
        stats = (self.mean, self.median, self.p90, self.max)
        if self.n == 0:
            _need(all(s is None for s in stats), "summary", "n = 0 but statistics are given")
        else:
            _need(all(s is not None for s in stats), "summary", f"n = {self.n} but a statistic is null")
            top = self.max * (1 + 1e-12) + 1e-300
            _need(self.median <= top and self.p90 <= top and self.mean <= top, "summary",
                  "median, p90 or mean above max")
        return self


class Split(_Strict):
    """A per-node quantity summarised over order-exact nodes and over the others."""
    order_exact: Summary
    other: Summary


class FlipRates(_Strict):
    order_exact: Rate | None
    other: Rate | None
    all: Rate | None


class DepthRow(_Strict):
    depth: Count
    nodes: Count
    state_rel: Summary
    hidden_rel_last: Summary
    argmax_flip_rate: Rate | None


class RankRow(_Strict):
    rank: Count
    nodes: Count
    state_rel: Summary
    hidden_rel_last: Summary
    argmax_flip_rate: Rate | None


class LayerRow(_Strict):
    layer: Count
    kind: Literal["g", "a", "m", "p", "f", "c", "s", "l", "k", "z"]  # ddsim.model.config.LAYER_KINDS
    hidden_rel: Summary
    state_rel: Summary | None = None  # layers with a recurrent state (STATEFUL_KINDS) only
    conv_rel: Summary | None = None  # layers with a conv window (WINDOWED_KINDS)

    @model_validator(mode="after")
    def _recurrent(self):
        _need((self.state_rel is not None) == (self.kind in STATEFUL_KINDS)
              and (self.conv_rel is not None) == (self.kind in WINDOWED_KINDS),
              f"by_layer[{self.layer}]", "state_rel is given exactly for layers with a recurrent state, conv_rel for "
                                         "layers with a conv window")
        return self


class FamilyRow(_Strict):
    """The leak of one recurrent family (all its layers, nodes that are not order-exact)."""
    family: Literal["gdn", "mamba2", "conv", "mamba1", "lightning", "kda"]
    layers: Positive
    state_rel: Summary | None  # None for the short convs (LFM2): their window is their whole state
    conv_rel: Summary | None  # None for lightning attention (MiniMax): it has no conv

    @model_validator(mode="after")
    def _stateless(self):
        _need((self.state_rel is None) == (self.family == "conv"), f"by_family[{self.family}]",
              "state_rel is given exactly for the families that keep a state beside the window")
        _need((self.conv_rel is None) == (self.family == "lightning"), f"by_family[{self.family}]",
              "conv_rel is given exactly for the families that keep a conv window")
        return self


class LeakTable(_Strict):
    """One mode against the oracle over every node of every measured step of one budget."""
    nodes: Count
    order_exact_nodes: Count
    not_order_exact_nodes: Count  # the leak's coverage: nodes whose flattened state is wrong
    argmax_flip_rate: FlipRates
    kl: Split
    max_abs_logit: Split
    state_rel: Split
    conv_rel: Split
    hidden_rel_last: Split
    by_depth: list[DepthRow]
    by_rank: list[RankRow]
    by_layer: list[LayerRow]
    by_family: list[FamilyRow]
    margin_of_flipped: Summary
    margin_all: Summary

    @model_validator(mode="after")
    def _counts(self):
        n, ox, other = self.nodes, self.order_exact_nodes, self.not_order_exact_nodes
        _need(ox + other == n, "leak", f"order_exact_nodes {ox} + not_order_exact_nodes {other} != nodes {n}")
        for name in ("kl", "max_abs_logit"):
            s = getattr(self, name)
            _need(s.order_exact.n == ox and s.other.n == other, f"leak.{name}", "counts differ from the node counts")
        _need(self.margin_all.n == n, "leak.margin_all", f"n {self.margin_all.n} != nodes {n}")
        _need(sum(r.nodes for r in self.by_depth) == n, "leak.by_depth", "node counts do not add up to nodes")
        fr = self.argmax_flip_rate
        for name, rate, count in (("order_exact", fr.order_exact, ox), ("other", fr.other, other), ("all", fr.all, n)):
            _need((rate is None) == (count == 0), f"leak.argmax_flip_rate.{name}", "null exactly when there are no nodes")
        if n:
            flips = (fr.order_exact or 0.0) * ox + (fr.other or 0.0) * other
            _need(abs(flips - fr.all * n) <= 1e-6 * max(1, n), "leak.argmax_flip_rate.all",
                  "is not the node-weighted mean of order_exact and other")
            _need(self.margin_of_flipped.n == round(fr.all * n), "leak.margin_of_flipped",
                  "count differs from the flipped nodes")
        return self


class NoiseFloor(_Strict):
    """The exact fast path against the oracle on one budget's trees: the arithmetic's own error."""
    state_rel_max: NonNeg | None
    kl_max: NonNeg | None
    argmax_flip_rate: Rate | None

    @classmethod
    def of(cls, exact: LeakTable) -> "NoiseFloor":
        """Worst case over every node, order-exact or not (the exact path has no leak to split by)."""
        def worst(split: Split):
            vals = [s.max for s in (split.order_exact, split.other) if s.n]
            return max(vals) if vals else None
        return cls(state_rel_max=worst(exact.state_rel), kl_max=worst(exact.kl),
                   argmax_flip_rate=exact.argmax_flip_rate.all)


def noise_margin_of(exact_tables: list[LeakTable], temperature: float) -> float:
    """The largest oracle top-1 margin among nodes whose argmax the exact path's arithmetic flipped,
    over every budget (0 when it never did), in decision-score units (nats / temperature when
    sampling): a divergence from the reference at a smaller margin may be the arithmetic's doing."""
    m = max((t.margin_of_flipped.max for t in exact_tables if t.margin_of_flipped.n), default=0.0)
    return m / temperature if temperature > 0 else m


# --- generations and their summaries ------------------------------------------------------------

class Generation(_Strict):
    """One speculative generation: a prompt, a tree policy (budget None: the chain) and a mode."""
    prompt: Count
    budget: Positive | None
    mode: Mode
    policy: str
    tokens: list[Token]
    first_divergence: Count | None
    divergence_margin: NonNeg | None
    agreement: Rate | None
    silent_corruption_steps: Count
    tokens_per_step: NonNeg
    accepted: list[Count]  # draft tokens accepted per step
    decision_flips: list[Count]  # per step, nodes on the reference walk whose decision differs
    reference_walk: list[Positive]  # per step, nodes on the reference walk (root included)
    tree_sizes: list[Positive]
    # temperature > 0 (null at 0), per step: the step's exact law under the sampler (ddsim.sampling.law) from the
    # mode's per-node distributions against exact verification's from the same state
    emitted_tv: list[Rate] | None = None  # total variation between the emitted-sequence laws
    length_tv: list[Rate] | None = None  # between the accepted-length distributions
    expected_accepted: list[NonNeg] | None = None  # E[draft tokens accepted], the mode's distributions
    expected_accepted_exact: list[NonNeg] | None = None  # and exact verification's
    # the generation measured against the oracle (mode leaky) at temperature > 0: per step, exact verification's
    # law against the oracle's, emitted tokens and accepted length (the exact path's arithmetic noise)
    noise_tv: list[Rate] | None = None
    noise_length_tv: list[Rate] | None = None

    @model_validator(mode="after")
    def _steps(self):
        k = len(self.accepted)
        laws = (self.emitted_tv, self.length_tv, self.expected_accepted, self.expected_accepted_exact)
        _need(all(x is None for x in laws) or all(x is not None and len(x) == k for x in laws), "generation",
              "emitted_tv, length_tv and the expected accepted lengths must all be null or one per step")
        _need((self.noise_tv is None) == (self.noise_length_tv is None) and (self.noise_tv is None or (
            len(self.noise_tv) == len(self.noise_length_tv) == k and self.emitted_tv is not None)), "generation",
              "noise_tv and noise_length_tv must both be null or one per step of a sampled generation")
        if self.mode == "exact" and self.emitted_tv is not None:
            _need(all(x == 0 for x in self.emitted_tv + self.length_tv), "generation",
                  "exact verification's law differs from itself")
        _need(len(self.decision_flips) == k and len(self.tree_sizes) == k and len(self.reference_walk) == k,
              "generation", "accepted, decision_flips, reference_walk and tree_sizes differ in length")
        _need(all(f <= w <= s for f, w, s in zip(self.decision_flips, self.reference_walk, self.tree_sizes)),
              "generation", "more decision flips than nodes on the reference walk, or a walk longer than its tree")
        _need(all(a < s for a, s in zip(self.accepted, self.tree_sizes)), "generation",
              "accepted more draft tokens than the tree holds")
        _need(len(self.tokens) == sum(a + 1 for a in self.accepted), "generation",
              "tokens do not match the accepted lengths (each step emits accepted + 1)")
        _need(self.silent_corruption_steps <= k, "generation", "more silent-corruption steps than steps")
        _need(_close(self.tokens_per_step, (len(self.tokens) / k) if k else 0.0), "generation.tokens_per_step",
              "does not match tokens and steps")
        return self

    def check_against(self, reference: list[int], margins: list[float | None], where: str) -> None:
        """first_divergence, agreement and divergence_margin recomputed from the prompt's reference."""
        first = next((i for i, (a, b) in enumerate(zip(self.tokens, reference)) if a != b), None)
        _need(self.first_divergence == first, f"{where}.first_divergence", f"{self.first_divergence} but the tokens "
              f"leave the reference at {first}")
        n = min(len(self.tokens), len(reference))
        agreement = (sum(a == b for a, b in zip(self.tokens[:n], reference[:n])) / n) if n else 1.0
        _need(_close(self.agreement, agreement), f"{where}.agreement", "does not match the tokens")
        margin = None if first is None else margins[first]
        _need(_close(self.divergence_margin, margin), f"{where}.divergence_margin",
              "is not the reference's margin at the first divergence")


def _law_summary(gens: list[Generation]) -> dict:
    """ModeSummary's temperature > 0 fields from the generations' per-step laws (empty at temperature 0)."""
    if not gens or any(g.emitted_tv is None for g in gens):
        return {}
    tv = [x for g in gens for x in g.emitted_tv]
    if not tv:
        return {}
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    noise = {} if any(g.noise_tv is None for g in gens) else {
        "noise_tv_max": max(x for g in gens for x in g.noise_tv),
        "noise_length_tv_max": max(x for g in gens for x in g.noise_length_tv)}
    return {**noise, "emitted_tv_max": max(tv), "emitted_tv_mean": mean(tv),
            "accepted_length_tv_max": max(x for g in gens for x in g.length_tv),
            "expected_accepted_per_step": mean([x for g in gens for x in g.expected_accepted]),
            "expected_accepted_exact_per_step": mean([x for g in gens for x in g.expected_accepted_exact])}


class ModeSummary(_Strict):
    generations: Count
    steps: Count
    tokens_per_step: NonNeg
    mean_tree_size: NonNeg
    accepted_histogram: list[Count]
    good_tokens_per_step: NonNeg  # of tokens_per_step, those emitted before the generation left the reference
    corrupted_tokens_per_step: NonNeg  # the rest: emitted after it left (a leaky mode's output is no longer the model's)
    silent_corruption_steps: Count
    decision_flips: Count
    decision_flip_rate: Rate
    generations_leaving_greedy: Count
    generations_leaving_greedy_above_noise: Count
    first_divergence: list[Count | None]
    agreement: Rate | None
    survival: list[Rate]
    # temperature > 0 (null at 0): the leak's effect on the output distribution, exactly, over every step
    emitted_tv_max: Rate | None = None
    emitted_tv_mean: Rate | None = None
    accepted_length_tv_max: Rate | None = None
    expected_accepted_per_step: NonNeg | None = None
    expected_accepted_exact_per_step: NonNeg | None = None
    noise_tv_max: Rate | None = None  # the generations measured against the oracle: exact's law against the oracle's
    noise_length_tv_max: Rate | None = None

    @classmethod
    def of(cls, gens: list[Generation], *, ref_len: int, noise_margin: float) -> "ModeSummary":
        """The summary of ``gens`` (one per prompt, in prompt order); the audit writes it and loading
        recomputes it. ``noise_margin``: divergences where the reference led by no more than this
        are counted apart (possibly the arithmetic's doing)."""
        acc = [a for g in gens for a in g.accepted]
        steps = len(acc)
        flips = sum(f for g in gens for f in g.decision_flips)
        on_walk = sum(a + 1 for a in acc)  # nodes the mode's own walk accepted, root included
        on_reference = sum(w for g in gens for w in g.reference_walk)  # decisions the reference walk looked at
        divs = [g.first_divergence for g in gens]
        hist = [0] * (max(acc) + 1) if acc else []
        for a in acc:
            hist[a] += 1
        # tokens that agree with the reference: everything before each generation's first divergence
        good = sum(len(g.tokens) if g.first_divergence is None else min(g.first_divergence, len(g.tokens)) for g in gens)
        return cls(
            generations=len(gens), steps=steps,
            tokens_per_step=(on_walk / steps) if steps else 0.0,
            good_tokens_per_step=(good / steps) if steps else 0.0,
            corrupted_tokens_per_step=((on_walk - good) / steps) if steps else 0.0,
            mean_tree_size=(sum(s for g in gens for s in g.tree_sizes) / steps) if steps else 0.0,
            accepted_histogram=hist,
            silent_corruption_steps=sum(g.silent_corruption_steps for g in gens),
            decision_flips=flips, decision_flip_rate=(flips / on_reference) if on_reference else 0.0,
            generations_leaving_greedy=sum(d is not None for d in divs),
            generations_leaving_greedy_above_noise=sum(
                g.divergence_margin is not None and g.divergence_margin > noise_margin for g in gens),
            first_divergence=divs,
            agreement=(sum(g.agreement for g in gens) / len(gens)) if gens and all(
                g.agreement is not None for g in gens) else None,
            survival=[sum(d is None or d > i for d in divs) / len(divs) for i in range(ref_len)] if divs else [],
            **_law_summary(gens),
        )

    def check_equal(self, other: "ModeSummary", where: str) -> None:
        for name in type(self).model_fields:
            a, b = getattr(self, name), getattr(other, name)
            if isinstance(a, list):
                same = len(a) == len(b) and all(_close(x, y) if isinstance(x, float) else x == y for x, y in zip(a, b))
            elif isinstance(a, float) or isinstance(b, float):
                same = _close(a, b)
            else:
                same = a == b
            _need(same, f"{where}.{name}", f"{a!r} but generations[] give {b!r}")


# --- the rest of the report ---------------------------------------------------------------------

class Precision(_Strict):
    """The arithmetic compared: the fast path's weights and activations, its states, the oracle's."""
    fast_path: Dtype
    recurrent_state: Literal["float64", "float32"]
    oracle: Literal["float64", "float32"]
    # the oracle's products by the weights: "converted" (the weights in its dtype), or "bf16x3" (bf16 weights left as
    # they are, the other operand in three bf16 parts, float32 accumulation: a full-size bf16 model on a GPU)
    oracle_products: Literal["converted", "bf16x3"]


class RunEnvironment(_Strict):
    """What a run ran under (ddsim.environment): a replay's report records this much."""
    python: str
    platform: str
    torch: str
    triton: str | None  # the Triton release installed (its kernels' compiler and CPU interpreter); None: none
    numpy: str
    ddsim: str
    device: str
    threads: Positive
    device_name: str | None = None  # on CUDA


class Environment(RunEnvironment):
    """An audit's: with the releases of the libraries its report and report.html are written with."""
    matplotlib: str
    pydantic: str


class EngineRecord(_Strict):
    """An external GDN kernel the fast path ran (``--fast-path``), as ddsim.engines loaded it."""
    name: str
    modes: list[Literal["exact", "leaky"]]  # the recurrence modes it computed
    package: str | None
    version: str | None
    source: str | None  # the file the kernel lives in, and its sha256
    source_sha256: Sha256 | None
    # every file its module reaches in its package (ddsim.engines.sources), by path from the package's directory
    sources: dict[str, Sha256]


class Provenance(_Strict):
    """What was audited: enough to refuse a report of another model, run or version."""
    ddsim_version: str
    source: str  # "preset NAME" or "checkpoint DIR"
    weights_sha256: Sha256  # preset: the generated tensors; checkpoint: config.json and the weight files
    fast_path: str  # the verify implementation the audit ran
    engine: EngineRecord | None  # the external kernel behind it (--fast-path), None for ddsim's own
    inputs_sha256: dict[Literal["prompts", "trace", "cost"], Sha256]  # the files given, by option


class SyntheticDrafterParams(_Strict):
    kind: Literal["synthetic"]
    depth: Positive
    accuracy: Rate
    accuracy_decay: Rate
    sharpness: NonNeg
    recall: Rate
    noise: NonNeg
    seed: Count


class TraceDrafterParams(_Strict):
    kind: Literal["trace"]
    path: str
    steps: Positive
    depth: Positive
    topk: Positive


class ModelDrafterParams(_Strict):
    kind: Literal["model"]
    path: str
    sha256: Sha256  # config.json and the weight files, as for the target
    depth: Positive


class ReportConfig(AuditConfig):
    drafter: Annotated[SyntheticDrafterParams | TraceDrafterParams | ModelDrafterParams, Field(discriminator="kind")]


class GateStats(_Strict):
    exp_g_typical: Summary  # exp(g) at gate input 0, per GDN head: how long heads remember
    halflife_tokens: Summary


class ModelRecord(_Strict):
    config: dict[str, str | int | float | bool | list[int | float | None] | None]  # ddsim.model.config.ModelConfig fields
    source: str
    gates: GateStats

    @model_validator(mode="after")
    def _pattern(self):
        lp = self.config.get("layer_pattern")
        _need(isinstance(lp, str) and len(lp) >= 1 and set(lp) <= set(LAYER_KINDS), "model.config.layer_pattern",
              f"expected a non-empty string over {LAYER_KINDS!r}, got {lp!r}")
        v = self.config.get("vocab_size")
        _need(is_int(v) and v >= 1, "model.config.vocab_size", f"expected a positive integer, got {v!r}")
        return self

    @property
    def layer_pattern(self) -> str:
        return self.config["layer_pattern"]

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]


class PromptRecord(_Strict):
    index: Count
    tokens: Annotated[list[Token], Field(min_length=1)]
    reference: list[Token]
    reference_margins: list[NonNeg | None]  # null: no runner-up (infinite margin)


class BudgetRecord(_Strict):
    budget: Positive
    policy: str
    modes: dict[Mode, ModeSummary]
    leak: dict[Mode, LeakTable]

    @model_validator(mode="after")
    def _every_mode(self):
        for name in ("modes", "leak"):
            missing = [m for m in VERIFY_MODES if m not in getattr(self, name)]
            _need(not missing, f"budgets[{self.budget}].{name}", f"mode {missing[0] if missing else ''!r} missing")
        nodes = {m: (t.nodes, t.order_exact_nodes) for m, t in self.leak.items()}
        _need(len(set(nodes.values())) == 1, f"budgets[{self.budget}].leak",
              "modes were measured on different trees (node counts differ)")
        return self


class CostRecord(_Strict):
    node_cost: NonNeg
    draft_cost: NonNeg
    mode_factor: dict[Mode, Annotated[float, Field(gt=0.0)]]
    table: list[tuple[Positive, Annotated[float, Field(gt=0.0)]]] | None
    source: str


class ThroughputRow(_Strict):
    label: str
    mode: Mode
    budget: Positive | None
    tokens_per_step: NonNeg
    nodes: NonNeg
    step_cost: Annotated[float, Field(gt=0.0)]
    speedup_vs_ar: NonNeg
    speedup_vs_chain: NonNeg | None


class Throughput(_Strict):
    cost_model: CostRecord
    rows: list[ThroughputRow]


class MeasuredStep(_Strict):
    """One decoding step timed as the serving model runs it (ddsim.measure.step_timing), milliseconds."""
    label: str  # "autoregressive", "chain" or the tree policy
    mode: Mode
    budget: Positive | None
    nodes: Positive
    verify_ms: NonNeg
    commit_ms: NonNeg
    step_ms: Annotated[float, Field(gt=0.0)]  # verify + commit (the draft is not timed: ddsim.measure.step_timing)
    tokens_per_step: NonNeg
    tokens_per_s: NonNeg
    speedup_vs_ar: NonNeg

    @model_validator(mode="after")
    def _sums(self):
        _need(_close(self.step_ms, self.verify_ms + self.commit_ms), "measured step",
              f"{self.label} {self.mode}: step_ms is not verify + commit")
        _need(_close(self.tokens_per_s, self.tokens_per_step / self.step_ms * 1e3), "measured step",
              f"{self.label} {self.mode}: tokens_per_s is not tokens_per_step / step_ms")
        return self


class MeasuredSteps(_Strict):
    """Measured decoding steps (on CUDA by default; --measure-steps): the machine's, not the seed's, so two runs
    of one seed differ here and nowhere else besides the time stamp and environment."""
    device: str
    warmup: Count
    repeats: Positive
    rows: list[MeasuredStep]


FRAGILE_FRACTION = 0.5  # a reference whose decisions lie within the noise margin more often than this is too fragile


class ReferenceFragility(_Strict):
    """How many of the reference decoding's decisions (every prompt's every token) the reference took
    by no more than the noise margin: there, the exact path's own arithmetic could have chosen the
    runner-up, so a divergence says nothing about the leak. Too many, and the audit cannot judge."""
    decisions: Count
    within_noise_margin: Count
    fraction: Rate
    fragile: bool

    @classmethod
    def of(cls, margins: list[list[float | None]], noise_margin: float) -> "ReferenceFragility":
        flat = [m for ms in margins for m in ms]
        within = sum(m is not None and m <= noise_margin for m in flat)
        frac = within / len(flat) if flat else 1.0
        return cls(decisions=len(flat), within_noise_margin=within, fraction=frac, fragile=frac > FRAGILE_FRACTION)


class Report(_Strict):
    schema_version: Literal[12]
    generated_at: str | None  # the only field that differs between two runs of one seed; set by the writer
    config: ReportConfig
    provenance: Provenance
    environment: Environment
    precision: Precision
    model: ModelRecord
    prompts: Annotated[list[PromptRecord], Field(min_length=1)]
    chain: ModeSummary
    budgets: Annotated[list[BudgetRecord], Field(min_length=1)]
    noise_margin: NonNeg
    reference_fragility: ReferenceFragility
    noise_floor: dict[str, NoiseFloor]
    throughput: Throughput
    generations: list[Generation]
    measured_steps: MeasuredSteps | None = None

    @model_validator(mode="after")
    def _consistent(self):
        check_consistency(self)
        return self


def check_consistency(r: Report) -> None:
    """Everything a report says twice must agree; ValueError names the first disagreement."""
    cfg = r.config
    # the budgets audited are the budgets asked for, each once, in order
    got = [b.budget for b in r.budgets]
    _need(got == list(cfg.budgets), "budgets", f"{got} but config.budgets is {list(cfg.budgets)}")
    # provenance, environment and precision tell one story
    _need(r.provenance.ddsim_version == r.environment.ddsim, "provenance.ddsim_version",
          f"{r.provenance.ddsim_version!r} but environment.ddsim is {r.environment.ddsim!r}")
    source = f"checkpoint {cfg.model_path}" if cfg.model_path else f"preset {cfg.preset}"
    _need(r.provenance.source == source and r.model.source == source, "provenance.source",
          f"{r.provenance.source!r} / model.source {r.model.source!r}, but config audits {source}")
    device = r.environment.device.split(":")[0]
    _need(device in ("cpu", "cuda"), "environment.device", f"unknown device {r.environment.device!r}")
    _need(device == cfg.device.split(":")[0] or cfg.device == "auto", "environment.device",
          f"{r.environment.device!r} but config.device is {cfg.device!r}")
    if device == "cpu":
        _need(r.precision.fast_path == "float32" and r.precision.oracle == "float64", "precision",
              "a CPU audit compares a float32 fast path with the float64 oracle")
    else:
        _need(r.precision.oracle == "float32", "precision.oracle", "a CUDA audit runs the float32 oracle")
    _need(r.precision.oracle_products == "converted" or (device == "cuda" and r.precision.fast_path == "bfloat16"),
          "precision.oracle_products", "bf16x3 products are the oracle's on a bf16 model on a GPU only")
    _need((cfg.fast_path == "ddsim") == (r.provenance.engine is None), "provenance.engine",
          f"config.fast_path is {cfg.fast_path!r} but the engine record is {r.provenance.engine!r}")
    given = {k for k, v in (("prompts", cfg.prompts_file), ("trace", cfg.trace), ("cost", cfg.cost_file)) if v}
    _need(set(r.provenance.inputs_sha256) == given, "provenance.inputs_sha256",
          f"digests for {sorted(r.provenance.inputs_sha256)} but the files given are {sorted(given)}")
    drafter = cfg.drafter
    depth = drafter.depth
    ref_len = cfg.steps * (depth + 1)
    # prompts: numbered in order, each with a reference as long as every generation, a margin per token
    vocab = r.model.vocab_size
    for i, p in enumerate(r.prompts):
        where = f"prompts[{i}]"
        _need(p.index == i, f"{where}.index", f"{p.index}, expected {i}")
        _need(len(p.reference) == ref_len and len(p.reference_margins) == ref_len, where,
              f"reference of {len(p.reference)} tokens / {len(p.reference_margins)} margins, expected {ref_len}")
        _need(all(t < vocab for t in p.tokens + p.reference), where, f"token outside the vocabulary ({vocab})")
    # generations: every (prompt, budget, mode) exactly once, chain (budget null) in exact mode only
    expected = {(i, None, "exact") for i in range(len(r.prompts))}
    expected |= {(i, b, m) for i in range(len(r.prompts)) for b in cfg.budgets for m in VERIFY_MODES}
    seen: dict[tuple, Generation] = {}
    for j, g in enumerate(r.generations):
        key = (g.prompt, g.budget, g.mode)
        where = f"generations[{j}]"
        _need(key in expected, where, f"prompt {g.prompt}, budget {g.budget}, mode {g.mode} was not audited")
        _need(key not in seen, where, f"prompt {g.prompt}, budget {g.budget}, mode {g.mode} appears twice")
        seen[key] = g
        _need(len(g.accepted) == cfg.steps, where, f"{len(g.accepted)} steps, config.steps is {cfg.steps}")
        _need(all(t < vocab for t in g.tokens), where, f"token outside the vocabulary ({vocab})")
        _need((g.emitted_tv is not None) == (cfg.temperature > 0), where,
              "per-step laws are recorded exactly when the temperature is > 0")
        _need((g.noise_tv is not None) == (cfg.temperature > 0 and g.mode == "leaky" and g.budget is not None), where,
              "the exact path's noise is recorded exactly for the sampled generations measured against the oracle")
        p = r.prompts[g.prompt]
        g.check_against(p.reference, p.reference_margins, where)
    missing = sorted(expected - set(seen), key=str)
    _need(not missing, "generations", f"prompt {missing[0][0]}, budget {missing[0][1]}, mode {missing[0][2]} "
          "is missing" if missing else "")
    # the leak tables count every node of the leaky generations' trees (each mode's table: BudgetRecord)
    for b in r.budgets:
        nodes = sum(sum(g.tree_sizes) for k, g in seen.items() if k[1] == b.budget and k[2] == "leaky")
        _need(b.leak["leaky"].nodes == nodes, f"budgets[{b.budget}].leak",
              f"{b.leak['leaky'].nodes} nodes, but the leaky generations' trees have {nodes}")
    # the noise margin and floor follow from the exact path's leak tables
    margin = noise_margin_of([b.leak["exact"] for b in r.budgets], cfg.temperature)
    _need(_close(r.noise_margin, margin), "noise_margin", f"{r.noise_margin!r} but the exact leak tables give {margin!r}")
    frag = ReferenceFragility.of([p.reference_margins for p in r.prompts], r.noise_margin)
    _need(r.reference_fragility == frag, "reference_fragility", f"{r.reference_fragility!r} but the prompts' reference "
          f"margins and the noise margin give {frag!r}")
    _need(set(r.noise_floor) == {str(b) for b in cfg.budgets}, "noise_floor",
          f"budgets {sorted(r.noise_floor)} but config.budgets is {list(cfg.budgets)}")
    for b in r.budgets:
        floor = NoiseFloor.of(b.leak["exact"])
        for name in NoiseFloor.model_fields:
            _need(_close(getattr(r.noise_floor[str(b.budget)], name), getattr(floor, name)),
                  f"noise_floor[{b.budget}].{name}", "does not match the budget's exact leak table")
    # every summary the gate reads is recomputed from generations[]
    order = lambda gs: [gs[k] for k in sorted(gs)]  # noqa: E731
    chain = order({g.prompt: g for k, g in seen.items() if k[1] is None})
    r.chain.check_equal(ModeSummary.of(chain, ref_len=ref_len, noise_margin=r.noise_margin), "chain")
    for b in r.budgets:
        for m in VERIFY_MODES:
            gens = order({g.prompt: g for k, g in seen.items() if k[1] == b.budget and k[2] == m})
            b.modes[m].check_equal(ModeSummary.of(gens, ref_len=ref_len, noise_margin=r.noise_margin),
                                   f"budgets[{b.budget}].modes.{m}")
    # the leak tables: layers match the model; the leak modes' coverage is the exact table's
    pattern = r.model.layer_pattern
    for b in r.budgets:
        for m, t in b.leak.items():
            _need([row.kind for row in t.by_layer] == list(pattern) and [row.layer for row in t.by_layer] ==
                  list(range(len(pattern))), f"budgets[{b.budget}].leak.{m}.by_layer", "does not match the model's layers")
            fams = {}
            for kind in pattern:
                if kind in FAMILIES:
                    fams[FAMILIES[kind]] = fams.get(FAMILIES[kind], 0) + 1
            _need([(f.family, f.layers) for f in t.by_family] == [(k, n) for k, n in sorted(fams.items()) if n],
                  f"budgets[{b.budget}].leak.{m}.by_family", "does not match the model's recurrent layers")
    # measured steps: the autoregressive step, the chain and every (budget, mode) once, at the summaries' tokens
    # per step
    if r.measured_steps is not None:
        ms = {(row.label, row.budget, row.mode): row for row in r.measured_steps.rows}
        want_ms = {("autoregressive", None, "exact"): 1.0, ("chain", None, "exact"): r.chain.tokens_per_step}
        want_ms.update({(f"ddtree-{b.budget}", b.budget, m): b.modes[m].tokens_per_step for b in r.budgets
                        for m in VERIFY_MODES})
        _need(len(ms) == len(r.measured_steps.rows) and set(ms) == set(want_ms), "measured_steps.rows",
              "expected the autoregressive step, the chain and every budget and mode once")
        for k, row in ms.items():
            _need(_close(row.tokens_per_step, want_ms[k]), "measured_steps.rows",
                  f"{k[0]} {k[2]}: tokens_per_step does not match its summary")
    # throughput rows: one per (chain) and (budget, mode), with the summaries' tokens per step
    rows = {(row.budget, row.mode, row.label): row for row in r.throughput.rows}
    _need(len(rows) == len(r.throughput.rows) == 1 + len(r.budgets) * len(VERIFY_MODES), "throughput.rows",
          "expected one row for the chain and one per budget and mode")
    want = {(None, "exact"): r.chain.tokens_per_step}
    want.update({(b.budget, m): b.modes[m].tokens_per_step for b in r.budgets for m in VERIFY_MODES})
    for (bud, mode, _), row in rows.items():
        _need((bud, mode) in want and _close(row.tokens_per_step, want[(bud, mode)]), "throughput.rows",
              f"budget {bud} mode {mode}: tokens_per_step does not match its summary")

