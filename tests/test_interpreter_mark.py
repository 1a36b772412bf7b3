"""The ``interpreter`` mark (properties/interpreter_mark.py): its tests run wherever Triton interprets, and are skipped,
saying why, only where Triton compiles for a GPU."""
import pytest

from ddsim.gpu_backend._common import interpreting
from ddsim.properties.interpreter_mark import REASON, skip_where_compiled
from tests.cli_runs import FAST_AUDIT, one_line_error, run_cli


class _Item:
    """A collected test as skip_where_compiled sees one: its marks, and the marks added to it."""

    def __init__(self, *marks):
        self.marks = list(marks)

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, mark):
        self.marks.append(mark.mark)


def _skips(item):
    return [m.kwargs.get("reason") for m in item.marks if m.name == "skip"]


def test_marked_tests_are_skipped_only_where_triton_compiles():
    marked, slow, plain = _Item(pytest.mark.interpreter.mark), _Item(pytest.mark.slow.mark), _Item()
    assert skip_where_compiled([marked, slow, plain], interpreting=True) == 0
    assert [_skips(i) for i in (marked, slow, plain)] == [[], [], []]
    assert skip_where_compiled([marked, slow, plain], interpreting=False) == 1
    assert [_skips(i) for i in (marked, slow, plain)] == [[REASON], [], []]


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("On", True), ("0", False), ("", False),
                                       ("no", False), (None, False)])
def test_interpreting_reads_triton_interpret_as_triton_does(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() is on


@pytest.mark.parametrize("value", ["1", "0", "true", "TRUE", "On", " on", "1 ", "yes", "Y", "2", "t", "off", ""])
def test_interpreting_agrees_with_tritons_own_reader(monkeypatch, value):
    """Where this Triton has its knobs' C++ reader, ddsim's reading of TRITON_INTERPRET is the same on every value."""
    try:
        from triton._C.libtriton import getenv_bool
    except ImportError:
        pytest.skip("this Triton has no getenv_bool")
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() is bool(getenv_bool("TRITON_INTERPRET", False))


def test_without_a_gpu_the_suite_interprets_so_no_marked_test_is_skipped(request):
    """On CI (no CUDA) the root conftest turns the interpreter on before Triton is imported: every test marked
    ``interpreter`` in this session runs."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device: Triton compiles here unless TRITON_INTERPRET=1 was set")
    assert interpreting()
    skipped = [i.nodeid for i in request.session.items
               if i.get_closest_marker("interpreter") and i.get_closest_marker("skip")]
    assert skipped == []


@pytest.mark.parametrize("value, off", [("0", "0"), ("no", "no"), ("1", None), ("yes", None), (None, None)])
def test_the_interpreter_turned_off_is_named_by_its_value(monkeypatch, value, off):
    from ddsim.engines.triton_interpret import interpreter_turned_off
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreter_turned_off() == off


@pytest.mark.parametrize("args", [
    ["check-kernel", "--impl", "ddsim", "--mode", "exact", "--device", "cpu"],
    ["audit", *FAST_AUDIT, "--fast-path", "tests.planted_kernels:wrong_gate_sign", "--convention", "ddsim"],
])
def test_engine_kernels_on_the_cpu_with_the_interpreter_turned_off_are_refused_in_one_line(monkeypatch, tmp_path, args):
    """--device cpu runs an engine's Triton kernels in Triton's interpreter; TRITON_INTERPRET=0 would have them
    compiled for a GPU, and every property would fail on the CPU tensors: refused before any work, nothing written."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the command line's process inherits it
    out = tmp_path / "out"
    one_line_error(run_cli(*args, "--out", out / "x.json" if args[0] == "check-kernel" else out),
                   "--device cpu", "TRITON_INTERPRET='0' turns it off")
    assert not out.exists()


def test_check_kernels_lines_say_when_triton_compiled_an_engines_kernel_for_a_gpu_on_the_cpu(tmp_path):
    """An in-process caller of check_kernel.check(device="cpu") who imported an engine's Triton kernels before
    TRITON_INTERPRET=1 was set gets every property failing on Triton's own error (fail closed); the line then says
    why. A kernel's own refusal, and any error on a GPU device, carry no such note."""
    import os
    import subprocess
    import sys

    import torch
    if torch.cuda.is_available():
        pytest.skip("a machine with a GPU: Triton raises another error there for a CPU tensor (tested where there is none)")
    script = tmp_path / "compiled_on_cpu.py"
    script.write_text(
        "import torch\nimport triton\n\nfrom ddsim.engines.check_kernel import raised_line\n\n\n@triton.jit\n"
        "def noop(x):\n    pass\n\n\ntry:\n    noop[(1,)](torch.zeros(1))\nexcept Exception as e:\n"
        "    print(raised_line(e, 'cpu'))\n    print(raised_line(e, 'cuda'))\n"
        "print(raised_line(ValueError('T > 64'), 'cpu'))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 3, r.stdout + r.stderr
    note = "(Triton compiled the kernel for a GPU: on the CPU an engine's Triton kernels run only in Triton's interpreter"
    assert note in lines[0] and note not in lines[1] and lines[2] == "ValueError: T > 64"
