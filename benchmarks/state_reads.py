"""How fast a program reads its tile of the state, alone, on the one-kernel WY form's grid at one sequence
(Qwen3.6-27B GDN shapes: HV = 48 value heads, K = V = 128, an fp32 state, read through a slot table as a server's
pool is): the ways a Triton kernel can read it, each program folding its tile into one row of the output (the sum
over K) so that no read is dropped.

  ldg         tl.load of the [BK, BV] tile (16-byte reads into registers: the form's own read)
  ldg .cg     the same, cached in L2 only
  ldg, rows prefetched in bulk
              the same after each row's 256 bytes are prefetched into L2 by cp.async.bulk.prefetch (64-wide only)
  tma host    a tensor descriptor made on the host (a kernel argument), the tile copied by the Tensor Memory
              Accelerator into shared memory, then into registers
  tma device  the same with the descriptor made in the kernel (tl.make_tensor_descriptor)

each with 64-, 32- and 16-wide V tiles (96, 192 and 384 programs), 4 warps; one process, the rows interleaved round by
round: the device time after do_bench's flush and warm (bench.kernel_device_us, the median of 30 calls) and the
kernels-alone timer (bench.median_us). After a flush the form takes about as long as its reads alone (RESULTS.md,
fused_floor.py); this asks whether another way of reading its state is faster.

    python benchmarks/state_reads.py [--commit SHA] [--rounds 2] [--block-v 64,32,16]
"""
import argparse

import torch
import triton
import triton.language as tl

from ddsim.bench.bench import at_least_one, cuda_header, int_list, kernel_device_us, median_us
from ddsim.gpu_backend.launch import bind

HV, K, V = 48, 128, 128
POOL = 64  # the pool's rows; the sequence's slot is one of them


@triton.jit
def _bulk_prefetch_l2(rows):
    # 256 bytes prefetched into L2 from each address in rows (16-byte aligned) by cp.async.bulk.prefetch, the copy
    # engine's, which nothing waits for; compiled only (sm_90 and later: the interpreter runs no inline assembly)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 256;\n mov.u32 $0, 0;", "=r,l", [rows],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _ldg_kernel(state, state_idx, out, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                CG: tl.constexpr, PREFETCH: tl.constexpr):
    i_v, i_hv = tl.program_id(0), tl.program_id(1)
    slot = tl.load(state_idx)
    o_k, o_v = tl.arange(0, K), i_v * BV + tl.arange(0, BV)
    if PREFETCH:  # each row's BV * 4 = 256 bytes (BV = 64)
        _bulk_prefetch_l2(state + ((slot * HV + i_hv) * K + o_k).to(tl.int64) * V + i_v * BV)
    ptrs = state + ((slot * HV + i_hv) * K + o_k[:, None]).to(tl.int64) * V + o_v[None, :]
    if CG:
        s0 = tl.load(ptrs, cache_modifier=".cg")
    else:
        s0 = tl.load(ptrs)
    tl.store(out + i_hv * V + o_v, tl.sum(s0, 0))


@triton.jit
def _tma_host_kernel(desc, state_idx, out, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    i_v, i_hv = tl.program_id(0), tl.program_id(1)
    slot = tl.load(state_idx)
    s0 = desc.load([(slot * HV + i_hv) * K, i_v * BV])  # [K, BV]
    tl.store(out + i_hv * V + i_v * BV + tl.arange(0, BV), tl.sum(s0, 0))


@triton.jit
def _tma_device_kernel(state, state_idx, out, R, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BV: tl.constexpr):
    i_v, i_hv = tl.program_id(0), tl.program_id(1)
    desc = tl.make_tensor_descriptor(state, shape=[R, V], strides=[V, 1], block_shape=[K, BV])
    slot = tl.load(state_idx)
    s0 = desc.load([(slot * HV + i_hv) * K, i_v * BV])
    tl.store(out + i_hv * V + i_v * BV + tl.arange(0, BV), tl.sum(s0, 0))


def launches(pool: torch.Tensor, slot: torch.Tensor, out: torch.Tensor, bv: int) -> dict:
    """name -> a bound launch reading the slot's [HV, K, V] state in [K, bv] tiles into out [HV, V]."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    grid = (V // bv, HV)
    flat = pool.view(-1, V)  # [POOL * HV * K, V]
    common = dict(state_idx=slot, out=out, HV=HV, K=K, V=V, BV=bv, num_warps=4)
    return {
        "ldg": bind(_ldg_kernel, grid, dict(common, state=pool, CG=False, PREFETCH=False)),
        "ldg .cg": bind(_ldg_kernel, grid, dict(common, state=pool, CG=True, PREFETCH=False)),
        **({"ldg, rows prefetched in bulk": bind(_ldg_kernel, grid, dict(common, state=pool, CG=False, PREFETCH=True))}
           if bv == 64 else {}),
        "tma host": bind(_tma_host_kernel, grid, dict(common, desc=TensorDescriptor.from_tensor(flat, [K, bv]))),
        "tma device": bind(_tma_device_kernel, grid, dict(common, state=flat, R=flat.shape[0])),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--block-v", default="64,32,16")
    a = ap.parse_args()
    at_least_one(ap, a, "rounds")
    block_vs = int_list(ap, "--block-v", a.block_v, (16, 32, 64, 128))
    if not torch.cuda.is_available():
        raise SystemExit("state_reads: needs a CUDA device")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    torch.manual_seed(0)
    pool = torch.randn(POOL, HV, K, V, device="cuda")
    slot = torch.tensor([37], dtype=torch.int32, device="cuda")
    want = pool[37].sum(1)  # [HV, V]
    rows = {}
    for bv in block_vs:
        out = torch.full((HV, V), float("nan"), device="cuda")
        for name, launch in launches(pool, slot, out, bv).items():
            out.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            err = (out - want).abs().max().item()
            if not err < 1e-3:
                raise SystemExit(f"state_reads: {name} at {bv}-wide tiles reads wrong: max |error| {err}")
            rows[(name, bv)] = launch
    print(cuda_header(a.commit))
    print(f"the state [{HV}, {K}, {V}] fp32 ({HV * K * V * 4 / 2**20:.1f} MiB) read through a slot table, 4 warps")
    print("| read | V tile (programs) | device us, flushed (rounds) | device us, warm | timer us (rounds) |")
    print("|---|---|---|---|---|")
    got = {key: ([], [], []) for key in rows}
    for _ in range(a.rounds):
        for key, launch in rows.items():
            flushed, warm, timer = got[key]
            flushed.append(kernel_device_us(launch))
            warm.append(kernel_device_us(launch, flush=False))
            timer.append(median_us(launch))
    for (name, bv), (flushed, warm, timer) in got.items():
        cells = [" / ".join(f"{x:.2f}" for x in xs) for xs in (flushed, warm, timer)]
        print(f"| {name} | {bv} ({HV * V // bv}) | {cells[0]} | {cells[1]} | {cells[2]} |", flush=True)


if __name__ == "__main__":
    main()
