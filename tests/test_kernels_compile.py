"""Every Triton kernel the public functions and the WY launchers would launch compiles for an sm_90a GPU, and
what a server launches compiles for both Blackwell targets, sm_100a (B200) and sm_120a (RTX 50, RTX PRO 6000),
within each one's shared memory per block, on a CPU (tests/gpu_compile.py, in a subprocess without
TRITON_INTERPRET, with Triton's bundled ptxas): the interpreter, which runs the other kernel tests here, never
compiles, so a kernel can pass them all and still fail on the device (d8862be did: a loop variable that
changed type)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # `make test-slow` (three minutes of one core on a cold Triton cache)
SCRIPT = Path(__file__).with_name("gpu_compile.py")
OTHERS = ("_gdn_recurrent_kernel", "_gdn_paths_kernel", "_gdn_commit_kernel", "_tree_conv_kernel", "_conv_commit_kernel",
          "_mamba2_recurrent_kernel", "_mamba2_ssd_kernel", "_mamba2_commit_kernel", "_kda_recurrent_kernel",
          "_kda_wy_kernel", "_kda_commit_kernel", "_mamba1_recurrent_kernel", "_mamba1_commit_kernel", "_lightning_recurrent_kernel",
          "_lightning_masked_kernel", "_lightning_commit_kernel", "_rms_norm_kernel", "_gated_rms_norm_kernel",
          "_gated_act_kernel", "_gdn_gates_kernel", "_rms_norm_rope_kernel", "_tree_attention_kernel",
          "_tree_tables_kernel", "_step_checks_kernel")


def _compile(*args, prefix: str = "ok ") -> list[str]:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                       cwd=SCRIPT.parent.parent, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return [line for line in r.stdout.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("arch", [100, 120])
def test_what_a_server_launches_compiles_for_blackwell(arch):
    """The WY launchers' default design at one sequence of 16 nodes (the root in the block: the Gluon fold, gluon_gdn)
    and one and eight of 17, 65 and 131 nodes (bf16), the two-kernel forms auto takes when given their options (fold
    at 8 x 65, split at 1 x 65), six of these on a plan built on the device (a captured call's: its tables' kernel, then the WY kernels
    taking each sequence's rounds from its depths) and every other kernel: 68 launches, each within the
    architecture's shared memory per block (sm_120a: 99 KiB)."""
    ok = _compile("--arch", str(arch), "--set", "serving")
    assert len(ok) == 68, ok
    assert sum("a device plan" in line for line in ok) == 16, ok
    for name in ("_gdn_fold_kernel", "_gdn_wy_kernel", "_gdn_wy_fold_head_kernel", "_gdn_wy_solve_kernel",
                 "_gdn_wy_apply_kernel",
                 "_gdn_wy_fold_kernel", "_gdn_wy_fold_root_apply_kernel", "_gdn_wy_blocked_diag_kernel",
                 "_gdn_wy_blocked_solve_kernel", "_gdn_wy_blocked_apply_kernel", *OTHERS):
        assert any(name in line for line in ok), name


def test_every_triton_kernel_compiles_for_sm90():
    ok = _compile("--arch", "90")
    # WY: 6 + 6 one-block launches, 7 + 7 past one block (bf16, fp32), head for eight sequences, the Gluon fold at
    # 1 x 16 and 2 x 9 (design fused, bf16); the others: 38
    assert len(ok) == 67, ok
    assert sum("_gdn_fold_kernel" in line for line in ok) == 2, ok
    for name in ("_gdn_wy_blocked_solve_kernel", "_gdn_wy_fold_kernel", "_gdn_wy_fold_apply_kernel",
                 "_gdn_wy_fold_root_apply_kernel", "_gdn_wy_fold_head_kernel", "_gdn_recurrent_kernel",
                 "_gdn_paths_kernel",
                 "_gdn_commit_kernel", "_tree_conv_kernel", "_conv_commit_kernel", "_mamba2_ssd_kernel", "_mamba2_commit_kernel",
                 "_kda_recurrent_kernel", "_kda_wy_kernel", "_kda_commit_kernel", "_mamba1_recurrent_kernel",
                 "_mamba1_commit_kernel", "_lightning_recurrent_kernel", "_lightning_masked_kernel",
                 "_lightning_commit_kernel", "_rms_norm_kernel", "_gated_rms_norm_kernel", "_gated_act_kernel",
                 "_gdn_gates_kernel", "_rms_norm_rope_kernel", "_tree_attention_kernel", "_tree_tables_kernel",
                 "_step_checks_kernel"):
        assert any(name in line for line in ok), name
    # the WY launchers' default dot precision: bf16x3 for bf16 inputs, tf32x3 for fp32 ones (issue #13's
    # bar), except the chunked form past one block (131 nodes, design fused), which stays at tf32x3
    for dtype, prec in (("bfloat16", "bf16x3"), ("float32", "tf32x3")):
        wy = [line for line in ok if f", {dtype}, design" in line and "_gdn_fold_kernel" not in line]
        chunked = [line for line in wy if line.startswith(f"ok   131 nodes, {dtype}, design fused")]
        assert len(wy) == (14 if dtype == "bfloat16" else 13) and len(chunked) == 1, wy  # (bf16: head at 8 x 65)
        assert all(f"({prec if line not in chunked else 'tf32x3'}, " in line for line in wy), wy
    # the recurrent kernels whose two modes are one kernel compiled twice: nothing ptxas could contract in one
    # compilation and not the other (gpu_backend._common.ONE_ARITHMETIC); the other kernels keep their contractions
    one = [line for line in ok if any(n in line for n in ("_kda_recurrent_kernel", "_mamba1_recurrent_kernel",
                                                           "_lightning_recurrent_kernel"))]
    assert len(one) == 6 and all(line.endswith(" 0 contractible)") for line in one), one
    # (a count that could not be 0 for all: the GDN recurrent kernel, compiled with contraction, has some)
    assert not any(line.endswith(" 0 contractible)") for line in ok if "_gdn_recurrent_kernel" in line), ok
    # and at their serving widths (the fixed examples: KDA's and lightning's heads of 128, Jamba's 16-wide state) the
    # two compilations sum in the same layouts, so the modes agree bit for bit on order-exact nodes (at KDA's K = 3
    # they do not: benchmarks/RESULTS.md); the fingerprint tells layouts apart (GDN's paths and serial kernels)
    for kernel in ("_kda_recurrent_kernel", "_mamba1_recurrent_kernel", "_lightning_recurrent_kernel"):
        prints = {re.search(r"reductions (\w+),", line).group(1) for line in one if kernel in line}
        assert len(prints) == 1, (kernel, one)
    gdn = {re.search(r"reductions (\w+),", line).group(1) for line in ok if "gdn recurrent, exact:" in line
           or "gdn recurrent, leaky" in line}
    assert len(gdn) == 2, ok


def test_the_wy_kernels_issue_their_reads_together():
    """The WY kernels a server launches up to one block issue their global reads before their first barrier, so a
    program waits one memory round trip for its inputs, not one per reduction between reads (the one-kernel form
    at 1 x 17 took five, the head kernel eight, the fold kernel five, compiled for sm_90, before a read-first
    order). The head kernel's V tile (its v, then its state) adds two: three in all, in its mixed grid (HEAD_MIXED,
    the default) and with a program per head. The one-kernel form takes one with q and k as read (FUSED_RAW16: three
    at 1 x 16 and 1 x 17 without the select that places them after its last read) and with them l2-normed."""
    got = {}
    for line in _compile("--set", "reads", prefix=""):
        if line.startswith(("reads ", "late ")):
            what, n = line.rsplit(" ", 1)
            got[what] = int(n)
    # the Gluon fold (gluon_gdn) at 1 x 16: four runs of reads, parted by the three barriers that keep ptxas from
    # putting a use among them, and no read after the first use (a barrier waits for no read: one round trip)
    assert got.pop("reads 1 x 16, design auto: _gdn_fold_kernel") == 4, got
    assert got.pop("late 1 x 16, design auto: _gdn_fold_kernel") == 0, got
    got = {what.removeprefix("reads "): n for what, n in got.items()}
    assert got == {"1 x 16, design auto, FUSED_GLUON=False: _gdn_wy_kernel": 1,  # the root in the block: state last
                   "1 x 16, design auto, FUSED_RAW16=False: _gdn_wy_kernel": 1,  # q, k l2-normed in fp32
                   "1 x 17, design auto: _gdn_wy_kernel": 1,
                   "1 x 65, design auto: _gdn_wy_fold_head_kernel": 3,
                   "8 x 65, design auto: _gdn_wy_fold_head_kernel": 3,
                   "8 x 65, design auto, HEAD_MIXED=False: _gdn_wy_fold_head_kernel": 3,
                   "8 x 65, design fold: _gdn_wy_fold_kernel": 1,
                   "8 x 65, design fold: _gdn_wy_fold_root_apply_kernel": 3}, got
