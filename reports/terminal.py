"""The terminal summary: per budget, what a person needs to decide about the hybrid-unsafe mode."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ddsim.reports import model_label, precision_label
from ddsim.trees.modes import LEAK_MODES
from ddsim.verdict.report_model import Report


def _g(x, spec=".2g"):
    return "–" if x is None else format(x, spec)


def print_verdict(report: Report, v, console: Console) -> None:
    """The verdict first: the policy's headline, each violated rule with its measured value and bound, the
    rules a non-default policy relaxes, and what it means for this model."""
    from ddsim.reports.verdict import meaning
    console.print(f"[bold {'green' if v.holds else 'red'}]{v.headline()}[/]")
    console.print(f"policy {v.policy.name}: {v.policy.source()}", highlight=False)
    if v.relaxed:
        console.print(f"[yellow]policy relaxes {len(v.relaxed)} built-in rules: {'; '.join(v.relaxed)}[/yellow]")
    for x in v.violated:
        op = ">" if x.kind == "max" else "<"
        console.print(f"  [red]✗[/red] {x.rule}: {x.measured:.4g} {op} {x.bound:.4g}", highlight=False)
    console.print(meaning(report, v))


def print_summary(report: Report, console: Console | None = None, *, wide: bool = False, verdict=None) -> None:
    """The verdict, then the evidence in a table that fits 100 columns (``wide``: every column)."""
    from ddsim.reports import verdict as verdicts
    console = console or Console()
    cfg = report.config
    print_verdict(report, verdict or verdicts.of(report), console)
    console.print(f"[bold]ddsim audit[/bold] {model_label(report)} · seed {cfg.seed} · "
                  f"{len(report.prompts)} prompts × {cfg.steps} steps · {report.environment.device} · "
                  f"{precision_label(report)}", highlight=False)
    from rich import box
    t = Table(title=f"Leak vs the {report.precision.oracle} oracle (medians over nodes not order-exact; exact = noise floor)",
              show_lines=False, title_justify="left", box=box.SIMPLE_HEAD)
    cols = ["budget", "mode", "leak\nnodes", "KL", "argmax\nflips", "accept\nflips", "tokens\n/step",
            "corrupt\n/step", "off\ngreedy", "silent\nsteps"]
    if wide:
        cols[3:3] = ["state err\norder-exact", "state err\nother"]
        cols.append("modelled\nspeedup")
    for c in cols:
        t.add_column(c, justify="left" if c == "mode" else "right", no_wrap=c == "mode", min_width=11 if c == "mode" else None)
    speed = {(r.budget, r.mode): r.speedup_vs_ar for r in report.throughput.rows}
    for b in report.budgets:
        for mode in ("exact",) + LEAK_MODES:
            lk, md = b.leak[mode], b.modes[mode]
            firsts = [d for d in md.first_divergence if d is not None]
            row = [str(b.budget), mode, str(lk.not_order_exact_nodes), _g(lk.kl.other.median),
                   _g(lk.argmax_flip_rate.other), _g(md.decision_flip_rate), f"{md.tokens_per_step:.2f}",
                   f"{md.corrupted_tokens_per_step:.2f}",
                   f"{md.generations_leaving_greedy}/{md.generations}" + (f" ({min(firsts)})" if firsts else ""),
                   str(md.silent_corruption_steps)]
            if wide:
                row[3:3] = [_g(lk.state_rel.order_exact.median), _g(lk.state_rel.other.median)]
                row.append(_g(speed.get((b.budget, mode)), ".2f"))
            t.add_row(*row)
    console.print(t)
    console.print(f"chain baseline (exact): {report.chain.tokens_per_step:.2f} tokens/step · accept flips: accept "
                  "decisions that differ along the reference's walk · off greedy: generations that left the reference "
                  "(first divergence) · corrupt/step: tokens per step emitted after it · throughput: modelled (--wide)"
                  if not wide else
                  f"chain baseline (exact): {report.chain.tokens_per_step:.2f} tokens/step · speedup modelled from "
                  f"the cost model ({report.throughput.cost_model.source})", highlight=False)
    if report.measured_steps is not None:
        ms = report.measured_steps
        console.print(f"measured on {ms.device} (verify + commit, median of {ms.repeats}): " + "; ".join(
            f"{r.label} {r.mode} {r.step_ms:.2f} ms, {r.tokens_per_s:.0f} tok/s" for r in ms.rows
            if r.budget is None or r.mode in ("exact", "leaky")), highlight=False)
    if report.budgets and report.budgets[0].modes["exact"].emitted_tv_max is not None:
        console.print(f"temperature {report.config.temperature:g}, {report.config.sampler or 'gumbel'} sampler: largest "
                      "total variation of a step's emitted tokens against exact verification's: " + "; ".join(
                          f"budget {b.budget}: " + ", ".join(f"{m} {b.modes[m].emitted_tv_max:.3g}" for m in LEAK_MODES)
                          for b in report.budgets), highlight=False)
    if report.noise_margin > 0:
        console.print(f"noise margin {report.noise_margin:.3g} (the largest decision margin the exact path's arithmetic "
                      "overturned); generations leaving greedy above it: " + "; ".join(
                          f"budget {b.budget}: " + ", ".join(
                              f"{m} {b.modes[m].generations_leaving_greedy_above_noise}" for m in ("exact",) + LEAK_MODES)
                          for b in report.budgets))
    fr = report.reference_fragility
    if fr.fragile:
        console.print(f"[bold yellow]The reference is too fragile to judge: {fr.within_noise_margin} of {fr.decisions} "
                      f"of its decisions ({fr.fraction:.0%}) led the runner-up by no more than the noise margin, where "
                      "the exact path's own arithmetic could choose either; the gate refuses to approve this audit.")
