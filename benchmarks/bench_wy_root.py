"""The one-kernel WY form's places for the root (triton_gdn.FUSED_ROOT: its recurrent step first, or row 0 of the block,
its chain counted or its column eliminated) and its products by q and k (triton_gdn.FUSED_RAW16: bf16 as read, or
l2-normed in fp32 with bf16x3) side by side, where the whole tree fits one block: kernels
alone (do_bench, L2 flushed before each call; and the kernel's own device time from the profiler,
bench.kernel_device_us) and graphed (N layers' inputs back to back from one CUDA graph, us a layer) over warps and V
tiles, Qwen3.6-27B GDN shapes, bf16 inputs, DDTree trees
(past 16 nodes the root cannot join the block: those shapes time the root-first form alone). Each
row's output against the shape's first row's (max |difference|) and against the float64 oracle rounded to bf16 (the
share of entries that differ: ddsim.bench.bench.off_rounded). --hold 1,0 times the root-in-the-block form (2) with
its state's use held behind its state-free products (triton_gdn.FUSED_HOLD, the default) and without it; --rownorm
0,1 times the forms with q and k as read with the rows' norms from the products' diagonals and summed from the rows as
read (triton_gdn.FUSED_ROWNORM); --chains 0,1 with the state's products by its head and remainder accumulated in
one chain of MMAs or two (triton_gdn.FUSED_CHAINS); --slots 0,1 with the states given by sequence (initial_state of B
rows, no state_indices) and in a pool of 2 B rows read through a slot table (state_indices, as a server's pool is);
--calls N times each row alone as the median of N do_bench calls (their range beside it); --rounds N runs the whole
sweep N times in the one process, rows of the same form apart in time (a figure that moves between processes or
allocations shows its spread here, round by round).

    python benchmarks/bench_wy_root.py [--commit SHA] [--shapes 1x16,1x9,2x16] [--layers 48] [--roots 0,1,2]
                                       [--raw16 1,0] [--warps 4,8] [--block-v 64] [--hold 1] [--rownorm 1]
                                       [--chains 0] [--slots 0] [--calls 1] [--rounds 1]
"""
import argparse

import torch

from ddsim import oracle
from ddsim.bench.bench import (
    add_fused_sweep_options,
    at_least_one,
    calls_cell,
    cuda_header,
    ddtree_batch,
    fused_root_sweep,
    fused_sweep_options,
    graphed_layers_us,
    int_list,
    kernel_device_us,
    kernel_inputs,
    median_us_calls,
    off_rounded,
    parse_shapes,
    slotted_pool,
    timed_resources,
)
from ddsim.gpu_backend import triton_gdn
from ddsim.gpu_backend.triton_gdn import plan_wy

ROOTS = {0: "root first", 1: "root in the block, its chain counted", 2: "root in the block, eliminated (default)"}
RAW16 = {1: "q, k as read (default)", 0: "q, k l2-normed, bf16x3"}
HOLD = {1: "the state held (default)", 0: "the state not held"}
ROWNORM = {1: ", rows' norms from the rows as read", 0: ""}
CHAINS = {1: ", the state's products in two chains", 0: ""}
STATES = {0: "by sequence", 1: "through slots"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x16,1x9,2x16")
    ap.add_argument("--layers", type=int, default=48)
    add_fused_sweep_options(ap, roots="0,1,2", raw16="1,0", warps="4,8", block_v="64")
    ap.add_argument("--slots", default="0", help="comma-separated, from [0, 1]: the states through a slot table")
    ap.add_argument("--calls", type=int, default=1, help="do_bench calls a row's time alone is the median of")
    ap.add_argument("--rounds", type=int, default=1, help="times the whole sweep runs, one after the other")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    sweep = fused_sweep_options(ap, a)
    slot_ways = int_list(ap, "--slots", a.slots, (0, 1))
    at_least_one(ap, a, "calls", "rounds", "layers")
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_root: needs a CUDA device")
    print(cuda_header(a.commit))
    print(f"| round | B x T | form | products by q, k | states | warps | V tile | us (median of {a.calls} do_bench calls, range) | "
          f"device us | graphed, {a.layers} layers, us a layer | max abs diff to the first row | off the rounded oracle | "
          "registers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rnd in range(1, a.rounds + 1):
        for B, T in shapes:
            bench_shape(B, T, a, sweep, slot_ways, rnd)


def bench_shape(B: int, T: int, a, sweep: dict, slot_ways: list, rnd: int):
    """The sweep's rows at B x T (one round)."""
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device="cuda")
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"],
                  parents=parents.to("cuda"), initial_state=inp["initial_state"], poison=False)
    pool, slots = slotted_pool(inp["initial_state"])
    states = {0: dict(initial_state=inp["initial_state"]), 1: dict(initial_state=pool, state_indices=slots)}
    ref = oracle.gdn_tree_verify(**{k: inp[k].cpu() for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                                 initial_state=inp["initial_state"].cpu())
    first = None
    for root, raw16, hold, rownorm, chains, warps, bv in fused_root_sweep(**sweep):
        if root and not triton_gdn.root_fits_block(T):
            continue
        kw = dict(design="fused", num_warps=warps, block_v=bv)
        for way in slot_ways:
            launch, o = plan_wy(**dict(common, **states[way]), **kw)
            _, kernels = timed_resources(launch)
            alone = median_us_calls(launch, a.calls)
            device = kernel_device_us(launch)
            launch()
            torch.cuda.synchronize()
            first = o.clone() if first is None else first
            graphed = graphed_layers_us(B, T, parents, a.layers, slots=bool(way), **kw)
            regs = "; ".join(f"{c['regs']} regs, {c['spills']} spilled" for c in kernels)
            form = ROOTS[root] + (f", {HOLD[int(hold)]}" if root == 2 else "")
            products = RAW16[int(raw16)] + ROWNORM[int(rownorm)] + CHAINS[int(chains)]
            print(f"| {rnd} | {B} x {T} | {form} | {products} | {STATES[way]} | {warps} | {bv} | {calls_cell(alone)} | "
                  f"{device:.1f} | {graphed:.1f} | {(o.float() - first.float()).abs().max().item():.2e} | "
                  f"{off_rounded(o, ref):.4f} | {regs} |", flush=True)


if __name__ == "__main__":
    main()
