"""Every family's Triton designs refuse inputs they cannot launch on, with one line, before anything runs: CPU
tensors outside Triton's interpreter (Triton itself fails at launch on a pointer it cannot read), and inputs spread
over two devices."""
import os

import pytest
import torch

import ddsim.gpu_backend as gb
from ddsim.properties.strategies import fixed_gdn_example, fixed_mamba2_example

pytest.importorskip("triton")

GEN = torch.Generator().manual_seed(0)
B, T, H, K, V, I, N = 1, 3, 2, 4, 4, 3, 2
PARENTS = torch.tensor([[-1, 0, 0]])


def _r(*shape, neg=False):
    x = torch.randn(*shape, generator=GEN)
    return -x.abs() if neg else x


def _kda():
    return dict(q=_r(B, T, H, K), k=_r(B, T, H, K), v=_r(B, T, H, V), g=_r(B, T, H, K, neg=True),
                beta=torch.rand(B, T, H, generator=GEN), initial_state=_r(B, H, K, V))


def _lightning():
    return dict(q=_r(B, T, H, K), k=_r(B, T, H, K), v=_r(B, T, H, V), decay=torch.tensor([0.9, 0.5]),
                initial_state=_r(B, H, K, V))


def _mamba1():
    return dict(x=_r(B, T, I), dt=_r(B, T, I), A=_r(I, N, neg=True), B=_r(B, T, N), C=_r(B, T, N),
                initial_state=_r(B, I, N))


def _drop(d, *names):
    return {k: v for k, v in d.items() if k not in names}


def _gdn():
    return _drop(fixed_gdn_example(), "trees")


def _mamba2():
    return _drop(fixed_mamba2_example(), "trees", "pool", "slots")


# (name, call on a dict of inputs, the inputs, the tensor moved to another device in the mixed case)
CALLS = [
    ("kda verify, recurrent", lambda a: gb.kda_tree_verify(**a, parents=PARENTS, backend="triton-recurrent"), _kda, "g"),
    ("kda verify, wy", lambda a: gb.kda_tree_verify(**a, parents=PARENTS, backend="triton-wy"), _kda, "beta"),
    ("kda commit", lambda a: gb.kda_tree_commit(**_drop(a, "q"), parents=PARENTS, accepted=[2], backend="triton"),
     _kda, "v"),
    ("lightning verify, recurrent", lambda a: gb.lightning_tree_verify(**a, parents=PARENTS, backend="triton-recurrent"),
     _lightning, "decay"),
    ("lightning verify, masked", lambda a: gb.lightning_tree_verify(**a, parents=PARENTS, backend="triton-masked"),
     _lightning, "initial_state"),
    ("lightning commit", lambda a: gb.lightning_tree_commit(**_drop(a, "q"), parents=PARENTS, accepted=[1],
                                                            backend="triton"), _lightning, "k"),
    ("mamba1 verify", lambda a: gb.mamba1_tree_verify(**a, parents=PARENTS, backend="triton"), _mamba1, "A"),
    ("mamba1 commit", lambda a: gb.mamba1_tree_commit(**_drop(a, "C"), parents=PARENTS, accepted=[2], backend="triton"),
     _mamba1, "initial_state"),
    ("gdn verify", lambda a: gb.gdn_tree_verify(**a, backend="triton-recurrent"), _gdn, "v"),
    ("mamba2 verify", lambda a: gb.mamba2_tree_verify(**a, backend="triton-recurrent"), _mamba2, "B"),
]
IDS = [c[0] for c in CALLS]


@pytest.mark.parametrize("name, call, inputs, moved", CALLS, ids=IDS)
def test_cpu_inputs_outside_the_interpreter_are_refused(name, call, inputs, moved, monkeypatch):
    args = inputs()
    if os.environ.get("TRITON_INTERPRET") == "1":
        call(args)  # in the interpreter (as the tests run Triton without a GPU) the same call runs
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="triton kernels need CUDA tensors \\(or TRITON_INTERPRET=1\\), got cpu"):
        call(args)


@pytest.mark.parametrize("name, call, inputs, moved", CALLS, ids=IDS)
def test_inputs_on_two_devices_are_refused(name, call, inputs, moved):
    args = inputs()
    args[moved] = args[moved].to("meta")
    with pytest.raises(ValueError, match="(on|is on) meta") as err:  # the shape checks' line or the launch's
        call(args)
    assert "\n" not in str(err.value)
