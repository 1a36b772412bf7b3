"""report.html: one self-contained file (no network; plots embedded as PNG data URIs) showing the
same figures as report.json, as tables and plots."""
from __future__ import annotations

import base64
import html
import io

import matplotlib

from ddsim.modes import LEAK_MODES
from ddsim.report_model import Report
from ddsim.reports import model_label, precision_label

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODE_COLORS = {"exact": "#1f77b4", "leaky": "#d62728", "leaky-state": "#ff7f0e", "leaky-conv": "#9467bd"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return '<img alt="plot" src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode() + '">'


def _med(s):
    return s.median if s is not None and s.n else None


def _fmt(x, spec=".3g"):
    if x is None:
        return "–"
    if isinstance(x, float):
        return format(x, spec)
    return html.escape(str(x))


def _table(headers, rows) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in headers)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _plot_by(report, key, title):
    fig, axes = plt.subplots(1, len(report.budgets), figsize=(4.2 * len(report.budgets), 3.2), squeeze=False)
    for ax, b in zip(axes[0], report.budgets):
        for mode in ("exact",) + LEAK_MODES:
            rows = getattr(b.leak[mode], key)
            xs = [getattr(r, key.split("_")[1]) for r in rows if _med(r.state_rel) is not None]
            ys = [max(_med(r.state_rel), 1e-12) for r in rows if _med(r.state_rel) is not None]
            if xs:
                ax.plot(xs, ys, "o-", color=MODE_COLORS[mode], label=mode if mode != "exact" else "exact (noise floor)")
        ax.set_yscale("log")
        ax.set_title(f"budget {b.budget}")
        ax.set_xlabel(key.split("_")[1])
        ax.set_ylabel("median state rel. error")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, y=1.04)
    return _png(fig)


def _plot_layers(report):
    b = report.budgets[-1]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for mode in ("exact",) + LEAK_MODES:
        rows = b.leak[mode].by_layer
        ys = [max(_med(r.hidden_rel) or 1e-12, 1e-12) for r in rows]
        ax.plot([r.layer for r in rows], ys, "o-", color=MODE_COLORS[mode], label=mode)
    for r in b.leak["exact"].by_layer:
        if r.kind in "am":
            ax.axvspan(r.layer - 0.4, r.layer + 0.4, color="#cccccc" if r.kind == "a" else "#cfe3f7", alpha=0.4)
    ax.set_yscale("log")
    ax.set_xlabel("layer (grey: attention only; light blue: Mamba2)")
    ax.set_ylabel("median hidden rel. error\n(non-order-exact nodes)")
    ax.set_title(f"Leak by layer, budget {b.budget}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _png(fig)


def _plot_flips(report):
    fig, ax = plt.subplots(figsize=(8, 3.2))
    budgets = [b.budget for b in report.budgets]
    width = 0.2
    for j, mode in enumerate(("exact",) + LEAK_MODES):
        arg = [b.leak[mode].argmax_flip_rate.other or 0.0 for b in report.budgets]
        dec = [b.modes[mode].decision_flip_rate for b in report.budgets]
        xs = [i + (j - 1.5) * width for i in range(len(budgets))]
        ax.bar(xs, arg, width, color=MODE_COLORS[mode], label=f"{mode}: argmax flips (non-order-exact)")
        ax.plot(xs, dec, "k_", markersize=14)
    ax.set_xticks(range(len(budgets)), [f"budget {b}" for b in budgets])
    ax.set_ylabel("rate")
    ax.set_title("Argmax flip rate (bars) and accept-decision flip rate (black ticks)")
    ax.legend(fontsize=7)
    return _png(fig)


def _plot_accept(report):
    fig, axes = plt.subplots(1, len(report.budgets), figsize=(4.2 * len(report.budgets), 3.0), squeeze=False)
    for ax, b in zip(axes[0], report.budgets):
        for mode, off in (("exact", -0.2), ("leaky", 0.2)):
            h = b.modes[mode].accepted_histogram
            ax.bar([i + off for i in range(len(h))], h, 0.4, color=MODE_COLORS[mode], label=mode)
        ax.set_title(f"budget {b.budget}")
        ax.set_xlabel("accepted draft tokens per step")
        ax.set_ylabel("steps")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Accepted length, exact vs leaky", y=1.04)
    return _png(fig)


def _plot_survival(report):
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for b, style in zip(report.budgets, ("-", "--", ":", "-.") * 4):
        for mode in LEAK_MODES:
            s = b.modes[mode].survival
            ax.plot(range(len(s)), s, style, color=MODE_COLORS[mode], label=f"{mode}, budget {b.budget}")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("generated token")
    ax.set_ylabel("fraction of generations\nstill equal to the reference")
    ax.set_title("Divergence along the generation")
    ax.legend(fontsize=6, ncol=3)
    return _png(fig)


def _plot_throughput(report):
    rows = report.throughput.rows
    fig, ax = plt.subplots(figsize=(8, 3.2))
    labels = [f"{r.label}\n{r.mode}" for r in rows]
    ax.bar(range(len(rows)), [r.speedup_vs_ar for r in rows], color=[MODE_COLORS.get(r.mode, "#777") for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=6, rotation=90)
    ax.set_ylabel("expected speedup vs AR")
    ax.set_title("Throughput model")
    return _png(fig)


CSS = """body{font-family:system-ui,sans-serif;margin:24px;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:8px 0 18px}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}
th{background:#f2f2f2}h2{border-bottom:1px solid #ddd;padding-bottom:4px}img{max-width:100%;display:block;margin:8px 0}
.note{color:#555;font-size:13px}"""


def render(report: Report) -> str:
    cfg, env = report.config, report.environment
    subject = model_label(report)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ddsim audit: {html.escape(subject)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>ddsim leakage audit — {html.escape(subject)}</h1>",
             f"<p class='note'>schema {report.schema_version} · generated {html.escape(str(report.generated_at))} · "
             f"seed {cfg.seed} · device {html.escape(env.device)} · torch {html.escape(env.torch)} · "
             f"ddsim {html.escape(env.ddsim)} · {len(report.prompts)} prompts × {cfg.steps} steps · "
             f"temperature {cfg.temperature} · fast path {html.escape(report.provenance.fast_path)} · "
             f"weights sha256 {report.provenance.weights_sha256[:16]}… · "
             f"drafter {html.escape(str(cfg.drafter.model_dump()))}</p>"]
    rows = []
    for b in report.budgets:
        for mode in ("exact",) + LEAK_MODES:
            lk, md = b.leak[mode], b.modes[mode]
            rows.append([b.budget, mode, lk.not_order_exact_nodes, _med(lk.state_rel.order_exact), _med(lk.state_rel.other),
                         _med(lk.kl.other), lk.argmax_flip_rate.other, md.decision_flip_rate, md.tokens_per_step,
                         f"{md.generations_leaving_greedy}/{md.generations}",
                         md.generations_leaving_greedy_above_noise, md.silent_corruption_steps])
    parts += ["<h2>Summary</h2>",
              "<p class='note'>Leak figures are medians over nodes, measured on each leaky-generation step's tree and "
              f"committed state against the oracle ({html.escape(precision_label(report))}); the exact rows are the "
              "numerical noise floor. A generation leaves greedy <em>above the noise</em> where the reference's "
              "choice led its runner-up by more than the noise margin, the largest margin the exact path's own "
              f"arithmetic overturned on any budget's trees ({report.noise_margin:.3g}). <em>Leak nodes</em>: verified "
              "nodes that were not order-exact, where a flattened pass hands over a wrong state (an audit without "
              "them never exercised the leak). Reference decisions within the noise margin: "
              f"{report.reference_fragility.within_noise_margin} of {report.reference_fragility.decisions}"
              + (" &mdash; <strong>too fragile to judge</strong>" if report.reference_fragility.fragile else "")
              + ".</p>",
              _table(["budget", "mode", "leak nodes", "state err (order-exact)", "state err (other)", "KL (other)",
                      "argmax flip rate (other)", "decision flip rate", "tokens/step", "gens leaving greedy",
                      "… above the noise", "silent-corruption steps"], rows),
              f"<p>Chain baseline (exact): {report.chain.tokens_per_step:.3g} tokens per step.</p>",
              "<h2>Leak by depth</h2>", _plot_by(report, "by_depth", "Recurrent-state error by depth"),
              "<h2>Leak by sibling rank</h2>", _plot_by(report, "by_rank", "Recurrent-state error by sibling rank"),
              "<h2>Leak by layer</h2>", _plot_layers(report),
              "<h2>Leak by recurrent family</h2>",
              "<p class='note'>Recurrent-state and conv-window relative error over every layer of one family "
              "(gdn: Gated DeltaNet; mamba2: Mamba2 SSM, also the Mamba2 half of parallel layers), nodes that are not "
              "order-exact.</p>",
              _table(["budget", "mode", "family", "layers", "state err median", "state err max", "conv err median",
                      "conv err max"],
                     [[b.budget, mode, f.family, f.layers, _med(f.state_rel), f.state_rel.max, _med(f.conv_rel),
                       f.conv_rel.max] for b in report.budgets for mode in ("exact",) + LEAK_MODES
                      for f in b.leak[mode].by_family]),
              "<h2>Flip rates</h2>", _plot_flips(report),
              "<h2>Accepted length</h2>", _plot_accept(report),
              "<h2>Divergence along the generation</h2>", _plot_survival(report)]
    parts.append(_table(["budget", "noise floor: max state rel. error", "max KL", "argmax flip rate"],
                        [[k, v.state_rel_max, v.kl_max, v.argmax_flip_rate] for k, v in report.noise_floor.items()]))
    tp = report.throughput
    parts += ["<h2>Throughput model</h2>",
              f"<p class='note'>Costs in autoregressive steps: {html.escape(str(tp.cost_model.model_dump()))}</p>",
              _plot_throughput(report),
              _table(["tree", "mode", "tokens/step", "nodes", "step cost", "speedup vs AR", "speedup vs chain"],
                     [[r.label, r.mode, r.tokens_per_step, r.nodes, r.step_cost, r.speedup_vs_ar, r.speedup_vs_chain]
                      for r in tp.rows])]
    gen_rows = [[g.prompt, g.budget if g.budget is not None else "chain", g.mode, g.first_divergence,
                 g.divergence_margin, g.agreement, g.silent_corruption_steps, g.tokens_per_step]
                for g in report.generations]
    parts += ["<h2>Generations</h2>",
              _table(["prompt", "budget", "mode", "first divergence", "reference's margin there", "agreement",
                      "silent-corruption steps", "tokens/step"], gen_rows),
              "</body></html>"]
    return "\n".join(parts)
