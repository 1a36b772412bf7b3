import os

import torch

# Without a GPU the Triton kernels run in Triton's interpreter (set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ddsim.properties.profiles import load  # noqa: E402

load()
