"""The verdict a report opens with: a policy (the built-in default unless the gate was given another)
evaluated on the report, each rule with its measured value and bound, and one sentence of what it
means for this model. The terminal summary, report.html and the gate read the same object."""
from __future__ import annotations

from dataclasses import dataclass

from ddsim.verdict.gate import (
    SAMPLED_RULES,
    Policy,
    Verdict,
    evaluate,
    leak_nodes,
    load_policy,
    not_applicable,
    relaxations,
)
from ddsim.verdict.report_model import Report


@dataclass(frozen=True)
class ReportVerdict:
    policy: Policy
    rules: list[Verdict]
    relaxed: list[str]  # built-in rules the policy omits or loosens
    skipped: list[str] = ()  # "rule: why" for the policy's rules that do not apply to this report

    @property
    def holds(self) -> bool:
        return all(v.holds for v in self.rules)

    @property
    def violated(self) -> list[Verdict]:
        return [v for v in self.rules if not v.holds]

    def headline(self) -> str:
        if self.holds:
            return f"Verdict: policy {self.policy.name} holds — hybrid-unsafe ({self.policy.mode}) verification may be enabled"
        return (f"Verdict: keep hybrid-unsafe verification off — {len(self.violated)} of {len(self.rules)} rules of "
                f"policy {self.policy.name} violated")


def of(report: Report, policy: Policy | None = None) -> ReportVerdict:
    policy = policy or load_policy("hybrid-unsafe")
    # (the sampled_* rules of a greedy report go unsaid: every greedy report would print them)
    skipped = [f"{r}: {why}" for r in policy.bounds(report.precision.fast_path)
               if (why := not_applicable(r, report)) and r not in SAMPLED_RULES]
    return ReportVerdict(policy, evaluate(policy, report), relaxations(policy, report.precision.fast_path), skipped)


def meaning(report: Report, v: ReportVerdict) -> str:
    """One sentence (or two) of what the verdict means for this model."""
    mode = v.policy.mode
    budgets = ", ".join(str(b.budget) for b in report.budgets)
    worst = max(report.budgets, key=lambda b: b.modes[mode].generations_leaving_greedy_above_noise)
    m = worst.modes[mode]
    failed = {x.rule for x in v.violated}
    if leak_nodes(report, mode) == 0:
        return ("The audit never exercised the leak: some budget verified no node outside order-exact positions, so "
                "nothing it measured can approve the unsafe mode. Raise --budget or --topk-cap and audit again.")
    if failed & {"exact_state_rel_max", "exact_kl_max", "exact_generations_leaving_greedy_above_noise"}:
        return ("The exact path itself is further from the oracle than the policy allows: the fast path (or the engine "
                f"kernel behind it) is wrong, or its {report.precision.fast_path} arithmetic is coarser than the "
                "policy's exact bounds. Settle which before judging the leak; no leak figure of this audit can be "
                "trusted.")
    if "reference_decisions_above_noise" in failed:
        return ("The reference decoding is too fragile to judge: most of its decisions are within the exact path's own "
                "rounding, so the leak cannot be told from the arithmetic.")
    any_above = any(b.modes[mode].generations_leaving_greedy_above_noise for b in report.budgets)
    any_left = any(b.modes[mode].generations_leaving_greedy for b in report.budgets)
    if any_above:
        return (f"On this model the {mode} path changes the output: at budget {worst.budget}, "
                f"{m.generations_leaving_greedy_above_noise} of {m.generations} generations leave greedy decoding above "
                f"the noise and {m.silent_corruption_steps} steps emit tokens exact verification would not. Use exact "
                "tree verification.")
    near = (f"{mode.capitalize()} generations left greedy decoding only at near-ties within the noise margin (the "
            "arithmetic's doing as much as the leak's); the other rules decide. ") if any_left else ""
    if v.holds:
        return near + (f"In this audit the leak did not reach the tokens above the noise at budgets {budgets}: the policy "
                       f"allows the {mode} mode for this model at these budgets; gate again when the model, budgets or "
                       "kernel change.")
    return near + (f"The leak reached the logits and the accept decisions ({', '.join(sorted(failed))}) though no "
                   "generation left greedy decoding above the noise in this audit. Keep the unsafe mode off.")
