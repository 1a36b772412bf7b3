"""What the kernel tables' timer reads for kernels that do next to nothing: the floor under every figure of
bench_wy_defaults.py. do_bench (each call alone, L2 flushed before it, as the tables time) and one CUDA graph of 48
launches back to back (as a server's replayed verify runs them), for:

    empty    a Triton kernel whose programs return at once;
    state    each program loads one 128 x 64 fp32 tile of a committed state (Qwen3.6-27B GDN: a value head's
             state is 128 x 128) and stores its sum: one round trip to memory;
    chain    each program makes N dependent loads (pointer chasing in a table of its own): N round trips.

at the grids the WY kernels launch (96: 1 x 16's fused form; 384: a batch of 8's heads; 1536: 32's; 6144: the
past-one-block apply at 8 x 257). Median us. --split: the state kernel also reads one sequence's 48 states (3 MB)
in narrower tiles, 128 x 32 over 192 programs and 128 x 16 over 384, and with 4 warps instead of Triton's 4...8
default (what a one-kernel form over 32- or 16-wide V tiles would read).

    python benchmarks/bench_launch_floor.py [--commit SHA] [--grids 96,384,1536,6144] [--chain 1,4,16] [--split]
"""
import argparse

import torch
import triton
import triton.language as tl

from ddsim.bench.bench import cuda_header, graphed_us, median_us


@triton.jit
def _empty_kernel(x):
    pass


@triton.jit
def _state_kernel(state, out, K: tl.constexpr, BV: tl.constexpr):
    # state [P, K, BV] fp32: each program its own tile; out [P]
    i = tl.program_id(0)
    o_k, o_v = tl.arange(0, K), tl.arange(0, BV)
    s = tl.load(state + (i.to(tl.int64) * K + o_k[:, None]) * BV + o_v[None, :])
    tl.store(out + i, tl.sum(tl.sum(s, 1), 0))


@triton.jit
def _chain_kernel(table, out, N, SPAN: tl.constexpr):
    # table [P, SPAN] int32: each program follows its own cycle N times
    i = tl.program_id(0)
    base = table + i.to(tl.int64) * SPAN
    j = tl.load(base)
    for _ in range(0, N):
        j = tl.load(base + j)
    tl.store(out + i, j)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--grids", default="96,384,1536,6144")
    ap.add_argument("--chain", default="1,4,16")
    ap.add_argument("--split", action="store_true", help="also one sequence's states in 64-, 32- and 16-wide tiles")
    a = ap.parse_args()
    try:
        grids = [int(x) for x in a.grids.split(",")]
        chains = [int(x) for x in a.chain.split(",")]
        if min(grids) < 1 or min(chains) < 0:
            raise ValueError
    except ValueError:
        ap.error(f"--grids {a.grids!r} / --chain {a.chain!r}: expected positive integers, comma separated")
    if not torch.cuda.is_available():
        raise SystemExit("bench_launch_floor: needs a CUDA device")
    print(cuda_header(a.commit))
    print("| kernel | programs | do_bench us (L2 flushed) | graphed us per launch (48 in one graph) |")
    print("|---|---|---|---|")
    span = 1024
    for P in grids:
        out = torch.empty(P, device="cuda", dtype=torch.float32)
        state = torch.randn(P, 128, 64, device="cuda")
        # a random cycle through each program's span: every load depends on the one before
        perm = torch.stack([torch.randperm(span) for _ in range(P)]).cuda()
        table = torch.empty(P, span, dtype=torch.int32, device="cuda")
        table.scatter_(1, perm, torch.roll(perm, -1, 1).to(torch.int32))
        iout = torch.empty(P, device="cuda", dtype=torch.int32)
        cases = [("empty", lambda: _empty_kernel[(P,)](out)),
                 ("state (one 128 x 64 fp32 tile)", lambda: _state_kernel[(P,)](state, out, K=128, BV=64))]
        for n in chains:
            cases.append((f"chain of {n} dependent loads", lambda n=n: _chain_kernel[(P,)](table, iout, n, SPAN=span)))
        for name, fn in cases:
            us = median_us(fn)
            print(f"| {name} | {P} | {us:.1f} | {graphed_us([fn] * 48):.2f} |", flush=True)
    if a.split:  # one sequence's 48 value heads, 128 x 128 fp32 each, read in tiles of BV columns
        state = torch.randn(48 * 128 * 128, device="cuda")
        for bv in (64, 32, 16):
            P = 48 * 128 // bv
            out = torch.empty(P, device="cuda", dtype=torch.float32)
            for warps in (4, 8):
                fn = (lambda P=P, bv=bv, warps=warps, out=out:
                      _state_kernel[(P,)](state, out, K=128, BV=bv, num_warps=warps))
                print(f"| state (one 128 x {bv} fp32 tile, {warps} warps) | {P} | {median_us(fn):.1f} | "
                      f"{graphed_us([fn] * 48):.2f} |", flush=True)
    print("do_bench: ddsim.bench.bench.median_us (triton.testing.do_bench, median); graphed: ddsim.bench.bench.graphed_us")


if __name__ == "__main__":
    main()
