"""Which divergences from the reference the audit attributes to arithmetic: a generation leaves the
reference "above the noise" only where the reference's choice led its runner-up by more than the
largest margin the exact path was seen to overturn against the oracle."""
import copy
import math

from rich.console import Console

from ddsim.audit import _mode_summary, _noise_margin
from ddsim.generate import GenerationResult
from ddsim.metrics import summarize
from ddsim.reports.terminal import print_summary


def _gen(tokens, reference):
    return GenerationResult(mode="exact", policy="ddtree", prompt=[0], tokens=tokens, reference=reference)


def test_divergences_are_split_at_the_noise_margin():
    ref = [5, 6, 7, 8]
    margins = [[2.0, 0.05, 3.0, 1.0], [2.0, 0.05, 3.0, 1.0], [2.0, 0.05, 3.0, 1.0]]
    gens = [_gen([5, 9, 7, 8], ref),   # leaves at position 1, where the reference led by 0.05: a near-tie
            _gen([5, 6, 4, 8], ref),   # leaves at position 2, led by 3.0: not arithmetic
            _gen([5, 6, 7, 8], ref)]   # never leaves
    s = _mode_summary(gens, 4, margins, noise_margin=0.26)
    assert s["generations_leaving_greedy"] == 2
    assert s["generations_leaving_greedy_above_noise"] == 1
    assert s["first_divergence"] == [1, 2, None]
    # with no measured noise (a float32 audit whose exact path never flipped), every divergence counts
    assert _mode_summary(gens, 4, margins, noise_margin=0.0)["generations_leaving_greedy_above_noise"] == 2


def test_noise_margin_is_the_largest_overturned_oracle_margin():
    flipped = {"margin_of_flipped": summarize([0.1, 0.26, 0.02])}
    assert math.isclose(_noise_margin(flipped, 0.0), 0.26)
    assert math.isclose(_noise_margin(flipped, 0.5), 0.52)  # decision scores are logits / temperature
    assert _noise_margin({"margin_of_flipped": summarize([])}, 0.0) == 0.0


def _set_leaky(report, *, left, above):
    r = copy.deepcopy(report)
    for b in r["budgets"]:
        b["modes"]["leaky"].update(generations_leaving_greedy=left, generations_leaving_greedy_above_noise=above)
    return r


def test_terminal_summary_tells_near_ties_from_the_leak(report):
    """The summary's verdict line follows the above-noise count, and names near-ties apart."""
    def verdict(r):
        console = Console(record=True, width=200)
        print_summary(r, console)
        return console.export_text()

    assert "changes the output" in verdict(_set_leaky(report, left=2, above=1))
    near = verdict(_set_leaky(report, left=2, above=0))
    assert "only at near-ties within the noise margin" in near and "changes the output" not in near
    assert "No generation left greedy decoding" in verdict(_set_leaky(report, left=0, above=0))
