"""Whether the one-kernel WY form at 1 x 16 gains from its state read by the copy engine (TMA) issued first and
waited for only where the state is used: an order Triton's language cannot state (Triton 3.6 waits for a descriptor's
copy where it issues it), made here by editing the kernel's TTGIR and compiling from it. Per --configs (warps x V
tile width), in one process, the rows interleaved round by round:

  the form            plan_wy's launch of the one-kernel form (the state by 16-byte loads; at 4x64 the default)
  TMA, waited at once the form with its state read by a host tensor descriptor, as Triton compiles it
  TMA, waited at use  its TTGIR with the copy's wait, the barrier's invalidation and the tile's move into registers
                      placed right before the tile's first use (the state's hold, after -L's root column), compiled
                      from that IR; the copy still goes out where Triton put it, once the slot has arrived
  TMA, at use, in the products' layout
                      the same, the tile moved from the copy's shared memory straight into the layout of the products'
                      second operand and split into its bf16 head and remainder there: no hold's product and no
                      second pass through shared memory (Triton's lowering stores a product's operand made in
                      registers to shared memory and loads it back)
  ..., split after K K^T / Q K^T
                      the same with the wait, the tile's load and its split moved up to right after the K K^T or
                      Q K^T product (the split then overlaps the state-free products, and the wait may come first)

Each edited kernel runs a second handle on Triton's own compile of the descriptor form (its launcher takes the host
descriptor, encoded at each launch) with the edited binary and its shared memory. Each output is checked against the
form's (max |difference|, all finite). Timer: bench.median_us_calls; device: bench.kernel_device_us, the figure to
compare here (the descriptor's encoding on the host is not in it).

    python benchmarks/fused_tma_late.py [--commit SHA] [--calls 5] [--rounds 2] [--configs 4x64,2x32]
"""
import argparse
import os
import re
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget

from ddsim.bench.bench import (
    at_least_one,
    compile_kernel,
    cuda_run,
    edited_kernel,
    timing_options,
    timing_rounds,
    warps_widths,
    wy_default_launch,
)

READ = ("        s0 = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),\n"
        "                     mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)  # a padded row: zero\n")
COORDS = "        _, i_b, i_hv, i_h, o_t, o_k, o_v, mk, mv, neg_A, bias = h.block_coords("
# the same, the V tile's index kept (a descriptor's read takes it)
COORDS_V = COORDS.replace("_, i_b", "i_v, i_b")
TMA_READ = "        s0 = state.load([slot * HV + i_hv, 0, i_v * BV]).reshape(BK, BV)\n"  # a host descriptor [1, BK, BV]
HEADER = ("import triton\nimport triton.language as tl\nfrom ddsim.gpu_backend import triton_helpers as h\n"
          "from ddsim.gpu_backend.triton_gdn import _apart\n\n\n")


def tma_kernel():
    from ddsim.gpu_backend import triton_gdn as G
    return edited_kernel(G._gdn_wy_kernel, [(COORDS, COORDS_V), (READ, TMA_READ)], header=HEADER, who="fused_tma_late")


def desc_type(kw: dict) -> str:
    """The state's parameter type where a launch's keyword arguments ``kw`` take it by a host descriptor (TMA_READ's),
    for bench.compile_kernel's ``types``."""
    return f"tensordesc<fp32[1,{kw['BK']},{kw['BV']}]>"


def descriptor_launches(kern, cks: dict, kw: dict, grid, o) -> dict:
    """{name: (launch, output)} of each of ``cks`` ({name: compiled}, compiles of kern taking the state by a host
    descriptor, desc_type's) on kw's inputs, each into a fresh NaN output shaped as o. The launcher takes every
    parameter, constexprs too."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    state = kw["state"]
    desc = TensorDescriptor.from_tensor(state.view(-1, kw["BK"], state.shape[-1]), [1, kw["BK"], kw["BV"]])
    names = [p.name for p in kern.params]
    g3 = tuple(grid) + (1,) * (3 - len(grid))
    forms = {}
    for name, ck in cks.items():
        out = torch.full_like(o, float("nan"))
        args = [desc if n == "state" else out if n == "o" else kw[n] for n in names]
        forms[name] = ((lambda ck=ck, args=args: ck[g3](*args)), out)
    return forms


def first(lines: list, pred, what: str) -> int:
    """The index of the first line pred holds for; where none does, the script stops naming what it looked for."""
    at = next((i for i, line in enumerate(lines) if pred(line)), None)
    if at is None:
        raise SystemExit(f"fused_tma_late: the TTGIR has no {what}")
    return at


def waited_at_use(ttgir: str) -> str:
    """The TTGIR with the state copy's wait, its barrier's invalidation and the tile's local_load moved to right
    before the tile's first use."""
    lines = ttgir.split("\n")
    w = first(lines, lambda line: "ttng.wait_barrier" in line, "wait for the copy")
    moved = lines[w:w + 3]
    if "inval_barrier" not in moved[1] or "ttg.local_load" not in moved[2]:
        raise SystemExit("fused_tma_late: the copy's wait is not followed by its invalidation and the tile's load")
    tile = re.match(r"\s*(%[\w.]+) = ttg.local_load", moved[2]).group(1)
    rest = lines[:w] + lines[w + 3:]
    use = first(rest, lambda line: re.search(re.escape(tile) + r"\b", line), f"use of {tile}")
    print(f"# moved the wait from line {w} to {use} (of {len(lines)}): {rest[use].strip()[:80]}")
    return "\n".join(rest[:use] + moved + rest[use:])


DOB = "#ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>"


def name_of(line: str) -> str:
    return re.match(r"\s*(%[\w.]+) =", line).group(1)


def read_in_operand_layout(ttgir: str) -> str:
    """waited_at_use's TTGIR with the state tile loaded from the copy's buffer in the products' operand layout: the
    hold's product dropped, the head and remainder made in that layout, their shared-memory round trip removed."""
    lines = ttgir.split("\n")
    i = first(lines, lambda line: "ttng.inval_barrier" in line, "barrier invalidation") + 1
    tile = name_of(lines[i])
    lines[i] = re.sub(r"-> tensor<(\d+)x(\d+)xf32, #blocked\d*>", rf"-> tensor<\1x\2xf32, {DOB}>", lines[i])
    m = first(lines, lambda line: re.search(r"arith.mulf " + re.escape(tile) + ",", line), f"hold's product of {tile}")
    held = name_of(lines.pop(m))
    out, loads = [], {}
    for line in lines:
        if re.match(r"\s*%s_(hi|lo)\w* = arith\.(truncf|extf|subf)", line):
            line = re.sub(re.escape(held) + r"\b", tile, line)
            line = re.sub(r"#blocked\d*", DOB, line)
        elif re.match(r"\s*%s_(hi|lo)\w* = ttg\.local_alloc", line):
            loads[name_of(line)] = re.search(r"local_alloc (%[\w.]+)", line).group(1)
            continue
        elif re.match(r"\s*%s_(hi|lo)\w* = ttg\.local_load", line):
            src = re.search(r"local_load (%[\w.]+)", line).group(1)
            loads[name_of(line)] = loads[src]
            continue
        out.append(line)
    if len(loads) != 4:
        raise SystemExit(f"fused_tma_late: expected the head's and remainder's alloc and load, found {sorted(loads)}")
    text = "\n".join(out)
    for name, value in loads.items():
        text = re.sub(re.escape(name) + r"(?![\w.])", value, text)
    return text


ANCHORS = {"K K^T": r"\s*%KK_\d+ = tt\.dot ", "Q K^T": r"\s*%QK = tt\.dot "}


def split_after(ttgir: str, anchor: str) -> str:
    """read_in_operand_layout's TTGIR with the copy's wait, the tile's load and its split into head and remainder
    moved to right after the first line matching ANCHORS[anchor] (sooner: the split's work can then fill the K side's
    stalls, the wait come before the state has arrived)."""
    lines = ttgir.split("\n")
    w = first(lines, lambda line: "ttng.wait_barrier" in line, "wait for the copy")
    end = w + 3
    while re.match(r"\s*%s_(hi|lo)\w* = arith\.(truncf|extf|subf)", lines[end]):
        end += 1
    if end - w != 7:
        raise SystemExit(f"fused_tma_late: expected the wait, its invalidation, the load and 4 split lines, got {end - w}")
    block, rest = lines[w:end], lines[:w] + lines[end:]
    at = first(rest, lambda line: re.match(ANCHORS[anchor], line), f"{anchor} product")
    if at >= w:
        raise SystemExit(f"fused_tma_late: {anchor} comes after the state's first use")
    return "\n".join(rest[:at + 1] + block + rest[at + 1:])


def compiled_ir(ttgir: str, d: str, name: str, target):
    path = os.path.join(d, f"{name}.ttgir")
    with open(path, "w") as f:
        f.write(ttgir)
    return triton.compile(path, target=target)


def swapped(ck, ir_ck):
    """A second handle on ck's compile (its launcher, built from the source's signature, takes the host tensor
    descriptor) running ir_ck's binary, with ir_ck's shared memory."""
    from triton.compiler.compiler import CompiledKernel, make_backend
    out = CompiledKernel(ck.src, ck.metadata_group, ck.hash)
    out.kernel = ir_ck.kernel
    out.metadata = out.metadata._replace(shared=ir_ck.metadata.shared)
    out.packed_metadata = make_backend(out.metadata.target).pack_metadata(out.metadata)
    return out


def variants(B: int, T: int, warps: int, block_v: int, target, d: str) -> dict:
    """{name: launch} of the form at (warps, block_v) and its TMA variants, each output checked against the form's."""
    # the one-kernel form at (warps, block_v): at 4 warps and 64-wide tiles the default launch itself
    default, o, grid, kw, _, _ = wy_default_launch(B, T, design="fused", num_warps=warps, block_v=block_v)
    if kw.get("ROOT") != 2 or not kw.get("RAW16") or not kw.get("HOLD") or kw.get("STATE_VK"):
        raise SystemExit(f"fused_tma_late: the form at {B} x {T} is not the one this edits")
    kern = tma_kernel()
    # the state a host tensor descriptor
    at_once = compile_kernel(kern, kw, target, types={"state": desc_type(kw)})
    tag = f"{warps}w{block_v}"
    late = waited_at_use(at_once.asm["ttgir"])
    operand = read_in_operand_layout(late)
    cks = {"TMA, waited at once": at_once, "TMA, waited at use": swapped(at_once, compiled_ir(late, d, tag + "late", target)),
           "TMA, at use, in the products' layout": swapped(at_once, compiled_ir(operand, d, tag + "op", target))}
    for anchor in ANCHORS:
        cks[f"TMA, in the products' layout, split after {anchor}"] = swapped(
            at_once, compiled_ir(split_after(operand, anchor), d, tag + anchor[0], target))
    launches = descriptor_launches(kern, cks, kw, grid, o)
    outs = {name: out for name, (_, out) in launches.items()}
    forms = {f"{warps} warps, {block_v} wide: the form": default,
             **{f"{warps} warps, {block_v} wide: {name}": launch for name, (launch, _) in launches.items()}}
    for launch in forms.values():
        launch()
    torch.cuda.synchronize()
    for name, out in outs.items():
        print(f"# {tag} {name}: {cks[name].metadata.shared} B shared; output bit-equal to the form's "
              f"{torch.equal(out, o)}, max |diff| {(out.float() - o.float()).abs().max():.3e}, finite "
              f"{bool(torch.isfinite(out).all())}")
    return forms


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=2)
    ap.add_argument("--configs", default="4x64", help="comma-separated warps x V tile width, e.g. 4x64,2x32")
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    configs = warps_widths(ap, a.configs)
    cuda_run("fused_tma_late", a.commit)
    cap = torch.cuda.get_device_capability()
    target = GPUTarget("cuda", cap[0] * 10 + cap[1], 32)
    d = tempfile.mkdtemp(prefix="ddsim_tma_late_")
    forms = {}
    for warps, block_v in configs:
        forms.update(variants(1, 16, warps, block_v, target, d))
    timing_rounds(forms, rounds=a.rounds, calls=a.calls)


if __name__ == "__main__":
    main()
