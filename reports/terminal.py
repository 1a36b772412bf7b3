"""The terminal summary: per budget, what a person needs to decide about the hybrid-unsafe mode."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ddsim.modes import LEAK_MODES
from ddsim.report_model import Report
from ddsim.reports import model_label, precision_label


def _g(x, spec=".2g"):
    return "–" if x is None else format(x, spec)


def print_summary(report: Report, console: Console | None = None) -> None:
    console = console or Console()
    cfg = report.config
    console.print(f"[bold]ddsim audit[/bold] {model_label(report)} · seed {cfg.seed} · "
                  f"{len(report.prompts)} prompts × {cfg.steps} steps · device {report.environment.device} · "
                  f"{precision_label(report)} · fast path {report.provenance.fast_path}")
    t = Table(title=f"Leak vs the {report.precision.oracle} oracle (medians; exact = noise floor)", show_lines=False)
    for col in ("budget", "mode", "leak\nnodes", "state err\norder-exact", "state err\nother", "KL other", "argmax flips\nother",
                "decision\nflips", "tokens/\nstep", "gens leaving\ngreedy (first at)", "silent\nsteps", "speedup\nvs AR"):
        t.add_column(col, justify="right")
    speed = {(r.budget, r.mode): r.speedup_vs_ar for r in report.throughput.rows}
    for b in report.budgets:
        for mode in ("exact",) + LEAK_MODES:
            lk, md = b.leak[mode], b.modes[mode]
            firsts = [d for d in md.first_divergence if d is not None]
            t.add_row(str(b.budget), mode, str(lk.not_order_exact_nodes), _g(lk.state_rel.order_exact.median),
                      _g(lk.state_rel.other.median), _g(lk.kl.other.median),
                      _g(lk.argmax_flip_rate.other), _g(md.decision_flip_rate), f"{md.tokens_per_step:.2f}",
                      f"{md.generations_leaving_greedy}/{md.generations}" + (f" ({min(firsts)})" if firsts else ""),
                      str(md.silent_corruption_steps), _g(speed.get((b.budget, mode)), ".2f"))
    console.print(t)
    console.print(f"chain baseline (exact): {report.chain.tokens_per_step:.2f} tokens/step")
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
    if not min(b.leak["leaky"].not_order_exact_nodes for b in report.budgets):
        console.print("[bold yellow]A budget verified no node outside order-exact positions: the leak was never "
                      "exercised there, so this audit cannot approve hybrid-unsafe verification.[/bold yellow]")
    worst = max(b.modes["leaky"].generations_leaving_greedy_above_noise for b in report.budgets)
    any_left = max(b.modes["leaky"].generations_leaving_greedy for b in report.budgets)
    if worst:
        console.print("[bold red]The leaky (hybrid-unsafe) path changes the output:[/bold red] generations leave greedy "
                      "decoding. Use exact tree verification, or run `ddsim gate` on your own model before enabling it.")
    elif any_left:
        console.print("[yellow]Leaky generations left greedy decoding only at near-ties within the noise margin (the "
                      "arithmetic's doing as much as the leak's); the gate's other rules decide.[/yellow]")
    else:
        console.print("[green]No generation left greedy decoding under the leaky path in this audit.[/green]")
