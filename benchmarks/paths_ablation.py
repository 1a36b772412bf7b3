"""What each part of the paths kernel (triton_gdn._gdn_paths_kernel, the drop-in's verify up to four sequences) costs,
and whether a changed read or store order helps, at Qwen3.6-27B GDN shapes (H=16, HV=48, K=V=128, bf16 inputs, SGLang's
fp32 pool and intermediate buffer), DDTree trees: copies of the kernel with lines replaced (bench.edited_kernel),
timed beside the kernel and the serial kernel (design "serial", plan_recurrent's choice past four sequences) in one
process, the rows interleaved round by round. A cut copy writes wrong states: it is timed, never used. A changed copy
(no "cut" in its name) is checked against the kernel's output and buffer first (its largest difference printed:
0 where it makes the same steps in the same order).

  no state store        the node's state not written (its output still made)
  no steps              no step along the path: the committed tile read, the output made from it, the state stored
  no committed read     the path stepped from zeros (the committed tile not read)
  path from registers   (changed) the path's entries taken from the one vector read that counts its steps, not read
                        again one by one inside the loop (one fewer round trip a step)
  rows first            (changed) every step's k, v rows and gates read in one round before the first step, each step
                        taking its row from registers
  streaming stores      (changed) the state stored with the evict-first hint (.cs): the buffer's lines leave L2 first,
                        the committed tiles stay
  rows first + streaming stores
  decay deferred        (changed) S kept divided by c, the product of the path's decays so far: a step makes two passes
                        over the tile (the sum over K, the rank-one update by u / c) where delta_step makes three; S
                        times c once after the last step (c taken into S where it falls below 1e-20)
  root first, two kernels
                        (changed) the serial kernel's first node alone (the root's output and state into the buffer),
                        then the paths kernel over the other nodes, each stepping from the root's state read back
                        from the buffer: each node's path one step shorter (the root's step made once, not by every
                        node); "+ decay deferred": with the second kernel's decay deferred too
  K in thread           (changed) the committed tile read with its offsets along K times a runtime 1, so that Triton
                        lays the tile and the loop's state in its default layout: a column of K to a thread, each
                        step's sum over K a thread's own adds; at V tiles and warps that put the warps along V, beside
                        the kernel at the same ones (PATHS_CONFIGS); serial, K in thread: the same in the serial
                        kernel, its parents' reads too (SERIAL_EDITS). SGLang's layout only

Timer: bench.median_us_calls (the median of --calls do_bench calls, their range); device: bench.kernel_device_us after
do_bench's flush. Beside them: the floor of writing the buffer's bytes once over the measured copy bandwidth.

    python benchmarks/paths_ablation.py [--commit SHA] [--calls 5] [--rounds 2] [--shapes 1x65,8x65]
                                        [--only "K in thread,cut"]
"""
import argparse

import torch

from ddsim.bench.bench import (
    at_least_one,
    captured_launch,
    copy_bandwidth,
    cuda_run,
    edited_kernel,
    parse_shapes,
    sglang_layer,
    timing_options,
    timing_rounds,
)
from ddsim.gpu_backend import triton_gdn as G
from ddsim.gpu_backend.launch import bind

STORE = "        h.store_state(snap, seq0 + t, S, i_hv, o_k, o_v, mkv, HV, K, V, False, SNAP_VK)\n"
STREAM = ("        tl.store(h.state_ptrs(snap, seq0 + t, i_hv, o_k, o_v, HV, K, V, SNAP_VK), S, mask=mkv,\n"
          "                 cache_modifier=\".cs\")\n")
STEPS = "    steps = tl.sum((tl.load(path + o_d, mask=o_d < DMAX, other=-1) >= 0).to(tl.int32), 0)  # t's depth + 1\n"
ENTRIES = ("    ent = tl.load(path + o_d, mask=o_d < DMAX, other=-1)\n"
           "    steps = tl.sum((ent >= 0).to(tl.int32), 0)\n")
READ = ("    S = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),\n"
        "                mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)\n")
PATH_ROW = "        row = i_b * T + tl.load(path + d)\n"
LOOP = ("    for d in range(0, steps):\n"
        "        row = i_b * T + tl.load(path + d)\n"
        "        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, L2NORM, 0, KS)\n"
        "        b_v = h.load_rows(v, row, i_hv, o_v, mv, HV, V, False, 0, VS)\n"
        "        b_g, b_beta = h.gates(g, beta, row * HV + i_hv, 0, neg_A, bias, FUSED, False)\n")
ROWS_FIRST = ("    on = ent >= 0\n"
              "    rws = i_b * T + tl.maximum(ent, 0)\n"
              "    KK = h.load_rows(k, rws[:, None], i_h, o_k[None, :], on[:, None] & mk[None, :], H, K, L2NORM, 1, KS)\n"
              "    VV = h.load_rows(v, rws[:, None], i_hv, o_v[None, :], on[:, None] & mv[None, :], HV, V, False, 1, VS)\n"
              "    GG, BB = h.gates(g, beta, rws * HV + i_hv, on, neg_A, bias, FUSED, True)\n"
              "    for d in range(0, steps):\n"
              "        sel = o_d == d\n"
              "        b_k = tl.sum(tl.where(sel[:, None], KK, 0.0), 0)\n"
              "        b_v = tl.sum(tl.where(sel[:, None], VV, 0.0), 0)\n"
              "        b_g = tl.sum(tl.where(sel, GG, 0.0), 0)\n"
              "        b_beta = tl.sum(tl.where(sel, BB, 0.0), 0)\n")
EDITS = {
    "cut: no state store": [(STORE, "        pass\n")],
    "cut: no steps": [(STEPS, "    steps = 0\n")],
    "cut: no committed read": [(READ, "    S = tl.zeros([BK, BV], tl.float32)\n")],
    "path from registers": [(STEPS, ENTRIES), (PATH_ROW, "        row = i_b * T + tl.sum(tl.where(o_d == d, ent, 0), 0)\n")],
    "rows first": [(STEPS, ENTRIES), (LOOP, ROWS_FIRST)],
    "streaming stores": [(STORE, STREAM)],
    "rows first + streaming stores": [(STEPS, ENTRIES), (LOOP, ROWS_FIRST), (STORE, STREAM)],
}
# the committed tile's read with its offsets along K times a runtime 1: Triton cannot see them contiguous, so the
# tile (and the steps' loop-carried S) lies in its default layout, a column of K to a thread, V across the threads
# and the warps: each step's sum over K is a thread's own adds (no shuffles, no shared memory). SGLang's layout only
IN_THREAD = ("    one = T // T\n"
             "    S = tl.load(state + ((slot.to(tl.int64) * HV + i_hv) * V + o_v[None, :]) * K\n"
             "                + o_k[:, None] * one, mask=mkv, other=0.0)\n")
S_READ = ("    s0 = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),\n"
          "                 mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)\n")
S_IN_THREAD = IN_THREAD.replace("    S = ", "    s0 = ")
PARENT = "            S = h.source_state(snap, src + i_b * SRC_B, t, seq0, s0, i_hv, o_k, o_v, mkv, HV, K, V, SNAP_VK)\n"
PARENT_IN_THREAD = (
    "            p = tl.load(src + i_b * SRC_B + t)\n"
    "            sp = tl.load(snap + (((seq0 + tl.maximum(p, 0)).to(tl.int64) * HV + i_hv) * V + o_v[None, :]) * K\n"
    "                         + o_k[:, None] * one, mask=mkv, other=0.0)\n"
    "            S = tl.where(p >= 0, sp, s0)\n")
# changed forms past EDITS: (the kernel edited, its edits, the (V tile, warps) it runs at); the default layout puts 32
# columns on a warp's threads and the warps along V where the tile has 32 columns a warp
SERIAL_EDITS = {"serial, K in thread": ([(S_READ, S_IN_THREAD), (PARENT, PARENT_IN_THREAD)], [(32, 1), (64, 2)])}
PATHS_CONFIGS = {"K in thread": ([(READ, IN_THREAD)], [(32, 1), (64, 2), (128, 4)])}
# the decay deferred: S kept as S_true / c with c the product of the path's decays so far, so that a step is two
# passes over the tile (the sum over K, the rank-one update) where delta_step makes three (the decay too); S_true made
# once after the last step; c taken into S where it falls below 1e-20 (so u / c stays finite, and a decay that
# rounds to 0 zeroes S as delta_step's does)
FOR = "    for d in range(0, steps):\n"
STEP = "        S = h.delta_step(S, b_k, b_v, b_g, b_beta)\n    row = i_b * T + t\n"
DEFERRED_STEP = ("        c = c * tl.exp(b_g)\n"
                 "        if c < 1e-20:\n"
                 "            S = S * c\n"
                 "            c = tl.full([], 1.0, tl.float32)\n"
                 "        u = b_beta * (b_v - c * tl.sum(S * b_k[:, None], 0))\n"
                 "        S = S + b_k[:, None] * (u / c)[None, :]\n"
                 "    S = S * c\n"
                 "    row = i_b * T + t\n")
C_INIT = "    c = tl.full([], 1.0, tl.float32)\n"
EDITS["decay deferred"] = [(FOR, C_INIT + FOR), (STEP, DEFERRED_STEP)]
# the root first, in two kernels: the serial kernel's first node alone (its output and state into the buffer), then
# a program per other node steps along its path from the root's state read back from the buffer, not from the
# committed state (a third of the paths kernel's steps are the root's, each node making it again)
ROOT_SERIAL = [("    for t in range(0, T):\n", "    for t in range(0, 1):\n")]
FROM_ROOT = [("    i_bh = pid // T\n    t = pid % T\n", "    i_bh = pid // (T - 1)\n    t = 1 + pid % (T - 1)\n"),
             (READ, "    if ROWS:\n        r0 = tl.load(snap_rows + i_b) * TS\n    else:\n        r0 = i_b * T\n"
                    "    S = tl.load(h.state_ptrs(snap, r0, i_hv, o_k, o_v, HV, K, V, SNAP_VK), mask=mkv, other=0.0)\n")]
FROM_ROOT_FOR = "    for d in range(1, steps):\n"
# (the root's kernel's edits, the others' kernel's edits): the second kernel's grid has T - 1 nodes a head
TWO_KERNELS = {
    "root first, two kernels": (ROOT_SERIAL, FROM_ROOT + [(FOR, FROM_ROOT_FOR)]),
    "root first, two kernels + decay deferred": (ROOT_SERIAL, FROM_ROOT + [(FOR, C_INIT + FROM_ROOT_FOR),
                                                                           (STEP, DEFERRED_STEP)]),
}
HEADER = "import triton\nimport triton.language as tl\nfrom ddsim.gpu_backend import triton_helpers as h\n\n\n"


def planned(**plan_kw):
    """plan_recurrent's (kernel, grid, kw) for plan_kw, as it binds them (bench.captured_launch)."""
    _, grid, kw = captured_launch(lambda: G.plan_recurrent(**plan_kw))
    return G._gdn_paths_kernel if "paths" in kw else G._gdn_recurrent_kernel, grid, kw


def edited_forms(chosen) -> list:
    """The one-kernel forms whose names ``chosen`` takes: (name, design, its kernel, (V tile, warps) or None for the
    paths kernel's own), each edited copy made once; beside each form of PATHS_CONFIGS and SERIAL_EDITS its design's
    kernel at the same V tile and warps (its kernel None: the design's own)."""
    forms = [(name, "paths", edited_kernel(G._gdn_paths_kernel, edits, header=HEADER, who="paths_ablation"), None)
             for name, edits in EDITS.items() if chosen(name)]
    for table, design, base_kernel in ((PATHS_CONFIGS, "paths", G._gdn_paths_kernel),
                                       (SERIAL_EDITS, "serial", G._gdn_recurrent_kernel)):
        for name, (edits, configs) in table.items():
            if chosen(name):
                kernel = edited_kernel(base_kernel, edits, header=HEADER, who="paths_ablation")
                for bv, w in configs:
                    forms += [(f"{design} {bv}/{w}", design, None, (bv, w)), (f"{name} {bv}/{w}", design, kernel, (bv, w))]
    return forms


def two_kernel_forms(chosen) -> dict:
    """TWO_KERNELS' forms whose names ``chosen`` takes: {name: (the root's kernel, the others' kernel)}."""
    return {name: (edited_kernel(G._gdn_recurrent_kernel, root, header=HEADER, who="paths_ablation"),
                   edited_kernel(G._gdn_paths_kernel, rest, header=HEADER, who="paths_ablation"))
            for name, (root, rest) in TWO_KERNELS.items() if chosen(name)}


def root_first(root_kernel, rest_kernel, *, base: dict, kw: dict, grid) -> callable:
    """A two-kernel form's launch into the paths launch kw's output and buffer (plan_recurrent's keywords ``base``,
    its grid ``grid``): the root's kernel on the serial kernel's grid at kw's V tile and warps, then the others'
    kernel over T - 1 nodes a head."""
    _, rgrid, rkw = planned(**base, design="serial", block_v=kw["BV"], num_warps=kw["num_warps"])
    root = bind(root_kernel, rgrid, dict(rkw, o=kw["o"], snap=kw["snap"]))
    rest = bind(rest_kernel, (grid[0] // kw["T"] * (kw["T"] - 1), grid[1]), kw)

    def launch():
        root()
        rest()
    return launch


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=2)
    ap.add_argument("--shapes", default="1x65,8x65")
    ap.add_argument("--only", default="", help="comma-separated parts of the forms' names to time (besides the "
                                                "kernel and the serial kernel); all where empty")
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    shapes = parse_shapes(ap, a.shapes)
    only = [x for x in a.only.split(",") if x]
    names = [*EDITS, *PATHS_CONFIGS, *SERIAL_EDITS, *TWO_KERNELS]
    for x in only:
        if not any(x in name for name in names):
            ap.error(f"--only {x!r}: no form's name has it (forms: {', '.join(names)})")
    cuda_run("paths_ablation", a.commit)
    bw = copy_bandwidth("cuda")
    chosen = lambda name: not only or any(x in name for x in only)  # noqa: E731
    forms_of, two = edited_forms(chosen), two_kernel_forms(chosen)
    for B, T in shapes:
        _, _, inp, a_, b_, zeros, pool, slots, par, plan, pslots, buf, rows, prows = sglang_layer(B, T)
        base = dict(q=inp["q"], k=inp["k"], v=inp["v"], parents=plan, initial_state=pool.transpose(-1, -2),
                    state_indices=pslots, a=a_, b=b_, A_log=zeros, dt_bias=zeros, mode="exact", poison=True,
                    states_out=buf.transpose(-1, -2), states_rows=prows)

        def fresh(kw):  # its own output and buffer, NaN at first
            bufd = torch.full_like(buf, float("nan"))
            return dict(kw, o=torch.full_like(kw["o"], float("nan")), snap=bufd.transpose(-1, -2)), bufd

        kernel, grid, kw = planned(**base, design="paths")
        ref_kw, ref_buf = fresh(kw)
        forms = {"the kernel (paths 32/2)": bind(kernel, grid, ref_kw)}
        skernel, sgrid, skw = planned(**base, design="serial")
        forms["serial 16/1 (design auto past 4 sequences)"] = bind(skernel, sgrid, fresh(skw)[0])
        outs = {}
        for name, design, edited, config in forms_of:
            k0, g0, kw0 = (kernel, grid, kw) if config is None else planned(
                **base, design=design, block_v=config[0], num_warps=config[1])
            kwn, bufn = fresh(kw0)
            forms[name] = bind(edited or k0, g0, kwn)
            outs[name] = (kwn["o"], bufn)
        for name, (root_kernel, rest_kernel) in two.items():
            kwn, bufn = fresh(kw)
            forms[name] = root_first(root_kernel, rest_kernel, base=base, kw=kwn, grid=grid)
            outs[name] = (kwn["o"], bufn)
        for launch in forms.values():
            launch()
        torch.cuda.synchronize()
        print(f"\n## {B} x {T}: mean path steps {float((plan.root_paths() >= 0).sum()) / (B * T):.1f}, write floor "
              f"{buf.numel() * 4 / bw * 1e6:.1f} us (copy bandwidth {bw / 1e9:.0f} GB/s)")
        for name, (o, bufn) in outs.items():
            if not name.startswith("cut"):
                d = max(float((o.float() - ref_kw["o"].float()).abs().max()), float((bufn - ref_buf).abs().max()))
                finite = bool(torch.isfinite(o).all() and torch.isfinite(bufn).all())
                print(f"# {name}: largest difference from the kernel {d:.1e}, all finite {finite}")
        timing_rounds(forms, rounds=a.rounds, calls=a.calls, warm=False)


if __name__ == "__main__":
    main()
