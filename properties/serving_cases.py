"""The recurrent families at their models' serving shapes (no tests here: properties/test_serving_shapes.py
runs them, benchmarks/serving_shape_margins.py prints how far inside its bars each case lies): each family's shapes,
inputs and calls, and the checks of a verify and a commit against the float64 oracle on sampled heads or channels.
The bars and the sampling are described in the test file."""

from __future__ import annotations

import random

import numpy as np
import torch

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.bench.bench import ddtree_batch
from ddsim.engines.check_kernel import _bits
from ddsim.engines.kernel_cases import _pool as pool_of
from ddsim.engines.kernel_cases import split_views
from ddsim.gpu_backend.checks import TreePlan, checked_accepted, checked_slots
from ddsim.measure.compare import assert_close, rel_error
from ddsim.properties.kernel_checks import DEVICE, on_device

# the share of bf16 outputs off the correctly rounded oracle a kernel may move (test_triton_kernels.OFF_ROUNDED_MAX)
OFF_ROUNDED_MAX = 0.02
# fp32 states: within this multiple of float32's tolerance (ddsim.measure.compare), as the property suites hold them
STATE_SLACK = 5
BF16 = torch.bfloat16
# Triton's interpreter casts fp32 to bf16 by dropping the low bits (toward zero), a compiled kernel to nearest: there
# every Triton output is half the time an ulp off the oracle rounded to nearest, and the bar takes it truncated
TRUNCATES = DEVICE == "cpu"


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _rand(gen, *shape):
    return torch.rand(*shape, generator=gen)


class Family:
    """One family's shapes, inputs and calls. ``verify``/``commit`` name the op in ddsim.gpu_backend and its twin in
    ddsim.oracle (one signature); ``args``/``commit_args`` their positional tensors; ``unit_dim`` the dimension of
    each input that holds the units (heads, or Mamba1's channels) the oracle samples; ``grouped`` the inputs indexed
    by a unit's group along dimension 2 (GDN's key heads, Mamba2's B and C groups), ``groups`` the dims' key that
    counts them; ``tile`` the kernels' tile along the units (the sample brackets its first edge); ``pooled``: the
    committed states in a pool (``pool``, ``slots``: _pool), read through state_indices and committed in place."""
    name: str
    serving: dict
    small: dict
    units: str  # the key of the dims that counts the units
    tile = 1
    sample = 6
    verify: str
    commit: str
    args: tuple
    commit_args: tuple
    unit_dim: dict
    grouped: tuple = ()
    groups = ""
    designs: tuple  # the verify backends: "triton" (the default's choice) first
    pooled = False
    padded = False  # the batch padded as a CUDA-graph replay pads it: its last rows slot -1 (_pool)
    split: tuple = ()  # the inputs handed over as views of one fused projection, made on the device (_case)

    def inputs(self, B: int, T: int, d: dict, gen) -> dict:
        raise NotImplementedError

    def take(self, inp: dict, idx: torch.Tensor, d: dict) -> dict:
        """The inputs of the units ``idx`` alone (the oracle's), each sampled unit given its own group."""
        group = idx // (d[self.units] // d[self.groups]) if self.grouped else None
        out = {}
        for k, v in inp.items():
            if k in self.unit_dim:
                out[k] = v.index_select(self.unit_dim[k], idx)
            elif k in self.grouped:
                out[k] = v.index_select(2, group)
            elif k not in ("pool", "slots"):
                out[k] = v
        if self.pooled:  # a padded row (slot -1) starts from a zero state
            slots = inp["slots"].long()
            states = inp["pool"][slots.clamp(min=0)]
            states[slots < 0] = 0.0
            out["initial_state"] = states.index_select(1, idx)
        return self.to_oracle(out)

    def to_oracle(self, part: dict) -> dict:
        """The sampled inputs as the oracle takes them (where the fast path takes others)."""
        return part

    def state_of(self, inp: dict) -> dict:
        """The committed states as the fast path takes them."""
        if not self.pooled:
            return dict(initial_state=inp["initial_state"])
        pool, slots = inp["pool"], inp["slots"]
        return dict(initial_state=pool, state_indices=checked_slots(slots, pool.shape[0], len(slots), pool.device,
                                                                    pad=self.padded))


def _pool(B: int, shape: tuple, gen, pad: int = 0) -> dict:
    """A pool of 2B + 3 states of ``shape``, the batch's in shuffled slots (one in the last), every other slot NaN
    (check-kernel's pool of kind "last"); the last ``pad`` rows of the batch padding (slot -1, no state in the pool)."""
    rng = np.random.default_rng(int(torch.randint(2 ** 31, (1,), generator=gen)))
    pool, slots = pool_of(_randn(gen, B, *shape), "last", 2 * B + 3, rng, pad)
    return dict(pool=pool, slots=slots)


class GDN(Family):
    name, units, groups = "gdn", "HV", "H"
    serving = dict(H=16, HV=48, K=128, V=128)  # Qwen3.6-27B
    small = dict(H=2, HV=4, K=16, V=8)
    verify, commit = "gdn_tree_verify", "gdn_tree_commit"
    args, commit_args = ("q", "k", "v", "g", "beta"), ("k", "v", "g", "beta")
    unit_dim = dict(v=2, g=2, beta=2)
    grouped = ("q", "k")
    designs = ("triton", "triton-recurrent", "triton-wy-fused", "triton-wy-split", "triton-wy-fold", "triton-wy-head")
    pooled = True

    def inputs(self, B, T, d, gen):
        H, HV, K, V = d["H"], d["HV"], d["K"], d["V"]
        pad = B // 4 + 1 if self.padded and B > 1 else 0
        return dict(q=_randn(gen, B, T, H, K).to(BF16), k=_randn(gen, B, T, H, K).to(BF16),
                    v=_randn(gen, B, T, HV, V).to(BF16), g=-_rand(gen, B, T, HV) * 0.3, beta=_rand(gen, B, T, HV),
                    **_pool(B, (HV, K, V), gen, pad))


class GDNPadded(GDN):
    """GDN in a batch padded as SGLang pads a CUDA-graph replay's (engine_api.plan_slots): its last B // 4 + 1 rows
    slot -1 (PAD_SLOT_ID), no state of theirs in the pool. A padded row verifies and commits from a zero state (the
    oracle's too), and no slot is read or written for it, through every design."""
    name = "gdn-padded"
    padded = True


class GDNGates(GDN):
    """GDN with its gates fused into the kernels, as SGLang calls them (engine_api): the raw projections a, b (bf16)
    with A_log and dt_bias [HV]; the oracle takes the gates they make, in float64 (g = -exp(A_log) softplus(a +
    dt_bias), beta = sigmoid(b), as the model's layer makes them). q, k and v come as SGLang's layer hands them over
    too: views of one fused projection, each token's row strided by its width (kernel_cases.split_views), which the
    kernels read in place."""
    name = "gdn-gates"
    split = ("q", "k", "v")
    args, commit_args = ("q", "k", "v"), ("k", "v")
    unit_dim = dict(v=2, a=2, b=2, A_log=0, dt_bias=0)
    designs = ("triton", "triton-recurrent")

    def inputs(self, B, T, d, gen):
        inp = super().inputs(B, T, d, gen)
        del inp["g"], inp["beta"]
        HV = d["HV"]
        return dict(inp, a=_randn(gen, B, T, HV).to(BF16), b=_randn(gen, B, T, HV).to(BF16),
                    A_log=torch.log(_rand(gen, HV) * 15 + 1), dt_bias=_rand(gen, HV) * 2.3 - 4.6)

    def to_oracle(self, part):
        out = {k: v for k, v in part.items() if k not in ("a", "b", "A_log", "dt_bias")}
        a, b, A_log, dt_bias = (part[k].double() for k in ("a", "b", "A_log", "dt_bias"))
        out["g"] = -torch.exp(A_log) * torch.nn.functional.softplus(a + dt_bias)
        out["beta"] = torch.sigmoid(b)
        return out


class KDA(Family):
    name, units = "kda", "H"
    serving = dict(H=32, K=128, V=128)  # Kimi-Linear-48B-A3B
    small = dict(H=3, K=16, V=8)
    verify, commit = "kda_tree_verify", "kda_tree_commit"
    args, commit_args = ("q", "k", "v", "g", "beta"), ("k", "v", "g", "beta")
    unit_dim = dict(q=2, k=2, v=2, g=2, beta=2, initial_state=1)
    designs = ("triton", "triton-wy", "triton-recurrent")

    def inputs(self, B, T, d, gen):
        H, K, V = d["H"], d["K"], d["V"]
        return dict(q=_randn(gen, B, T, H, K).to(BF16), k=_randn(gen, B, T, H, K).to(BF16),
                    v=_randn(gen, B, T, H, V).to(BF16), g=-_rand(gen, B, T, H, K) * 0.5, beta=_rand(gen, B, T, H),
                    initial_state=_randn(gen, B, H, K, V) * 0.1)


class Lightning(Family):
    name, units = "lightning", "H"
    serving = dict(H=64, K=128, V=128)  # MiniMax-Text-01
    small = dict(H=3, K=16, V=8)
    verify, commit = "lightning_tree_verify", "lightning_tree_commit"
    args, commit_args = ("q", "k", "v"), ("k", "v")
    unit_dim = dict(q=2, k=2, v=2, decay=0, initial_state=1)
    designs = ("triton", "triton-recurrent")

    def inputs(self, B, T, d, gen):
        H, K, V = d["H"], d["K"], d["V"]
        slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1) / H)  # MiniMax's per-head rates (ALiBi's): decays 0.4 .. 0.996
        return dict(q=(_randn(gen, B, T, H, K) * 0.1).to(BF16), k=(_randn(gen, B, T, H, K) * 0.1).to(BF16),
                    v=_randn(gen, B, T, H, V).to(BF16), decay=torch.exp(-slopes), initial_state=_randn(gen, B, H, K, V))


class Mamba1(Family):
    name, units = "mamba1", "I"
    serving = dict(I=8192, N=16)  # Jamba Mini 1.6
    small = dict(I=70, N=16)  # two of the kernel's 64-channel tiles, the second partial
    tile, sample = 64, 24
    verify, commit = "mamba1_tree_verify", "mamba1_tree_commit"
    args, commit_args = ("x", "dt", "A", "B", "C"), ("x", "dt", "A", "B")
    unit_dim = dict(x=2, dt=2, A=0, D=0, dt_bias=0, initial_state=1)
    designs = ("triton",)

    def inputs(self, B, T, d, gen):
        I, N = d["I"], d["N"]
        A = -torch.arange(1, N + 1, dtype=torch.float32).expand(I, N) * torch.exp(_randn(gen, I, 1) * 0.3)  # S4D-real
        return dict(x=_randn(gen, B, T, I).to(BF16), dt=_randn(gen, B, T, I).to(BF16), A=A.contiguous(),
                    B=_randn(gen, B, T, N).to(BF16), C=_randn(gen, B, T, N).to(BF16), D=_randn(gen, I),
                    dt_bias=_rand(gen, I) * 2.3 - 4.6,  # softplus: steps of 0.01 .. 0.1
                    initial_state=_randn(gen, B, I, N))


class Mamba2(Family):
    name, units = "mamba2", "H"
    serving = dict(H=128, P=64, N=128, G=8)  # Nemotron-H-8B
    small = dict(H=4, P=8, N=16, G=2)
    verify, commit = "mamba2_tree_verify", "mamba2_tree_commit"
    args, commit_args = ("x", "dt", "A", "B", "C"), ("x", "dt", "A", "B")
    unit_dim = dict(x=2, dt=2, A=0, D=0, dt_bias=0)
    grouped, groups = ("B", "C"), "G"
    designs = ("triton", "triton-recurrent")
    pooled = True

    def inputs(self, B, T, d, gen):
        H, P, N, G = d["H"], d["P"], d["N"], d["G"]
        return dict(x=_randn(gen, B, T, H, P).to(BF16), dt=_randn(gen, B, T, H).to(BF16), A=-torch.exp(_rand(gen, H) * 2.7),
                    B=_randn(gen, B, T, G, N).to(BF16), C=_randn(gen, B, T, G, N).to(BF16), D=_randn(gen, H),
                    dt_bias=_rand(gen, H) * 2.3 - 4.6, dt_limit=(0.001, float("inf")), **_pool(B, (H, P, N), gen))


FAMILIES = {f.name: f for f in (GDN(), GDNGates(), GDNPadded(), KDA(), Lightning(), Mamba1(), Mamba2())}


def _sampled(fam: Family, d: dict, seed: int) -> torch.Tensor:
    """The units the oracle recomputes: the first and the last, both sides of the middle and of the first tile's
    edge, and draws up to fam.sample (all of them where there are no more)."""
    n = d[fam.units]
    if n <= fam.sample:
        return torch.arange(n)
    fixed = {0, fam.tile - 1, fam.tile, n // 2 - 1, n // 2, n - 1} & set(range(n))
    rest = random.Random(seed).sample(sorted(set(range(n)) - fixed), fam.sample - len(fixed))
    return torch.tensor(sorted(fixed | set(rest)))


def _extra(fam: Family, inp: dict, *, commit: bool = False) -> dict:
    """The op's keyword tensors and options beside its positional ones and the states (a commit takes no q, C or D:
    it emits nothing)."""
    drop = set(fam.args) | {"initial_state", "pool", "slots"} | ({"D"} if commit else set())
    return {k: v for k, v in inp.items() if k not in drop}


def _to_bf16(ref: torch.Tensor) -> torch.Tensor:
    """The oracle's output as the kernel's cast gives it: to nearest compiled, toward zero in the interpreter."""
    if not TRUNCATES:
        return ref.to(BF16)
    return (ref.float().contiguous().view(torch.int32) & -65536).view(torch.float32).to(BF16)


def _assert_bf16_bar(name: str, o: torch.Tensor, ref: torch.Tensor) -> dict:
    """A bf16 output [.., sampled units, ..] against the float64 oracle's; returns its error over the cast's and the
    share of its entries off the oracle cast."""
    assert o.dtype == BF16 and o.shape == ref.shape, (name, o.dtype, tuple(o.shape), tuple(ref.shape))
    cast = _to_bf16(ref)
    rounding, err = rel_error(cast, ref), rel_error(o, ref)
    assert err <= 1.01 * rounding, f"{name}: relative error {err:.3e}, the cast's {rounding:.3e}"
    off = (o != cast).double().mean().item()
    assert off <= OFF_ROUNDED_MAX, f"{name}: {off:.2%} of the entries off the oracle cast to bf16"
    return dict(err_over_cast=err / rounding, off=off)


def _snapshot(dev: dict) -> dict:
    """The bits of every tensor of a call's inputs (the committed states among them)."""
    return {k: _bits(v).clone() for k, v in dev.items() if torch.is_tensor(v)}


def _assert_unchanged(dev: dict, before: dict, call: str) -> None:
    for k, bits in before.items():
        assert torch.equal(_bits(dev[k]), bits), f"{k} written by the {call}"


def _case(fam: Family, B: int, T: int, dims: str, seed: int):
    d = getattr(fam, dims)
    trees, parents = ddtree_batch(B, T, seed=seed)
    inp = fam.inputs(B, T, d, torch.Generator().manual_seed(seed))
    dev = on_device(inp)
    if fam.split:  # each view's own copy to the device would be contiguous: the views are made there
        dev.update(split_views({n: dev[n] for n in fam.split}))
    return d, trees, parents, inp, dev, TreePlan(parents, device=DEVICE)


def check_verify(fam: Family, B: int, T: int, *, mode: str, backend: str, states: bool, dims: str,
                 seed: int = 0) -> dict:
    """One verify at [B, T] with dims "serving" or "small" against the oracle; returns the output's figures
    (_assert_bf16_bar) and with ``states`` the per-node states' max error over its bound."""
    d, _, parents, inp, dev, plan = _case(fam, B, T, dims, seed)
    before = _snapshot(dev)
    committed = fam.state_of(dev)  # one CheckedSlots for both calls, as a step's layers share it (fastcall matches it)

    def call():
        out = getattr(gb, fam.verify)(*(dev[k] for k in fam.args), **_extra(fam, dev), **committed,
                                      parents=plan, mode=mode, output_states=states, backend=backend)
        return out if states else (out, None)
    o, st = call()
    _assert_unchanged(dev, before, "verify")
    assert bool(torch.isfinite(o).all()), "an output not written, or not finite"
    assert st is None or bool(torch.isfinite(st).all()), "a per-node state not written, or not finite"
    # a second call on the same plan and arguments, as a model's next layer makes it (on a GPU, GDN's is one fastcall
    # can replay from the first's recipe, where its extension builds)
    o2, st2 = call()
    assert torch.equal(_bits(o2), _bits(o)) and (st is None or torch.equal(_bits(st2), _bits(st))), \
        "a second call on one input differs"
    del o2, st2
    idx = _sampled(fam, d, seed)
    part = fam.take(inp, idx, d)
    ref = getattr(oracle, fam.verify)(*(part[k] for k in fam.args), **_extra(fam, part),
                                      initial_state=part["initial_state"], parents=parents, mode=mode, output_states=states)
    ref_o, ref_st = ref if states else (ref, None)
    sel = idx.to(o.device)
    figures = _assert_bf16_bar(f"{fam.name} {mode} ({backend}) output", o.index_select(2, sel).cpu(), ref_o)
    if states:
        c = assert_close(f"{fam.name} {mode} per-node states", st.index_select(2, sel).cpu(), ref_st,
                         dtype=torch.float32, slack=STATE_SLACK)
        figures["states_over_bound"] = c.max_abs / c.bound
    return figures


def _accepted(trees, T: int, seed: int) -> list[int]:
    """Each even sequence's deepest node (the longest path a step can accept), each odd one's a drawn node."""
    rng = random.Random(seed)
    return [int(np.argmax(t.depths)) if b % 2 == 0 else rng.randrange(T) for b, t in enumerate(trees)]


def check_commit(fam: Family, B: int, T: int, *, dims: str, seed: int = 0) -> dict:
    """One commit at [B, T] (each even sequence's deepest node, each odd one's a drawn node) against the oracle;
    returns the committed states' max error over its bound."""
    d, trees, parents, inp, dev, plan = _case(fam, B, T, dims, seed)
    acc = _accepted(trees, T, seed)
    idx = _sampled(fam, d, seed)
    part = fam.take(inp, idx, d)  # copies, before a commit in place (on the CPU dev's tensors are inp's)
    before = _snapshot(dev)
    states = fam.state_of(dev)
    new = getattr(gb, fam.commit)(*(dev[k] for k in fam.commit_args), **_extra(fam, dev, commit=True), **states,
                                  parents=plan, accepted=checked_accepted(acc, B, T, DEVICE),
                                  **(dict(inplace=True) if fam.pooled else {}))
    ref = getattr(oracle, fam.commit)(*(part[k] for k in fam.commit_args), **_extra(fam, part, commit=True),
                                      initial_state=part["initial_state"], parents=parents, accepted=acc)
    if fam.pooled:  # written in place into the batch's slots; every other slot bit-identical (a padded row has none)
        pool, slots = dev["pool"], dev["slots"].long()
        real = slots >= 0
        others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
        others[slots[real]] = False
        assert new is pool
        assert torch.equal(_bits(pool[others]), before.pop("pool")[others]), "a slot outside the batch written"
        new, ref = pool[slots[real]], ref[real.cpu()]
    _assert_unchanged(dev, before, "commit")
    assert bool(torch.isfinite(new).all()), "a committed state not written, or not finite"
    c = assert_close(f"{fam.name} commit", new.index_select(1, idx.to(new.device)).cpu(), ref, dtype=torch.float32,
                     slack=STATE_SLACK)
    return dict(states_over_bound=c.max_abs / c.bound)


# (B, T): the serving batches the kernel tables time, DDTree budgets 15, 16, 64, 128 and 256; leaky where its oracle
# (which replays every earlier node for each node) stays within seconds
EXACT_SHAPES = [(1, 16), (1, 17), (8, 65), (32, 65), (2, 129), (32, 129), (1, 257)]
LEAKY_SHAPES = [(1, 16), (4, 65), (1, 129), (1, 257)]
STATE_SHAPES = [("exact", 8, 65), ("leaky", 2, 65)]  # (mode, B, T) with every node's state
DESIGN_SHAPES = [(1, 16), (8, 65), (1, 257)]  # each exact design besides the default's choice
COMMIT_SHAPES = [(1, 16), (8, 65), (32, 65), (1, 257)]
