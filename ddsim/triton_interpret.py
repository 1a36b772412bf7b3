"""Running engines' Triton kernels on the CPU, in Triton's interpreter (TRITON_INTERPRET=1).

One interpreter defect is worked around here: a mask built as ``scalar_bool & block_bool`` (SGLang's
causal_conv1d_update does this) comes out of the interpreter's numpy arithmetic as int64, and the
interpreter's masked load and store refuse any mask that is not bool. Nonzero is true either way, so
the masked load and store cast such a mask to bool; a bool mask passes unchanged. Compiled kernels on
a GPU never see this code.
"""
from __future__ import annotations

import os


def prepare() -> None:
    """Set TRITON_INTERPRET=1 (before triton is imported) and apply the fixes once."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import contextlib

    import numpy as np
    import torch
    from triton.runtime import interpreter

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_ddsim_bool_masks", False):
        return

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    load, store = builder.create_masked_load, builder.create_masked_store

    # the builder's trailing arguments (cache and eviction policies, volatility) differ between
    # Triton versions (3.6 passes one more than 3.9): passed on as they come
    def create_masked_load(self, ptrs, mask, *rest):
        return load(self, ptrs, as_bool(mask), *rest)

    def create_masked_store(self, ptrs, value, mask, *rest):
        return store(self, ptrs, value, as_bool(mask), *rest)

    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    builder._ddsim_bool_masks = True
