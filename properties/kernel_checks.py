"""Checks shared by the recurrent families' property tests (no tests here)."""
from __future__ import annotations

import torch

from ddsim.measure.compare import assert_close

# Where the fast paths run: compiled on a GPU where there is one, else on the CPU (the Triton backends in Triton's
# interpreter, `make test-slow`). The tests draw their examples on the CPU and the oracle runs there, in float64.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def on_device(x):
    """x (a tensor, or a dict, tuple or list of tensors and other values) with its tensors on DEVICE (the same
    tensors where they are there already)."""
    if isinstance(x, torch.Tensor):
        return x.to(DEVICE)
    if isinstance(x, dict):
        return {k: on_device(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(on_device(v) for v in x)
    return x


def check_verify_against_oracle(fast, ref, args: dict, *, kw: dict, initial_state: torch.Tensor, mode: str,
                                dtype: torch.dtype, backend: str, keep: bool) -> None:
    """A family's fast verify ``fast(**args, **kw, initial_state=, mode=, backend=)`` against its oracle twin
    ``ref`` on one drawn example: the output in ``dtype`` within that dtype's tolerance, and with ``keep`` the
    per-node states (output_states=True) within float32's; the inputs ``args`` and the committed state
    bit-identical after the call. Without ``keep`` the outputs alone (a Triton kernel then writes per-node
    states only for exact's parents)."""
    dev, dev_kw = on_device(args), on_device(kw)  # the fast path's inputs on DEVICE, the oracle's on the CPU
    before = {k: v.clone() for k, v in dev.items()}
    S0 = on_device(initial_state).clone()
    if not keep:
        o = fast(**dev, **dev_kw, initial_state=S0, mode=mode, backend=backend).cpu()
        ref_o = ref(**args, **kw, initial_state=initial_state, mode=mode)
        assert o.dtype == dtype and o.shape == ref_o.shape
        assert_close(f"o ({mode}, {backend})", o, ref_o, dtype=dtype, slack=5)
    else:
        o, states = fast(**dev, **dev_kw, initial_state=S0, mode=mode, output_states=True, backend=backend)
        o, states = o.cpu(), states.cpu()
        ref_o, ref_states = ref(**args, **kw, initial_state=initial_state, mode=mode, output_states=True)
        assert o.dtype == dtype and o.shape == ref_o.shape and states.shape == ref_states.shape
        assert_close(f"o ({mode})", o, ref_o, dtype=dtype, slack=5)
        assert_close(f"per-node states ({mode})", states, ref_states, dtype=torch.float32, slack=5)
    assert torch.equal(S0.cpu(), initial_state) and all(torch.equal(dev[k], v) for k, v in before.items())


def assert_rounding_twins(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, *, atol: float = 1e-7,
                          share: float = 0.01, scale: torch.Tensor | None = None,
                          counted: torch.Tensor | None = None) -> None:
    """A glue kernel's output against its PyTorch twin, which rounds at the same points (gpu_backend.triton_norms):
    fp32 within 2e-6 relative (the fp32 sums' order). 16-bit: the two differ where an fp32 value lands on a rounding
    midpoint in one and not the other, on fewer than ``share`` of the entries, and there by at most what the flipped
    roundings move the output: one ulp of ``scale`` (default four times the entry: up to three intermediates rounded
    before the output's own, as the gated norm's, each flip moving it by an ulp of its size; RoPE's caller passes its
    terms' sizes, whose sum may cancel) plus one ulp at the tensor's root-mean-square size. atol: where both lose
    digits alike (GELU's 1 + erf(x) for x << 0, through different erfs). counted (bool, got's shape): the entries
    the share is taken over, where the rest may differ more often (within the bound): GELU's tail, where the two
    erfs' few-ulp differences near -1 are a large part of 1 + erf and flip a 16-bit rounding one time in ten or
    more, as often on one CPU's erf as another's."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    assert torch.isfinite(got).all()
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=atol)
        return
    diff = (got.float() - want.float()).abs()
    eps = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)  # one ulp, relative, at the top of a binade
    size = 4 * want.float().abs() if scale is None else scale.float()
    bound = eps * (size + want.float().pow(2).mean().sqrt()) + atol
    assert (diff <= bound).all(), (diff - bound).max()
    flipped = (diff > 0) if counted is None else (diff > 0)[counted]
    assert flipped.numel() and flipped.float().mean() < share, (flipped.float().mean(), flipped.numel())
