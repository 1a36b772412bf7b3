"""Compile, for an NVIDIA GPU and without one, the Triton kernels ddsim launches; print a line per kernel
(ok, or FAIL with the reason: a compile error, or more shared memory than the architecture gives a block);
exit 1 if any fails. Triton's interpreter runs kernels without compiling them, so a kernel it runs may still
not compile (a loop variable that changes type, shared memory past the SM's); this catches that on a CPU,
with Triton's bundled ptxas.

    python tests/gpu_compile.py [--arch 90|100|120] [--set all|serving|reads]

--arch: 90 (Hopper, sm_90a), 100 (datacenter Blackwell, sm_100a), 120 (consumer Blackwell, sm_120a).
--set all (the default): every launch the GDN WY launchers make at Qwen3.6-27B GDN shapes for every design,
one block (65 nodes: fused, split, fold, head) and past it (131 nodes: the chunked form and the split form,
unfolded and folded), bf16 and fp32 inputs (design head at 2 x 65 split along V), design head for eight sequences
(whole heads, the last wave's split along V: HEAD_MIXED), the Gluon fold (gluon_gdn) at 1 x 16 and 2 x 9 (design
fused), and every other Triton kernel the public functions launch (recurrent GDN, the commits, the tree conv,
Mamba2's recurrent, SSD and commit kernels) at the property suites' fixed examples. --set serving: what a server
launches, the WY launchers' default design ("auto") at one sequence of 16 nodes (the root in the block: the Gluon
fold) and one and eight of 17, 65 and 131 nodes in bf16, the two-kernel form auto takes for a batch when given its
options (fold at 8 x 65) and for one sequence (split at 1 x 65), six of these on a plan built on the device (a
captured call's: the tables' kernel, then the WY kernels taking each sequence's doubling rounds from the depths it
wrote), and the other kernels. --set reads: the WY kernels a server launches up to one block (design auto at
1 x 16 (the root in the block: the Gluon fold, and the Triton form with triton_gdn.FUSED_GLUON off), 1 x 17, 1 x 65
and 8 x 65, fold at 8 x 65, auto at 1 x 16 with triton_gdn.FUSED_RAW16 off and at 8 x 65 with
triton_wy_split.HEAD_MIXED off), each with its global reads' rounds in the machine code: runs of loads that a
barrier (BAR.SYNC) separates. A read issued after a barrier waits a memory round trip of its own; a kernel whose
reads all precede its first barrier takes one. The Gluon fold parts its reads by barriers on purpose, so its line
says too how many reads go out after the first instruction that waits for one ("late": none where every read goes
out in one round trip).
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # before Triton is imported: compile, do not interpret

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import ddsim.gpu_backend as gb  # noqa: E402
from ddsim.bench.bench import compile_kernel, ddtree_batch, kernel_inputs, on_cubin, triton_tool  # noqa: E402
from ddsim.gpu_backend import (  # noqa: E402
    _common,
    gluon_gdn,
    triton_attention,
    triton_checks,
    triton_commit,
    triton_conv,
    triton_gdn,
    triton_kda,
    triton_lightning,
    triton_mamba1,
    triton_mamba2,
    triton_norms,
    triton_tables,
    triton_wy_blocked,
    triton_wy_split,
)
from ddsim.properties.strategies import fixed_conv_example, fixed_gdn_example, fixed_mamba2_example  # noqa: E402

ARCH = int(sys.argv[sys.argv.index("--arch") + 1]) if "--arch" in sys.argv else 90
SET = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "all"
# the largest shared memory a block may take, in bytes: Hopper (H100, H200) and datacenter Blackwell (B200, GB200)
# 227 KiB, consumer Blackwell (RTX 50 series, RTX PRO 6000) 99 KiB
SHARED_PER_BLOCK = {90: 232448, 100: 232448, 120: 101376}.get(ARCH, 0)


GOT = []  # (kernel, keyword arguments) of each launch asked for since the last clear


def _bind(kernel, grid, kw):
    GOT.append((kernel, dict(kw)))
    return lambda: None


def _launch(kernel, grid, **kw):
    GOT.append((kernel, dict(kw)))


for _m in (triton_gdn, triton_wy_split, triton_wy_blocked, triton_commit, triton_mamba2, triton_kda, triton_mamba1,
           triton_lightning):
    _m.bind = _bind
for _m in (triton_attention, triton_checks, triton_commit, triton_conv, triton_norms, triton_tables):
    _m.launch = _launch
_common.check_device = lambda *xs: None  # CPU tensors: nothing is launched


def launches(B, T, dtype, design, device_plan=False, **plan_kw):
    """(kernel, keyword arguments) of each launch plan_wy would make (with ``plan_kw``: num_warps, block_v ...);
    device_plan: on a plan built on the device, as a captured call's (its tables' launch first, then the WY kernels
    taking each sequence's rounds from its depths)."""
    GOT.clear()
    _, parents = ddtree_batch(B, T)
    if device_plan:
        from ddsim.gpu_backend import device_checks
        parents = device_checks.DevicePlan(parents.int())
    inp = kernel_inputs(B, T, dtype=dtype, device="cpu")
    triton_gdn.plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                       initial_state=inp["initial_state"], design=design, poison=False, **plan_kw)
    return list(GOT)


def other_calls():
    """(name, call) of every other public Triton path, at the fixed examples (bf16 inputs)."""
    g = fixed_gdn_example(dtype=torch.bfloat16)
    qkv = {n: g[n] for n in ("q", "k", "v", "g", "beta")}
    acc = torch.tensor([4, 5])
    c = fixed_conv_example(dtype=torch.bfloat16)
    m = fixed_mamba2_example(dtype=torch.bfloat16)
    mk = {n: m[n] for n in ("x", "dt", "A", "B", "C", "D", "dt_bias", "dt_softplus", "dt_limit")}
    mc = {n: mk[n] for n in ("x", "dt", "A", "B", "dt_bias", "dt_softplus", "dt_limit")}
    gen = torch.Generator().manual_seed(0)  # KDA at Kimi Linear's head width: q, k, v [1, 6, 2, 128], g per channel
    kd = {n: torch.randn(1, 6, 2, 128, generator=gen).to(torch.bfloat16) for n in ("q", "k", "v")}
    kd.update(g=-torch.rand(1, 6, 2, 128, generator=gen), beta=torch.rand(1, 6, 2, generator=gen))
    ks = torch.randn(1, 2, 128, 128, generator=gen)
    # Mamba1 at Jamba's state size: x, dt [1, 6, 256], A [256, 16], B, C [1, 6, 16]
    m1 = dict(x=torch.randn(1, 6, 256, generator=gen).to(torch.bfloat16), dt=torch.randn(1, 6, 256, generator=gen),
              A=-torch.rand(256, 16, generator=gen), B=torch.randn(1, 6, 16, generator=gen).to(torch.bfloat16),
              C=torch.randn(1, 6, 16, generator=gen).to(torch.bfloat16), D=torch.ones(256), dt_bias=torch.zeros(256))
    m1s = torch.randn(1, 256, 16, generator=gen)
    # lightning attention at MiniMax's head width: q, k, v [1, 6, 2, 128], decay [2]
    la = {n: torch.randn(1, 6, 2, 128, generator=gen).to(torch.bfloat16) for n in ("q", "k", "v")}
    lam = torch.exp(-torch.rand(2, generator=gen))
    # the layers' glue at Qwen3.6-27B's widths: hidden 5120, q/k heads of 256, 48 GDN heads of 128 (z and [a | b]
    # read as column slices of wider GEMM outputs)
    h = torch.randn(3, 5120, generator=gen).to(torch.bfloat16)
    wide = torch.randn(3, 48 * 128 + 96, generator=gen).to(torch.bfloat16)
    o = torch.randn(3, 48, 128, generator=gen).to(torch.bfloat16)
    glue = dict(glue="triton")
    # tree attention at Qwen3.6-27B's: 17 nodes, 24 query heads over 4 key-value heads of 256, a prefix of 512 rows,
    # the mask over the tree alone (the eager verify) and over prefix and tree (the graphs' fixed-capacity prefix)
    aq, akv = torch.randn(17, 24, 256, generator=gen).to(torch.bfloat16), torch.randn(17, 4, 256, generator=gen).to(torch.bfloat16)
    apre = torch.randn(512, 4, 256, generator=gen).to(torch.bfloat16)
    anc = torch.ones(17, 17, dtype=torch.bool).tril()
    nt = g["parents"].shape[1]  # the tree tables' nodes (one tree of the GDN example)
    HV, V, K = g["v"].shape[2], g["v"].shape[3], g["q"].shape[3]
    snap = torch.empty(g["parents"].shape[0], nt, HV, V, K)  # SGLang's intermediate buffer [rows, T, HV, V, K]
    return [
        ("tree attention", lambda: gb.tree_attention(aq, akv, akv, prefix_k=apre, prefix_v=apre, ancestor_mask=anc,
                                                     **glue)),
        ("tree attention, prefix masked", lambda: gb.tree_attention(
            aq, akv, akv, prefix_k=apre, prefix_v=apre, ancestor_mask=torch.ones(17, 529, dtype=torch.bool), **glue)),
        ("tree attention, the committed prefix rows", lambda: gb.tree_attention(
            aq, akv, akv, prefix_k=apre, prefix_v=apre, ancestor_mask=torch.ones(17, 529, dtype=torch.bool),
            prefix_rows=torch.tensor(31), **glue)),
        ("tree tables on the device", lambda: triton_tables.tree_tables(
            g["parents"][0], width=nt, src=torch.empty(nt, dtype=torch.int64), anc=torch.empty(nt, nt, dtype=torch.int8),
            mask=torch.empty(nt, nt, dtype=torch.bool), paths=torch.empty(nt, nt, dtype=torch.int32),
            conv=torch.empty(nt, 4, dtype=torch.int32))),
        # the drop-in's device checks (gpu_backend/device_checks.py) at 8 x 65, Qwen3.6-27B's 48 value heads
        ("trees' tables checked on the device", lambda: triton_tables.checked_tables(
            torch.zeros(8, 65, dtype=torch.int32), src=torch.empty(8, 65, dtype=torch.int64),
            anc=torch.empty(8, 65, 65, dtype=torch.int8), paths=torch.empty(8, 65, 65, dtype=torch.int32),
            bad=torch.empty(8, triton_tables.blocks(65), dtype=torch.int32),
            depths=torch.empty(8, triton_tables.blocks(65), dtype=torch.int32))),
        ("a step's checks and its tree's tables on the device", lambda: triton_checks.step_checks(
            slots=torch.zeros(8, dtype=torch.int32), N=16, a=torch.zeros(8, 65, 48, dtype=torch.bfloat16),
            b=torch.zeros(8, 65, 48, dtype=torch.bfloat16), tree=torch.zeros(8, 65, dtype=torch.int32),
            rows=torch.zeros(8, dtype=torch.int32), N_buf=8, accepted=torch.zeros(8, dtype=torch.int64),
            cu_seqlens=torch.zeros(9, dtype=torch.int32))),
        ("a step's checks and its chains' tables (the flattened recurrence)", lambda: triton_checks.step_checks(
            slots=torch.zeros(8, dtype=torch.int32), N=16, a=torch.zeros(8, 65, 48, dtype=torch.bfloat16),
            b=torch.zeros(8, 65, 48, dtype=torch.bfloat16), chain=True, rows=torch.zeros(8, dtype=torch.int32), N_buf=8)),
        ("a step's checks, its trees' flags read", lambda: triton_checks.step_checks(
            slots=torch.zeros(8, dtype=torch.int32), N=16, a=torch.zeros(8, 65, 48, dtype=torch.bfloat16),
            b=torch.zeros(8, 65, 48, dtype=torch.bfloat16), tree_bad=torch.zeros(8, 3, dtype=torch.int32))),
        ("rms norm after the residual add", lambda: gb.rms_norm(h, h[0], eps=1e-6, residual=h, **glue)),
        ("rms norm per head", lambda: gb.rms_norm(h.view(3, 20, 256), h[0, :256], eps=1e-6, **glue)),
        ("gated rms norm", lambda: gb.gated_rms_norm(o, o[0, 0], wide[:, :6144], eps=1e-6, **glue)),
        ("rms norm and rope per head", lambda: gb.rms_norm_rope(h.view(3, 20, 256), h[0, :256], h[:, :64], h[:, 64:128],
                                                                 eps=1e-6, **glue)),
        ("gated act", lambda: gb.gated_act(h, h, act="silu", **glue)),
        ("sigmoid-gated output", lambda: gb.gated_act(h, h, act="sigmoid", **glue)),
        ("gdn gates", lambda: gb.gdn_gates(wide[:, 6144:6192], wide[:, 6192:], A=-torch.rand(48), dt_bias=torch.zeros(48),
                                           **glue)),
        ("gdn recurrent, exact", lambda: gb.gdn_tree_verify(**qkv, parents=g["parents"], initial_state=g["initial_state"],
                                                            backend="triton-recurrent")),
        ("gdn recurrent, leaky with states", lambda: gb.gdn_tree_verify(
            **qkv, parents=g["parents"], initial_state=g["initial_state"], mode="leaky", output_states=True,
            backend="triton-recurrent")),
        ("gdn recurrent, exact, serial", lambda: triton_gdn.plan_recurrent(
            **qkv, parents=g["parents"], initial_state=g["initial_state"], design="serial")[0]()),
        ("gdn drop-in, node states into SGLang's buffer", lambda: gb.gdn_tree_verify(
            **qkv, parents=g["parents"], initial_state=g["initial_state"], states_out=snap.transpose(-1, -2),
            backend="triton")),
        ("gdn commit", lambda: gb.gdn_tree_commit(g["k"], g["v"], g["g"], g["beta"], parents=g["parents"], accepted=acc,
                                                  initial_state=g["initial_state"], backend="triton")),
        ("tree conv", lambda: gb.tree_causal_conv1d(c["x"], weight=c["weight"], parents=c["parents"],
                                                    initial_window=c["initial_window"], backend="triton")),
        ("tree conv, split as GDN's q, k, v", lambda: gb.tree_causal_conv1d(
            c["x"], weight=c["weight"], parents=c["parents"], initial_window=c["initial_window"], split=(1, 1, 1),
            backend="triton")),
        ("conv commit", lambda: gb.conv_tree_commit(c["x"], parents=c["parents"], accepted=acc,
                                                    initial_window=c["initial_window"], backend="triton")),
        ("mamba2 recurrent", lambda: gb.mamba2_tree_verify(**mk, parents=m["parents"], initial_state=m["initial_state"],
                                                           backend="triton-recurrent")),
        ("mamba2 ssd", lambda: gb.mamba2_tree_verify(**mk, parents=m["parents"], initial_state=m["initial_state"],
                                                     backend="triton-ssd")),
        ("mamba2 commit", lambda: gb.mamba2_tree_commit(**mc, parents=m["parents"], accepted=acc,
                                                        initial_state=m["initial_state"], backend="triton")),
        ("kda recurrent, exact", lambda: gb.kda_tree_verify(**kd, parents=g["parents"][:1], initial_state=ks,
                                                            backend="triton-recurrent")),
        ("kda wy, exact", lambda: gb.kda_tree_verify(**kd, parents=g["parents"][:1], initial_state=ks,
                                                     backend="triton-wy")),
        ("kda recurrent, leaky with states", lambda: gb.kda_tree_verify(
            **kd, parents=g["parents"][:1], initial_state=ks, mode="leaky", output_states=True, backend="triton")),
        ("mamba1 recurrent, exact", lambda: gb.mamba1_tree_verify(**m1, parents=g["parents"][:1], initial_state=m1s,
                                                                  backend="triton")),
        ("mamba1 recurrent, leaky with states", lambda: gb.mamba1_tree_verify(
            **m1, parents=g["parents"][:1], initial_state=m1s, mode="leaky", output_states=True, backend="triton")),
        ("kda commit", lambda: gb.kda_tree_commit(kd["k"], kd["v"], kd["g"], kd["beta"], parents=g["parents"][:1],
                                                  accepted=acc[:1], initial_state=ks, backend="triton")),
        ("mamba1 commit", lambda: gb.mamba1_tree_commit(m1["x"], m1["dt"], m1["A"], m1["B"], dt_bias=m1["dt_bias"],
                                                        parents=g["parents"][:1], accepted=acc[:1], initial_state=m1s,
                                                        backend="triton")),
        ("lightning recurrent, exact", lambda: gb.lightning_tree_verify(**la, decay=lam, parents=g["parents"][:1],
                                                                        initial_state=ks, backend="triton-recurrent")),
        ("lightning masked, exact", lambda: gb.lightning_tree_verify(**la, decay=lam, parents=g["parents"][:1],
                                                                     initial_state=ks, backend="triton")),
        ("lightning recurrent, leaky with states", lambda: gb.lightning_tree_verify(
            **la, decay=lam, parents=g["parents"][:1], initial_state=ks, mode="leaky", output_states=True,
            backend="triton")),
        ("lightning commit", lambda: gb.lightning_tree_commit(la["k"], la["v"], decay=lam, parents=g["parents"][:1],
                                                              accepted=acc[:1], initial_state=ks, backend="triton")),
    ]


def compile_for(kernel, kw):
    """kernel compiled for --arch with a launch's keyword arguments kw (bench.compile_kernel)."""
    return compile_kernel(kernel, kw, GPUTarget("cuda", ARCH, 32))


def read_rounds(ck) -> int:
    """Runs of global loads (LDG) in the compiled kernel's machine code that a barrier (BAR.SYNC) separates, in
    code order (a loop's body counted once): the memory round trips a program waits at the least."""
    rounds, barrier = 0, True
    for text in sass_instructions(ck):
        if "BAR.SYNC" in text:
            barrier = True
        elif opcode(text).startswith("LDG") and barrier:
            rounds, barrier = rounds + 1, False
    return rounds


def cuobjdump(ck, flag: str) -> str:
    """What Triton's bundled cuobjdump prints with ``flag`` (-sass, -res-usage) for the compiled kernel's cubin."""
    return on_cubin(ck, [triton_tool("cuobjdump"), flag])[0]


def sass_instructions(ck) -> list[str]:
    """The compiled kernel's machine instructions in code order (cuobjdump -sass, each without its encoding)."""
    import re
    return [m.group(1) for line in cuobjdump(ck, "-sass").splitlines()
            if (m := re.match(r"^\s+/\*[0-9a-f]+\*/\s+(.*?);", line))]


def opcode(instruction: str) -> str:
    """The instruction without its predicate (@P0, @!PT, @UP1 ...)."""
    import re
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", instruction)


def read_places(ops: list[str]) -> str:
    """Where each global read into registers (LDG; cp.async's LDGSTS, which writes shared memory, and its LDGDEPBAR
    aside) of compiled machine code ``ops`` (its instructions without their predicates, opcode's) lies and where the
    first instruction that waits for a read lies: 'LDG@i' and 'use@j <- i' in code order, up to the last read."""
    import re
    ops = [op for op in ops if not op.startswith(("LDGSTS", "LDGDEPBAR"))]
    loaded, out = {}, []
    last = max((i for i, op in enumerate(ops) if op.startswith("LDG")), default=-1)
    for i, op in enumerate(ops[:last + 1]):
        name = op.split()[0] if op.split() else ""
        regs = [int(r) for r in re.findall(r"(?<![A-Z])R(\d+)\b", op)]
        if name.startswith("LDG"):
            for j in range(4 if ".128" in name else 2 if ".64" in name else 1):
                loaded[regs[0] + j] = i
            out.append(f"LDG@{i}")
            continue
        srcs, dst = (regs, None) if name.startswith(("ST", "RED", "ATOM")) else (regs[1:], regs[0] if regs else None)
        hit = sorted({loaded[r] for r in srcs if r in loaded})
        if hit:
            out.append(f"use@{i} <- {','.join(map(str, hit))}")
            for r in srcs:
                loaded.pop(r, None)
        if dst is not None:
            loaded.pop(dst, None)
    return " ".join(out)


def late_reads(ck) -> int:
    """The global reads into registers the compiled kernel issues after its first instruction that waits for one
    (read_places): each goes out a memory round trip late at the least."""
    places = read_places([opcode(x) for x in sass_instructions(ck)]).split()
    first = next((i for i, p in enumerate(places) if p.startswith("use@")), len(places))
    return sum(p.startswith("LDG@") for p in places[first:])


def is_mma(instruction: str) -> bool:
    return opcode(instruction).startswith(("HMMA", "HGMMA"))


def first_uses(ins: list[str]) -> dict:
    """{(barriers, MMAs before it): how many 128-bit global reads (LDG.E.128) are first used there}, "never" where
    none is: a read first used before any barrier holds up what follows until it arrives."""
    import collections
    import re
    got = collections.Counter()
    for i, text in enumerate(ins):
        m = re.search(r"LDG\.E\.128 R(\d+),", text)
        if not m:
            continue
        regs = {f"R{int(m.group(1)) + j}" for j in range(4)}
        where = "never"
        for j in range(i + 1, len(ins)):
            if "LDG" not in ins[j] and regs & set(re.findall(r"\bR\d+\b", ins[j])):
                where = (sum("BAR.SYNC" in x for x in ins[:j]), sum(map(is_mma, ins[:j])))
                break
        got[where] += 1
    return dict(got)


def contractible(ck) -> int:
    """fp32 multiplies, adds and subtracts in the compiled kernel's PTX without a rounding mode (mul.f32, not
    mul.rn.f32): ptxas may contract each into an FMA, as it sees fit in each compilation; none where the kernel was
    compiled with enable_fp_fusion=False."""
    import re
    return len(re.findall(r"^\s*(?:@%p\d+\s+)?(?:mul|add|sub)\.f32\b", ck.asm["ptx"], re.M))


def reductions(ck) -> str:
    """A fingerprint (8 hex digits) of the layouts the compiled kernel's reductions take their operands in, in code
    order (Triton's TTGIR): a reduction's order of adds follows its operand's layout, so two compilations of one
    kernel with the same fingerprint (and nothing contractible) sum alike."""
    import hashlib
    import re
    ttgir = ck.asm["ttgir"]
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*)$", ttgir, re.M))
    ops = re.findall(r'"tt\.reduce"\(%[\w]+\) <\{axis = (\d+) : i32\}>.*?\}\) : \(tensor<([^,>]*), (#\w+)>', ttgir, re.S)
    text = ";".join(f"{axis}:{shape}:{defs.get(layout, layout)}" for axis, shape, layout in ops)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def check(what, kernel, kw) -> bool:
    """Compile; print one line (its dot precision where the launcher chose one, its shared memory, its reductions'
    layouts, its contractible operations); False on failure (every kernel is tried)."""
    what = f"{what}: {kernel.__name__}"
    try:
        ck = compile_for(kernel, kw)
        shared = ck.metadata.shared
        if shared > SHARED_PER_BLOCK:
            raise RuntimeError(f"{shared} B of shared memory, more than sm_{ARCH}'s {SHARED_PER_BLOCK}")
        prec = f"{kw['PRECISION']}, " if "PRECISION" in kw else ""  # the dot precision the launcher chose
        print(f"ok   {what} ({prec}{shared} B shared, reductions {reductions(ck)}, {contractible(ck)} contractible)",
              flush=True)
        return True
    except Exception as e:
        print(f"FAIL {what}: {type(e).__name__}: {(str(e).splitlines() or [''])[-1][:300]}", flush=True)
        return False


if __name__ == "__main__":
    if ARCH not in (90, 100, 120) or SET not in ("all", "serving", "reads"):
        sys.exit("usage: gpu_compile.py [--arch 90|100|120] [--set all|serving|reads]")
    failed = 0
    if SET == "reads":
        # the defaults, then the one-kernel form with q, k l2-normed in fp32 (FUSED_RAW16 off) and the head kernel
        # with a program per head for every head (HEAD_MIXED off)
        for B, T, design, option in ((1, 16, "auto", None), (1, 16, "auto", (triton_gdn, "FUSED_GLUON", False)),
                                     (1, 17, "auto", None), (1, 65, "auto", None),
                                     (8, 65, "auto", None), (8, 65, "fold", None),
                                     (1, 16, "auto", (triton_gdn, "FUSED_RAW16", False)),
                                     (8, 65, "auto", (triton_wy_split, "HEAD_MIXED", False))):
            old = option and getattr(*option[:2])
            if option:
                setattr(*option)
            on = f", {option[1]}={option[2]}" if option else ""
            for kernel, kw in launches(B, T, torch.bfloat16, design):
                ck = compile_for(kernel, kw)
                print(f"reads {B} x {T}, design {design}{on}: {kernel.__name__} {read_rounds(ck)}", flush=True)
                if kernel is gluon_gdn._gdn_fold_kernel:  # its barriers part its reads on purpose, no use between them
                    print(f"late {B} x {T}, design {design}{on}: {kernel.__name__} {late_reads(ck)}", flush=True)
            if option:
                setattr(*option[:2], old)
        sys.exit(0)
    if SET == "all":
        for T, designs in ((65, ("fused", "split", "fold", "head")), (131, ("fused", "split", "fold"))):
            for dtype in (torch.bfloat16, torch.float32):
                for design in designs:
                    for kernel, kw in launches(2, T, dtype, design):
                        failed += not check(f"{T} nodes, {str(dtype)[6:]}, design {design}", kernel, kw)
        for kernel, kw in launches(8, 65, torch.bfloat16, "head"):  # whole heads, the last wave split (HEAD_MIXED)
            failed += not check("8 x 65 nodes, bfloat16, design head", kernel, kw)
        for B, T in ((1, 16), (2, 9)):  # the Gluon fold (gluon_gdn): every node a row, and rows past the tree masked
            for kernel, kw in launches(B, T, torch.bfloat16, "fused"):
                failed += not check(f"{B} x {T} nodes, bfloat16, design fused", kernel, kw)
    else:
        # design auto, and the two-kernel forms it takes when given their own options (pdl, block_v, ...)
        for B, T, design in ((1, 16, "auto"), (1, 17, "auto"), (1, 65, "auto"), (8, 65, "auto"), (1, 131, "auto"),
                             (8, 131, "auto"), (8, 65, "fold"), (1, 65, "split")):
            for kernel, kw in launches(B, T, torch.bfloat16, design):
                failed += not check(f"{B} x {T} nodes, bfloat16, design {design}", kernel, kw)
        # the same forms on a plan built on the device (a captured call's): each sequence's rounds from its depths
        for B, T, design in ((1, 16, "auto"), (1, 17, "auto"), (8, 65, "auto"), (8, 131, "auto"), (8, 65, "fold"),
                             (1, 65, "split")):
            for kernel, kw in launches(B, T, torch.bfloat16, design, device_plan=True):
                assert kw.get("DEPTHS", True), kernel.__name__  # (the tables' launch has no DEPTHS)
                failed += not check(f"{B} x {T} nodes, bfloat16, design {design}, a device plan", kernel, kw)
    for name, call in other_calls():
        GOT.clear()
        try:
            call()
        except Exception as e:  # a launcher that fails before launching counts as a failure too
            failed += 1
            print(f"FAIL {name}: the launcher raised {type(e).__name__}: {e}", flush=True)
        if not GOT:
            failed += 1
            print(f"FAIL {name}: nothing launched", flush=True)
        for kernel, kw in list(GOT):
            failed += not check(name, kernel, kw)
    sys.exit(1 if failed else 0)
