"""The drop-in as a server runs it: captured in one CUDA graph with n GDN layers back to back, on SGLang's raw step
tensors (retrieve_parent_token, initial_state_indices, intermediate_state_indices, accepted: what a captured verify
reads, refilled in place every step), beside SGLang's own kernels captured the same way, in one run on one GPU, at
Qwen3.6-27B GDN shapes (H=16, HV=48, K=V=128, bf16 inputs, fp32 state pool), DDTree trees. Median microseconds per
layer of graph replays (bench.graphed_us: no launch latency; each layer's inputs its own, cold in L2 when the layers
together exceed it):

  sglang exact        fused_sigmoid_gating_delta_rule_update with retrieve_parent_token and the intermediate buffer
  sglang commit copy  the accepted node's state copied from that buffer into the pool slot (SGLang's commit)
  ddsim drop-in       engine_api.target_verify with the same buffer, raw tensors: its inputs checked and its tree's
                      tables built on the device in the graph (gpu_backend.device_checks)
  ddsim snapshot-free engine_api.target_verify without a buffer, and engine_api.commit_accepted, raw tensors
  sglang flattened    the hybrid-unsafe path, for reference

Also printed: the largest difference of the drop-in's and the snapshot-free verify's outputs from SGLang's exact
verify on the last layer after the replays (fp32 outputs of bf16 inputs), and the drop-in's node states' from
SGLang's, so the graphs are seen to compute the verify, not only to take time.

    python benchmarks/drop_in_graphed.py [--commit SHA] [--shapes 1x16,1x65,8x65,32x65] [--layers 48] [--gib 40]
        # needs CUDA and SGLang's kernel importable; --layers is capped per shape so that the layers' pools and
        # buffers fit in --gib GiB
"""
import argparse

import torch

from ddsim.bench.bench import cuda_header, ddtree_batch, graphed_us, kernel_inputs, parse_shapes, sglang_run
from ddsim.engines import fused_gates
from ddsim.gpu_backend import engine_api


def _layer(B, T, seed):
    """One layer's inputs in SGLang's convention: q, k, v, a, b, the pool (2 B rows, the batch's every other one),
    its slots, the buffer [B, T, HV, V, K] and its rows, the accepted nodes. Each drawn from ``seed`` alone, so a
    shape's inputs do not depend on the shapes run before it."""
    inp = kernel_inputs(B, T, device="cuda", seed=seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, b = fused_gates(inp["g"], inp["beta"])
    HV, V, K = inp["v"].shape[2], inp["v"].shape[3], inp["q"].shape[3]
    return dict(q=inp["q"], k=inp["k"], v=inp["v"], a=a, b=b, zeros=torch.zeros(HV, device="cuda"),
                pool=torch.randn(2 * B, HV, V, K, device="cuda", generator=gen),
                slots=torch.arange(0, 2 * B, 2, dtype=torch.int32, device="cuda"),
                buf=torch.empty(B, T, HV, V, K, device="cuda"), rows=torch.arange(B, dtype=torch.int32, device="cuda"))


def options(extra=None):
    """(options, shapes) of a graphed-layers benchmark (this one and profile_captured.py): --commit, --shapes, --layers,
    --gib, and what ``extra(ap)`` adds, checked (argparse's one line and exit 2 on a bad one)."""
    ap = argparse.ArgumentParser()
    if extra is not None:
        extra(ap)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x16,1x65,8x65,32x65", help="sequences x nodes, comma-separated")
    ap.add_argument("--layers", type=int, default=48, help="GDN layers in one graph (at most)")
    ap.add_argument("--gib", type=float, default=40.0, help="GiB the layers' pools and buffers may take")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    if a.layers < 1 or a.gib <= 0:
        ap.error("--layers and --gib must be positive")
    return a, shapes


def step_layers(B: int, T: int, layers: int, gib: float):
    """(par, acc, inputs) of one step at B x T: the DDTree trees as SGLang hands them over (int32 [B, T], the root's
    entry 0 as its tree conv leaves it), each sequence's deepest node as accepted [B], and the inputs of as many
    layers (at most ``layers``) as fit their pools and buffers in ``gib`` GiB (_layer)."""
    trees, parents = ddtree_batch(B, T)
    par = parents.cuda().int().contiguous()
    par[:, 0] = 0
    acc = torch.tensor([int(t.depths.argmax()) for t in trees], device="cuda")
    per_layer = (3 * B + B * T) * 48 * 128 * 128 * 4
    n = max(1, min(layers, int(gib * 2**30 // per_layer)))
    return par, acc, [_layer(B, T, seed=1 + i) for i in range(n)]


def main():
    a, shapes = options()
    sgl, where = sglang_run("drop_in_graphed")
    print(cuda_header(a.commit) + f" | SGLang kernel {where}")
    print("| B x T | layers | sglang exact (buffer) | + commit copy | ddsim drop-in (buffer) | ddsim snapshot-free "
          "verify | + commit_accepted | sglang flattened | max abs diff from sglang exact: drop-in / snapshot-free / "
          "node states |")
    print("|---|---|---|---|---|---|---|---|---|")
    for B, T in shapes:
        par, acc, layers = step_layers(B, T, a.layers, a.gib)
        n = len(layers)

        def sg_exact(x):
            x["o_sgl"] = sgl(x["zeros"], x["a"], x["zeros"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], x["pool"],
                             x["slots"], use_qk_l2norm_in_kernel=True, disable_state_update=True,
                             intermediate_states_buffer=x["buf"], intermediate_state_indices=x["rows"], cache_steps=T,
                             retrieve_parent_token=par)

        def sg_commit(x):
            x["pool"][x["slots"].long()] = x["buf"][x["rows"].long(), acc]

        def sg_flat(x):
            x["o"] = sgl(x["zeros"], x["a"], x["zeros"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], x["pool"],
                         x["slots"], use_qk_l2norm_in_kernel=True, disable_state_update=True)

        def dd_dropin(x):
            x["o_dropin"] = engine_api.target_verify(
                x["zeros"], x["a"], x["zeros"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], x["pool"], x["slots"],
                retrieve_parent_token=par, intermediate_states_buffer=x["buf"], intermediate_state_indices=x["rows"],
                cache_steps=T)

        def dd_verify(x):
            x["o_free"] = engine_api.target_verify(x["zeros"], x["a"], x["zeros"], 1.0, 20.0, x["q"], x["k"], x["v"],
                                                   x["b"], x["pool"], x["slots"], retrieve_parent_token=par)

        def dd_commit(x):
            engine_api.commit_accepted(x["zeros"], x["a"], x["zeros"], x["k"], x["v"], x["b"], x["pool"], x["slots"],
                                       retrieve_parent_token=par, accepted=acc)

        pools = [x["pool"].clone() for x in layers]
        t = {}
        for name, fn in (("sg_exact", sg_exact), ("sg_commit", sg_commit), ("dd_dropin", dd_dropin),
                         ("dd_verify", dd_verify), ("dd_commit", dd_commit), ("sg_flat", sg_flat)):
            t[name] = graphed_us([(lambda x=x, fn=fn: fn(x)) for x in layers])
            for x, p in zip(layers, pools):  # the commits wrote the pools: each form starts from the same states
                x["pool"].copy_(p)
        last = layers[-1]
        sg_exact(last)  # eager, after the graphs: the same calls' values to compare
        sgl_o, sgl_states = last["o_sgl"], last["buf"].clone()
        dd_dropin(last)
        dd_verify(last)
        diff = " / ".join(f"{(o.float() - sgl_o.float()).abs().max().item():.2e}"
                          for o in (last["o_dropin"], last["o_free"]))
        diff += f" / {(last['buf'] - sgl_states).abs().max().item():.2e}"
        print(f"| {B} x {T} | {n} | {t['sg_exact']:.1f} | {t['sg_commit']:.1f} | {t['dd_dropin']:.1f} | "
              f"{t['dd_verify']:.1f} | {t['dd_commit']:.1f} | {t['sg_flat']:.1f} | {diff} |", flush=True)
        del layers, pools
        torch.cuda.empty_cache()
    print("times in microseconds per layer, median of replays of one CUDA graph of that many layers")


if __name__ == "__main__":
    main()
