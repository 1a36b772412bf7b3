"""Whether the serving-shape cases' second verify call replays through fastcall: GDN's default and fused-gates
verify at Qwen3.6-27B's heads at 8 x 65, checked as properties/test_serving_shapes.py checks them, with fastcall's
counters (recipes recorded, calls served in C++) before and after each.

    python benchmarks/serving_shape_replays.py [--commit SHA]
"""
import argparse

from ddsim.bench.bench import cuda_run
from ddsim.gpu_backend import fastcall
from ddsim.properties import serving_cases as S


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    cuda_run("serving_shape_replays", a.commit)
    for name in ("gdn", "gdn-gates"):
        before = fastcall.stats()
        S.check_verify(S.FAMILIES[name], 8, 65, mode="exact", backend="triton", states=False, dims="serving")
        after = fastcall.stats()
        print(f"{name} 8 x 65 exact: recorded {after['recorded'] - before['recorded']}, "
              f"served in C++ {after['served'] - before['served']}, refused {after['refused']}", flush=True)
    print(f"fastcall: {fastcall.status()}")


if __name__ == "__main__":
    main()
