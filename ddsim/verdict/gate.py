"""The CI gate: a TOML policy evaluated against a validated report. Fails closed: anything that
cannot be evaluated is an error (exit 2), never a pass; an audit that never exercised the leak is a
violation (exit 1), whatever the other rules say.

Policy file:
  [policy]   name = "...", mode = "leaky" | "leaky-state" | "leaky-conv" (the mode being approved)
  [rules]    upper bounds on measured values, worst case over every budget of the audit
  [rules.<dtype>]  (bfloat16, float16, float32, float64) bounds that replace or add to [rules] for
             reports whose fast path computes in that dtype: the exact path's distance from the
             oracle is a property of the arithmetic, the leak is not
  [require]  lower bounds: how much of the leak the audit must have exercised
  [replay]   upper bounds on a replay of an engine's dump (``gate --dump``), and ``noise_kl``: the KL
             within which an engine's logits count as the oracle's; [replay.<dtype>] gives the
             tolerance for an engine that computes in that dtype (chosen on the gate's command line;
             a dump's own header can only tighten it)
Unknown tables and keys at any level are refused: a typo must not quietly gate something else.

A bare name (no path separator, no suffix) is a built-in policy and nothing else: a file of that name
in the working directory is never read in its place. A file is given as a path. Every verdict names
the policy's source and sha256, and a policy that omits or loosens a rule of the built-in default
says so in the verdict, rule by rule (``relaxations``).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ddsim.errors import InputError
from ddsim.model.config import STATEFUL_KINDS
from ddsim.trees.modes import LEAK_MODES
from ddsim.values import is_real
from ddsim.verdict.report_model import Report

GATED_MODES = LEAK_MODES
PRECISIONS = ("float64", "float32", "bfloat16", "float16")
BUILTIN_POLICIES = Path(__file__).with_name("policies")
DEFAULT_POLICY = "hybrid-unsafe"


def _worst(values: list[float]) -> float:
    """The largest of one value per budget; every value must be there (the report model guarantees
    it, this guards the rule functions against an empty audit)."""
    if not values or any(v is None or not math.isfinite(v) for v in values):
        raise InputError("report: a rule's measurement is missing or non-finite in some budget")
    return max(values)


def _flip_excess(r: Report, mode: str) -> float:
    """How much more often the mode flips a node's argmax against the oracle than the exact path's
    arithmetic does, worst budget (rates over every measured node)."""
    out = []
    for b in r.budgets:
        leak, exact = b.leak[mode].argmax_flip_rate.all, b.leak["exact"].argmax_flip_rate.all
        if leak is None or exact is None:
            raise InputError(f"report: budget {b.budget} measured no node (argmax flip rate is null)")
        out.append(leak - exact)
    return _worst(out)


def _mode_worst(r: Report, field: str, mode: str) -> float:
    """The worst over budgets of a mode summary's ``field``."""
    return _worst([getattr(b.modes[mode], field) for b in r.budgets])


def _floor_worst(r: Report, field: str) -> float:
    """The worst over budgets of a noise-floor ``field`` (the exact path against the oracle)."""
    return _worst([getattr(v, field) for v in r.noise_floor.values()])


# rule -> (measurement, meaning); every rule is an upper bound
RULES = {
    "argmax_flip_rate_above_noise": (_flip_excess, "argmax flip rate of the mode minus the exact path's"),
    "decision_flip_rate": (lambda r, m: _mode_worst(r, "decision_flip_rate", m),
                           "accept decisions that differ along the reference walk, per node on it"),
    "generations_leaving_greedy": (lambda r, m: _mode_worst(r, "generations_leaving_greedy", m),
                                   "generations whose output leaves the reference"),
    "generations_leaving_greedy_above_noise": (
        lambda r, m: _mode_worst(r, "generations_leaving_greedy_above_noise", m),
        "generations leaving the reference where its choice led by more than the noise margin"),
    "silent_corruption_steps": (lambda r, m: _mode_worst(r, "silent_corruption_steps", m),
                                "steps emitting tokens exact verification would not"),
    "exact_generations_leaving_greedy": (lambda r, m: _mode_worst(r, "generations_leaving_greedy", "exact"),
                                         "exact-mode generations leaving the reference (must be lossless)"),
    "exact_generations_leaving_greedy_above_noise": (
        lambda r, m: _mode_worst(r, "generations_leaving_greedy_above_noise", "exact"),
        "exact-mode generations leaving the reference where its choice led by more than the noise margin"),
    "exact_state_rel_max": (lambda r, m: _floor_worst(r, "state_rel_max"),
                            "largest recurrent-state relative error of the exact path vs the oracle"),
    "exact_kl_max": (lambda r, m: _floor_worst(r, "kl_max"), "largest KL(oracle || exact)"),
    "sampled_emitted_tv_above_noise": (
        lambda r, m: _above_noise(r, m, "emitted_tv_max", "noise_tv_max"),
        "temperature > 0: largest total variation, over steps, between the emitted-token laws of the mode and of "
        "exact verification (exact, from the per-node distributions), minus the exact path's own against the "
        "oracle's"),
    "sampled_accepted_length_tv_above_noise": (
        lambda r, m: _above_noise(r, m, "accepted_length_tv_max", "noise_length_tv_max"),
        "temperature > 0: largest total variation between the accepted-length distributions of the mode and of "
        "exact verification, minus the exact path's own against the oracle's"),
}
# rules measured only at temperature > 0, and rules that compare generations with the reference decoding, which
# a sampler not coupled to seeded autoregressive sampling (anything but ddsim's Gumbel walk) cannot follow
SAMPLED_RULES = ("sampled_emitted_tv_above_noise", "sampled_accepted_length_tv_above_noise")
COUPLED_RULES = ("generations_leaving_greedy", "generations_leaving_greedy_above_noise",
                 "exact_generations_leaving_greedy", "exact_generations_leaving_greedy_above_noise")


def not_applicable(rule: str, report: Report) -> str | None:
    """Why ``rule`` does not apply to ``report`` (None: it does)."""
    cfg = report.config
    if rule in SAMPLED_RULES and cfg.temperature == 0:
        return "measured at temperature > 0 only"
    if rule == "exact_state_rel_max" and not any(k in STATEFUL_KINDS for k in report.model.layer_pattern):
        return ("the model's recurrent layers keep no state beside their conv windows (short convs); the exact path "
                "is judged by exact_kl_max and its generations")
    if rule in COUPLED_RULES and cfg.temperature > 0 and cfg.sampler not in (None, "gumbel"):
        return (f"the {cfg.sampler} sampler is not coupled to the seeded reference sampling; its effect on the output "
                "is judged by the sampled_* rules")
    return None


def _above_noise(r: Report, mode: str, field: str, noise: str) -> float:
    """Per budget, the mode's ``field`` minus the exact path's ``noise`` (measured against the oracle in the
    generations that are, mode leaky); the worst budget."""
    return _worst([None if getattr(b.modes[mode], field) is None or getattr(b.modes["leaky"], noise) is None else
                   getattr(b.modes[mode], field) - getattr(b.modes["leaky"], noise) for b in r.budgets])


def leak_nodes(r: Report, mode: str) -> int:
    """The fewest verified nodes, over budgets, that were not order-exact: where a flattened pass
    hands over a wrong state. Zero means the audit never exercised the leak in some budget."""
    return min(b.leak[mode].not_order_exact_nodes for b in r.budgets)


def reference_decisions_above_noise(r: Report, mode: str) -> float:
    """The fraction of the reference's decisions taken by more than the noise margin: where a
    divergence can be told from the exact path's own arithmetic."""
    return 1.0 - r.reference_fragility.fraction


# requirement -> (measurement, meaning); every requirement is a lower bound
REQUIREMENTS = {
    "leak_nodes_per_budget": (leak_nodes, "verified nodes that were not order-exact, fewest over budgets"),
    "reference_decisions_above_noise": (reference_decisions_above_noise,
                                        "fraction of the reference's decisions taken by more than the noise margin "
                                        "(below 0.5 the reference is too fragile to judge)"),
}
POLICY_KEYS = {"name", "mode", "description"}


@dataclass(frozen=True)
class Policy:
    path: str
    name: str
    mode: str
    rules: dict  # rule -> upper bound
    by_precision: dict  # fast-path dtype -> {rule: bound} replacing or adding to rules
    require: dict  # requirement -> lower bound
    replay: dict = None  # `gate --dump`: replay rule -> upper bound (REPLAY_RULES; 0 where the policy is silent)
    replay_noise_kl: dict = field(default_factory=dict)  # engine dtype ("" for any) -> KL tolerance of a replay
    builtin: bool = False  # a built-in policy, named by its bare name
    sha256: str = ""  # of the policy file's bytes

    def bounds(self, precision: str) -> dict:
        return {**self.rules, **self.by_precision.get(precision, {})}

    def noise_kl(self, engine_dtype: str) -> float:
        """The replay's KL tolerance for an engine computing in ``engine_dtype`` ([replay.<dtype>], else [replay])."""
        return self.replay_noise_kl.get(engine_dtype, self.replay_noise_kl[""])

    def source(self) -> str:
        """What the verdict names: built-in or the file, and the sha256 of its bytes."""
        return f"{'built-in ' + self.name if self.builtin else self.path}, sha256 {self.sha256[:16]}"


@dataclass(frozen=True)
class Verdict:
    rule: str
    measured: float
    bound: float
    holds: bool
    meaning: str
    kind: str = "max"  # "max": measured <= bound; "min": measured >= bound

    def line(self, mode: str) -> str:
        op = ">" if self.kind == "max" else "<"
        return f"VIOLATED {self.rule}: measured {self.measured:.6g} {op} bound {self.bound:.6g} ({self.meaning}; mode {mode})"


def _is_bare_name(name: str) -> bool:
    return "/" not in name and "\\" not in name and not Path(name).suffix and name not in (".", "..")


def resolve_policy(name: str) -> tuple[Path, bool]:
    """(file, built-in?): a bare name (no separator, no suffix) is a built-in policy only, never a file
    of that name in the working directory; anything else is a path."""
    if not _is_bare_name(name):
        return Path(name), False
    builtin = BUILTIN_POLICIES / f"{name}.toml"
    if builtin.is_file():
        return builtin, True
    known = ", ".join(sorted(x.stem for x in BUILTIN_POLICIES.glob("*.toml")))
    raise InputError(f"--policy {name}: no built-in policy of that name (built-in: {known}; a policy file is given as "
                     "a path, e.g. ./{name}.toml)".replace("{name}", name))


def load_policy(path: str | Path) -> Policy:
    p, builtin = resolve_policy(str(path))
    try:
        raw = p.read_bytes()
        data = tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read policy ({getattr(e, 'strerror', None) or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{p}: malformed TOML ({e})") from None
    unknown = sorted(set(data) - {"policy", "rules", "require", "replay"})
    if unknown:
        raise InputError(f"{p}: unknown table [{unknown[0]}] (known: [policy], [rules], [rules.<dtype>], [require], "
                         "[replay])")
    replay = data.get("replay", {})
    if not isinstance(replay, dict):
        raise InputError(f"{p}: 'replay' must be a table")
    replay_kl = {"": _bounds(p, {"noise_kl": replay.get("noise_kl", REPLAY_NOISE_KL)}, "replay", {"noise_kl": 0})["noise_kl"]}
    for dt in [k for k, v in replay.items() if isinstance(v, dict)]:
        if dt not in PRECISIONS:
            raise InputError(f"{p}: [replay.{dt}] names no dtype (known: {', '.join(PRECISIONS)})")
        replay_kl[dt] = _bounds(p, replay[dt], f"replay.{dt}", {"noise_kl": 0}).get("noise_kl", replay_kl[""])
    replay = {k: v for k, v in replay.items() if not isinstance(v, dict) and k != "noise_kl"}
    head = data.get("policy", {})
    if not isinstance(head, dict):
        raise InputError(f"{p}: 'policy' must be a table")
    bad = sorted(set(head) - POLICY_KEYS)
    if bad:
        raise InputError(f"{p}: unknown key {bad[0]!r} in [policy] (known: {', '.join(sorted(POLICY_KEYS))})")
    for k in ("name", "description"):
        if k in head and not isinstance(head[k], str):
            raise InputError(f"{p}: policy.{k} must be a string")
    rules = data.get("rules")
    if not isinstance(rules, dict) or not rules:
        raise InputError(f"{p}: no [rules] table (a policy with no rules would pass anything)")
    mode = head.get("mode", "leaky")
    if mode not in GATED_MODES:
        raise InputError(f"{p}: policy.mode {mode!r} is not one of {', '.join(GATED_MODES)}")
    by_precision = {}
    for dt, table in rules.items():
        if isinstance(table, dict):
            if dt not in PRECISIONS:
                raise InputError(f"{p}: [rules.{dt}] names no dtype (known: {', '.join(PRECISIONS)})")
            by_precision[dt] = _bounds(p, table, f"rules.{dt}", RULES)
    base = {k: v for k, v in rules.items() if k not in by_precision}
    if not base:
        raise InputError(f"{p}: [rules] has no bounds of its own (a report of another precision would pass anything)")
    require = data.get("require", {})
    if not isinstance(require, dict):
        raise InputError(f"{p}: 'require' must be a table")
    return Policy(str(p), str(head.get("name", p.stem)), mode, _bounds(p, base, "rules", RULES), by_precision,
                  _bounds(p, require, "require", REQUIREMENTS),
                  {**{k: 0.0 for k in REPLAY_RULES}, **_bounds(p, replay, "replay", REPLAY_RULES)},
                  replay_kl, builtin, hashlib.sha256(raw).hexdigest())


def relaxations(policy: Policy, precision: str | None) -> list[str]:
    """Each rule of the built-in default policy that ``policy`` omits or loosens, as "rule (built-in B,
    policy P)": for a report of fast-path dtype ``precision`` (its [rules] and [require]); for a replay
    (``precision`` None) its [replay] bounds and tolerance. Empty for the built-in policy itself."""
    base = load_policy(DEFAULT_POLICY)
    out = []

    def cmp(where, ours: dict, theirs: dict, looser):
        for rule, b in ours.items():
            v = theirs.get(rule)
            if v is None or looser(v, b):
                out.append(f"{where}{rule} (built-in {b:g}, policy {'omits it' if v is None else format(v, 'g')})")
    if policy.mode != base.mode:
        out.append(f"mode (built-in {base.mode}, policy {policy.mode})")
    if precision is None:
        cmp("replay.", base.replay, policy.replay, lambda v, b: v > b)
        for dt in ("", *PRECISIONS):
            ours, theirs = base.noise_kl(dt), policy.noise_kl(dt)
            if theirs > ours:
                out.append(f"replay{'.' + dt if dt else ''}.noise_kl (built-in {ours:g}, policy {theirs:g})")
        return out
    cmp("", base.bounds(precision), policy.bounds(precision), lambda v, b: v > b)
    cmp("require.", base.require, requirements(policy), lambda v, b: v < b)
    return out


def requirements(policy: Policy) -> dict:
    """The lower bounds the gate applies: the policy's [require], never below the built-in floors (at least
    one node outside order-exact positions per budget, a reference not too fragile to judge:
    ddsim.verdict.report_model.FRAGILE_FRACTION)."""
    require = {"leak_nodes_per_budget": 1.0, "reference_decisions_above_noise": 0.5, **policy.require}
    require["leak_nodes_per_budget"] = max(1.0, require["leak_nodes_per_budget"])
    require["reference_decisions_above_noise"] = max(0.5, require["reference_decisions_above_noise"])
    return require


# `ddsim gate --dump`: the KL within which an engine's logits count as the oracle's, where a policy
# gives none (the exact path's float32 tolerance)
REPLAY_NOISE_KL = 1e-6
# upper bounds on a replay of the engine's own verify steps (ddsim.engines.replay)
REPLAY_RULES = {
    "silent_corruption_steps": (lambda s: s["silent_corruption_steps"],
                                "steps where the engine emitted what exact verification would not, beyond a near-tie "
                                "its rounding turned"),
    "diagnosed_steps": (lambda s: s["diagnosed_steps"],
                        "steps whose engine logits are not within noise of the oracle's (any diagnosis)"),
    "top1_disagreements_above_noise": (lambda s: s["top1_disagreements_above_noise"],
                                       "nodes whose engine argmax is not the oracle's and whose logits are not within "
                                       "the noise of the oracle's"),
    "bonus_error_steps": (lambda s: s["bonus_error_steps"],
                          "steps whose bonus token is not the engine's own argmax at its last accepted node"),
    "commit_error_steps": (lambda s: s["commit_error_steps"],
                           "steps that do not continue their request (context plus what was committed, root the bonus)"),
    "positions_unexpected_steps": (lambda s: s["positions_unexpected_steps"],
                                   "steps whose positions are not prefix length + depth"),
}


def evaluate_replay(policy: Policy, summary: dict) -> list[Verdict]:
    """The policy's replay bounds on a replay summary, and the fail-closed rule that a dump with no
    step approves nothing."""
    out = []
    for rule, bound in policy.replay.items():
        fn, meaning = REPLAY_RULES[rule]
        measured = float(fn(summary))
        out.append(Verdict(rule, measured, bound, math.isfinite(measured) and measured <= bound, meaning))
    out.append(Verdict("replayed_steps", float(summary["steps"]), 1.0, summary["steps"] >= 1,
                       "a dump with no verify step approves nothing", "min"))
    return out


# rules a policy may no longer name, and what took their place
RETIRED = {"top1_disagreements": "replaced by top1_disagreements_above_noise: a node whose logits are within the noise "
                                 "and whose near-tie the engine's rounding turned is not counted"}


def _bounds(p: Path, table: dict, where: str, known: dict) -> dict:
    """{key: float bound} from a policy table, every key known and every bound finite and >= 0."""
    for k, v in table.items():
        if k in RETIRED and k not in known:
            raise InputError(f"{p}: {k!r} in [{where}] is retired ({RETIRED[k]})")
        if k not in known:
            raise InputError(f"{p}: unknown key {k!r} in [{where}] (known: {', '.join(sorted(known))})")
        if not is_real(v) or not math.isfinite(v) or v < 0:
            raise InputError(f"{p}: {k!r} in [{where}] needs a finite bound >= 0, got {v!r}")
    return {k: float(v) for k, v in table.items()}


def evaluate(policy: Policy, report: Report) -> list[Verdict]:
    """Every rule and requirement of the policy, then the built-in coverage rule: at least one verified
    node outside order-exact positions in every budget, whatever the policy requires."""
    out = []
    bounds = policy.bounds(report.precision.fast_path)
    if report.config.temperature > 0 and not set(SAMPLED_RULES) & set(bounds):
        raise InputError(f"{policy.path}: the report samples at temperature {report.config.temperature:g} and the "
                         f"policy bounds none of {', '.join(SAMPLED_RULES)}: its effect on the output would go unjudged")
    for rule, bound in bounds.items():
        if not_applicable(rule, report):
            continue
        fn, meaning = RULES[rule]
        measured = float(fn(report, policy.mode))
        out.append(Verdict(rule, measured, bound, measured <= bound, meaning))
    for name, bound in requirements(policy).items():
        fn, meaning = REQUIREMENTS[name]
        measured = float(fn(report, policy.mode))
        out.append(Verdict(name, measured, bound, measured >= bound, meaning, kind="min"))
    return out
