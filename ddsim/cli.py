"""The ddsim command line: audit, gate, tree, bench, check-kernel, check-sampler.

Exit codes: 0 success (gate: the policy holds), 1 gate violated, 2 any error or bad input.
Errors are one line naming the input and the problem; an unexpected exception is also one line
and exit 2, so the gate can never pass by accident.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddsim.engines import CONVENTIONS
from ddsim.measure.settings import MAX_BUDGET, MAX_STEPS

EXIT_OK, EXIT_VIOLATED, EXIT_ERROR = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def _budgets(text: str) -> list[int]:
    try:  # an empty entry ("16,,64", "16,64,") is refused, not skipped: it is a budget mistyped
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"budgets must be integers >= 1, got {text!r}")
    return vals


def _int_in(lo: int, hi: int | None = None):
    """An argparse type: an integer in lo..hi (no upper bound where hi is None)."""
    want = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return v
    return parse


# audit option -> AuditConfig field
AUDIT_FIELDS = {"preset": "preset", "model": "model_path", "budget": "budgets", "topk_cap": "topk_cap",
                "prompts": "prompts_file", "steps": "steps", "temperature": "temperature", "device": "device",
                "seed": "seed", "trace": "trace", "drafter_model": "drafter_model", "cost": "cost_file",
                "fast_path": "fast_path", "convention": "convention", "devices": "devices", "sampler": "sampler",
                "sampler_param": "sampler_params", "measure_steps": "measure_steps"}


def _add_audit_options(p, *, defaults: bool = True):
    """The audit's options. Without defaults (gate) an option left out is None, so the gate can tell
    which ones were given and check them against a --report."""
    d = (lambda v: v) if defaults else (lambda v: None)
    from ddsim.model.config import PRESETS
    p.add_argument("--preset", default=d("tiny"), metavar="NAME",
                   help=f"built-in model preset with random weights (default: tiny): {', '.join(sorted(PRESETS))}")
    p.add_argument("--model", metavar="PATH", help="a Hugging Face checkpoint directory, or 'stdlib' for the trained "
                                                  "hybrid ddsim ships (qwen3_next, qwen3_5, qwen3_5_moe, "
                                                  "nemotron_h, bamba, granitemoehybrid, falcon_h1, lfm2, lfm2_moe, "
                                                  "jamba, olmo_hybrid, minimax, kimi_linear, zamba2)")
    p.add_argument("--budget", type=_budgets, default=d([16, 32, 64]), metavar="B[,B...]",
                   help=f"DDTree node budgets (each at most {MAX_BUDGET})")
    p.add_argument("--topk-cap", type=int, default=None, help="cap on per-depth top-k")
    p.add_argument("--prompts", metavar="FILE", help='JSONL of {"tokens": [...]} or {"text": ...} prompts, or '
                                                    "'stdlib' for the shipped model's prompts (default: 3 random prompts, "
                                                    "or a checkpoint's built-in text prompts)")
    p.add_argument("--steps", type=int, default=d(8), help=f"speculative steps per generation (default: 8, at most {MAX_STEPS})")
    p.add_argument("--temperature", type=float, default=d(0.0), help="0: greedy; > 0: seeded sampling")
    p.add_argument("--sampler", choices=["gumbel", "sglang", "eagle", "ddtree", "typical"], default=None,
                   help="at --temperature > 0, the acceptance rule (default: gumbel, ddsim's walk coupled to seeded "
                        "autoregressive sampling; sglang, eagle, ddtree: engines' rules; typical: lossy)")
    p.add_argument("--sampler-param", action="append", default=None, metavar="NAME=VALUE",
                   help="a parameter of the sampler, e.g. threshold_single=0.9 for sglang (repeatable)")
    p.add_argument("--device", default=d("auto"), help="auto (default: cuda when there is one, else cpu), cpu or cuda[:N]")
    p.add_argument("--devices", default=None, metavar="DEV[,DEV...]",
                   help="place the model's layers across these GPUs (cuda:0,cuda:1,...): contiguous blocks balanced "
                        "by bytes; under torchrun each rank takes the next group of as many GPUs")
    p.add_argument("--seed", type=int, default=d(0), help="seed of the random weights, prompts and drafter (default: 0)")
    p.add_argument("--trace", metavar="FILE", help="replay a drafter trace (JSONL) instead of the synthetic drafter")
    p.add_argument("--drafter-model", metavar="DIR",
                   help="a draft checkpoint (same vocabulary) run autoregressively as the drafter")
    p.add_argument("--cost", metavar="FILE", help="verify-cost JSON for the throughput model")
    p.add_argument("--measure-steps", choices=["auto", "on", "off"], default=d("auto"),
                   help="time each mode's decoding step (verify and commit) as the serving model runs it, and report "
                        "measured tokens per second beside the modelled figure (default auto: on CUDA)")
    p.add_argument("--fast-path", default=d("ddsim"), metavar="IMPL",
                   help="the GDN kernel every layer runs: ddsim (default), fla or MODULE:FUNCTION")
    p.add_argument("--convention", choices=list(CONVENTIONS), default=None,
                   help="the calling convention of a MODULE:FUNCTION fast path")


def _given_audit_options(a) -> dict:
    """{option: value} for the audit options given on a gate's command line."""
    return {opt: shipped(opt, getattr(a, opt)) for opt in AUDIT_FIELDS if getattr(a, opt) is not None}


# the shipped trained hybrid (ddsim/models), by name: a bare 'stdlib' means it and nothing else (a
# directory of that name is given as ./stdlib), as a bare policy name is the built-in policy
SHIPPED = {"model": "hybrid-stdlib", "drafter_model": "drafter-stdlib", "prompts": "prompts-stdlib.jsonl"}


def shipped(option: str, value):
    """``value``, or the shipped model's path for the bare name 'stdlib'."""
    if value == "stdlib" and option in SHIPPED:
        return str(Path(__file__).with_name("models") / SHIPPED[option])
    return value


def _audit_config(a):
    from ddsim.measure.settings import AuditConfig
    from ddsim.sampling.load import parse_params
    kw = {AUDIT_FIELDS[opt]: shipped(opt, v) for opt, v in vars(a).items() if opt in AUDIT_FIELDS and v is not None}
    if "sampler_params" in kw:
        kw["sampler_params"] = parse_params(kw["sampler_params"])
    return AuditConfig.build(**kw)


def _run_audit(ac, console, *, quiet=False):
    from ddsim.measure.audit import run_audit, total_steps
    bar = _StepBar(console, total_steps(ac, _count_prompts(ac)), quiet=quiet)
    try:
        return run_audit(ac, progress=bar.advance)
    finally:
        bar.stop()


class _StepBar:
    """The audit's progress bar on a terminal, started at its first step: the inputs are checked before that, and a
    refusal leaves its one line alone (a bar started before them left a blank line there, as it did in a log)."""

    def __init__(self, console, total: int, *, quiet: bool):
        self.console, self.total, self.quiet = console, total, quiet or not console.is_terminal
        self.prog = self.task = None

    def advance(self, advance: int = 1) -> None:
        if self.quiet:
            return
        if self.prog is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.prog = Progress(TextColumn("audit"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=self.console, transient=True)
            self.prog.start()
            self.task = self.prog.add_task("audit", total=self.total)
        self.prog.update(self.task, advance=advance)

    def stop(self) -> None:
        if self.prog is not None:
            self.prog.stop()


def _count_prompts(ac) -> int:
    """How many prompts the audit will run (for the progress bar); bad files fail later, in the audit."""
    if ac.prompts_file:
        try:
            return max(1, sum(1 for line in Path(ac.prompts_file).read_text().splitlines() if line.strip()))
        except (OSError, UnicodeDecodeError):
            return 1
    if ac.model_path:
        from ddsim.model.prompts import BUILTIN_PROMPTS
        return len(BUILTIN_PROMPTS)
    return ac.n_prompts


def check_writable(out: Path, option: str = "--out") -> None:
    """Refuse an output directory that cannot be written, before any work and without leaving
    anything behind: a temporary directory is made and removed in it, or in its nearest existing
    ancestor when it does not exist yet."""
    import tempfile

    from ddsim.errors import InputError
    if out.exists() and not out.is_dir():
        raise InputError(f"{option} {out}: exists and is not a directory")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{option} {out}: {probe} is not a directory")
    try:
        tempfile.TemporaryDirectory(dir=probe).cleanup()
    except OSError as e:
        raise InputError(f"{option} {out}: cannot write there ({e.strerror or e})") from None


def _write_report(report, out: Path, policy=None):
    """Stamp and write report.json and report.html; (the stamped report, its verdict by ``policy``, the
    default's if None, which report.html opens with)."""
    from ddsim.reports import html as html_report
    from ddsim.reports import json_report
    from ddsim.reports import verdict as verdicts
    report = json_report.stamp(report)
    v = verdicts.of(report, policy)
    json_report.write_report(report, html_report.render(report, v), out)
    return report, v


def cmd_audit(a, console) -> int:
    from ddsim.devices import audit_allocator
    from ddsim.measure.distributed import Shard
    from ddsim.reports.terminal import print_summary
    audit_allocator()
    ac = _audit_config(a)
    out = Path(a.out)
    check_writable(out)
    shard = Shard.from_env(ac.device)  # under torchrun: this rank's share of the prompts
    try:
        if shard.distributed:
            from ddsim.measure.audit import run_audit
            report = run_audit(ac, shard=shard)
            if report is None:  # not rank 0: its records went to rank 0
                return EXIT_OK
        else:
            report = _run_audit(ac, console)
        report, v = _write_report(report, out)
    finally:
        shard.close()
    print_summary(report, console, wide=a.wide, verdict=v)
    console.print(f"wrote {out / 'report.json'} and {out / 'report.html'}"
                  + (f" ({shard.world} ranks)" if shard.distributed else ""))
    return EXIT_OK


def check_report_matches(report, given: dict) -> None:
    """``gate --report`` with audit options: each option given must describe the report, else the
    report is of another model, budget or run and the gate refuses it."""
    from ddsim.errors import InputError
    cfg, prov = report.config, report.provenance
    for opt, value in given.items():
        flag = "--" + opt.replace("_", "-")
        if opt == "model":
            from ddsim.model.checkpoint import checkpoint_digest
            same = cfg.model_path is not None and checkpoint_digest(value) == prov.weights_sha256
            recorded = f"{prov.source}, weights sha256 {prov.weights_sha256[:12]}"
        elif opt in ("prompts", "trace", "cost"):
            from ddsim.digest import file_digest
            same = prov.inputs_sha256.get(opt) == file_digest(value)  # keyed by the option's name
            recorded = f"{opt} sha256 {prov.inputs_sha256.get(opt, 'none')[:12]}"
        elif opt == "preset":
            same = cfg.model_path is None and cfg.preset == value
            recorded = prov.source
        elif opt == "device":
            same = report.environment.device == value or cfg.device == value
            recorded = report.environment.device
        elif opt == "fast_path":
            same = cfg.fast_path == value
            recorded = prov.fast_path
        elif opt == "drafter_model":
            from ddsim.model.checkpoint import checkpoint_digest
            same = getattr(cfg.drafter, "sha256", None) == checkpoint_digest(value)
            recorded = f"drafter {cfg.drafter.kind}"
        else:
            recorded = getattr(cfg, AUDIT_FIELDS[opt])
            same = recorded == value
        if not same:
            raise InputError(f"{flag} {value}: the report does not match (it records {recorded}); "
                             "it audited something else")


def check_version(report, accept: bool) -> str | None:
    """A report written by another ddsim version is refused unless the caller accepts it explicitly; the
    caveat the verdict then carries (None for a report of this version)."""
    from ddsim.errors import InputError
    got = report.provenance.ddsim_version
    if got == _version():
        return None
    if not accept:
        raise InputError(f"--report: written by ddsim {got}, this is ddsim {_version()} (its figures and rules may "
                         "mean something else here; --accept-other-version gates it anyway, and the verdict says so)")
    return f"the report was written by ddsim {got} (accepted explicitly)"


def check_releases(report, accept: bool) -> list[str]:
    """Where the gate takes the report's kernels to be the ones here (the recheck re-runs them; --fast-path names
    them): kernels Triton compiled or interpreted (an engine's, or ddsim's own on a GPU) under another torch or Triton
    release than this process has are not the ones audited, and refused unless the caller accepts it explicitly. The
    caveats the verdict then carries. torch is imported only for such a report (the gate on another stays
    torch-free)."""
    from ddsim.errors import InputError
    env = report.environment
    if report.provenance.engine is None and not env.device.startswith("cuda"):
        return []  # ddsim's torch path on the CPU: the recheck's re-run holds it to its figures
    import torch

    from ddsim.environment import triton_version
    caveats = []
    for name, audited, here in (("torch", env.torch, torch.__version__), ("Triton", env.triton, triton_version())):
        if audited == here:
            continue
        if not accept:
            raise InputError(f"--report: its kernels ran under {name} {audited}, this is {name} {here} (the kernel "
                             "gated here is not the one audited; --accept-other-version gates it anyway, and the "
                             "verdict says so)")
        caveats.append(f"the report's kernels ran under {name} {audited}, this is {here} (accepted explicitly)")
    return caveats


def _policy_lines(policy, relaxed: list[str]) -> list[str]:
    """What the verdict says of the policy itself: its source and sha256, and every built-in rule it relaxes."""
    lines = [f"policy {policy.name}: {policy.source()}"]
    if relaxed:
        lines.append(f"policy relaxes {len(relaxed)} built-in rule{'s' if len(relaxed) > 1 else ''}: " + "; ".join(relaxed))
    return lines


def cmd_gate(a, console) -> int:
    """The gate; with --json / --junit its verdict (or its error) is also written for CI systems."""
    from ddsim.errors import DDSimError
    from ddsim.reports import gate_files
    if not a.report and (a.accept_other_version or not a.recheck or a.recheck_prompts is not None):
        from ddsim.errors import InputError
        raise InputError("--accept-other-version, --no-recheck, --recheck-prompts: only with --report")
    if not a.recheck and a.recheck_prompts is not None:  # never ignored: the recheck it sizes does not run
        from ddsim.errors import InputError
        raise InputError("--recheck-prompts: not with --no-recheck")
    for opt, path in (("--json", a.json), ("--junit", a.junit)):
        if path:
            if Path(path).is_dir():
                from ddsim.errors import InputError
                raise InputError(f"{opt} {path}: is a directory (a file path is expected)")
            check_writable(Path(path).parent if str(Path(path).parent) else Path("."), opt)
    try:
        code, doc = (_gate_dump if a.dump else _gate_report)(a, console)
    except DDSimError as e:
        if a.json or a.junit:
            gate_files.write(gate_files.document(exit_code=EXIT_ERROR, error=str(e), version=_version()),
                             json_path=a.json, junit_path=a.junit)
        raise
    gate_files.write(doc, json_path=a.json, junit_path=a.junit)
    return code


def _gate_report(a, console):
    from ddsim.errors import InputError
    from ddsim.reports import gate_files, json_report
    from ddsim.reports import verdict as verdicts
    from ddsim.verdict.gate import leak_nodes, load_policy
    if a.engine_dtype is not None:  # never ignored: an audit's report carries its own dtype
        raise InputError("--engine-dtype: only with --dump (an audit's report records the dtype its fast path "
                         "computed in)")
    policy = load_policy(a.policy)
    caveats, notes = [], []  # caveats end the verdict line; notes (the recheck) only go to --json
    rerun = None  # a whole recheck's own re-run of the audit
    if a.report:
        if a.out:
            raise InputError("--out: only with an audit the gate runs itself (not with --report)")
        import hashlib

        from ddsim.jsonl import read_text
        text = read_text(a.report, "report")  # read once: what is gated is what its sha256 names
        report = json_report.loads(text, str(a.report))
        report_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        other_version = check_version(report, a.accept_other_version)
        if other_version:
            caveats.append(other_version)
        given = _given_audit_options(a)
        check_report_matches(report, given)
        if a.recheck or "fast_path" in given:  # its kernels taken to be the ones here (else: on trust, said so)
            caveats.extend(check_releases(report, a.accept_other_version))
        if "fast_path" in given and not a.recheck:  # (the recheck checks the report's kernel, the one given)
            from ddsim.measure.recheck import check_engine_source
            check_engine_source(report, given["fast_path"], given.get("convention"))
        v = None
        if a.recheck:
            from ddsim.measure.recheck import FILE_FIELDS, recheck
            # a file option given names where that input is here (its digest matched the report's above)
            at = {AUDIT_FIELDS[o]: path for o, path in given.items() if AUDIT_FIELDS[o] in FILE_FIELDS}
            checked = recheck(report, prompts=a.recheck_prompts or 1, at=at)
            notes.append(checked.line())
            print(notes[-1])
            rerun = checked.rerun
        else:
            caveats.append("reached without a recheck (--no-recheck): the report's figures were taken on trust")
    else:
        ac = _audit_config(a)
        if a.out:
            check_writable(Path(a.out))
        report = _run_audit(ac, console, quiet=True)
        report, v = _write_report(report, Path(a.out), policy) if a.out else (json_report.stamp(report), None)
        report_sha256 = None  # the gate's own audit: no report file it was handed
    v = v or verdicts.of(report, policy)
    again = None if rerun is None else verdicts.of(rerun, policy)
    if again is not None and v.holds and not again.holds:
        # a whole recheck's figures reproduce the report's within tolerance, yet break a rule the report's
        # keep (a figure at its bound): the verdict is the re-run's, never the kinder of the two
        v = again
        caveats.append("the report's own figures hold, the recheck's re-run of the audit does not (a figure "
                       "within the recheck's tolerance of its bound): the re-run's verdict is given")
    for line in _policy_lines(policy, v.relaxed):
        print(line)
    for line in v.skipped:
        notes.append(f"not applicable: {line}")
        print(notes[-1])
    for x in v.violated:
        print(x.line(policy.mode))
    if leak_nodes(report, policy.mode) == 0:
        print("the audit never exercised the leak: some budget verified no node outside order-exact positions "
              "(raise --budget or --topk-cap), so it cannot approve hybrid-unsafe verification")
    label = f"gate {policy.name} ({report.precision.fast_path} fast path, {report.provenance.source})"
    caveat = "".join(f"; {c}" for c in caveats)
    code = EXIT_OK if v.holds else EXIT_VIOLATED
    if v.holds:
        print(f"{label}: all {len(v.rules)} rules hold for mode {policy.mode}{caveat}")
    else:
        print(f"{label}: {len(v.violated)} of {len(v.rules)} rules violated; keep hybrid-unsafe verification off{caveat}")
    return code, gate_files.document(exit_code=code, policy=policy, verdicts=v.rules, relaxed=v.relaxed,
                                     subject=report.provenance.source, notes=notes + caveats,
                                     version=_version(), audited=gate_files.audited_report(report, report_sha256))


def _version() -> str:
    import ddsim
    return ddsim.__version__


def _gate_dump(a, console):
    from ddsim.engines import replay
    from ddsim.errors import InputError
    from ddsim.reports import gate_files
    from ddsim.verdict.gate import evaluate_replay, load_policy, relaxations
    policy = load_policy(a.policy)
    if a.report or not a.model:
        raise InputError("--dump: needs --model DIR (the checkpoint the engine served) and no --report")
    a.engine_dtype = a.engine_dtype or "float32"
    others = [o for o, v in _given_audit_options(a).items() if v is not None and o not in ("model", "device")]
    if others:
        raise InputError(f"--{others[0].replace('_', '-')}: not an option of a replay (--dump takes --model, --device)")
    if a.out:
        check_writable(Path(a.out))
    rep = replay.run(shipped("model", a.model), a.dump, device=_replay_device(a.device),
                     tolerance=replay.tolerance(policy, a.engine_dtype))
    if a.out:
        replay.write(rep, Path(a.out))
    relaxed = relaxations(policy, None)
    for line in _policy_lines(policy, relaxed):
        print(line)
    verdicts = evaluate_replay(policy, rep["summary"])
    bad = [v for v in verdicts if not v.holds]
    for v in bad:
        print(v.line("replay"))
    notes = [f"noise KL {rep['noise_kl']:.3g}"]
    turned = rep["summary"]["rounding_divergence_steps"]
    if turned:  # the engine emitted other tokens than exact verification there: said, though no rule counts it
        notes.append(f"{turned} steps emitted other tokens than exact verification where the engine's rounding turned "
                     "a near-tie (every node within the noise, the engine following its own rule); not counted as "
                     "silent corruption")
        print(f"note: {notes[-1]}")
    label = (f"gate {policy.name} (replay of {rep['summary']['steps']} engine verify steps; logits within "
             f"{replay.tolerance_words(rep['noise_kl'], rep['provenance']['logits'])} of the oracle's count as exact: the "
             f"policy's tolerance for a {a.engine_dtype} engine"
             f"{', tightened by the dump' if rep['noise_kl'] < policy.noise_kl(a.engine_dtype) else ''})")
    if bad:
        print(f"{label}: {len(bad)} of {len(verdicts)} rules violated; keep hybrid-unsafe verification off")
    else:
        print(f"{label}: all {len(verdicts)} rules hold")
    code = EXIT_VIOLATED if bad else EXIT_OK
    return code, gate_files.document(exit_code=code, policy=policy, verdicts=verdicts, relaxed=relaxed,
                                     subject=f"replay of {a.dump}", notes=notes,
                                     version=_version(), audited=gate_files.audited_replay(rep))


def _replay_device(device):
    from ddsim.devices import resolve_device
    return resolve_device(device or "auto")


def cmd_replay(a, console) -> int:
    from ddsim.engines import replay
    out = Path(a.out)
    check_writable(out)
    if a.noise_kl is not None and not (a.noise_kl >= 0 and a.noise_kl < float("inf")):
        from ddsim.errors import InputError
        raise InputError(f"--noise-kl: expected a finite value >= 0, got {a.noise_kl}")
    tolerance = replay.default_tolerance(a.noise_kl, a.engine_dtype)
    rep = replay.run(shipped("model", a.model), a.dump, device=_replay_device(a.device), tolerance=tolerance)
    replay.write(rep, out)
    s = rep["summary"]
    for r in rep["steps"]:
        if r["diagnosis"] != "within noise" or r["silent_corruption"]:
            print(f"step {r['step']} ({r['request']}): {r['diagnosis']}"
                  + (" — SILENT CORRUPTION" if r["silent_corruption"] else "") + f": {r['evidence']}")
    diag = ", ".join(f"{k} {v}" for k, v in s["diagnoses"].items() if v)
    rounding = (f" (and {s['rounding_divergence_steps']} steps where the engine's rounding turned a near-tie)"
                if s["rounding_divergence_steps"] else "")
    print(f"replayed {s['steps']} steps ({s['requests']} requests, {s['nodes']} nodes) within "
          f"{replay.tolerance_words(rep['noise_kl'], rep['provenance']['logits'])}: {diag}; silent corruption in "
          f"{s['silent_corruption_steps']} steps{rounding}; report in {out}")
    return EXIT_OK


def cmd_tree(a, console) -> int:
    import torch

    from ddsim.errors import InputError
    from ddsim.trees.builders import ddtree
    # every option given is used, or refused: the random logits' and the trace's options are not mixed
    unused = [f for f, v in (("--seed", a.seed), ("--depth", a.depth)) if v is not None] if a.trace else \
        (["--step"] if a.step is not None else [])
    if unused:
        raise InputError(f"{unused[0]}: " + ("not with --trace (the trace's drafts give the tree)" if a.trace else
                                            "only with --trace (a step of the trace)"))
    if a.trace:
        from ddsim.sim.drafters import DraftContext, TraceDrafter
        if a.vocab is None:
            raise InputError("--vocab: needed with --trace (the trace's vocab_size)")
        d = TraceDrafter(a.trace, vocab_size=a.vocab)
        logits = d.draft(DraftContext(step=a.step or 0, tokens=[0]))
        cap = min(c for c in (a.topk_cap, d.max_rank) if c)
    else:
        gen = torch.Generator().manual_seed(a.seed or 0)
        logits = torch.randn(a.depth or 6, 32 if a.vocab is None else a.vocab, generator=gen,
                             dtype=torch.float64) * 3.0
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
    from ddsim.bench.bench import mode_table
    from ddsim.devices import resolve_device
    from ddsim.errors import InputError
    dev = resolve_device(a.device)
    # every option given is used, or refused: never silently ignored
    if dev.type != "cuda" and a.op != "gdn":
        raise InputError(f"--op {a.op}: a kernel table, on CUDA only; on the CPU bench times each verify mode of "
                         "--preset's model (any family's preset)")
    if dev.type == "cuda" and a.repeats is not None:
        raise InputError("--repeats: the CPU's mode table only; on CUDA each kernel is timed by its own repeats")
    if dev.type == "cuda" and a.op == "gdn" and a.preset is not None:
        raise InputError(f"--preset {a.preset}: the GDN kernel table runs at Qwen3.6-27B's GDN shapes, whatever the "
                         "preset (--op mamba2 takes a preset's SSM shape)")
    if dev.type == "cuda" and a.op == "mamba2":
        from ddsim.bench.bench_mamba2 import mamba2_kernel_accuracy, mamba2_kernel_table
        from ddsim.model.config import get_preset
        preset = a.preset or "nemotron-h-8b"
        if not get_preset(preset).mamba_layers:
            raise InputError(f"--preset {preset}: has no Mamba2 layers to take the kernel shapes from")
        print(mamba2_kernel_table(preset=preset, device=str(dev))[0])
        print(mamba2_kernel_accuracy(device=str(dev)))
    elif dev.type == "cuda":
        from ddsim.bench.bench import kernel_accuracy, kernel_table
        print(kernel_table(device=str(dev))[0])
        print(kernel_accuracy(device=str(dev)))
    else:
        print(mode_table(preset=a.preset or "tiny", repeats=a.repeats or 5, device=str(dev)))
    return EXIT_OK


def cmd_check_kernel(a, console) -> int:
    import torch
    from rich.markup import escape
    from rich.table import Table

    from ddsim.devices import prepare_engine_device
    from ddsim.engines.check_kernel import DTYPES, check, default_launch, write_result
    from ddsim.environment import environment
    from ddsim.errors import InputError
    if a.max_examples < 1:
        raise InputError(f"--max-examples: expected >= 1, got {a.max_examples}")
    if not (a.example_timeout > 0 and a.example_timeout < float("inf")):
        raise InputError(f"--example-timeout: expected a finite number of seconds > 0, got {a.example_timeout}")
    if a.impl == "fla":  # its kernels take no tree: --mode exact refused before fla-core's import
        from ddsim.engines import fla
        fla.refuse_before_import(a.op, a.mode)
    device = prepare_engine_device(a.device)
    if a.launch == "graph" and not str(device).startswith("cuda"):  # a CUDA graph needs a CUDA device
        raise InputError(f"--launch graph: needs a CUDA device, got --device {a.device} ({device}); the CPU replays eager")
    kernel = _load_kernel(a)
    kernel.check_op(a.op, a.mode)
    if a.commit and (a.op, a.mode) not in kernel.node_states:  # a commit given that would never run: refused
        raise InputError(f"--commit {a.commit}: {kernel.name} keeps no node states in --op {a.op} --mode {a.mode}, so "
                         "there is nothing for a commit to copy")
    out = Path(a.out)
    check_writable(out.parent if str(out.parent) else Path("."), "--out")
    env = environment(torch.device(device))  # before the check: a device fault ends the CUDA context its name needs
    result = check(kernel, mode=a.mode, device=device, max_examples=a.max_examples, dtype=DTYPES[a.dtype], op=a.op,
                   profile=a.profile, example_timeout=a.example_timeout, on_hang=lambda label, s: _hung(out, label, s),
                   launch=a.launch, progress=(lambda line: print(line, file=sys.stderr, flush=True)) if a.progress else None)
    from ddsim.engines import OPS
    op = a.op if a.op in OPS else None  # None: the GDN verify
    name, source, digest, sources = ((getattr(kernel, f"{op}_name"), getattr(kernel, f"{op}_source"),
                                      getattr(kernel, f"{op}_source_sha256"), getattr(kernel, f"{op}_sources"))
                                     if op else (kernel.name, kernel.source, kernel.source_sha256, kernel.sources))
    t = Table(title=f"{name} ({kernel.package or '?'} {kernel.version or ''}) mode {a.mode}, {a.dtype} inputs, "
                    f"on {device} against the oracle, {result.profile} profile")
    for col in ("property", "verdict", "detail"):
        t.add_column(col)
    for r in result:  # details quote labels in brackets: plain text, not markup
        t.add_row(r.name, "holds" if r.holds else "[bold red]FAILS[/bold red]", escape(r.detail))
    console.print(t)
    cov = Table(title=f"coverage: {result.examples} serving examples ({result.profile}) and the drawn ones")
    cov.add_column("dimension")
    cov.add_column("values run")
    for dim, vals in result.coverage.items():
        cov.add_row(dim, ", ".join(map(str, vals)) if isinstance(vals, list) else f"{vals:.3g}")
    console.print(cov)
    if result.lost_at is not None:  # nothing after a device fault ran: said, with what was left
        left = f"the {len(result.unchecked)} serving examples after it and " if result.unchecked else ""
        print(f"a fault at {result.lost_at} ended the device's CUDA context: {left}every drawn input after it not run "
              f"(named in {out})")
    if digest:  # and the files of its package its module reaches (the JSON names each with its sha256)
        console.print(f"kernel source {source} sha256 {digest[:16]}… ({len(sources)} files of its package reached)")
    commits = kernel.commits(a.op, a.mode)
    if commits and kernel.commit_source_sha256:
        console.print(f"commit {kernel.commit_name}: source {kernel.commit_source} sha256 "
                      f"{kernel.commit_source_sha256[:16]}…")
    elif not commits and (a.op, a.mode) in kernel.node_states:  # its kept states checked, no commit of them: said
        console.print(f"no commit checked: {name} offers none for its kept node states (--commit MODULE:FUNCTION "
                      "checks one)")
    write_result(result, out, kernel={"name": name, "package": kernel.package, "version": kernel.version,
                                      "source": source, "source_sha256": digest, "sources": dict(sources),
                                      "op": a.op, "mode": a.mode,
                                      "dtype": a.dtype, "device": device, "max_examples": a.max_examples,
                                      "launch": a.launch or default_launch(device),
                                      **({"commit": {"name": kernel.commit_name, "source": kernel.commit_source,
                                                     "source_sha256": kernel.commit_source_sha256,
                                                     "sources": dict(kernel.commit_sources)}} if commits else {})},
                 environment=env)
    failed = [r for r in result if not r.holds]
    if failed:
        for r in failed:
            print(f"FAILED {r.name}: {r.detail}")
        print(f"{len(failed)} of {len(result.properties)} properties failed; counterexamples in {out}")
        return EXIT_VIOLATED
    print(f"all {len(result.properties)} properties hold ({result.profile} profile: {result.examples} serving examples "
          f"and {a.max_examples} drawn per property; coverage in {out})")
    return EXIT_OK


def cmd_check_sampler(a, console) -> int:
    import json

    import torch
    from rich.table import Table

    from ddsim.environment import environment
    from ddsim.errors import InputError
    from ddsim.reports.json_report import write_atomic
    from ddsim.sampling.check import check, describe_failure, power_line
    from ddsim.sampling.load import parse_params, resolve
    if not 1000 <= a.draws <= 10**8:
        raise InputError(f"--draws: expected 1000 to 1e8 draws per case, got {a.draws}")
    if a.max_examples < 1:  # as check-kernel's: a verdict on the explicit cases alone is never given
        raise InputError(f"--max-examples: expected >= 1, got {a.max_examples}")
    if not 0 < a.alpha <= 0.5:
        raise InputError(f"--alpha: expected a false-alarm rate in (0, 0.5], got {a.alpha}")
    device = a.device
    if device == "auto":
        device = "cuda" if a.impl == "sgl-kernel" and torch.cuda.is_available() else "cpu"
    sampler, described = resolve(a.impl, convention=a.convention, params=parse_params(a.param), drafting=a.drafting,
                                 device=device)
    out = Path(a.out)
    check_writable(out.parent if str(out.parent) else Path("."), "--out")
    env = environment(torch.device(device))  # what the rule ran under (before the check, as check-kernel's)
    result = check(sampler, draws=a.draws, max_examples=a.max_examples, alpha=a.alpha, seed=a.seed)
    t = Table(title=f"{a.impl} (drafting {sampler.drafting}): {len(result.cases)} cases x {a.draws} draws against "
                    f"autoregressive sampling from the target")
    for col in ("case", "nodes", "V", "worst test", "L1 / threshold", "verdict"):
        t.add_column(col)
    for c in result.cases:
        w = c.worst()
        t.add_row(c.case.label, str(len(c.case.parents) if c.case.ddtree is None else f"ddtree {c.case.ddtree[0]}"),
                  str(c.case.vocab), c.failure or (w["name"] if w else "-"),
                  "-" if c.failure or not w else f"{w['l1'] / w['threshold']:.2f}",
                  "holds" if c.holds else "[bold red]LOSSY[/bold red]")
    console.print(t)
    print(f"false-alarm rate <= {a.alpha:g} per run ({result.alpha_per_test:.3g} per test); "
          + power_line(a.draws, result.alpha_per_test))
    doc = {"sampler": described, "environment": env, "drafting": sampler.drafting, "draws_per_case": a.draws,
           "alpha": a.alpha, "alpha_per_test": result.alpha_per_test, "seed": a.seed, "max_examples": a.max_examples,
           "lossless": result.holds, "seconds": round(result.seconds, 1),
           "cases": [{"case": c.case.describe(), "parents": list(c.case.parents), "holds": c.holds,
                      "failure": c.failure,
                      "tests": [{k: v for k, v in x.items() if k not in ("measured", "expected")} for x in c.tests],
                      "worst": c.worst()} for c in result.cases]}
    write_atomic({out: json.dumps(doc, indent=1) + "\n"})
    if not result.holds:
        for line in describe_failure(result.worst()):
            print(line)
        bad = sum(not c.holds for c in result.cases)
        print(f"LOSSY: {bad} of {len(result.cases)} cases emit tokens not distributed as autoregressive sampling "
              f"(details in {out})")
        return EXIT_VIOLATED
    print(f"no evidence of loss: {len(result.cases)} cases x {a.draws} draws hold ({result.seconds:.0f} s; "
          f"details in {out})")
    return EXIT_OK


def _hung(out: Path, label: str, seconds: float) -> None:
    """A kernel that did not return on a serving example fails, and the process exits 1: a hung kernel
    cannot be interrupted, and a check that never ends must not read as one that passed."""
    import json
    import os

    from ddsim.reports.json_report import write_atomic
    line = f"serving example [{label}] did not return within {seconds:g} s: the kernel hangs there"
    try:
        write_atomic({out: json.dumps({"holds": False, "hung": {"example": label, "seconds": seconds},
                                       "properties": [], "counterexamples": []}, indent=1) + "\n"})
    finally:
        print(f"FAILED every property: {line}", flush=True)
        print(f"the check did not finish; exit 1 (verdict in {out})", flush=True)
        os._exit(EXIT_VIOLATED)


def _load_kernel(a):
    from ddsim.engines import load
    return load(a.impl, convention=a.convention, commit=a.commit)


def build_parser() -> argparse.ArgumentParser:
    import ddsim
    p = _Parser(prog="ddsim", description="Tree speculative decoding on hybrid models, checked against an exact oracle")
    p.add_argument("--version", action="version", version=f"ddsim {ddsim.__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=_int_in(1, 1024), default=None, metavar="N",
                        help="CPU threads for torch (default: OMP_NUM_THREADS when set, else 1: ddsim's CPU work is "
                             "small ops that a thread pool slows down, most of all on a busy machine)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add = sub.add_parser
    sub.add_parser = lambda *a, **k: _add(*a, parents=[common], **k)  # every command takes --threads
    pa = sub.add_parser("audit", help="leakage audit; writes report.json and report.html")
    _add_audit_options(pa)
    pa.add_argument("--out", default="ddsim-report", help="output directory (default: ./ddsim-report)")
    pa.add_argument("--wide", action="store_true", help="the summary with every column (state errors, modelled speedup)")
    pg = sub.add_parser("gate", help="evaluate a policy: exit 0 holds, 1 violated, 2 error")
    pg.add_argument("--policy", required=True, metavar="FILE",
                    help="TOML policy file, or the name of a built-in policy (hybrid-unsafe)")
    pg.add_argument("--report", metavar="FILE",
                    help="an existing report.json (otherwise the audit runs); audit options given with it must match it")
    pg.add_argument("--out", metavar="DIR", help="also write the audit's (or replay's) report here (without --report)")
    pg.add_argument("--dump", metavar="DIR", help="gate a replay of an engine's verify-step dump (with --model DIR)")
    pg.add_argument("--recheck", action=argparse.BooleanOptionalAction, default=True,
                    help="with --report: re-run a sample of the audit from the report's provenance and refuse a report "
                         "that does not reproduce (default: on; --no-recheck takes its figures on trust, and says so)")
    pg.add_argument("--recheck-prompts", type=_int_in(1), default=None, metavar="N",
                    help="prompts the recheck re-runs in every budget and mode (default: 1; all of them: the whole "
                         "audit)")
    pg.add_argument("--accept-other-version", action="store_true",
                    help="with --report: gate a report written by another ddsim version, or whose kernels ran under "
                         "another torch or Triton release (refused otherwise)")
    pg.add_argument("--json", metavar="PATH", help="also write the verdict as JSON (every rule, the policy's sha256; "
                                                    "an error too), for CI systems")
    pg.add_argument("--junit", metavar="PATH", help="also write the verdict as JUnit XML (a test case per rule)")
    pg.add_argument("--engine-dtype", choices=["float32", "bfloat16", "float16", "float64"], default=None,
                    help="with --dump: the dtype the engine computes in, which picks the policy's replay tolerance "
                         "([replay.<dtype>]); a dump's own header can only tighten it (default: float32)")
    _add_audit_options(pg, defaults=False)
    pr = sub.add_parser("replay", help="replay a serving engine's verify-step dump against the exact oracle")
    pr.add_argument("--model", required=True, metavar="DIR", help="the checkpoint the engine served ('stdlib': the shipped one)")
    pr.add_argument("--dump", required=True, metavar="DIR", help="the engine's verify-step dump (ddsim.engines.dump)")
    pr.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")
    pr.add_argument("--noise-kl", type=float, default=None,
                    help="KL within which the engine counts as exact (default: the default policy's for --engine-dtype); "
                         "a dump's declared compute dtype can only tighten it")
    pr.add_argument("--engine-dtype", choices=["float32", "bfloat16", "float16", "float64"], default="float32",
                    help="the dtype the engine computes in: picks the default policy's tolerance (default: float32)")
    pr.add_argument("--out", default="ddsim-replay", help="where report.json and report.html go")
    pt = sub.add_parser("tree", help="draw a DDTree with node order and order-exact nodes")
    pt.add_argument("--seed", type=_int_in(0), default=None, help="seed of the random draft logits (default: 0)")
    pt.add_argument("--budget", type=_int_in(1, 1024), default=16, help="DDTree node budget (default: 16)")
    pt.add_argument("--topk-cap", type=_int_in(1), default=None, help="cap on per-depth top-k")
    pt.add_argument("--depth", type=_int_in(1), default=None, help="drafter depth (default: 6)")
    pt.add_argument("--vocab", type=_int_in(1), default=None, help="vocabulary size (default 32; required with --trace)")
    pt.add_argument("--trace", metavar="FILE", help="build the tree from a drafter trace (JSONL) instead")
    pt.add_argument("--step", type=_int_in(0), default=None, help="the trace's step to build (default: 0)")
    pt.add_argument("--format", choices=["text", "dot"], default="text", help="text (default) or Graphviz dot")
    pk = sub.add_parser("check-kernel", help="the property suite against the oracle for an engine's GDN kernel, "
                                             "tree conv, Mamba2, KDA or lightning-attention verify")
    pk.add_argument("--impl", required=True, help="ddsim, sglang, vllm, fla, or MODULE:FUNCTION (with --convention)")
    pk.add_argument("--convention", choices=list(CONVENTIONS), default=None,
                    help="the calling convention of a MODULE:FUNCTION kernel")
    pk.add_argument("--mode", required=True, choices=["exact", "leaky"])
    pk.add_argument("--commit", default=None, metavar="MODULE:FUNCTION",
                    help="a commit in SGLang's convention (fused_mamba_state_scatter_with_mask's signature) in place of "
                         "the kernel's own: run after every verify that keeps node states, the pool held to the oracle")
    pk.add_argument("--op", default="gdn", choices=["gdn", "conv", "mamba2", "kda", "lightning"],
                    help="gdn: the GDN recurrence (default); conv: the engine's tree causal conv; mamba2: its Mamba2 "
                         "tree verify (SSM); kda: its Kimi Delta Attention verify; lightning: its lightning-attention "
                         "verify")
    pk.add_argument("--device", default="auto",
                    help="auto (default: cuda when there is one), cpu (Triton kernels in Triton's interpreter) or cuda[:N]")
    pk.add_argument("--max-examples", type=int, default=100,
                    help="hypothesis examples drawn per property, besides the profile's serving examples (always run)")
    pk.add_argument("--profile", choices=["quick", "serving"], default=None,
                    help="the explicit serving examples: quick (default on the CPU, where Triton's interpreter is slow: "
                         "a few of each wide dimension) or serving (default on CUDA: every value)")
    pk.add_argument("--launch", choices=["graph", "eager"], default=None,
                    help="how the replayed examples replay the kernel's launch on another step's tensors: graph (default "
                         "on CUDA) from a CUDA graph captured on that step, as a server that replays its verify from "
                         "graphs runs it; eager (the CPU's) called again on those tensors, as a server without graphs")
    pk.add_argument("--example-timeout", type=float, default=900.0, metavar="S",
                    help="seconds a serving example may take before the kernel is judged hung: every property fails and "
                         "the command exits 1 (default: 900)")
    pk.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="q, k, v and gates drawn in this dtype (states float32); outputs compared within its tolerance "
                         "(the serving examples add the other dtypes)")
    pk.add_argument("--progress", action="store_true",
                    help="print each serving example's and each property's drawn search's wall time to stderr as it "
                         "ends (where a long check spends its time; the verdicts are the same)")
    pk.add_argument("--out", default="check-kernel.json",
                    help="the verdicts, coverage and counterexamples (JSON, written atomically)")
    ps = sub.add_parser("check-sampler", help="a statistical losslessness test of a tree acceptance rule at "
                                              "temperature > 0: exit 0 no evidence of loss, 1 lossy, 2 error")
    ps.add_argument("--impl", required=True,
                    help="sglang, eagle, ddtree, gumbel, specinfer, rrs, typical (ddsim's references), sgl-kernel "
                         "(sgl_kernel's CUDA kernel) or MODULE:FUNCTION (with --convention)")
    ps.add_argument("--convention", choices=["ddsim", "sglang"], default=None,
                    help="the calling convention of a MODULE:FUNCTION rule (docs/sampling.md)")
    ps.add_argument("--param", action="append", metavar="NAME=VALUE",
                    help="a rule parameter, e.g. threshold_single=0.9 (repeatable)")
    ps.add_argument("--drafting", choices=["fixed", "iid", "without-replacement"], default=None,
                    help="how the tree's tokens are drafted for the rule: fixed (top-k trees; the default for "
                         "MODULE:FUNCTION), iid or without-replacement (sampled per draw)")
    ps.add_argument("--draws", type=int, default=1_000_000, help="draws per case (default: 1000000)")
    ps.add_argument("--max-examples", type=int, default=24,
                    help="hypothesis-drawn cases besides the 9 explicit ones (default: 24)")
    ps.add_argument("--alpha", type=float, default=1e-6,
                    help="the false-alarm rate of the whole run (default: 1e-6)")
    ps.add_argument("--seed", type=_int_in(0), default=0, help="the random numbers' seed (default: 0)")
    ps.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]: where an SGLang-convention "
                                                     "rule runs")
    ps.add_argument("--out", default="check-sampler.json", help="the verdict and every test (JSON, written atomically)")
    pb = sub.add_parser("bench", help="CUDA: GDN kernel times against the memory floor; CPU: trees per second per mode")
    pb.add_argument("--preset", default=None, metavar="NAME",
                    help="CPU: the model whose verify modes are timed (default: tiny); CUDA with --op mamba2: the "
                         "preset whose SSM shape the kernels take (default: nemotron-h-8b)")
    pb.add_argument("--repeats", type=_int_in(1, 100000), default=None, metavar="N",
                    help="CPU: timed repeats per mode (default: 5)")
    pb.add_argument("--op", choices=["gdn", "mamba2"], default="gdn",
                    help="CUDA: the GDN kernels (default) or the Mamba2 kernels at --preset's SSM shape "
                         "(default nemotron-h-8b)")
    pb.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")
    return p


COMMANDS = {"audit": cmd_audit, "gate": cmd_gate, "tree": cmd_tree, "bench": cmd_bench, "check-kernel": cmd_check_kernel,
            "check-sampler": cmd_check_sampler, "replay": cmd_replay}


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every ``finally`` runs (temporary files removed). A BaseException, as
    KeyboardInterrupt is: a handler of a kernel's or an example's errors (``except Exception``) must not take it for
    one and go on (check-kernel once recorded it as every property failing on the example it came in, and ran on)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    """Exit 0 success (gate: the policy holds), 1 gate violated, 2 anything else. ``--debug`` or
    DDSIM_DEBUG=1 adds the traceback of an internal error (still exit 2)."""
    import os
    import signal
    import traceback

    from rich.console import Console
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("DDSIM_DEBUG", "") not in ("", "0")
    if "--debug" in argv:
        argv.remove("--debug")
        debug = True
    args = build_parser().parse_args(argv)
    console = Console()
    if not console.is_terminal:  # logs and CI: the audit's summary fits 100 columns (--wide and the tables of
        # check-kernel need more)
        console = Console(width=100 if args.command in ("audit", "gate") and not getattr(args, "wide", False) else 160)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from ddsim.errors import DDSimError
        from ddsim.threads import configure
        configure(args.threads)
        return COMMANDS[args.command](args, console)
    except DDSimError as e:
        print(f"ddsim {args.command}: error: {e}", file=sys.stderr)
    except (KeyboardInterrupt, Terminated) as e:
        print(f"ddsim {args.command}: {'terminated' if isinstance(e, Terminated) else 'interrupted'}", file=sys.stderr)
    except Exception as e:  # fail closed: never exit 0; the traceback only when asked for
        if debug:
            traceback.print_exc()
        print(f"ddsim {args.command}: internal error: {type(e).__name__}: {e}"
              + ("" if debug else " (--debug or DDSIM_DEBUG=1 shows the traceback)"), file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
