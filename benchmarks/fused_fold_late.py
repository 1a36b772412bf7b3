"""The one-kernel WY form at one sequence (1 x 16: the root in the block, q and k as read, their rows' norms from the
rows as read) with its value-independent half folded into the output's weights, its state's read placed in several
ways, beside the form, in one process, rows interleaved round by round (Qwen3.6-27B GDN shapes, bf16 inputs, a DDTree
tree).

After do_bench's flush the form waits on its state's read (fused_ablation.py: 4.6 us of device time with its whole
value side cut, 3.0 without the state's read, the form 5.2), and after the state arrives it still makes K S0 and
Q S0, the right-hand side, the solve and the output's product. Folded (O = P S0 + Y, with X = (D o Q K^T)
prod_r (I + N^(2^r)), W = X (I + c e_0^T), P = diag(a_q) Q - W diag(beta a_k) K [BT, BK], Y = W diag(beta) V
[BT, BV]), one product is left after the state arrives:

  fold, no state                 the fold with the state not read (P times zero): when the fold's weights are made,
                                 and what its tail costs
  fold, state held on P          the state read at once by 16-byte loads, its use held until P is made (as
                                 0cfc0d2's FOLD_HOLD), at each of --configs (warps x V tile width)
  ..., four products             the same with P S0's remainder by remainder too: what the fold's error owes to it
  fold, TMA, waited at once      (--tma) the state read by a host tensor descriptor (the copy engine) where the form reads
                                 it, as Triton 3.6 compiles it: the copy waited for where it is issued
  fold, TMA, waited at use       (--tma) its TTGIR with the copy's wait moved to the state's first use, the hold on P
                                 (fused_tma_late.waited_at_use), compiled from that IR: the order a Gluon port could
                                 state; a measurement, not a servable kernel

At 1e37fa5 the script also timed the tile read by 16-byte loads only once W or P were made, after the head was sent
into L2 in bulk as soon as its slot arrived (cp.async.bulk.prefetch) or without that: 7.1-7.6 us of device time on
an H100 against the form's 5.9 (RESULTS.md); those rows are gone.

Products: X's doubling chain as the form's solve (bf16x3); W's products by K and V with W split into bf16 head and
remainder (q, k and v are exact in bf16: two MMAs each); P S0 with P and the state split (three MMAs: head by head,
head by remainder, remainder by head). Each copy is _gdn_wy_kernel's source with its state's read and value side
replaced (bench.edited_kernel); the TMA copies take the form's launch with HOLD off (so that their state's first use
is the hold on P). Printed: each copy's output against the form's and the share of its entries off the float64
oracle rounded to bf16 (bench.off_rounded), then the timing table (bench.timing_rounds; the TMA rows' timer takes in
the descriptor's encoding on the host, their device time does not).

    python benchmarks/fused_fold_late.py [--commit SHA] [--calls 5] [--rounds 3] [--configs 4x64,2x32] [--tma]
        # compiled only: needs CUDA
"""
import argparse
import inspect
import tempfile

import torch
from fused_tma_late import (  # benchmarks/, the script's own folder
    COORDS,
    COORDS_V,
    READ,
    TMA_READ,
    compiled_ir,
    desc_type,
    descriptor_launches,
    swapped,
    waited_at_use,
)
from triton.backends.compiler import GPUTarget

from ddsim import oracle
from ddsim.bench.bench import (
    at_least_one,
    compile_kernel,
    cuda_run,
    edited_kernel,
    off_rounded,
    timing_options,
    timing_rounds,
    warps_widths,
    wy_default_launch,
)
from ddsim.gpu_backend.launch import bind

HEADER = """import triton
import triton.language as tl
from ddsim.gpu_backend import triton_helpers as h


@triton.jit
def _split_dot(w, x, acc):
    # w [M, N] fp32 by x [N, P] bf16 (exact) onto acc: w's bf16 head and remainder, two MMAs
    w_hi = w.to(tl.bfloat16)
    return tl.dot(w_hi, x, tl.dot((w - w_hi.to(tl.float32)).to(tl.bfloat16), x, acc))


"""
VALUE_START = "    if RAW16:\n        # the head and remainder made by conversions"
VALUE_END = "    b_o = A_q[:, None] * QS + tl.dot(D * QK, U, input_precision=PRECISION)\n"
NO_READ = "        s0 = tl.zeros([BK, BV], tl.float32)\n"


def _fold(hold: bool, four: bool = False) -> str:
    """The value side folded (ROOT 2, RAW16, ROWNORM: D's rows carry q's norms, A_k and A_q the rows' norms); with
    ``hold`` the state's first use is its product by P's zero (a sum over P's rows and columns); with ``four`` P S0
    takes the remainder by remainder too (four MMAs)."""
    return (
        "    X = D * QK\n"
        "    NSTEP = h.solve_rounds(NSTEP, depth, DEPTHS, 0)\n"
        "    NLp = NL\n"
        "    if NSTEP > 0:\n"
        "        X = X + tl.dot(X, NLp, input_precision=PRECISION)\n"
        "    for _ in range(1, NSTEP):\n"
        "        NLp = tl.dot(NLp, NLp, input_precision=PRECISION)\n"
        "        X = X + tl.dot(X, NLp, input_precision=PRECISION)\n"
        "    W = X + tl.where(first[None, :], tl.sum(X * c[None, :], 1)[:, None], 0.0)  # X (I + c e_0^T)\n"
        "    P = A_q[:, None] * q_raw.to(tl.float32) - _split_dot(W * (b_beta * A_k)[None, :], k_raw,\n"
        "                                                        tl.zeros([BT, BK], tl.float32))\n"
        "    Y = _split_dot(W * b_beta[None, :], b_v.to(tl.bfloat16), tl.zeros([BT, BV], tl.float32))\n"
        + ("    s0 = s0 * (tl.sum(tl.sum(P - P, 1), 0) + 1.0)\n" if hold else "") +
        "    s_hi = s0.to(tl.bfloat16)\n"
        "    s_lo = (s0 - s_hi.to(tl.float32)).to(tl.bfloat16)\n"
        "    p_hi = P.to(tl.bfloat16)\n"
        "    p_lo = (P - p_hi.to(tl.float32)).to(tl.bfloat16)\n"
        + ("    Y = tl.dot(p_lo, s_lo, Y)\n" if four else "") +
        "    b_o = tl.dot(p_hi, s_hi, tl.dot(p_hi, s_lo, tl.dot(p_lo, s_hi, Y)))\n")


VARIANTS = {  # name: (the state's read, the value side)
    "fold, no state": (NO_READ, _fold(hold=False)),
    "fold, state held on P": (READ, _fold(hold=True)),
    "fold, state held on P, four products": (READ, _fold(hold=True, four=True)),
    "fold, TMA": (TMA_READ, _fold(hold=True)),  # compiled as is (waited at once) and from its edited TTGIR
}


def fold_kernel(name: str):
    """_gdn_wy_kernel with its state's read and value side replaced as VARIANTS[name] says (bench.edited_kernel)."""
    from ddsim.gpu_backend import triton_gdn as G
    src = inspect.getsource(G._gdn_wy_kernel.fn)
    if src.count(VALUE_START) != 1 or src.count(VALUE_END) != 1:
        raise SystemExit("fused_fold_late: _gdn_wy_kernel's value side no longer starts and ends as this script reads it")
    value = src[src.index(VALUE_START):src.index(VALUE_END) + len(VALUE_END)]
    read, fold = VARIANTS[name]
    edits = [(COORDS, COORDS_V), (READ, read), (value, fold)]
    return edited_kernel(G._gdn_wy_kernel, edits, header=HEADER, who="fused_fold_late")


def tma_forms(grid, kw, o) -> dict:
    """{name: (launch, output)} of the TMA fold, waited for at once (Triton's compile) and at its use (the TTGIR
    edited): each a compiled kernel launched on a host tensor descriptor of the state."""
    cap = torch.cuda.get_device_capability()
    target = GPUTarget("cuda", cap[0] * 10 + cap[1], 32)
    kern = fold_kernel("fold, TMA")
    kw = dict(kw, HOLD=False)  # the hold on -L's root column off: the state's first use is the hold on P
    at_once = compile_kernel(kern, kw, target, types={"state": desc_type(kw)})
    late = swapped(at_once, compiled_ir(waited_at_use(at_once.asm["ttgir"]), tempfile.mkdtemp(prefix="ddsim_fold_"),
                                        "fold_late", target))
    return descriptor_launches(kern, {"fold, TMA, waited at once": at_once, "fold, TMA, waited at use": late}, kw,
                               grid, o)


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=3)
    ap.add_argument("--configs", default="4x64", help="comma-separated warps x V tile width, e.g. 4x64,2x32 (the form "
                    "and the fold held on P at each; the other rows at the first)")
    ap.add_argument("--tma", action="store_true", help="also the fold read by TMA, waited for at once and at its use")
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    configs = warps_widths(ap, a.configs)
    cuda_run("fused_fold_late", a.commit)
    B, T = 1, 16
    forms, ref = {}, None
    for n, (warps, block_v) in enumerate(configs):
        default, o, grid, kw, inp, parents = wy_default_launch(B, T, design="fused", num_warps=warps, block_v=block_v)
        if (kw.get("ROOT") != 2 or not kw.get("RAW16") or not kw.get("ROWNORM") or kw.get("CHAINS")
                or kw.get("STATE_VK") or kw.get("DEPTHS")):
            raise SystemExit(f"fused_fold_late: the form at {B} x {T} is not the one these copies are of")
        if ref is None:
            ref = oracle.gdn_tree_verify(**{k: inp[k].cpu() for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                                         initial_state=inp["initial_state"].cpu())
            base = o
        tag = f"{warps} warps, {block_v} wide"
        forms[f"{tag}: the form"] = (default, o)
        names = ["fold, state held on P"] if n else [v for v in VARIANTS if v != "fold, TMA"]  # (TMA: --tma)
        for name in names:
            out = torch.full_like(o, float("nan"))
            forms[f"{tag}: {name}"] = (bind(fold_kernel(name), grid, dict(kw, o=out)), out)
        if a.tma and not n:
            forms.update({f"{tag}: {k}": v for k, v in tma_forms(grid, kw, o).items()})
    for launch, _ in forms.values():
        launch()
    torch.cuda.synchronize()
    print(f"B x T {B} x {T}, NSTEP {kw['NSTEP']}\n")
    print("| form | entries that differ from the default form's | max abs difference | off the rounded oracle |")
    print("|---|---|---|---|")
    for name, (_, out) in forms.items():
        diff = (out.float() - base.float()).abs()
        print(f"| {name} | {(out != base).float().mean().item():.4%} | {diff.max().item():.3g} | "
              f"{off_rounded(out, ref):.4%} |", flush=True)
    timing_rounds({name: launch for name, (launch, _) in forms.items()}, rounds=a.rounds, calls=a.calls)


if __name__ == "__main__":
    main()
