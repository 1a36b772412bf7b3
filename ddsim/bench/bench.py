"""Verify-throughput benchmark of the pure-torch fast path and the oracle (trees per second)."""
from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ddsim import oracle
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree
from ddsim.trees.modes import VERIFY_MODES


def cuda_header(commit: str) -> str:
    """The first line of a CUDA benchmark's output: the date, the device, torch, Triton, Python and the commit."""
    import triton
    return (f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.get_device_name()} | torch {torch.__version__} | "
            f"triton {triton.__version__} | python {platform.python_version()} | commit {commit}")


def _checkout() -> str:
    """ddsim's version and the commit of the checkout it runs from (the package's own directory, wherever the command
    is run; "commit ?" where that is not a git checkout)."""
    import ddsim
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30,
                                cwd=Path(ddsim.__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"ddsim {ddsim.__version__} | commit {commit or '?'}"


def mode_table(*, preset: str = "tiny", repeats: int = 5, prefix: int = 64, device: str = "cpu",
               budgets=(16, 32, 64)) -> str:
    cfg = get_preset(preset)
    w = init_weights(cfg, seed=0)
    m = HybridModel(cfg, w, device=device)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, prefix).tolist()
    state, _ = m.prefill(prompt)
    ostate, _ = oracle.prefill(w, cfg, prompt)
    lines = [f"# {time.strftime('%Y-%m-%d')} | {platform.machine()} | device {device} | torch {torch.__version__} | "
             f"threads {torch.get_num_threads()} | {_checkout()} | preset {cfg.name}",
             "| budget | nodes | " + " | ".join(VERIFY_MODES) + " | oracle |",
             "|---|---|" + "---|" * (len(VERIFY_MODES) + 1)]
    for budget in budgets:
        gen = torch.Generator().manual_seed(budget)
        tree = ddtree(torch.randn(8, cfg.vocab_size, generator=gen) * 3, budget)
        cells = []
        for mode in VERIFY_MODES:
            m.verify(state, tree, mode=mode)  # warm-up
            if m.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(repeats):
                m.verify(state, tree, mode=mode)
            if m.device.type == "cuda":
                torch.cuda.synchronize()
            cells.append(repeats / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        oracle.verify_tree(w, cfg, ostate, tree.parents, tree.tokens)
        cells.append(1.0 / (time.perf_counter() - t0))
        lines.append(f"| {budget} | {tree.size} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    lines.append("(trees per second)")
    return "\n".join(lines)


# ---- GDN kernels on CUDA --------------------------------------------------------------------------
KERNEL_SHAPES = ((1, 16), (1, 65), (8, 65), (32, 65))  # (sequences, nodes)


def copy_bandwidth(device, nbytes: int = 2 << 30) -> float:
    """Device copy bandwidth in bytes/s, counting bytes read and written."""
    import triton.testing
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=10, rep=50, return_mode="median")
    return 2 * nbytes / (ms * 1e-3)


def parse_shapes(ap, text: str) -> list[tuple[int, int]]:
    """A bench's --shapes "BxT,BxT,..." as [(B, T), ...], B >= 1 and T >= 2; anything else is refused
    through ``ap.error`` (argparse's one line, exit 2) before any work."""
    try:
        shapes = [tuple(int(x) for x in s.split("x")) for s in text.split(",")]
    except ValueError:
        ap.error(f"--shapes {text!r}: expected BxT,BxT,...")
    if any(len(s) != 2 or s[0] < 1 or s[1] < 2 for s in shapes):
        ap.error(f"--shapes {text!r}: expected BxT,BxT,... with B >= 1, T >= 2")
    return shapes


def parse_shape(ap, text: str) -> tuple[int, int]:
    """A bench's --shape "BxT", one shape, as (B, T); anything else (parse_shapes' refusals, or several shapes) is
    refused through ``ap.error`` before any work."""
    shapes = parse_shapes(ap, text)
    if len(shapes) != 1:
        ap.error(f"--shape {text!r}: expected one shape")
    return shapes[0]


def at_least_one(ap, a, *names: str) -> None:
    """Refuse, through ``ap.error`` before any work, any of the parsed options ``names`` (attribute names of ``a``,
    counts such as calls, rounds, layers) below 1."""
    for name in names:
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected 1 or more, got {getattr(a, name)}")


def triton_tool(name: str) -> str:
    """The path of one of the NVIDIA tools Triton bundles (cuobjdump, nvdisasm, ptxas): they read a compiled
    kernel's cubin on a machine without a GPU."""
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def on_cubin(ck, *commands: list) -> list[str]:
    """The output of each command (a tool and its flags) run on Triton's compiled kernel ck's cubin, in order."""
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        return [subprocess.run([*c, f.name], capture_output=True, text=True, check=True).stdout for c in commands]


# Triton's name of each tensor dtype in a kernel signature
TRITON_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int8: "i8",
                 torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}


def compile_kernel(kernel, kw: dict, target, *, types: dict | None = None):
    """``kernel`` (a @triton.jit function) compiled by Triton for ``target`` (a GPUTarget) with a launch's keyword
    arguments ``kw`` (its arguments, and num_warps / num_stages / maxnreg / enable_fp_fusion where given), without a
    GPU, specialized as Triton's launcher specializes that launch (launch_specialization): an int argument equal to 1
    compiled as a constant, ints and pointers divisible by 16 so hinted, unless the kernel's do_not_specialize names
    them; ``types``: {parameter: Triton type} in place of the launcher's type (a tensor descriptor, say), no hint. A
    Gluon kernel (@gluon.jit) compiles from its own source class. Triton's compiled kernel."""
    import triton
    from triton.compiler import ASTSource
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    sig, consts, attrs = launch_specialization(kernel, kw, target, types=types)
    opts = {k: kw[k] for k in ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion") if k in kw}
    return triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs), target=target,
                          options=opts)


def launch_specialization(kernel, kw: dict, target, *, types: dict | None = None) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attributes) under which Triton's launcher compiles ``kernel`` for ``target`` with the
    arguments ``kw``: the kernel's own binder (triton.runtime.jit's, as JITFunction.run makes it), so each argument is
    typed and specialized as on a GPU (an int equal to 1 a constant, divisibility by 16 a hint, do_not_specialize
    honoured); CPU tensors stand for the GPU's (torch aligns both to 16 bytes or more). ``types`` overrides a
    parameter's type (no hint)."""
    import triton
    unlike = (f"bench.launch_specialization: Triton {triton.__version__}'s launcher binds a launch otherwise than the "
              "3.6-3.9 this was written against (triton.runtime.jit.create_function_from_signature, "
              "triton.compiler.make_backend)")
    try:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError:
        raise RuntimeError(unlike) from None
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound = binder(**{p.name: kw[p.name] for p in kernel.params})
    if not (isinstance(bound, tuple) and len(bound) == 3 and len(bound[1]) == len(kernel.params)):
        raise RuntimeError(unlike)
    spec = bound[1]
    sig, consts, attrs = {}, {}, {}
    for i, (p, (ty, hint)) in enumerate(zip(kernel.params, spec)):
        if types and p.name in types and not p.is_constexpr:
            sig[p.name] = types[p.name]
            continue
        sig[p.name] = ty
        if ty == "constexpr":
            consts[(i,)] = kw[p.name]
        elif isinstance(hint, str) and hint:
            attrs[(i,)] = backend.parse_attr(hint)
    return sig, consts, attrs


def int_list(ap, name: str, text: str, allowed) -> list[int]:
    """A bench's comma-separated option ``name`` (its text ``text``) as integers, each one of ``allowed``; anything
    else, or nothing, is refused through ``ap.error`` (argparse's one line, exit 2) before any work."""
    try:
        got = [int(x) for x in text.split(",")]
    except ValueError:
        got = []
    if not got or not set(got) <= set(allowed):
        ap.error(f"{name} {text!r}: expected a comma-separated list from {sorted(allowed)}")
    return got


def warps_widths(ap, text: str) -> list[tuple[int, int]]:
    """A variant benchmark's --configs ("4x64,2x32": warps x V tile width) as (warps, width) pairs, warps 1, 2, 4 or 8
    and width 16, 32 or 64; anything else refused through ``ap.error`` (argparse's one line, exit 2) before any work."""
    configs = []
    for c in text.split(","):
        m = re.fullmatch(r"(1|2|4|8)x(16|32|64)", c.strip())
        if not m:
            ap.error(f"--configs: {c!r} is not warps x width (warps 1, 2, 4, 8; width 16, 32, 64)")
        configs.append((int(m.group(1)), int(m.group(2))))
    return configs


# The one-kernel WY form's sweep options (bench_wy_root.py, first_use.py) and the values each may take: the root's
# place (triton_gdn.FUSED_ROOT), q and k as read or l2-normed (FUSED_RAW16, 1 / 0), warps, V tiles, the state's use
# held behind its state-free products or not (FUSED_HOLD, 1 / 0: the root's place 2 only), the rows' norms of q and k
# summed from the rows as read or from the products' diagonals (FUSED_ROWNORM, 1 / 0: q and k as read with the root in
# the block only), and the state's products by its head and remainder accumulated apart or in one chain (FUSED_CHAINS,
# 1 / 0: q and k as read only)
FUSED_SWEEP = {"--roots": (0, 1, 2), "--raw16": (0, 1), "--warps": (1, 2, 4, 8, 16), "--block-v": (16, 32, 64, 128),
               "--hold": (0, 1), "--rownorm": (0, 1), "--chains": (0, 1)}


class FusedForm(NamedTuple):
    """One point of fused_root_sweep: the one-kernel form's flags (triton_gdn's FUSED_*) and launch."""
    root: int
    raw16: bool
    hold: bool
    rownorm: bool
    chains: bool
    warps: int
    block_v: int


def add_fused_sweep_options(ap, *, roots: str, raw16: str, warps: str, block_v: str, hold: str = "1",
                            rownorm: str = "1", chains: str = "0"):
    """FUSED_SWEEP's options on ``ap``, each a comma-separated list with the default given."""
    for name, default in zip(FUSED_SWEEP, (roots, raw16, warps, block_v, hold, rownorm, chains)):
        ap.add_argument(name, default=default, help=f"comma-separated, from {list(FUSED_SWEEP[name])}")


def fused_sweep_options(ap, a) -> dict:
    """fused_root_sweep's keyword arguments (roots, warps, block_vs, raw16s, holds, rownorms, chains) from
    add_fused_sweep_options' parsed options ``a``; a value outside FUSED_SWEEP's refused through ``ap.error``
    (int_list) before any work."""
    roots, raw16, warps, block_v, hold, rownorm, chains = (
        int_list(ap, name, getattr(a, name[2:].replace("-", "_")), allowed) for name, allowed in FUSED_SWEEP.items())
    return dict(roots=roots, warps=warps, block_vs=block_v, raw16s=[bool(r) for r in raw16],
                holds=[bool(h) for h in hold], rownorms=[bool(r) for r in rownorm], chains=[bool(c) for c in chains])


_FLAGS = ("FUSED_ROOT", "FUSED_RAW16", "FUSED_HOLD", "FUSED_ROWNORM", "FUSED_CHAINS")


def fused_root_sweep(roots, warps, block_vs, raw16s=(True,), holds=(True,), rownorms=(True,), chains=(False,)):
    """FusedForm over every combination, triton_gdn.FUSED_ROOT, FUSED_RAW16, FUSED_HOLD, FUSED_ROWNORM and
    FUSED_CHAINS set to the form's while it runs (restored after): the one-kernel WY form's places for the root, its
    products by q and k as read or l2-normed, its state's use held or not, its rows' norms from the rows as read or
    not and its state's products in two chains or one, side by side. The hold applies to the root's place 2 only
    (plan_wy's HOLD), the rows' norms to q and k as read with the root in the block (ROWNORM) and the chains to q and k
    as read (CHAINS): elsewhere each is swept once, False."""
    from ddsim.gpu_backend import triton_gdn
    old = tuple(getattr(triton_gdn, f) for f in _FLAGS)
    try:
        for root in roots:
            for raw16 in raw16s:
                for hold in (holds if root == 2 else (False,)):
                    for rownorm in (rownorms if raw16 and root else (False,)):
                        for chain in (chains if raw16 else (False,)):
                            for f, value in zip(_FLAGS, (root, raw16, hold, rownorm, chain)):
                                setattr(triton_gdn, f, value)
                            for w in warps:
                                for bv in block_vs:
                                    yield FusedForm(root, raw16, hold, rownorm, chain, w, bv)
    finally:
        for f, value in zip(_FLAGS, old):
            setattr(triton_gdn, f, value)


def ddtree_batch(B: int, T: int, *, vocab: int = 1000, depth: int = 15, topk: int = 8, seed: int = 0):
    """B DDTree trees of T nodes (best-first, top-k cap 8, depth 15) from random draft logits."""
    gen = torch.Generator().manual_seed(seed)
    trees = [ddtree(torch.randn(depth, vocab, generator=gen) * 2.0, T - 1, topk) for _ in range(B)]
    return trees, torch.tensor([t.parents for t in trees])


def gdn_shape(preset: str = "qwen3.6-27b") -> dict:
    """A preset's GDN head shape {H, HV, K, V}: the kernel benchmarks take their shapes from the
    presets instead of restating them (default: Qwen3.6-27B, H=16, HV=48, K=V=128)."""
    cfg = get_preset(preset)
    return dict(H=cfg.linear_num_key_heads, HV=cfg.linear_num_value_heads, K=cfg.linear_key_head_dim,
                V=cfg.linear_value_head_dim)


BENCH_SHAPE = gdn_shape()


def kernel_inputs(B, T, *, H=BENCH_SHAPE["H"], HV=BENCH_SHAPE["HV"], K=BENCH_SHAPE["K"], V=BENCH_SHAPE["V"],
                  dtype=torch.bfloat16, device="cuda", seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen).to(device=device, dtype=dtype)

    g = (-torch.rand(B, T, HV, generator=gen) * 0.3).to(device)  # long-ish memory
    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), g=g, beta=torch.rand(B, T, HV, generator=gen).to(device),
                initial_state=torch.randn(B, HV, K, V, generator=gen).to(device))


class SGLangLayer(NamedTuple):
    """sglang_layer's inputs of one GDN layer's verify in SGLang's calling convention."""
    trees: list  # B DDTree trees
    parents: torch.Tensor  # [B, T] int64 on the host
    inp: dict  # kernel_inputs
    a: torch.Tensor  # [B, T, HV] and b: the fused gates' raw projections (ddsim.engines.fused_gates)
    b: torch.Tensor
    zeros: torch.Tensor  # [HV]: A_log and dt_bias
    pool: torch.Tensor  # [2B, HV, V, K] fp32 (SGLang's layout), the batch at every other row
    slots: torch.Tensor  # [B] int32
    par: torch.Tensor  # parents on the device, int32
    plan: object  # engine_api.plan_tree(par)
    pslots: object  # engine_api.plan_slots(pool, slots)
    buf: torch.Tensor  # [B, T, HV, V, K] fp32, unfilled: SGLang's intermediate buffer, sequence b at row b
    rows: torch.Tensor  # [B] int32: those rows
    prows: object  # engine_api.plan_slots(buf, rows)


def sglang_layer(B: int, T: int, *, device="cuda") -> SGLangLayer:
    """One GDN layer's verify inputs at Qwen3.6-27B shapes in SGLang's calling convention for B DDTree trees of T
    nodes, and the step's plans an engine builds once for every layer (the engine benchmarks' setup)."""
    from ddsim.engines import fused_gates
    from ddsim.gpu_backend import engine_api
    trees, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device=device)
    HV, V, K = inp["v"].shape[2], inp["v"].shape[3], inp["q"].shape[3]
    a, b = fused_gates(inp["g"], inp["beta"])
    pool = torch.randn(2 * B, HV, V, K, device=device)
    slots = torch.arange(0, 2 * B, 2, dtype=torch.int32, device=device)
    par = parents.to(device).int().contiguous()
    buf = torch.empty(B, T, HV, V, K, device=device)
    rows = torch.arange(B, dtype=torch.int32, device=device)
    return SGLangLayer(trees, parents, inp, a, b, torch.zeros(HV, device=device), pool, slots, par,
                       engine_api.plan_tree(par), engine_api.plan_slots(pool, slots), buf, rows,
                       engine_api.plan_slots(buf, rows))


def kernel_bytes(B, T, *, H=BENCH_SHAPE["H"], HV=BENCH_SHAPE["HV"], K=BENCH_SHAPE["K"], V=BENCH_SHAPE["V"],
                 in_bytes=2):
    """Bytes each design must move at least: inputs + output + committed state (+ snapshots)."""
    io = B * T * (2 * H * K + 2 * HV * V) * in_bytes + B * T * HV * 8
    state = B * HV * K * V * 4
    snaps = B * T * HV * K * V * 4
    return {"leaky": io + state, "leaky+states": io + state + snaps, "parent-indexed": io + state + 2 * snaps,
            "wy": io + state, "commit": 2 * state, "copy": 2 * state}


def kernel_flops(B, T, *, H=BENCH_SHAPE["H"], HV=BENCH_SHAPE["HV"], K=BENCH_SHAPE["K"], V=BENCH_SHAPE["V"]):
    """Floating-point operations each design must do at least (multiply-adds count two), per layer:
    the recurrences 7 K V per node and value head (decay, k.S, the rank-one update, q.S); the WY form,
    with n = T - 1 draft nodes under a recurrent root, 7 K V + 4 n K V (K S_r, Q S_r) + 2 n^2 K (the
    lower triangles of K K^T and Q K^T) + 2 n^2 V (the triangular solve applied to the values, and
    P U), by value head. No floor for the commit (its path length varies) or the copy."""
    n = T - 1
    rec = B * HV * T * 7 * K * V
    wy = B * HV * (7 * K * V + 4 * n * K * V + 2 * n * n * K + 2 * n * n * V)
    return {"leaky": rec, "leaky+states": rec, "parent-indexed": rec, "wy": wy}


# dense tf32 tensor-core peaks (FLOP/s); fp32-level accuracy on tensor cores takes three tf32 passes
TF32_PEAK = {"H100": 494e12, "H200": 494e12}


def fp32_tensor_rate(device="cuda", precision: str = "tf32x3") -> float | None:
    """The device's tensor-core rate for products of fp32 operands at ``precision``: its dense tf32
    peak over the three passes of tf32x3, or for bf16x3 (the WY kernels' default for 16-bit inputs)
    its dense bf16 peak (twice tf32's) over three (None for a device not in TF32_PEAK)."""
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in TF32_PEAK.items() if k in name), None)
    return None if peak is None else peak * (2 if precision == "bf16x3" else 1) / 3


def kernel_table(*, device="cuda", shapes=KERNEL_SHAPES, precisions=("ieee", "tf32x3"), only=None,
                 progress=None) -> tuple[str, list]:
    """Median time per call of each GDN kernel design at Qwen3.6-27B GDN shapes, against the
    memory floor of each design (bytes it must move / measured copy bandwidth) and its FLOP floor
    (kernel_flops / fp32_tensor_rate, where the device's peak is known)."""
    bw = copy_bandwidth(device)
    rate = fp32_tensor_rate(device)
    rows = []
    for B, T in shapes:
        trees, parents = ddtree_batch(B, T)
        parents = parents.to(device)
        inp = kernel_inputs(B, T, device=device)
        nbytes = kernel_bytes(B, T)
        acc = torch.tensor([int(t.depths.argmax()) for t in trees], device=device)  # commit the deepest path
        qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        s0 = inp["initial_state"]
        out_state = torch.empty_like(s0)
        from ddsim.gpu_backend.triton_commit import plan_commit
        from ddsim.gpu_backend.triton_gdn import plan_recurrent, plan_wy
        rec_cfgs = [dict(block_v=bv, num_warps=nw) for bv, nw in ((16, 1), (32, 2), (32, 4), (64, 4))]
        wy_cfgs = [dict(block_v=bv, num_warps=nw) for bv, nw in ((16, 4), (32, 4), (32, 8), (64, 8), (128, 8), (64, 4))]
        common = dict(parents=parents, initial_state=s0, poison=False)
        cases = {
            "leaky": ("leaky", rec_cfgs, lambda c: plan_recurrent(**qkv, **common, mode="leaky", **c)),
            "leaky+states": ("leaky+states", rec_cfgs, lambda c: plan_recurrent(
                **qkv, **common, mode="leaky", output_states=True, **c)),
            "exact parent-indexed": ("parent-indexed", rec_cfgs, lambda c: plan_recurrent(
                **qkv, **common, mode="exact", design="serial", **c)),
        }
        for prec in precisions:
            cases[f"exact wy ({prec})"] = ("wy", wy_cfgs, (lambda c, p=prec: plan_wy(
                **qkv, **common, mode="exact", precision=p, design="fused", **c)))
        split_cfgs = [dict(block_v=bv, num_warps=nw, solve_warps=sw)
                      for bv, nw, sw in ((32, 4, 8), (64, 4, 8), (64, 8, 8), (32, 4, 4), (64, 4, 4))]
        cases["exact wy split (tf32x3)"] = ("wy", split_cfgs, lambda c: plan_wy(
            **qkv, **common, mode="exact", design="split", **c))
        fold_cfgs = [dict(block_v=bv, num_warps=nw, solve_warps=sw, exact16=e) for bv, nw, sw in (
            (32, 4, 4), (32, 4, 8), (64, 4, 4), (64, 4, 8), (64, 8, 8), (16, 4, 4)) for e in ("bf16x3", "tf32x2")]
        pdl_cfgs = [dict(c, pdl=True) for c in fold_cfgs if c["exact16"] == "bf16x3"]
        cases["exact wy fold (tf32x3)"] = ("wy", fold_cfgs, lambda c: plan_wy(
            **qkv, **common, mode="exact", design="fold", **c))
        cases["exact wy fold, PDL (tf32x3)"] = ("wy", pdl_cfgs, lambda c: plan_wy(
            **qkv, **common, mode="exact", design="fold", **c))
        for i, part in enumerate(("solve", "apply")):  # each kernel of the two alone (where the time goes)
            cases[f"exact wy fold: {part} kernel"] = ("wy", fold_cfgs, (lambda c, i=i: _part(plan_wy(
                **qkv, **common, mode="exact", design="fold", **c), i)))
            cases[f"exact wy split: {part} kernel"] = ("wy", split_cfgs, (lambda c, i=i: _part(plan_wy(
                **qkv, **common, mode="exact", design="split", **c), i)))
        cases["commit"] = ("commit", rec_cfgs, lambda c: plan_commit(
            inp["k"], inp["v"], inp["g"], inp["beta"], parents=parents, accepted=acc, initial_state=s0,
            poison=False, **c))
        cases["state copy"] = ("copy", [{}], lambda c: ((lambda: out_state.copy_(s0)), None))
        rows += sweep(B, T, cases, nbytes, bw, only=only, progress=progress, flops=kernel_flops(B, T), flop_rate=rate)
    head = f"copy bandwidth {bw / 1e9:.0f} GB/s (read + write)" + (
        f"; FLOP floor at {rate / 1e12:.0f} TFLOP/s (dense tf32 peak / 3: fp32-level accuracy)" if rate else "")
    return "\n".join([head] + table_lines(rows)), rows


def graphed_us(launches: list, *, repeats: int = 20) -> float:
    """Median microseconds per launch of ``launches`` (one launcher each, e.g. one per layer's inputs) run back to
    back from one CUDA graph, as a server's replayed verify runs its kernels: no launch latency, and each launcher's
    inputs cold in L2 when all of them together exceed it (48 layers' states at Qwen3.6-27B size do from one
    sequence up), unlike do_bench, which times each call alone after flushing L2."""
    graph = layers_graph(launches)
    us = event_median_ms(graph.replay, repeats=repeats) * 1e3 / len(launches)
    del graph
    return us


def layers_graph(launches: list) -> "torch.cuda.CUDAGraph":
    """One CUDA graph of ``launches`` back to back (each called once first, so that compiling and first-call work
    happen before the capture), replayed once: graphed_us's, and a profile's of the same graph."""
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    graph.replay()
    return graph


def slotted_pool(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pool, slots): a pool of 2 B rows [2 B, ...] fp32 holding the B committed states [B, ...] at every other row
    (random values between, so that a kernel reading a row it was not given shows it) and the slots [B] int32 of them,
    as a server's pool is read through state_indices."""
    B = states.shape[0]
    slots = torch.arange(0, 2 * B, 2, dtype=torch.int32, device=states.device)
    pool = torch.randn(2 * B, *states.shape[1:], dtype=states.dtype, device=states.device)
    pool[slots.long()] = states
    return pool, slots


def graphed_layers_us(B: int, T: int, parents, n: int, *, slots: bool = False, **plan_kw) -> float:
    """graphed_us of n layers' exact WY verifies at B x T (each layer its own inputs, seeded apart; one plan_wy each,
    with ``plan_kw``), as a server's replayed verify runs a model's GDN layers; slots: each layer's states in a pool
    of 2 B rows, read through a slot table (every other row), as a server's pool is."""
    from ddsim.gpu_backend.triton_gdn import plan_wy
    plans = []
    for i in range(n):
        li = kernel_inputs(B, T, device="cuda", seed=1 + i)
        states = dict(initial_state=li["initial_state"])
        if slots:
            states = dict(zip(("initial_state", "state_indices"), slotted_pool(li["initial_state"])))
        plans.append(plan_wy(**{k: li[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents.cuda(),
                             poison=False, **states, **plan_kw))
    us = graphed_us([launch for launch, _ in plans])
    del plans
    torch.cuda.empty_cache()
    return us


def event_samples_us(fn, *, flush=None, repeats: int = 400) -> list[float]:
    """Sorted us of fn() between two CUDA events, flush() (when given) before each: do_bench's loop with the flush
    given, a spin kernel of 400k cycles (about 200 us on an H200) first so that the launches queue ahead of the start
    event (20k left unflushed calls timing the host's launch: 25-34 us, benchmarks/RESULTS.md)."""
    fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for a, b in ev:
        torch.cuda._sleep(400_000)
        if flush is not None:
            flush()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) * 1e3 for a, b in ev)


def event_median_ms(fn, *, repeats: int = 20) -> float:
    """Median milliseconds of fn() between two CUDA events (the device idle before each call): a graph's replay
    alone, without the host's work around it."""
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def _part(plan, i: int):
    """(launch of the i-th kernel of a two-kernel plan alone, result)."""
    launch, result = plan
    return launch.parts[i], result


def _do_bench(launch) -> float:
    import triton.testing
    return triton.testing.do_bench(launch, warmup=10, rep=50, return_mode="median")


def median_us(launch) -> float:
    """The kernel tables' timer in us: do_bench's median over 50 ms after 10 ms of warm-up, each call alone with
    the L2 flushed before it."""
    return _do_bench(launch) * 1e3


def median_us_calls(launch, calls: int) -> list[float]:
    """median_us over ``calls`` do_bench calls, sorted: each call's median sits on one of two levels about 0.6 us
    apart at 1 x 16 on an H200, in no order (benchmarks/RESULTS.md, timer_warmup.py), so one call's is a draw of
    the two and the median of several is the figure to hold a bound to."""
    if calls < 1:
        raise ValueError(f"calls: expected 1 or more, got {calls}")
    return sorted(median_us(launch) for _ in range(calls))


def timing_options(ap, *, rounds: int) -> None:
    """The variant benchmarks' (fused_*.py) options on ``ap``: --commit (stamped in the header), --calls (do_bench
    calls a figure's median is taken over, 5) and --rounds (timing_rounds' rounds, ``rounds``)."""
    ap.add_argument("--commit", default="?")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=rounds)


def cuda_run(who: str, commit: str) -> None:
    """Stop (SystemExit naming ``who``) where there is no CUDA device, else print cuda_header: a GPU benchmark's start,
    after its options are checked."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{who}: needs a CUDA device")
    print(cuda_header(commit), flush=True)


def sglang_run(who: str):
    """(SGLang's target-verify kernel, where it was found) for a GPU benchmark beside SGLang, after its options are
    checked: stop (SystemExit naming ``who``) where there is no CUDA device, and in one line, exit 2, where SGLang's
    kernel cannot be imported, before any work."""
    import sys

    from ddsim.engines.sglang import _kernel
    from ddsim.errors import InputError
    if not torch.cuda.is_available():
        raise SystemExit(f"{who}: needs a CUDA device")
    try:
        return _kernel()
    except InputError as e:
        print(f"{who}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def timing_rounds(forms: dict, *, rounds: int, calls: int, warm: bool = True) -> None:
    """Each launch of ``forms`` ({name: launch}) timed ``rounds`` times over in this process, the rows interleaved
    round by round (a figure that moves between rounds shows its spread): a markdown table on stdout of the timer
    (median_us_calls: the median of ``calls`` do_bench calls, their range), three device times after do_bench's flush
    (kernel_device_us) and, with ``warm``, one warm. The variant benchmarks' (fused_*.py) timing table."""
    import statistics
    print("\n| round | form | timer us (median of calls, range) | device us, flushed (three) |"
          + (" device us, warm |" if warm else ""))
    print("|---|---|---|---|" + ("---|" if warm else ""))
    for rnd in range(rounds):
        for name, launch in forms.items():
            t = median_us_calls(launch, calls)
            dev = [kernel_device_us(launch) for _ in range(3)]
            row = (f"| {rnd} | {name} | {statistics.median(t):.2f} ({t[0]:.2f}-{t[-1]:.2f}) | "
                   f"{' '.join(f'{x:.2f}' for x in dev)} |")
            if warm:
                row += f" {kernel_device_us(launch, flush=False):.2f} |"
            print(row, flush=True)


def calls_cell(times: list[float]) -> str:
    """A table cell for median_us_calls' sorted times: their median, and their range where there are several."""
    import statistics
    mid = statistics.median(times)
    return f"{mid:.1f}" if len(times) == 1 else f"{mid:.1f} ({times[0]:.1f}-{times[-1]:.1f})"


def kernel_device_us(fn, *, repeats: int = 30, flush: bool = True) -> float:
    """Median over ``repeats`` calls of the device time of the kernels fn() launches, summed (each kernel's start
    to end as CUPTI records it, through torch.profiler), each call after the L2 is flushed as do_bench flushes it:
    the kernels' own time, without the launch latency and event gaps do_bench's events take in (an empty kernel
    reads 2.85-3.6 us on do_bench's timer on an H200, 0.67 us of device time on the one-kernel form's grid). A
    call's kernels are those between two flushes. flush=False: the calls apart by a zeroed int32 alone, the L2 as
    the call before left it (warm)."""
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(256 * 2**20 // 4 if flush else 1, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            flush.zero_()
            fn()
        flush.zero_()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    first = kernels[0].name  # the first flush's kernel: every call's kernels lie between two of these
    calls, cur = [], None
    for e in kernels:
        if e.name == first:
            if cur is not None:
                calls.append(cur)
            cur = 0.0
        elif cur is not None:
            cur += e.time_range.elapsed_us()
    if len(calls) != repeats or not all(c > 0 for c in calls):
        raise RuntimeError(f"kernel_device_us: {len(calls)} calls' kernels told apart, {repeats} made")
    return sorted(calls)[len(calls) // 2]


def captured_launch(fn, *, gluon: bool = False):
    """(fn()'s result, grid, keyword arguments) of the one kernel launch fn plans through triton_gdn.bind (caught on
    the way, bound as before): a benchmark's handle on the launch plan_wy makes, to time it beside variants of it.
    gluon False: the one-kernel form's Triton kernel (_gdn_wy_kernel) where the Gluon fold would serve
    (triton_gdn.FUSED_GLUON off while fn plans), the kernel the variant benchmarks edit."""
    import ddsim.gpu_backend.triton_gdn as G
    got = []
    real, served = G.bind, G.FUSED_GLUON
    G.bind = lambda kernel, grid, kw: got.append((grid, kw)) or real(kernel, grid, kw)
    G.FUSED_GLUON = gluon and served
    try:
        result = fn()
    finally:
        G.bind, G.FUSED_GLUON = real, served
    if len(got) != 1:
        raise RuntimeError(f"captured_launch: {len(got)} launches bound through triton_gdn.bind, expected one")
    (grid, kw), = got
    return result, grid, kw


def wy_default_launch(B: int, T: int, **plan_kw):
    """(launch, o, grid, keyword arguments, inputs, parents) of plan_wy's launch at its auto design (or as plan_kw
    asks: design, num_warps, block_v ...) on kernel_inputs(B, T) in bf16 on the GPU (captured_launch): the Triton
    form's launch a benchmark times its variants of _gdn_wy_kernel beside (the Gluon fold off, where it serves)."""
    import ddsim.gpu_backend.triton_gdn as G
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, dtype=torch.bfloat16, device="cuda")
    (launch, o), grid, kw = captured_launch(lambda: G.plan_wy(
        **{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents.cuda(), initial_state=inp["initial_state"],
        poison=False, **{"design": "auto", **plan_kw}))
    return launch, o, grid, kw, inp, parents


def wy_form_output(x: dict, plan, design: str) -> torch.Tensor:
    """The exact WY verify's output of inputs x (q, k, v, g, beta, initial_state) on ``plan`` in one form: plan_wy's
    designs (fused, split, fold, head ...), or past one block's forms on any tree (triton_wy_blocked: "chunked" its one
    kernel, "blocked" its split form) in 16-node chunks, so that a few nodes' tree is one chunk whose in-chunk solve
    spans its deepest chain. A fresh tensor (the blocked forms' output is their plan's)."""
    from ddsim.gpu_backend import triton_gdn, triton_wy_blocked
    if design in ("chunked", "blocked"):
        run, o = triton_wy_blocked.plan_wy_blocked(**x, parents=plan, mode="exact", block_t=16, poison=True,
                                                    design="chunked" if design == "chunked" else "split")
        run()
        return o.clone()
    return triton_gdn.gdn_tree_verify_wy(**x, parents=plan, mode="exact", design=design)


_EDITED_DIR: dict[int, str] = {}  # process id -> that process's folder of edited kernels' modules


def _remove_edited_dir(path: str, owner: int) -> None:
    """At exit: the folder of edited modules, by the process that made it only (a forked child inherits the hook)."""
    import shutil
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def _edited_dir() -> str:
    """This process's one temporary folder for edited_kernel's modules, removed when the process exits: Triton (its
    interpreter too) reads a kernel's source from its file when it first runs it, so the files stay until then."""
    import atexit
    import tempfile
    pid = os.getpid()
    if pid not in _EDITED_DIR:
        _EDITED_DIR[pid] = tempfile.mkdtemp(prefix="ddsim_edited_")
        atexit.register(_remove_edited_dir, _EDITED_DIR[pid], pid)
    return _EDITED_DIR[pid]


def edited_kernel(kernel, edits, *, header: str, who: str):
    """``kernel`` (a @triton.jit function) with each (old, new) of ``edits`` replaced in its source, in order, each old
    found exactly once (else SystemExit naming ``who`` and the line), imported from a module written to a temporary
    file with ``header`` (its imports and helpers) before it: Triton reads a kernel's source from its file. The module
    starts from the kernel's own module's names (its decorator's options, its helpers), which the header's replace. A
    benchmark's traced or cut copy of a served kernel, kept to the kernel's source as it is. The files live in one
    folder a process (_edited_dir), removed when it exits."""
    import importlib.util
    import inspect
    import tempfile
    src = inspect.getsource(kernel.fn)
    name = kernel.fn.__name__
    for old, new in edits:
        if src.count(old) != 1:
            raise SystemExit(f"{who}: {name}'s source no longer has {old.strip()[:60]!r} once")
        src = src.replace(old, new)
    fd, path = tempfile.mkstemp(prefix=f"edited_{name}_", suffix=".py", dir=_edited_dir())
    with os.fdopen(fd, "w") as f:
        f.write(header + src)
    spec = importlib.util.spec_from_file_location(f"edited_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    mod.__dict__.update({k: v for k, v in kernel.fn.__globals__.items() if not k.startswith("__")})
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def compiled_during(fn):
    """(fn's result, [(key, compiled kernel)] that ddsim.gpu_backend.launch's cache took while fn ran, by key)."""
    from ddsim.gpu_backend import launch as L
    before = set(L._COMPILED)
    result = fn()
    return result, sorted(((k, L._COMPILED[k]) for k in set(L._COMPILED) - before), key=lambda x: str(x[0]))


def timed_resources(launch) -> tuple[float, list[dict]]:
    """do_bench's median ms of ``launch``, and what each kernel it compiled holds (ddsim.gpu_backend.launch's
    cache: the kernel's name and constexprs key, registers, spilled words, shared memory bytes)."""
    from ddsim.gpu_backend import launch as L
    ms, new = compiled_during(lambda: _do_bench(launch))
    kernels = [dict(name=L._PARAMS[key[0]][3].__name__, config=key[2], regs=getattr(ck, "n_regs", "?"),
                    spills=getattr(ck, "n_spills", "?"), shared=getattr(ck.metadata, "shared", "?"))
               for key, ck in new]
    return ms, kernels


def sweep(B: int, T: int, cases: dict, nbytes: dict, bw: float, *, only=None, progress=None, timer=_do_bench,
          flops: dict | None = None, flop_rate: float | None = None) -> list:
    """One row per case {name: (design, launch configurations, plan(config) -> (launch, result))}:
    the best median ms over a fixed configuration sweep (no autotuning; only the launch is timed by
    ``timer``), against the design's memory floor nbytes[design] / bw and, where given, its FLOP
    floor flops[design] / flop_rate. A configuration that does not compile (out of resources) is
    skipped and said so; a case with none left has no row."""
    rows = []
    for name, (design, cfgs, plan) in cases.items():
        if only and not any(name.startswith(o) for o in only):
            continue
        best = None
        for c in cfgs:
            try:
                launch, result = plan(c)
                ms = timer(launch)
                del result
            except Exception as e:  # a config that does not compile (e.g. out of resources) is skipped
                print(f"# {B}x{T} {name} {c}: skipped ({type(e).__name__}: {str(e)[:80]})", flush=True)
                continue
            if best is None or ms < best[0]:
                best = (ms, c)
        if best is None:
            continue
        ms, c = best
        us = ms * 1e3
        f = (flops or {}).get(design)
        row = {"B": B, "T": T, "kernel": name, "us": us, "floor_us": nbytes[design] / bw * 1e6, "config": c,
               "flop_floor_us": f / flop_rate * 1e6 if f and flop_rate else None,
               "GBps": nbytes[design] / (us * 1e-6) / 1e9,
               "snapshot_MiB": (nbytes["leaky+states"] - nbytes["leaky"]) / 2**20
               if design in ("leaky+states", "parent-indexed") else 0.0}
        rows.append(row)
        if progress:
            progress(row)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def table_lines(rows: list) -> list[str]:
    """The kernel table's markdown header and one line per sweep row."""
    lines = ["| B x T | kernel | median us | memory floor us | FLOP floor us | achieved GB/s | snapshots MiB/layer | "
             "config |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        ff = "–" if r.get("flop_floor_us") is None else f"{r['flop_floor_us']:.1f}"
        lines.append(f"| {r['B']}x{r['T']} | {r['kernel']} | {r['us']:.1f} | {r['floor_us']:.1f} | {ff} | "
                     f"{r['GBps']:.0f} | {r['snapshot_MiB']:.0f} | {cfg} |")
    return lines


def off_rounded(o: torch.Tensor, ref: torch.Tensor) -> float:
    """The share of a 16-bit output's entries that differ from the float64 oracle rounded to its dtype:
    what the kernel's own error adds to the rounding of its output (0 for a correctly rounded output;
    an internal error d relative moves about 2 d / 2^-8 of the entries of a bf16 output)."""
    return (o.cpu() != ref.to(o.dtype)).double().mean().item()


def kernel_accuracy(*, device="cuda", B=2, T=65, H=4, HV=8, K=128, V=128, seed=1) -> str:
    """Error of each design's output vs the float64 oracle (bf16 and fp32 inputs): Frobenius-relative,
    max abs, and for bf16 outputs the share of entries off the correctly rounded oracle. The one-kernel
    form at each dot precision; the split and folded forms at their default (tf32x3 for fp32 inputs,
    bf16x3 for 16-bit ones) and at tf32x3."""
    import ddsim.gpu_backend as gb
    from ddsim.gpu_backend import _common
    from ddsim.gpu_backend.triton_gdn import WY_MAX_NODES, gdn_tree_verify_wy
    from ddsim.gpu_backend.triton_wy_blocked import CHUNKED_REFUSES
    from ddsim.measure.compare import rel_error
    _, parents = ddtree_batch(B, T, seed=seed)
    lines = ["| inputs | kernel | mode | relative error vs oracle (Frobenius) | max abs error | "
             "outputs off the rounded oracle (%) |", "|---|---|---|---|---|---|"]
    for dtype in (torch.float32, torch.bfloat16):
        inp = kernel_inputs(B, T, H=H, HV=HV, K=K, V=V, dtype=dtype, device=device, seed=seed)
        qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        cpu = {k: v.cpu() for k, v in qkv.items()}
        default = _common.dot_precision(None, qkv["q"], qkv["k"], qkv["v"])  # (g, beta are fp32 whatever q's dtype)
        name = str(dtype).replace('torch.', '')
        for mode in ("exact", "leaky"):
            ref = oracle.gdn_tree_verify(**cpu, parents=parents, initial_state=inp["initial_state"].cpu(), mode=mode)
            args = dict(**qkv, parents=parents.to(device), initial_state=inp["initial_state"], mode=mode)
            outs = {"recurrent": gb.gdn_tree_verify(**args, backend="triton-recurrent")}
            for prec in ("ieee", "tf32x3", "bf16x3", "tf32"):
                if not (T > WY_MAX_NODES and prec in CHUNKED_REFUSES):  # past one block "fused" is chunked
                    outs[f"wy {prec}"] = gdn_tree_verify_wy(**args, precision=prec, design="fused")
            for prec in dict.fromkeys((default, "tf32x3")):
                outs[f"wy split {prec}"] = gdn_tree_verify_wy(**args, precision=prec, design="split")
                for e in ("bf16x3", "tf32x2"):
                    outs[f"wy fold {prec}, 16-bit operands {e}"] = gdn_tree_verify_wy(
                        **args, precision=prec, design="fold", exact16=e)
            outs["torch"] = gb.gdn_tree_verify(**args, backend="torch")
            if dtype != torch.float32:  # storing o in this dtype alone costs this much
                lines.append(f"| {name} | (oracle rounded to {name}) | {mode} | {rel_error(ref.to(dtype), ref):.2e} | "
                             f"{(ref.to(dtype).double() - ref).abs().max().item():.2e} | 0 |")
            for kernel, o in outs.items():
                off = f"{100 * off_rounded(o, ref):.2f}" if dtype != torch.float32 else "–"
                lines.append(f"| {name} | {kernel} | {mode} | {rel_error(o.cpu(), ref):.2e} | "
                             f"{(o.cpu().double() - ref).abs().max().item():.2e} | {off} |")
    return "\n".join(lines)
