"""What a verdict ran under: the releases of Python, torch, Triton, numpy and ddsim, the platform, the device and its
name, torch's threads. An audit's report records it (``environment``, with matplotlib's and pydantic's releases) and
so does check-kernel's JSON: a verdict on a kernel is a verdict under the Triton that compiled or interpreted it."""
from __future__ import annotations

import importlib.metadata
import platform
import sys


def triton_version() -> str | None:
    """The Triton release the kernels run under: the imported module's, else the installed distribution's (read
    without importing it), else None (none installed)."""
    mod = sys.modules.get("triton")
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        return mod.__version__
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device) -> dict:
    """{python, platform, torch, triton, numpy, ddsim, device, threads[, device_name]} for ``device`` (a
    torch.device): device_name on CUDA only."""
    import numpy as np
    import torch

    import ddsim
    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "triton": triton_version(), "numpy": np.__version__, "ddsim": ddsim.__version__, "device": str(device),
           "threads": torch.get_num_threads()}
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    return env
