"""Hypothesis strategies that build valid objects directly (no filtering), so failures shrink to
tiny trees and tensors."""
from __future__ import annotations

import hypothesis.strategies as st
import torch

from ddsim.model.config import ModelConfig
from ddsim.trees.seeds import derive_seed
from ddsim.trees.tree import Tree

TREE_SHAPES = ("chain", "star", "deep", "wide", "random", "single")


@st.composite
def trees(draw, *, min_size: int = 1, max_size: int = 12, vocab: int = 32, shape: str | None = None) -> Tree:
    """Trees of every shape: chains, stars, deep and wide trees, random trees, the single root.

    Tokens are distinct among siblings by construction.
    """
    shape = shape or draw(st.sampled_from(TREE_SHAPES))
    size = 1 if shape == "single" else draw(st.integers(max(min_size, 1), max(max_size, min_size, 1)))
    parents = [-1]
    for i in range(1, size):
        if shape == "chain":
            p = i - 1
        elif shape == "star":
            p = 0
        elif shape == "deep":  # mostly the previous node, sometimes a branch back
            p = i - 1 if draw(st.integers(0, 3)) else draw(st.integers(0, i - 1))
        elif shape == "wide":  # shallow: parents among the first few nodes
            p = draw(st.integers(0, min(i - 1, 2)))
        else:
            p = draw(st.integers(0, i - 1))
        parents.append(p)
    used: dict[int, list[int]] = {}
    tokens = [draw(st.integers(0, vocab - 1))]
    for i in range(1, size):
        taken = used.setdefault(parents[i], [])
        free = [t for t in range(vocab) if t not in taken]
        if not free:  # more siblings than tokens: re-parent to the previous node
            parents[i] = i - 1
            taken = used.setdefault(i - 1, [])
            free = [t for t in range(vocab) if t not in taken]
        t = free[draw(st.integers(0, len(free) - 1))]
        taken.append(t)
        tokens.append(t)
    return Tree(parents, tokens)


@st.composite
def topological_orders(draw, tree: Tree) -> list[int]:
    """A random topological order of ``tree`` (root first, parents before children)."""
    order, ready = [0], list(tree.children[0])
    while ready:
        n = ready.pop(draw(st.integers(0, len(ready) - 1)))
        order.append(n)
        ready.extend(tree.children[n])
    return order


@st.composite
def ddtree_logits(draw, *, max_depth: int = 4, max_vocab: int = 6) -> torch.Tensor:
    """[D, V] draft logits; small integer values so that ties (and tie-breaking) are common."""
    D = draw(st.integers(1, max_depth))
    V = draw(st.integers(1, max_vocab))
    vals = draw(st.lists(st.integers(-4, 4), min_size=D * V, max_size=D * V))
    scale = draw(st.sampled_from([0.5, 1.0, 3.0]))
    return torch.tensor(vals, dtype=torch.float64).view(D, V) * scale


@st.composite
def model_configs(draw) -> ModelConfig:
    """Toy hybrid configs exercising grouped heads (HV/H in 1..3), GQA, every layer kind (GDN,
    attention, Mamba2, parallel attention + Mamba2, MLP-only blocks, short convs, Mamba1, lightning attention, KDA,
    Zamba2's attention-then-Mamba2 hybrid layers),
    multi-head latent attention, the real-checkpoint features
    (gated attention, q/k norm per head or over all heads, partial RoPE, zero-centred norms, MoE, OLMo-Hybrid's
    output-normed attention blocks and GDN beta scale) and the Mamba2-hybrid ones
    (grouped B/C, dt limits, the three gated-norm forms, relu^2 and GeGLU MLPs, NoPE, scalings)."""
    H = draw(st.integers(1, 2))
    HV = H * draw(st.integers(1, 3))
    nkv = draw(st.integers(1, 2))
    n_layers = draw(st.integers(1, 4))
    pat = "".join(draw(st.sampled_from("gagampfcslkz")) for _ in range(n_layers))
    layer_mlp = "f" not in pat or draw(st.booleans())
    moe = draw(st.booleans())
    n_exp = draw(st.integers(2, 4)) if moe else 0
    router = draw(st.sampled_from(["softmax", "sigmoid"])) if moe else "softmax"
    n_group = 2 if router == "sigmoid" and n_exp % 2 == 0 else 1
    topk_group = draw(st.integers(1, n_group))
    if min(2, n_exp) > topk_group * (n_exp // n_group if n_exp else 1):
        topk_group = n_group
    mG = draw(st.integers(1, 2))
    qk_norm = draw(st.booleans())
    minimax = set(pat) <= set("alf") and layer_mlp and draw(st.booleans())  # MiniMax's scaled normed-residual blocks
    ab = st.sampled_from([1.0, 0.5, 2.0])
    kw = dict(
        residual_from_norm=minimax, attn_alpha=draw(ab), attn_beta=draw(ab), linear_alpha=draw(ab), linear_beta=draw(ab),
        mlp_alpha=draw(ab), mlp_beta=draw(ab),
        name="hypothesis", vocab_size=draw(st.integers(8, 40)), hidden_size=draw(st.sampled_from([8, 16, 24])),
        layer_pattern=pat, intermediate_size=16, num_attention_heads=nkv * draw(st.integers(1, 2)),
        num_key_value_heads=nkv, head_dim=draw(st.sampled_from([4, 8])), linear_num_key_heads=H,
        linear_num_value_heads=HV, linear_key_head_dim=draw(st.sampled_from([3, 4, 6])),
        linear_value_head_dim=draw(st.sampled_from([3, 5, 8])), max_position_embeddings=256,
        gate_halflife=(1.0, draw(st.sampled_from([4.0, 64.0, 1024.0]))),
        logit_std=draw(st.sampled_from([1.0, 4.0])),
        norm_offset=draw(st.sampled_from([0.0, 1.0])), attn_output_gate=draw(st.booleans()),
        qk_norm=qk_norm, qk_norm_all=qk_norm and draw(st.booleans()), attn_post_norm=not minimax and draw(st.booleans()),
        gdn_beta_scale=draw(st.sampled_from([1.0, 2.0])), gdn_norm_eps=draw(st.sampled_from([0.0, 1e-5])),
        partial_rotary_factor=draw(st.sampled_from([1.0, 0.5])),
        num_experts=n_exp, num_experts_per_tok=min(2, n_exp), moe_intermediate_size=8 if moe else 0,
        shared_expert_intermediate_size=draw(st.sampled_from([0, 8])) if moe else 0,
        norm_topk_prob=draw(st.booleans()), decoder_sparse_step=draw(st.sampled_from([1, 2])),
        shared_expert_gate=draw(st.booleans()), moe_router=router, moe_n_group=n_group, moe_topk_group=topk_group,
        routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])), moe_norm_eps=draw(st.sampled_from([1e-20, 1e-6])),
        mamba_n_groups=mG, mamba_num_heads=mG * draw(st.integers(1, 2)),
        mamba_head_dim=draw(st.sampled_from([2, 4])), mamba1_inner=draw(st.sampled_from([4, 6])),
        mamba1_dt_rank=draw(st.sampled_from([1, 3])), mamba1_bcdt_norm=draw(st.booleans()),
        mamba_state_size=draw(st.sampled_from([3, 4])), mamba_conv_bias=draw(st.booleans()),
        mamba_dt_limit=draw(st.sampled_from([(0.0, float("inf")), (0.01, 0.5)])),
        mamba_norm=draw(st.sampled_from(["gated", "gated-before", "gate"])), layer_mlp=layer_mlp,
        mlp_act=draw(st.sampled_from(["swiglu", "geglu", "relu2"])), use_rope=draw(st.booleans()),
        residual_multiplier=draw(st.sampled_from([1.0, 0.5])), logits_scaling=draw(st.sampled_from([1.0, 2.0])))
    if "k" in pat:  # KDA: H heads of K = V dims
        kw.update(linear_num_value_heads=H, linear_value_head_dim=kw["linear_key_head_dim"])
    if any(c in "ap" for c in pat) and "z" not in pat and draw(st.booleans()):  # MLA, heads zero-padded to head_dim
        nope, rope, vd = draw(st.sampled_from([2, 4])), draw(st.sampled_from([0, 2, 4])), draw(st.sampled_from([2, 4, 6]))
        mla_rope = rope > 0 and draw(st.booleans())  # DeepSeek's decoupled RoPE (else NoPE, as Kimi Linear)
        kw.update(mla_kv_lora_rank=draw(st.sampled_from([3, 5])), mla_q_lora_rank=draw(st.sampled_from([0, 4])),
                  mla_qk_nope_head_dim=nope, mla_qk_rope_head_dim=rope, mla_v_head_dim=vd, head_dim=max(nope + rope, vd),
                  use_rope=mla_rope, mla_rope_interleave=mla_rope and draw(st.booleans()),
                  num_key_value_heads=kw["num_attention_heads"], qk_norm=False, qk_norm_all=False,
                  attn_output_gate=False, attention_scale=(nope + rope) ** -0.5, partial_rotary_factor=1.0,
                  mla_norm_eps=draw(st.sampled_from([1e-6, 1e-5])))
    return ModelConfig(**kw)


def _normal(gen: torch.Generator):
    """rnd(*shape): standard normal float64 draws from ``gen`` (the strategies' tensors, seeded by a drawn integer)."""
    return lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)


def _trees_of_size(draw, B: int, T: int) -> list[Tree]:
    """B drawn trees of exactly T nodes each (a chain where a shape cannot reach T)."""
    ts = [draw(trees(min_size=T, max_size=T)) for _ in range(B)]
    return [t if t.size == T else Tree([-1] + list(range(T - 1)), range(T)) for t in ts]


def _pooled(draw, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pool, slots): the batch's rows [B, ...] in a pool of B + 1..3 rows at shuffled slots (int32 [B]),
    every other row NaN, so a kernel that reads a slot it was not given shows it."""
    B = batch.shape[0]
    n = B + draw(st.integers(1, 3))
    slots = draw(st.permutations(range(n)))[:B]
    pool = torch.full((n, *batch.shape[1:]), float("nan"), dtype=batch.dtype)
    pool[list(slots)] = batch
    return pool, torch.tensor(slots, dtype=torch.int32)


@st.composite
def gdn_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32, ks=(2, 3, 4, 5)):
    """Layer inputs for gdn_tree_verify: a tree per sequence (same T), random q/k/v/g/beta/state;
    the key width K drawn from ``ks``."""
    B = draw(st.integers(1, max_batch))
    H = draw(st.integers(1, 2))
    HV = H * draw(st.integers(1, 3))
    K = draw(st.sampled_from(list(ks)))
    V = draw(st.sampled_from([2, 3, 4, 6]))
    T = draw(st.integers(1, max_nodes))
    ts = _trees_of_size(draw, B, T)
    seed = draw(st.integers(0, 2**31 - 1))
    memory = draw(st.sampled_from(["fast", "long"]))
    gen = torch.Generator().manual_seed(seed)
    rnd = _normal(gen)
    g = -torch.rand(B, T, HV, generator=gen, dtype=torch.float64) * (2.0 if memory == "fast" else 0.05)
    return dict(
        q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, HV, V).to(dtype),
        g=g.to(dtype), beta=torch.rand(B, T, HV, generator=gen, dtype=torch.float64).to(dtype),
        parents=torch.tensor([t.parents for t in ts]), initial_state=rnd(B, HV, K, V).float(),
        trees=ts)


@st.composite
def gdn_pool_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32):
    """gdn_inputs with the committed states in a state pool, as a serving engine keeps them:
    pool [N, HV, K, V] float32 with N = B + 1..3 slots, the batch's sequences in shuffled slots
    ``slots`` [B] (int32), every other slot NaN (a kernel that reads a slot it was not given shows it)."""
    inp = draw(gdn_inputs(max_batch=max_batch, max_nodes=max_nodes, dtype=dtype))
    B, HV, K, V = inp["initial_state"].shape
    pool, slots = _pooled(draw, inp["initial_state"])
    return dict(inp, pool=pool, slots=slots)


@st.composite
def mamba2_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32, engine: bool = False,
                  ns=(2, 3, 5, 8)):
    """Layer inputs for mamba2_tree_verify: a tree per sequence (same T), x [B, T, H, P],
    raw dt [B, T, H], A [H] < 0, grouped B, C [B, T, G, N], D and dt_bias [H] (or None), dt limits,
    and the committed states in a pool (N = B + 1..3 slots, the batch in shuffled slots, every other
    slot NaN). ``engine``: what an engine's Mamba2 contract takes (softplus always, no dt limit); the state width N
    drawn from ``ns``."""
    B = draw(st.integers(1, max_batch))
    G = draw(st.integers(1, 2))
    H = G * draw(st.integers(1, 3))
    P = draw(st.sampled_from([2, 3, 4, 6]))
    N = draw(st.sampled_from(list(ns)))
    T = draw(st.integers(1, max_nodes))
    ts = _trees_of_size(draw, B, T)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    memory = draw(st.sampled_from(["fast", "long"]))
    rnd = _normal(gen)
    A = -torch.rand(H, generator=gen, dtype=torch.float64) * (4.0 if memory == "fast" else 0.1) - 1e-3
    state = rnd(B, H, P, N).float()
    pool, slots = _pooled(draw, state)
    softplus = True if engine else draw(st.sampled_from([True, True, False]))
    dt = rnd(B, T, H) if softplus else rnd(B, T, H).abs()  # taken as given, dt is a step: >= 0 (decays)
    return dict(x=rnd(B, T, H, P).to(dtype), dt=dt.to(dtype), A=A.float(), B=rnd(B, T, G, N).to(dtype),
                C=rnd(B, T, G, N).to(dtype), D=rnd(H).float() if draw(st.booleans()) else None,
                dt_bias=None if not softplus else (rnd(H).float() if draw(st.booleans()) else None),
                dt_softplus=softplus,
                dt_limit=(0.0, float("inf")) if engine else draw(st.sampled_from([(0.0, float("inf")), (0.05, 1.5)])),
                parents=torch.tensor([t.parents for t in ts]), initial_state=state, pool=pool, slots=slots, trees=ts)


@st.composite
def mamba1_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32):
    """Layer inputs for mamba1_tree_verify: a tree per sequence (same T), x [B, T, I], raw dt [B, T, I],
    A [I, N] < 0 (per channel and state index, fast or long memory), B, C [B, T, N] shared by every channel,
    D and dt_bias [I] (or None), softplus or dt taken as given, and the committed state [B, I, N]."""
    B = draw(st.integers(1, max_batch))
    I = draw(st.sampled_from([1, 2, 3, 5, 8]))
    N = draw(st.sampled_from([1, 2, 3, 5, 8]))
    T = draw(st.integers(1, max_nodes))
    ts = _trees_of_size(draw, B, T)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    memory = draw(st.sampled_from(["fast", "long"]))
    rnd = _normal(gen)
    A = -torch.rand(I, N, generator=gen, dtype=torch.float64) * (8.0 if memory == "fast" else 0.1) - 1e-3
    softplus = draw(st.sampled_from([True, True, False]))
    dt = rnd(B, T, I) if softplus else rnd(B, T, I).abs()  # taken as given, dt is a step: >= 0 (decays)
    return dict(x=rnd(B, T, I).to(dtype), dt=dt.to(dtype), A=A.float(), B=rnd(B, T, N).to(dtype),
                C=rnd(B, T, N).to(dtype), D=rnd(I).float() if draw(st.booleans()) else None,
                dt_bias=None if not softplus else (rnd(I).float() if draw(st.booleans()) else None),
                dt_softplus=softplus, parents=torch.tensor([t.parents for t in ts]), initial_state=rnd(B, I, N).float(),
                trees=ts)


@st.composite
def lightning_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32, engine: bool = False):
    """Layer inputs for lightning_tree_verify: a tree per sequence (same T), q, k [B, T, H, K], v [B, T, H, V],
    the per-head decay lambda in (0, 1] (MiniMax's exp(-slope), fast or long memory, 1 included) and the
    committed state [B, H, K, V]. ``engine``: the committed states also in a pool, as an engine's contract takes
    them (N = B + 1..3 slots, the batch in shuffled slots, every other slot NaN)."""
    B = draw(st.integers(1, max_batch))
    H = draw(st.integers(1, 3))
    K = draw(st.sampled_from([1, 2, 3, 5]))
    V = draw(st.sampled_from([1, 2, 4, 6]))
    T = draw(st.integers(1, max_nodes))
    ts = _trees_of_size(draw, B, T)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    rnd = _normal(gen)
    memory = draw(st.sampled_from(["fast", "long", "none"]))
    slope = torch.rand(H, generator=gen, dtype=torch.float64) * {"fast": 2.0, "long": 0.05, "none": 0.0}[memory]
    out = dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, H, V).to(dtype),
               decay=torch.exp(-slope).float(), parents=torch.tensor([t.parents for t in ts]),
               initial_state=rnd(B, H, K, V).float(), trees=ts)
    if engine:
        out["pool"], out["slots"] = _pooled(draw, out["initial_state"])
    return out


@st.composite
def kda_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32, engine: bool = False):
    """Layer inputs for kda_tree_verify: a tree per sequence (same T), q, k [B, T, H, K], v [B, T, H, V], the log
    decay per key channel g [B, T, H, K] <= 0 (fast or long memory, or none), beta [B, T, H] in (0, 1) (or up to 2)
    and the committed state [B, H, K, V]. ``engine``: what an engine's KDA contract takes: beta in (0, 1), and the
    committed states also in a pool (N = B + 1..3 slots, the batch in shuffled slots, every other slot NaN)."""
    B = draw(st.integers(1, max_batch))
    H = draw(st.integers(1, 3))
    K = draw(st.sampled_from([1, 2, 3, 5]))
    V = draw(st.sampled_from([1, 2, 4, 6]))
    T = draw(st.integers(1, max_nodes))
    ts = _trees_of_size(draw, B, T)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    rnd = _normal(gen)
    scale = {"fast": 3.0, "long": 0.02, "none": 0.0}[draw(st.sampled_from(["fast", "long", "none"]))]
    g = -torch.rand(B, T, H, K, generator=gen, dtype=torch.float64) * scale
    # beta up to 2 (negative eigenvalues) for ddsim's ops; an engine's contract takes a sigmoid's beta in (0, 1)
    beta = torch.sigmoid(rnd(B, T, H)) * (1.0 if engine else draw(st.sampled_from([1.0, 2.0])))
    out = dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, H, V).to(dtype),
               g=g.float(), beta=beta.float(), parents=torch.tensor([t.parents for t in ts]),
               initial_state=rnd(B, H, K, V).float(), trees=ts)
    if engine:
        out["pool"], out["slots"] = _pooled(draw, out["initial_state"])
    return out


def fixed_mamba2_example(*, dtype=torch.float32, seed: int = 7, T: int = 6, growing: bool = False) -> dict:
    """A deterministic branching case for @example: two sequences, grouped B/C (H=4, G=2), odd P and
    N, D, dt_bias and a clamping dt_limit; with T > 6 a deep chain follows the branching prefix (more
    than one 32-row block of the SSD kernel at T > 32). ``growing``: dt taken as given (no softplus,
    no limit) and some of it negative, so exp(dt A) > 1 at those nodes: a state that grows along a
    path (the case hypothesis found a decay-only assumption in the SSD kernel with)."""
    pa = [[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 0, 3, 3]]
    pa = [row + list(range(len(row) - 1, T - 1)) for row in pa] if T > 6 else [row[:T] for row in pa]
    ts = [Tree(row, list(range(T))) for row in pa]
    gen = torch.Generator().manual_seed(seed)
    B, H, G, P, N = 2, 4, 2, 3, 5
    rnd = _normal(gen)
    state = rnd(B, H, P, N).float()
    pool = torch.full((B + 2, H, P, N), float("nan"))
    slots = [3, 0]
    pool[slots] = state
    dt = rnd(B, T, H) * (0.1 if growing else 1.0)
    return dict(x=rnd(B, T, H, P).to(dtype), dt=dt.to(dtype),
                A=(-torch.rand(H, generator=gen, dtype=torch.float64) * 0.5).float(), B=rnd(B, T, G, N).to(dtype),
                C=rnd(B, T, G, N).to(dtype), D=rnd(H).float(), dt_bias=None if growing else rnd(H).float(),
                dt_softplus=not growing, dt_limit=(0.0, float("inf")) if growing else (0.05, 1.5),
                parents=torch.tensor(pa), initial_state=state, pool=pool,
                slots=torch.tensor(slots, dtype=torch.int32), trees=ts)


@st.composite
def conv_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32):
    B = draw(st.integers(1, max_batch))
    C = draw(st.integers(1, 6))
    W = draw(st.integers(2, 5))
    T = draw(st.integers(1, max_nodes))
    ts = _trees_of_size(draw, B, T)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return dict(x=torch.randn(B, T, C, generator=gen).to(dtype), weight=torch.randn(C, W, generator=gen).to(dtype),
                bias=torch.randn(C, generator=gen).to(dtype) if draw(st.booleans()) else None,
                parents=torch.tensor([t.parents for t in ts]),
                initial_window=torch.randn(B, C, W - 1, generator=gen).to(dtype), trees=ts)


@st.composite
def conv_pool_inputs(draw, *, max_batch: int = 2, max_nodes: int = 8, dtype=torch.float32, widths=(2, 3, 4, 5)):
    """Tree-conv inputs with the committed windows in a pool: pool [N, C, W-1] with N = B + 1..3, the
    batch's windows in shuffled slots ``slots`` [B] (int32), every other slot NaN."""
    B = draw(st.integers(1, max_batch))
    C = draw(st.integers(1, 6))
    W = draw(st.sampled_from(sorted(widths)))
    T = draw(st.integers(1, max_nodes))
    ts = _trees_of_size(draw, B, T)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    window = torch.randn(B, C, W - 1, generator=gen).to(dtype)
    pool, slots = _pooled(draw, window)
    return dict(x=torch.randn(B, T, C, generator=gen).to(dtype), weight=torch.randn(C, W, generator=gen).to(dtype),
                bias=torch.randn(C, generator=gen).to(dtype) if draw(st.booleans()) else None,
                parents=torch.tensor([t.parents for t in ts]), initial_window=window, pool=pool, slots=slots,
                trees=ts)


def fixed_gdn_example(*, dtype=torch.float32, seed: int = 7) -> dict:
    """A deterministic branching case (two sequences, grouped heads, odd K and V) for @example:
    siblings and cousins, so every mode-dependent path is exercised even in the first examples."""
    ts = [Tree([-1, 0, 0, 1, 1, 2], [5, 1, 2, 3, 4, 3]), Tree([-1, 0, 1, 0, 3, 3], [0, 1, 2, 3, 4, 5])]
    gen = torch.Generator().manual_seed(seed)
    B, T, H, HV, K, V = 2, 6, 1, 3, 3, 5
    rnd = _normal(gen)
    return dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, HV, V).to(dtype),
                g=(-torch.rand(B, T, HV, generator=gen, dtype=torch.float64) * 0.3).to(dtype),
                beta=torch.rand(B, T, HV, generator=gen, dtype=torch.float64).to(dtype),
                parents=torch.tensor([t.parents for t in ts]), initial_state=rnd(B, HV, K, V).float(), trees=ts)


def fixed_conv_example(*, dtype=torch.float32, seed: int = 7) -> dict:
    ts = [Tree([-1, 0, 0, 1, 1, 2], [5, 1, 2, 3, 4, 3]), Tree([-1, 0, 1, 2, 0, 4], [0, 1, 2, 3, 4, 5])]
    gen = torch.Generator().manual_seed(seed)
    B, T, C, W = 2, 6, 3, 4
    return dict(x=torch.randn(B, T, C, generator=gen).to(dtype), weight=torch.randn(C, W, generator=gen).to(dtype),
                bias=None, parents=torch.tensor([t.parents for t in ts]),
                initial_window=torch.randn(B, C, W - 1, generator=gen).to(dtype), trees=ts)


class RandomDrafter:
    """A drafter of arbitrary seeded logits [depth, V] per step: any drafter at all, for the
    lossless properties (acceptance must not depend on drafter quality for correctness)."""
    needs_greedy = False
    max_rank = None

    def __init__(self, *, vocab_size: int, depth: int, seed: int, scale: float = 3.0):
        self.vocab_size, self.depth, self.seed, self.scale = vocab_size, depth, seed, scale

    def draft(self, ctx):
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "random-drafter", ctx.step))
        return torch.randn(self.depth, self.vocab_size, generator=gen, dtype=torch.float64) * self.scale

    def params(self) -> dict:
        return {"kind": "random", "depth": self.depth, "seed": self.seed, "scale": self.scale}


@st.composite
def drafters(draw, *, vocab_size: int, greedy_ok: bool = True):
    """Random drafters, and (when greedy_ok) the synthetic drafter with random knobs."""
    depth = draw(st.integers(1, 4))
    if greedy_ok and draw(st.booleans()):
        from ddsim.sim.drafters import SyntheticDrafter
        return SyntheticDrafter(vocab_size=vocab_size, depth=depth, accuracy=draw(st.sampled_from([0.0, 0.5, 1.0])),
                                sharpness=draw(st.sampled_from([0.0, 4.0, 8.0])), seed=draw(st.integers(0, 99)))
    return RandomDrafter(vocab_size=vocab_size, depth=depth, seed=draw(st.integers(0, 10**6)),
                         scale=draw(st.sampled_from([0.5, 3.0, 10.0])))


@st.composite
def tree_policies(draw):
    from ddsim.sim.generate import TreePolicy
    if draw(st.integers(0, 3)) == 0:
        return TreePolicy("chain")
    return TreePolicy("ddtree", budget=draw(st.integers(0, 12)), topk_cap=draw(st.sampled_from([None, 1, 2, 3])))
