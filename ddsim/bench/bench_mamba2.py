"""Mamba2 tree kernels on CUDA at Nemotron-H-8B and Falcon-H1-7B SSM shapes (bf16 inputs, fp32
state): median time per call of each design against its memory floor, SGLang's Mamba2 verify (tree and
flattened paths) beside them in the same run, and accuracy against the float64 oracle. Script:
benchmarks/bench_mamba2_kernels.py."""
from __future__ import annotations

import torch

from ddsim import oracle
from ddsim.bench.bench import copy_bandwidth, ddtree_batch, sweep, table_lines
from ddsim.model.config import get_preset

SHAPES = ((1, 16), (1, 65), (8, 65), (32, 65), (1, 129), (8, 129))  # (sequences, nodes)


def mamba2_shape(preset: str) -> dict:
    """A preset's Mamba2 head shape {H, P, N, G}."""
    c = get_preset(preset)
    return dict(H=c.mamba_num_heads, P=c.mamba_head_dim, N=c.mamba_state_size, G=c.mamba_n_groups)


def mamba2_inputs(B, T, *, H, P, N, G, dtype=torch.bfloat16, device="cuda", seed=0) -> dict:
    """Random layer inputs: x [B, T, H, P], dt [B, T, H] (raw, fp32), A [H] < 0, B and C [B, T, G, N],
    D and dt_bias [H], the committed state [B, H, P, N] fp32."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s, std=1.0):
        return (torch.randn(*s, generator=gen) * std).to(device=device, dtype=dtype)

    return dict(x=r(B, T, H, P), dt=(torch.randn(B, T, H, generator=gen) - 2.0).to(device),
                A=-torch.exp(torch.rand(H, generator=gen) * 2.0).to(device), B=r(B, T, G, N, std=N ** -0.5),
                C=r(B, T, G, N, std=N ** -0.5), D=torch.ones(H, device=device),
                dt_bias=torch.zeros(H, device=device), initial_state=torch.randn(B, H, P, N, generator=gen).to(device))


def mamba2_bytes(B, T, *, H, P, N, G, in_bytes=2) -> dict:
    """Bytes each design must move at least: inputs + output + committed state (+ snapshots)."""
    io = B * T * (2 * H * P + 2 * G * N) * in_bytes + B * T * H * 4
    state = B * H * P * N * 4
    snaps = B * T * H * P * N * 4
    return {"leaky": io + state, "leaky+states": io + state + snaps, "parent-indexed": io + state + 2 * snaps,
            "ssd": io + state, "commit": 2 * state, "copy": 2 * state}


def sglang_mamba2_calls(inp: dict, parents: torch.Tensor) -> dict | None:
    """SGLang's Mamba2 verify (selective_state_update, where its kernel module is importable: .engines) on one
    batch as its mixer calls it, every argument made once (the launch alone is what a call costs): {"exact":
    the tree path (retrieve_parent_token = parents, each node's state written to a per-node buffer), "leaky":
    the flattened path (no parents)} -> (launch, its output [B, T, H, P]); None where the kernel is absent.
    dt, A, D and dt_bias are broadcast per head over P (and N) with stride 0, as SGLang's mixer passes them;
    the verify leaves the pool alone (disable_state_update)."""
    from ddsim.engines.sglang import _mamba2_kernel
    fn = _mamba2_kernel()
    if fn is None:
        return None
    x = inp["x"].contiguous()
    Bn, T, H, P = x.shape
    N, dev = inp["B"].shape[-1], x.device
    args = (inp["initial_state"].clone(), x, inp["dt"].float()[..., None].expand(Bn, T, H, P),
            inp["A"].float()[:, None, None].expand(H, P, N), inp["B"].contiguous(), inp["C"].contiguous())
    kw = dict(D=inp["D"].float()[:, None].expand(H, P), dt_bias=inp["dt_bias"].float()[:, None].expand(H, P),
              dt_softplus=True, state_batch_indices=torch.arange(Bn, dtype=torch.int32, device=dev),
              disable_state_update=True)
    tree = dict(intermediate_states_buffer=torch.empty(Bn, T, H, P, N, device=dev), cache_steps=T,
                retrieve_parent_token=parents.to(device=dev, dtype=torch.int32).contiguous(),
                intermediate_state_indices=torch.arange(Bn, dtype=torch.int32, device=dev))
    calls = {}
    for mode, extra in (("exact", tree), ("leaky", {})):
        out = torch.empty_like(x)
        calls[mode] = ((lambda out=out, extra=extra: fn(*args, **kw, out=out, **extra)), out)
    return calls


def mamba2_kernel_table(*, preset="nemotron-h-8b", device="cuda", shapes=SHAPES, progress=None,
                        engines: bool = True) -> tuple[str, list]:
    """Median time per call of every Mamba2 design at a preset's SSM shape; a fixed sweep of
    launch configurations per design (no autotuning), only the kernel launches timed. ``engines``:
    SGLang's verify beside them (sglang_mamba2_calls), where its kernel is importable, each mode's output
    first checked against ddsim's of the same mode (the largest difference printed)."""
    from ddsim.gpu_backend.triton_mamba2 import plan_commit, plan_recurrent, plan_ssd
    shp = mamba2_shape(preset)
    bw = copy_bandwidth(device)
    rows = []
    for Bn, T in shapes:
        trees, parents = ddtree_batch(Bn, T)
        parents = parents.to(device)
        inp = mamba2_inputs(Bn, T, **shp, device=device)
        nbytes = mamba2_bytes(Bn, T, **shp)
        acc = torch.tensor([int(t.depths.argmax()) for t in trees], device=device)
        lay = {k: inp[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias")}
        common = dict(parents=parents, initial_state=inp["initial_state"], poison=False)
        rec = [dict(block_p=bp, num_warps=nw) for bp, nw in ((8, 2), (16, 4), (32, 4), (64, 8))]
        ssd = [dict(block_i=bi, block_p=bp, num_warps=nw, precision=pr) for bi, bp, nw in
               ((16, 32, 4), (32, 32, 4), (32, 64, 4), (64, 64, 8), (32, 128, 8)) for pr in ("tf32x3",)]
        s0, out_state = inp["initial_state"], torch.empty_like(inp["initial_state"])
        cases = {
            "leaky (flattened)": ("leaky", rec, lambda c: plan_recurrent(**lay, **common, mode="leaky", **c)),
            "leaky+states": ("leaky+states", rec, lambda c: plan_recurrent(**lay, **common, mode="leaky",
                                                                          output_states=True, **c)),
            "exact parent-indexed": ("parent-indexed", rec, lambda c: plan_recurrent(**lay, **common, mode="exact", **c)),
            "exact ssd (tf32x3)": ("ssd", ssd, lambda c: plan_ssd(**lay, **common, mode="exact", **c)),
            "exact ssd (ieee)": ("ssd", [dict(c, precision="ieee") for c in ssd[:3]],
                                 lambda c: plan_ssd(**lay, **common, mode="exact", **c)),
            "commit": ("commit", rec, lambda c: plan_commit(inp["x"], inp["dt"], inp["A"], inp["B"],
                                                            dt_bias=inp["dt_bias"], parents=parents, accepted=acc,
                                                            initial_state=s0, poison=False, **c)),
            "state copy": ("copy", [{}], lambda c: ((lambda: out_state.copy_(s0)), None)),
        }
        sg = sglang_mamba2_calls(inp, parents) if engines else None
        if sg is not None:
            import ddsim.gpu_backend as gb
            for mode, (launch, out) in sg.items():
                launch()
                ours = gb.mamba2_tree_verify(**lay, parents=parents, initial_state=s0, mode=mode)
                print(f"# {Bn}x{T} sglang {mode} against ddsim's {mode}: max abs difference "
                      f"{(out.float() - ours.float()).abs().max().item():.2e}", flush=True)
            cases["sglang exact (tree path)"] = ("parent-indexed", [{}], lambda c: sg["exact"])
            cases["sglang leaky (flattened)"] = ("leaky", [{}], lambda c: sg["leaky"])
        rows += sweep(Bn, T, cases, nbytes, bw, progress=progress)
    head = (f"{preset}: H={shp['H']} P={shp['P']} N={shp['N']} G={shp['G']}, bf16 inputs, fp32 state; "
            f"copy bandwidth {bw / 1e9:.0f} GB/s (read + write)")
    return "\n".join([head] + table_lines(rows)), rows


def mamba2_kernel_accuracy(*, device="cuda", B=2, T=65, H=4, P=64, N=128, G=2, seed=1) -> str:
    """Relative error of each design's output vs the float64 oracle (fp32 and bf16 inputs)."""
    import ddsim.gpu_backend as gb
    from ddsim.gpu_backend.triton_mamba2 import mamba2_tree_verify_ssd
    from ddsim.measure.compare import rel_error
    _, parents = ddtree_batch(B, T, seed=seed)
    lines = ["| inputs | kernel | mode | relative error vs oracle (Frobenius) | max abs error |", "|---|---|---|---|---|"]
    for dtype in (torch.float32, torch.bfloat16):
        inp = mamba2_inputs(B, T, H=H, P=P, N=N, G=G, dtype=dtype, device=device, seed=seed)
        lay = {k: inp[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias")}
        cpu = {k: v.cpu() for k, v in lay.items()}
        for mode in ("exact", "leaky"):
            ref = oracle.mamba2_tree_verify(**cpu, parents=parents, initial_state=inp["initial_state"].cpu(), mode=mode)
            kw = dict(parents=parents.to(device), initial_state=inp["initial_state"], mode=mode)
            outs = {"recurrent": gb.mamba2_tree_verify(**lay, **kw, backend="triton-recurrent")}
            for prec in ("ieee", "tf32x3", "tf32"):
                outs[f"ssd {prec}"] = mamba2_tree_verify_ssd(**lay, **kw, precision=prec)
            outs["torch"] = gb.mamba2_tree_verify(**lay, **kw, backend="torch")
            dn = str(dtype).replace("torch.", "")
            if dtype != torch.float32:
                lines.append(f"| {dn} | (oracle rounded to {dn}) | {mode} | {rel_error(ref.to(dtype), ref):.2e} | "
                             f"{(ref.to(dtype).double() - ref).abs().max().item():.2e} |")
            for name, o in outs.items():
                lines.append(f"| {dn} | {name} | {mode} | {rel_error(o.float().cpu(), ref):.2e} | "
                             f"{(o.float().cpu().double() - ref).abs().max().item():.2e} |")
    return "\n".join(lines)
