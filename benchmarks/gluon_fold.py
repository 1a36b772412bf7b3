"""Whether a Gluon kernel could bring the one-kernel WY form at 1 x 16 under #36's bound: the form folded into its
output's weights (fused_fold_late.py's fold: O = P S0 + Y), written in Gluon (Triton's lower-level language) so that
its state is copied by the copy engine (TMA) into shared memory as soon as its slot arrives and waited for only where
P S0 needs it, and read from there straight into the product's operand layout; Triton's language states neither
(fused_tma_late.py measured the wait's place by editing the compiled IR). A measurement, not a served kernel: one
sequence of 16 nodes (the root in the block, DDTree's tree), bf16 q, k, v as read, the gates given, a state pool
in ddsim's layout read through its slot table, 4 warps, 64-wide V tiles, Qwen3.6-27B GDN shapes.

Products: K K^T, Q K^T (exact: bf16 operands), the solve's doubling on 16 x 16 matrices and W's products by K and V
(the fp32 side split into bf16 head and remainder), P S0 (P and the state split: three MMAs), all mma.sync (mma_v2).
Printed: the output against the served form's and the share of entries off the float64 oracle rounded to bf16
(bench.off_rounded), then the timing table (bench.timing_rounds: the timer, three device times after do_bench's flush,
one warm) beside the served form, the same kernel with its state never read (its product by zero: what its chain
before the state takes), and with its state copied as two boxes of 128-byte rows into swizzled shared memory (one box
of 256-byte rows, unswizzled, otherwise), and with P S0's three products accumulated in three chains (whether the time
after the state arrives is their one chain, 3 K / 16 MMAs deep), and with its copy waited for but only eight of its
rows read (P S0 by zero: when the copy lands in the fold). And both again with the copy issued before any other read,
at the sequence's own row (no slot: the state by sequence, as the kernel table's kernels alone hold it), a barrier
after it so that ptxas cannot sink its issue below the reads. And the three again with two barriers among the reads
(q, k, v's; beta's; the gates' and mask's), so that ptxas issues every read before the first use of any (without them
it sums the path gates, which waits for them, before some of the reads, and those go out a round trip late, beside the
state's copy), and the fenced, chained form with its state copied by cp.async instead of TMA (pointers, no descriptor:
what gpu_backend.gluon_gdn serves, since a launch of plain tensors is what fastcall replays and any GPU from Ampere
on runs). The tile's two halves of V each take their own product and store. Timed beside them: the state's copy
alone in both forms (the slot, the copy, the wait, each column's sum stored), when the copy arrives. Its inputs are
read coalesced and each moved once into its uses' layouts: read straight into those layouts instead (8d415f8: 37
barriers compiled for sm_90 against 73), the chain took 1.8 us more on an H100 (RESULTS.md), and that revision was
reverted.

    python benchmarks/gluon_fold.py [--commit SHA] [--calls 5] [--rounds 3]   # needs CUDA (sm_90 or later)
"""
import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ddsim import oracle
from ddsim.bench.bench import at_least_one, cuda_run, off_rounded, timing_options, timing_rounds, wy_default_launch
from ddsim.gpu_backend.gluon_gdn import _cp_async, _fold, _thread_barrier  # the served kernel's pieces

# The copy engine's load into shared memory: Triton 3.6's name (the GPUs' Triton), or its later one (3.9 renamed it)
if hasattr(tma, "async_load"):
    @gluon.jit
    def _tma_load(desc, coord, bar, smem):
        tma.async_load(desc, coord, bar, smem)
else:
    @gluon.jit
    def _tma_load(desc, coord, bar, smem):
        tma.async_copy_global_to_shared(desc, coord, bar, smem)


@gluon.jit
def _tail(p_hi, p_lo, s0, Y, ptrs, CHAINS: gl.constexpr):
    # P S0 + Y stored: the state's tile split into its bf16 head and remainder in the operand layout it was read in
    # (CHAINS: the three products accumulated apart and summed, three chains of K / 16 MMAs where one is 3 K / 16 deep)
    s_hi = s0.to(gl.bfloat16)
    s_lo = (s0 - s_hi.to(gl.float32)).to(gl.bfloat16)
    if CHAINS:
        zero = gl.zeros_like(Y)
        b_o = mma_v2(p_hi, s_hi, Y) + (mma_v2(p_hi, s_lo, zero) + mma_v2(p_lo, s_hi, zero))
    else:
        b_o = mma_v2(p_hi, s_hi, mma_v2(p_hi, s_lo, mma_v2(p_lo, s_hi, Y)))
    gl.store(ptrs, b_o.to(gl.bfloat16))


@gluon.jit
def _gluon_fold_kernel(q, k, v, g, beta, mask, state, state_desc, state_idx, o, scale, NSTEP,
                       H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                       BT: gl.constexpr, BV: gl.constexpr, READ: gl.constexpr, HALVES: gl.constexpr,
                       CHAINS: gl.constexpr, LOAD: gl.constexpr, FIRST: gl.constexpr, FENCE: gl.constexpr,
                       CPASYNC: gl.constexpr, num_warps: gl.constexpr):
    # one sequence (i_b 0) of BT nodes, the root node 0; a program per (V tile, value head)
    i_v = gl.program_id(0)
    i_hv = gl.program_id(1)
    i_h = i_hv // (HV // H)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps], instr_shape=[16, 8])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)  # [BT] a value per row
    COLS: gl.constexpr = gl.SliceLayout(0, MMA)  # [BT] / [BV] a value per column
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [BT, K] bf16 rows, 16 bytes a thread
    LDT: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, num_warps], [0, 1])  # [K, BT]: k^T read by columns
    HB: gl.constexpr = BV // 2

    # the state's buffer and its barrier (HALVES: the descriptor's box is half the tile's width, 128-byte rows, so
    # that its shared layout can be swizzled; two copies)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if HALVES:
        s_smem = gl.allocate_shared_memory(gl.float32, [2, K, HB], state_desc.layout)
    else:
        s_smem = gl.allocate_shared_memory(gl.float32, [K, BV], state_desc.layout)
    if FIRST:  # the copy issued before any read, at the sequence's own row (no slot: the state by sequence, as the
        # kernel table's kernels alone hold it; one box), then a barrier: without it ptxas sinks the copy's issue below
        # the reads and the first use of the mask and gates, a round trip later (compiled for sm_90)
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, state_desc.block_type.nbytes)
        _tma_load(state_desc, [i_hv * K, i_v * BV], bar, s_smem)
        _thread_barrier()

    # the slot read first; the state's copy is issued once the other reads have gone out (its address waits on the
    # slot's arrival, and a read issued after it would wait as long)
    slot = gl.load(state_idx)

    # q, k [BT, K] as read (k^T [K, BT] too), v [BT, BV], the gates and the ancestor-or-self mask [BT, BT]
    r_ld = gl.arange(0, BT, layout=gl.SliceLayout(1, LD))
    c_ld = gl.arange(0, K, layout=gl.SliceLayout(0, LD))
    q_raw = gl.load(q + (r_ld[:, None] * H + i_h) * K + c_ld[None, :])
    k_raw = gl.load(k + (r_ld[:, None] * H + i_h) * K + c_ld[None, :])
    r_t = gl.arange(0, K, layout=gl.SliceLayout(1, LDT))
    c_t = gl.arange(0, BT, layout=gl.SliceLayout(0, LDT))
    k_t = gl.load(k + (c_t[None, :] * H + i_h) * K + r_t[:, None])
    rows = gl.arange(0, BT, layout=ROWS)
    cols = gl.arange(0, BT, layout=COLS)
    o_v0 = i_v * BV + gl.arange(0, HB, layout=COLS)  # the tile's halves of V, each its own product and store
    o_v1 = o_v0 + HB
    b_v0 = gl.load(v + (rows[:, None] * HV + i_hv) * V + o_v0[None, :])  # [BT, HB] bf16, MMA
    b_v1 = gl.load(v + (rows[:, None] * HV + i_hv) * V + o_v1[None, :])
    if FENCE:  # a barrier after q, k, v's reads: without the two ptxas puts the gates' first use (the path sums,
        # which wait for the gates and the mask) before some of q, k, v's reads and gives those reads the gates'
        # registers, so they go out a round trip late, beside the state's copy (compiled for sm_90); a read cannot
        # cross a barrier, and a use cannot rise above its read
        _thread_barrier()
    b_beta = gl.load(beta + rows * HV + i_hv)
    beta_col = gl.load(beta + cols * HV + i_hv)
    if FENCE:  # and one between beta's reads and the gates' and mask's, whose first use waits for them
        _thread_barrier()
    g_col = gl.load(g + cols * HV + i_hv)
    anc = gl.load(mask + rows[:, None] * BT + cols[None, :]) != 0

    # the state: the copy engine into shared memory, waited for where P S0 needs it (READ off: never read, zero);
    # CPASYNC: each thread's 16-byte pieces of the tile copied into shared memory by cp.async (pointers, no descriptor:
    # what a launch of plain tensors can state), waited for as the copy engine's is
    if READ and CPASYNC:
        CP: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [num_warps, 1], [1, 0])  # [K, BV] fp32, 16 bytes a thread
        r_cp = gl.arange(0, K, layout=gl.SliceLayout(1, CP))
        c_cp = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, CP))
        _cp_async(s_smem, state + ((slot * HV + i_hv) * K + r_cp[:, None]) * V + c_cp[None, :], None)
        async_copy.commit_group()
    elif READ and not FIRST:
        mbarrier.init(bar, count=1)
        row = (slot * HV + i_hv) * K
        if HALVES:
            mbarrier.expect(bar, 2 * state_desc.block_type.nbytes)
            _tma_load(state_desc, [row, i_v * BV], bar, s_smem.index(0))
            _tma_load(state_desc, [row, i_v * BV + HB], bar, s_smem.index(1))
        else:
            mbarrier.expect(bar, state_desc.block_type.nbytes)
            _tma_load(state_desc, [row, i_v * BV], bar, s_smem)

    # the fold's weights on the rows as read, the l2 norms applied (gluon_gdn._fold, the served kernel's)
    p_hi, p_lo, Y0, Y1 = _fold(q_raw, k_raw, k_t, b_v0, b_v1, b_beta, beta_col, g_col, anc, scale, NSTEP, True, BT, K,
                               HB, MMA, A_OP, B_OP)

    # the state: waited for here, read from the copy's shared memory straight into the product's operand layout
    if READ:
        if CPASYNC:  # each thread's own copies, then every thread's
            async_copy.wait_group(0)
            _thread_barrier()
        else:
            mbarrier.wait(bar, 0)
            mbarrier.invalidate(bar)
        if not LOAD:  # when the copy lands: eight of its rows read and summed to a zero added to Y (which keeps its
            # buffer live past the wait: a buffer nothing reads after it is reused while the copy writes it), P S0 by
            # zero (one box only)
            LB: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
            few = gl.sum(gl.sum(s_smem.slice(0, 8, dim=0).load(LB), 1), 0) * 0.0
            Y0 = Y0 + few
            Y1 = Y1 + few
            s0 = gl.zeros([K, HB], gl.float32, B_OP)
            s1 = s0
        elif HALVES:
            s0 = s_smem.index(0).load(B_OP)  # [K, HB] fp32
            s1 = s_smem.index(1).load(B_OP)
        else:
            s0 = s_smem.slice(0, HB, dim=1).load(B_OP)
            s1 = s_smem.slice(HB, HB, dim=1).load(B_OP)
    else:
        s0 = gl.zeros([K, HB], gl.float32, B_OP)
        s1 = s0
    _tail(p_hi, p_lo, s0, Y0, o + (rows[:, None] * HV + i_hv) * V + o_v0[None, :], CHAINS)
    _tail(p_hi, p_lo, s1, Y1, o + (rows[:, None] * HV + i_hv) * V + o_v1[None, :], CHAINS)


@gluon.jit
def _gluon_copy_kernel(state_desc, state_idx, out, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                       BV: gl.constexpr, HALVES: gl.constexpr, num_warps: gl.constexpr):
    # the fold's state copy alone, on its grid: the slot, the copy (one box, or two of half the width), the wait,
    # each column's sum over K stored (so that nothing is dropped): when the copy arrives
    i_v = gl.program_id(0)
    i_hv = gl.program_id(1)
    HB: gl.constexpr = BV // 2
    LB: gl.constexpr = gl.BlockedLayout([4, 1], [4, 8], [num_warps, 1], [0, 1])
    slot = gl.load(state_idx)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    row = (slot * HV + i_hv) * K
    o_h = i_v * BV + gl.arange(0, HB, layout=gl.SliceLayout(0, LB))
    if HALVES:
        s_smem = gl.allocate_shared_memory(gl.float32, [2, K, HB], state_desc.layout)
        mbarrier.expect(bar, 2 * state_desc.block_type.nbytes)
        _tma_load(state_desc, [row, i_v * BV], bar, s_smem.index(0))
        _tma_load(state_desc, [row, i_v * BV + HB], bar, s_smem.index(1))
        mbarrier.wait(bar, 0)
        gl.store(out + i_hv * V + o_h, gl.sum(s_smem.index(0).load(LB), 0))
        gl.store(out + i_hv * V + o_h + HB, gl.sum(s_smem.index(1).load(LB), 0))
    else:
        s_smem = gl.allocate_shared_memory(gl.float32, [K, BV], state_desc.layout)
        mbarrier.expect(bar, state_desc.block_type.nbytes)
        _tma_load(state_desc, [row, i_v * BV], bar, s_smem)
        mbarrier.wait(bar, 0)
        gl.store(out + i_hv * V + o_h, gl.sum(s_smem.slice(0, HB, dim=1).load(LB), 0))
        gl.store(out + i_hv * V + o_h + HB, gl.sum(s_smem.slice(HB, HB, dim=1).load(LB), 0))
    mbarrier.invalidate(bar)


def _state_desc(kw: dict, halves: bool):
    """The state pool's host descriptor: boxes of the V tile's width, unswizzled (256-byte rows), or of half of it
    into 128-byte swizzled shared memory."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    state, BV = kw["state"], kw["BV"]
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128 if halves else 0, element_bitwidth=32, rank=2)
    return TensorDescriptor.from_tensor(state.view(-1, state.shape[-1]), [state.shape[-2], BV // 2 if halves else BV],
                                        layout)


def kernel_args(kw: dict, out: torch.Tensor, *, read: bool = True, halves: bool = False, copy: bool = False,
                chains: bool = False, load: bool = True, first: bool = False, fence: bool = False,
                cpasync: bool = False):
    """(kernel, keyword arguments, grid) of the Gluon fold on the served form's inputs (plan_wy's keyword arguments
    ``kw``) into ``out`` (o's shape); read False: the state never read (its product by zero), what the chain before it
    takes; halves: the state copied as two boxes of 128-byte rows into swizzled shared memory, where otherwise one
    box of 256-byte rows, unswizzled; chains: P S0's three products accumulated apart (_tail's CHAINS); load False:
    the copy waited for, eight of its rows read, P S0 by zero (LOAD); first: the copy issued before any read, at the
    sequence's own row, no slot (FIRST; the state by sequence, one sequence); fence: two barriers among the reads so
    that ptxas issues every read before any is used (FENCE); cpasync: the state copied by cp.async instead of TMA (its
    pointer, one box's shared layout; CPASYNC). copy:
    _gluon_copy_kernel instead, the state's copy alone, into out [HV, V] fp32."""
    args = dict(state_desc=_state_desc(kw, halves), state_idx=kw["state_idx"], HV=kw["HV"], K=kw["K"], V=kw["V"],
                BV=kw["BV"], HALVES=halves, num_warps=4)
    if copy:
        fn = _gluon_copy_kernel
        args.update(out=out)
    else:
        fn = _gluon_fold_kernel
        args.update(q=kw["q"], k=kw["k"], v=kw["v"], g=kw["g"], beta=kw["beta"], mask=kw["mask"], state=kw["state"],
                    o=out, scale=kw["scale"], NSTEP=kw["NSTEP"], H=kw["H"], BT=kw["T"], READ=read, CHAINS=chains,
                    LOAD=load, FIRST=first, FENCE=fence, CPASYNC=cpasync)
    return fn, args, (kw["V"] // kw["BV"], kw["HV"])


FORMS = {  # each timed form of the fold: kernel_args' flags
    "Gluon fold, TMA waited for at P S0": {},
    "Gluon fold, the state not read": dict(read=False),
    "Gluon fold, TMA in two swizzled halves": dict(halves=True),
    "Gluon fold, P S0's products in three chains": dict(chains=True),
    "Gluon fold, the copy waited for, 8 of its rows read": dict(load=False),
    "Gluon fold, the copy issued first, no slot": dict(first=True),
    "the same, 8 of its rows read": dict(first=True, load=False),
    "Gluon fold, every read issued before any is used": dict(fence=True),
    "the same, the state not read": dict(fence=True, read=False),
    "the same, 8 of the copy's rows read": dict(fence=True, load=False),
    "the same, P S0 in three chains": dict(fence=True, chains=True),
    "the same, two swizzled boxes too": dict(fence=True, chains=True, halves=True),
    "the same, the state by cp.async, one box's layout": dict(fence=True, chains=True, cpasync=True),
}


def launch_of(kw: dict, out: torch.Tensor, **how):
    """kernel_args' launch (``how``: read, halves, copy, chains, load, first)."""
    fn, args, grid = kernel_args(kw, out, **how)
    return lambda: fn[grid](**args)


def offline_compile(arch: int, **how):
    """The fold's kernel in the form kernel_args' flags ``how`` say (copy: the state's copy alone) compiled for
    sm_<arch> without a GPU (CPU tensors of the served form's launch at 1 x 16, the launcher's signature; run without
    TRITON_INTERPRET): Triton's compiled kernel, its TTGIR in .asm["ttgir"]."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import mangle_type

    from ddsim.bench.bench import compile_kernel, ddtree_batch, kernel_inputs
    from ddsim.gpu_backend import _common, triton_gdn
    got = []
    bind, check, interpreting = triton_gdn.bind, _common.check_device, _common.interpreting
    triton_gdn.bind = lambda kernel, grid, kw: got.append(dict(kw)) or (lambda: None)
    _common.check_device, _common.interpreting = (lambda *xs: None), (lambda: False)
    try:
        _, parents = ddtree_batch(1, 16)
        inp = kernel_inputs(1, 16, dtype=torch.bfloat16, device="cpu")
        triton_gdn.plan_wy(**{n: inp[n] for n in ("q", "k", "v", "g", "beta")}, parents=parents,
                           initial_state=inp["initial_state"], poison=False, design="auto")
    finally:
        triton_gdn.bind, _common.check_device, _common.interpreting = bind, check, interpreting
    kw = got[-1]
    out = torch.empty(kw["HV"], kw["V"]) if how.get("copy") else kw["o"]
    fn, args, _ = kernel_args(kw, out, **how)
    return compile_kernel(fn, args, GPUTarget("cuda", arch, 32), types={"state_desc": mangle_type(args["state_desc"])})


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=3)
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    cuda_run("gluon_fold", a.commit)
    B, T = 1, 16
    default, o, grid, kw, inp, parents = wy_default_launch(B, T)
    if (kw.get("ROOT") != 2 or not kw.get("RAW16") or kw.get("FUSED") or kw.get("STATE_VK") or kw.get("DEPTHS")
            or kw["BT"] != T or kw["BV"] != 64):
        raise SystemExit(f"gluon_fold: the form at {B} x {T} is not the one this kernel is of")
    ref = oracle.gdn_tree_verify(**{n: inp[n].cpu() for n in ("q", "k", "v", "g", "beta")}, parents=parents,
                                 initial_state=inp["initial_state"].cpu())
    forms = {"the form": (default, o)}
    for name, how in FORMS.items():
        x = torch.full_like(o, float("nan"))
        forms[name] = (launch_of(kw, x, **how), x)
    copies = {f"the state's copy alone, {name}": launch_of(kw, torch.empty(kw["HV"], kw["V"], device="cuda"),
                                                           halves=h, copy=True)
              for name, h in (("one box", False), ("two swizzled boxes", True))}
    for launch, _ in forms.values():
        launch()
    torch.cuda.synchronize()
    print("| form | entries that differ from the form's | max abs difference | off the rounded oracle | finite |")
    print("|---|---|---|---|---|")
    for name, (_, x) in forms.items():
        print(f"| {name} | {(x != o).float().mean().item():.4%} | {(x.float() - o.float()).abs().max().item():.3g} | "
              f"{off_rounded(x, ref):.4%} | {bool(torch.isfinite(x).all())} |", flush=True)
    timing_rounds({**{name: launch for name, (launch, _) in forms.items()}, **copies}, rounds=a.rounds, calls=a.calls)


if __name__ == "__main__":
    main()
