"""Registers, spills, shared memory and machine instructions of the folded WY kernels, compiled offline for an
sm_90 GPU (no GPU needed: Triton compiles to a cubin and cuobjdump reads it): first the one that design "auto"
launches for a batch of bf16 inputs (head) and the two of design "fold" at its bf16 defaults, then sweeps of
warps, caps and tiles (tf32x3 products), and of three small kernels that isolate what costs the per-head kernel
its registers: one fp32-level (tf32x3) 64 x 64 product, one doubling round of two such products (N N and Y N
from one N, as the fold kernel pairs them), and the same round with the three tf32 MMAs of each product chained
by hand.

The figures match the device's (bench_wy_fold.py prints the loaded kernels' registers) when the
Triton here is the device's: RESULTS.md's came from Triton 3.6, the H200's version, installed
beside the project's own (pip install --no-deps --target DIR triton==3.6.0; PYTHONPATH=DIR).

    python benchmarks/kernel_registers.py [--defaults-only] [--head-caps 168,128] [--lines 20] [--live 20] [--blocked]
                                          [--mixed | --whole]

--head-caps: the head kernel at its defaults under each register cap too (two programs an SM at 255 registers,
three at 168, four at 128: what a cap would buy in occupancy, against what it spills). --lines N: the head kernel's
N source lines with the most machine instructions (nvdisasm's line table; what to cut first, beside Nsight Compute's
stall samples on the device). --live N: the head kernel's N source lines where the most registers are live at once
(nvdisasm's life ranges): what a register cap would have to spill. --blocked: the three kernels of the split form
past one block at their bf16 defaults for a batch (diag, solve, the apply's 64-wide tiles) instead, with --lines N
each one's N lines. --mixed: the head kernel's grid of whole heads then a program per (head, V tile)
(triton_wy_split.HEAD_MIXED, the default since it was timed; --whole: without it).
"""
import argparse
import collections
import linecache
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ddsim.bench.bench import on_cubin, triton_tool  # noqa: E402
from ddsim.gpu_backend import triton_wy_blocked as wb  # noqa: E402
from ddsim.gpu_backend import triton_wy_split as ws  # noqa: E402

CUOBJDUMP, NVDISASM = triton_tool("cuobjdump"), triton_tool("nvdisasm")
SHAPE = dict(H=16, HV=48, K=128, BT=64, BK=128, FUSED=False, L2NORM=True, PRECISION="tf32x3")  # Qwen3.6-27B GDN
FOLD = dict(q="*bf16", k="*bf16", g="*fp32", beta="*fp32", A_log="*fp32", dt_bias="*fp32", mask="*i8", Qe="*fp32",
            Ve="*fp32", Cv="*fp32", Q0="*fp32", C0="*fp32", ready="*i32", T="i32", scale="fp32", NSTEP="i32")
HEAD = dict(q="*bf16", k="*bf16", v="*bf16", g="*fp32", beta="*fp32", A_log="*fp32", dt_bias="*fp32", mask="*i8",
            state="*fp32", state_idx="*i32", o="*bf16", T="i32", scale="fp32", NSTEP="i32", NWHOLE="i32")
ROOT_APPLY = dict(v="*bf16", Qe="*fp32", Ve="*fp32", Cv="*fp32", Q0="*fp32", C0="*fp32", ready="*i32", state="*fp32",
              state_idx="*i32", o="*bf16", T="i32")
APPLY = dict(q="*bf16", k="*bf16", v="*bf16", g="*fp32", beta="*fp32", A_log="*fp32", dt_bias="*fp32", Qe="*fp32",
             Ve="*fp32", ready="*i32", state="*fp32", state_idx="*i32", o="*bf16", T="i32", scale="fp32")
TILES = dict(N="*fp32", Y="*fp32", out="*fp32")
B_DIAG = dict(k="*bf16", g="*fp32", beta="*fp32", A_log="*fp32", dt_bias="*fp32", mask="*i8", Gs="*fp32", Wd="*fp32",
              T="i32", NSTEP="i32", NP="i32", NC="i32")
B_SOLVE = dict(q="*bf16", k="*bf16", g="*fp32", beta="*fp32", A_log="*fp32", dt_bias="*fp32", mask="*i8", Gs="*fp32",
               Wd="*fp32", Ve="*fp32", Qe="*fp32", T="i32", scale="fp32", NP="i32", NC="i32")
B_APPLY = dict(q="*bf16", k="*bf16", v="*bf16", g="*fp32", beta="*fp32", A_log="*fp32", dt_bias="*fp32", Gs="*fp32",
               Ve="*fp32", Qe="*fp32", state="*fp32", state_idx="*i32", o="*bf16", T="i32", scale="fp32", NP="i32")


def blocked(lines: int):
    """The split form past one block at its bf16 defaults for a batch (64-row chunks, bf16x3, unfolded, 4 warps,
    one stage; the apply's tile wb.auto_block_v): each kernel's usage, and its ``lines`` busiest source lines."""
    sh = dict(H=16, HV=48, K=128, BT=64, BK=128, FUSED=False, L2NORM=True, PRECISION="bf16x3")
    bv = wb.auto_block_v(8, "bf16x3")
    for name, fn, sig, ce in (
            ("diag", wb._gdn_wy_blocked_diag_kernel, B_DIAG, dict(sh, RAW16=True)),
            ("solve", wb._gdn_wy_blocked_solve_kernel, B_SOLVE, dict(sh, RAW16=True, EXACT=2, FOLD=False)),
            (f"apply ({bv}-wide tiles)", wb._gdn_wy_blocked_apply_kernel, B_APPLY,
             dict(sh, V=128, BV=bv, STATE_VK=False, FOLD=False))):
        print(f"{name} kernel past one block, bf16 defaults, 4 warps: " + usage(fn, sig, ce, 4, num_stages=1))
        if lines:
            for row in by_line(fn, sig, ce, 4, lines, num_stages=1):
                print("  " + row)


def cubin(fn, signature: dict, constexprs: dict, num_warps: int, maxnreg=None, num_stages=None):
    """fn compiled for sm_90, every pointer 16-byte aligned (as torch allocates): Triton's compiled kernel."""
    names = list(fn.arg_names)
    full = dict(signature, **{k: "constexpr" for k in constexprs})
    src = ASTSource(fn=fn, signature={n: full[n] for n in names},
                    constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items() if t[0] == "*"})
    opts = dict(num_warps=num_warps, **({"maxnreg": maxnreg} if maxnreg else {}),
                **({"num_stages": num_stages} if num_stages else {}))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def usage(fn, signature: dict, constexprs: dict, num_warps: int, maxnreg=None, num_stages=None) -> str:
    """'R registers, S bytes of stack (spills), M bytes of shared memory, N instructions (C tensor-core)' of fn
    compiled for sm_90 (cubin); N counts the machine instructions cuobjdump lists, C those of them that are MMAs."""
    ck = cubin(fn, signature, constexprs, num_warps, maxnreg, num_stages)
    res, sass = on_cubin(ck, [CUOBJDUMP, "-res-usage"], [CUOBJDUMP, "-sass"])
    reg, stack = re.search(r"REG:(\d+)", res), re.search(r"STACK:(\d+)", res)
    ins = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/", line)]
    mma = sum(1 for line in ins if re.search(r"\bH[G]?MMA\b", line))  # wgmma (HGMMA) or mma.sync (HMMA)
    return (f"{reg.group(1) if reg else '?'} registers, {stack.group(1) if stack else '?'} B stack (spills), "
            f"{ck.metadata.shared} B shared, {len(ins)} instructions ({mma} tensor-core)")


def source_lines(sass: str):
    """(address, instruction line, (path, line) of its source) for each instruction of nvdisasm -g's output."""
    where = None
    for line in sass.splitlines():
        m = re.search(r'File "([^"]+)", line (\d+)', line)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/", line)
        if m:
            yield m.group(1), line, where


def by_line(fn, signature: dict, constexprs: dict, num_warps: int, top: int, num_stages=None) -> list[str]:
    """The ``top`` source lines of fn (compiled for sm_90) with the most machine instructions, from nvdisasm's line
    table: 'count  file:line  opcodes  source', most first, and the total. Static counts: a loop's body counts
    once (the head kernel's V-tile loop runs V / BV times)."""
    (sass,) = on_cubin(cubin(fn, signature, constexprs, num_warps, num_stages=num_stages), [NVDISASM, "-g", "-c"])
    count, ops = collections.Counter(), collections.defaultdict(collections.Counter)
    for _, line, where in source_lines(sass):
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            count[where] += 1
            ops[where][m.group(1)] += 1
    out = [f"{sum(count.values())} instructions"]
    for (path, n), c in count.most_common(top):
        try:
            text = linecache.getline(path, n).strip()[:70]
        except TypeError:  # no line (None)
            text = ""
        op = ", ".join(f"{k} {v}" for k, v in ops[(path, n)].most_common(4))
        out.append(f"{c:5d}  {os.path.basename(path or '?')}:{n}  {op}  | {text}")
    return out


def live(fn, signature: dict, constexprs: dict, num_warps: int, top: int, num_stages=None) -> list[str]:
    """The ``top`` source lines of fn (compiled for sm_90) where the most registers are live at once, from
    nvdisasm's life ranges, most first: where a register cap would have to spill. Compiled under a cap of 254:
    nvdisasm reads no life ranges at 255 registers ("Invalid register count")."""
    lines, ranges = on_cubin(cubin(fn, signature, constexprs, num_warps, 254, num_stages), [NVDISASM, "-g", "-c"],
                             [NVDISASM, "-c", "-lrm", "count"])
    at = {address: where for address, _, where in source_lines(lines)}  # each instruction's source line
    peak = collections.Counter()
    for line in ranges.splitlines():  # the '# live' column after each instruction
        m = re.match(r"\s+/\*([0-9a-f]+)\*/.*?//\s*\|\s*(\d+)", line)
        if m and at.get(m.group(1)):
            w = at[m.group(1)]
            peak[w] = max(peak[w], int(m.group(2)))
    out = [f"registers live at once, at most: {max(peak.values(), default=0)}"]
    for (path, n), c in peak.most_common(top):
        out.append(f"{c:5d}  {os.path.basename(path)}:{n}  | {linecache.getline(path, n).strip()[:90]}")
    return out


@triton.jit
def _tf32_hi(x):
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _dot3_by_hand(a, b, acc):
    """acc + a b to fp32 level: three tf32 MMAs on explicit head / remainder splits, chained."""
    ah = _tf32_hi(a)
    bh = _tf32_hi(b)
    acc = tl.dot(a - ah, bh, acc, input_precision="tf32")
    acc = tl.dot(ah, b - bh, acc, input_precision="tf32")
    return tl.dot(ah, bh, acc, input_precision="tf32")


@triton.jit
def _products(N, Y, out, BT: tl.constexpr, WHAT: tl.constexpr):
    """WHAT 0: one tf32x3 product N N; 1: a paired round, N N and Y + Y N (Triton's tf32x3);
    2: the same round with each product's MMAs chained by hand."""
    o = tl.arange(0, BT)
    off = o[:, None] * BT + o[None, :]
    n = tl.load(N + off)
    y = tl.load(Y + off)
    if WHAT == 0:
        x = tl.dot(n, n, input_precision="tf32x3")
    elif WHAT == 1:
        x = tl.dot(n, n, input_precision="tf32x3") + tl.dot(y, n, y, input_precision="tf32x3")
    else:
        x = _dot3_by_hand(n, n, tl.zeros([BT, BT], tl.float32)) + _dot3_by_hand(y, n, y)
    tl.store(out + off, x)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--defaults-only", action="store_true", help="the bf16 defaults' kernels alone")
    ap.add_argument("--head-caps", default="", help="register caps to compile the head kernel under too (168,128)")
    ap.add_argument("--lines", type=int, default=0, help="the head kernel's N source lines with the most instructions")
    ap.add_argument("--blocked", action="store_true", help="the split form's kernels past one block instead")
    ap.add_argument("--mixed", action="store_true", help="the head kernel with HEAD_MIXED on (the default)")
    ap.add_argument("--whole", action="store_true", help="the head kernel with HEAD_MIXED off")
    ap.add_argument("--live", type=int, default=0,
                    help="the head kernel's N source lines with the most registers live at once (cap 254)")
    a = ap.parse_args()
    defaults_only = a.defaults_only
    try:
        head_caps = [int(x) for x in a.head_caps.split(",") if x]
    except ValueError:
        ap.error(f"--head-caps {a.head_caps!r}: expected register counts, comma separated")
    print(f"# Triton {triton.__version__}, compiled for sm_90 (no GPU); Qwen3.6-27B GDN shapes, bf16 inputs")
    if a.blocked:
        blocked(a.lines)
        raise SystemExit(0)
    # what design "auto" launches for a batch of bf16 inputs (the head kernel: HEAD_BLOCK_V, HEAD_STAGES), then the
    # two kernels of design "fold" at its bf16 defaults (bf16x3 products, the root folded in: FOLD_DEFAULTS)
    head = dict(SHAPE, V=128, BV=ws.HEAD_BLOCK_V, PRECISION="bf16x3", RAW16=True, EXACT=2, STATE_VK=False,
                SPLIT_V=ws.HEAD_SPLIT_V is True, MIXED=(a.mixed or ws.HEAD_MIXED) and not a.whole)
    for cap in (None, *head_caps):
        print(f"head kernel at the bf16 defaults (bf16x3, {ws.HEAD_BLOCK_V}-wide tiles, {ws.HEAD_STAGES} stage"
              f"{', mixed grid' if head['MIXED'] else ''}), 4 warps"
              + (f", cap {cap}: " if cap else ": ") + usage(ws._gdn_wy_fold_head_kernel, HEAD, head, 4, cap,
                                                            num_stages=ws.HEAD_STAGES))
    if a.live:
        print(f"the head kernel's {a.live} source lines with the most registers live at once (compiled under a cap of"
              " 254):")
        for row in live(ws._gdn_wy_fold_head_kernel, HEAD, head, 4, a.live, num_stages=ws.HEAD_STAGES):
            print("  " + row)
    if a.lines:
        print(f"the head kernel's {a.lines} source lines with the most machine instructions (static counts):")
        for row in by_line(ws._gdn_wy_fold_head_kernel, HEAD, head, 4, a.lines, num_stages=ws.HEAD_STAGES):
            print("  " + row)
    print("fold kernel at the bf16 defaults (bf16x3, the root folded in), 4 warps: "
          + usage(ws._gdn_wy_fold_kernel, FOLD, dict(SHAPE, PRECISION="bf16x3", RAW16=True, EXACT=2, PDL=False, ROOT=True), 4))
    print("apply kernel of the folded root at the bf16 defaults (64-wide tiles, all of K), 4 warps: "
          + usage(ws._gdn_wy_fold_root_apply_kernel, ROOT_APPLY,
                  dict(H=16, HV=48, K=128, V=128, BT=64, BK=128, BV=64, BKC=128, EXACT=2, PRECISION="bf16x3",
                       PDL=False, STATE_VK=False), 4))
    if defaults_only:
        raise SystemExit(0)
    # the sweeps below keep the tf32x3 products of the figures recorded before bf16x3 was the default
    for cap in (None, 168):
        for nw in (4, 8):
            print(f"fold kernel (per head), {nw} warps, cap {cap}: "
                  + usage(ws._gdn_wy_fold_kernel, FOLD, dict(SHAPE, RAW16=True, EXACT=2, PDL=False, ROOT=False), nw, cap))
            print(f"fold kernel with the root folded in (per head), {nw} warps, cap {cap}: "
                  + usage(ws._gdn_wy_fold_kernel, FOLD, dict(SHAPE, RAW16=True, EXACT=2, PDL=False, ROOT=True), nw, cap))
    for bv in (32, 64):
        for cap in (None, 168):
            print(f"apply kernel (per V tile), {bv}-wide tiles, 4 warps, cap {cap}: "
                  + usage(ws._gdn_wy_fold_apply_kernel, APPLY, dict(SHAPE, V=128, BV=bv, EXACT=2, PDL=False, STATE_VK=False), 4,
                        cap))
    for bv in (32, 64, 128):
        for bk in (32, 64, 128):
            print(f"apply kernel of the folded root (per V tile), {bv}-wide tiles, {bk}-row K chunks, 4 warps: "
                  + usage(ws._gdn_wy_fold_root_apply_kernel, ROOT_APPLY,
                          dict(H=16, HV=48, K=128, V=128, BT=64, BK=128, BV=bv, BKC=bk, EXACT=2, PRECISION="tf32x3",
                               PDL=False, STATE_VK=False), 4))
    for what, name in enumerate(("one tf32x3 64 x 64 product", "a paired round (Triton's tf32x3)",
                                 "a paired round, tf32 MMAs chained by hand")):
        print(f"{name}, 4 warps: " + usage(_products, TILES, dict(BT=64, WHAT=what), 4))
