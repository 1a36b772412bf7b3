"""ddsim's exact kernel in SGLang's calling convention (ddsim.gpu_backend.engine_api) against SGLang's own
target-verify kernel, side by side in one run on one GPU, at Qwen3.6-27B GDN shapes (H=16, HV=48,
K=V=128, bf16 inputs, fp32 state pool), DDTree trees, through the public functions (host work
included), one GDN layer per call:

  sglang exact        fused_sigmoid_gating_delta_rule_update with retrieve_parent_token, writing every
                      node's state to the intermediate buffer; + its commit: copying the accepted
                      node's state from the buffer into the pool slot
  ddsim drop-in       engine_api.target_verify with the same buffer (same semantics)
  ddsim snapshot-free engine_api.target_verify (no buffer) + engine_api.commit_accepted
(ddsim's calls take the step's trees, pool rows, buffer rows and accepted nodes planned once, as an engine would
build them once per step for every layer: plan_tree, plan_slots, plan_accepted)
  sglang flattened    the hybrid-unsafe path, for reference
  ddsim kernels alone the snapshot-free verify's kernels alone (the launch triton_gdn.plan_wy returns, its host work
                      done once, the states given by sequence: no state_indices), the figure issue #36's bounds are set
                      on, beside each bound, as the median of --calls do_bench calls (their range beside it)
  ... through slots   the same with the states in a pool of 2 B rows read through a slot table (state_indices), as a
                      server's pool is
With --layout split every public call (SGLang's and ddsim's) takes q, k, v as SGLang's GDN layer hands them over:
views of one [B, T, 2 H K + HV V] projection (torch.split of the tree conv's output mixed_qkv), each token's row
strided by the projection's width; both engines' kernels read them in place (ddsim's by a row stride per input,
_common.rows_of). The kernels-alone columns take the contiguous inputs in either layout.
Each call is timed by do_bench (CUDA events around it, the L2 flushed before it); the last columns give the device
time of the kernels themselves of SGLang's exact verify, ddsim's snapshot-free verify (engine_api: its gates fused in
the kernel) and ddsim's kernels alone (torch.profiler's kernel records, without the launch latency and the host's
time that do_bench's events take in).

    python benchmarks/bench_engine_api.py [--commit SHA] [--shapes 1x16,...,8x257] [--rownorm 0|1] [--fused-warps N]
                                          [--calls 5] [--layout contiguous|split]
        # needs CUDA and SGLang's kernel importable; trees above 65 nodes run ddsim's split WY form; --rownorm and
        # --fused-warps set the one-kernel form's triton_gdn.FUSED_ROWNORM and FUSED_WARPS (unset: their defaults)
"""
import argparse
import statistics

import torch

from ddsim.bench.bench import (
    KERNEL_SHAPES,
    at_least_one,
    calls_cell,
    copy_bandwidth,
    cuda_header,
    fp32_tensor_rate,
    kernel_bytes,
    kernel_device_us,
    kernel_flops,
    median_us,
    median_us_calls,
    parse_shapes,
    sglang_layer,
    sglang_run,
    slotted_pool,
)
from ddsim.engines.kernel_cases import split_views
from ddsim.gpu_backend import engine_api, fastcall, triton_gdn
from ddsim.gpu_backend.triton_gdn import plan_wy

# issue #36's bounds on the exact path's kernels alone (us, H200, bf16 inputs, Qwen3.6-27B GDN shapes)
BOUNDS = {(1, 16): 8.0, (8, 65): 50.0, (32, 65): 150.0, (8, 129): 200.0, (8, 257): 600.0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in KERNEL_SHAPES) + ",1x129,8x129,1x257,8x257",
                    help="sequences x nodes, comma-separated")
    ap.add_argument("--rownorm", type=int, choices=(0, 1), help="triton_gdn.FUSED_ROWNORM (unset: its default)")
    ap.add_argument("--fused-warps", type=int, choices=(1, 2, 4, 8, 16), help="triton_gdn.FUSED_WARPS (unset: its default)")
    ap.add_argument("--calls", type=int, default=5, help="do_bench calls for the kernels alone (their median)")
    ap.add_argument("--layout", choices=("contiguous", "split"), default="contiguous",
                    help="q, k, v contiguous, or views of one fused projection as SGLang's layer passes them")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    at_least_one(ap, a, "calls")
    if a.rownorm is not None:
        triton_gdn.FUSED_ROWNORM = bool(a.rownorm)
    if a.fused_warps is not None:
        triton_gdn.FUSED_WARPS = a.fused_warps
    sgl, where = sglang_run("bench_engine_api")
    print(cuda_header(a.commit) + f" | SGLang kernel {where} | FUSED_ROWNORM {int(triton_gdn.FUSED_ROWNORM)}, "
          f"FUSED_WARPS {triton_gdn.FUSED_WARPS} | q, k, v {a.layout}")
    bw, rate = copy_bandwidth("cuda"), fp32_tensor_rate("cuda", "bf16x3")  # bf16 inputs' default
    print(f"# floors: the snapshot-free verify's least bytes (inputs, output, committed states) over the measured copy "
          f"bandwidth {bw / 1e9:.0f} GB/s, and the WY form's least FLOPs over "
          + (f"{rate / 1e12:.0f} TFLOP/s (dense bf16 peak / 3: bf16x3 products, the default for bf16 inputs)" if rate
             else "(no known peak for this device)")
          + "; the commit's floor: its slots' states read and written once")
    print("| B x T | sglang exact verify | + commit copy | ddsim drop-in (buffer) | ddsim snapshot-free verify | "
          "+ commit_accepted | sglang flattened | verify floor: bytes / FLOPs | commit floor | buffer MiB/layer | "
          f"ddsim snapshot-free verify: peak allocations MiB/layer (output + scratch) | ddsim kernels alone "
          f"(median of {a.calls} do_bench calls, range) | #36 bound | ddsim kernels alone, the states through slots | "
          "kernels' device time: sglang exact / ddsim snapshot-free verify / ddsim kernels alone / through slots |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    dev = "cuda"
    for B, T in shapes:
        # the step's tree, pool rows and buffer rows planned once, shared by every layer (as an engine would);
        # likewise below the accepted nodes
        trees, parents, inp, a_, b_, zeros, pool, slots, par, plan, pslots, buf, rows, prows = sglang_layer(
            B, T, device=dev)
        acc = torch.tensor([int(t.depths.argmax()) for t in trees], device=dev)
        pacc = engine_api.plan_accepted(plan, acc)
        q, k, v = inp["q"], inp["k"], inp["v"]
        if a.layout == "split":  # as SGLang's layer splits mixed_qkv: views, each row strided by the projection's width
            q, k, v = split_views({"q": q, "k": k, "v": v}).values()

        def sg_exact():
            sgl(zeros, a_, zeros, 1.0, 20.0, q, k, v, b_, pool, slots, use_qk_l2norm_in_kernel=True,
                disable_state_update=True, intermediate_states_buffer=buf, intermediate_state_indices=rows,
                cache_steps=T, retrieve_parent_token=par)

        def sg_commit():
            pool[slots.long()] = buf[rows.long(), acc]

        def sg_flat():
            sgl(zeros, a_, zeros, 1.0, 20.0, q, k, v, b_, pool, slots, use_qk_l2norm_in_kernel=True,
                disable_state_update=True)

        def dd_dropin():
            engine_api.target_verify(zeros, a_, zeros, 1.0, 20.0, q, k, v, b_, pool, pslots, retrieve_parent_token=plan,
                                     intermediate_states_buffer=buf, intermediate_state_indices=prows, cache_steps=T)

        def dd_verify():
            engine_api.target_verify(zeros, a_, zeros, 1.0, 20.0, q, k, v, b_, pool, pslots, retrieve_parent_token=plan)

        pool_copy = pool.clone()

        def dd_commit():
            engine_api.commit_accepted(zeros, a_, zeros, k, v, b_, pool_copy, pslots, retrieve_parent_token=plan,
                                       accepted=pacc)

        torch.cuda.synchronize()  # what one snapshot-free verify allocates at its peak (its output and scratch)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        dd_verify()
        torch.cuda.synchronize()
        dd_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
        qkvgb = {n: inp[n] for n in ("q", "k", "v", "g", "beta")}
        alone, _ = plan_wy(**qkvgb, parents=parents.to(dev), initial_state=inp["initial_state"], poison=False)
        kpool, kslots = slotted_pool(inp["initial_state"])  # the same states in every other row of a pool
        slotted, _ = plan_wy(**qkvgb, parents=parents.to(dev), initial_state=kpool, state_indices=kslots, poison=False)
        t = {name: median_us(fn) for name, fn in (("sg_exact", sg_exact), ("sg_commit", sg_commit),
                                              ("dd_dropin", dd_dropin), ("dd_verify", dd_verify),
                                              ("dd_commit", dd_commit), ("sg_flat", sg_flat))}
        calls = {name: median_us_calls(fn, a.calls) for name, fn in (("dd_alone", alone), ("dd_slotted", slotted))}
        alone_us = statistics.median(calls["dd_alone"])
        bound = BOUNDS.get((B, T))
        verdict = "–" if bound is None else f"{bound:.0f} ({'met' if alone_us <= bound else 'not met'})"
        try:
            device = " / ".join(f"{kernel_device_us(fn):.1f}" for fn in (sg_exact, dd_verify, alone, slotted))
        except Exception as e:  # the profiler's records could not be told apart: said, not guessed
            device = f"– ({type(e).__name__}: {e})"
        nb, fl = kernel_bytes(B, T), kernel_flops(B, T)
        floor = f"{nb['wy'] / bw * 1e6:.1f} / " + (f"{fl['wy'] / rate * 1e6:.1f}" if rate else "–")
        print(f"| {B} x {T} | {t['sg_exact']:.1f} | {t['sg_commit']:.1f} | {t['dd_dropin']:.1f} | {t['dd_verify']:.1f} | "
              f"{t['dd_commit']:.1f} | {t['sg_flat']:.1f} | {floor} | {nb['commit'] / bw * 1e6:.1f} | "
              f"{buf.numel() * 4 / 2**20:.1f} | {dd_mib:.1f} | {calls_cell(calls['dd_alone'])} | {verdict} | "
              f"{calls_cell(calls['dd_slotted'])} | {device} |", flush=True)
        print(f"# after {B} x {T}, ddsim's replayed calls (gpu_backend.fastcall): {fastcall.stats()}", flush=True)
    print("times in microseconds per call, median of do_bench (CUDA events around the public call)")


if __name__ == "__main__":
    main()
