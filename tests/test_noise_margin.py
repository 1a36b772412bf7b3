"""Which divergences from the reference the audit attributes to arithmetic: a generation leaves the
reference "above the noise" only where the reference's choice led its runner-up by more than the
largest margin the exact path was seen to overturn against the oracle."""
import math
from types import SimpleNamespace

from rich.console import Console

from ddsim.metrics import summarize
from ddsim.report_model import Generation, ModeSummary, Summary, noise_margin_of
from ddsim.reports.terminal import print_summary


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


def test_terminal_summary_tells_near_ties_from_the_leak(typed_report):
    """The summary's verdict line follows the above-noise count, and names near-ties apart."""
    def verdict(r):
        console = Console(record=True, width=200)
        print_summary(r, console)
        return console.export_text()

    assert "changes the output" in verdict(_set_leaky(typed_report, left=2, above=1))
    near = verdict(_set_leaky(typed_report, left=2, above=0))
    assert "only at near-ties within the noise margin" in near and "changes the output" not in near
    assert "No generation left greedy decoding" in verdict(_set_leaky(typed_report, left=0, above=0))
