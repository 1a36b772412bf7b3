"""Whether the serving-shape tests' second GDN call is fastcall's replay (properties/serving_cases.check_verify shares
one CheckedSlots across its two calls, as a step's layers share the planned slots): each GDN family's verify at
serving shapes, fastcall's counts (gpu_backend.fastcall.stats) before and after.

    python benchmarks/serving_shape_replays.py [--commit SHA]   # needs CUDA
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("serving_shape_replays: needs CUDA")
    from ddsim.gpu_backend import fastcall
    from ddsim.properties.serving_cases import FAMILIES, check_verify
    print(f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.get_device_name()} | torch {torch.__version__} | commit {a.commit}")
    print("| family | B x T | mode | fastcall: recorded / served / refused, after the call pair |")
    print("|---|---|---|---|")
    for name in ("gdn", "gdn-gates", "gdn-padded"):
        for B, T, mode in ((1, 16, "exact"), (8, 65, "exact"), (32, 129, "exact"), (4, 65, "leaky")):
            check_verify(FAMILIES[name], B, T, mode=mode, backend="triton", states=False, dims="serving")
            s = fastcall.stats()
            print(f"| {name} | {B} x {T} | {mode} | {s['recorded']} / {s.get('served')} / {s['refused']} |", flush=True)


if __name__ == "__main__":
    main()
