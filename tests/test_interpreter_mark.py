"""The ``interpreter`` mark (properties/interpreter_mark.py): its tests run wherever Triton interprets, and are skipped,
saying why, only where Triton compiles for a GPU."""
import pytest

from ddsim.properties.interpreter_mark import REASON, interpreting, skip_where_compiled


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
