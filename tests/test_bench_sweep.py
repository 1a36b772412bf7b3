"""The kernel benchmarks' shared configuration sweep (ddsim.bench.bench.sweep, table_lines), on the CPU with
a stand-in timer: the best configuration per case, a configuration that fails skipped and said so, a
case with none left dropped, floors and bandwidths from the byte counts; and one real Mamba2 plan
launched through it in Triton's interpreter (the wiring the CUDA tables use)."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ddsim.bench.bench import sweep, table_lines
from ddsim.bench.bench_mamba2 import mamba2_bytes, mamba2_inputs

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmark(name: str):
    """benchmarks/<name>.py imported as a module (nothing of it run but its definitions)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compiled_on_the_cpu(code: str) -> str:
    """The stdout of ``code`` run in benchmarks/ in a fresh interpreter without TRITON_INTERPRET (so Triton compiles
    for the GPU there, on the CPU, with its bundled ptxas); skipped where Triton has no NVIDIA backend, failed where
    the code exits non-zero."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=BENCHMARKS,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def _refused_before_any_work(script: str, args: list, want: str):
    """benchmarks/<script> with ``args``: exit 2, its last line of stderr ending with ``want``, said before its CUDA
    check (so here, on a machine without a GPU). Its main() runs in this process, as `python benchmarks/<script>` would
    run it (its argv, its stderr, its exit status), without a fresh interpreter's second of imports per call."""
    import contextlib
    import io
    err, argv, path = io.StringIO(), sys.argv, list(sys.path)
    sys.argv = [str(BENCHMARKS / script), *args]
    sys.path.insert(0, str(BENCHMARKS))  # a script imports its siblings, as from its own folder
    code = 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _benchmark(script.removesuffix(".py")).main()
    except SystemExit as e:  # as the interpreter exits: None 0, a number itself, anything else printed and 1
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            err.write(f"{e.code}\n")
    finally:
        sys.argv, sys.path[:] = argv, path
    stderr = err.getvalue()
    assert code == 2, (args, stderr)
    assert stderr.strip().splitlines()[-1].endswith(want), stderr
    assert "needs a CUDA device" not in stderr


def test_sweep_picks_the_best_configuration_and_skips_failures(capsys):
    times = {1: 0.5, 2: 0.2, 3: 0.9}

    def plan(c):
        if c["n"] == 3:
            raise RuntimeError("out of resource: shared memory")
        return (lambda: c["n"]), None

    nbytes = {"leaky": 2e6, "leaky+states": 6e6, "parent-indexed": 10e6, "copy": 1e6}
    cases = {"exact parent-indexed": ("parent-indexed", [{"n": 1}, {"n": 2}, {"n": 3}], plan),
             "never compiles": ("copy", [{"n": 3}], plan),
             "leaky": ("leaky", [{"n": 1}], plan)}
    seen = []
    rows = sweep(4, 65, cases, nbytes, bw=1e12, only=["exact", "never"], progress=seen.append,
                 timer=lambda launch: times[launch()], flops={"parent-indexed": 3e9}, flop_rate=1e14)
    assert [r["kernel"] for r in rows] == ["exact parent-indexed"] and seen == rows  # "leaky" not asked for
    r = rows[0]
    assert r["config"] == {"n": 2} and r["us"] == pytest.approx(200.0) and r["floor_us"] == pytest.approx(10.0)
    assert r["GBps"] == pytest.approx(50.0) and r["snapshot_MiB"] == pytest.approx(4e6 / 2**20)
    assert r["flop_floor_us"] == pytest.approx(30.0)
    out = capsys.readouterr().out
    assert "# 4x65 exact parent-indexed {'n': 3}: skipped (RuntimeError: out of resource" in out
    assert "never compiles" in out
    lines = table_lines(rows)
    assert lines[2] == "| 4x65 | exact parent-indexed | 200.0 | 10.0 | 30.0 | 50 | 4 | n=2 |"


def test_flop_floors_count_the_designs_arithmetic():
    from ddsim.bench.bench import kernel_flops
    f = kernel_flops(2, 5, H=1, HV=3, K=4, V=8)
    assert f["leaky"] == f["parent-indexed"] == 2 * 3 * 5 * 7 * 4 * 8
    n = 4  # draft nodes under the root
    assert f["wy"] == 2 * 3 * (7 * 4 * 8 + 4 * n * 4 * 8 + 2 * n * n * 4 + 2 * n * n * 8)
    assert "commit" not in f and "copy" not in f


@pytest.mark.interpreter
def test_a_real_mamba2_plan_runs_through_the_sweep():
    from ddsim.bench.bench import ddtree_batch
    from ddsim.gpu_backend.triton_mamba2 import plan_ssd
    shp = dict(H=2, P=4, N=8, G=1)
    _, parents = ddtree_batch(1, 9, vocab=20, depth=4, topk=3)
    inp = mamba2_inputs(1, 9, **shp, dtype=torch.float32, device="cpu")
    lay = {k: inp[k] for k in ("x", "dt", "A", "B", "C", "D", "dt_bias")}
    outs = []

    def plan(c):
        launch, y = plan_ssd(**lay, parents=parents, initial_state=inp["initial_state"], poison=False, **c)
        outs.append(y)
        return launch, y

    def timer(launch):
        launch()
        return 1.0

    rows = sweep(1, 9, {"exact ssd": ("ssd", [dict(block_i=16, block_p=16)], plan)}, mamba2_bytes(1, 9, **shp),
                 bw=1e12, timer=timer)
    assert len(rows) == 1 and torch.isfinite(outs[0]).all()


def test_bench_shapes_parse_or_are_refused_with_one_line_and_exit_2(capsys):
    import argparse

    from ddsim.bench.bench import parse_shapes
    ap = argparse.ArgumentParser(prog="bench")
    assert parse_shapes(ap, "1x16,8x65") == [(1, 16), (8, 65)]
    for bad in ("8x", "8x65,x", "8", "0x65", "8x1", "1x2x3"):
        with pytest.raises(SystemExit) as e:
            parse_shapes(ap, bad)
        assert e.value.code == 2
        assert f"--shapes {bad!r}" in capsys.readouterr().err
    # one shape (--shape): parse_shapes' refusals, and several shapes
    from ddsim.bench.bench import parse_shape
    assert parse_shape(ap, "1x16") == (1, 16)
    for bad, said in (("1x16,1x9", "--shape '1x16,1x9': expected one shape"), ("8x1", "--shapes '8x1'")):
        with pytest.raises(SystemExit) as e:
            parse_shape(ap, bad)
        assert e.value.code == 2
        assert said in capsys.readouterr().err


def test_bench_counts_below_one_are_refused_with_one_line_and_exit_2(capsys):
    import argparse

    from ddsim.bench.bench import at_least_one
    ap = argparse.ArgumentParser(prog="bench")
    at_least_one(ap, argparse.Namespace(calls=1, rounds=7), "calls", "rounds")  # nothing said
    assert capsys.readouterr().err == ""
    for ns, said in ((argparse.Namespace(calls=0, rounds=1), "--calls: expected 1 or more, got 0"),
                     (argparse.Namespace(calls=3, rounds=-2), "--rounds: expected 1 or more, got -2"),
                     (argparse.Namespace(calls=3, rounds=1, fused_warps=0), "--fused-warps: expected 1 or more, got 0")):
        with pytest.raises(SystemExit) as e:
            at_least_one(ap, ns, *vars(ns))
        assert e.value.code == 2
        assert said in capsys.readouterr().err


def test_bench_integer_lists_parse_or_are_refused_with_one_line_and_exit_2(capsys):
    import argparse

    from ddsim.bench.bench import int_list
    ap = argparse.ArgumentParser(prog="bench")
    assert int_list(ap, "--warps", "4,8", (1, 2, 4, 8)) == [4, 8]
    for bad in ("", "4,", "x", "3", "4,16"):
        with pytest.raises(SystemExit) as e:
            int_list(ap, "--warps", bad, (1, 2, 4, 8))
        assert e.value.code == 2
        assert f"--warps {bad!r}: expected a comma-separated list from [1, 2, 4, 8]" in capsys.readouterr().err


def test_the_fused_sweep_options_parse_in_the_sweeps_order_or_are_refused_with_one_line_and_exit_2(capsys):
    import argparse

    from ddsim.bench.bench import add_fused_sweep_options, fused_sweep_options
    ap = argparse.ArgumentParser(prog="bench")
    add_fused_sweep_options(ap, roots="0,2", raw16="1,0", warps="4", block_v="64")
    assert fused_sweep_options(ap, ap.parse_args([])) == dict(roots=[0, 2], warps=[4], block_vs=[64],
                                                              raw16s=[True, False], holds=[True], rownorms=[True],
                                                              chains=[False])
    assert fused_sweep_options(ap, ap.parse_args(["--roots", "1", "--raw16", "0", "--warps", "8,16", "--block-v", "32",
                                                  "--hold", "1,0", "--rownorm", "1,0", "--chains", "1"])) == dict(
        roots=[1], warps=[8, 16], block_vs=[32], raw16s=[False], holds=[True, False], rownorms=[True, False],
        chains=[True])
    for option, bad, allowed in (("--roots", "3", "[0, 1, 2]"), ("--raw16", "2", "[0, 1]"),
                                 ("--warps", "32", "[1, 2, 4, 8, 16]"), ("--block-v", "", "[16, 32, 64, 128]"),
                                 ("--hold", "2", "[0, 1]"), ("--rownorm", "x", "[0, 1]"),
                                 ("--chains", "3", "[0, 1]")):
        with pytest.raises(SystemExit) as e:
            fused_sweep_options(ap, ap.parse_args([option, bad]))
        assert e.value.code == 2
        assert f"{option} {bad!r}: expected a comma-separated list from {allowed}" in capsys.readouterr().err


def test_the_fused_root_sweep_sets_each_root_raw16_hold_and_rownorm_while_it_runs_and_restores_the_defaults():
    from ddsim.bench.bench import fused_root_sweep
    from ddsim.gpu_backend import triton_gdn
    flags = ("FUSED_ROOT", "FUSED_RAW16", "FUSED_HOLD", "FUSED_ROWNORM", "FUSED_CHAINS")
    default = tuple(getattr(triton_gdn, f) for f in flags)
    seen = [(root, raw, w, bv, triton_gdn.FUSED_ROOT, triton_gdn.FUSED_RAW16)
            for root, raw, *_, w, bv in fused_root_sweep((0, 2), (4,), (32, 64), (True, False))]
    assert seen == [(0, True, 4, 32, 0, True), (0, True, 4, 64, 0, True), (0, False, 4, 32, 0, False),
                    (0, False, 4, 64, 0, False), (2, True, 4, 32, 2, True), (2, True, 4, 64, 2, True),
                    (2, False, 4, 32, 2, False), (2, False, 4, 64, 2, False)]
    assert tuple(getattr(triton_gdn, f) for f in flags) == default
    assert [x[:5] for x in fused_root_sweep((1,), (4,), (64,))] == [(1, True, False, True, False)]  # the defaults
    # the hold is swept for the root's place 2 only (plan_wy holds nothing elsewhere), held unless told
    held = [(f.root, f.hold, triton_gdn.FUSED_HOLD) for f in fused_root_sweep((0, 2), (4,), (64,), holds=(True, False))]
    assert held == [(0, False, False), (2, True, True), (2, False, False)]
    assert [f.hold for f in fused_root_sweep((2,), (4,), (64,))] == [True]
    # the rows' norms are swept with q and k as read and the root in the block only (plan_wy's ROWNORM needs RAW16
    # and takes the norms as read nowhere else), set while each runs
    normed = [(f.root, f.raw16, f.rownorm, triton_gdn.FUSED_ROWNORM)
              for f in fused_root_sweep((0, 2), (4,), (64,), (True, False), rownorms=(False, True))]
    assert normed == [(0, True, False, False), (0, False, False, False), (2, True, False, False), (2, True, True, True),
                      (2, False, False, False)]
    chained = [(f.raw16, f.chains, triton_gdn.FUSED_CHAINS)
               for f in fused_root_sweep((0,), (4,), (64,), (True, False), chains=(True, False))]
    assert chained == [(True, True, True), (True, False, False), (False, False, False)]
    for _ in fused_root_sweep((1,), (4,), (64,), (True,), rownorms=(True,), chains=(True,)):
        break  # left early: restored when the sweep is closed
    assert tuple(getattr(triton_gdn, f) for f in flags) == default


def test_bench_wy_root_refuses_a_hold_it_does_not_know_before_any_work():
    """bench_wy_root.py --hold (FUSED_SWEEP's) takes 0 and 1 (triton_gdn.FUSED_HOLD off / on): anything else is one
    line and exit 2, said before its CUDA check (so here, on a machine without a GPU)."""
    for bad in ("2", "0,x", ""):
        _refused_before_any_work("bench_wy_root.py", ["--hold", bad],
                                 f"--hold {bad!r}: expected a comma-separated list from [0, 1]")


def test_fused_floors_traced_copy_still_finds_each_probes_line_in_the_kernel():
    """benchmarks/fused_floor.py traces a copy of _gdn_wy_kernel made by inserting probes before or after lines of its
    source; an edit of the kernel that moves one of those lines would leave the script refusing to run on the GPU.
    Here (no GPU: the copy is made and imported, not compiled) every probe's line is found once and the copy takes
    the trace pointer."""
    kernel = _benchmark("fused_floor").traced_kernel()
    names = list(getattr(kernel, "arg_names", None) or kernel.fn.arg_names)
    assert names[names.index("o") + 1] == "trace"


def test_bench_wy_root_refuses_bad_slots_and_calls_before_any_work():
    """bench_wy_root.py --slots takes 0 and 1 (the states by sequence / through a slot table) and --calls 1 or more:
    anything else is one line and exit 2, said before its CUDA check."""
    for args, want in ((["--slots", "2"], "--slots '2': expected a comma-separated list from [0, 1]"),
                       (["--calls", "0"], "--calls: expected 1 or more, got 0")):
        _refused_before_any_work("bench_wy_root.py", args, want)


def test_several_do_bench_calls_give_their_median_and_range(monkeypatch):
    """bench.median_us_calls: one median_us per call, sorted; calls_cell prints their median (of an even count, the
    middle two's mean) with the range, or the one figure alone; no calls is refused."""
    from ddsim.bench import bench
    times = iter([9.4, 8.3, 8.9, 9.5, 8.4])
    monkeypatch.setattr(bench, "median_us", lambda launch: next(times))
    got = bench.median_us_calls(lambda: None, 5)
    assert got == [8.3, 8.4, 8.9, 9.4, 9.5]
    assert bench.calls_cell(got) == "8.9 (8.3-9.5)"
    assert bench.calls_cell([8.3, 8.4, 9.4, 9.5]) == "8.9 (8.3-9.5)"
    assert bench.calls_cell([9.04]) == "9.0"
    with pytest.raises(ValueError, match="calls: expected 1 or more"):
        bench.median_us_calls(lambda: None, 0)


def test_the_variant_benchmarks_options_and_their_cuda_check(monkeypatch):
    """bench.timing_options: --commit, --calls 5 and --rounds as given; bench.cuda_run stops naming the script where
    there is no CUDA device (here, on a machine without one)."""
    import argparse

    from ddsim.bench import bench
    ap = argparse.ArgumentParser()
    bench.timing_options(ap, rounds=3)
    a = ap.parse_args([])
    assert (a.commit, a.calls, a.rounds) == ("?", 5, 3)
    assert ap.parse_args(["--calls", "7", "--rounds", "1", "--commit", "abc"]).calls == 7
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="^probe: needs a CUDA device$"):
        bench.cuda_run("probe", "abc")


def test_timing_rounds_interleave_the_forms_round_by_round_with_their_timer_and_device_times(monkeypatch, capsys):
    """bench.timing_rounds, the variant benchmarks' table: every form in each round before the next round, its timer
    cell the median of its calls with their range, three flushed device times and (with warm) one warm."""
    from ddsim.bench import bench
    order = []
    monkeypatch.setattr(bench, "median_us_calls", lambda launch, calls: (order.append((launch(), calls)),
                                                                          [8.1, 8.2, 8.6][:calls])[1])
    dev = iter([5.2, 5.25, 5.3, 4.1, 5.0, 5.05, 5.1, 3.9] * 2)
    monkeypatch.setattr(bench, "kernel_device_us", lambda launch, flush=True: next(dev))
    bench.timing_rounds({"the form": lambda: "a", "a variant": lambda: "b"}, rounds=2, calls=3)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == "| round | form | timer us (median of calls, range) | device us, flushed (three) | device us, warm |"
    assert rows[1:] == ["| 0 | the form | 8.20 (8.10-8.60) | 5.20 5.25 5.30 | 4.10 |",
                        "| 0 | a variant | 8.20 (8.10-8.60) | 5.00 5.05 5.10 | 3.90 |",
                        "| 1 | the form | 8.20 (8.10-8.60) | 5.20 5.25 5.30 | 4.10 |",
                        "| 1 | a variant | 8.20 (8.10-8.60) | 5.00 5.05 5.10 | 3.90 |"]
    assert order == [("a", 3), ("b", 3), ("a", 3), ("b", 3)]
    dev = iter([5.2, 5.25, 5.3])
    bench.timing_rounds({"the form": lambda: "a"}, rounds=1, calls=1, warm=False)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["| round | form | timer us (median of calls, range) | device us, flushed (three) |",
                    "| 0 | the form | 8.10 (8.10-8.10) | 5.20 5.25 5.30 |"]


def test_timer_warmups_watch_reads_where_do_bench_put_its_flush_buffer():
    """benchmarks/timer_warmup.py's watch_flush_buffer wraps the active Triton driver's get_empty_cache_for_benchmark
    (what do_bench calls for its 256 MiB flush buffer) and reads back the address of the last buffer handed out; here
    with a stand-in driver (no GPU)."""
    import triton
    mod = _benchmark("timer_warmup")

    class Driver:
        def __init__(self):
            self.made = []

        def get_empty_cache_for_benchmark(self):
            self.made.append(torch.empty(4 + len(self.made)))
            return self.made[-1]

    config = triton.runtime.driver
    before = config._active
    fake = Driver()
    config.set_active(fake)
    try:
        at = mod.watch_flush_buffer()
        assert at() is None
        first = triton.runtime.driver.active.get_empty_cache_for_benchmark()
        assert at() == first.data_ptr()
        second = triton.runtime.driver.active.get_empty_cache_for_benchmark()
        assert at() == second.data_ptr() and len(fake.made) == 2
    finally:
        config._active = before


def test_a_slotted_pool_holds_each_state_at_its_slot_and_others_between():
    """bench.slotted_pool: B states in a pool of 2 B rows at slots 0, 2, 4 ... (int32, on the states' device), the
    rows between random (not a copy of a state, so that a kernel reading a row it was not given shows it)."""
    from ddsim.bench.bench import slotted_pool
    states = torch.randn(3, 2, 4, 5)
    pool, slots = slotted_pool(states)
    assert pool.shape == (6, 2, 4, 5) and pool.dtype == states.dtype
    assert slots.dtype == torch.int32 and slots.tolist() == [0, 2, 4]
    assert torch.equal(pool[slots.long()], states)
    assert all(not torch.equal(pool[r], states[b]) for r in (1, 3, 5) for b in range(3))


def test_the_kernel_table_and_the_timer_probe_refuse_bad_counts_before_any_work():
    """bench_engine_api.py --calls and timer_warmup.py --placements: a count out of range is one line and exit 2,
    said before the CUDA check."""
    _refused_before_any_work("bench_engine_api.py", ["--calls", "0"], "--calls: expected 1 or more, got 0")
    _refused_before_any_work("timer_warmup.py", ["--placements", "-1"], "--placements: 0 or more")


def test_the_serving_shape_margins_refuse_a_family_they_do_not_know_and_print_a_rows_figures():
    """serving_shape_margins.py: a family outside ddsim.properties.serving_cases is one line and exit 2, said before
    the CUDA check; a row gives an output's error over the rounding's and its share off, a commit's states alone."""
    _refused_before_any_work("serving_shape_margins.py", ["--families", "kda,rwkv7"],
                             "--families: expected some of gdn, gdn-gates, gdn-padded, kda, lightning, mamba1, mamba2, got 'kda,rwkv7'")
    cells = _benchmark("serving_shape_margins")._cells
    assert cells(dict(err_over_cast=1.00012, off=0.0031)) == "1.0001 | 0.31% | "
    assert cells(dict(err_over_cast=1.0, off=0.0, states_over_bound=0.0123)) == "1.0000 | 0.00% | 0.012"
    assert cells(dict(states_over_bound=0.5)) == " |  | 0.500"


def test_the_carveout_probe_refuses_a_carveout_out_of_range_and_a_bad_count_before_any_work():
    """timer_carveout.py: a carveout outside -1..100, a call count below 1 and more than one shape are each one line
    and exit 2, said before the CUDA check."""
    _refused_before_any_work("timer_carveout.py", ["--carveouts=-1,101"], "each -1 (none) or a percent from 0 to 100")
    _refused_before_any_work("timer_carveout.py", ["--calls", "0"], "--calls: expected 1 or more, got 0")
    _refused_before_any_work("timer_carveout.py", ["--shape", "1x16,1x9"], "expected one shape")
    _refused_before_any_work("timer_warmup.py", ["--shape", "1x16,1x9"], "expected one shape")
    _refused_before_any_work("bench_wy_root.py", ["--layers", "0"], "--layers: expected 1 or more, got 0")


def test_fused_variants_refuses_bad_counts_before_any_work():
    """fused_variants.py --calls and --rounds below 1: one line and exit 2, said before the CUDA check."""
    _refused_before_any_work("fused_variants.py", ["--calls", "0"], "--calls: expected 1 or more, got 0")
    _refused_before_any_work("fused_variants.py", ["--rounds", "0"], "--rounds: expected 1 or more, got 0")


@pytest.mark.interpreter
@pytest.mark.slow  # a benchmark's kernel in Triton's interpreter (13 s)
@pytest.mark.parametrize("B, T", [(1, 16), (2, 11)])
def test_the_transposed_form_fused_variants_times_matches_the_oracle(B, T):
    """fused_variants.py's transposed kernel (the one-kernel form on the transposes, its state the products' first
    operand), run by Triton's interpreter with fp32 operands (UP) on the launch plan_wy makes with the root in the
    block: its output within fp32's tolerance of the float64 oracle, so the figures it is timed for are of a kernel
    that computes the verify."""
    from ddsim import oracle
    from ddsim.bench.bench import captured_launch, ddtree_batch, kernel_inputs
    from ddsim.gpu_backend import triton_gdn
    from ddsim.measure.compare import assert_close

    mod = _benchmark("fused_variants")
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, dtype=torch.bfloat16, device="cpu")
    _, grid, kw = captured_launch(lambda: triton_gdn.plan_wy(
        **{n: inp[n] for n in ("q", "k", "v", "g", "beta")}, parents=parents, initial_state=inp["initial_state"],
        design="fused", poison=False))
    assert kw["ROOT"] == 2
    kk = {n: kw[n] for n in mod.TRANSPOSED_ARGS if n != "num_warps"}
    # an fp32 output (Triton 3.6's interpreter truncates fp32 to bf16, where compiled code rounds to nearest), held
    # to fp32's tolerance
    kk.update(o=torch.full(kw["o"].shape, float("nan")), UP=True, HOLD=True)
    mod._transposed_kernel[grid](**kk)
    ref = oracle.gdn_tree_verify(**{n: inp[n] for n in ("q", "k", "v", "g", "beta")}, parents=parents,
                                 initial_state=inp["initial_state"])
    assert_close(f"transposed form {B} x {T}", kk["o"], ref, dtype=torch.float32)


def test_fused_ablations_cuts_each_find_their_lines_in_the_kernel():
    """benchmarks/fused_ablation.py cuts parts out of a copy of _gdn_wy_kernel by replacing lines of its source: each
    cut still finds each of its lines exactly once (else the script stops), and its copy is a Triton kernel with the
    kernel's arguments, so the figures it records are of those cuts."""
    import inspect

    from ddsim.gpu_backend import triton_gdn

    mod = _benchmark("fused_ablation")
    src = inspect.getsource(triton_gdn._gdn_wy_kernel.fn)
    for name, edits in mod.CUTS.items():
        assert all(src.count(old) == 1 for old, _ in edits), name
        kernel = mod.cut_kernel(name)
        assert kernel.arg_names == triton_gdn._gdn_wy_kernel.arg_names, name
        cut = inspect.getsource(kernel.fn)
        assert all(new in cut and (old in new or old not in cut) for old, new in edits), name


def test_the_tma_and_fold_copies_each_find_their_lines_in_the_kernel(monkeypatch):
    """benchmarks/fused_tma_late.py's copy (the state by a tensor descriptor) and each of fused_fold_late.py's (the
    value side folded into the output's weights, the state read as each variant says) still find their lines in
    _gdn_wy_kernel's source (else the script stops on the GPU), take the kernel's arguments, and hold what each
    variant is named for: the fold's one product after the state, the hold on P where held, no read where none."""
    import inspect

    from ddsim.gpu_backend import triton_gdn

    monkeypatch.syspath_prepend(str(BENCHMARKS))  # fused_fold_late imports its sibling, as from its own folder
    tma = _benchmark("fused_tma_late").tma_kernel()
    assert tma.arg_names == triton_gdn._gdn_wy_kernel.arg_names
    assert "s0 = state.load([slot * HV + i_hv, 0, i_v * BV])" in inspect.getsource(tma.fn)
    mod = _benchmark("fused_fold_late")
    assert set(mod.VARIANTS) == {"fold, no state", "fold, state held on P", "fold, state held on P, four products",
                                 "fold, TMA"}
    for name in mod.VARIANTS:
        kernel = mod.fold_kernel(name)
        assert kernel.arg_names == triton_gdn._gdn_wy_kernel.arg_names, name
        src = inspect.getsource(kernel.fn)
        assert "b_o = tl.dot(p_hi, s_hi, tl.dot(p_hi, s_lo, tl.dot(p_lo, s_hi, Y)))" in src, name
        assert "U = U + tl.dot(NL, U" not in src and "QS = tl.dot(q_raw, s_hi" not in src, name
        assert ("s0 = s0 * (tl.sum(tl.sum(P - P, 1), 0) + 1.0)" in src) == ("held" in name or "TMA" in name), name
        assert ("Y = tl.dot(p_lo, s_lo, Y)" in src) == ("four" in name), name
        assert ("tl.load(h.state_ptrs(state, slot" in src) == ("held" in name), name
        assert ("state.load(" in src) == ("TMA" in name), name


def test_the_fenced_copies_each_find_their_lines_in_the_kernel():
    """benchmarks/fused_fence.py's copies of _gdn_wy_kernel (its draft rows' reads placed among barriers) still find
    the draft reads' lines once (else the script stops on the GPU), take the kernel's arguments, read q, k, v, the mask
    and the gates once each as the form does, and hold the barriers each is named for."""
    import inspect

    from ddsim.gpu_backend import triton_gdn

    mod = _benchmark("fused_fence")
    assert inspect.getsource(triton_gdn._gdn_wy_kernel.fn).count(mod.DRAFT) == 1
    barriers = {"fenced": 2, "fenced, q k v only": 1, "fenced after every read": 1,
                "gates first, fenced after every read": 1}
    assert set(mod.FENCES) == set(barriers)
    for name, edit in mod.FENCES.items():
        kernel = mod.fenced_kernel(name)
        assert kernel.arg_names == triton_gdn._gdn_wy_kernel.arg_names, name
        src = inspect.getsource(kernel.fn)
        assert "h.draft_reads(" not in src and src.count("draft = (f_q, f_k, f_v, raw_g, raw_b)") == 1, name
        assert all(edit.count(r) == 1 for r in ("h.raw_rows(q,", "h.raw_rows(k,", "h.raw_rows(v,", "tl.load(mask",
                                                "h.raw_gates(")), name
        assert edit.count("tl.debug_barrier()") == barriers[name], name
    fenced = mod.FENCES["fenced"]
    assert fenced.index("h.raw_rows(v,") < fenced.index("tl.debug_barrier()") < fenced.index("tl.load(mask") < \
        fenced.rindex("tl.debug_barrier()") < fenced.index("h.raw_gates(")


def test_fused_fence_refuses_bad_counts_before_any_work():
    """fused_fence.py --calls and --rounds below 1: one line and exit 2, said before the CUDA check."""
    _refused_before_any_work("fused_fence.py", ["--calls", "0"], "--calls: expected 1 or more, got 0")
    _refused_before_any_work("fused_fence.py", ["--rounds", "0"], "--rounds: expected 1 or more, got 0")


def test_paths_ablations_copies_each_find_their_lines_in_the_kernels():
    """benchmarks/paths_ablation.py's copies of the paths and serial kernels (every form and two-kernel form it can
    time) still find each of their lines once, and each takes its kernel's arguments."""
    from ddsim.gpu_backend import triton_gdn

    mod = _benchmark("paths_ablation")
    forms = mod.edited_forms(lambda name: True)
    edited = [(name, k) for name, _, k, _ in forms if k is not None]
    assert len(edited) == len(mod.EDITS) + sum(len(c) for _, c in [*mod.PATHS_CONFIGS.values(), *mod.SERIAL_EDITS.values()])
    base = {"paths": triton_gdn._gdn_paths_kernel, "serial": triton_gdn._gdn_recurrent_kernel}
    for name, design, kernel, _ in forms:
        if kernel is not None:
            assert kernel.arg_names == base[design].arg_names, name
    for name, (root, rest) in mod.two_kernel_forms(lambda name: True).items():
        assert root.arg_names == triton_gdn._gdn_recurrent_kernel.arg_names, name
        assert rest.arg_names == triton_gdn._gdn_paths_kernel.arg_names, name


def test_fused_fold_late_refuses_bad_options_before_any_work():
    """fused_fold_late.py --configs not warps x width (bench.warps_widths, as fused_tma_late.py's), --calls below 1,
    and gluon_fold.py's --rounds below 1: one line and exit 2, before the CUDA check."""
    _refused_before_any_work("fused_fold_late.py", ["--configs", "4x64,3x64"],
                             "--configs: '3x64' is not warps x width (warps 1, 2, 4, 8; width 16, 32, 64)")
    _refused_before_any_work("fused_fold_late.py", ["--configs", "4x128"],
                             "--configs: '4x128' is not warps x width (warps 1, 2, 4, 8; width 16, 32, 64)")
    _refused_before_any_work("fused_fold_late.py", ["--calls", "0"], "--calls: expected 1 or more, got 0")
    _refused_before_any_work("gluon_fold.py", ["--rounds", "0"], "--rounds: expected 1 or more, got 0")


def test_gluon_served_refuses_shapes_design_auto_gives_another_form_before_any_work():
    """gluon_served.py --shapes with a batch (design auto's head form) or a tree past 16 nodes (the root first), and
    --rounds below 1: one line and exit 2, before the CUDA check."""
    want = "--shapes: design auto takes the one-kernel form (the Gluon fold, or the Triton form) for one sequence of at most"
    _refused_before_any_work("gluon_served.py", ["--shapes", "1x16,2x16"], want + " 16 nodes, got '1x16,2x16'")
    _refused_before_any_work("gluon_served.py", ["--shapes", "1x17"], want + " 16 nodes, got '1x17'")
    _refused_before_any_work("gluon_served.py", ["--rounds", "0"], "--rounds: expected 1 or more, got 0")
    _refused_before_any_work("gluon_served.py", ["--layers", "-1"], "--layers: expected 0 (no graphed replay) or more, got -1")


def test_rounds_specialization_refuses_counts_below_one_before_any_work():
    """rounds_specialization.py --trials or --calls below 1: one line and exit 2, before the CUDA check."""
    _refused_before_any_work("rounds_specialization.py", ["--trials", "0"], "--trials: expected 1 or more, got 0")
    _refused_before_any_work("rounds_specialization.py", ["--calls", "-2"], "--calls: expected 1 or more, got -2")


def test_wy_fault_probe_refuses_a_count_or_a_selection_of_configurations_it_does_not_have_before_any_work():
    _refused_before_any_work("wy_fault_probe.py", ["--first", "0"], "--first 0: expected 1 to 139")
    _refused_before_any_work("wy_fault_probe.py", ["--first", "140"], "--first 140: expected 1 to 139")
    # a selection that leaves nothing to run (the SSD configurations are the last 12; --mma compiles no SSD launch)
    # would print an empty listing and "faults 0"
    _refused_before_any_work("wy_fault_probe.py", ["--first", "50", "--design", "ssd"],
                             "--first 50 --design ssd: no configuration to run")
    _refused_before_any_work("wy_fault_probe.py", ["--mma", "--design", "ssd"], "--first 139 --design ssd --mma: no configuration to run")


@pytest.mark.slow  # Triton's compiler and ptxas (a few seconds)
def test_wy_fault_probe_mma_prints_the_layouts_of_the_launch_that_faulted_and_of_the_fixed_tiles():
    """wy_fault_probe.mma, compiled for sm_90 on the CPU: the faulting draw's launch (37 nodes, fp32, the root in the
    block, a device plan: a 64-row block, 8 warps) with the old least tile of 16 takes wgmma with products of N = 8;
    as planned now (_common.MIN_V_TILE_64: a 32-wide tile) none is N = 8; with V = 64 every product is N = 32."""
    code = ("import wy_fault_probe as P\n"
            "P.mma([(37, 1, 'device', 'float32', 1, 4, 4, 'fused', 16), (37, 1, 'device', 'float32', 1, 4, 4, 'fused', 32),"
            " (37, 1, 'device', 'float32', 1, 4, 64, 'fused', 32)])\n")
    narrow, fixed, wide = [line for line in _compiled_on_the_cpu(code).splitlines() if line.startswith("(37")]
    assert "BT 64 warps 8 BV 16:" in narrow and "warpsPerCTA = [8, 1], instrShape = [16, 8, 8]" in narrow, narrow
    assert "BT 64 warps 8 BV 32:" in fixed and "instrShape = [16, 8, 8]" not in fixed, fixed
    assert "BT 64 warps 8 BV 64:" in wide and "instrShape = [16, 32, 8]" in wide, wide
    assert "instrShape = [16, 8, 8]" not in wide and "instrShape = [16, 16, 8]" not in wide, wide


def test_the_gluon_fold_compiles_with_its_copy_issued_before_the_products_and_waited_for_after_them():
    """benchmarks/gluon_fold.py's kernel (Gluon: Triton's interpreter cannot run it) compiled for sm_90 on the CPU, in each
    form it times: the state's copy (TMA: one box, or two) goes out before any product and is waited for only once
    every product but P S0's is made (six MMAs after the wait: three for each half of the tile's V, in one chain or
    in three, or by zero with eight of the copy's rows read after the wait; the copy issued first, with no slot, and
    every read issued before any is used, too; the state copied by cp.async, its wait_group the wait); with the state
    not read, no copy and no wait; the copy alone
    compiles too (one box or two, one wait). So what it measures is that order, not Triton's wait where the copy is
    issued."""
    code = ("import gluon_fold as G\n"
            "for i, form in enumerate(G.FORMS.values()):\n"
            "    ck = G.offline_compile(90, **form)\n"
            "    read, halves = form.get('read', True), form.get('halves', False)\n"
            "    ir = ck.asm['ttgir'].split(chr(10))\n"
            "    copy, wait = ('ttg.async_copy_global_to_local', 'ttg.async_wait') if form.get('cpasync') else"
            " ('async_tma_copy_global_to_local', 'ttng.wait_barrier')\n"
            "    ops = [('copy' if copy in x else 'wait' if wait in x else 'dot') for x in ir if copy in x or wait in x"
            " or ' = tt.dot ' in x]\n"
            "    print('ORDER', read, halves, i, ' '.join(ops))\n"
            "for halves in (False, True):\n"
            "    ir = G.offline_compile(90, halves=halves, copy=True).asm['ttgir']\n"
            "    print('COPY', halves, ir.count('async_tma_copy_global_to_local'), ir.count('ttng.wait_barrier'))\n")
    out = _compiled_on_the_cpu(code)
    order = {tuple(line.split()[1:4]): line.split()[4:] for line in out.splitlines() if line.startswith("ORDER")}
    for (read, halves, _), ops in order.items():
        if read == "False":
            assert "copy" not in ops and "wait" not in ops and ops.count("dot") > 6, ops
            continue
        copies = 2 if halves == "True" else 1
        assert ops[:copies] == ["copy"] * copies and ops.count("copy") == copies, ops
        assert ops[-7:] == ["wait"] + ["dot"] * 6 and ops.count("wait") == 1, ops
    assert len(order) == 13, out[-2000:]  # every timed form of gluon_fold.FORMS
    copies = [line.split()[1:] for line in out.splitlines() if line.startswith("COPY")]
    assert copies == [["False", "1", "1"], ["True", "2", "1"]], out[-2000:]  # the copy alone: one box or two


def test_edited_kernel_refuses_a_line_not_found_once():
    """bench.edited_kernel, which fused_floor.py and fused_ablation.py build their copies with: an edit whose line the
    kernel's source lacks, or holds twice, stops with the caller's name and the line, before anything is written."""
    from ddsim.bench.bench import edited_kernel
    from ddsim.gpu_backend import triton_gdn

    header = "import triton\nimport triton.language as tl\nfrom ddsim.gpu_backend import triton_helpers as h\n\n\n"
    with pytest.raises(SystemExit, match="probe: _gdn_wy_kernel's source no longer has 'no such line' once"):
        edited_kernel(triton_gdn._gdn_wy_kernel, [("    no such line\n", "")], header=header, who="probe")
    with pytest.raises(SystemExit, match="no longer has 'tl.constexpr' once"):  # many times, not once
        edited_kernel(triton_gdn._gdn_wy_kernel, [("tl.constexpr", "int")], header=header, who="probe")


def test_edited_kernels_files_are_read_where_they_run_and_removed_when_the_process_exits(tmp_path):
    """bench.edited_kernel writes each edited module into one temporary folder a process: two edits of one kernel in
    two files (neither overwrites the other), both there while the process runs (Triton and its interpreter read a
    kernel's source from its file when they first run it), and the folder gone once the process exits; a child
    forked from it leaves it be. (Each edited_kernel call made its own folder and left it behind before: 30 a run of
    `make test`.)"""
    code = ("import os, sys\n"
            "from ddsim.bench import bench\n"
            "from ddsim.gpu_backend import triton_gdn\n"
            "header = 'import triton\\nimport triton.language as tl\\nfrom ddsim.gpu_backend import triton_helpers as h\\n\\n\\n'\n"
            "a = bench.edited_kernel(triton_gdn._gdn_wy_kernel, [('def _gdn_wy_kernel(', 'def _gdn_wy_kernel(  # edited')],\n"
            "                        header=header, who='t')\n"
            "b = bench.edited_kernel(triton_gdn._gdn_wy_kernel, [], header=header, who='t')\n"
            "py = lambda: sorted(f for f in os.listdir(bench._edited_dir()) if f.endswith('.py'))  # (and __pycache__)\n"
            "files = py()\n"
            "assert len(files) == 2 and a.fn.__code__.co_filename != b.fn.__code__.co_filename, files\n"
            "assert '# edited' in open(a.fn.__code__.co_filename).read()\n"
            "if os.fork() == 0:\n"
            "    sys.exit(0)  # the child runs the exit hooks it inherited\n"
            "os.wait()\n"
            "assert py() == files, 'the forked child removed its parent folder'\n"
            "print(bench._edited_dir())\n")
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    folder = r.stdout.strip().splitlines()[-1]
    assert folder.startswith(str(tmp_path)) and os.path.basename(folder).startswith("ddsim_edited_"), folder
    assert not os.path.exists(folder) and os.listdir(tmp_path) == []


def test_fused_ablation_refuses_bad_counts_before_any_work():
    """fused_ablation.py --calls and --rounds below 1: one line and exit 2, said before the CUDA check."""
    _refused_before_any_work("fused_ablation.py", ["--calls", "0"], "--calls: expected 1 or more, got 0")
    _refused_before_any_work("fused_ablation.py", ["--rounds", "0"], "--rounds: expected 1 or more, got 0")


def test_state_reads_refuses_bad_options_before_any_work():
    """state_reads.py --rounds below 1, a V tile it does not time: one line and exit 2, said before the CUDA check."""
    _refused_before_any_work("state_reads.py", ["--rounds", "0"], "--rounds: expected 1 or more, got 0")
    _refused_before_any_work("state_reads.py", ["--block-v", "48"],
                             "--block-v '48': expected a comma-separated list from [16, 32, 64, 128]")


@pytest.mark.interpreter
@pytest.mark.parametrize("bv", [64, 32])
def test_each_read_state_reads_times_reads_the_slots_state(monkeypatch, bv):
    """state_reads.py's kernels, run by Triton's interpreter on a smaller pool (4 value heads): each program folds
    the tile at the table's slot (not row 0, not its neighbour's) into its output row, every read but the bulk
    prefetch (inline assembly, compiled only) checked, so what it times is a read of the state through the slot."""
    import triton

    mod = _benchmark("state_reads")
    monkeypatch.setattr(mod, "HV", 4)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    pool = torch.randn(3, 4, mod.K, mod.V, generator=torch.Generator().manual_seed(0))
    slot = torch.tensor([2], dtype=torch.int32)
    out = torch.empty(4, mod.V)
    got = mod.launches(pool, slot, out, bv)
    assert {"ldg", "ldg .cg", "tma host", "tma device"} <= set(got)
    assert ("ldg, rows prefetched in bulk" in got) == (bv == 64)
    for name, launch in got.items():
        if "prefetched" in name:
            continue
        out.fill_(float("nan"))
        launch()
        torch.testing.assert_close(out, pool[2].sum(1), rtol=0, atol=1e-4, msg=name)


@pytest.mark.interpreter
def test_captured_launch_gives_the_one_launch_a_plan_binds_and_refuses_none_or_several():
    """bench.captured_launch: plan_wy's result with the grid and keyword arguments of the launch it bound (bind as
    before, restored after), and a RuntimeError where fn binds no launch or more than one."""
    from ddsim.bench.bench import captured_launch, ddtree_batch, kernel_inputs
    from ddsim.gpu_backend import triton_gdn

    bind = triton_gdn.bind
    _, parents = ddtree_batch(1, 16)
    inp = kernel_inputs(1, 16, device="cpu")
    (launch, o), grid, kw = captured_launch(lambda: triton_gdn.plan_wy(
        **{n: inp[n] for n in ("q", "k", "v", "g", "beta")}, parents=parents, initial_state=inp["initial_state"],
        design="fused", poison=False))
    assert callable(launch) and kw["o"] is o and kw["T"] == 16 and grid == (2, 48)
    assert triton_gdn.bind is bind
    with pytest.raises(RuntimeError, match="0 launches bound"):
        captured_launch(lambda: None)
    with pytest.raises(RuntimeError, match="2 launches bound"):
        captured_launch(lambda: (triton_gdn.bind(None, (1,), {}), triton_gdn.bind(None, (1,), {})))
    assert triton_gdn.bind is bind


# The state's copy, its wait and its first use as Triton 3.6 writes them in the one-kernel form's TTGIR (names as
# there, types shortened): what fused_tma_late.py's edits find and move
_TMA_TTGIR = """\
    %s0_140 = ttg.local_alloc : () -> !ttg.memdesc<128x64xf32, #shared1, #smem, mutable>
    %s0_141 = ttg.local_alloc : () -> !ttg.memdesc<1xi64, #shared2, #smem, mutable>
    ttng.async_tma_copy_global_to_local %state[%s0_139, %c0_i32, %o_v] %s0_140, %s0_141, %true : !tt.tensordesc
    ttng.wait_barrier %s0_141, %c0_i32 : !ttg.memdesc<1xi64, #shared2, #smem, mutable>
    ttng.inval_barrier %s0_141 : !ttg.memdesc<1xi64, #shared2, #smem, mutable>
    %s0_142 = ttg.local_load %s0_140 : !ttg.memdesc<128x64xf32, #shared1, #smem, mutable> -> tensor<128x64xf32, #blocked3>
    %KK_157 = tt.dot %11, %KK_156, %cst_22, inputPrecision = tf32 : tensor<16x128xbf16> -> tensor<16x16xf32, #mma>
    %QK = tt.dot %16, %KK_156, %cst_22, inputPrecision = tf32 : tensor<16x128xbf16> -> tensor<16x16xf32, #mma>
    %s0_211 = tt.splat %s0_210 : f32 -> tensor<128x64xf32, #blocked3>
    %s0_212 = arith.mulf %s0_142, %s0_211 : tensor<128x64xf32, #blocked3>
    %s_hi = arith.truncf %s0_212 : tensor<128x64xf32, #blocked3> to tensor<128x64xbf16, #blocked3>
    %s_hi_213 = ttg.local_alloc %s_hi : (tensor<128x64xbf16, #blocked3>) -> !ttg.memdesc<128x64xbf16, #shared3, #smem>
    %s_lo = arith.extf %s_hi : tensor<128x64xbf16, #blocked3> to tensor<128x64xf32, #blocked3>
    %s_lo_214 = arith.subf %s0_212, %s_lo : tensor<128x64xf32, #blocked3>
    %s_lo_215 = arith.truncf %s_lo_214 : tensor<128x64xf32, #blocked3> to tensor<128x64xbf16, #blocked3>
    %s_lo_216 = ttg.local_alloc %s_lo_215 : (tensor<128x64xbf16, #blocked3>) -> !ttg.memdesc<128x64xbf16, #shared3, #smem>
    %s_lo_217 = ttg.local_load %s_lo_216 : !ttg.memdesc<128x64xbf16, #shared3, #smem> -> tensor<128x64xbf16, #dot1>
    %KS = tt.dot %11, %s_lo_217, %cst_21, inputPrecision = tf32 : tensor<16x128xbf16> -> tensor<16x64xf32, #mma>
    %s_hi_218 = ttg.local_load %s_hi_213 : !ttg.memdesc<128x64xbf16, #shared3, #smem> -> tensor<128x64xbf16, #dot1>
    %KS_219 = tt.dot %11, %s_hi_218, %KS, inputPrecision = tf32 : tensor<16x128xbf16> -> tensor<16x64xf32, #mma>
    %QS = tt.dot %16, %s_lo_217, %cst_21, inputPrecision = tf32 : tensor<16x128xbf16> -> tensor<16x64xf32, #mma>
    %QS_219 = tt.dot %16, %s_hi_218, %QS, inputPrecision = tf32 : tensor<16x128xbf16> -> tensor<16x64xf32, #mma>"""


def _ops(ttgir: str) -> list[str]:
    """Each line's op: its result's name and op, or the op alone."""
    import re
    return [re.sub(r"^\s*(?:(%[\w.]+) = )?([\w.]+).*$", lambda m: f"{m.group(1) or ''}={m.group(2)}", line)
            for line in ttgir.split("\n")]


def test_fused_tma_lates_edits_wait_for_the_copy_at_the_states_use_and_read_it_in_the_products_layout():
    """benchmarks/fused_tma_late.py's TTGIR edits: the copy's wait, the barrier's invalidation and the tile's load
    move to the tile's first use; read in the products' layout, the tile feeds the head and remainder directly (no
    hold, no allocation and load back of either) and the products take them; split after Q K^T, the wait, load and
    split follow that product. The copy itself never moves."""
    mod = _benchmark("fused_tma_late")
    late = mod.waited_at_use(_TMA_TTGIR)
    assert _ops(late)[2:9] == ["=ttng.async_tma_copy_global_to_local", "%KK_157=tt.dot", "%QK=tt.dot",
                               "%s0_211=tt.splat", "=ttng.wait_barrier", "=ttng.inval_barrier",
                               "%s0_142=ttg.local_load"]
    assert _ops(late)[9] == "%s0_212=arith.mulf"
    op = mod.read_in_operand_layout(late)
    assert "local_alloc %s_" not in op and "local_load %s_" not in op and "arith.mulf" not in op
    assert f"-> tensor<128x64xf32, {mod.DOB}>" in op and "#blocked3>\n" not in op.split("ttg.local_load %s0_140")[1]
    assert "%s_hi = arith.truncf %s0_142 :" in op and "%s_lo_214 = arith.subf %s0_142, %s_lo :" in op
    assert "%KS = tt.dot %11, %s_lo_215, %cst_21" in op and "%KS_219 = tt.dot %11, %s_hi, %KS," in op
    assert "%QS_219 = tt.dot %16, %s_hi, %QS," in op
    early = mod.split_after(op, "Q K^T")
    ops = _ops(early)
    at = ops.index("%QK=tt.dot")
    assert ops[at + 1:at + 8] == ["=ttng.wait_barrier", "=ttng.inval_barrier", "%s0_142=ttg.local_load",
                                  "%s_hi=arith.truncf", "%s_lo=arith.extf", "%s_lo_214=arith.subf",
                                  "%s_lo_215=arith.truncf"]
    assert ops.index("=ttng.async_tma_copy_global_to_local") == 2
    assert sorted(early.split("\n")) == sorted(op.split("\n"))  # moved, nothing lost


def test_fused_tma_lates_edits_stop_where_the_ir_is_not_as_they_expect():
    """An IR whose wait is not followed by the barrier's invalidation and the tile's load, or whose product to split
    after comes after the state's use: the edit stops (SystemExit), nothing compiled from a half-edited IR."""
    mod = _benchmark("fused_tma_late")
    swapped = _TMA_TTGIR.replace("    ttng.inval_barrier %s0_141", "    %x = arith.addf %a, %b\n    ttng.inval_barrier")
    with pytest.raises(SystemExit, match="not followed by its invalidation"):
        mod.waited_at_use(swapped)
    op = mod.read_in_operand_layout(mod.waited_at_use(_TMA_TTGIR))
    late_qk = op.replace("    %QK = tt.dot", "    %QK_0 = tt.dot").replace("%QS_219 = tt.dot", "%QK = tt.dot")
    with pytest.raises(SystemExit, match="Q K\\^T comes after the state's first use"):
        mod.split_after(late_qk, "Q K^T")
    with pytest.raises(SystemExit, match="the TTGIR has no wait for the copy"):
        mod.waited_at_use(_TMA_TTGIR.replace("ttng.wait_barrier", "ttng.other_op"))


def test_fused_tma_late_refuses_bad_options_before_any_work():
    """fused_tma_late.py --rounds below 1, a config it cannot launch: one line and exit 2, before the CUDA check."""
    _refused_before_any_work("fused_tma_late.py", ["--rounds", "0"], "--rounds: expected 1 or more, got 0")
    _refused_before_any_work("fused_tma_late.py", ["--configs", "4x64,3x32"],
                             "--configs: '3x32' is not warps x width (warps 1, 2, 4, 8; width 16, 32, 64)")


def test_the_engine_benchmarks_layer_is_sglangs_convention_with_the_steps_plans():
    """bench.sglang_layer (bench_engine_api.py's and bench_node_states.py's setup): Qwen3.6-27B shapes, the pool in
    SGLang's [N, HV, V, K] layout with the batch at every other row, and the plans built from those very tensors."""
    from ddsim.bench.bench import sglang_layer
    from ddsim.gpu_backend import checks
    L = sglang_layer(2, 9, device="cpu")
    HV, V, K = L.inp["v"].shape[2], L.inp["v"].shape[3], L.inp["q"].shape[3]
    assert (HV, V, K) == (48, 128, 128) and L.parents.shape == (2, 9) and len(L.trees) == 2
    assert L.pool.shape == (4, HV, V, K) and L.pool.dtype == torch.float32 and L.slots.tolist() == [0, 2]
    assert L.a.shape == L.b.shape == (2, 9, HV) and torch.equal(L.zeros, torch.zeros(HV))
    assert isinstance(L.plan, checks.TreePlan) and torch.equal(L.plan.parents, L.parents)
    assert L.par.dtype == torch.int32 and L.pslots.indices.tolist() == [0, 2]
    assert L.buf.shape == (2, 9, HV, V, K) and L.buf.dtype == torch.float32 and L.prows.indices.tolist() == [0, 1]


@pytest.mark.slow  # Triton's compiler and ptxas (a second or two)
def test_compile_kernel_types_a_launchs_arguments_as_the_launcher_does_and_takes_overrides(tmp_path):
    """bench.compile_kernel (tests/gpu_compile.py's and fused_tma_late.py's offline compile) specializes a launch as
    Triton's launcher does (its kernel's own binder): tensors as pointers of their dtype, ints by their range, an int
    equal to 1 a constant unless the kernel's do_not_specialize names it, bools as u1, constexprs bound, num_warps
    taken; ``types`` in place of the launcher's type. Typed by hand (before), an int 1 was an i32: an offline compile
    was not the kernel a launch of one doubling round ran (_common.ROUNDS_AS_VALUE)."""
    pytest.importorskip("triton.backends.nvidia")
    import os
    script = (
        "import os\nos.environ.pop('TRITON_INTERPRET', None)\n"
        "import torch, triton, triton.language as tl\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from ddsim.bench.bench import compile_kernel\n"
        "def body(x, n, one, big, flag, s, B: tl.constexpr):\n"
        "    tl.store(x + tl.arange(0, B), tl.zeros([B], tl.float32) + s + n + one + big + flag)\n"
        "k = triton.jit(body)\n"
        "k_value = triton.jit(body, do_not_specialize=['one'])\n"
        "kw = dict(x=torch.zeros(4), n=3, one=1, big=2**40, flag=True, s=0.5, B=4, num_warps=2)\n"
        "t = GPUTarget('cuda', 90, 32)\n"
        "a = compile_kernel(k, kw, t)\n"
        "b = compile_kernel(k, kw, t, types={'n': 'i64'})\n"
        "c = compile_kernel(k_value, kw, t)\n"
        "print(dict(a.src.signature), a.metadata.num_warps)\n"
        "print(dict(b.src.signature))\n"
        "print(dict(c.src.signature))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    path = tmp_path / "compile_one.py"  # Triton reads a kernel's source from its file
    path.write_text(script)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300,
                       cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    first, second, third = r.stdout.splitlines()[-3:]
    assert first == ("{'x': '*fp32', 'n': 'i32', 'one': 'constexpr', 'big': 'i64', 'flag': 'u1', 's': 'fp32', "
                     "'B': 'constexpr'} 2")
    assert second == ("{'x': '*fp32', 'n': 'i64', 'one': 'constexpr', 'big': 'i64', 'flag': 'u1', 's': 'fp32', "
                      "'B': 'constexpr'}")
    assert third == ("{'x': '*fp32', 'n': 'i32', 'one': 'i32', 'big': 'i64', 'flag': 'u1', 's': 'fp32', "
                     "'B': 'constexpr'}")


def test_an_offline_compile_on_a_triton_whose_launcher_binds_otherwise_says_so(monkeypatch):
    """bench.launch_specialization leans on Triton's launcher binder (3.6-3.9): where a Triton lacks it, or its binder
    returns another shape, the offline compile stops with one line naming the Triton version, not a traceback deep
    in Triton or a compile specialized wrongly."""
    import triton
    import triton.compiler
    import triton.runtime.jit as jit

    from ddsim.bench.bench import launch_specialization
    monkeypatch.setattr(triton.compiler, "make_backend", lambda target: None)
    want = rf"^bench.launch_specialization: Triton {re.escape(triton.__version__)}'s launcher binds a launch otherwise"
    monkeypatch.setattr(jit, "create_function_from_signature", lambda *a: (lambda **kw: ("key", [("i32", None)])))
    kernel = SimpleNamespace(signature=None, params=[SimpleNamespace(name="n")])
    with pytest.raises(RuntimeError, match=want):
        launch_specialization(kernel, {"n": 3}, None)
    monkeypatch.delattr(jit, "create_function_from_signature")
    with pytest.raises(RuntimeError, match=want):
        launch_specialization(kernel, {"n": 3}, None)


def test_bench_node_states_refuses_bad_options_before_any_work():
    """benchmarks/bench_node_states.py: a configuration it cannot launch, or a shape it cannot draw, is one line and
    exit 2, before the CUDA check."""
    _refused_before_any_work("bench_node_states.py", ["--serial", "32/3"],
                             "--serial '32/3': expected BV in 16, 32, 64, 128 and W in 1, 2, 4, 8, got (32, 3)")
    _refused_before_any_work("bench_node_states.py", ["--paths", "32-2"], "--paths '32-2': expected BV/W,BV/W,...")
    _refused_before_any_work("bench_node_states.py", ["--shapes", "1x1"],
                             "--shapes '1x1': expected BxT,BxT,... with B >= 1, T >= 2")


def test_paths_ablation_refuses_bad_options_before_any_work():
    """benchmarks/paths_ablation.py: a count below 1, a shape it cannot draw, or an --only no form's name has, is one
    line and exit 2, before the CUDA check."""
    _refused_before_any_work("paths_ablation.py", ["--calls", "0"], "--calls: expected 1 or more, got 0")
    _refused_before_any_work("paths_ablation.py", ["--shapes", "1x1"],
                             "--shapes '1x1': expected BxT,BxT,... with B >= 1, T >= 2")
    _refused_before_any_work("paths_ablation.py", ["--only", "K in thread,no such form"],
                             "--only 'no such form': no form's name has it (forms: cut: no state store, cut: no steps, "
                             "cut: no committed read, path from registers, rows first, streaming stores, rows first + "
                             "streaming stores, decay deferred, K in thread, serial, K in thread, root first, two "
                             "kernels, root first, two kernels + decay deferred)")


@pytest.mark.interpreter
@pytest.mark.slow  # a benchmark's kernels in Triton's interpreter (16 s)
def test_paths_ablations_changed_forms_compute_the_kernels_output_and_its_cuts_find_their_lines():
    """benchmarks/paths_ablation.py's copies of the paths and serial kernels, run by Triton's interpreter on a batch of
    two trees into SGLang's buffer at rows of its own: each changed form (no "cut" in its name, at each of its V tiles
    and warps; the root first in two kernels) writes the kernel's outputs and node states and nothing else of the
    buffer (the same bits where it makes the same steps, within fp32's rounding where the decay is deferred), so the
    times it records are of forms that do the drop-in's work; each cut is a copy with the kernel's arguments."""
    from ddsim.gpu_backend import engine_api
    from ddsim.gpu_backend import triton_gdn as G
    from ddsim.gpu_backend.launch import bind

    mod = _benchmark("paths_ablation")
    g = torch.Generator().manual_seed(5)
    B, T, H, HV, K, V = 2, 7, 1, 2, 16, 32
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    plan = engine_api.plan_tree(torch.tensor([[-1, 0, 0, 1, 1, 2, 3], [-1, 0, 1, 0, 3, 3, 5]], dtype=torch.int32))
    buf = torch.empty(3, T + 2, HV, V, K)  # SGLang's [rows, TS, HV, V, K], its rows 2 and 0 written
    base = dict(q=r(B, T, H, K).bfloat16(), k=r(B, T, H, K).bfloat16(), v=r(B, T, HV, V).bfloat16(),
                parents=plan, initial_state=r(4, HV, V, K).transpose(-1, -2), state_indices=torch.tensor([3, 1]),
                a=r(B, T, HV), b=r(B, T, HV), A_log=r(HV) * 0.3, dt_bias=r(HV) * 0.3, mode="exact", poison=True,
                states_out=buf.transpose(-1, -2), states_rows=torch.tensor([2, 0]))

    def run(kernel, grid, kw):
        out = torch.full_like(buf, float("nan"))
        kw = dict(kw, o=torch.full_like(kw["o"], float("nan")), snap=out.transpose(-1, -2))
        bind(kernel, grid, kw)()
        return kw["o"], out

    kernel, grid, kw = mod.planned(**base, design="paths")
    o_ref, buf_ref = run(kernel, grid, kw)
    assert torch.isfinite(o_ref).all() and torch.isfinite(buf_ref[[2, 0], :T]).all()
    assert torch.isnan(buf_ref[1]).all() and torch.isnan(buf_ref[:, T:]).all()
    every = lambda name: True  # noqa: E731
    forms = mod.edited_forms(every)  # the script's own forms, as it times them
    assert {name for name, *_ in forms} >= {*mod.EDITS, "K in thread 64/2", "serial, K in thread 32/1"}
    for name, design, edited, config in forms:
        base_kernel = G._gdn_paths_kernel if design == "paths" else G._gdn_recurrent_kernel
        assert edited is None or edited.arg_names == base_kernel.arg_names, name
        if name.startswith("cut"):
            continue
        k0, g0, kw0 = (kernel, grid, kw) if config is None else mod.planned(
            **base, design=design, block_v=config[0], num_warps=config[1])
        _same(name, *run(edited or k0, g0, kw0), o_ref, buf_ref)
    two = mod.two_kernel_forms(every)
    assert set(two) == set(mod.TWO_KERNELS)
    for name, (root, rest) in two.items():
        out = torch.full_like(buf, float("nan"))
        kwn = dict(kw, o=torch.full_like(kw["o"], float("nan")), snap=out.transpose(-1, -2))
        mod.root_first(root, rest, base=base, kw=kwn, grid=grid)()
        _same(name, kwn["o"], out, o_ref, buf_ref)


def _same(name, o, out, o_ref, buf_ref):
    """A changed form's output and buffer against the kernel's: the same bits, or with the decay deferred (other
    roundings) within fp32's tolerance; NaN (unwritten) exactly where the kernel's are."""
    assert torch.equal(torch.isnan(out), torch.isnan(buf_ref)) and not torch.isnan(o).any(), name
    if "deferred" in name:
        torch.testing.assert_close(o.float(), o_ref.float(), rtol=1e-2, atol=1e-2, msg=name)  # bf16 outputs
        torch.testing.assert_close(out.nan_to_num(7.0), buf_ref.nan_to_num(7.0), rtol=1e-5, atol=1e-5, msg=name)
    else:
        assert torch.equal(o, o_ref) and torch.equal(out.nan_to_num(7.0), buf_ref.nan_to_num(7.0)), name


def test_order_exact_bits_refuses_a_count_below_one_before_any_work():
    _refused_before_any_work("order_exact_bits.py", ["--cases", "0"], "--cases 0: expected at least 1")
