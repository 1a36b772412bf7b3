"""The ddsim command line: audit, gate, tree, bench.

Exit codes: 0 success (gate: the policy holds), 1 gate violated, 2 any error or bad input.
Errors are one line naming the input and the problem; an unexpected exception is also one line
and exit 2, so the gate can never pass by accident.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_VIOLATED, EXIT_ERROR = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def _budgets(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"budgets must be integers >= 1, got {text!r}")
    return vals


def _add_audit_options(p):
    p.add_argument("--preset", default="tiny", help="built-in model preset (default: tiny)")
    p.add_argument("--model", metavar="PATH", help="a Hugging Face checkpoint directory (qwen3_next, qwen3_5, qwen3_5_moe)")
    p.add_argument("--budget", type=_budgets, default=[16, 32, 64], metavar="B[,B...]", help="DDTree node budgets")
    p.add_argument("--topk-cap", type=int, default=None, help="cap on per-depth top-k")
    p.add_argument("--prompts", metavar="FILE", help='JSONL of {"tokens": [...]} prompts')
    p.add_argument("--steps", type=int, default=8, help="speculative steps per generation (default: 8)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--device", default="cpu", help="cpu, cuda[:N] or auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", metavar="FILE", help="replay a drafter trace (JSONL) instead of the synthetic drafter")
    p.add_argument("--cost", metavar="FILE", help="verify-cost JSON for the throughput model")


def _audit_config(a):
    from ddsim.audit import AuditConfig
    return AuditConfig(preset=a.preset, model_path=a.model, budgets=a.budget, topk_cap=a.topk_cap, steps=a.steps, prompts_file=a.prompts,
                       temperature=a.temperature, seed=a.seed, device=a.device, trace=a.trace, cost_file=a.cost)


def _run_audit(ac, console, *, quiet=False):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ddsim.audit import run_audit, total_steps
    n_prompts = _count_prompts(ac)
    with Progress(TextColumn("audit"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  disable=quiet, transient=True) as prog:
        task = prog.add_task("audit", total=total_steps(ac, n_prompts))
        return run_audit(ac, progress=lambda advance: prog.update(task, advance=advance))


def _count_prompts(ac) -> int:
    """How many prompts the audit will run (for the progress bar); bad files fail later, in the audit."""
    if ac.prompts_file:
        try:
            return max(1, sum(1 for line in Path(ac.prompts_file).read_text().splitlines() if line.strip()))
        except OSError:
            return 1
    if ac.model_path:
        from ddsim.prompts import BUILTIN_PROMPTS
        return len(BUILTIN_PROMPTS)
    return ac.n_prompts


def _write_report(report, out: Path):
    from reports import html as html_report
    from reports import json_report
    report = json_report.stamp(report)
    problem = json_report.validate(json.loads(json_report.dumps(report)))
    if problem:
        raise RuntimeError(f"internal: report does not match its schema ({problem})")
    page = html_report.render(report)
    json_report.write_atomic({out / "report.json": json_report.dumps(report), out / "report.html": page})
    return report


def cmd_audit(a, console) -> int:
    from reports.terminal import print_summary
    ac = _audit_config(a)
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        from ddsim.errors import InputError
        raise InputError(f"--out {out}: exists and is not a directory")
    report = _write_report(_run_audit(ac, console), out)
    print_summary(report, console)
    console.print(f"wrote {out / 'report.json'} and {out / 'report.html'}")
    return EXIT_OK


def cmd_gate(a, console) -> int:
    from ddsim.gate import evaluate, load_policy, report_precision
    from reports import json_report
    policy = load_policy(a.policy)
    if a.report:
        report = json_report.load(a.report)
    else:
        report = _run_audit(_audit_config(a), console, quiet=True)
        report = _write_report(report, Path(a.out)) if a.out else json_report.stamp(report)
    verdicts = evaluate(policy, report)
    bad = [v for v in verdicts if not v.holds]
    for v in bad:
        print(f"VIOLATED {v.rule}: measured {v.measured:.6g} > bound {v.bound:.6g} ({v.meaning}; mode {policy.mode})")
    label = f"gate {policy.name} ({report_precision(report)} fast path)"
    if bad:
        print(f"{label}: {len(bad)} of {len(verdicts)} rules violated; keep hybrid-unsafe verification off")
        return EXIT_VIOLATED
    print(f"{label}: all {len(verdicts)} rules hold for mode {policy.mode}")
    return EXIT_OK


def cmd_tree(a, console) -> int:
    import torch

    from ddsim.builders import ddtree
    from ddsim.errors import InputError
    if a.trace:
        from ddsim.drafters import DraftContext, TraceDrafter
        if a.vocab is None:
            raise InputError("--vocab: needed with --trace (the trace's vocab_size)")
        d = TraceDrafter(a.trace, vocab_size=a.vocab)
        logits = d.draft(DraftContext(step=a.step, tokens=[0]))
        cap = min(c for c in (a.topk_cap, d.max_rank) if c)
    else:
        if a.depth < 1 or (a.vocab or 32) < 1:
            raise InputError("--depth, --vocab: expected >= 1")
        gen = torch.Generator().manual_seed(a.seed)
        logits = torch.randn(a.depth, a.vocab or 32, generator=gen, dtype=torch.float64) * 3.0
        cap = a.topk_cap
    tree = ddtree(logits, a.budget, cap)
    if a.format == "dot":
        print(to_dot(tree))
    else:
        draw_tree(tree, console)
    return EXIT_OK


def to_dot(tree) -> str:
    lines = ["digraph ddtree {", "  node [shape=box, fontname=monospace];"]
    for i in range(tree.size):
        style = ', style=filled, fillcolor="#c7e9c0"' if tree.order_exact[i] else ""
        lines.append(f'  n{i} [label="#{i} tok {tree.tokens[i]}\\ndepth {tree.depths[i]}"{style}];')
    for i in range(1, tree.size):
        lines.append(f"  n{tree.parents[i]} -> n{i};")
    lines.append("}")
    return "\n".join(lines)


def draw_tree(tree, console) -> None:
    from rich.tree import Tree as RichTree

    def label(i):
        mark = " [green]✓ order-exact[/green]" if tree.order_exact[i] else ""
        return f"[bold]#{i}[/bold] tok {tree.tokens[i]} · depth {tree.depths[i]}{mark}"

    root = RichTree(label(0))
    handles = {0: root}
    for i in range(1, tree.size):
        handles[i] = handles[tree.parents[i]].add(label(i))
    console.print(root)
    n_exact = int(tree.order_exact.sum())
    console.print(f"{tree.size} nodes (root + {tree.size - 1} drafts), depth {int(tree.depths.max())}, "
                  f"{n_exact} order-exact (only these get the right recurrent state from a flattened pass)")


def cmd_bench(a, console) -> int:
    from ddsim.audit import resolve_device
    from ddsim.bench import mode_table
    dev = resolve_device(a.device)
    if dev.type == "cuda":
        from ddsim.bench import kernel_accuracy, kernel_table
        print(kernel_table(device=str(dev))[0])
        print(kernel_accuracy(device=str(dev)))
    else:
        print(mode_table(preset=a.preset, repeats=a.repeats, device=str(dev)))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ddsim", description="Tree speculative decoding on hybrid models, checked against an exact oracle")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    pa = sub.add_parser("audit", help="leakage audit; writes report.json and report.html")
    _add_audit_options(pa)
    pa.add_argument("--out", default="ddsim-report", help="output directory (default: ./ddsim-report)")
    pg = sub.add_parser("gate", help="evaluate a policy: exit 0 holds, 1 violated, 2 error")
    pg.add_argument("--policy", required=True, metavar="FILE", help="TOML policy, e.g. policies/hybrid-unsafe.toml")
    pg.add_argument("--report", metavar="FILE", help="an existing report.json (otherwise the audit runs)")
    pg.add_argument("--out", metavar="DIR", help="also write the audit's report here (without --report)")
    _add_audit_options(pg)
    pt = sub.add_parser("tree", help="draw a DDTree with node order and order-exact nodes")
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--budget", type=int, default=16)
    pt.add_argument("--topk-cap", type=int, default=None)
    pt.add_argument("--depth", type=int, default=6)
    pt.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 32; required with --trace)")
    pt.add_argument("--trace", metavar="FILE")
    pt.add_argument("--step", type=int, default=0)
    pt.add_argument("--format", choices=["text", "dot"], default="text")
    pb = sub.add_parser("bench", help="CUDA: GDN kernel times against the memory floor; CPU: trees per second per mode")
    pb.add_argument("--preset", default="tiny")
    pb.add_argument("--repeats", type=int, default=5)
    pb.add_argument("--device", default="cpu")
    return p


COMMANDS = {"audit": cmd_audit, "gate": cmd_gate, "tree": cmd_tree, "bench": cmd_bench}


def main(argv=None) -> int:
    from rich.console import Console
    args = build_parser().parse_args(argv)
    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough for the summary table
        console = Console(width=160)
    try:
        from ddsim.errors import DDSimError
        return COMMANDS[args.command](args, console)
    except DDSimError as e:
        print(f"ddsim {args.command}: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"ddsim {args.command}: interrupted", file=sys.stderr)
    except Exception as e:  # fail closed: never a traceback, never exit 0
        print(f"ddsim {args.command}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
