"""The leakage audit: whole generations per budget and mode, node-level leak against the oracle,
the noise floor beside every figure, and the throughput model; returns report.json's content.

For every prompt: the reference (greedy, or seeded sampling) autoregressive continuation; the
chain baseline (exact); then per budget:
  exact        generation, decisions checked          -> lossless check, tokens per step
  leaky        generation, every step against the oracle per node and layer, with exact
               (noise floor), leaky-state and leaky-conv evaluated on the same tree and state
  leaky-state, leaky-conv   generations, decisions checked (what each leak source alone does
               to acceptance and to the output)
The noise margin is the largest decision margin the exact path's arithmetic overturned against the
oracle (0 in float32; bf16 logits are coarse): a generation that leaves the reference where the
reference's choice led by no more than that is counted apart, as possibly the arithmetic's doing.
"""
from __future__ import annotations

import gc
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ddsim import oracle
from ddsim.devices import resolve_device
from ddsim.digest import read_digest, reading
from ddsim.errors import EngineError, InputError
from ddsim.measure.aggregate import NodePool
from ddsim.measure.metrics import summarize
from ddsim.measure.settings import AuditConfig
from ddsim.measure.throughput import CostModel, speedup_table
from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel, copies_per_replay, not_capturable, serving_model
from ddsim.model.model import HybridModel
from ddsim.model.prompts import TextEncoder, builtin_prompts, load_prompts
from ddsim.model.tensor_digest import tensors_sha256
from ddsim.model.weights import init_weights
from ddsim.reports.json_report import from_audit
from ddsim.sim.drafters import ModelDrafter, SyntheticDrafter, TraceDrafter
from ddsim.sim.generate import TreePolicy, reference_rows, speculative_lockstep
from ddsim.sim.timing import timed
from ddsim.trees.modes import LEAK_MODES, VERIFY_MODES
from ddsim.verdict.report_model import (
    SCHEMA_VERSION,
    Generation,
    LeakTable,
    ModeSummary,
    NoiseFloor,
    ReferenceFragility,
    Report,
    noise_margin_of,
)

ALL_MODES = VERIFY_MODES


def environment(device: torch.device) -> dict:
    """The report's environment: ddsim.environment's, with matplotlib's and pydantic's releases."""
    import matplotlib
    import pydantic

    from ddsim.environment import environment as common
    return {**common(device), "matplotlib": matplotlib.__version__, "pydantic": pydantic.__version__}


def precision(model: HybridModel, weights: dict) -> dict:
    """The arithmetic compared: the fast path's weights and activations, its recurrent states, and
    the oracle's where the model lives, with its products by ``weights`` (oracle.takes_bf16_products).
    The gate's tolerance for the exact path depends on the first."""
    name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
    return {"fast_path": name(model.dtype), "recurrent_state": name(model.state_dtype),
            "oracle": name(oracle.default_dtype(model.device)),
            "oracle_products": "bf16x3" if oracle.takes_bf16_products(weights) else "converted"}


def _gate_stats(cfg, w) -> dict:
    """The decay per step at gate input 0 of every recurrent head, exp(-exp(A_log) softplus(dt_bias))
    (GDN's exp(g), Mamba2's exp(dt A)): how long heads remember."""
    decays = []
    for l in cfg.recurrent_layers:
        if not cfg.stateful(l):  # a short conv has no decay
            continue
        if cfg.family(l) == "lightning":  # a constant decay exp(-slope) per head
            decays.append(torch.exp(-w[f"layers.{l}.lightning.slope"].double().cpu()))
            continue
        pre = f"layers.{l}.{ {'gdn': 'gdn', 'mamba1': 'mamba1', 'kda': 'kda'}.get(cfg.family(l), 'mamba')}."
        A = torch.exp(w[pre + "A_log"].double().cpu())
        if cfg.family(l) == "kda":  # A per head, dt_bias per key channel
            A = A.repeat_interleave(cfg.linear_key_head_dim)
        if A.dim() == 2:  # Mamba1's A [I, N]: each channel's slowest state index
            A = A.min(-1).values
        dt = torch.nn.functional.softplus(w[pre + "dt_bias"].double().cpu())
        decays.append(torch.exp(-A * dt))
    d = torch.cat(decays).numpy() if decays else np.zeros(0)
    return {"exp_g_typical": summarize(d), "halflife_tokens": summarize(np.log(0.5) / np.log(np.clip(d, 1e-12, 1 - 1e-12)))}


def _gen_record(g, prompt_index, budget, margins) -> Generation:
    d = g.first_divergence
    return Generation(
        prompt=prompt_index, budget=budget, mode=g.mode, policy=g.policy, tokens=list(g.tokens),
        first_divergence=d, divergence_margin=None if d is None else margins[d], agreement=g.agreement,
        silent_corruption_steps=int(g.silent_corruption_steps), tokens_per_step=g.tokens_per_step,
        accepted=[int(s.accepted) for s in g.steps], decision_flips=[int(s.decision_flips) for s in g.steps],
        reference_walk=[int(s.reference_walk) for s in g.steps],
        tree_sizes=[int(s.tree_size) for s in g.steps],
        **({} if not g.steps or g.steps[0].emitted_tv is None else {
            "emitted_tv": [min(1.0, float(s.emitted_tv)) for s in g.steps],
            "length_tv": [min(1.0, float(s.length_tv)) for s in g.steps],
            "expected_accepted": [float(s.expected_accepted) for s in g.steps],
            "expected_accepted_exact": [float(s.expected_accepted_exact) for s in g.steps]}),
        **({} if not g.steps or g.steps[0].noise_tv is None else {
            "noise_tv": [min(1.0, float(s.noise_tv)) for s in g.steps],
            "noise_length_tv": [min(1.0, float(s.noise_length_tv)) for s in g.steps]}))


def read_model_config(ac: AuditConfig):
    """The model configuration alone (a preset, or a checkpoint's config.json), before any weights."""
    if ac.model_path:
        from ddsim.model.checkpoint import read_config
        return read_config(ac.model_path)[0]
    return get_preset(ac.preset)


def load_model(ac: AuditConfig, device, layer_devices=None):
    """(config, weights, text encoder or None) for a preset or a checkpoint directory; with
    ``layer_devices`` each layer's weights made or loaded straight onto its device."""
    if ac.model_path:
        from ddsim.model.checkpoint import load_checkpoint
        cfg, weights, _ = load_checkpoint(ac.model_path, device=device, layer_devices=layer_devices)
        encoder = TextEncoder(ac.model_path) if (Path(ac.model_path) / "tokenizer.json").is_file() else None
        return cfg, weights, encoder
    cfg = get_preset(ac.preset)
    # synthetic weights in bf16 on a GPU, as a served checkpoint would be (float32 on the CPU)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return cfg, init_weights(cfg, seed=ac.seed, device=device, dtype=dtype, layer_devices=layer_devices), None


def resolve_placement(ac: AuditConfig, cfg, device: torch.device, shard) -> tuple[torch.device, list | None]:
    """(primary device, each layer's device or None) for ``--devices``: this rank's group of GPUs (under
    torchrun rank r takes the r-th group of len(--devices) GPUs, counted from the listed ones),
    layers in contiguous blocks balanced by bytes."""
    if not ac.devices:
        return device, None
    from ddsim.model.placement import parse_devices, plan_layers
    devs = parse_devices(ac.devices)
    if torch.device(ac.device) != devs[0]:
        raise InputError(f"--device {ac.device}: with --devices the model lives on {ac.devices} (leave --device out)")
    if shard.world > 1 and devs[0].type == "cuda":
        k = len(devs)
        devs = [torch.device("cuda", d.index + shard.rank * k) for d in devs]
        if max(d.index for d in devs) >= torch.cuda.device_count():
            raise InputError(f"--devices {ac.devices}: rank {shard.rank} of {shard.world} needs GPUs "
                             f"{[str(d) for d in devs]}, {torch.cuda.device_count()} exist")
        torch.cuda.set_device(devs[0])
    return devs[0], plan_layers(cfg, devs)


def audit_prompts(ac: AuditConfig, cfg, encoder) -> list[list[int]]:
    if ac.prompts_file:
        return load_prompts(ac.prompts_file, cfg.vocab_size, encoder)
    if encoder is not None:
        return builtin_prompts(encoder, cfg.vocab_size)
    rng = np.random.default_rng(ac.seed)
    return [rng.integers(0, cfg.vocab_size, ac.prompt_len).tolist() for _ in range(ac.n_prompts)]


def weights_digest(ac: AuditConfig, weights: dict) -> str:
    """sha256 of what was audited: a checkpoint's config.json and weight files (read back from disk,
    so ``gate --model DIR`` can check a report without loading the model), or a preset's generated
    tensors (ddsim.model.tensor_digest). Taken in the foreground: run in a thread beside the audit
    (tried on the H200), its threads' interpreter-lock traffic slowed the audit's host-bound eager
    passes by more than the digest took."""
    if ac.model_path:
        from ddsim.model.checkpoint import checkpoint_digest
        return checkpoint_digest(ac.model_path)
    return tensors_sha256(weights)


def input_digests(ac: AuditConfig) -> dict:
    """sha256 of each input file's bytes as the audit read and parsed them (noted by run_audit's
    ddsim.digest.reading()), not of a second read, which a file replaced since would answer with other bytes."""
    return {k: read_digest(v) for k, v in (("prompts", ac.prompts_file), ("trace", ac.trace),
                                                  ("cost", ac.cost_file)) if v}


def fast_path_name(model: HybridModel, serving=None) -> str:
    """The verify implementation the audit's fast path ran: ddsim's backend, or the engine kernel
    and the recurrence modes it computed (ddsim's backend did the rest); and where the decision-only
    generations replayed CUDA graphs (``serving`` a GraphedModel), that (the audit then replays the
    leaky generations' verifies with per-node states from graphs too)."""
    backend = model.backend or ("triton" if model.device.type == "cuda" else "torch")
    name = f"ddsim-{backend}"
    if model.engine is not None:
        name = f"{model.engine.name} ({'/'.join(model.engine.modes)} recurrences; ddsim-{backend} otherwise)"
    if serving is not None and serving is not model:
        name += (" (replayed from CUDA graphs: the serving verify of decision-only generations, the verify with "
                 "per-node states of the leaky ones)")
    return name


def load_engine(ac: AuditConfig, device: torch.device):
    """The --fast-path kernel (None for ddsim's own), loaded before any work: a missing engine
    package, or an engine that offers no recurrence mode the audit runs, is refused up front."""
    if ac.fast_path == "ddsim":
        if ac.convention is not None:
            raise InputError("--convention: only with a MODULE:FUNCTION --fast-path")
        return None
    from ddsim.devices import prepare_engine_device
    from ddsim.engines import load
    prepare_engine_device(str(device))  # Triton kernels of an engine run in Triton's interpreter on the CPU
    kernel = load(ac.fast_path, convention=ac.convention, flag="--fast-path")
    if not set(kernel.modes) & {"exact", "leaky"}:
        raise InputError(f"--fast-path {ac.fast_path}: offers no recurrence mode the audit runs")
    return held_to_contract(kernel, ac.fast_path)


def held_to_contract(kernel, impl: str):
    """``kernel`` whose verify the audit calls through a check: a raise, or an output other than a floating-point
    tensor of v's shape [B, T, HV, V] (the contract's, as check-kernel holds it; one of the same size would reshape
    silently), is an EngineError naming --fast-path, where a raise was an internal error and such an output was read
    as if it were right."""
    import dataclasses

    from ddsim.engines.check_kernel import ContractError, checked_output, raised_line
    verify = kernel.verify

    def checked(q, k, v, g, beta, **kw):
        try:
            o = verify(q, k, v, g, beta, **kw)
        except Exception as e:  # a device fault included: the audit cannot go on either way
            raise EngineError(f"--fast-path {impl}: the kernel raised {raised_line(e, str(v.device))}") from e
        try:
            checked_output(o, v.shape)
        except ContractError as e:
            raise EngineError(f"--fast-path {impl}: the kernel broke its contract: {e}") from None
        return o
    return dataclasses.replace(kernel, verify=checked)


def run_audit(ac: AuditConfig, *, progress=None, shard=None, timings: dict | None = None,
              prompt_subset: list[int] | None = None):
    """Run the audit and return its validated report; ``progress(advance=1)`` is called once per
    speculative step if given. Every input is checked before the first generation starts.
    ``shard`` (ddsim.measure.distributed.Shard): this process's share of the prompts under torchrun; the
    report is assembled on rank 0 (other ranks return None). The fast path's outputs are
    NaN-poisoned throughout (gpu_backend.poisoned). ``timings``: a dict this process's wall seconds
    per phase are added to (benchmarks/audit_full_size.py prints them). ``prompt_subset``: run only
    these prompts' generations (each exactly as in the whole audit) and return, instead of a report
    (ddsim.measure.recheck), {"prompts": {prompt index: its reference, margins and Generation records},
    "provenance": ..., "leak": {budget: {mode: LeakTable pooled over these prompts' nodes}}}."""
    from ddsim.gpu_backend import poisoned
    with poisoned(), reading():
        return _audit(ac, progress=progress, shard=shard, timings=timings, prompt_subset=prompt_subset)


@dataclass
class _Run:
    """One audit's inputs, checked, and what it built: what every phase reads."""
    ac: AuditConfig
    shard: object
    timings: dict | None
    cfg: object = None
    device: torch.device = None
    layer_devices: list | None = None
    cost: CostModel = None
    engine: object = None
    drafter: object = None
    weights: dict = None
    model: HybridModel = None
    serving: object = None
    prompts: list = None
    provenance: dict = None
    common: dict = None  # the generation options every mode shares

    def phase(self, name: str):
        """Adds the block's wall seconds to timings[name] when timings are asked for."""
        return timed(self.timings, name, self.device)

    @property
    def ref_len(self) -> int:
        return self.ac.steps * (self.drafter.depth + 1)


def _audit(ac: AuditConfig, *, progress=None, shard=None, timings: dict | None = None,
           prompt_subset: list[int] | None = None):
    """The audit's phases: inputs checked, model built, generations per prompt (this process's share),
    then the report assembled (rank 0). ``prompt_subset``: see run_audit."""
    from ddsim.measure.distributed import Shard
    run = _checked_inputs(ac, shard or Shard.single(), timings)
    _build(run, progress)
    if prompt_subset is not None:
        bad = [i for i in prompt_subset if not 0 <= i < len(run.prompts)]
        if bad:
            raise InputError(f"prompt {bad[0]}: the audit has {len(run.prompts)} prompts")
        outs = _share(run, sorted(set(prompt_subset)))
        return {"prompts": {o["index"]: {"prompt": run.prompts[o["index"]], "reference": o["reference"],
                                         "margins": o["margins"],
                                         "generations": [o["chain"]] + [g for b in ac.budgets
                                                                        for g in o["budgets"][b]["gens"].values()]}
                            for o in outs},
                "provenance": run.provenance,
                "leak": {b: _leak_tables(run.cfg, outs, b) for b in ac.budgets}}  # pooled over the subset
    per_prompt = run.shard.run_group(lambda idx: _share(run, idx), len(run.prompts))  # rank 0 gathers every prompt
    if per_prompt is None:
        return None
    report = _assemble(run, per_prompt)
    if ac.measure_steps == "on" or (ac.measure_steps == "auto" and run.device.type == "cuda"):
        with run.phase("measured steps"):
            report = _measured(run, report, per_prompt[0]["reference"])
    return report


def _measured(run: _Run, report: Report, reference: list[int]) -> Report:
    """The report with each mode's decoding step timed (ddsim.measure.step_timing) on the first prompt, as a server
    runs it: where the serving model is replayed from CUDA graphs, from graphs of its own captured with the Triton
    launchers' outputs left unfilled (the audit's, captured NaN-poisoned, launch a fill per output: 0.4-1.1 ms a
    verify at Qwen3.6-27B size on an H200, RESULTS.md); the audit's graphs are let go first."""
    from ddsim.gpu_backend import poisoned
    from ddsim.measure.step_timing import measure_steps, rows
    ac, prompt = run.ac, run.prompts[0]
    greedy = reference if ac.temperature == 0 else reference_rows(run.serving, [prompt], run.drafter.depth)[0][0]
    policies = {b: TreePolicy("ddtree", b, ac.topk_cap) for b in ac.budgets}
    if run.serving is not run.model:
        run.serving = None  # the audit's graphs: nothing reads them after this
        gc.collect()
        torch.cuda.empty_cache()
    with poisoned(False):
        timer = serving_model(run.model)
        times = measure_steps(timer, prompt=prompt, greedy=greedy, drafter=run.drafter, policies=policies,
                              modes=ALL_MODES)
    tps = {"chain": report.chain.tokens_per_step}
    tps.update({(b.budget, m): b.modes[m].tokens_per_step for b in report.budgets for m in ALL_MODES})
    measured = {"device": str(run.device), "warmup": 3, "repeats": 20, "rows": rows(times, tokens_per_step=tps)}
    return Report.model_validate({**report.model_dump(), "measured_steps": measured})


def _checked_inputs(ac: AuditConfig, shard, timings) -> _Run:
    """Every input checked before any weights are made: the model's config, the devices, the cost model,
    the engine kernel, the drafter, the memory the audit will need."""
    run = _Run(ac, shard, timings)
    run.cfg = read_model_config(ac)
    run.device, run.layer_devices = resolve_placement(ac, run.cfg, resolve_device(ac.device), shard)
    run.cost = CostModel.from_file(ac.cost_file) if ac.cost_file else CostModel()
    run.engine = load_engine(ac, run.device)
    if ac.trace and ac.drafter_model:
        raise InputError("--drafter-model: not with --trace (an audit has one drafter)")
    if ac.trace:
        run.drafter = TraceDrafter(ac.trace, vocab_size=run.cfg.vocab_size)
        if len(run.drafter.steps) < ac.steps:
            raise InputError(f"{ac.trace}: trace has {len(run.drafter.steps)} steps, --steps asks for {ac.steps}")
    elif ac.drafter_model:
        run.drafter = ModelDrafter(ac.drafter_model, vocab_size=run.cfg.vocab_size, depth=ac.depth)
    else:
        run.drafter = SyntheticDrafter(vocab_size=run.cfg.vocab_size, depth=ac.depth, seed=ac.seed)
    check_memory(ac, run.cfg, run.device, 2 if run.device.type == "cuda" else 4, layer_devices=run.layer_devices)
    return run


def _build(run: _Run, progress) -> None:
    """The weights, the fast-path model (the checkpoint's dtype on CUDA, float32 for a float64 checkpoint as
    a serving stack would run it, float32 on the CPU; recurrent state float32), its serving twin for the
    decision-only generations (no per-node states, CUDA graphs where possible), the prompts, provenance."""
    ac = run.ac
    with run.phase("model build"):
        run.cfg, run.weights, encoder = load_model(ac, run.device, run.layer_devices)
    compute = run.weights["embed"].dtype if run.device.type == "cuda" else torch.float32
    compute = torch.float32 if compute == torch.float64 else compute
    run.model = HybridModel(run.cfg, run.weights, device=run.device, dtype=compute, engine=run.engine)
    run.serving = serving_model(run.model)
    run.prompts = audit_prompts(ac, run.cfg, encoder)
    with run.phase("weights digest"):
        digest = weights_digest(ac, run.weights)
    run.provenance = {"ddsim_version": environment(run.device)["ddsim"],
                      "source": f"checkpoint {ac.model_path}" if ac.model_path else f"preset {ac.preset}",
                      "weights_sha256": digest, "fast_path": fast_path_name(run.model, run.serving),
                      "engine": run.engine.provenance() if run.engine is not None else None,
                      "inputs_sha256": input_digests(ac)}
    tick = (lambda rec: progress(advance=1)) if progress else None
    run.common = dict(temperature=ac.temperature, seed=ac.seed, steps=ac.steps, on_step=tick, sampler=ac.sampler,
                      sampler_params=dict(ac.sampler_params))


def _share(run: _Run, indices: list[int]) -> list[dict]:
    """Every prompt of this process's share, all stepping together (each generation is the one it would
    be alone; their greedy continuations, and references, are decoded as one batch): the references, the
    chain generations, per budget the decision-only generations, then per budget the leaky generations."""
    ps = [run.prompts[i] for i in indices]
    with run.phase("references"):
        refs = reference_rows(run.serving, ps, run.ref_len, temperature=run.ac.temperature, seed=run.ac.seed)
    outs = [{"index": i, "reference": ref, "margins": margins, "budgets": {}}
            for i, (ref, margins) in zip(indices, refs)]
    references = [o["reference"] for o in outs]
    with run.phase("chain"):
        chain_gens = speculative_lockstep(run.serving, ps, references=references, drafter=run.drafter,
                                          policy=TreePolicy("chain"), mode="exact", **run.common)
    for o, g in zip(outs, chain_gens):
        o["chain"] = _gen_record(g, o["index"], None, o["margins"])
    for budget in run.ac.budgets:
        _decision_only(run, ps, references, outs, budget)
    if run.serving is not run.model:  # the decode graph's buffers (GBs at full size) would be oracle batch room
        run.serving.set_decode_graphs(False)
    for budget in run.ac.budgets:
        _leaky(run, ps, references, outs, budget)
    if run.serving is not run.model:
        run.serving.set_decode_graphs(True)
    return outs


def _decision_only(run: _Run, ps, references, outs, budget: int) -> None:
    """The exact, leaky-state and leaky-conv generations of one budget, verified as a server does."""
    policy = TreePolicy("ddtree", budget, run.ac.topk_cap)
    for o in outs:
        o["budgets"][budget] = {"gens": {}, "nodes": {m: [] for m in ALL_MODES}}
    parts = {} if run.timings is not None else None
    with run.phase(f"decision-only generations, budget {budget}"):
        for m in ALL_MODES:
            if m == "leaky":
                continue
            gens = speculative_lockstep(run.serving, ps, references=references, drafter=run.drafter, policy=policy,
                                        mode=m, timings=parts, **run.common)
            for o, g in zip(outs, gens):
                o["budgets"][budget]["gens"][m] = _gen_record(g, o["index"], budget, o["margins"])
    for name, v in (parts or {}).items():
        run.timings[f"  of which {name}, budget {budget}"] = v


def _leaky(run: _Run, ps, references, outs, budget: int) -> None:
    """The leaky generations of one budget, every step against the oracle per node and layer, with the
    exact, leaky-state and leaky-conv fast paths on the same trees (their verifies with per-node states
    replayed from CUDA graphs where the model can be captured: the four modes side by side, in as few
    passes of equal size as a fifth of the device's memory holds (side_by_side), one graph and one set of
    per-node buffers per copy, freed after the budget); the oracle takes each round's trees as one batch
    (as many as fit in memory beside them)."""
    model = run.model
    policy = TreePolicy("ddtree", budget, run.ac.topk_cap)
    inner = {} if run.timings is not None else None
    full = model if not_capturable(model) else GraphedModel(model)
    graphs = 0
    if full is not model:
        modes = len(dict.fromkeys(("leaky", "exact", *LEAK_MODES)))  # what each step verifies with states
        full.max_copies = copies = copies_per_replay(modes, side_by_side(model, budget + 1, modes))
        # what the graph with per-node states will allocate (one set per copy side by side), until it has
        graphs = lambda full=full, n=copies * (budget + 1) * fast_path_state_bytes(model): 0 if full.captured() else n  # noqa: E731
    with run.phase(f"leaky generations in lock step, budget {budget}"):
        leaky = speculative_lockstep(full, ps, references=references,
                                     max_trees=OracleBatches(run.cfg, run.device, reserve=graphs,
                                                             bf16_products=oracle.takes_bf16_products(run.weights)),
                                     timings=inner, drafter=run.drafter, policy=policy, mode="leaky",
                                     measure="full", weights=run.weights, attribution=LEAK_MODES,
                                     serving=run.serving, **run.common)
    del full, graphs
    if run.device.type == "cuda":  # the graph's pool back to the device before the next budget's sizing
        gc.collect()
        torch.cuda.empty_cache()
    if inner:
        _leaky_timings(run.timings, inner, budget)
    for o, g in zip(outs, leaky):
        o["budgets"][budget]["gens"]["leaky"] = _gen_record(g, o["index"], budget, o["margins"])
        for st in g.steps:
            for m, metrics in st.nodes.items():
                o["budgets"][budget]["nodes"][m].append((metrics, st.keys))


def _leaky_timings(timings: dict, inner: dict, budget: int) -> None:
    timings[f"  of which the oracle, budget {budget}"] = inner.pop("oracle")
    timings[f"  oracle batches (trees), budget {budget}"] = inner.pop("oracle_batches")
    if "oracle_batch_memory_gib" in inner:
        timings[f"  memory after each oracle batch (GiB), budget {budget}"] = inner.pop("oracle_batch_memory_gib")
        timings[f"  peak memory in each oracle batch (GiB), budget {budget}"] = inner.pop("oracle_batch_peak_gib")
    if "oracle_splits" in inner:
        timings[f"  oracle batches split for memory, budget {budget}"] = inner.pop("oracle_splits")
    for name, v in inner.items():
        timings[f"  of which (leaky generations) {name}, budget {budget}"] = v


def _leak_tables(cfg, per_prompt: list[dict], budget: int) -> dict:
    """{mode: LeakTable} of one budget, every node of the given prompts' records pooled in prompt order, as one
    process adds them."""
    pools = {m: NodePool() for m in ALL_MODES}
    for r in per_prompt:
        for m in ALL_MODES:
            for metrics, keys in r["budgets"][budget]["nodes"][m]:
                pools[m].add(metrics, keys)
    return {m: LeakTable.model_validate_json(json.dumps(pools[m].table(cfg))) for m in ALL_MODES}


def _assemble(run: _Run, per_prompt: list[dict]) -> Report:
    """The report from every prompt's records, in prompt order: leak tables pooled as one process adds
    them, the noise margin over every budget's trees, the summaries, the throughput rows."""
    ac, cfg = run.ac, run.cfg
    references = [r["reference"] for r in per_prompt]
    margins = [r["margins"] for r in per_prompt]
    chain_gens = [r["chain"] for r in per_prompt]
    measured = []  # (budget, policy, generation records per mode, leak table per mode)
    for budget in ac.budgets:
        policy = TreePolicy("ddtree", budget, ac.topk_cap)
        gens = {m: [r["budgets"][budget]["gens"][m] for r in per_prompt] for m in ALL_MODES}
        measured.append((budget, policy, gens, _leak_tables(cfg, per_prompt, budget)))
    # the arithmetic's noise is the audit's, not a budget's: pooled over every budget's trees
    noise_margin = noise_margin_of([leak["exact"] for *_, leak in measured], ac.temperature)
    summary = lambda gs: ModeSummary.of(gs, ref_len=run.ref_len, noise_margin=noise_margin)  # noqa: E731
    budgets = [{"budget": budget, "policy": policy.label(), "modes": {m: summary(gens[m]) for m in ALL_MODES},
                "leak": leak} for budget, policy, gens, leak in measured]
    chain = summary(chain_gens)
    rows = [{"label": "chain", "mode": "exact", "budget": None, "tokens_per_step": chain.tokens_per_step,
             "nodes": chain.mean_tree_size}]
    rows += [{"label": b["policy"], "mode": m, "budget": b["budget"], "tokens_per_step": b["modes"][m].tokens_per_step,
              "nodes": b["modes"][m].mean_tree_size} for b in budgets for m in ALL_MODES]
    generations = chain_gens + [g for *_, gens, _ in measured for m in ALL_MODES for g in gens[m]]
    generations.sort(key=lambda g: (g.budget is not None, g.budget or 0, g.prompt, ALL_MODES.index(g.mode)))
    return from_audit({
        "schema_version": SCHEMA_VERSION,
        "generated_at": None,  # filled by the writer; the only field that varies between runs
        "config": {**ac.model_dump(), "drafter": run.drafter.params()},
        "provenance": run.provenance,
        "environment": environment(run.device),
        "precision": precision(run.model, run.weights),
        "model": {"config": cfg.to_dict(), "source": run.provenance["source"], "gates": _gate_stats(cfg, run.weights)},
        "prompts": [{"index": i, "tokens": p, "reference": r, "reference_margins": m}
                    for i, (p, r, m) in enumerate(zip(run.prompts, references, margins))],
        "chain": chain.model_dump(),
        "budgets": [{**b, "modes": {m: v.model_dump() for m, v in b["modes"].items()},
                     "leak": {m: v.model_dump() for m, v in b["leak"].items()}} for b in budgets],
        "noise_margin": noise_margin,
        "reference_fragility": ReferenceFragility.of(margins, noise_margin).model_dump(),
        "noise_floor": {str(b["budget"]): NoiseFloor.of(b["leak"]["exact"]).model_dump() for b in budgets},
        "throughput": {"cost_model": run.cost.to_dict(), "rows": speedup_table(rows, run.cost)},
        "generations": [g.model_dump() for g in generations],
    })


def check_memory(ac: AuditConfig, cfg, device: torch.device, weight_bytes_per_param: int, *,
                 layer_devices=None) -> None:
    """Refuse, before any weights are made or loaded, an audit that would not fit: the weights (and
    the oracle's copy of a small model), and for the largest tree, per node, the recurrent state and
    conv window of every recurrent layer for four fast-path modes and the oracle, hidden states and
    logits, plus the KV of every attention layer over the whole context. With a placement, the same
    total against the memory free on all its devices together."""
    from ddsim.model.weights import weight_shapes
    params = sum(math.prod(s) for s in weight_shapes(cfg).values())
    oracle_bytes = torch.finfo(oracle.default_dtype(device)).bits // 8
    weights = params * weight_bytes_per_param + min(params * oracle_bytes, 2 << 30)
    nodes = max(ac.budgets) + 1
    rec = recurrent_values(cfg)
    per_node = rec * (4 * 4 + 8) + cfg.num_layers * cfg.hidden_size * 8 * 5 + 5 * cfg.vocab_size * 8
    context = ac.prompt_len + ac.steps * (ac.depth + 1) + nodes
    kv = len(cfg.attention_layers) * 2 * cfg.num_key_value_heads * cfg.head_dim * context * 8
    need = weights + nodes * per_node + kv
    devs = sorted(set(layer_devices), key=str) if layer_devices else [device]
    frees = [available_memory(d) for d in devs]
    free = None if any(f is None for f in frees) else (sum(frees) if devs[0].type == "cuda" else frees[0])
    if len(devs) > 1:
        device = ",".join(map(str, devs))
    if free is not None and need > free:
        what = f"--budget {max(ac.budgets)}" if nodes * per_node > weights else (
            f"--model {ac.model_path}" if ac.model_path else f"--preset {ac.preset}")
        raise InputError(f"{what}: the audit needs about {need / 2**30:.1f} GiB on {device} (weights "
                         f"{weights / 2**30:.1f} GiB, per-node states and logits {nodes * per_node / 2**30:.1f} GiB), "
                         f"more than the {free / 2**30:.1f} GiB available")


def recurrent_values(cfg) -> int:
    """Values one node's recurrent states and conv windows hold, over every recurrent layer."""
    return sum(math.prod(cfg.state_shape(l)) + math.prod(cfg.window_shape(l)) for l in cfg.recurrent_layers)


SIDE_BY_SIDE_MEMORY = 0.2  # the share of a device's memory the copies of one verify with states may take


def side_by_side(model: HybridModel, nodes: int, modes: int) -> int:
    """How many of a step's ``modes`` verifies with per-node states of ``nodes`` nodes the audit replays side
    by side (GraphedModel.max_copies): as many as fit in SIDE_BY_SIDE_MEMORY of the device's memory (at
    Qwen3.6-27B shapes on an H200, all four at budget 16, two at budget 64), at least one; the rest of the
    memory is the oracle's batches'."""
    total = torch.cuda.get_device_properties(model.device).total_memory if model.device.type == "cuda" else None
    if total is None:
        return modes
    return max(1, min(modes, int(total * SIDE_BY_SIDE_MEMORY // (nodes * fast_path_state_bytes(model)))))


def fast_path_state_bytes(model: HybridModel) -> int:
    """Bytes one node's per-node states, windows and hidden states take in a fast-path verify that
    keeps them (what one CUDA graph with per-node states holds per node)."""
    cfg = model.cfg
    state = torch.finfo(model.state_dtype).bits // 8
    hidden = torch.finfo(model.dtype).bits // 8
    return recurrent_values(cfg) * state + cfg.num_layers * cfg.hidden_size * hidden + cfg.vocab_size * 4


def oracle_tree_bytes(cfg, parents, device: torch.device, *, bf16_products: bool = False) -> int:
    """Bytes the oracle holds for one tree (its ``parents``) in its dtype (oracle.verify_trees, layer by
    layer): every node's recorded recurrent states and windows, hidden states and logits, one
    layer's activations of every node (its input, projections and MLP rows), one layer's states and
    windows of every node and every layer's hidden states once more (each gathered for the batch before
    it is copied out tree by tree), and one layer's working states of the tree's widest depth four times
    over (the depth being decoded, the states it produces, its children's gathered copies, and one more
    for the step's transients). With
    ``bf16_products`` (oracle.takes_bf16_products) each node's row of the widest product three times
    over (the LM head's: its three parts' results, before they are summed)."""
    b = torch.finfo(oracle.default_dtype(device)).bits // 8
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    width = max(depth.count(d) for d in set(depth))
    layer = max((math.prod(cfg.state_shape(l)) + math.prod(cfg.window_shape(l)) for l in cfg.recurrent_layers), default=0)
    d = cfg.hidden_size
    activations = 8 * d + 3 * cfg.intermediate_size + max((cfg.window_shape(l)[0] for l in cfg.recurrent_layers), default=0)
    per_node = recurrent_values(cfg) + cfg.num_layers * d + cfg.vocab_size + activations + layer + cfg.num_layers * d
    if bf16_products:
        per_node += 3 * cfg.vocab_size
    return b * (len(parents) * per_node + 4 * width * layer)


def oracle_batch_bytes(cfg, device: torch.device, *, bf16_products: bool = False) -> int:
    """Bytes the oracle holds once per batch, whatever its trees: the largest of one layer's weights
    and the LM head's, converted to its dtype (each is converted once per batch and let go); with
    ``bf16_products`` only the weights that are not product operands are converted (norms, conv
    filters, A_log, routers)."""
    from ddsim.model.weights import weight_shapes
    b = torch.finfo(oracle.default_dtype(device)).bits // 8
    per_layer = {}
    for name, shape in weight_shapes(cfg).items():
        if name == "embed":  # only the tokens' rows are converted
            continue
        key = ".".join(name.split(".")[:2]) if name.startswith("layers.") else name
        tail = name.split(".", 2)[-1] if name.startswith("layers.") else name
        if bf16_products and tail in oracle.PRODUCT_WEIGHTS:  # 2-D, or stacked experts taken one by one
            continue
        per_layer[key] = per_layer.get(key, 0) + math.prod(shape)
    return b * max(per_layer.values(), default=0)


class OracleBatches:
    """speculative_lockstep's max_trees for the audit: a round's oracle requests -> how many trees the
    oracle takes at once (at least 1), as many of the largest's need as fit in the memory free now less
    ``reserve`` bytes (what the fast path will still allocate, e.g. its CUDA graph's per-node states; an
    int, or a function asked each round, which says 0 once they are allocated).

    Before any batch has run, the need is the estimate (oracle_tree_bytes, and oracle_batch_bytes once
    per batch), fitted in 3/4 of that memory. Once batches have run on a GPU, speculative_lockstep
    reports each one's footprint (``observe``: its peak allocation over what was allocated before it)
    and the need is the largest footprint per node seen so far, times the tree's nodes and a margin of
    MARGIN, fitted in FRACTION of that memory: the estimate counts every buffer at its worst, the
    measure what the allocator held. ``bf16_products``: the oracle takes its products unconverted
    (oracle.takes_bf16_products). A batch that runs out of memory anyway is split (speculative_lockstep)."""

    MARGIN, FRACTION = 1.1, 0.9

    def __init__(self, cfg, device: torch.device, *, reserve=0, bf16_products: bool = False):
        self.cfg, self.device, self.reserve, self.bf16_products = cfg, device, reserve, bf16_products
        self.fixed = oracle_batch_bytes(cfg, device, bf16_products=bf16_products)
        self.per_node = None  # the largest footprint per node observed, bytes

    def observe(self, requests, footprint: int) -> None:
        """A batch of ``requests`` took ``footprint`` bytes at its peak over what was allocated before it."""
        nodes = sum(len(q.parents) for q in requests)
        if nodes and footprint > 0:
            self.per_node = max(self.per_node or 0, footprint / nodes)

    def __call__(self, requests) -> int:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # blocks the allocator keeps but no tensor uses count as free
        free = available_memory(self.device)
        if free is None:
            return 1
        held = self.reserve() if callable(self.reserve) else self.reserve
        if self.per_node is None:
            need = max(oracle_tree_bytes(self.cfg, q.parents, self.device, bf16_products=self.bf16_products)
                       for q in requests)
            room = max(0, free - held - self.fixed) * 3 // 4
        else:
            need = self.per_node * self.MARGIN * max(len(q.parents) for q in requests)
            room = max(0, free - held) * self.FRACTION
        return max(1, min(len(requests), int(room // need)))


def available_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def total_steps(ac: AuditConfig, n_prompts: int) -> int:
    return n_prompts * ac.steps * (1 + len(ac.budgets) * len(ALL_MODES))
