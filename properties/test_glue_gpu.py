"""The layers' glue kernels compiled on a GPU, in bf16 at Qwen3.6-27B's widths, against their PyTorch twins
(the CPU suite holds them in fp32 and fp16 in Triton's interpreter, whose bf16 conversion is wrong), and a
model on the glue kernels against the same model on PyTorch's ops (GPU only: skipped without CUDA)."""
import pytest
import torch

import ddsim.gpu_backend as gb
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.properties.kernel_checks import assert_rounding_twins
from ddsim.trees.builders import ddtree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need a GPU")
BF16 = torch.bfloat16


def _rand(*shape, scale=1.0, gen):
    return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(BF16)


ROWS = [1, 17, 65 * 4]


@pytest.mark.parametrize("rows", ROWS)
def test_bf16_rms_norm_after_the_residual_add_at_full_width(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    h, out = _rand(rows, 5120, scale=4.0, gen=gen), _rand(rows, 5120, gen=gen)
    w = _rand(5120, gen=gen) + 1.0
    (xn, h2), (xn_ref, h2_ref) = (gb.rms_norm(out, w, eps=1e-6, residual=h, glue=g) for g in ("triton", "torch"))
    assert torch.equal(h2, h2_ref)
    assert_rounding_twins(xn, xn_ref, BF16)


@pytest.mark.parametrize("rows", ROWS)
def test_bf16_per_head_norm_and_partial_rope(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    q, w = _rand(rows, 24, 256, gen=gen), _rand(256, gen=gen) + 1.0  # RoPE on the first 64 of 256 dims
    assert_rounding_twins(gb.rms_norm(q, w, eps=1e-6, glue="triton"), gb.rms_norm(q, w, eps=1e-6), BF16)
    ang = torch.arange(rows, device="cuda")[:, None] * 0.5 ** torch.arange(32, device="cuda")[None, :]
    cos, sin = (torch.cat([f(ang), f(ang)], -1).to(BF16) for f in (torch.cos, torch.sin))
    y = gb.rms_norm(q, w, eps=1e-6).float()  # the rotated dims are y cos + y' sin, each term rounded: a flip in y
    terms = (y[..., :64] * cos[:, None]).abs() + (torch.cat([y[..., 32:64], y[..., :32]], -1) * sin[:, None]).abs()
    scale = torch.cat([4 * terms, 4 * y[..., 64:].abs()], -1)  # (two roundings), a term's or the sum's: their ulps
    # a rotated entry reads two normed entries and rounds twice more: a flip in either or in its own roundings
    # shows (1.3% of all entries at 17 rows and 2.0% at 260 on an H200, the norm's alone under 1%)
    assert_rounding_twins(gb.rms_norm_rope(q, w, cos, sin, eps=1e-6, glue="triton"),
                          gb.rms_norm_rope(q, w, cos, sin, eps=1e-6), BF16, scale=scale, share=0.04)


@pytest.mark.parametrize("rows", ROWS)
def test_bf16_gated_rms_norm_on_a_strided_gate(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    wide = _rand(rows, 48 * 128 + 96, scale=2.0, gen=gen)  # [z | a | b] as one GEMM's output
    args = (_rand(rows, 48, 128, gen=gen), _rand(128, gen=gen) + 1.0, wide[:, :6144])
    assert_rounding_twins(gb.gated_rms_norm(*args, eps=1e-6, glue="triton"), gb.gated_rms_norm(*args, eps=1e-6), BF16)


@pytest.mark.parametrize("act", ["silu", "gelu", "sigmoid"])
@pytest.mark.parametrize("rows", ROWS)
def test_bf16_gated_activations(rows, act):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    gate, up = _rand(rows, 17408, scale=3.0, gen=gen), _rand(rows, 17408, gen=gen)
    assert_rounding_twins(gb.gated_act(gate, up, act=act, glue="triton"), gb.gated_act(gate, up, act=act), BF16,
                          atol=1e-5 if act == "gelu" else 1e-7, share=0.05 if act == "gelu" else 0.01)


@pytest.mark.parametrize("rows", ROWS)
def test_gdn_gates_from_a_strided_projection(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    ab = _rand(rows, 96, scale=16.0, gen=gen)
    kw = dict(A=-torch.rand(48, device="cuda") * 8, dt_bias=torch.randn(48, device="cuda"), beta_scale=1.0)
    (g, beta), (g_ref, beta_ref) = (gb.gdn_gates(ab[:, :48], ab[:, 48:], glue=x, **kw) for x in ("triton", "torch"))
    # the GPU's exp takes x log2(e) rounded: a few ulps off for g below 1e-12, where exp(g) is 1 in fp32 anyway
    torch.testing.assert_close(g, g_ref, rtol=2e-6, atol=1e-12)
    torch.testing.assert_close(beta, beta_ref, rtol=2e-6, atol=1e-12)  # sigmoid's tail through the same exp


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("T", [1, 17, 65])
def test_tree_attention_at_full_width(T, dtype):
    """Qwen3.6-27B's attention (24 query heads over 4 key-value heads of 256) over a prefix of 700 rows and a
    chain's ancestor mask, the mask over the tree alone and over a fixed-capacity prefix with its last 200 rows
    unused: the kernel against SDPA's fp32 math, within one rounding of the output; and with the committed length
    (500) given, as a graph gives it, bit for bit the mask alone's."""
    gen = torch.Generator(device="cuda").manual_seed(T)
    q, k, v = (_rand(T, n, 256, gen=gen).to(dtype) for n in (24, 4, 4))
    pk, pv = (_rand(700, 4, 256, gen=gen).to(dtype) for _ in range(2))
    anc = torch.ones(T, T, dtype=torch.bool, device="cuda").tril()
    used = torch.arange(700, device="cuda") < 500
    for mask in (anc, torch.cat([used.expand(T, 700), anc], 1)):
        got = gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask, glue="triton")
        want = gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask)
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        else:
            assert_rounding_twins(got, want, dtype, scale=want.float().abs())
    rows = torch.tensor(500, device="cuda")
    assert torch.equal(gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask, prefix_rows=rows,
                                         glue="triton"), got)


@pytest.mark.parametrize("preset", ["tiny", "tiny-zamba2", "tiny-lfm2"])
def test_a_bf16_model_on_the_glue_kernels_verifies_as_on_pytorchs_ops(preset):
    """Every layer's norms, residual adds, gates and activations through the kernels (the CUDA default) against
    PyTorch's ops: the per-node logits within bf16's noise over a few layers, and the same argmax nearly everywhere."""
    cfg = get_preset(preset)
    w = init_weights(cfg, seed=0, device="cuda")
    fused = HybridModel(cfg, w, device="cuda", dtype=BF16)
    ref = HybridModel(cfg, w, device="cuda", dtype=BF16, glue="torch")
    assert fused.glue == "triton"
    st, _ = ref.prefill([1, 2, 3, 4, 5])
    tree = ddtree(torch.randn(4, cfg.vocab_size, generator=torch.Generator().manual_seed(0)) * 3, 16, root_token=6)
    for keep in (True, False):
        a, b = ref.verify(st, tree, keep_states=keep).logits, fused.verify(st, tree, keep_states=keep).logits
        assert torch.isfinite(b).all()
        scale = a.abs().max()
        assert (a - b).abs().max() <= 0.05 * scale, ((a - b).abs().max(), scale)
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9
