"""The ``interpreter`` mark: a test that launches ddsim's Triton kernels on CPU tensors, which only Triton's
interpreter runs. Where Triton compiles for a GPU instead (a CUDA torch and TRITON_INTERPRET unset, as
ddsim.gpu_backend._common.interpreting reads it), such a test could only fail on the tensors' device, so the
root conftest skips it there, saying why; the GPU suites
(properties/test_glue_gpu.py, test_cuda_graphs.py, test_triton_kernels.py and the others that need CUDA) hold most of
the same kernels on the device. On a machine without a GPU (CI) the root conftest turns the interpreter on and every
marked test runs. It lives in the installed namespace (ddsim.properties), not in tests/: the root conftest imports it,
and the GPU property suites run from outside the checkout, where tests/ is not importable."""
from __future__ import annotations

import pytest

REASON = ("launches Triton kernels on CPU tensors, which only Triton's interpreter runs, and Triton compiles for the "
          "GPU here (TRITON_INTERPRET=1 runs it; the GPU suites hold the same kernels on the device)")


def skip_where_compiled(items, *, interpreting: bool) -> int:
    """Skip (REASON) every item marked ``interpreter`` where Triton does not interpret; the number skipped."""
    if interpreting:
        return 0
    marked = [item for item in items if item.get_closest_marker("interpreter") is not None]
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=REASON))
    return len(marked)
