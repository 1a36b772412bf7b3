"""report.html: one self-contained file (no network; plots embedded as PNG data URIs) showing the
same figures as report.json, as tables and plots."""
from __future__ import annotations

import base64
import html
import io

import matplotlib

from ddsim.reports import model_label, precision_label
from ddsim.trees.modes import LEAK_MODES
from ddsim.verdict.report_model import Report

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Okabe-Ito (colour-blind safe), and a line style and marker per mode, so no mode hides under another
MODE_COLORS = {"exact": "#0072B2", "leaky": "#D55E00", "leaky-state": "#009E73", "leaky-conv": "#CC79A7"}
MODE_STYLES = {"exact": ("-", "o"), "leaky": ("--", "s"), "leaky-state": (":", "^"), "leaky-conv": ("-.", "D")}


def _line(ax, xs, ys, mode, label=None):
    style, marker = MODE_STYLES[mode]
    ax.plot(xs, ys, linestyle=style, marker=marker, color=MODE_COLORS[mode], label=label or mode, linewidth=1.6,
            markersize=5, alpha=0.9)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})  # constrained layout fits it: no second draw to crop
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


def _drafter(d) -> str:
    """The drafter in words, not a dict."""
    p = d.model_dump()
    kind = p.pop("kind")
    return f"{kind} (" + ", ".join(f"{k} {v}" for k, v in p.items()) + ")"


def _table(headers, rows) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in headers)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _plot_by(report, key, title):
    from matplotlib.ticker import MaxNLocator
    n = len(report.budgets)
    fig, axes = plt.subplots(1, n, figsize=(min(4.2 * n, 13), 3.6), squeeze=False, layout="constrained")
    for j, (ax, b) in enumerate(zip(axes[0], report.budgets)):
        for mode in ("exact",) + LEAK_MODES:
            rows = getattr(b.leak[mode], key)
            xs = [getattr(r, key.split("_")[1]) for r in rows if _med(r.state_rel) is not None]
            ys = [max(_med(r.state_rel), 1e-12) for r in rows if _med(r.state_rel) is not None]
            if xs:
                _line(ax, xs, ys, mode, mode if mode != "exact" else "exact (noise floor)")
        ax.set_yscale("log")
        ax.minorticks_off()  # a decade-spanning log axis shows none; computing them is a plot's costliest layout step
        ax.set_title(f"budget {b.budget}", fontsize=10)
        ax.set_xlabel(key.split("_")[1])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if j == 0:
            ax.set_ylabel("median state rel. error")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    return _png(fig)


def _plot_layers(report):
    from matplotlib.ticker import MaxNLocator
    b = report.budgets[-1]
    fig, ax = plt.subplots(figsize=(9, 3.6), layout="constrained")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for mode in ("exact",) + LEAK_MODES:
        rows = b.leak[mode].by_layer
        ys = [max(_med(r.hidden_rel) or 1e-12, 1e-12) for r in rows]
        _line(ax, [r.layer for r in rows], ys, mode)
    for r in b.leak["exact"].by_layer:
        if r.kind in "ampz":  # Mamba2's layers: its own, Falcon-H1's parallel ones, Zamba2's hybrid ones
            ax.axvspan(r.layer - 0.4, r.layer + 0.4, color="#cccccc" if r.kind == "a" else "#cfe3f7", alpha=0.4)
    ax.set_yscale("log")
    ax.minorticks_off()
    ax.set_xlabel("layer (grey: attention only; light blue: with a Mamba2 mixer)")
    ax.set_ylabel("median hidden rel. error\n(non-order-exact nodes)")
    ax.set_title(f"Leak by layer, budget {b.budget}", fontsize=11)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return _png(fig)


def _plot_flips(report):
    fig, ax = plt.subplots(figsize=(9, 3.8), layout="constrained")
    budgets = [b.budget for b in report.budgets]
    width = 0.2
    for j, mode in enumerate(("exact",) + LEAK_MODES):
        arg = [b.leak[mode].argmax_flip_rate.other or 0.0 for b in report.budgets]
        dec = [b.modes[mode].decision_flip_rate for b in report.budgets]
        xs = [i + (j - 1.5) * width for i in range(len(budgets))]
        ax.bar(xs, arg, width, color=MODE_COLORS[mode], hatch={"exact": "", "leaky": "//", "leaky-state": "..",
                                                               "leaky-conv": "xx"}[mode], edgecolor="white",
               label=f"{mode}: argmax flips (nodes not order-exact)")
        ax.plot(xs, dec, "k_", markersize=14)
    ax.set_xticks(range(len(budgets)), [f"budget {b}" for b in budgets])
    ax.set_ylabel("rate")
    ax.set_title("Argmax flip rate (bars) and accept-decision flip rate (black ticks)", fontsize=11)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return _png(fig)


def _plot_accept(report):
    from matplotlib.ticker import MaxNLocator
    n = len(report.budgets)
    fig, axes = plt.subplots(1, n, figsize=(min(4.2 * n, 13), 3.4), squeeze=False, layout="constrained")
    for j, (ax, b) in enumerate(zip(axes[0], report.budgets)):
        for mode, off in (("exact", -0.2), ("leaky", 0.2)):
            h = b.modes[mode].accepted_histogram
            ax.bar([i + off for i in range(len(h))], h, 0.4, color=MODE_COLORS[mode], label=mode,
                   hatch="" if mode == "exact" else "//", edgecolor="white")
        ax.set_title(f"budget {b.budget}", fontsize=10)
        ax.set_xlabel("accepted draft tokens per step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if j == 0:
            ax.set_ylabel("steps")
    fig.suptitle("Accepted length, exact vs leaky", fontsize=11)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return _png(fig)


def _plot_survival(report):
    n = len(report.budgets)
    fig, axes = plt.subplots(1, n, figsize=(min(4.2 * n, 13), 3.4), squeeze=False, layout="constrained", sharey=True)
    for j, (ax, b) in enumerate(zip(axes[0], report.budgets)):
        for mode in LEAK_MODES:
            s = b.modes[mode].survival
            style, _ = MODE_STYLES[mode]
            ax.plot(range(len(s)), s, linestyle=style, color=MODE_COLORS[mode], label=mode, linewidth=1.8)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"budget {b.budget}", fontsize=10)
        ax.set_xlabel("generated token")
        if j == 0:
            ax.set_ylabel("generations still\nequal to the reference")
        ax.grid(alpha=0.3)
    fig.suptitle("Divergence along the generation", fontsize=11)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return _png(fig)


def _plot_throughput(report):
    rows = report.throughput.rows
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.2), layout="constrained")
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [r.speedup_vs_ar for r in rows], color=[MODE_COLORS.get(r.mode, "#777") for r in rows])
    ax.set_yticks(ys, [f"{r.label} · {r.mode}" for r in rows], fontsize=9)
    ax.set_xlabel("modelled speedup vs autoregressive decoding (cost model, not measured)")
    ax.set_title("Throughput (modelled)", fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


CSS = """body{font-family:system-ui,sans-serif;margin:24px;max-width:1400px;color:#222}
#verdict{border:2px solid;border-radius:6px;padding:10px 16px;margin:0 0 18px}
#verdict.fail{border-color:#D55E00;background:#fff4ee}#verdict.pass{border-color:#009E73;background:#effaf5}
#verdict h1{margin:4px 0 8px;font-size:22px}#verdict td:first-child,#verdict th:first-child{text-align:left}
#verdict td:last-child,#verdict th:last-child{text-align:left}#verdict td:nth-child(3){white-space:nowrap}
table{display:block;overflow-x:auto;max-width:100%}
.bad{color:#b00020;font-weight:600}.ok{color:#00704a}
table{border-collapse:collapse;margin:8px 0 18px}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}
th{background:#f2f2f2}h2{border-bottom:1px solid #ddd;padding-bottom:4px}img{max-width:100%;display:block;margin:8px 0}
.note{color:#555;font-size:13px}"""


def _verdict(report: Report, v) -> str:
    """The verdict section: the headline, what it means for this model, every rule with its measured
    value and bound, and what a non-default policy relaxes."""
    from ddsim.reports.verdict import meaning
    rows = "".join(
        f"<tr><td>{html.escape(x.rule)}</td><td>{x.measured:.4g}</td><td>{'≤' if x.kind == 'max' else '≥'} {x.bound:.4g}</td>"
        f"<td class='{'ok' if x.holds else 'bad'}'>{'pass' if x.holds else 'FAIL'}</td><td>{html.escape(x.meaning)}</td></tr>"
        for x in v.rules)
    relaxed = (f"<p class='bad'>This policy relaxes {len(v.relaxed)} built-in rules: {html.escape('; '.join(v.relaxed))}</p>"
               if v.relaxed else "")
    return (f"<section id='verdict' class='{'pass' if v.holds else 'fail'}'><h1>{html.escape(v.headline())}</h1>"
            f"<p>{html.escape(meaning(report, v))}</p>"
            f"<p class='note'>policy {html.escape(v.policy.name)} ({html.escape(v.policy.source())}), mode "
            f"{html.escape(v.policy.mode)}; `ddsim gate` exits {0 if v.holds else 1} on this report.</p>{relaxed}"
            "<table><tr><th>rule</th><th>measured</th><th>bound</th><th>verdict</th><th>meaning</th></tr>"
            f"{rows}</table></section>")


def render(report: Report, verdict=None) -> str:
    """report.html: the verdict (``verdict``, ddsim.reports.verdict.of: the default policy unless the gate
    passes its own) as the body's first element, then the evidence."""
    from ddsim.reports import verdict as verdicts
    cfg, env = report.config, report.environment
    subject = model_label(report)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ddsim audit: {html.escape(subject)}</title>"
             f"<style>{CSS}</style></head><body>",
             _verdict(report, verdict or verdicts.of(report)),
             f"<h2>ddsim leakage audit — {html.escape(subject)}</h2>",
             f"<p class='note'>schema {report.schema_version} · generated {html.escape(str(report.generated_at))} · "
             f"seed {cfg.seed} · device {html.escape(env.device)} · torch {html.escape(env.torch)} · "
             f"ddsim {html.escape(env.ddsim)} · {len(report.prompts)} prompts × {cfg.steps} steps · "
             f"temperature {cfg.temperature} · fast path {html.escape(report.provenance.fast_path)} · "
             f"weights sha256 {report.provenance.weights_sha256[:16]}… · "
             f"drafter: {html.escape(_drafter(cfg.drafter))}</p>"]
    rows = []
    for b in report.budgets:
        for mode in ("exact",) + LEAK_MODES:
            lk, md = b.leak[mode], b.modes[mode]
            rows.append([b.budget, mode, lk.not_order_exact_nodes, _med(lk.state_rel.order_exact), _med(lk.state_rel.other),
                         _med(lk.kl.other), lk.argmax_flip_rate.other, md.decision_flip_rate, md.tokens_per_step,
                         md.good_tokens_per_step, md.corrupted_tokens_per_step,
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
                      "argmax flip rate (other)", "decision flip rate", "tokens/step", "of which good",
                      "of which corrupted", "gens leaving greedy",
                      "… above the noise", "silent-corruption steps"], rows),
              f"<p>Chain baseline (exact): {report.chain.tokens_per_step:.3g} tokens per step.</p>",
              "<h2>Leak by depth</h2>", _plot_by(report, "by_depth", "Recurrent-state error by depth"),
              "<h2>Leak by sibling rank</h2>", _plot_by(report, "by_rank", "Recurrent-state error by sibling rank"),
              "<h2>Leak by layer</h2>", _plot_layers(report),
              "<h2>Leak by recurrent family</h2>",
              "<p class='note'>Recurrent-state and conv-window relative error over every layer of one family "
              "(gdn: Gated DeltaNet; mamba2: Mamba2 SSM, also the Mamba2 half of parallel layers; mamba1: Mamba1 "
              "selective scan; lightning: MiniMax's linear attention, no conv; kda: Kimi Delta Attention; conv: gated short "
              "convolutions, whose window is their whole state), nodes that are not order-exact.</p>",
              _table(["budget", "mode", "family", "layers", "state err median", "state err max", "conv err median",
                      "conv err max"],
                     [[b.budget, mode, f.family, f.layers, _med(f.state_rel), f.state_rel and f.state_rel.max, _med(f.conv_rel),
                       f.conv_rel and f.conv_rel.max] for b in report.budgets for mode in ("exact",) + LEAK_MODES
                      for f in b.leak[mode].by_family]),
              "<h2>Flip rates</h2>", _plot_flips(report),
              "<h2>Accepted length</h2>", _plot_accept(report),
              "<h2>Divergence along the generation</h2>", _plot_survival(report)]
    parts.append(_table(["budget", "noise floor: max state rel. error", "max KL", "argmax flip rate"],
                        [[k, v.state_rel_max, v.kl_max, v.argmax_flip_rate] for k, v in report.noise_floor.items()]))
    ms = report.measured_steps
    if ms is not None:
        parts += [f"<h2>Measured decoding steps ({html.escape(ms.device)})</h2>",
                  "<p class='note'>Each mode's verify and commit of the first prompt's first tree, timed as the serving "
                  f"model runs them (median of {ms.repeats} after {ms.warmup} warm-up); tokens per second are this "
                  "audit's tokens per step over that time. The draft is not timed (ddsim's drafters are simulations or "
                  "a CPU reference model): a served drafter's time adds to every speculative row alike. Leaky modes' "
                  "tokens include corrupted ones.</p>",
                  _table(["tree", "mode", "nodes", "verify ms", "commit ms", "step ms", "tokens/step", "tokens/s",
                          "vs autoregressive"],
                         [[r.label, r.mode, r.nodes, r.verify_ms, r.commit_ms, r.step_ms, r.tokens_per_step,
                           r.tokens_per_s, r.speedup_vs_ar]
                          for r in ms.rows])]
    if report.budgets and report.budgets[0].modes["exact"].emitted_tv_max is not None:
        parts += [f"<h2>The output distribution at temperature {report.config.temperature:g} "
                  f"({html.escape(report.config.sampler or 'gumbel')} sampler)</h2>",
                  "<p class='note'>Per step, the exact law of what the step emits under the sampler, from the mode's "
                  "per-node distributions against exact verification's from the same state: total variation of the "
                  "emitted tokens and of the accepted length, and the expected accepted length.</p>",
                  _table(["budget", "mode", "emitted TV max", "emitted TV mean", "length TV max",
                          "E[accepted] mode", "E[accepted] exact"],
                         [[b.budget, m, b.modes[m].emitted_tv_max, b.modes[m].emitted_tv_mean,
                           b.modes[m].accepted_length_tv_max, b.modes[m].expected_accepted_per_step,
                           b.modes[m].expected_accepted_exact_per_step]
                          for b in report.budgets for m in ("exact",) + LEAK_MODES])]
    tp = report.throughput
    cm = tp.cost_model
    parts += ["<h2>Throughput (modelled, not measured)</h2>",
              f"<p class='note'>Modelled from a cost model ({html.escape(cm.source)}), in autoregressive steps: a tree "
              f"node costs {cm.node_cost:g}, a draft step {cm.draft_cost:g}, and the modes' verify kernels are weighed "
              f"{html.escape(', '.join(f'{m} x{f:g}' for m, f in cm.mode_factor.items()))}. A modelled speedup cannot "
              "show what one mode's kernel saves over another's unless the cost file says so; measured kernel times "
              "are in benchmarks/RESULTS.md. Leaky modes' tokens per step count corrupted tokens as well "
              "(the summary shows them apart).</p>",
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
