import os

import torch

# Every fast-path output is NaN-filled before its kernel writes it (read when ddsim.gpu_backend is
# imported; test_poisoning_is_on_in_the_tests guards it).
os.environ.setdefault("DDSIM_POISON", "1")
# the command-line tests fork this process (tests/conftest.py run_cli): no tokenizer thread pool to fork
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without a GPU the Triton kernels run in Triton's interpreter (set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:  # the interpreter lists triton.language's builtins once, not at every launch (ddsim.engines.triton_interpret)
        from ddsim.engines.triton_interpret import cache_builtin_names
        cache_builtin_names()
    except ImportError:  # no Triton on this platform: the CPU path runs without it
        pass

from ddsim.properties.profiles import load  # noqa: E402
from ddsim.threads import configure  # noqa: E402

load()
configure()  # in-process tests run as the command line does: OMP_NUM_THREADS, else one thread
