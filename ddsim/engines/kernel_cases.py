"""The explicit examples ``ddsim check-kernel`` always runs, whatever ``--max-examples`` says: every
dimension a serving engine runs, one example per value, the others held at small values so that a
kernel wrong only along one dimension is caught by the example that reaches it.

Profiles:
  quick    (the CPU default: Triton kernels run in Triton's interpreter) a few examples of each wide
           dimension, each sized for the interpreter: one K = V = 128 example, one tree of 129 nodes,
           one batch of 8 in a pool of 300 slots (ids above 255), a batch of 3, the last slot of a
           pool, head ratios 4, 6 and 8, widths that are not powers of two, strong decay (g down to
           -30) and long memory (g up to -1e-4), beta at 0 and 1, 16-bit inputs, and a burst of 24
           calls on one input, and one example whose q, k, v (Mamba2: x, B, C) are views of one fused
           projection
  serving  (the CUDA default) every value: T in {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 66, 127,
           128, 129, 257}, DDTree trees at budgets 15/16/64/128/256 with top-k caps 1-8, chains,
           stars, deep and wide trees; K and V in {16, 32, 64, 128} and widths that are not powers of
           two; HV/H in {1, 2, 3, 4, 6, 8}; batches of 1, 3, 8 and 32; pools of 1024 slots with
           the batch shuffled, sparse, descending, above 255 and at the last slot; gates from fast
           forgetting to long memory; bf16 / fp16 / fp32 inputs; bursts of repeated calls; and a
           model's layer with every dimension at once (GDN: Qwen3.6-27B's heads at 8 x 65 and 32 x 17;
           the conv: its 10240 channels at 8 x 65; Mamba2: Nemotron-H-8B's, KDA: Kimi Linear's,
           lightning: MiniMax's heads at 8 x 33), where an engine may pick another configuration; those
           layers, and one small example, take q, k, v (Mamba2: x, B, C) as a server's layer hands them
           over: views of one fused projection, every token's row strided by the projection's width

The KDA examples (``--op kda``) follow the GDN ones with H heads of K = V dims (Kimi Linear's 32 x 128 among them)
and a decay per key channel; the lightning-attention examples (``--op lightning``) likewise (MiniMax's 64 x 128
among them), a constant decay per head from fast to none.

Both profiles add padded batches (padded_cases: the last rows slot -1) for a kernel whose convention pads.

Each example is the dict the drawn strategies make (ddsim.properties.strategies) plus ``label`` (what
it covers) and ``burst`` (how many calls on the same input must agree bit for bit: two by default, one in the
quick profile but for its burst examples, see ``cases``). The recurrent
states are float32; q, k, v, gates (and the conv's and Mamba2's inputs) are in the example's dtype,
and its comparison uses that dtype's tolerance.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ddsim.gpu_backend.checks import PAD_SLOT  # a padded row's slot, as SGLang pads a CUDA-graph batch
from ddsim.trees.tree import Tree

PROFILES = ("quick", "serving")
SERVING_NODES = (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 66, 127, 128, 129, 257)
SHAPES = ("chain", "star", "deep", "wide", "random")
# the inputs a server's layer hands its verify as views of one fused projection, their columns side by side: SGLang
# splits the tree conv's output mixed_qkv [tokens, 2 H K + HV V] into q, k and v (torch.split on the last axis) and
# passes the views, a Mamba2 layer its xBC into x, B and C. Each view's token stride is the projection's width, not
# its own: a kernel that computes its offsets from its shapes reads the other inputs' columns there
SPLIT = {"gdn": ("q", "k", "v"), "kda": ("q", "k", "v"), "lightning": ("q", "k", "v"), "mamba2": ("x", "B", "C")}
# the state pools servers keep in 16 bits: vLLM's mamba cache dtypes "auto" keep GDN, Mamba2 and lightning states
# in the model's dtype (its MiniMax lightning states cannot be float32: MambaStateDtypeCalculator), SGLang's
# SGLANG_MAMBA_SSM_DTYPE takes bfloat16, and its Mamba2 kernel stores float16 states. A kernel reads the pool's values
# and writes its node states in the pool's dtype; each profile holds an example of each op with each
STATE_DTYPES = (torch.bfloat16, torch.float16)
# a server's unified state pool holds each slot's entries of every layer side by side (SGLang's page-major pool: its
# kernels take a layer's slot pitch from the pool's stride(0), "an envelope-strided view"), so a layer's pool [N, ...]
# is a view whose slots lie SLOT_MAJOR[1] entries apart: the examples _slot_major marks put theirs at layer
# SLOT_MAJOR[0] of such a pool, the other layers' entries NaN. A kernel that takes the pitch from the shape reads them
SLOT_MAJOR = (2, 4)


def _slot_major(inp: dict) -> dict:
    """The example with its pool handed over as one layer of a slot-major pool of several (check_kernel builds it on
    every call), said in its label."""
    layer, layers = SLOT_MAJOR
    inp.update(pool_layers=SLOT_MAJOR, label=f"{inp['label']}, pool layer {layer} of {layers} slot-major")
    return inp


def split_views(ts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors ``ts`` (each [B, T, ...], one dtype and device) as views of one fused [B, T, sum of their widths]
    tensor, in order: what SPLIT's examples hand a kernel (the values the same, the layout a server's)."""
    first = next(iter(ts.values()))
    fused = torch.cat([t.reshape(*first.shape[:2], -1) for t in ts.values()], -1)  # [B, T, W]
    out, at = {}, 0
    for name, t in ts.items():
        width = t[0, 0].numel()
        out[name] = fused[..., at:at + width].unflatten(-1, t.shape[2:])  # token stride W, not width
        at += width
    return out


def _split(op: str, inp: dict) -> dict:
    """The example with its SPLIT inputs handed over as views of one fused projection (check_kernel builds them on
    every call), said in its label."""
    names = SPLIT[op]
    inp.update(split=names, label=f"{inp['label']}, {' '.join(names)} views of one fused projection")
    return inp


def tree(kind: str, T: int, rng: np.random.Generator) -> Tree:
    """A tree of exactly T nodes of one shape (tokens distinct among siblings: node i carries token i)."""
    parents = [-1]
    for i in range(1, T):
        if kind == "chain":
            p = i - 1
        elif kind == "star":
            p = 0
        elif kind == "deep":  # a long chain that branches back now and then
            p = i - 1 if i % 5 else int(rng.integers(0, i))
        elif kind == "wide":  # a few roots of many siblings each
            p = int(rng.integers(0, min(i, 4)))
        else:
            p = int(rng.integers(0, i))
        parents.append(p)
    return Tree(parents, range(T))


def ddtree(budget: int, cap: int, rng: np.random.Generator, depth: int = 15, vocab: int = 64) -> Tree:
    """DDTree's best-first tree over random draft logits (ddsim.trees.builders.ddtree), as a server builds it."""
    from ddsim.trees.builders import ddtree as build
    logits = torch.from_numpy(rng.standard_normal((depth, vocab)) * 3.0)
    return build(logits, budget, cap)


def _gates(kind: str, shape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) float64: "fast" g in [-30, -1], "long" in [-1e-2, -1e-4], "mixed" log-uniform over
    [-30, -1e-4]; beta uniform in [0, 1] with exact 0 and 1 among them."""
    u = torch.rand(*shape, generator=gen, dtype=torch.float64)
    if kind == "fast":
        g = -(1.0 + 29.0 * u)
    elif kind == "long":
        g = -(1e-4 + (1e-2 - 1e-4) * u)
    else:
        g = -torch.exp(np.log(1e-4) + (np.log(30.0) - np.log(1e-4)) * u)
    beta = torch.rand(*shape, generator=gen, dtype=torch.float64)
    flat = beta.view(-1)
    flat[::7] = 0.0
    flat[3::7] = 1.0
    return g, beta


def _pool(batch: torch.Tensor, kind: str, n: int, rng: np.random.Generator, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(pool [n, ...] NaN but for the batch's rows, slots int32 [B]): "shuffled" random distinct slots,
    "sparse" spread over the pool, "descending", "high" (every id above 255), "last" (the last slot
    among them). The last ``pad`` rows are padding, as SGLang pads a CUDA-graph batch: slot PAD_SLOT, no state
    in the pool (their rows of ``batch`` are zeroed in place: an engine computes a padded row from a zero state)."""
    if pad:
        batch[batch.shape[0] - pad:] = 0
        pool, slots = _pool(batch[:batch.shape[0] - pad], kind, n, rng)
        return pool, torch.cat([slots, torch.full((pad,), PAD_SLOT, dtype=torch.int32)])
    B = batch.shape[0]
    if kind == "sparse":
        slots = [int(i * (n // B)) + int(rng.integers(0, max(1, n // B))) for i in range(B)]
    elif kind == "descending":
        slots = sorted(rng.choice(n, B, replace=False).tolist(), reverse=True)
    elif kind == "high":
        slots = (256 + rng.choice(n - 256, B, replace=False)).tolist()
    elif kind == "last":
        slots = [n - 1] + rng.choice(n - 1, B - 1, replace=False).tolist()
        rng.shuffle(slots)
    else:
        slots = rng.choice(n, B, replace=False).tolist()
    pool = torch.full((n, *batch.shape[1:]), float("nan"), dtype=batch.dtype)
    pool[slots] = batch
    return pool, torch.tensor(slots, dtype=torch.int32)


def _trees(kind, T: int, B: int, rng) -> list[Tree]:
    """B trees: of one shape at T nodes, or DDTree trees ("ddtree", budget, cap) padded or cut to one size."""
    if isinstance(kind, tuple):
        ts = [ddtree(kind[1], kind[2], rng) for _ in range(B)]
        T = min(t.size for t in ts)
        return [Tree(t.parents[:T], t.tokens[:T]) for t in ts]  # a topological prefix is a tree
    return [tree(kind, T, rng) for _ in range(B)]


def _draws(kind, T: int, B: int, seed: int):
    """What every case starts from: (numpy rng, torch generator, B trees of one size, that size, a float64
    standard-normal draw ``rnd(*shape)``), all from ``seed``."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    ts = _trees(kind, T, B, rng)
    return rng, gen, ts, ts[0].size, lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)


def _label(kind) -> str:
    return f"ddtree budget {kind[1]} top-k {kind[2]}" if isinstance(kind, tuple) else kind


def _pool_label(label: str, state_dtype) -> str:
    """An example's label, saying its state pool's dtype where that is not float32."""
    return label if state_dtype == torch.float32 else f"{label}, state pool {str(state_dtype).removeprefix('torch.')}"


def gdn_case(*, T: int = 17, kind="random", B: int = 2, H: int = 1, ratio: int = 2, K: int = 16, V: int = 16,
             gates: str = "mixed", pool: str = "shuffled", pool_size: int | None = None, dtype=torch.float32,
             burst: int = 2, seed: int = 0, label: str = "", pad: int = 0, state_dtype=torch.float32) -> dict:
    rng, gen, ts, T, rnd = _draws(kind, T, B, seed)
    HV = H * ratio
    g, beta = _gates(gates, (B, T, HV), gen)
    state = rnd(B, HV, K, V).to(state_dtype)
    p, slots = _pool(state, pool, pool_size or B + 3, rng, pad)
    return dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, HV, V).to(dtype),
                g=g.to(dtype), beta=beta.to(dtype), parents=torch.tensor([t.parents for t in ts]), initial_state=state,
                trees=ts, pool=p, slots=slots, burst=burst, tree=_label(kind),
                label=_pool_label(label or f"{_label(kind)} T={T} B={B} H={H} HV={HV} K={K} V={V} gates {gates} "
                                           f"pool {pool} {str(dtype).removeprefix('torch.')}", state_dtype))


def gdn_cases(profile: str, dtype=torch.float32) -> list[dict]:
    """The explicit GDN examples of a profile (inputs in ``dtype``, plus the other 16-bit and 32-bit
    dtypes once each)."""
    other = [d for d in (torch.float32, torch.bfloat16, torch.float16) if d != dtype]
    if profile == "quick":  # sized for Triton's interpreter: a few hundred program-steps each at most
        return [
            gdn_case(T=17, kind=("ddtree", 16, 8), B=1, ratio=1, K=128, V=128, seed=1, dtype=dtype),
            gdn_case(T=129, kind=("ddtree", 128, 4), B=1, ratio=1, seed=2, dtype=dtype),
            gdn_case(T=9, kind="deep", B=8, ratio=4, gates="fast", pool="high", pool_size=300, seed=3, dtype=dtype),
            gdn_case(T=16, kind="star", B=1, ratio=8, K=24, V=20, gates="fast", pool="last", pool_size=64, seed=5,
                     dtype=dtype),
            gdn_case(T=9, kind="wide", B=3, ratio=1, gates="long", pool="descending", seed=6, dtype=dtype),
            gdn_case(T=5, kind="random", B=1, ratio=1, burst=24, seed=8, dtype=dtype, label="burst of 24 calls"),
        ] + [gdn_case(T=9, kind=("ddtree", 8, 4), B=1, ratio=6 - 4 * i, K=32, V=32, pool="sparse", pool_size=40,
                      seed=9 + i, dtype=d) for i, d in enumerate(other)] + [
            _split("gdn", gdn_case(T=9, kind=("ddtree", 8, 4), B=2, ratio=3, K=32, V=16, seed=12, dtype=dtype))] + [
            gdn_case(T=9, kind=("ddtree", 8, 4), B=2, ratio=2, K=32, V=32, pool="sparse", pool_size=40, seed=13 + i,
                     dtype=dtype, state_dtype=sd) for i, sd in enumerate(STATE_DTYPES)] + [
            _slot_major(gdn_case(T=9, kind=("ddtree", 8, 4), B=2, ratio=2, K=16, V=32, pool="last", pool_size=6,
                                 seed=15, dtype=dtype))]
    assert profile == "serving", profile
    cases, seed = [], 100
    for i, T in enumerate(SERVING_NODES):
        cases.append(gdn_case(T=T, kind=SHAPES[i % len(SHAPES)], B=2, K=64, V=64, seed=seed + i, dtype=dtype))
    for i, (budget, cap) in enumerate([(15, 8), (16, 1), (64, 8), (128, 8), (256, 8), (64, 2), (64, 3), (64, 4),
                                       (64, 5), (64, 6), (64, 7), (16, 8)]):
        cases.append(gdn_case(kind=("ddtree", budget, cap), B=2, K=64, V=64, seed=seed + 30 + i, dtype=dtype))
    for i, (K, V) in enumerate([(16, 16), (32, 32), (64, 64), (128, 128), (128, 64), (64, 128), (96, 80), (24, 40)]):
        cases.append(gdn_case(T=33, kind=("ddtree", 32, 8), B=2, K=K, V=V, seed=seed + 50 + i, dtype=dtype))
    for i, ratio in enumerate((1, 2, 3, 4, 6, 8)):
        cases.append(gdn_case(T=17, kind=("ddtree", 16, 8), B=2, H=2, ratio=ratio, K=128, V=128, seed=seed + 60 + i,
                              dtype=dtype))
    for i, B in enumerate((1, 3, 8, 32)):
        cases.append(gdn_case(T=65, kind=("ddtree", 64, 8), B=B, K=64, V=64, pool="shuffled", pool_size=2 * B + 3,
                              seed=seed + 70 + i, dtype=dtype))
    for i, pool in enumerate(("shuffled", "sparse", "descending", "high", "last")):
        cases.append(gdn_case(T=17, kind="random", B=32, K=16, V=16, pool=pool, pool_size=1024, seed=seed + 80 + i,
                              dtype=dtype))
    for i, gates in enumerate(("fast", "long", "mixed")):
        cases.append(gdn_case(T=65, kind=("ddtree", 64, 8), B=2, K=128, V=128, gates=gates, seed=seed + 90 + i,
                              dtype=dtype))
    for i, d in enumerate(other):
        cases.append(gdn_case(T=65, kind=("ddtree", 64, 8), B=4, ratio=3, K=128, V=128, seed=seed + 95 + i, dtype=d))
    cases += [gdn_case(T=65, kind=("ddtree", 64, 8), B=8, K=128, V=128, burst=24, seed=seed + 99, dtype=dtype,
                       label="burst of 24 calls at 8 x 65, K = V = 128"),
              gdn_case(T=9, kind="random", B=2, burst=48, seed=seed + 98, dtype=dtype, label="burst of 48 calls")]
    # every dimension at once, as a server's layer calls it (an engine may pick another configuration, or grid, only
    # there): Qwen3.6-27B's heads (16 key heads, 48 value heads of 128) at 8 x 65 and 32 x 17
    # q, k and v as its layer hands them over: views of the conv's output (SPLIT), and once at small widths
    cases += [_split("gdn", gdn_case(T=T, kind=("ddtree", T - 1, 8), B=B, pool_size=2 * B + 3, **MODEL_WIDTHS["gdn"],
                                     seed=seed + 110 + i, dtype=dtype,
                                     label=f"Qwen3.6-27B's layer at {B} x {T}, every dimension at once"))
              for i, (B, T) in enumerate(((8, 65), (32, 17)))]
    cases.append(_split("gdn", gdn_case(T=33, kind=("ddtree", 32, 8), B=3, ratio=3, K=64, V=32, seed=seed + 115,
                                        dtype=dtype)))
    # the state pool in 16 bits (STATE_DTYPES): the model's layer in bf16, and once at small widths in fp16
    cases += [gdn_case(T=65, kind=("ddtree", 64, 8), B=8, pool_size=19, **MODEL_WIDTHS["gdn"], seed=seed + 116,
                       dtype=dtype, state_dtype=torch.bfloat16, label="Qwen3.6-27B's layer at 8 x 65"),
              gdn_case(T=33, kind=("ddtree", 32, 8), B=3, ratio=3, K=64, V=32, pool="sparse", pool_size=40,
                       seed=seed + 117, dtype=dtype, state_dtype=torch.float16)]
    # the pool one layer of a slot-major pool (SLOT_MAJOR): the model's layer, and once at small widths
    cases += [_slot_major(gdn_case(T=17, kind=("ddtree", 16, 8), B=4, pool="last", pool_size=9, **MODEL_WIDTHS["gdn"],
                                   seed=seed + 118, dtype=dtype, label="Qwen3.6-27B's layer at 4 x 17")),
              _slot_major(gdn_case(T=33, kind=("ddtree", 32, 8), B=3, ratio=2, K=32, V=64, pool="sparse",
                                   pool_size=40, seed=seed + 119, dtype=dtype))]
    return cases


def conv_case(*, T: int = 17, kind="random", B: int = 2, C: int = 8, W: int = 4, bias: bool = True,
              pool: str = "shuffled", pool_size: int | None = None, dtype=torch.float32, burst: int = 2, seed: int = 0,
              label: str = "", pad: int = 0) -> dict:
    rng, gen, ts, T, _ = _draws(kind, T, B, seed)
    window = torch.randn(B, C, W - 1, generator=gen).to(dtype)
    p, slots = _pool(window, pool, pool_size or B + 3, rng, pad)
    return dict(x=torch.randn(B, T, C, generator=gen).to(dtype), weight=torch.randn(C, W, generator=gen).to(dtype),
                bias=torch.randn(C, generator=gen).to(dtype) if bias else None,
                parents=torch.tensor([t.parents for t in ts]), initial_window=window, pool=p, slots=slots, trees=ts,
                burst=burst, tree=_label(kind), label=label or f"{_label(kind)} T={T} B={B} C={C} W={W} pool {pool} "
                                            f"{str(dtype).removeprefix('torch.')}")


def conv_cases(profile: str, dtype=torch.float32, widths=(2, 3, 4, 5)) -> list[dict]:
    other = [d for d in (torch.float32, torch.bfloat16, torch.float16) if d != dtype]
    W = 4 if 4 in widths else max(widths)
    if profile == "quick":  # sized for Triton's interpreter
        cases = [conv_case(T=129, kind=("ddtree", 128, 4), B=1, C=16, W=W, seed=1, dtype=dtype),
                 conv_case(T=9, kind="deep", B=8, C=1024, W=W, pool="high", pool_size=300, seed=2, dtype=dtype),
                 conv_case(T=17, kind="wide", B=3, C=24, W=W, pool="last", pool_size=64, seed=3, dtype=dtype),
                 conv_case(T=5, kind="random", B=1, C=8, W=W, burst=24, seed=4, dtype=dtype, label="burst of 24 calls")]
        cases += [conv_case(T=9, kind="random", B=2, C=8, W=w, bias=w % 2 == 0, seed=5 + w, dtype=dtype)
                  for w in sorted(widths) if w != W]
        cases += [conv_case(T=9, kind=("ddtree", 8, 4), B=1, C=8, W=W, seed=10 + i, dtype=d) for i, d in enumerate(other)]
        cases.append(_slot_major(conv_case(T=9, kind=("ddtree", 8, 4), B=2, C=16, W=W, pool="last", pool_size=6,
                                           seed=15, dtype=dtype)))
        return cases
    cases, seed = [], 100
    for i, T in enumerate(SERVING_NODES):
        cases.append(conv_case(T=T, kind=SHAPES[i % len(SHAPES)], B=2, C=64, W=W, seed=seed + i, dtype=dtype))
    for i, (budget, cap) in enumerate([(15, 8), (16, 1), (64, 8), (128, 8), (256, 8), (64, 4)]):
        cases.append(conv_case(kind=("ddtree", budget, cap), B=2, C=64, W=W, seed=seed + 30 + i, dtype=dtype))
    cases += [conv_case(T=65, kind=("ddtree", 64, 8), B=2, C=C, W=W, seed=seed + 40 + i, dtype=dtype)
              for i, C in enumerate((1, 130, 2048, 10240))]
    cases += [conv_case(T=33, kind="random", B=2, C=64, W=w, seed=seed + 50 + w, dtype=dtype) for w in sorted(widths)]
    cases += [conv_case(T=65, kind=("ddtree", 64, 8), B=B, C=256, W=W, pool_size=2 * B + 3, seed=seed + 60 + i,
                        dtype=dtype) for i, B in enumerate((1, 3, 8, 32))]
    cases += [conv_case(T=17, kind="random", B=32, C=64, W=W, pool=pool, pool_size=1024, seed=seed + 70 + i, dtype=dtype)
              for i, pool in enumerate(("shuffled", "sparse", "descending", "high", "last"))]
    cases += [conv_case(T=65, kind=("ddtree", 64, 8), B=4, C=256, W=W, seed=seed + 80 + i, dtype=d)
              for i, d in enumerate(other)]
    cases.append(conv_case(T=65, kind=("ddtree", 64, 8), B=8, C=2048, W=W, burst=24, seed=seed + 90, dtype=dtype,
                           label="burst of 24 calls at 8 x 65, C = 2048"))
    # every dimension at once: Qwen3.6-27B's conv channels (q, k and v: 2 x 16 x 128 + 48 x 128) at 8 x 65
    cases.append(conv_case(T=65, kind=("ddtree", 64, 8), B=8, C=10240, W=W, pool_size=19, seed=seed + 95, dtype=dtype,
                           label="Qwen3.6-27B's conv at 8 x 65, every dimension at once"))
    # its window pool one layer of a slot-major pool (SLOT_MAJOR): the model's channels, and once at small widths
    cases += [_slot_major(conv_case(T=17, kind=("ddtree", 16, 8), B=4, C=10240, W=W, pool="last", pool_size=9,
                                    seed=seed + 96, dtype=dtype, label="Qwen3.6-27B's conv at 4 x 17")),
              _slot_major(conv_case(T=33, kind=("ddtree", 32, 8), B=3, C=64, W=W, pool="sparse", pool_size=40,
                                    seed=seed + 97, dtype=dtype))]
    return cases


def mamba2_case(*, T: int = 17, kind="random", B: int = 2, G: int = 1, ratio: int = 2, P: int = 8, N: int = 16,
                decay: str = "mixed", pool: str = "shuffled", pool_size: int | None = None, dtype=torch.float32,
                burst: int = 2, seed: int = 0, label: str = "", pad: int = 0, state_dtype=torch.float32) -> dict:
    """An engine's Mamba2 contract: softplus always, no dt limit; A < 0 ("fast": |A| up to 16 with large
    steps, "long": |A| near 1e-3, "mixed"); D and dt_bias given."""
    rng, gen, ts, T, rnd = _draws(kind, T, B, seed)
    H = G * ratio
    scale = {"fast": 16.0, "long": 1e-3, "mixed": 4.0}[decay]
    A = -(torch.rand(H, generator=gen, dtype=torch.float64) * scale + 1e-4)
    dt = rnd(B, T, H) + (3.0 if decay == "fast" else 0.0)
    state = rnd(B, H, P, N).to(state_dtype)
    p, slots = _pool(state, pool, pool_size or B + 3, rng, pad)
    return dict(x=rnd(B, T, H, P).to(dtype), dt=dt.to(dtype), A=A.float(), B=rnd(B, T, G, N).to(dtype),
                C=rnd(B, T, G, N).to(dtype), D=rnd(H).float(), dt_bias=rnd(H).float(), dt_softplus=True,
                dt_limit=(0.0, float("inf")), parents=torch.tensor([t.parents for t in ts]), initial_state=state,
                pool=p, slots=slots, trees=ts, burst=burst, tree=_label(kind),
                label=_pool_label(label or f"{_label(kind)} T={T} B={B} G={G} H={H} P={P} N={N} decay {decay} "
                                           f"pool {pool} {str(dtype).removeprefix('torch.')}", state_dtype))


def mamba2_cases(profile: str, dtype=torch.float32) -> list[dict]:
    other = [d for d in (torch.float32, torch.bfloat16, torch.float16) if d != dtype]
    if profile == "quick":  # sized for Triton's interpreter
        return [mamba2_case(T=17, kind=("ddtree", 16, 8), B=1, G=1, ratio=1, P=64, N=128, seed=1, dtype=dtype),
                mamba2_case(T=129, kind=("ddtree", 128, 4), B=1, ratio=1, seed=2, dtype=dtype),
                mamba2_case(T=9, kind="deep", B=8, G=1, ratio=4, decay="fast", pool="high", pool_size=300, seed=3,
                            dtype=dtype),
                mamba2_case(T=16, kind="star", B=1, G=2, ratio=4, P=6, N=10, decay="long", pool="last", pool_size=64,
                            seed=4, dtype=dtype),
                mamba2_case(T=9, kind="wide", B=3, G=1, ratio=1, pool="descending", seed=5, dtype=dtype),
                mamba2_case(T=5, kind="random", B=1, ratio=1, burst=24, seed=6, dtype=dtype, label="burst of 24 calls")] + [
            mamba2_case(T=9, kind=("ddtree", 8, 4), B=1, G=1, ratio=2, seed=7 + i, dtype=d) for i, d in enumerate(other)] + [
            _split("mamba2", mamba2_case(T=9, kind=("ddtree", 8, 4), B=2, G=2, ratio=2, P=16, N=8, seed=12, dtype=dtype))] + [
            mamba2_case(T=9, kind=("ddtree", 8, 4), B=2, G=1, ratio=2, P=16, N=32, pool="sparse", pool_size=40,
                        seed=13 + i, dtype=dtype, state_dtype=sd) for i, sd in enumerate(STATE_DTYPES)] + [
            _slot_major(mamba2_case(T=9, kind=("ddtree", 8, 4), B=2, G=1, ratio=2, P=8, N=16, pool="last",
                                    pool_size=6, seed=15, dtype=dtype))]
    cases, seed = [], 100
    for i, T in enumerate(SERVING_NODES):
        cases.append(mamba2_case(T=T, kind=SHAPES[i % len(SHAPES)], B=2, P=32, N=64, seed=seed + i, dtype=dtype))
    for i, (budget, cap) in enumerate([(15, 8), (16, 1), (64, 8), (128, 8), (256, 8), (64, 4)]):
        cases.append(mamba2_case(kind=("ddtree", budget, cap), B=2, P=32, N=64, seed=seed + 30 + i, dtype=dtype))
    for i, (G, ratio, P, N) in enumerate([(1, 8, 64, 128), (8, 2, 64, 128), (2, 4, 64, 64), (1, 1, 80, 96),
                                          (4, 6, 16, 32), (1, 3, 64, 128)]):
        cases.append(mamba2_case(T=33, kind=("ddtree", 32, 8), B=2, G=G, ratio=ratio, P=P, N=N, seed=seed + 40 + i,
                                 dtype=dtype))
    cases += [mamba2_case(T=65, kind=("ddtree", 64, 8), B=B, P=32, N=64, pool_size=2 * B + 3, seed=seed + 50 + i,
                          dtype=dtype) for i, B in enumerate((1, 3, 8, 32))]
    cases += [mamba2_case(T=17, kind="random", B=32, P=8, N=16, pool=pool, pool_size=1024, seed=seed + 60 + i,
                          dtype=dtype) for i, pool in enumerate(("shuffled", "sparse", "descending", "high", "last"))]
    cases += [mamba2_case(T=65, kind=("ddtree", 64, 8), B=2, P=64, N=128, decay=d, seed=seed + 70 + i, dtype=dtype)
              for i, d in enumerate(("fast", "long", "mixed"))]
    cases += [mamba2_case(T=65, kind=("ddtree", 64, 8), B=4, P=64, N=128, seed=seed + 80 + i, dtype=d)
              for i, d in enumerate(other)]
    cases.append(mamba2_case(T=65, kind=("ddtree", 64, 8), B=8, ratio=8, P=64, N=128, burst=24, seed=seed + 90,
                             dtype=dtype, label="burst of 24 calls at 8 x 65"))
    # every dimension at once (the tree at budget 32: the oracle replays each leaky node's batch-order history):
    # Nemotron-H-8B's 128 heads in 8 groups, P = 64, N = 128, at 8 x 33
    # x, B and C as its layer hands them over: views of the conv's output xBC (SPLIT), and once at small widths
    cases.append(_split("mamba2", mamba2_case(T=33, kind=("ddtree", 32, 8), B=8, pool_size=19, **MODEL_WIDTHS["mamba2"],
                                              seed=seed + 95, dtype=dtype,
                                              label="Nemotron-H-8B's layer at 8 x 33, every dimension at once")))
    cases.append(_split("mamba2", mamba2_case(T=33, kind=("ddtree", 32, 8), B=3, G=2, ratio=2, P=32, N=16,
                                              seed=seed + 96, dtype=dtype)))
    # the state pool in 16 bits (STATE_DTYPES): the model's layer in bf16, and once at small widths in fp16
    cases += [mamba2_case(T=33, kind=("ddtree", 32, 8), B=8, pool_size=19, **MODEL_WIDTHS["mamba2"], seed=seed + 97,
                          dtype=dtype, state_dtype=torch.bfloat16, label="Nemotron-H-8B's layer at 8 x 33"),
              mamba2_case(T=33, kind=("ddtree", 32, 8), B=3, G=2, ratio=2, P=32, N=16, pool="sparse", pool_size=40,
                          seed=seed + 98, dtype=dtype, state_dtype=torch.float16)]
    # the pool one layer of a slot-major pool (SLOT_MAJOR): the model's layer, and once at small widths
    cases += [_slot_major(mamba2_case(T=17, kind=("ddtree", 16, 8), B=4, pool="last", pool_size=9,
                                      **MODEL_WIDTHS["mamba2"], seed=seed + 99, dtype=dtype,
                                      label="Nemotron-H-8B's layer at 4 x 17")),
              _slot_major(mamba2_case(T=33, kind=("ddtree", 32, 8), B=3, G=2, ratio=2, P=32, N=16, pool="sparse",
                                      pool_size=40, seed=seed + 100, dtype=dtype))]
    return cases


def kda_case(*, T: int = 17, kind="random", B: int = 2, H: int = 2, K: int = 16, memory: str = "mixed",
             pool: str = "shuffled", pool_size: int | None = None, dtype=torch.float32, burst: int = 2, seed: int = 0,
             label: str = "", pad: int = 0, state_dtype=torch.float32) -> dict:
    """An engine's KDA contract: H heads of K = V dims, the log decay per key channel g [B, T, H, K] (from fast
    forgetting to long memory, as the GDN examples' gates), beta [B, T, H] with exact 0 and 1 among them."""
    rng, gen, ts, T, rnd = _draws(kind, T, B, seed)
    g, _ = _gates(memory, (B, T, H, K), gen)
    _, beta = _gates(memory, (B, T, H), gen)
    state = rnd(B, H, K, K).to(state_dtype)
    p, slots = _pool(state, pool, pool_size or B + 3, rng, pad)
    return dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, H, K).to(dtype),
                g=g.float(), beta=beta.float(), parents=torch.tensor([t.parents for t in ts]), initial_state=state,
                trees=ts, pool=p, slots=slots, burst=burst, tree=_label(kind),
                label=_pool_label(label or f"{_label(kind)} T={T} B={B} H={H} K=V={K} gates {memory} pool {pool} "
                                           f"{str(dtype).removeprefix('torch.')}", state_dtype))


def kda_cases(profile: str, dtype=torch.float32) -> list[dict]:
    """The explicit KDA examples of a profile: Kimi Linear's heads (K = V = 128, 32 of them) among them."""
    return _head_cases(kda_case, "kda", profile, dtype, deep_heads=2, wide_heads=32)


def _decays(kind: str, H: int, gen: torch.Generator) -> torch.Tensor:
    """[H] float32 per-head decays in (0, 1]: "fast" from e^-8 to e^-0.5, "long" within 1e-3 of 1, "mixed" both, with
    exactly 1 (no decay: MiniMax's last layers come close) among them."""
    u = torch.rand(H, generator=gen, dtype=torch.float64)
    slope = {"fast": 0.5 + 7.5 * u, "long": 1e-3 * u}.get(kind, torch.where(u < 0.5, 8.0 * u, 2e-3 * u))
    d = torch.exp(-slope)
    d[::3] = 1.0
    return d.float()


def lightning_case(*, T: int = 17, kind="random", B: int = 2, H: int = 2, K: int = 16, memory: str = "mixed",
                   pool: str = "shuffled", pool_size: int | None = None, dtype=torch.float32, burst: int = 2, seed: int = 0,
                   label: str = "", pad: int = 0, state_dtype=torch.float32) -> dict:
    """An engine's lightning-attention contract: H heads of K = V dims (q and k scaled down: the state is a running
    sum), a constant decay per head."""
    rng, gen, ts, T, rnd = _draws(kind, T, B, seed)
    state = rnd(B, H, K, K).to(state_dtype)
    p, slots = _pool(state, pool, pool_size or B + 3, rng, pad)
    s = K ** -0.5
    return dict(q=(rnd(B, T, H, K) * s).to(dtype), k=(rnd(B, T, H, K) * s).to(dtype), v=rnd(B, T, H, K).to(dtype),
                decay=_decays(memory, H, gen), parents=torch.tensor([t.parents for t in ts]), initial_state=state,
                trees=ts, pool=p, slots=slots, burst=burst, tree=_label(kind),
                label=_pool_label(label or f"{_label(kind)} T={T} B={B} H={H} K=V={K} decay {memory} pool {pool} "
                                           f"{str(dtype).removeprefix('torch.')}", state_dtype))


def lightning_cases(profile: str, dtype=torch.float32) -> list[dict]:
    """The explicit lightning-attention examples of a profile: MiniMax's heads (K = V = 128, 64 of them) among them."""
    return _head_cases(lightning_case, "lightning", profile, dtype, deep_heads=3, wide_heads=64)


def _head_cases(case, op: str, profile: str, dtype, *, deep_heads: int, wide_heads: int) -> list[dict]:
    """The explicit examples of an op of H heads of K = V dims with a memory setting (KDA's gates, lightning
    attention's decays): ``case`` builds one of ``op``; the quick profile's deep tree has ``deep_heads`` heads, the
    serving profile's widest example the model's ``wide_heads`` heads of 128 (q, k, v split from one projection)."""
    other = [d for d in (torch.float32, torch.bfloat16, torch.float16) if d != dtype]
    if profile == "quick":  # sized for Triton's interpreter
        return [case(T=17, kind=("ddtree", 16, 8), B=1, H=1, K=128, seed=1, dtype=dtype),
                case(T=129, kind=("ddtree", 128, 4), B=1, H=1, seed=2, dtype=dtype),
                case(T=9, kind="deep", B=8, H=deep_heads, K=8, memory="fast", pool="high", pool_size=300, seed=3,
                     dtype=dtype),
                case(T=16, kind="star", B=1, H=3, K=24, memory="long", pool="last", pool_size=64, seed=4, dtype=dtype),
                case(T=9, kind="wide", B=3, H=1, pool="descending", seed=5, dtype=dtype),
                case(T=5, kind="random", B=1, H=1, burst=24, seed=6, dtype=dtype, label="burst of 24 calls")] + [
            case(T=9, kind=("ddtree", 8, 4), B=1, H=2, K=32, pool="sparse", pool_size=40, seed=7 + i, dtype=d)
            for i, d in enumerate(other)] + [_split(op, case(T=9, kind=("ddtree", 8, 4), B=2, H=2, K=16, seed=12,
                                                             dtype=dtype))] + [
            case(T=9, kind=("ddtree", 8, 4), B=2, H=2, K=16, pool="sparse", pool_size=40, seed=13 + i, dtype=dtype,
                 state_dtype=sd) for i, sd in enumerate(STATE_DTYPES)] + [
            _slot_major(case(T=9, kind=("ddtree", 8, 4), B=2, H=2, K=16, pool="last", pool_size=6, seed=15,
                             dtype=dtype))]
    assert profile == "serving", profile
    cases, seed = [], 100
    for i, T in enumerate(SERVING_NODES):
        cases.append(case(T=T, kind=SHAPES[i % len(SHAPES)], B=2, K=64, seed=seed + i, dtype=dtype))
    for i, (budget, cap) in enumerate([(15, 8), (16, 1), (64, 8), (128, 8), (256, 8), (64, 4)]):
        cases.append(case(kind=("ddtree", budget, cap), B=2, K=64, seed=seed + 30 + i, dtype=dtype))
    for i, (H, K) in enumerate([(2, 16), (2, 32), (2, 128), (4, 96), (2, 24), (wide_heads, 128)]):
        wide = H == wide_heads
        cases.append(case(T=17 if wide else 33, kind=("ddtree", 32, 8), B=1 if wide else 2, H=H, K=K, seed=seed + 40 + i,
                          dtype=dtype))
    cases += [case(T=65, kind=("ddtree", 64, 8), B=B, K=64, pool_size=2 * B + 3, seed=seed + 50 + i, dtype=dtype)
              for i, B in enumerate((1, 3, 8, 32))]
    cases += [case(T=17, kind="random", B=32, K=16, pool=pool, pool_size=1024, seed=seed + 60 + i, dtype=dtype)
              for i, pool in enumerate(("shuffled", "sparse", "descending", "high", "last"))]
    cases += [case(T=65, kind=("ddtree", 64, 8), B=2, K=128, memory=m, seed=seed + 70 + i, dtype=dtype)
              for i, m in enumerate(("fast", "long", "mixed"))]
    cases += [case(T=65, kind=("ddtree", 64, 8), B=4, K=128, seed=seed + 80 + i, dtype=d) for i, d in enumerate(other)]
    cases.append(case(T=65, kind=("ddtree", 64, 8), B=8, K=128, burst=24, seed=seed + 90, dtype=dtype,
                      label="burst of 24 calls at 8 x 65, K = V = 128"))
    # every dimension at once (the tree at budget 32, as Mamba2's): the model's heads at 8 x 33
    cases.append(_split(op, case(T=33, kind=("ddtree", 32, 8), B=8, H=wide_heads, K=128, pool_size=19, seed=seed + 95,
                                 dtype=dtype, label=f"{wide_heads} heads of 128 at 8 x 33, every dimension at once")))
    cases.append(_split(op, case(T=33, kind=("ddtree", 32, 8), B=3, H=2, K=32, seed=seed + 96, dtype=dtype)))
    # the state pool in 16 bits (STATE_DTYPES): the model's heads in bf16, and once at small widths in fp16
    cases += [case(T=33, kind=("ddtree", 32, 8), B=8, H=wide_heads, K=128, pool_size=19, seed=seed + 97, dtype=dtype,
                   state_dtype=torch.bfloat16, label=f"{wide_heads} heads of 128 at 8 x 33"),
              case(T=33, kind=("ddtree", 32, 8), B=3, H=2, K=32, pool="sparse", pool_size=40, seed=seed + 98,
                   dtype=dtype, state_dtype=torch.float16)]
    # the pool one layer of a slot-major pool (SLOT_MAJOR): the model's heads, and once at small widths
    cases += [_slot_major(case(T=17, kind=("ddtree", 16, 8), B=4, H=wide_heads, K=128, pool="last", pool_size=9,
                               seed=seed + 99, dtype=dtype, label=f"{wide_heads} heads of 128 at 4 x 17")),
              _slot_major(case(T=33, kind=("ddtree", 32, 8), B=3, H=2, K=32, pool="sparse", pool_size=40,
                               seed=seed + 100, dtype=dtype))]
    return cases


def padded_cases(op: str, profile: str, dtype=torch.float32, widths=(2, 3, 4, 5)) -> list[dict]:
    """Batches padded as a CUDA-graph replay pads them (SGLang: the last rows' slots PAD_SLOT): the real sequences
    with one in the pool's last slot, so a kernel that takes -1 as the last slot (Python's indexing) reads or writes
    a real sequence's state, and one that adds -1 times a slot's stride to the pool's address lands in the guard
    slot check-kernel keeps before the pool. quick: 2 of 4 rows padded; serving: 3 of 8 in a pool of 1024 slots at
    the widths models use, and a batch of one sequence padded to two."""
    if profile == "quick":
        shapes = [dict(T=9, kind=("ddtree", 8, 4), B=4, pad=2, pool_size=40, seed=20)]
    else:
        shapes = [dict(T=17, kind=("ddtree", 16, 8), B=8, pad=3, pool_size=1024, seed=120, wide=True),
                  dict(T=65, kind=("ddtree", 64, 8), B=2, pad=1, pool_size=8, seed=121)]
    out = []
    for sh in shapes:
        wide = sh.pop("wide", False)
        label = (f"padded batch: {sh['B'] - sh['pad']} sequences and {sh['pad']} padded rows (slot {PAD_SLOT}) at "
                 f"{sh['B']} x {sh['T']}")
        out.append(_op_case(op, wide, widths)(**sh, pool="last", dtype=dtype, label=label))
    return out


def _op_case(op: str, wide: bool, widths=(2, 3, 4, 5)):
    """The op's case function with its widths bound: a server's (wide) or small ones."""
    if op == "gdn":
        return functools.partial(gdn_case, ratio=2, K=128 if wide else 32, V=128 if wide else 32)
    if op == "conv":
        return functools.partial(conv_case, C=256 if wide else 16, W=4 if 4 in widths else max(widths))
    if op == "mamba2":
        return functools.partial(mamba2_case, P=64 if wide else 8, N=128 if wide else 16)
    return functools.partial({"kda": kda_case, "lightning": lightning_case}[op], K=128 if wide else 16)


def replayed(case, op: str, **kw) -> dict:
    """``case(**kw)`` judged as a server's CUDA graph runs it (check_kernel._calls, graphs): the kernel is first
    launched on another step, ``replay``, of the same shapes and layouts, and then on the example's values in that
    step's tensors. The other step is a chain of the example's size (the example's trees branch), with other values,
    other slots (descending) and no padded rows (a server captures its graph once, on a step of its own). Both hand
    their SPLIT inputs over as views of one fused projection, as a server's graph holds its layer's projection."""
    inp = case(**kw)
    T = int(inp["parents"].shape[1])
    other = case(**{**kw, "T": T, "kind": "chain", "seed": kw.get("seed", 0) + 1000, "pool": "descending", "pad": 0,
                    "label": "the step the launch was kept on"})
    if op in SPLIT:
        inp, other = _split(op, inp), _split(op, other)
    inp["replay"] = other
    inp["label"] += ", replayed on a chain step's launch"
    return inp


def replay_cases(op: str, profile: str, dtype=torch.float32, pads: bool = False, widths=(2, 3, 4, 5)) -> list[dict]:
    """The examples judged on a replayed launch (replayed): quick, one at small widths at 4 x 9 (2 rows padded where
    the convention pads); serving, one at a server's widths at 8 x 17 in a pool of 1024 slots (3 rows padded where it
    pads)."""
    if profile == "quick":
        sh = dict(T=9, kind="wide", B=4, pad=2 if pads else 0, pool_size=40, seed=40)
    else:
        sh = dict(T=17, kind=("ddtree", 16, 8), B=8, pad=3 if pads else 0, pool_size=1024, seed=140)
    label = f"a step at {sh['B']} x {sh['T']}" + (f", {sh['pad']} rows padded" if sh["pad"] else "")
    return [replayed(_op_case(op, profile == "serving", widths), op, **sh, pool="shuffled", dtype=dtype, label=label)]


# Where the per-node state buffer puts a sequence's node states, for a kernel that keeps them (SGLang's exact verify:
# intermediate_states_buffer, rows intermediate_state_indices): the examples take these in turn. "batch rows": row b
# for sequence b in a buffer of B rows of T steps (SGLang's indices, arange); "shuffled rows": distinct rows in any
# order among 2 B + 3, each of T + 5 steps; "draft-budget pitch": rows of max(T, 65) steps (a buffer sized for
# the largest draft, SGLang's adaptive drafts keep that pitch in stride(0)), the rows descending
NODE_LAYOUTS = ("batch rows", "shuffled rows", "draft-budget pitch")


def node_layout(inp: dict, kind: str, seed: int) -> dict:
    """The example's per-node state buffer layout of ``kind`` (NODE_LAYOUTS): node_rows [B] int32, node_buffer
    (rows M, pitch P)."""
    B, T = inp["parents"].shape
    if kind == "batch rows":
        rows, M, P = list(range(B)), B, T
    elif kind == "shuffled rows":
        M, P = 2 * B + 3, T + 5
        rows = np.random.default_rng(seed).choice(M, B, replace=False).tolist()
    else:
        M, P = B + 2, max(T, 65)
        rows = list(range(M - 1, M - 1 - B, -1))
    return {"node_rows": torch.tensor(rows, dtype=torch.int32), "node_buffer": (M, P), "node_layout": kind}


# elements at which a 32-bit signed offset wraps
INT32_OFFSETS = 2 ** 31


# a model's layer of each op, every width at once: Qwen3.6-27B's GDN heads (16 key and 48 value heads of 128), Kimi
# Linear's KDA heads (32 of 128), Nemotron-H-8B's Mamba2 heads (128 in 8 groups, P = 64, N = 128); and the elements
# of one of its states
MODEL_WIDTHS = {"gdn": dict(H=16, ratio=3, K=128, V=128), "kda": dict(H=32, K=128),
                "mamba2": dict(G=8, ratio=16, P=64, N=128)}
MODEL_STATE = {"gdn": 48 * 128 * 128, "kda": 32 * 128 * 128, "mamba2": 128 * 64 * 128}


def _model_layer(op: str, **kw) -> dict:
    """The op's example (gdn_case, kda_case, mamba2_case with ``kw``) at its model's widths (MODEL_WIDTHS)."""
    return {"gdn": gdn_case, "kda": kda_case, "mamba2": mamba2_case}[op](**kw, **MODEL_WIDTHS[op])


def wide_node_buffer(op: str, dtype=torch.float32) -> dict:
    """A model's layer at 2 x 65 whose node states lie past 2^31 elements into their buffer (the batch in its last
    two rows, 65 steps a row, as a server's buffer for 40-odd requests at budget 64 is): a kernel that computes the
    buffer's offsets in 32-bit integers writes, and reads its parents' states, elsewhere. Several GB: serving profile
    only (its buffer is allocated on the GPU)."""
    inp = _model_layer(op, T=65, kind=("ddtree", 64, 8), B=2, pool_size=4, seed=130, dtype=dtype)
    per_row = 65 * inp["initial_state"][0].numel()
    M = -(-INT32_OFFSETS // per_row) + 2  # the last row starts past 2^31 elements
    # its commit (where the kernel has one) copies this one layer: two would double a buffer of several GB
    inp.update(node_rows=torch.tensor([M - 2, M - 1], dtype=torch.int32), node_buffer=(M, 65),
               node_layout="past 2^31 elements", commit_layers=1,
               label=f"node states past 2^31 elements: a model's layer at 2 x 65 in rows {M - 2}, {M - 1} of {M}")
    return inp


# a model's recurrent layers of each op, as its engine commits them at once: Qwen3.6-27B's 48 GDN layers (of 64),
# Kimi Linear 48B's 20 KDA layers (of 27), Nemotron-H-8B's 24 Mamba2 layers (of 52)
MODEL_LAYERS = {"gdn": 48, "kda": 20, "mamba2": 24}


def wide_commit(op: str, dtype=torch.float32) -> dict:
    """A step of 2 sequences at 17 nodes whose commit copies a model's every layer at once (MODEL_LAYERS, each at the
    model's width): its pool [L, N, ...] and its kept states [L, M, 17, ...] sized so that the last layers' entries lie
    past 2^31 elements, where a commit that computes its offsets in 32-bit integers copies from, and into, other
    entries. About 22 GB: serving profile only (on the GPU)."""
    L, per = MODEL_LAYERS[op], MODEL_STATE[op]
    N = -(-INT32_OFFSETS // ((L - 1) * per)) + 1  # the last layer's slots start past 2^31 elements
    inp = _model_layer(op, T=17, kind=("ddtree", 16, 8), B=2, seed=131, dtype=dtype, pool_size=N)
    assert inp["initial_state"][0].numel() == per
    M = -(-INT32_OFFSETS // ((L - 1) * 17 * per)) + 1  # and the last layer's rows
    inp.update(node_rows=torch.tensor([M - 1, M - 2], dtype=torch.int32), node_buffer=(M, 17), node_layout="batch rows",
               commit_layers=L,
               label=f"a commit of {L} layers past 2^31 elements: pools of {N} slots, kept states in rows {M - 1}, "
                     f"{M - 2} of {M} at 2 x 17")
    return inp


def cases(op: str, profile: str, dtype=torch.float32, pads: bool = False, nodes: bool = False, commit: bool = False,
          **kw) -> list[dict]:
    """The profile's explicit examples of ``op``, with padded batches (padded_cases) where the kernel's convention
    takes padding (``pads``), a step replayed on another step's launch (replay_cases), and for a kernel that keeps
    every node's state (``nodes``) each example's per-node state buffer layout (NODE_LAYOUTS in turn; the replayed
    step's shuffled rows) and, in the serving profile, a buffer whose node states lie past 2^31 elements
    (wide_node_buffer), and for one that commits them too (``commit``) a commit of a model's every layer past 2^31
    elements (wide_commit). In the quick profile every example but the bursts is called once:
    Triton's interpreter runs a launch's programs one after another, so a second call on the same input can
    differ only through the call count, and the burst examples' repeated calls check that."""
    out = {"gdn": gdn_cases, "conv": conv_cases, "mamba2": mamba2_cases, "kda": kda_cases,
           "lightning": lightning_cases}[op](profile, dtype, **kw)
    if pads:
        out += padded_cases(op, profile, dtype, **kw)
    out += replay_cases(op, profile, dtype, pads, **kw)
    if nodes:
        for i, inp in enumerate(out):
            # a replayed example's steps: one buffer, each step's requests at rows of their own (shuffled rows)
            kind = "shuffled rows" if "replay" in inp else NODE_LAYOUTS[i % len(NODE_LAYOUTS)]
            inp.update(node_layout(inp, kind, seed=1000 + i))
            if "replay" in inp:
                inp["replay"].update(node_layout(inp["replay"], kind, seed=2000 + i))
        if profile == "serving" and op in ("gdn", "kda", "mamba2"):
            out.append(wide_node_buffer(op, dtype))
            if commit:
                out.append(wide_commit(op, dtype))
    if profile == "quick":
        for inp in out:
            if inp["burst"] == 2:  # the default: not a burst example
                inp["burst"] = 1
    return out


def describe(inp: dict, commit: bool = False) -> dict:
    """The dimensions an example covers, for the coverage table (with ``commit``, its commit's layers and sizes)."""
    trees = inp["trees"]
    out = {"nodes": trees[0].size, "batch": len(trees), "padded rows": int((inp["slots"] < 0).sum()),
           "pool slots": int(inp["pool"].shape[0]), "largest slot id": int(inp["slots"].max()),
           "dtype": str(_first_input(inp).dtype).removeprefix("torch."),
           "tree": inp.get("tree", "drawn"),
           "not order-exact nodes total": int(sum(int((~t.order_exact).sum()) for t in trees))}
    if "decay" in inp:  # lightning attention
        H, K = inp["q"].shape[2:]
        out.update({"K": K, "V": int(inp["v"].shape[3]), "H": H, "decay min": float(inp["decay"].min()),
                    "decay max": float(inp["decay"].max())})
    elif "q" in inp:
        H, K = inp["q"].shape[2:]
        HV, V = inp["v"].shape[2:]
        g = inp["g"].double()
        out.update({"K": K, "V": V, "HV/H" if g.dim() == 3 else "H": HV // H if g.dim() == 3 else H,
                    **({"HV": HV} if g.dim() == 3 else {}),
                    "g min": float(g.min()), "g max": float(g.max()),
                    "beta min": float(inp["beta"].min()), "beta max": float(inp["beta"].max())})
    elif "dt" in inp:
        H, P = inp["x"].shape[2:]
        G, N = inp["B"].shape[2:]
        out.update({"H": H, "H/G": H // G, "P": P, "N": N, "A min": float(inp["A"].min()), "A max": float(inp["A"].max())})
    else:
        out.update({"C": int(inp["x"].shape[2]), "W": int(inp["weight"].shape[1])})
    if "initial_state" in inp:  # a recurrence's state pool (the conv's window pool is in its input's dtype)
        out["state pool dtype"] = str(inp["pool"].dtype).removeprefix("torch.")
    out["state pool layout"] = (f"layer {inp['pool_layers'][0]} of {inp['pool_layers'][1]} slot-major"
                                if "pool_layers" in inp else "one layer")
    out["calls"] = max(1, int(inp.get("burst", 2)))
    out["engine launch"] = "replayed on another step's" if "replay" in inp else "fresh each call"
    if "x" not in inp or "dt" in inp:  # the conv takes one input: its layout is its contract's
        out["input layout"] = "views of one projection" if inp.get("split") else "contiguous"
    if "node_buffer" in inp:  # a kernel that keeps every node's state: where its buffer puts them
        M, P = inp["node_buffer"]
        state = inp["initial_state"] if "initial_state" in inp else inp["initial_window"]
        out.update({"node-state layout": inp["node_layout"], "node-state pitch past T max": P - trees[0].size,
                    "node-state buffer elements max": M * P * state[0].numel()})
        if commit:  # and a commit copies them, every layer at once (check_kernel.COMMIT_LAYERS where not said)
            L = int(inp.get("commit_layers", 2))
            out.update({"commit layers": L, "commit pool elements max": L * inp["pool"].numel(),
                        "commit buffer elements max": L * M * P * state[0].numel()})
    return out


def _first_input(inp: dict) -> torch.Tensor:
    return inp["q"] if "q" in inp else inp["x"]
