"""Where the folded WY form's two kernels spend their time, at Qwen3.6-27B GDN shapes (bf16 inputs):
each kernel alone (do_bench, median us) for trees whose doubling chain is 0, 4 and 6 rounds long (a star
under the root, DDTree trees of depth 15, the leaky chain mask), with the root's step in the second kernel and
folded into the weights (fold_root); with --ncu, three launches of each kernel for Nsight Compute to read
(run under ``ncu -k regex:_gdn_wy``): the folded form both ways, or with --design auto what plan_wy's default
launches at each shape (the one-kernel form at 1 x 16, the three kernels past one block, ...).
(RESULTS.md's b7d178c run compared the per-head kernel on the whole block with a two-halves form since
reverted.)

    python benchmarks/profile_wy_fold.py [--commit SHA] [--shapes 8x65,1x65] [--ncu [--design auto]]
"""
import argparse

import torch

from ddsim.bench.bench import cuda_header, ddtree_batch, kernel_inputs, parse_shapes
from ddsim.gpu_backend.triton_gdn import plan_wy

TREES = ("star (0 rounds)", "DDTree, depth 15 (4 rounds)", "leaky chain (6 rounds)")


def plans(B, T, root):
    """{tree: the fold design's launch} for each tree kind in TREES."""
    inp = kernel_inputs(B, T)
    _, dd = ddtree_batch(B, T)
    star = torch.tensor([[-1] + [0] * (T - 1)] * B)
    out = {}
    for name, parents, mode in zip(TREES, (star, dd, dd), ("exact", "exact", "leaky")):
        launch, _ = plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents.cuda(),
                            initial_state=inp["initial_state"], mode=mode, design="fold", poison=False,
                            fold_root=root)
        out[name] = launch
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="8x65,1x65")
    ap.add_argument("--ncu", action="store_true", help="launch each kernel a few times, untimed (for ncu)")
    ap.add_argument("--design", choices=["fold", "auto"], default="fold", help="with --ncu: the design launched")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    if not torch.cuda.is_available():
        raise SystemExit("profile_wy_fold: needs a CUDA device")
    print(cuda_header(a.commit))
    if a.ncu:
        for B, T in shapes:
            if a.design == "auto":
                inp = kernel_inputs(B, T)
                launches = [plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")},
                                    parents=ddtree_batch(B, T)[1].cuda(), initial_state=inp["initial_state"],
                                    poison=False)[0]]
            else:
                launches = [plans(B, T, root)[TREES[1]] for root in (False, True)]
            for launch in launches:
                for _ in range(3):
                    launch()
        torch.cuda.synchronize()
        raise SystemExit(0)
    from triton.testing import do_bench
    print("| B x T | the root's step | tree | per-head kernel us | second kernel us | both us |")
    print("|---|---|---|---|---|---|")
    for B, T in shapes:
        for root in (False, True):
            for name, launch in plans(B, T, root).items():
                ts = [do_bench(f, warmup=10, rep=50, return_mode="median") * 1e3 for f in (*launch.parts, launch)]
                print(f"| {B}x{T} | {'folded in' if root else 'per V tile'} | {name} | {ts[0]:.1f} | {ts[1]:.1f} | "
                      f"{ts[2]:.1f} |", flush=True)
