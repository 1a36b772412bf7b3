import os

import pytest
import torch

# Every fast-path output is NaN-filled before its kernel writes it (read when ddsim.gpu_backend is
# imported; test_poisoning_is_on_in_the_tests guards it).
os.environ.setdefault("DDSIM_POISON", "1")
# the command-line tests fork this process (tests/conftest.py run_cli): no tokenizer thread pool to fork
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without a GPU the Triton kernels run in Triton's interpreter (set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:  # the interpreter lists triton.language's builtins once, not at every launch, patches them once a launch,
        # not again at each helper's call, takes a one-element array's element as a Python int where numpy 2.4
        # refuses Triton 3.6's int() of it, and holds every load and store to the launch's tensors
        # (ddsim.engines.triton_interpret)
        from ddsim.engines.triton_interpret import cache_builtin_names, check_bounds, index_one_element_arrays, patch_once_per_launch
        cache_builtin_names()
        patch_once_per_launch()
        index_one_element_arrays()
        # a Triton whose interpreter the check no longer fits fails the run here, rather than run unchecked
        assert check_bounds(), "ddsim.engines.triton_interpret.check_bounds: this Triton's interpreter has changed"
    except ImportError:  # no Triton on this platform: the CPU path runs without it
        pass

from ddsim.properties.profiles import load  # noqa: E402
from ddsim.threads import configure  # noqa: E402

load()
configure()  # in-process tests run as the command line does: OMP_NUM_THREADS, else one thread


def pytest_collection_modifyitems(config, items):
    """Tests marked ``interpreter`` (Triton kernels on CPU tensors) are skipped where Triton compiles for a GPU."""
    from ddsim.gpu_backend._common import interpreting
    from ddsim.properties.interpreter_mark import skip_where_compiled
    skip_where_compiled(items, interpreting=interpreting())


@pytest.fixture(autouse=True)
def _seeded_per_test(request):
    """Each test starts from global random state fixed by its own name, not by the tests that ran before it
    on the same worker (which pytest-xdist's work stealing changes from run to run)."""
    import random
    import zlib

    import numpy as np
    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
