"""The one-kernel WY form where a tree fits one block (1 x 16: the root in the block, q and k as read, their rows'
norms from the rows as read, the state held) beside variants of it measured and not taken, one process, rows
interleaved round by round: kernels alone (bench.median_us_calls: the median of --calls do_bench calls, their range;
the L2 flushed before each call) and the device time (bench.kernel_device_us, three figures), each variant's output
against the default's (entries that differ, max |difference|) and the share of entries off the float64 oracle
rounded to bf16 (bench.off_rounded).

Variants: the form on its transposes, V as rows, so that the state is the products' first operand (M = 64): with
4 warps Triton makes them wgmma's (transposed (wgmma)); DISABLE_MMA_V3=1 while compiling keeps them mma.sync's
(transposed (mma.sync)). At 98ad0a4 the kernel also took, as constexprs, its state's read issued only once the rows'
norms, K K^T's column norms or -L's root column were made (late 1 / 2 / 3), the state read unmasked by 32-bit offsets
(ptr32) and with that its products in tf32 (ptr32+tf32); at 0cfc0d2 the form with its value-independent half folded
into the output's weights (fold: O = P S0 + Y, one product after the state arrives), its state's use held on -L's root
column, on P, or not held; at 6d83e0f (--variants tma) its state read by a tensor descriptor (TMA), with q and k, and
its state prefetched into L2 in bulk (cp.async.bulk.prefetch: each of its tile's rows, or its head in two halves)
before the read; at 575971a (--variants late) the head's state prefetched in bulk once its slot arrives and the tile
read only once -L's root column, or K K^T's column norms, were made. None faster; they were removed after (RESULTS.md).
The state's copy waited for at its use, which Triton's language cannot state, is timed by fused_tma_late.py.

    python benchmarks/fused_variants.py [--commit SHA] [--calls 5] [--rounds 3]
"""
import argparse
import os

import torch
import triton
import triton.language as tl

from ddsim import oracle
from ddsim.bench.bench import (
    at_least_one,
    cuda_run,
    off_rounded,
    timing_options,
    timing_rounds,
    wy_default_launch,
)
from ddsim.gpu_backend import triton_helpers as h
from ddsim.gpu_backend.launch import bind


@triton.jit
def _transposed_kernel(
    q, k, v, g, beta, A_log, dt_bias, mask, state, state_idx, o,
    T, scale, NSTEP,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, PRECISION: tl.constexpr, STATE_VK: tl.constexpr, UP: tl.constexpr, HOLD: tl.constexpr,
    MMA2: tl.constexpr = False,  # compiled with DISABLE_MMA_V3 (a key of its own)
):
    # _gdn_wy_kernel's root-in-the-block form (ROOT 2, RAW16, ROWNORM, HOLD) on the transposes: the state's products
    # S0^T [BV, BK] x K^T [BK, BT] (M = BV), so with 4 warps Triton makes them wgmma's with the state's bf16 head and
    # remainder as the register operand; U^T, the solve U^T (I + N^T) and O^T likewise, by columns of the nodes.
    # UP (the interpreter, whose bf16 products are wrong): fp32 operands
    _, i_b, i_hv, i_h, o_t, o_k, o_v, mk, mv, neg_A, bias = h.block_coords(A_log, dt_bias, H, HV, K, V, BT, BK, BV, FUSED)
    mt = o_t < T
    rows = (i_b * T + o_t).to(tl.int64)
    slot = tl.load(state_idx + i_b)
    mqk = mt[:, None] & mk[None, :]
    q_raw = h.raw_rows(q, rows[:, None], i_h, o_k[None, :], mqk, H, K, H * K)  # [BT, BK]
    k_raw = h.raw_rows(k, rows[:, None], i_h, o_k[None, :], mqk, H, K, H * K)
    vT = h.raw_rows(v, rows[None, :], i_hv, o_v[:, None], mv[:, None] & mt[None, :], HV, V, HV * V)  # [BV, BT]
    raw_g, raw_b = h.raw_gates(g, beta, rows * HV + i_hv, mt, True)
    anc = tl.load(mask + (i_b * T + o_t[:, None]).to(tl.int64) * T + o_t[None, :],
                  mask=mt[:, None] & mt[None, :], other=0) != 0
    sT = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK).trans(1, 0),
                 mask=mv[:, None] & mk[None, :], other=0.0)  # [BV, BK] S0^T
    b_g, b_beta = h.gate_values(raw_g, raw_b, neg_A, bias, FUSED)
    b_g = tl.where(mt, b_g, 0.0)
    b_beta = tl.where(mt, b_beta, 0.0)
    vT = vT.to(tl.float32)
    if UP:
        q_raw, k_raw = q_raw.to(tl.float32), k_raw.to(tl.float32)
    G = tl.sum(tl.where(anc, b_g[None, :], 0.0), 1)
    D = tl.where(anc, tl.exp(G[:, None] - G[None, :]), 0.0)
    q_raw, k_raw = tl.where(mqk, q_raw, 0.0), tl.where(mqk, k_raw, 0.0)
    KK = tl.dot(k_raw, tl.trans(k_raw))
    eye = o_t[:, None] == o_t[None, :]
    ik_col = 1.0 / tl.sqrt(tl.sum(tl.where(eye, KK, 0.0), 0) + 1e-6)
    k32, q32 = k_raw.to(tl.float32), q_raw.to(tl.float32)
    ik = 1.0 / tl.sqrt(tl.sum(k32 * k32, 1) + 1e-6)
    iq = scale / tl.sqrt(tl.sum(q32 * q32, 1) + 1e-6)
    KK = KK * ik_col[None, :]
    QK = tl.dot(q_raw, tl.trans(k_raw)) * ik_col[None, :]
    A = tl.exp(G)
    NL = tl.where(o_t[:, None] != o_t[None, :], -(b_beta * ik)[:, None] * D * KK, 0.0)
    A_k, A_q = A * ik, A * iq
    D = D * iq[:, None]
    first = o_t == 0
    c = tl.sum(tl.where(first[None, :], NL, 0.0), 1)  # [BT]
    NL = tl.where(first[None, :], 0.0, NL)
    if HOLD:
        sT = sT * (tl.sum(c - c, 0) + 1.0)
    if UP:
        KS = tl.dot(sT, tl.trans(k_raw), input_precision="ieee")  # [BV, BT]
        QS = tl.dot(sT, tl.trans(q_raw), input_precision="ieee")
    else:
        s_hi = sT.to(tl.bfloat16)
        s_lo = (sT - s_hi.to(tl.float32)).to(tl.bfloat16)
        KS = tl.dot(s_hi, tl.trans(k_raw), tl.dot(s_lo, tl.trans(k_raw)))
        QS = tl.dot(s_hi, tl.trans(q_raw), tl.dot(s_lo, tl.trans(q_raw)))
    U = b_beta[None, :] * (vT - A_k[None, :] * KS)  # [BV, BT] U^T
    u0 = tl.sum(tl.where(first[None, :], U, 0.0), 1)  # [BV]
    U = U + u0[:, None] * c[None, :]
    NLt = tl.trans(NL)
    if NSTEP > 0:
        U = U + tl.dot(U, NLt, input_precision=PRECISION)
    for _ in range(1, NSTEP):
        NLt = tl.dot(NLt, NLt, input_precision=PRECISION)
        U = U + tl.dot(U, NLt, input_precision=PRECISION)
    b_o = A_q[None, :] * QS + tl.dot(U, tl.trans(D * QK), input_precision=PRECISION)  # [BV, BT]
    tl.store(o + (rows[None, :] * HV + i_hv) * V + o_v[:, None], b_o.to(o.dtype.element_ty),
             mask=mv[:, None] & mt[None, :])


TRANSPOSED_ARGS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "mask", "state", "state_idx", "o", "T", "scale",
                   "NSTEP", "H", "HV", "K", "V", "BT", "BK", "BV", "FUSED", "PRECISION", "STATE_VK", "num_warps")


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=3)
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    cuda_run("fused_variants", a.commit)
    B, T = 1, 16
    default, o, grid, kw, inp, parents = wy_default_launch(B, T)
    default()
    torch.cuda.synchronize()
    if kw.get("ROOT") != 2 or not kw.get("RAW16"):
        raise SystemExit(f"fused_variants.py: the default at {B} x {T} is not the root-in-the-block form with q, k as "
                         "read; these variants are of that form")
    ref = oracle.gdn_tree_verify(**{k: inp[k].cpu() for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                                 initial_state=inp["initial_state"].cpu())
    forms = {"default": (default, o)}
    for name, mma2 in (("transposed (wgmma)", False), ("transposed (mma.sync)", True)):
        kk = {n: kw[n] for n in TRANSPOSED_ARGS}
        kk.update(o=torch.full_like(o, float("nan")), UP=False, HOLD=True, MMA2=mma2)
        if mma2:
            os.environ["DISABLE_MMA_V3"] = "1"  # read when the kernel compiles (its first launch, below)
        try:
            launch = bind(_transposed_kernel, grid, kk)
            launch()
            torch.cuda.synchronize()
        finally:
            os.environ.pop("DISABLE_MMA_V3", None)
        forms[name] = (launch, kk["o"])
    print(f"B x T {B} x {T}, {kw['num_warps']} warps, {kw['BV']}-wide V tiles\n")
    print("| form | differ from the default | max abs difference | off rounded oracle |")
    print("|---|---|---|---|")
    for name, (launch, out) in forms.items():
        launch()
        torch.cuda.synchronize()
        diff = (out.float() - o.float()).abs()
        print(f"| {name} | {(out != o).float().mean().item():.4%} | {diff.max().item():.3g} | "
              f"{off_rounded(out, ref):.4f} |", flush=True)
    timing_rounds({name: launch for name, (launch, _) in forms.items()}, rounds=a.rounds, calls=a.calls, warm=False)


if __name__ == "__main__":
    main()
