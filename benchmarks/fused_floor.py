"""Where the one-kernel WY form's time goes at one sequence (Qwen3.6-27B GDN shapes, bf16 inputs, DDTree trees):
beside the form itself (plan_wy's launch, design auto, the states given by sequence; and through a pool's slot table,
as a server's pool is read), on its grid and warps,

  reads           its reads alone, as it makes them (q, k, v, the gates, the ancestor mask, the slot, then the state
                  at the slot), each folded into the output so that none is dropped: the reads its products sit on
  reads, no slot  the same with the state at the sequence's own row (no read waits on another's value)
  empty           a kernel that reads and writes nothing: the timer's own cost for a launch on this grid
  stores only     a kernel that stores the form's output tiles and reads nothing: what the stores add to it

each on do_bench's timer (the L2 flushed before each call), the profiler's device time with the L2 flushed and
without (warm: the calls apart by a 4-byte zero alone), and CUDA events around each call without the flush (a spin
kernel before each so that the launch is queued ahead of its start event); then the form with its inputs scattered
(each in an allocation of its own, 64 MiB apart), and the form again at the end of the run. Then the form traced: a copy of _gdn_wy_kernel
that stores each thread's cycle counter (%clock64) once a value is made (the products K K^T, Q K^T, -L with the
root's column out, K S0, the right-hand side, the solve's U and the output, per element), as cycles after the
program's start: the median and the slowest program, after a flush and warm (the traced copy's own time beside,
its stores are not free).

    python benchmarks/fused_floor.py [--commit SHA] [--shapes 1x16,1x9] [--rownorm 0,1] [--floor 1]
        # --rownorm: the form with triton_gdn.FUSED_ROWNORM off / on (timed and traced); --floor 0: the form alone
"""
import argparse

import torch
import triton
import triton.language as tl

from ddsim.bench.bench import (
    captured_launch,
    cuda_header,
    ddtree_batch,
    edited_kernel,
    event_samples_us,
    int_list,
    kernel_device_us,
    kernel_inputs,
    median_us,
    parse_shapes,
    slotted_pool,
)
from ddsim.gpu_backend import triton_helpers as h
from ddsim.gpu_backend.launch import bind
from ddsim.gpu_backend.triton_gdn import plan_wy

NAMES = ("q", "k", "v", "g", "beta")


@triton.jit
def _reads_kernel(q, k, v, g, beta, mask, state, state_idx, o, T,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SLOT: tl.constexpr):
    # the reads of _gdn_wy_kernel with the root in the block, in its order, folded into o [B, T, HV, V]
    i_v, i_b, i_hv, i_h = h.head_coords(H, HV)
    o_t = tl.arange(0, BT)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    mt = o_t < T
    rows = (i_b * T + o_t).to(tl.int64)
    if SLOT:
        slot = tl.load(state_idx + i_b)
    else:
        slot = i_b
    b_q, b_k, b_v, raw_g, raw_b = h.draft_reads(q, k, v, g, beta, rows, mt, i_h, i_hv, o_k, o_v, mk, mv, H, HV, K, V,
                                                H * K, H * K, HV * V)
    anc = tl.load(mask + (i_b * T + o_t[:, None]).to(tl.int64) * T + o_t[None, :],
                  mask=mt[:, None] & mt[None, :], other=0)
    s0 = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, False), mask=mk[:, None] & mv[None, :],
                 other=0.0)  # [BK, BV]
    x = (tl.sum(b_q.to(tl.float32), 1) + tl.sum(b_k.to(tl.float32), 1) + raw_g + raw_b
         + tl.sum(anc.to(tl.float32), 1))  # [BT]
    b_o = b_v.to(tl.float32) + x[:, None] + tl.sum(s0, 0)[None, :]
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=mt[:, None] & mv[None, :])


@triton.jit
def _empty_kernel(o):
    pass


@triton.jit
def _stores_kernel(o, T, H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    # the form's output tile [BT, BV] stored (zeros), nothing read: what its stores add after the flush
    i_v, i_b, i_hv, _ = h.head_coords(H, HV)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    rows = (i_b * T + o_t).to(tl.int64)
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], tl.zeros([BT, BV], o.dtype.element_ty),
             mask=(o_t < T)[:, None] & (o_v < V)[None, :])


def warm_events_us(fn, *, repeats: int = 200) -> float:
    """Median us of fn() between CUDA events without a flush (bench.event_samples_us)."""
    return event_samples_us(fn, repeats=repeats)[repeats // 2]


def scattered(inp: dict) -> tuple[dict, list]:
    """The inputs copied each into an allocation of its own, 64 MiB of other allocations between them."""
    out, keep = {}, []
    for name, t in inp.items():
        keep.append(torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"))
        nbytes = t.numel() * t.element_size()
        buf = torch.empty(nbytes + 2**21, dtype=torch.uint8, device="cuda")
        out[name] = buf[:nbytes].view(t.dtype).view(t.shape).copy_(t)
        keep.append(buf)
    return out, keep


def row(name: str, fn) -> str:
    cells = [median_us(fn), kernel_device_us(fn), kernel_device_us(fn, flush=False), warm_events_us(fn)]
    return f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |"


# the traced copy: a probe (name, where, line of _gdn_wy_kernel's source, value stamped, its rows, its columns) goes
# before or after its line (the root in the block, q and k as read; either way of the rows' norms)
PROBES = (("K K^T, Q K^T", "after", "    # -L through D (0 off the ancestors): the mask stays in the layout it was read in "
           "(no conversion waits for it)\n", "QK", "BT", "BT"),
          ("-L, root's column out", "after", "        NL = tl.where(first[None, :], 0.0, NL)\n", "NL", "BT", "BT"),
          ("K S0, Q S0", "before", "    U = b_beta[:, None] * (b_v - A_k[:, None] * KS)  # right-hand side\n", "KS + QS",
           "BT", "BV"),
          ("right-hand side", "after", "        U = U + c[:, None] * u0[None, :]\n", "U", "BT", "BV"),
          ("solve", "before", "    b_o = A_q[:, None] * QS + tl.dot(D * QK, U, input_precision=PRECISION)\n", "U", "BT",
           "BV"))
SLOTS = 1024  # trace entries per probe and program (a [BT, BV] tile at most)
HELPERS = '''
import triton
import triton.language as tl
from ddsim.gpu_backend import triton_helpers as h


@triton.jit
def _stamp(x, ptrs):
    # each element: the cycle counter's low 32 bits stored at ptrs once x is made, by the thread holding it (the
    # store inside the asm, so that no value changes layout: a conversion would add barriers)
    return tl.inline_asm_elementwise(
        "{ .reg .u64 t; .reg .u32 w; mov.u64 t, %clock64; cvt.u32.u64 w, t; st.global.u32 [$2], w; mov.u32 $0, 0; }",
        "=r,r,l", [x.to(tl.int32, bitcast=True), ptrs.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _probe(trace, x, J: tl.constexpr, NP: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    _stamp(x.to(tl.float32), trace + (pid * NP + J) * 1024 + offs)


@triton.jit
def _probe0(trace, NP: tl.constexpr):
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    _stamp(pid.to(tl.float32), trace + pid * NP * 1024)

'''


def traced_kernel():
    """_gdn_wy_kernel with a trace pointer after o and PROBES' stamps (bench.edited_kernel)."""
    from ddsim.gpu_backend import triton_gdn as G
    n = len(PROBES) + 1
    edits = [("    state, state_idx, o,\n", "    state, state_idx, o, trace,\n"),
             ("    if ROOT == 0:\n", f"    _probe0(trace, {n})\n    if ROOT == 0:\n")]
    for j, (_, where, line, expr, r, c) in enumerate(PROBES, 1):
        indent = line[:len(line) - len(line.lstrip())]
        probe = f"{indent}_probe(trace, {expr}, {j}, {n}, {r}, {c})\n"
        edits.append(("\n" + line, "\n" + (line + probe if where == "after" else probe + line)))
    return edited_kernel(G._gdn_wy_kernel, edits, header=HELPERS, who="fused_floor")


def trace_rows(name: str, kernel, grid, kw, *, repeats: int = 30) -> list[str]:
    """PROBES' cycles after each program's start: medians over the calls of the median program and the slowest."""
    n = len(PROBES) + 1
    programs = grid[0] * grid[1]
    trace = torch.zeros(programs * n * SLOTS, dtype=torch.int32, device="cuda")
    launch = bind(kernel, grid, dict(kw, trace=trace))
    rows = [f"# {name}, the traced copy itself (columns as above): {row('traced', launch)}"]
    BT, BV = kw["BT"], kw["BV"]
    sizes = [1] + [{"BT": BT, "BV": BV}[r] * {"BT": BT, "BV": BV}[c] for *_, r, c in PROBES]
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    for cold in (True, False):
        runs = []
        for _ in range(repeats):
            if cold:
                flush.zero_()
            launch()
            torch.cuda.synchronize()
            t = trace.view(programs, n, SLOTS).long().cpu()
            start = t[:, 0, 0]
            per = [((t[:, j, :sizes[j]] - start[:, None]) % 2**32).max(1).values for j in range(1, n)]
            runs.append(torch.stack(per, 1).float())  # [programs, probes]
        runs = torch.stack(runs)  # [repeats, programs, probes]
        med = runs.median(1).values.median(0).values
        slow = runs.max(1).values.median(0).values
        for j, (probe, *_) in enumerate(PROBES):
            rows.append(f"| {name}, {'flushed' if cold else 'warm'}: {probe} | {med[j]:.0f} | {slow[j]:.0f} |")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x16,1x9")
    ap.add_argument("--rownorm", default="1", help="the form's FUSED_ROWNORM, comma-separated, from [0, 1]")
    ap.add_argument("--floor", default="1", choices=("0", "1"), help="1: the reads, empty and scattered rows too")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    rownorms = [bool(x) for x in int_list(ap, "--rownorm", a.rownorm, (0, 1))]
    if not torch.cuda.is_available():
        raise SystemExit("fused_floor: needs a CUDA device")
    from ddsim.gpu_backend import triton_gdn
    print(cuda_header(a.commit))
    print("| B x T, launch | do_bench us (flushed) | device us (flushed) | device us (warm) | events us (warm) |")
    print("|---|---|---|---|---|")
    traces = []
    default = triton_gdn.FUSED_ROWNORM
    for B, T in shapes:
        _, parents = ddtree_batch(B, T)
        inp = kernel_inputs(B, T, device="cuda")

        def plan(x, **states):
            return plan_wy(**{n: x[n] for n in NAMES}, parents=parents.to("cuda"),
                           **(states or dict(initial_state=x["initial_state"])), poison=False)

        pool, slots = slotted_pool(inp["initial_state"])

        try:
            for rownorm in rownorms:
                triton_gdn.FUSED_ROWNORM = rownorm
                name = f"{B} x {T}, the form" + (", rows' norms from the rows as read" if rownorm else "")
                form, _ = plan(inp)
                print(row(name, form), flush=True)
                _, grid, kw = captured_launch(lambda: plan(inp))  # a second plan, as before: the floor kernels and
                # the trace write its output, not the timed form's
                traces.append((name, grid, kw))
                if a.floor == "1" and rownorm == rownorms[0]:
                    base = {n: kw[n] for n in ("q", "k", "v", "g", "beta", "mask", "state", "state_idx", "o", "H", "HV",
                                               "K", "V", "BT", "BK", "BV", "num_warps")}
                    for slot in (True, False):
                        print(row(f"{B} x {T}, reads" + ("" if slot else ", no slot"),
                                  bind(_reads_kernel, grid, dict(base, T=T, SLOT=slot))), flush=True)
                    print(row(f"{B} x {T}, empty", bind(_empty_kernel, grid, dict(o=kw["o"],
                                                                                  num_warps=kw["num_warps"]))),
                          flush=True)
                    stores = {n: kw[n] for n in ("o", "H", "HV", "V", "BT", "BV", "num_warps")}
                    print(row(f"{B} x {T}, stores only", bind(_stores_kernel, grid, dict(stores, T=T))), flush=True)
                    print(row(f"{name}, the states through slots", plan(inp, initial_state=pool,
                                                                              state_indices=slots)[0]), flush=True)
                    far, keep = scattered(inp)
                    print(row(f"{name}, inputs scattered", plan(far)[0]), flush=True)
                    del keep
                    print(row(f"{name} again", form), flush=True)
        finally:
            triton_gdn.FUSED_ROWNORM = default
    print("\n| launch, when, made | cycles after the program's start: median program | slowest program |")
    print("|---|---|---|")
    kernel = traced_kernel()
    for name, grid, kw in traces:
        for line in trace_rows(name, kernel, grid, kw):
            print(line, flush=True)


if __name__ == "__main__":
    main()
