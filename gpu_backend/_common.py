"""Shared launcher helpers for the Triton kernels: input validation, tree tables, dtypes."""
from __future__ import annotations

import os

import torch

from ddsim.gpu_backend.checks import (
    check_fused_gates,
    check_gdn_args,
    check_mode,
    constant,
    poisoning,
    pool_slots,
    source_parents,
    vk_layout,
)
from ddsim.gpu_backend.launch import recording

# Launch options of the recurrent kernels whose two modes are one kernel compiled twice, parent-indexed for exact and
# flattened for leaky (KDA, lightning attention, Mamba1): no product and add contracted into an FMA. Contracted,
# ptxas fuses a product into another add in one compilation than in the other, and a leaky verify's order-exact
# nodes, which make the exact verify's steps, differ from it in their last bits (Mamba1 at Jamba's shape on the H200:
# 28% of the states, up to 3.8e-6; benchmarks/order_exact_bits.py). A reduction laid out apart in the two parts them
# too (KDA at K = 3): tests/test_kernels_compile.py holds both compilations to one layout at the serving widths.
ONE_ARITHMETIC = dict(enable_fp_fusion=False)

# The WY kernels' doubling rounds (NSTEP) compiled as a value, not a constant. Triton's launcher compiles an int
# argument equal to 1 as the constant 1 (and one divisible by 16, 0 among them, with that hint): a host plan of one
# round (DDTree's 1 x 16 with the root in the block, any tree of depth 2) got a kernel without the solve's loop, whose
# products and adds ptxas contracts otherwise than in the kernel a device plan gets (rounds read on the device, the
# launch's NSTEP a bound): compiled for sm_90 at an 8-node star, 48 FFMA and 68 FADD against 28 and 128. Its outputs
# differed in their last bits from a captured call's on the same tree (H100, RESULTS.md 2026-12-07). Every plan now
# gets one compilation per kernel (tests/test_device_checks.py specializes both plans' launches as the launcher does).
ROUNDS_AS_VALUE = dict(do_not_specialize=["NSTEP"])


# the values of TRITON_INTERPRET that Triton reads as on (its knobs' boolean reader: any case, nothing stripped)
_TRUE = frozenset(("1", "true", "on", "yes", "y"))


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter in this process: TRITON_INTERPRET read as Triton reads it.
    The one reader of the variable (the launchers, the device checks, the command line's --device cpu, the tests'
    interpreter mark); it imports no Triton."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in _TRUE


# input_precision of the WY kernels' products of fp32 operands. "bf16x3" (three bf16 MMAs of 8-bit head
# and remainder splits: about 2^-16 relative per product, at twice tf32's MMA rate) is the default for
# 16-bit inputs, whose outputs are rounded to 2^-9; fp32 inputs take "tf32x3" (about 2^-22).
DOT_PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16x3")


def check_precision(precision: str | None) -> None:
    if precision is not None and precision not in DOT_PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(DOT_PRECISIONS)} (or None), got {precision!r}")


def dot_precision(precision: str | None, *inputs: torch.Tensor) -> str:
    """The WY kernels' PRECISION for a checked ``precision`` (None: the default of the inputs' dtypes,
    bf16x3 when every input is 16-bit, tf32x3 otherwise). Triton's interpreter knows no bf16x3 (its
    products are plain fp32 matmuls whatever the precision), so there it runs as tf32x3."""
    if precision is None:
        precision = "bf16x3" if all(t.dtype in (torch.float16, torch.bfloat16) for t in inputs) else "tf32x3"
    return "tf32x3" if precision == "bf16x3" and interpreting() else precision


def next_pow2(n: int, lo: int = 16) -> int:
    """The least power of two >= max(n, lo) (lo a power of two)."""
    return max(lo, 1 << max(0, int(n) - 1).bit_length())


# The V tile's least width at a block of 64 rows or more. Compiled for sm_90 (Triton 3.6), a 64-row block over 8
# warps at a 16-wide V tile takes wgmma of N = 8, and on an H100 such launches of _gdn_wy_kernel read 256 bytes past
# shared memory (compute-sanitizer's memcheck: an illegal address, or NaN outputs), where the same launches at 32-
# and 64-wide tiles (N = 16 and 32) ran clean (benchmarks/wy_fault_probe.py, RESULTS.md). The split, fold, head and
# blocked forms ran clean at 16 as well; their plans take the rule too, a precaution. Only a V of at most 16, or a
# block_v of 16 asked for, drew it; benchmarks set it to 16 to reproduce the fault. Mamba2's SSD kernel takes it for
# its P tile too: at block_i 64 and 8 warps a 16-wide tile compiles (sm_90, Triton 3.6) to the same N = 8 layouts
# (its default block_i, 32, to mma.sync), yet on an H100 it ran clean at 16 (wy_fault_probe.py --design ssd): there
# too the rule is a precaution.
MIN_V_TILE_64 = 32


def v_tile(block_v: int, V: int, BT: int) -> int:
    """A kernel's V tile: block_v, at most V's power of two but at least 16, and at least MIN_V_TILE_64 where the
    block has BT >= 64 rows."""
    bv = min(block_v, next_pow2(V))
    return max(bv, MIN_V_TILE_64) if BT >= 64 else bv


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids. (Plain Python: triton.cdiv and triton.next_power_of_2 are
    constexpr functions whose calls cost microseconds of host time in a launcher.)"""
    return -(-a // b)


def row_stride(t: torch.Tensor) -> int | None:
    """The row stride in elements at which the kernels read t [B, T, heads, dim] in place, or None where they cannot:
    each token's heads must lie side by side in one row (dim stride 1, head stride dim) and the batch's rows one
    after another (batch stride T rows), as a serving engine's split of its fused projection is (SGLang's q, k, v of
    mixed_qkv: each row strided by the projection's width). Element (r, h, d) then lies at r * stride + h * dim + d,
    the address the kernels read it at."""
    B, T, heads, dim = t.shape
    s = t.stride()
    if (dim == 1 or s[3] == 1) and (heads == 1 or s[2] == dim) and (B == 1 or T == 1 or s[0] == T * s[1]):
        return s[1] if T > 1 else (s[0] if B > 1 else heads * dim)
    return None


def rows_of(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(t, its row stride) for a kernel's q, k or v [B, T, heads, dim]: t itself where the kernels read it in place
    (row_stride), else a contiguous copy (its row stride heads x dim). The stride is a constexpr of the kernels: a
    contiguous input compiles to the same code as before they took it."""
    rs = row_stride(t)
    return (t, rs) if rs is not None else (t.contiguous(), t.shape[2] * t.shape[3])


def qkv_rows(q, k, v) -> dict:
    """A GDN kernel's q, k, v and their row strides QS, KS, VS (rows_of), as keyword arguments."""
    (q, qs), (k, ks), (v, vs) = rows_of(q), rows_of(k), rows_of(v)
    return dict(q=q, k=k, v=v, QS=qs, KS=ks, VS=vs)


def check_device(*tensors) -> None:
    dev = tensors[0].device
    if dev.type != "cuda" and not interpreting():
        raise ValueError(f"triton kernels need CUDA tensors (or TRITON_INTERPRET=1), got {dev}")
    for t in tensors:
        if t is not None and t.device != dev:
            raise ValueError(f"all tensors must be on {dev}, one is on {t.device}")


def check_pool(initial_state, state_indices, B, HV, K, V):
    """initial_state is [B, HV, K, V] or a pool [N, HV, K, V] addressed by state_indices [B]."""
    if initial_state.dtype != torch.float32:
        raise ValueError(f"initial_state: expected float32, got {initial_state.dtype}")
    if initial_state.dim() != 4 or tuple(initial_state.shape[1:]) != (HV, K, V):
        raise ValueError(f"initial_state: expected [N, HV, K, V] with HV, K, V = {(HV, K, V)}, got "
                         f"{tuple(initial_state.shape)}")
    state_vk(initial_state)  # contiguous, or SGLang's pool seen through a transpose
    return pool_slots(initial_state, state_indices, B, "initial_state", "states", pads=True)  # the GDN kernels


def state_vk(pool: torch.Tensor) -> bool:
    """The kernels' STATE_VK of a state pool [N, HV, K, V]: False when contiguous, True when it is the
    transpose of a contiguous [N, HV, V, K] pool (``sglang_pool.transpose(-1, -2)``: read and written
    in place, no copy); any other layout is refused."""
    return vk_layout(pool, "initial_state", "a contiguous [N, HV, K, V] pool or the transpose of a contiguous "
                                           "[N, HV, V, K] one")


def window_slots(initial_window, state_indices, B: int) -> torch.Tensor:
    """int32 [B] slots of the batch's conv windows in initial_window [N, C, W-1]."""
    return pool_slots(initial_window, state_indices, B, "initial_window", "windows")


def gates_args(g, beta, a, b, A_log, dt_bias, B, T, HV, device):
    """Either (g, beta) or the fused (a, b, A_log, dt_bias) (after check_gdn_args); returns the four
    kernel tensors and FUSED."""
    fused = g is None
    if fused:
        if any(x is None for x in (a, b, A_log, dt_bias)):
            raise ValueError("gates: pass g and beta, or all of a, b, A_log and dt_bias")
        check_fused_gates(a, b, A_log, dt_bias)  # a's shape [B, T, HV] checked before (check_gdn_args)
        return a.contiguous(), b.contiguous(), A_log.contiguous(), dt_bias.contiguous(), True
    dummy = constant("dummy", 1, device)
    return g.contiguous(), beta.contiguous(), dummy, dummy, False


def alloc(shape, dtype, device, poison: bool | None = None):
    """A fresh output: NaN-filled when poisoning (``poison``, or by default ``checks.poisoning()``:
    in the tests and audits) so an unwritten element cannot pass a comparison; else left unfilled,
    as a serving engine allocates."""
    if poisoning() if poison is None else poison:
        t = torch.full(shape, float("nan"), dtype=dtype, device=device)
    else:
        t = torch.empty(shape, dtype=dtype, device=device)
    rec = recording()
    if rec is not None:  # fastcall is recording this call: a replay allocates (and poisons) the same
        rec.allocs.append((t, poison is None))
    return t


def scratch(shape, dtype, device):
    """A launcher's intermediate buffer (kernels write it before any kernel reads it): never filled."""
    t = torch.empty(shape, dtype=dtype, device=device)
    rec = recording()
    if rec is not None:
        rec.allocs.append((t, False))
    return t


def prep_gdn(q, k, v, g, beta, a, b, A_log, dt_bias, parents, initial_state, state_indices, mode):
    """Validate a GDN Triton call (one set of checks shared with the torch path) and build its kernel arguments:
    (B, T, H, HV, K, V, source parents, pool indices, gates)."""
    B, T, H, HV, K, V = check_gdn_args(q, k, v, g, beta, a, b)
    check_device(q, k, v, initial_state)
    check_mode(mode)
    src = source_parents(parents, B, T, q.device, mode)
    idx = check_pool(initial_state, state_indices, B, HV, K, V)
    gates = gates_args(g, beta, a, b, A_log, dt_bias, B, T, HV, q.device)
    return B, T, H, HV, K, V, src, idx, gates
