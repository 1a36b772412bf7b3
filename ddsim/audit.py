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

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

import oracle

from ddsim.config import get_preset
from ddsim.prompts import TextEncoder, builtin_prompts, load_prompts
from ddsim.drafters import SyntheticDrafter, TraceDrafter
from ddsim.errors import InputError
from ddsim.generate import TreePolicy, reference_decode, speculative
from ddsim.metrics import group_by, summarize
from ddsim.model import HybridModel
from ddsim.modes import LEAK_MODES, VERIFY_MODES
from ddsim.throughput import CostModel, speedup_table
from ddsim.weights import init_weights
from reports.json_report import SCHEMA_VERSION

ALL_MODES = VERIFY_MODES


@dataclass
class AuditConfig:
    preset: str = "tiny"
    model_path: str | None = None  # a Hugging Face checkpoint directory instead of a preset
    budgets: list = field(default_factory=lambda: [16, 32, 64])
    topk_cap: int | None = None
    steps: int = 8  # speculative steps per generation
    n_prompts: int = 3
    prompt_len: int = 16
    prompts_file: str | None = None
    temperature: float = 0.0
    seed: int = 0
    device: str = "cpu"
    depth: int = 8  # drafter depth
    trace: str | None = None
    cost_file: str | None = None

    def validate(self):
        if not self.budgets or any(not isinstance(b, int) or b < 1 for b in self.budgets):
            raise InputError(f"--budget: expected positive integers, got {self.budgets}")
        if self.topk_cap is not None and self.topk_cap < 1:
            raise InputError(f"--topk-cap: expected >= 1, got {self.topk_cap}")
        if self.steps < 1:
            raise InputError(f"--steps: expected >= 1, got {self.steps}")
        if self.temperature < 0:
            raise InputError(f"--temperature: expected >= 0, got {self.temperature}")
        if self.n_prompts < 1 or self.prompt_len < 1:
            raise InputError("--prompts: need at least one prompt of at least one token")
        if self.depth < 1:
            raise InputError(f"--depth: expected >= 1, got {self.depth}")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError(f"--device: {name} requested but no CUDA device is available")
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"--device: {name} does not exist ({torch.cuda.device_count()} CUDA devices)")
        return dev
    raise InputError(f"--device: expected cpu, cuda[:N] or auto, got {name!r}")


def environment(device: torch.device) -> dict:
    import matplotlib
    import ddsim
    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "numpy": np.__version__, "matplotlib": matplotlib.__version__, "ddsim": ddsim.__version__,
           "device": str(device), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    return env


def precision(model: HybridModel) -> dict:
    """The arithmetic compared: the fast path's weights and activations, its recurrent states, and
    the oracle's where the model lives. The gate's tolerance for the exact path depends on the first."""
    name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
    return {"fast_path": name(model.dtype), "recurrent_state": name(model.state_dtype),
            "oracle": name(oracle.default_dtype(model.device))}


def _gate_stats(cfg, w) -> dict:
    """exp(g) at gate input 0 per GDN head: how long heads remember."""
    decays = []
    for l in cfg.gdn_layers:
        A = torch.exp(w[f"layers.{l}.gdn.A_log"].double().cpu())
        dt = torch.nn.functional.softplus(w[f"layers.{l}.gdn.dt_bias"].double().cpu())
        decays.append(torch.exp(-A * dt))
    d = torch.cat(decays).numpy() if decays else np.zeros(0)
    return {"exp_g_typical": summarize(d), "halflife_tokens": summarize(np.log(0.5) / np.log(np.clip(d, 1e-12, 1 - 1e-12)))}


class _Pool:
    """Collects per-node metric arrays over many steps for one mode."""

    def __init__(self):
        self.cols: dict[str, list] = {}

    def add(self, metrics: dict, keys: dict):
        for k, v in {**metrics, **keys}.items():
            self.cols.setdefault(k, []).append(np.asarray(v))

    def get(self, k):
        arrs = self.cols.get(k, [])
        if not arrs:
            return np.zeros(0)
        return np.concatenate(arrs, axis=-1)

    def table(self, cfg) -> dict:
        ex = self.get("order_exact").astype(bool)
        other = ~ex
        flip = self.get("flip").astype(float)
        depth, rank = self.get("depth"), self.get("rank")
        state, conv, hidden = self.get("state_rel"), self.get("conv_rel"), self.get("hidden_rel")
        last_hidden = hidden[-1] if hidden.size else np.zeros(0)
        out = {
            "nodes": int(ex.size), "order_exact_nodes": int(ex.sum()),
            "argmax_flip_rate": {"order_exact": _rate(flip, ex), "other": _rate(flip, other), "all": _rate(flip, None)},
        }
        for name, arr in (("kl", self.get("kl")), ("max_abs_logit", self.get("max_abs")),
                          ("state_rel", state), ("conv_rel", conv), ("hidden_rel_last", last_hidden)):
            out[name] = {"order_exact": summarize(arr[..., ex]) if arr.size else summarize([]),
                         "other": summarize(arr[..., other]) if arr.size else summarize([])}
        out["by_depth"] = _rows("depth", group_by(depth, state, mask=None) if state.size else {},
                                group_by(depth, flip), group_by(depth, last_hidden))
        out["by_rank"] = _rows("rank", group_by(rank, state, mask=depth > 0) if state.size else {},
                               group_by(rank, flip, mask=depth > 0), group_by(rank, last_hidden, mask=depth > 0))
        out["by_layer"] = [{"layer": int(l), "kind": cfg.layer_pattern[l],
                            "hidden_rel": summarize(hidden[l][other]) if other.any() else summarize([])}
                           for l in range(cfg.num_layers)]
        for gi, l in enumerate(cfg.gdn_layers):
            out["by_layer"][l]["state_rel"] = summarize(state[gi][other]) if other.any() else summarize([])
            out["by_layer"][l]["conv_rel"] = summarize(conv[gi][other]) if other.any() else summarize([])
        margin = self.get("margin")
        out["margin_of_flipped"] = summarize(margin[flip > 0]) if flip.size else summarize([])
        out["margin_all"] = summarize(margin)
        return out


def _rate(flags: np.ndarray, mask) -> float | None:
    f = flags if mask is None else flags[mask]
    return float(f.mean()) if f.size else None


def _rows(key, state_groups, flip_groups, hidden_groups) -> list:
    keys = sorted(set(flip_groups) | set(state_groups))
    return [{key: int(k), "nodes": flip_groups.get(k, {}).get("n", 0),
             "state_rel": state_groups.get(k, summarize([])),
             "hidden_rel_last": hidden_groups.get(k, summarize([])),
             "argmax_flip_rate": flip_groups.get(k, {}).get("mean")} for k in keys]


def _divergence_margin(g, margins: list[float]) -> float | None:
    """The reference's decision margin where generation g first leaves it (None: it never does)."""
    d = g.first_divergence
    return None if d is None else margins[d]


def _gen_record(g, prompt_index, budget, margins) -> dict:
    return {"prompt": prompt_index, "budget": budget, "mode": g.mode, "policy": g.policy, "tokens": g.tokens,
            "first_divergence": g.first_divergence, "divergence_margin": _divergence_margin(g, margins),
            "agreement": g.agreement,
            "silent_corruption_steps": g.silent_corruption_steps, "tokens_per_step": g.tokens_per_step,
            "accepted": [s.accepted for s in g.steps], "decision_flips": [s.decision_flips for s in g.steps],
            "tree_sizes": [s.tree_size for s in g.steps]}


def _noise_margin(exact_leak: dict, temperature: float) -> float:
    """How large a decision margin the fast path's own arithmetic was seen to overturn on one
    budget's trees: the largest oracle top-1 margin among the nodes where the exact path's argmax
    differs from the oracle's (0 when it never does), in decision-score units (nats / temperature
    when sampling). The audit's noise margin is the largest over its budgets."""
    flipped = exact_leak["margin_of_flipped"]
    m = float(flipped["max"]) if flipped["n"] else 0.0
    return m / temperature if temperature > 0 else m


def _mode_summary(gens: list, ref_len: int, margins: list[list[float]], noise_margin: float) -> dict:
    """gens[i] ran on prompt i, whose reference decision margins are margins[i]."""
    steps = [s for g in gens for s in g.steps]
    acc = [s.accepted for s in steps]
    divs = [g.first_divergence for g in gens]
    div_margins = [_divergence_margin(g, m) for g, m in zip(gens, margins)]
    nodes_on_walk = sum(s.accepted + 1 for s in steps)
    return {
        "generations": len(gens), "steps": len(steps),
        "tokens_per_step": float(np.mean([len(s.emitted) for s in steps])) if steps else 0.0,
        "mean_tree_size": float(np.mean([s.tree_size for s in steps])) if steps else 0.0,
        "accepted_histogram": np.bincount(acc, minlength=1).tolist() if acc else [],
        "silent_corruption_steps": int(sum(s.silent_corruption for s in steps)),
        "decision_flips": int(sum(s.decision_flips for s in steps)),
        "decision_flip_rate": (sum(s.decision_flips for s in steps) / nodes_on_walk) if nodes_on_walk else 0.0,
        "generations_leaving_greedy": int(sum(d is not None for d in divs)),
        # ... where the reference's choice led its runner-up by more than the exact path's arithmetic
        # was seen to overturn (noise_margin)
        "generations_leaving_greedy_above_noise": int(sum(m is not None and m > noise_margin for m in div_margins)),
        "first_divergence": divs,
        "agreement": float(np.mean([g.agreement for g in gens])) if gens else None,
        "survival": [float(np.mean([(d is None or d > i) for d in divs])) for i in range(ref_len)],
    }


def load_model(ac: AuditConfig, device):
    """(config, weights, text encoder or None) for a preset or a checkpoint directory."""
    if ac.model_path:
        from ddsim.checkpoint import load_checkpoint
        cfg, weights, _ = load_checkpoint(ac.model_path, device=device)
        encoder = TextEncoder(ac.model_path) if (Path(ac.model_path) / "tokenizer.json").is_file() else None
        return cfg, weights, encoder
    cfg = get_preset(ac.preset)
    # synthetic weights in bf16 on a GPU, as a served checkpoint would be (float32 on the CPU)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return cfg, init_weights(cfg, seed=ac.seed, device=device, dtype=dtype), None


def audit_prompts(ac: AuditConfig, cfg, encoder) -> list[list[int]]:
    if ac.prompts_file:
        return load_prompts(ac.prompts_file, cfg.vocab_size, encoder)
    if encoder is not None:
        return builtin_prompts(encoder, cfg.vocab_size)
    rng = np.random.default_rng(ac.seed)
    return [rng.integers(0, cfg.vocab_size, ac.prompt_len).tolist() for _ in range(ac.n_prompts)]


def run_audit(ac: AuditConfig, *, progress=None) -> dict:
    """Run the audit; ``progress(advance=1)`` is called once per speculative step if given."""
    ac.validate()
    device = resolve_device(ac.device)
    cfg, weights, encoder = load_model(ac, device)
    # fast path: the checkpoint's dtype on CUDA, float32 on the CPU; recurrent state float32
    compute = weights["embed"].dtype if device.type == "cuda" else torch.float32
    model = HybridModel(cfg, weights, device=device, dtype=compute)
    cost = CostModel.from_file(ac.cost_file) if ac.cost_file else CostModel()
    prompts = audit_prompts(ac, cfg, encoder)
    if ac.trace:
        drafter = TraceDrafter(ac.trace, vocab_size=cfg.vocab_size)
        if len(drafter.steps) < ac.steps:
            raise InputError(f"{ac.trace}: trace has {len(drafter.steps)} steps, --steps asks for {ac.steps}")
    else:
        drafter = SyntheticDrafter(vocab_size=cfg.vocab_size, depth=ac.depth, seed=ac.seed)
    ref_len = ac.steps * (drafter.depth + 1)
    tick = (lambda rec: progress(advance=1)) if progress else None

    decoded = [reference_decode(model, p, ref_len, temperature=ac.temperature, seed=ac.seed) for p in prompts]
    references, margins = [r for r, _ in decoded], [m for _, m in decoded]
    common = dict(temperature=ac.temperature, seed=ac.seed, steps=ac.steps, on_step=tick)
    generations, chain_gens = [], []
    for i, (p, ref) in enumerate(zip(prompts, references)):
        g = speculative(model, p, drafter=drafter, policy=TreePolicy("chain"), mode="exact", reference=ref, **common)
        chain_gens.append(g)
        generations.append(_gen_record(g, i, None, margins[i]))

    measured = []  # (budget, policy, generations per mode, leak table per mode)
    for budget in ac.budgets:
        policy = TreePolicy("ddtree", budget, ac.topk_cap)
        gens = {m: [] for m in ALL_MODES}
        pools = {m: _Pool() for m in ALL_MODES}
        for i, (p, ref) in enumerate(zip(prompts, references)):
            for mode in ALL_MODES:
                full = mode == "leaky"
                g = speculative(model, p, drafter=drafter, policy=policy, mode=mode, reference=ref,
                                measure="full" if full else "decisions", weights=weights if full else None,
                                attribution=LEAK_MODES if full else (), **common)
                gens[mode].append(g)
                generations.append(_gen_record(g, i, budget, margins[i]))
                if full:
                    for s in g.steps:
                        for m, metrics in s.nodes.items():
                            pools[m].add(metrics, s.keys)
        measured.append((budget, policy, gens, {m: pools[m].table(cfg) for m in ALL_MODES}))
    # the arithmetic's noise is the audit's, not a budget's: pooled over every budget's trees
    noise_margin = max(_noise_margin(leak["exact"], ac.temperature) for *_, leak in measured)
    budgets = [{"budget": budget, "policy": policy.label(),
                "modes": {m: _mode_summary(gens[m], ref_len, margins, noise_margin) for m in ALL_MODES},
                "leak": leak} for budget, policy, gens, leak in measured]
    chain = _mode_summary(chain_gens, ref_len, margins, noise_margin)

    rows = [{"label": "chain", "mode": "exact", "budget": None, "tokens_per_step": chain["tokens_per_step"],
             "nodes": float(np.mean([s.tree_size for g in chain_gens for s in g.steps]))}]
    for b in budgets:
        for m in ALL_MODES:
            rows.append({"label": b["policy"], "mode": m, "budget": b["budget"],
                         "tokens_per_step": b["modes"][m]["tokens_per_step"], "nodes": b["modes"][m]["mean_tree_size"]})
    noise = {b["budget"]: b["leak"]["exact"] for b in budgets}
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": None,  # filled by the writer; the only field that varies between runs
        "config": {**asdict(ac), "drafter": drafter.params()},
        "environment": environment(device),
        "precision": precision(model),
        "model": {**cfg.to_dict(), "source": ac.model_path or f"preset {ac.preset}", "gates": _gate_stats(cfg, weights)},
        "prompts": [{"index": i, "tokens": p, "reference": r, "reference_margins": m}
                    for i, (p, r, m) in enumerate(zip(prompts, references, margins))],
        "chain": chain,
        "budgets": budgets,
        "noise_margin": noise_margin,
        "noise_floor": {str(k): {"state_rel_max": v["state_rel"]["other"]["max"] if v["state_rel"]["other"]["n"] else
                                 v["state_rel"]["order_exact"]["max"],
                                 "kl_max": max(x for x in (v["kl"]["other"]["max"], v["kl"]["order_exact"]["max"]) if x is not None),
                                 "argmax_flip_rate": v["argmax_flip_rate"]["all"]} for k, v in noise.items()},
        "throughput": {"cost_model": cost.to_dict(), "rows": speedup_table(rows, cost)},
        "generations": generations,
    }


def total_steps(ac: AuditConfig, n_prompts: int) -> int:
    return n_prompts * ac.steps * (1 + len(ac.budgets) * len(ALL_MODES))
