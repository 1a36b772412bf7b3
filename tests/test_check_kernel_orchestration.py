"""check-kernel's orchestration in process, on ddsim's torch path (about a second each): the explicit
examples before the drawn ones, a serving-only bug reported by its example, a bug drawn inputs reach
shrunk, the leaky mode's leak, a kernel that raises, conv and Mamba2, the profiles. Kept apart from
tests/test_verdict_chain.py so that mutation testing of the property chain stays fast (each of these
re-runs the quick profile)."""
import pytest

from ddsim.engines import check_kernel as ck


def _load(name):
    from ddsim.engines import load
    return load(name, convention="ddsim") if ":" in name else load(name)


def test_check_holds_on_ddsims_kernel_with_its_coverage():
    res = ck.check(_load("ddsim"), mode="exact", max_examples=2)
    assert res.profile == "quick" and res.examples == 8 and len(res.properties) == 7
    assert all(r.holds for r in res) and all(r.counterexample is None for r in res)
    assert res.properties[-1].detail == "held on 8 serving examples (quick) and 2 drawn inputs"
    cov = res.coverage
    assert max(cov["nodes"]) == 129 and max(cov["K"]) == 128 and max(cov["batch"]) == 8 and max(cov["HV/H"]) == 8
    assert cov["g min"] < -29 and cov["beta min"] == 0.0 and cov["beta max"] == 1.0 and max(cov["calls"]) == 24
    assert cov["dtype"] == ["bfloat16", "float16", "float32"] and "drawn" in cov["tree"]
    assert cov["not order-exact nodes total"] > 150


def test_check_reports_a_serving_only_bug_by_its_example():
    res = ck.check(_load("tests.planted_kernels:wrong_past_16_nodes"), mode="exact", max_examples=2)
    bad = [r for r in res if not r.holds]
    assert [r.name for r in bad] == ["exact on every node"]
    ce = bad[0].counterexample
    assert ce["example"].startswith("ddtree budget 16 top-k 8 T=17") and ce["first_wrong_node"]["node"] == 16
    assert bad[0].detail.startswith(f"serving example [{ce['example']}]: first wrong node 16 of sequence 0")


def test_check_shrinks_a_bug_drawn_inputs_reach_too():
    res = ck.check(_load("tests.planted_kernels:parent_off_by_one"), mode="exact", max_examples=30)
    ce = next(r for r in res if r.name == "exact on every node").counterexample
    assert ce["example"] == "drawn" and ce["first_wrong_node"]["node"] == 2 and "serving_example" in ce
    assert ce["shapes"]["T"] <= 4  # shrunk


def test_check_in_leaky_mode_needs_the_leak():
    res = {r.name: r for r in ck.check(_load("tests.planted_kernels:exact_calling_itself_leaky"), mode="leaky",
                                       max_examples=2)}
    assert list(res)[-2:] == ["flattened semantics on every node", "leaks off order-exact nodes"]
    assert not res["flattened semantics on every node"].holds and not res["leaks off order-exact nodes"].holds
    assert res["exact on order-exact nodes"].holds
    ok = {r.name: r for r in ck.check(_load("ddsim"), mode="leaky", max_examples=2)}
    assert all(r.holds for r in ok.values()) and ok["leaks off order-exact nodes"].detail.startswith("e.g. serving example")


def test_a_kernel_that_raises_fails_every_property(tmp_path, monkeypatch):
    from ddsim.engines import EngineKernel

    def refuses_wide(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale):
        if q.shape[1] > 64:
            raise ValueError("T > 64 not supported")
        return _load("ddsim").verify(q, k, v, g, beta, parents=parents, state_pool=state_pool, slots=slots, mode=mode,
                                     scale=scale)
    res = ck.check(EngineKernel("refuses", ("exact",), refuses_wide), mode="exact", max_examples=2)
    assert not any(r.holds for r in res)
    assert res.properties[0].detail.startswith("serving example [ddtree budget 128 top-k 4 T=129") and \
        "the kernel raised ValueError: T > 64 not supported" in res.properties[0].detail


def test_check_conv_and_mamba2_and_bad_profiles():
    conv = ck.check(_load("ddsim"), mode="exact", max_examples=2, op="conv")
    assert all(r.holds for r in conv) and [r.name for r in conv][3] == "committed window untouched"
    assert 1024 in conv.coverage["C"] and conv.coverage["W"] == [2, 3, 4, 5]
    m2 = ck.check(_load("ddsim"), mode="exact", max_examples=2, op="mamba2")
    assert all(r.holds for r in m2) and max(m2.coverage["P"]) == 64 and max(m2.coverage["N"]) == 128
    bad = ck.check(_load("tests.planted_kernels:mamba2_forgets_dt_bias"), mode="exact", max_examples=2, op="mamba2")
    assert {r.name for r in bad if not r.holds} == {"exact on order-exact nodes", "exact on every node"}
    # a write to a positional input (x) is seen as a write to the kernel's arguments
    bad = ck.check(_load("tests.planted_kernels:mamba2_writes_x_in_place"), mode="exact", max_examples=2, op="mamba2")
    assert {r.name for r in bad if not r.holds} == {"inputs untouched"}
    from ddsim.errors import InputError
    with pytest.raises(InputError, match="--profile: expected one of quick, serving"):
        ck.check(_load("ddsim"), mode="exact", profile="huge")
    assert ck.default_profile("cuda:0") == "serving" and ck.default_profile("cpu") == "quick"


@pytest.mark.parametrize("op, want", [
    ("gdn", [dict(batch=8, nodes=65, HV=48, **{"HV/H": 3}, K=128, V=128), dict(batch=32, nodes=17, HV=48, K=128, V=128)]),
    ("kda", [dict(batch=8, nodes=33, H=32, K=128, V=128)]),
    ("lightning", [dict(batch=8, nodes=33, H=64, K=128, V=128)]),
    ("mamba2", [dict(batch=8, nodes=33, H=128, P=64, N=128, **{"H/G": 16})]),
    ("conv", [dict(batch=8, nodes=65, C=10240)]),
])
def test_the_serving_profile_runs_a_models_layer_with_every_dimension_at_once(op, want):
    """Each op's serving profile holds an example with every dimension at a model's serving size together (an
    engine may choose another configuration or grid only there), and the coverage names its head count."""
    from ddsim.engines import kernel_cases as kc
    seen = [kc.describe(c) for c in kc.cases(op, "serving")]
    for w in want:
        assert any(all(d.get(k) == v for k, v in w.items()) for d in seen), (op, w)
    assert not any(d["batch"] >= 8 and (d.get("HV") == 48 or d.get("H", 0) >= 32) for d in
                   (kc.describe(c) for c in kc.cases(op, "quick"))), "the quick profile stays sized for the interpreter"


def test_the_interpreters_cached_builtin_patching_patches_what_the_original_does():
    """ddsim.engines.triton_interpret.cache_builtin_names: for every module the interpreter patches at a launch,
    the cached version sets exactly the attributes the original sets, to wrappers of the same members, and the
    scope restores them."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    from ddsim.engines.triton_interpret import cache_builtin_names
    assert cache_builtin_names()
    cached = interpreter._patch_builtin
    assert cached._ddsim_cached

    def original(pkg, builder, scope):  # Triton's own, as written in triton/runtime/interpreter.py
        for name, member in inspect.getmembers(pkg):
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)
    for pkg in (tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        attrs = lambda: {k: v for k, v in vars(pkg).items() if not k.startswith("__")}  # noqa: E731
        before = attrs()  # (getmembers may create a class's __annotations__)
        seen = []
        for fn in (original, cached, cached):  # the second cached call reads the listed names
            scope = interpreter._LangPatchScope()
            fn(pkg, None, scope)
            seen.append(sorted((name, id(getattr(pkg, name).__kwdefaults__["member"])) for _, name, _ in scope._changes))
            scope.restore()
            assert attrs() == before
        assert seen[0] == seen[1] == seen[2] and seen[0]
