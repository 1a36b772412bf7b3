"""How far each engine's exact tree verify lies from the float64 oracle when its state pool is a server's 16-bit
state cache (check-kernel's kernel_cases.STATE_DTYPES examples of the quick profile, float32 inputs): the largest
error of any node's output, beside the float32 bound and the bound check-kernel holds the example to (the coarser of
the inputs' and the pool's: check_kernel._judged_dtype). SGLang's kernels reload each node's parent state from their
per-node buffer, which lies in the pool's dtype; ddsim's convention hands its verifies a float32 copy.

    python benchmarks/state_pool_rounding.py [--device cpu|cuda]   # the engines' packages on the path (.engines)
"""
import argparse
import platform

import torch

from ddsim import oracle
from ddsim.devices import prepare_engine_device

OPS = {"gdn": (oracle.gdn_tree_verify, ("q", "k", "v", "g", "beta"), ()),
       "mamba2": (oracle.mamba2_tree_verify, ("x", "dt", "A", "B", "C"), ("D", "dt_bias")),
       "kda": (oracle.kda_tree_verify, ("q", "k", "v", "g", "beta"), ())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    device = prepare_engine_device(a.device)
    from ddsim.engines import check_kernel as ck
    from ddsim.engines import kernel_cases as kc
    from ddsim.engines import load
    print(f"# {platform.python_version()} torch {torch.__version__} on {device}")
    print("| engine | op | state pool | max error | float32 bound | judged bound (dtype) |")
    print("|---|---|---|---|---|---|")
    for impl, op in (("sglang", "gdn"), ("sglang", "kda"), ("sglang", "mamba2"), ("ddsim", "gdn"), ("ddsim", "mamba2")):
        k = load(impl)
        call = {"gdn": k.verify, "mamba2": k.mamba2, "kda": k.kda}[op]
        ref, positional, keywords = OPS[op]
        nodes = op in (k.node_states or ())
        for c in kc.cases(op, "quick"):
            if c["pool"].dtype == torch.float32:
                continue
            r = ck._Runner(call, ref, positional, keywords, "exact", device, node_states=nodes,
                           extra={"scale": None} if op == "gdn" else None).run({**c, "burst": 1})
            err = ck._node_errors(r["o"], r["ref"]["exact"]).max().item()
            pool = str(c["pool"].dtype).removeprefix("torch.")
            print(f"| {impl} | {op} | {pool} | {err:.3g} | {ck._bound(r['ref']['exact'], torch.float32):.3g} | "
                  f"{ck._bound(r['ref']['exact'], r['dtype']):.3g} ({str(r['dtype']).removeprefix('torch.')}) |")


if __name__ == "__main__":
    main()
