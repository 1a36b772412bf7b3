"""``gate --report R`` re-runs a sample of R's audit from R's own provenance and refuses a report that
does not reproduce: a report is trusted for what it can be shown to compute, not for its name.

What is rechecked: before any work, that everything the audit read is at hand and is what R records
(the preset, or the checkpoint with its weights' sha256; the prompts, trace and cost files by sha256;
the drafter checkpoint; the device kind; an engine kernel by its source's sha256). Then a sample of
R's prompts, chosen from R's own digest (so a forger cannot choose which prompt is looked at), is
audited again: the prompt's tokens, its reference decoding, and its generation in the chain and in
every budget and mode must come out as R records them, and R's leak tables (pooled over every prompt) must
hold the sample's own: no count, flip or maximum of the sample's nodes above R's. A sample that covers every prompt re-runs
the whole audit and compares every figure the gate reads, leak tables included; the gate then holds its
verdict to the re-run's figures as well as the report's (a figure within the tolerance of a rule's bound
may pass on one and not the other: the verdict fails if either does).

The audit's files are found where the report records them (relative to the current directory, as the audit
named them), or where the gate's own options name them (``--model``, ``--drafter-model``, ``--prompts``,
``--trace``, ``--cost``: a report gated from another directory or on another machine, or a checkpoint moved): the
gate has checked each such file against the report's digest before the recheck starts, and the re-run's figures
are compared with the paths the report records put back, so a file is bound by its content, not by its name.

The recheck runs with the torch thread count the report's environment records (a float32 reduction's
order, and so its last bits, follow it). Token sequences, accepted lengths and decisions compare
exactly; floats within the report's precision (ddsim.measure.compare's tolerance for its fast-path dtype,
with the model slack: 4e-4 relative for float32), above an absolute floor that depends on what the
figure measures (ddsim.measure.reproduce). Another CPU's vector units (AVX-512 or AMX against AVX2, say) sum
a float32 GEMM in another order, so the exact path's distance from the oracle, itself rounding, comes
out other in its leading digits: its KL of 2e-13 and state error of 2e-7 cannot be checked relatively,
only against the rounding they measure. Every figure keeps the relative tolerance above its floor.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ddsim.errors import InputError
from ddsim.measure.reproduce import bounded, compare, tolerance


@dataclass(frozen=True)
class RecheckResult:
    prompts: list[int]  # the prompts re-run
    whole: bool  # the sample covered every prompt: the whole report was compared
    compared: int  # values compared
    rerun: object = None  # a whole recheck's own Report (the gate holds its verdict to it too), else None

    def line(self) -> str:
        what = "the whole audit re-run" if self.whole else f"prompts {self.prompts} re-run in every budget and mode"
        bound = "" if self.whole else " or hold inside its leak tables"
        return f"recheck: {what}; {self.compared} figures reproduce the report{bound}"


def sample(report, k: int) -> list[int]:
    """k distinct prompt indices chosen by the report's own content digest (generated_at aside)."""
    n = len(report.prompts)
    d = report.model_dump(mode="json")
    d.pop("generated_at")
    d.pop("measured_steps")  # the machine's timings: not the report's content
    seed = int.from_bytes(hashlib.sha256(json.dumps(d, sort_keys=True).encode()).digest()[:8], "big")
    order = sorted(range(n), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    return sorted(order[:min(k, n)])


# the audit's inputs read from files, by AuditConfig field, with their options: the recheck reads each where the
# report records it, or where the gate's option of that name says it is here
FILE_FIELDS = {"model_path": "--model", "drafter_model": "--drafter-model", "prompts_file": "--prompts",
               "trace": "--trace", "cost_file": "--cost"}


def _located(report, at: dict[str, str] | None) -> dict[str, str]:
    """{field: path} for the files the report's audit read that a gate option names elsewhere (only those)."""
    at = dict(at or {})
    unknown = set(at) - set(FILE_FIELDS)
    if unknown:
        raise ValueError(f"not file inputs of an audit: {sorted(unknown)}")
    return {f: p for f, p in at.items() if getattr(report.config, f) is not None}


def audit_config(report, at: dict[str, str] | None = None):
    """The AuditConfig the report records (its drafter record aside), on the device it ran on (an 'auto'
    audit re-runs where it resolved, not wherever 'auto' resolves here), its files read from ``at``'s paths
    ({field: path}, FILE_FIELDS) where given."""
    from ddsim.measure.settings import AuditConfig
    cfg = report.config.model_dump()
    cfg.pop("drafter")
    if cfg["device"] == "auto":
        cfg["device"] = report.environment.device
    cfg.update(_located(report, at))
    return AuditConfig(**cfg)


def check_at_hand(report, at: dict[str, str] | None = None) -> None:
    """Everything the audit read is here (where the report records it, or at ``at``'s path) and is what the
    report records; else one InputError saying what is missing (``--no-recheck`` skips the recheck, and the
    verdict then says so)."""
    import torch

    from ddsim.digest import file_digest
    cfg, prov = report.config, report.provenance
    paths = {f: getattr(cfg, f) for f in FILE_FIELDS} | _located(report, at)
    hint = " (--no-recheck gates the report unchecked, and says so)"

    def missing(field, what):
        where = ("" if field in (at or {}) else
                 f"; {FILE_FIELDS[field]} {'DIR' if field in ('model_path', 'drafter_model') else 'FILE'} names "
                 "where it is here")
        return InputError(f"--report: cannot recheck: the audited {what} {paths[field]} is not here{where}{hint}")

    from ddsim.model.checkpoint import checkpoint_digest
    for what, field, want in (("checkpoint", "model_path", prov.weights_sha256),
                              ("drafter", "drafter_model", getattr(cfg.drafter, "sha256", None))):
        path = paths[field]
        if path is None:
            continue
        if not Path(path).is_dir():
            raise missing(field, what)
        if checkpoint_digest(path) != want:
            raise InputError(f"--report: the {what} at {path} is not the one audited (the sha256 of its config and "
                             f"weights differs){hint}")
    for opt, field in (("prompts", "prompts_file"), ("trace", "trace"), ("cost", "cost_file")):
        path = paths[field]
        if path is None:
            continue
        if not Path(path).is_file():
            raise missing(field, f"--{opt} file")
        if file_digest(path) != prov.inputs_sha256.get(opt):
            raise InputError(f"--report: the --{opt} file {path} is not the one audited (sha256 differs){hint}")
    device = report.environment.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--report: cannot recheck a {device} audit without a CUDA device{hint}")
    if report.provenance.engine is not None:
        check_engine_source(report, report.config.fast_path, report.config.convention)


def check_engine_source(report, impl: str, convention: str | None) -> None:
    """The engine kernel ``impl`` as imported here has the source the report audited; else InputError."""
    from ddsim.engines import load
    rec = report.provenance.engine
    if impl == "ddsim":
        if rec is not None:
            raise InputError(f"--fast-path ddsim: the report audited {rec.name}, not ddsim's own kernels")
        return
    if rec is None:
        raise InputError(f"--fast-path {impl}: the report audited ddsim's own kernels")
    kernel = load(impl, convention=convention or report.config.convention, flag="--fast-path")
    if kernel.source_sha256 is None or kernel.source_sha256 != rec.source_sha256:
        got = (kernel.source_sha256 or "no source")[:16]
        raise InputError(f"--fast-path {impl}: its source {kernel.source} (sha256 {got}) is not the kernel the report "
                         f"audited (sha256 {(rec.source_sha256 or 'none')[:16]})")
    here = dict(kernel.sources)
    if not here or not rec.sources:  # nothing to hold the kernel's package to: not taken on trust
        raise InputError(f"--fast-path {impl}: {'the report records' if not rec.sources else 'its module has'} no "
                         "source files to hold the kernel's package to")
    for path in sorted(set(here) | set(rec.sources)):
        if here.get(path) != rec.sources.get(path):
            what = ("is not among the files the report audited" if path not in rec.sources else
                    "is no longer reached from the kernel's module" if path not in here else
                    f"(sha256 {here[path][:16]}) is not the file the report audited (sha256 {rec.sources[path][:16]})")
            raise InputError(f"--fast-path {impl}: its package's file {path} {what}")


def recheck(report, *, prompts: int = 1, at: dict[str, str] | None = None) -> RecheckResult:
    """Re-run ``prompts`` of the report's prompts (all of them: the whole audit) and compare; the audit's
    files read where the report records them, or at ``at``'s paths ({field: path}, FILE_FIELDS)."""
    import torch

    check_at_hand(report, at)
    threads = torch.get_num_threads()
    torch.set_num_threads(report.environment.threads)
    try:
        return _recheck(report, prompts, _located(report, at))
    finally:
        torch.set_num_threads(threads)


def _as_recorded(d, report, moved: dict[str, str]):
    """A re-run's report dict (or part of it) with the paths the report records put back wherever ``moved``
    read a file elsewhere: every string that is a moved path (as given or normalized), or a checkpoint's
    source ('checkpoint PATH'), becomes the report's, and so does the model's name (its directory's). The
    files themselves were held to the report's digests before the re-run (check_at_hand), so only their
    names may differ; any other difference still fails."""
    swap = {}
    for field, here in moved.items():
        recorded = getattr(report.config, field)
        for new, old in ((here, recorded), (str(Path(here)), str(Path(recorded)))):
            swap[new] = old
            swap[f"checkpoint {new}"] = f"checkpoint {old}"

    def put_back(x):
        if isinstance(x, dict):
            return {k: put_back(v) for k, v in x.items()}
        if isinstance(x, list):
            return [put_back(v) for v in x]
        return swap.get(x, x) if isinstance(x, str) else x

    d = put_back(d) if swap else d
    model = d.get("model") if isinstance(d, dict) else None
    config = model.get("config") if isinstance(model, dict) else None
    if "model_path" in moved and isinstance(config, dict) and config.get("name") == Path(moved["model_path"]).name:
        config["name"] = Path(report.config.model_path).name  # a checkpoint's model is named after its directory
    return d


def _recheck(report, prompts: int, moved: dict[str, str]) -> RecheckResult:
    from ddsim.measure.audit import run_audit
    ac = audit_config(report, moved)
    tol = tolerance(report.precision.fast_path)
    chosen = sample(report, prompts)
    if len(chosen) == len(report.prompts):
        from ddsim.reports.json_report import comparable
        rerun = run_audit(ac)
        again = _as_recorded(comparable(rerun), report, moved)
        again["provenance"]["ddsim_version"] = report.provenance.ddsim_version
        again["config"]["device"] = report.config.device  # the device 'auto' resolved to, as above
        n = compare(again, comparable(report), tol)
        return RecheckResult(chosen, True, n, rerun)
    got = run_audit(ac, prompt_subset=chosen)
    # the version was checked (or its difference accepted) before the recheck
    mine = _as_recorded({**got["provenance"], "ddsim_version": report.provenance.ddsim_version}, report, moved)
    n = compare(mine, report.provenance.model_dump(mode="json"), tol, "provenance")
    for i in chosen:
        rec, p = got["prompts"][i], report.prompts[i]
        n += compare({"tokens": rec["prompt"], "reference": rec["reference"]},
                     {"tokens": p.tokens, "reference": p.reference}, tol, f"prompts[{i}]")
        mine = {(g.budget, g.mode): g.model_dump(mode="json") for g in rec["generations"]}
        theirs = {(g.budget, g.mode): g.model_dump(mode="json") for g in report.generations if g.prompt == i}
        if set(mine) != set(theirs):
            raise InputError(f"--report: does not reproduce: prompt {i}'s generations are not one per budget and mode")
        for key in sorted(theirs, key=str):
            n += compare(mine[key], theirs[key], tol, f"generations[prompt {i}, budget {key[0]}, mode {key[1]}]")
    # the leak tables pool every prompt: the sample's own pool bounds them (counts, flips, maxima)
    for b in report.budgets:
        for m, table in b.leak.items():
            n += bounded(got["leak"][b.budget][m].model_dump(mode="json"), table.model_dump(mode="json"), tol,
                         f"budgets[{b.budget}].leak.{m}")
    return RecheckResult(chosen, False, n)
