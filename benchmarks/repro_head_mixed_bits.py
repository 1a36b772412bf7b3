"""Where the head kernel's mixed grid (HEAD_MIXED) and a program per head differ in their output bits, on the
property suite's example (4 heads on 3 slots, 16-wide V tiles: 3 heads whole, the fourth a program per tile),
for each mode, input dtype and (fp32 inputs) dot precision: per head and V tile, how many entries differ and by
how much (ulps of fp32), whether each grid repeats its own bits, and each grid's max |error| against the float64
oracle beside the max |difference| between the grids.

    python benchmarks/repro_head_mixed_bits.py [--commit SHA]   # needs CUDA
"""
import argparse

import torch

from ddsim import oracle
from ddsim.bench.bench import cuda_header
from ddsim.gpu_backend import triton_wy_split as ws
from ddsim.gpu_backend.triton_gdn import gdn_tree_verify_wy
from ddsim.properties.test_triton_kernels import _cast, _dev, _long_example, _pool


def _run(args, parents, pool, slots, mode, mixed, precision):
    ws.HEAD_MIXED = mixed
    return gdn_tree_verify_wy(**args, parents=parents, initial_state=pool, state_indices=slots, mode=mode,
                              design="head", precision=precision)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("repro_head_mixed_bits: needs a CUDA device")
    print(cuda_header(a.commit))
    ws.HEAD_BLOCK_V, ws._slots = 16, (lambda device: 3)
    inp = _long_example(T=40, V=40)
    print("| mode | dtype | precision | repeats (whole / mixed) | max abs error to the oracle: whole / mixed | "
          "max abs difference | head: differing entries / max ulps, per V tile |")
    print("|---|---|---|---|---|---|---|")
    cases = [(d, None) for d in (torch.float16, torch.bfloat16)] + [(torch.float32, p)
                                                                    for p in ("tf32x3", "ieee", "tf32")]
    for mode in ("exact", "leaky"):
        for dtype, prec in cases:
            args = _cast(inp, dtype)
            pool, slots = _pool(inp)
            par = _dev(inp["parents"])
            whole = _run(args, par, pool, slots, mode, False, prec)
            mixed = _run(args, par, pool, slots, mode, True, prec)
            rep = (torch.equal(whole, _run(args, par, pool, slots, mode, False, prec)),
                   torch.equal(mixed, _run(args, par, pool, slots, mode, True, prec)))
            ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"],
                                         mode=mode).double().cpu()
            err = [f"{(x.double().cpu() - ref).abs().max().item():.2e}" for x in (whole, mixed)]
            diff = (whole.double() - mixed.double()).abs().max().item()
            w32, m32 = whole.float(), mixed.float()  # [B, T, HV, V]
            ulp = (w32.view(torch.int32).long() - m32.view(torch.int32).long()).abs()
            cells = []
            for h in range(w32.shape[2]):
                tiles = []
                for t0 in range(0, w32.shape[3], 16):
                    u = ulp[:, :, h, t0:t0 + 16]
                    tiles.append(f"{int((u > 0).sum())}/{int(u.max())}")
                cells.append(f"h{h} " + " ".join(tiles))
            print(f"| {mode} | {str(dtype).removeprefix('torch.')} | {prec or 'default'} | {rep[0]} / {rep[1]} | "
                  f"{' / '.join(err)} | {diff:.2e} | {'; '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
