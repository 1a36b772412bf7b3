"""Bad input gets a ValueError subclass naming the argument, never a wrong answer."""
import re

import numpy as np
import pytest
import torch

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.errors import ConfigError, InputError, TreeError
from ddsim.model.config import ModelConfig, get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree, random_tree, static_tree
from ddsim.trees.tree import Tree


@pytest.mark.parametrize("parents, tokens, msg", [
    ([], [], "no nodes"),
    ([0], [1], "node 0"),
    ([-1, 0, 2], [1, 2, 3], "node 2: parent 2"),
    ([-1, 0, -1], [1, 2, 3], "node 2: parent -1"),
    ([-1, 0, 0], [1, 2, 2], "node 2: token 2 repeats sibling node 1"),
    ([-1, 0], [1], "2 parents but 1 tokens"),
    ([-1, 0], [1, -4], "node 1: token -4"),
])
def test_malformed_trees(parents, tokens, msg):
    with pytest.raises(TreeError, match=msg):
        Tree(parents, tokens)
    assert issubclass(TreeError, ValueError)


def test_relabel_rejects_non_topological_order():
    t = Tree([-1, 0, 1], [0, 1, 2])
    with pytest.raises(TreeError, match="before its parent"):
        t.relabel([0, 2, 1])
    with pytest.raises(TreeError, match="permutation"):
        t.relabel([0, 1, 1])


@pytest.mark.parametrize("build, kw, msg", [
    ("ddtree", dict(topk_cap=True), "topk_cap: expected an integer >= 1 or None, got True"),
    ("ddtree", dict(root_token=True), "root_token: expected an integer >= 0, got True"),
    ("ddtree", dict(root_token=-1), "root_token: expected an integer >= 0, got -1"),
    ("ddtree", dict(budget=np.bool_(True)), "budget: expected an integer >= 0"),
    ("static", dict(root_token=2.0), "root_token: expected an integer >= 0, got 2.0"),
    ("random", dict(size=True), "size: expected an integer >= 1, got True"),
    ("random", dict(size=3.0), "size: expected an integer >= 1, got 3.0"),
    ("random", dict(vocab=True), "vocab: expected an integer >= 1, got True"),
    ("random", dict(max_children=0), "max_children: expected an integer >= 1, got 0"),
    ("random", dict(root_token=torch.tensor(True)), "root_token: expected an integer >= 0"),
])
def test_tree_builders_refuse_a_bool_or_fraction_for_a_count_or_token(build, kw, msg):
    """ddtree, static_tree and random_tree took True as 1 (a budget, a cap, a size, a root token), a float size as a
    TypeError, a negative root token as given and max_children 0 as no cap; each is one line naming it now. Integers
    of numpy or 0-d integer tensors stay integers."""
    x = torch.zeros(2, 3)
    call = {"ddtree": lambda **k: ddtree(x, **{"budget": 3, **k}),
            "static": lambda **k: static_tree([[0]], x, **k),
            "random": lambda **k: random_tree(**{"size": 3, "vocab": 3, "rng": np.random.default_rng(0), **k})}[build]
    with pytest.raises(InputError, match=msg):
        call(**kw)
    assert ddtree(x, torch.tensor(3), root_token=np.int32(5)).tokens[0] == 5
    assert random_tree(np.int64(3), vocab=3, rng=np.random.default_rng(0), root_token=torch.tensor(2)).tokens[0] == 2


@pytest.mark.parametrize("kw, msg", [(dict(budget=True), "budget: expected an integer >= 0, got True"),
                                     (dict(budget=2.0), "budget: expected an integer >= 0"),
                                     (dict(topk_cap=0), "topk_cap: expected None or an integer >= 1, got 0"),
                                     (dict(topk_cap=True), "topk_cap: expected None or an integer >= 1"),
                                     (dict(kind="chain", topk_cap=2.5), "topk_cap: expected None or an integer")])
def test_a_tree_policy_refuses_a_bool_or_fraction_before_any_tree(kw, msg):
    """TreePolicy built in code: True was taken as budget 1 (Python's bool is an int) and topk_cap 0 as no cap."""
    from ddsim.sim.generate import TreePolicy
    with pytest.raises(InputError, match=msg):
        TreePolicy(**kw)


def test_builder_bad_input():
    with pytest.raises(InputError, match="budget"):
        ddtree(torch.zeros(2, 3), -1)
    with pytest.raises(InputError, match="draft_logits: non-finite"):
        ddtree(torch.tensor([[0.0, float("nan")]]), 2)
    for bad in (float("inf"), -float("inf")):  # the finite-sum check: each infinity, and both (a NaN sum)
        x = torch.zeros(2, 4)
        x[1, 2] = bad
        with pytest.raises(InputError, match="non-finite value at depth row 1, token 2"):
            ddtree(x, 2)
        x[0, 3] = -bad
        with pytest.raises(InputError, match="non-finite value at depth row 0, token 3"):
            ddtree(x, 2)
    # finite logits whose float32 sum overflows are finite all the same
    assert ddtree(torch.tensor([[3e38, 3e38, 0.0]]), 2, root_token=1).size == 3
    with pytest.raises(InputError, match="draft_logits: expected shape"):
        ddtree(torch.zeros(2, 3, 4), 2)
    # one token and one child per node still fits a chain; a tree of no nodes does not
    assert random_tree(5, vocab=1, rng=np.random.default_rng(0), max_children=1).size == 5
    with pytest.raises(InputError, match="size"):
        random_tree(0, vocab=3, rng=np.random.default_rng(0))


def test_config_errors():
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        get_preset("micro").replace(linear_num_value_heads=3, linear_num_key_heads=2)
    with pytest.raises(ConfigError, match="layer_pattern"):
        get_preset("micro").replace(layer_pattern="ggx")
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        get_preset("nope")
    with pytest.raises(ConfigError, match="unknown field"):
        ModelConfig.from_dict({**get_preset("micro").to_dict(), "bogus": 1})


@pytest.mark.parametrize("field, value, msg", [
    ("num_experts", True, "num_experts: expected an integer >= 0, got True"),
    ("moe_intermediate_size", 2.0, "moe_intermediate_size: expected an integer >= 0"),
    ("mla_kv_lora_rank", -1, "mla_kv_lora_rank: expected an integer >= 0"),
    ("num_experts_per_tok", False, "num_experts_per_tok: expected an integer >= 0"),
    ("decoder_sparse_step", 0, "decoder_sparse_step: expected a positive integer"),  # (i + 1) % 0 in is_moe_layer
    ("moe_n_group", True, "moe_n_group: expected a positive integer"),
    ("mlp_only_layers", (0, True), "mlp_only_layers: expected layer indices"),
    ("mlp_only_layers", (-1,), "mlp_only_layers: expected layer indices"),
])
def test_a_config_built_in_code_refuses_a_bool_or_fraction_for_a_count(field, value, msg):
    """The MoE and MLA sizes a config built in code gives (config.json's are refused before, checkpoint.INTEGER_FIELDS):
    a bool, a fraction or a negative count is one line naming the field, as the dense sizes' are."""
    with pytest.raises(ConfigError, match=msg):
        get_preset("micro").replace(**{field: value})


def _gdn_args(B=1, T=3, H=1, HV=2, K=4, V=4):
    return dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, HV, V),
                g=-torch.rand(B, T, HV), beta=torch.rand(B, T, HV),
                parents=torch.tensor([[-1, 0, 0]] * B), initial_state=torch.zeros(B, HV, K, V))


@pytest.mark.parametrize("impl", [gb.gdn_tree_verify, oracle.gdn_tree_verify], ids=["torch", "oracle"])
@pytest.mark.parametrize("change, msg", [
    (dict(q=torch.randn(1, 3, 2, 4), k=torch.randn(1, 3, 2, 4), v=torch.randn(1, 3, 3, 4), g=-torch.rand(1, 3, 3),
          beta=torch.rand(1, 3, 3)), "HV=3 value heads is not a multiple of H=2"),
    (dict(g=torch.zeros(1, 3, 5)), "g: expected"),
    (dict(initial_state=torch.zeros(1, 2, 4, 5)), "initial_state"),
    (dict(parents=torch.tensor([[-1, 0, 2]])), "parents: sequence 0 node 2"),
    (dict(parents=torch.tensor([[0, 0, 0]])), "parents: sequence 0 node 0"),
    (dict(k=torch.randn(1, 3, 1, 5)), "q, k"),
    (dict(mode="sideways"), "mode"),
])
def test_gdn_bad_input(impl, change, msg):
    args = {**_gdn_args(), **change}
    with pytest.raises(ValueError, match=msg):
        impl(**{k: args.pop(k) for k in ("q", "k", "v", "g", "beta")}, **args)


@pytest.mark.parametrize("commit", [oracle.gdn_tree_commit, oracle.kda_tree_commit, oracle.lightning_tree_commit],
                         ids=["gdn", "kda", "lightning"])
def test_the_oracles_commits_name_k_alone(commit):
    """A commit takes no q: a k of the wrong rank is named as k, not as "q, k"."""
    k, v = torch.randn(1, 3, 4), torch.randn(1, 3, 1, 4)
    kw = dict(decay=torch.ones(1)) if commit is oracle.lightning_tree_commit else \
        dict(g=-torch.rand(1, 3, 1, 4) if commit is oracle.kda_tree_commit else -torch.rand(1, 3, 1), beta=torch.rand(1, 3, 1))
    with pytest.raises(ValueError, match=r"^k: expected \[B, T, H, K\], got \(1, 3, 4\)$"):
        commit(k=k, v=v, **kw, parents=torch.tensor([[-1, 0, 0]]), accepted=[2], initial_state=torch.zeros(1, 1, 4, 4))


def test_torch_path_rejects_float_parents_and_int_inputs():
    args = _gdn_args()
    with pytest.raises(ValueError, match="parents: expected an integer"):
        gb.gdn_tree_verify(**{**args, "parents": torch.tensor([[-1.0, 0.0, 0.0]])})
    with pytest.raises(ValueError, match="q: expected a floating"):
        gb.gdn_tree_verify(**{**args, "q": torch.ones(1, 3, 1, 4, dtype=torch.int64)})


def test_conv_bad_input():
    x = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="weight"):
        gb.tree_causal_conv1d(x, weight=torch.randn(5, 4), parents=[[-1, 0, 1]], initial_window=torch.zeros(1, 4, 3))
    with pytest.raises(ValueError, match="initial_window"):
        gb.tree_causal_conv1d(x, weight=torch.randn(4, 4), parents=[[-1, 0, 1]], initial_window=torch.zeros(1, 4, 2))
    with pytest.raises(ValueError, match="accepted"):
        gb.conv_tree_commit(x, parents=[[-1, 0, 1]], accepted=[3], initial_window=torch.zeros(1, 4, 3))


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_conv_bias_is_held_to_its_channels_and_a_strided_one_read_as_its_values(backend):
    """A bias of [1] was broadcast over the channels by the torch path and read past its end by the Triton kernel (other
    memory taken as a channel's bias); a strided bias, a view of a wider parameter, was read by the kernel as if
    contiguous (another entry's value). Now the first is refused in one line on either backend, and the second gives
    the torch path's output; integer weights and a commit's windows of another batch are refused too."""
    torch.manual_seed(0)
    x, w, win, tree = torch.randn(2, 3, 4), torch.randn(4, 4), torch.randn(2, 4, 3), [[-1, 0, 0], [-1, 0, 1]]
    wide = torch.randn(8)
    want = oracle.tree_causal_conv1d(x.double(), weight=w.double(), bias=wide[::2].double(), parents=tree,
                                     initial_window=win.double())
    got = gb.tree_causal_conv1d(x, weight=w, bias=wide[::2], parents=tree, initial_window=win, backend=backend)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    for kw, needle in ((dict(bias=wide[:1]), r"^bias: expected \[C\] = \(4,\), got \(1,\)$"),
                       (dict(bias=wide[:4].long()), r"^bias: expected a floating dtype, got torch.int64$"),
                       (dict(weight=w.long()), r"^weight: expected a floating dtype, got torch.int64$"),
                       (dict(bias=wide[:4].numpy()), r"^bias: expected a torch.Tensor, got ndarray$")):
        with pytest.raises(ValueError, match=needle):
            gb.tree_causal_conv1d(x, **{"weight": w, **kw}, parents=tree, initial_window=win, backend=backend)
    want = r"\[N, C, W-1\] = \[N, 4, 3\]" if backend == "triton" else r"\[B, C, W-1\] = \(2, 4, 3\)"
    for kw, needle in ((dict(x=x[0]), r"^x: expected \[B, T, C\], got \(3, 4\)$"),
                       (dict(activation="relu"), r"^activation: expected 'silu' or None, got 'relu'$"),
                       (dict(x=x.numpy()), r"^x: expected a torch.Tensor, got ndarray$"),
                       (dict(initial_window=win.numpy()), r"^initial_window: expected a torch.Tensor, got ndarray$"),
                       (dict(initial_window=win[..., :2]), rf"^initial_window: expected {want}, got \(2, 4, 2\)$"),
                       *(() if backend == "triton" else  # (a pool of one row for two sequences: its slots' check)
                         ((dict(initial_window=win[:1]), r"^initial_window: expected \[B, C, W-1\] = \(2, 4, 3\), "
                                                         r"got \(1, 4, 3\)$"),))):
        with pytest.raises(ValueError, match=needle):
            gb.tree_causal_conv1d(**{"x": x, "weight": w, "parents": tree, "initial_window": win, **kw}, backend=backend)
    lead = "N" if backend == "triton" else "2"  # (the Triton commit reads a pool, the torch one the batch's windows)
    with pytest.raises(ValueError, match=rf"^initial_window: expected \[{lead}, C, W-1\] with C=4, got \(2, 5, 3\)$"):
        gb.conv_tree_commit(x, parents=tree, accepted=[1, 2], initial_window=torch.zeros(2, 5, 3), backend=backend)
    with pytest.raises(ValueError, match=r"^initial_window: expected a floating dtype, got torch.int64$"):
        gb.conv_tree_commit(x, parents=tree, accepted=[1, 2], initial_window=win.long(), backend=backend)
    committed = gb.conv_tree_commit(x, parents=tree, accepted=[1, 2], initial_window=win, backend=backend)
    assert torch.equal(committed.double(), oracle.conv_tree_commit(x.double(), parents=tree, accepted=[1, 2],
                                                                   initial_window=win.double()))
    for bad, needle in ((x.numpy(), r"^x: expected a torch.Tensor, got ndarray$"),
                        (x.long(), r"^x: expected a floating dtype, got torch.int64$"),
                        (x[0], r"^x: expected \[B, T, C\], got \(3, 4\)$")):
        with pytest.raises(ValueError, match=needle):
            gb.conv_tree_commit(bad, parents=tree, accepted=[1, 2], initial_window=win, backend=backend)
    if backend == "triton":  # a pool of other rows than the batch's, addressed by slots: its rows as given
        pool = torch.randn(5, 4, 3)
        got = gb.tree_causal_conv1d(x, weight=w, parents=tree, initial_window=pool, state_indices=torch.tensor([4, 1]),
                                    backend=backend)
        want = gb.tree_causal_conv1d(x, weight=w, parents=tree, initial_window=pool[[4, 1]], backend="torch")
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if backend == "torch":  # (the Triton commit reads a pool: its batch's rows are its slots' check)
        with pytest.raises(ValueError, match=r"^initial_window: expected \[2, C, W-1\] with C=4, got \(1, 4, 3\)$"):
            gb.conv_tree_commit(x, parents=tree, accepted=[1, 2], initial_window=win[:1], backend=backend)


_Z = torch.zeros(1)


@pytest.mark.parametrize("name, call", [
    ("B", lambda a: gb.mamba2_tree_verify(_Z, _Z, _Z, a, _Z, parents=[[-1]], initial_state=_Z, backend="torch")),
    ("dt", lambda a: gb.mamba2_tree_commit(_Z, a, _Z, _Z, parents=[[-1]], accepted=[0], initial_state=_Z,
                                           backend="torch")),
    ("A", lambda a: gb.mamba1_tree_verify(_Z, _Z, a, _Z, _Z, parents=[[-1]], initial_state=_Z, backend="torch")),
    ("initial_state", lambda a: gb.mamba1_tree_commit(_Z, _Z, _Z, _Z, parents=[[-1]], accepted=[0], initial_state=a,
                                                      backend="torch")),
    ("decay", lambda a: gb.lightning_tree_verify(_Z, _Z, _Z, decay=a, parents=[[-1]], initial_state=_Z,
                                                 backend="torch")),
    ("k", lambda a: gb.lightning_tree_commit(a, _Z, decay=_Z, parents=[[-1]], accepted=[0], initial_state=_Z,
                                             backend="torch")),
    ("g", lambda a: gb.kda_tree_verify(_Z, _Z, _Z, a, _Z, parents=[[-1]], initial_state=_Z, backend="torch")),
    ("v", lambda a: gb.gdn_tree_verify(_Z, _Z, a, _Z, _Z, parents=[[-1]], initial_state=_Z, backend="torch")),
    ("weight", lambda a: gb.tree_causal_conv1d(_Z, weight=a, parents=[[-1]], initial_window=_Z, backend="torch")),
    ("initial_window", lambda a: gb.conv_tree_commit(_Z, parents=[[-1]], accepted=[0], initial_window=a,
                                                     backend="torch")),
])
def test_a_numpy_array_for_a_tensor_is_refused_by_name(name, call):
    """Every family's entry points name a numpy array (or list) given for a tensor in one line; each failed deep
    inside as an AttributeError ('numpy.ndarray' object has no attribute 'dim')."""
    for given in (np.zeros(1), [0.0]):
        with pytest.raises(ValueError, match=rf"^{name}: expected a torch.Tensor, got {type(given).__name__}$"):
            call(given)


def test_gdn_gates_given_in_half_are_refused_by_name():
    """g without beta, or a without b, is refused in one line naming what is missing, on either backend's check."""
    args = _gdn_args()
    g, beta = args.pop("g"), args.pop("beta")
    with pytest.raises(ValueError, match=r"^beta: required with g$"):
        gb.gdn_tree_verify(**args, g=g, beta=None)
    for half in (dict(a=g), dict(b=beta)):
        with pytest.raises(ValueError, match=r"^gates: pass g and beta, or all of a, b, A_log and dt_bias$"):
            gb.gdn_tree_verify(**args, **half, A_log=torch.zeros(2), dt_bias=torch.zeros(2))
    fused = dict(a=g, b=beta, A_log=torch.zeros(2), dt_bias=torch.zeros(2))  # called directly, not through engine_api
    for name, bad in (("A_log", np.zeros(2)), ("dt_bias", [0.0, 0.0])):
        with pytest.raises(ValueError, match=rf"^{name}: expected a torch.Tensor, got {type(bad).__name__}$"):
            gb.gdn_tree_verify(**args, **{**fused, name: bad})


@pytest.mark.parametrize("line, needle", [
    ('{"tokens": [3], "extra": 1}', "got the keys ['extra', 'tokens']"),
    ('{"tokens": [3], "text": "a"}', "got the keys ['text', 'tokens']"),  # (the tokens won)
    ('{"text": "a", "chta": true}', "got the keys ['chta', 'text']"),  # (dropped: the prompt went without its template)
    ('{"text": "a", "chat": "false"}', "'chat' must be true or false, got 'false'"),  # (bool("false") is True)
])
def test_a_prompt_record_of_another_shape_is_one_line(tmp_path, line, needle):
    from ddsim.model.prompts import load_prompts
    p = tmp_path / "p.jsonl"
    p.write_text('{"tokens": [1, 2]}\n' + line + "\n")
    with pytest.raises(InputError, match=re.escape("p.jsonl:2: ") + ".*" + re.escape(needle)):
        load_prompts(p, 64)


def test_model_rejects_out_of_range_tokens_and_positions():
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    st = m.empty_state()
    with pytest.raises(InputError, match="outside the vocabulary"):
        m.verify(st, Tree([-1, 0], [0, cfg.vocab_size]))
    st.pos = cfg.max_position_embeddings - 1
    with pytest.raises(InputError, match="positions"):
        m.verify(st, Tree([-1, 0], [0, 1]))
    with pytest.raises(InputError, match="mode"):
        m.verify(m.empty_state(), Tree([-1], [0]), mode="fast")


def test_triton_window_slots_are_checked():
    from ddsim.gpu_backend import _common as C
    win = torch.zeros(3, 4, 3)
    assert C.window_slots(win, [2, 0], 2).tolist() == [2, 0]
    with pytest.raises(ValueError, match="3 windows for 2 sequences"):
        C.window_slots(win, None, 2)
    with pytest.raises(ValueError, match="state_indices: slots must lie in 0..2"):
        C.window_slots(win, [0, 3], 2)
    with pytest.raises(ValueError, match="state_indices: slots must be distinct"):
        C.window_slots(win, [1, 1], 2)
