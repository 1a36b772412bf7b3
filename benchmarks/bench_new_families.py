"""The recurrent families beyond GDN and Mamba2 (KDA, lightning attention, Mamba1) on CUDA at real shapes, bf16
inputs and fp32 states: median time per call of ddsim's tree verify (exact and leaky; no per-node states returned)
and commit at their CUDA defaults (the Triton recurrent kernels), beside fla's kernels for the same recurrence where
fla has one (KDA: fused_recurrent_kda and chunk_kda; lightning attention: fused_recurrent_simple_gla and
chunk_simple_gla with the per-head decay), which take no tree (each sequence's nodes in batch order: the leaky
path), and the memory floor (inputs, the initial state and the outputs read or written once, at the measured copy
bandwidth). As a model calls them: the tree as a TreePlan built once, the accepted nodes checked once. KDA's exact
verify in both designs: the WY form (no per-node state; the default from 128 sequence-head pairs) and the
parent-indexed recurrence (every node's state written); lightning's likewise in its masked form (the default) and
its recurrence. Sequences x nodes in {1x17, 8x65, 32x65}, DDTree trees.
Each row is printed as it is timed, ddsim's kernels before fla's (fla's autotuning can take minutes: a run cut by
a time limit keeps the rows it reached); then, for the families asked, agreement on chains (where every mode is
exact) with fla, and of KDA's two exact designs on trees.

    python benchmarks/bench_new_families.py [--commit SHA] [--families kda,lightning,mamba1]

Shapes: KDA at Kimi-Linear-48B-A3B (H=32, K=V=128); lightning attention at MiniMax-Text-01 (H=64, hd=128);
Mamba1 at Jamba Mini 1.6 (I=8192, N=16; no fla kernel).
"""
import argparse
import sys

import torch
import triton
import triton.testing

from ddsim import gpu_backend as gb
from ddsim.bench.bench import copy_bandwidth, cuda_header, ddtree_batch

SHAPES = ((1, 17), (8, 65), (32, 65))


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")


def _inputs(family: str, B: int, T: int, g: torch.Generator):
    dev = "cuda"

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g, device=dev).to(dtype)
    if family == "kda":
        H, K = 32, 128
        return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, K),
                    g=-torch.rand(B, T, H, K, generator=g, device=dev) * 0.1, beta=torch.rand(B, T, H, generator=g, device=dev),
                    S0=torch.randn(B, H, K, K, generator=g, device=dev) * 0.1)
    if family == "lightning":
        H, K = 64, 128
        return dict(q=r(B, T, H, K) * 0.1, k=r(B, T, H, K) * 0.1, v=r(B, T, H, K),
                    decay=torch.exp(-torch.rand(H, generator=g, device=dev)), S0=torch.randn(B, H, K, K, generator=g, device=dev))
    I, N = 8192, 16
    return dict(x=r(B, T, I), dt=r(B, T, I), A=-torch.rand(I, N, generator=g, device=dev) - 0.5, Bm=r(B, T, N), Cm=r(B, T, N),
                D=torch.ones(I, device=dev), dt_bias=torch.zeros(I, device=dev), S0=torch.randn(B, I, N, generator=g, device=dev))


def _nbytes(family: str, a: dict) -> int:
    """Inputs and the initial state read once, the output written once."""
    read = sum(t.numel() * t.element_size() for k, t in a.items() if torch.is_tensor(t))
    out = a["v"] if "v" in a else a["x"]
    return read + out.numel() * out.element_size()


def _calls(family: str, a: dict, parents, accepted):
    """name -> a call, ddsim's modes and commit, and fla's flattened kernels where it has one."""
    calls = {}
    if family == "kda":
        for m, backend in (("exact", "triton-wy"), ("exact", "triton-recurrent"), ("leaky", "triton")):
            name = f"ddsim kda {m}" + {"triton-wy": " (wy)", "triton-recurrent": " (recurrent)", "triton": ""}[backend]
            calls[name] = lambda m=m, backend=backend: gb.kda_tree_verify(
                a["q"], a["k"], a["v"], a["g"], a["beta"], parents=parents, initial_state=a["S0"], mode=m, backend=backend)
        calls["ddsim kda commit"] = lambda: gb.kda_tree_commit(a["k"], a["v"], a["g"], a["beta"], parents=parents,
                                                               accepted=accepted, initial_state=a["S0"])
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
        for name, fn in (("fla fused_recurrent_kda", fused_recurrent_kda), ("fla chunk_kda", chunk_kda)):
            calls[name] = lambda fn=fn: fn(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=a["S0"].clone(),
                                           use_qk_l2norm_in_kernel=True)
    elif family == "lightning":
        for m, backend in (("exact", "triton-masked"), ("exact", "triton-recurrent"), ("leaky", "triton")):
            name = f"ddsim lightning {m}" + {"triton-masked": " (masked)", "triton-recurrent": " (recurrent)", "triton": ""}[backend]
            calls[name] = lambda m=m, backend=backend: gb.lightning_tree_verify(
                a["q"], a["k"], a["v"], decay=a["decay"], parents=parents, initial_state=a["S0"], mode=m, backend=backend)
        calls["ddsim lightning commit"] = lambda: gb.lightning_tree_commit(a["k"], a["v"], decay=a["decay"], parents=parents,
                                                                           accepted=accepted, initial_state=a["S0"])
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
        gamma = torch.log(a["decay"])
        for name, fn in (("fla fused_recurrent_simple_gla", fused_recurrent_simple_gla), ("fla chunk_simple_gla", chunk_simple_gla)):
            calls[name] = lambda fn=fn: fn(a["q"], a["k"], a["v"], g_gamma=gamma, scale=1.0, initial_state=a["S0"].clone())
    else:
        for m in ("exact", "leaky"):
            calls[f"ddsim mamba1 {m}"] = lambda m=m: gb.mamba1_tree_verify(a["x"], a["dt"], a["A"], a["Bm"], a["Cm"], D=a["D"],
                                                                          dt_bias=a["dt_bias"], parents=parents,
                                                                          initial_state=a["S0"], mode=m)
        calls["ddsim mamba1 commit"] = lambda: gb.mamba1_tree_commit(a["x"], a["dt"], a["A"], a["Bm"], dt_bias=a["dt_bias"],
                                                                     parents=parents, accepted=accepted, initial_state=a["S0"])
    return calls


def agreement(g: torch.Generator, families=("kda", "lightning")) -> str:
    """On a chain (every node order-exact) ddsim's exact verify against fla's kernels: max |diff| / max |fla|;
    for KDA also the WY form against the parent-indexed recurrence on trees."""
    lines = ["# agreement on a 1x33 chain, bf16 inputs, fp32 states (max |ddsim - fla| / max |fla|)"]
    chain = torch.arange(-1, 32, device="cuda")[None]
    if "kda" in families:
        a = _inputs("kda", 1, 33, g)
        o = gb.kda_tree_verify(a["q"], a["k"], a["v"], a["g"], a["beta"], parents=chain, initial_state=a["S0"],
                               backend="triton-wy").float()
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
        for name, fn in (("fused_recurrent_kda", fused_recurrent_kda), ("chunk_kda", chunk_kda)):
            ref = fn(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=a["S0"].clone(),
                     use_qk_l2norm_in_kernel=True)[0].float()
            lines.append(f"kda (wy) vs fla {name}: {((o - ref).abs().max() / ref.abs().max()).item():.2e}")
        # on trees, where only the exact designs agree: the WY form against the parent-indexed recurrence
        _, parents = ddtree_batch(8, 65)
        a = _inputs("kda", 8, 65, g)
        wy, rec = (gb.kda_tree_verify(a["q"], a["k"], a["v"], a["g"], a["beta"], parents=parents.cuda(),
                                      initial_state=a["S0"], backend=b).float() for b in ("triton-wy", "triton-recurrent"))
        lines.append(f"kda wy vs recurrent, exact, 8x65 DDTree trees: {((wy - rec).abs().max() / rec.abs().max()).item():.2e}, "
                     f"bf16 outputs differing {(wy != rec).float().mean().item():.2%}")
    if "lightning" in families:
        a = _inputs("lightning", 1, 33, g)
        o = gb.lightning_tree_verify(a["q"], a["k"], a["v"], decay=a["decay"], parents=chain, initial_state=a["S0"]).float()
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
        for name, fn in (("fused_recurrent_simple_gla", fused_recurrent_simple_gla), ("chunk_simple_gla", chunk_simple_gla)):
            ref = fn(a["q"], a["k"], a["v"], g_gamma=torch.log(a["decay"]), scale=1.0, initial_state=a["S0"].clone())[0].float()
            lines.append(f"lightning vs fla {name}: {((o - ref).abs().max() / ref.abs().max()).item():.2e}")
    return "\n".join(lines)


def table(bw: float, g: torch.Generator, families=("kda", "lightning", "mamba1")) -> str:
    rows = ["| family | B x T | kernel | us | floor us | x floor |", "|---|---|---|---:|---:|---:|"]
    for family in families:
        for B, T in SHAPES:
            trees, parents = ddtree_batch(B, T)
            parents = gb.TreePlan(parents.cuda())
            # the deepest-numbered node's path
            accepted = gb.checked_accepted([t.size - 1 for t in trees], B, T, "cuda")
            a = _inputs(family, B, T, g)
            floor = _nbytes(family, a) / bw * 1e6
            for name, fn in _calls(family, a, parents, accepted).items():
                us = _ms(fn) * 1e3
                rows.append(f"| {family} | {B}x{T} | {name} | {us:.1f} | {floor:.1f} | {us / floor:.1f} |")
                print(f"# {family} {B}x{T} {name}: {us:.1f} us", flush=True)
            del a
            torch.cuda.empty_cache()
    return "\n".join(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--families", default="kda,lightning,mamba1")
    a = ap.parse_args()
    families = a.families.split(",")
    if not families or set(families) - {"kda", "lightning", "mamba1"}:
        ap.error(f"--families {a.families!r}: expected a comma-separated subset of kda, lightning, mamba1")
    if not torch.cuda.is_available():
        print("bench_new_families: needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    print(cuda_header(a.commit))
    gen = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth("cuda")
    print(f"# copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    # the table first (each row printed as it is timed, ddsim's kernels before fla's), then the agreement:
    # fla's autotuning can take minutes, and a run cut by a time limit keeps the rows it reached
    print(table(bw, gen, families), flush=True)
    print(agreement(gen, families), flush=True)
