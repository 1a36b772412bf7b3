"""HybridModel.decode_rows: one plain decode step of several sequences at once (the audit's references
and greedy continuations), against verify + commit of a one-node tree per sequence."""
import pytest
import torch

from ddsim.config import get_preset
from ddsim.errors import InputError
from ddsim.model import HybridModel
from ddsim.tree import chain
from ddsim.weights import init_weights

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [7]]  # prefixes of different lengths: padded, the padding masked out


@pytest.mark.parametrize("preset,backend", [("micro", None), ("micro-mamba2", None), ("tiny", None),
                                            ("micro", "triton")])
def test_decode_rows_equals_one_node_verify_and_commit_per_row(preset, backend):
    cfg = get_preset(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0), backend=backend)
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    roots = [p[-1] for p in PROMPTS]
    for _step in range(3):  # rows keep their own positions and contexts step after step
        logits, after = m.decode_rows(states, roots)
        assert logits.shape == (len(PROMPTS), cfg.vocab_size)
        for b, (st, root) in enumerate(zip(states, roots)):
            t = chain([root])
            res = m.verify(st, t, mode="exact")
            one = m.commit(st, t, res, 0)
            torch.testing.assert_close(logits[b], res.logits[0], rtol=1e-5, atol=1e-5)
            assert after[b].pos == one.pos == st.pos + 1
            for i in cfg.attention_layers:
                torch.testing.assert_close(after[b].kv[i][0], one.kv[i][0], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(after[b].kv[i][1], one.kv[i][1], rtol=1e-5, atol=1e-6)
            for i in cfg.recurrent_layers:
                torch.testing.assert_close(after[b].ssm[i], one.ssm[i], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(after[b].conv[i], one.conv[i], rtol=1e-5, atol=1e-6)
        states, roots = after, [int(x) for x in logits.argmax(-1)]


def test_decode_rows_refuses_what_it_cannot_decode():
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    st = m.prefill([1, 2])[0]
    with pytest.raises(InputError, match="one each"):
        m.decode_rows([st, st], [1])
    with pytest.raises(InputError, match="one each"):
        m.decode_rows([], [])
    with pytest.raises(InputError, match="outside the vocabulary"):
        m.decode_rows([st], [cfg.vocab_size])
