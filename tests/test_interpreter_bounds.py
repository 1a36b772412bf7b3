"""ddsim.engines.triton_interpret.check_bounds: an interpreted kernel's load or store with a lane, not masked off,
outside every tensor it was given fails, naming the kernel, the access and the nearest argument; lanes masked off,
scalar loads inside, a view reaching the rest of its storage, and a tensor descriptor's base pass. The root conftest
installs it wherever the tests interpret (planted accesses past a tensor, read and written, are caught here)."""
import pytest
import torch
import triton
import triton.language as tl

from ddsim.gpu_backend._common import interpreting

pytestmark = pytest.mark.interpreter


@triton.jit
def _copy(x, y, N, M, BLOCK: tl.constexpr):
    # y[:M] = x[:N] (lanes past N read 0): N past x's length reads past it, M past y's writes past it
    o = tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < N, other=0.0), mask=o < M)


@triton.jit
def _scalar(x, y, i):
    tl.store(y, tl.load(x + i))


def _error(fn):
    with pytest.raises(Exception) as e:
        fn()
    return str(e.value)


def test_the_conftest_holds_interpreted_launches_to_their_tensors():
    from ddsim.engines.triton_interpret import bounds_checked
    assert interpreting() and bounds_checked()


def test_a_read_or_write_past_a_tensor_fails_naming_the_kernel_and_the_argument():
    x, y = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    _copy[(1,)](x, y, 8, 8, BLOCK=16)  # lanes 8-15 masked off both ways
    assert torch.equal(y, x)
    read = _error(lambda: _copy[(1,)](x, y, 9, 8, BLOCK=16))
    assert "kernel _copy: a load of 4 bytes outside every tensor argument in 1 of 9 lanes" in read, read
    assert "32 bytes from the start of x's storage of 32 bytes" in read, read
    written = _error(lambda: _copy[(1,)](x, y, 8, 10, BLOCK=16))
    assert "kernel _copy: a store of 4 bytes outside every tensor argument in 2 of 10 lanes" in written, written
    assert "y's storage" in written, written


def test_scalar_loads_and_views_are_held_to_their_storage():
    x, y = torch.arange(8, dtype=torch.float32), torch.zeros(1)
    _scalar[(1,)](x, y, 7)
    assert y.item() == 7.0
    assert "a load of 4 bytes" in _error(lambda: _scalar[(1,)](x, y, 8))
    assert "a load of 4 bytes" in _error(lambda: _scalar[(1,)](x, y, -1))
    # a view reaches the rest of its storage (as a GPU kernel may): x[2:4] read from 2 to 9 is inside x's storage
    _scalar[(1,)](x[2:4], y, 5)
    assert y.item() == 7.0
    assert "x's storage" in _error(lambda: _scalar[(1,)](x[2:4], y, 6))


def test_a_tensor_descriptors_base_is_an_argument():
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def _tile(desc, y):
        tl.store(y + tl.arange(0, 16), desc.load([0]))
    x, y = torch.arange(16, dtype=torch.float32), torch.zeros(16)
    _tile[(1,)](TensorDescriptor.from_tensor(x, [16]), y)
    assert torch.equal(y, x)


def test_a_mask_handed_over_as_a_numpy_array_is_read_as_one(monkeypatch):
    """Triton 3.6's descriptor and block-pointer accesses hand the builder their mask as the numpy array itself (its
    ``.data`` a raw buffer), later Tritons as a TensorHandle: the bounds check and the bool-mask fix read both."""
    import numpy as np
    from triton.runtime import interpreter

    from ddsim.engines import triton_interpret as ti
    buf = np.zeros(4, dtype=np.float32)
    lo = buf.ctypes.data
    monkeypatch.setattr(ti._LAUNCH, "ranges", [("x", lo, lo + 16)], raising=False)
    monkeypatch.setattr(ti._LAUNCH, "fn", "k", raising=False)
    ptrs = interpreter.TensorHandle(np.array([lo + 12, lo + 16], dtype=np.uint64), tl.pointer_type(tl.float32))
    for as_given in (lambda m: m, lambda m: interpreter.TensorHandle(m, tl.int1)):
        ti._check_access("load", ptrs, as_given(np.array([True, False])), 4)  # the lane past x masked off
        with pytest.raises(ti.OutOfBounds, match="kernel k: a load of 4 bytes outside every tensor argument in 1 of 2"):
            ti._check_access("load", ptrs, as_given(np.array([True, True])), 4)
    ints = np.array([0, 3], dtype=np.int64)  # an int mask (scalar & block in the interpreter's numpy)
    assert ti.as_bool_mask(ints).dtype == np.bool_ and ti.as_bool_mask(ints).tolist() == [False, True]
    handle = ti.as_bool_mask(interpreter.TensorHandle(ints, tl.int64))
    assert isinstance(handle, interpreter.TensorHandle) and handle.data.tolist() == [False, True]
    bools = np.array([True, False])
    assert ti.as_bool_mask(bools) is bools
