"""Which divergences from the reference the audit attributes to arithmetic: a generation leaves the
reference "above the noise" only where the reference's choice led its runner-up by more than the
largest margin the exact path was seen to overturn against the oracle."""
import math
from types import SimpleNamespace

from rich.console import Console

from ddsim.measure.metrics import summarize
from ddsim.reports.terminal import print_summary
from ddsim.verdict.report_model import Generation, ModeSummary, Summary, noise_margin_of


def _gen(prompt, tokens, first, margin):
    return Generation(prompt=prompt, budget=4, mode="exact", policy="ddtree-4", tokens=tokens, first_divergence=first,
                      divergence_margin=margin, agreement=1.0, silent_corruption_steps=0,
                      tokens_per_step=float(len(tokens)), accepted=[len(tokens) - 1], decision_flips=[0], reference_walk=[len(tokens)],
                      tree_sizes=[5])


def test_divergences_are_split_at_the_noise_margin():
    gens = [_gen(0, [5, 9, 7, 8], 1, 0.05),   # leaves at position 1, where the reference led by 0.05: a near-tie
            _gen(1, [5, 6, 4, 8], 2, 3.0),    # leaves at position 2, led by 3.0: not arithmetic
            _gen(2, [5, 6, 7, 8], None, None)]  # never leaves
    s = ModeSummary.of(gens, ref_len=4, noise_margin=0.26)
    assert s.generations_leaving_greedy == 2
    assert s.generations_leaving_greedy_above_noise == 1
    assert s.first_divergence == [1, 2, None]
    # a divergence exactly at the noise margin is the arithmetic's (strictly above counts)
    assert ModeSummary.of(gens, ref_len=4, noise_margin=3.0).generations_leaving_greedy_above_noise == 0
    # with no measured noise (a float32 audit whose exact path never flipped), every divergence counts
    assert ModeSummary.of(gens, ref_len=4, noise_margin=0.0).generations_leaving_greedy_above_noise == 2


def _table(margins):
    return SimpleNamespace(margin_of_flipped=Summary(**summarize(margins)))


def test_noise_margin_is_the_largest_overturned_oracle_margin():
    tables = [_table([0.1, 0.26, 0.02]), _table([0.2]), _table([])]
    assert math.isclose(noise_margin_of(tables, 0.0), 0.26)
    assert math.isclose(noise_margin_of(tables, 0.5), 0.52)  # decision scores are logits / temperature
    assert noise_margin_of([_table([])], 0.0) == 0.0


def _set_leaky(report, *, left, above):
    budgets = [b.model_copy(update={"modes": {**b.modes, "leaky": b.modes["leaky"].model_copy(update={
        "generations_leaving_greedy": left, "generations_leaving_greedy_above_noise": above})}})
        for b in report.budgets]
    return report.model_copy(update={"budgets": budgets})


def test_the_verdict_sentence_tells_near_ties_from_the_leak():
    """The verdict's sentence follows the above-noise count, names near-ties apart, and says when the leak
    was never exercised (the FAST_AUDIT-like case: no leak node)."""
    from ddsim.reports import json_report
    from ddsim.reports.verdict import meaning, of
    from tests.report_fixtures import path

    def sentence(r):
        console = Console(record=True, width=100)
        print_summary(r, console)
        return meaning(r, of(r)), console.export_text()

    leak = json_report.load(path("leak"))
    s, text = sentence(_set_leaky(leak, left=2, above=1))
    assert "changes the output" in s and text.splitlines()[0].startswith("Verdict: keep hybrid-unsafe verification off")
    s, _ = sentence(_set_leaky(leak, left=2, above=0))
    assert "only at near-ties within the noise margin" in s and "changes the output" not in s
    inert = json_report.load(path("inert"))
    s, text = sentence(inert)
    assert "the leak did not reach the tokens" in s and text.splitlines()[0].startswith("Verdict: policy hybrid-unsafe holds")
    none = inert.model_copy(update={"budgets": [b.model_copy(update={"leak": {m: t.model_copy(update={
        "not_order_exact_nodes": 0}) for m, t in b.leak.items()}}) for b in inert.budgets]})
    assert sentence(none)[0].startswith("The audit never exercised the leak")
    # an exact path off the oracle: wrong, or (naming the fast path's arithmetic) too coarse for the bounds
    off = inert.model_copy(update={"noise_floor": {k: v.model_copy(update={"kl_max": 1.0})
                                                   for k, v in inert.noise_floor.items()}})
    s = sentence(off)[0]
    assert s.startswith("The exact path itself is further from the oracle than the policy allows") and \
        f"or its {inert.precision.fast_path} arithmetic is coarser" in s


def test_the_summary_fits_100_columns(typed_report):
    console = Console(record=True, width=100)
    print_summary(typed_report, console)
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= 100
    assert any(" leaky-state " in l for l in lines) and any(" leaky-conv " in l for l in lines)  # never cut
    wide = Console(record=True, width=160)
    print_summary(typed_report, wide, wide=True)
    text = wide.export_text()
    assert "modelled" in text and "speedup" in text and "state err" in text
