"""Layer placement (--devices): the plan (contiguous blocks balanced by bytes, every device used, the
embedding first and the head last), the checks on the device list, and the whole path on the CPU:
an audit placed over CPU "devices" is the unplaced audit, and a model forced onto its per-layer path
computes what the one-device model computes. The cross-GPU moves themselves are exercised on two
GPUs by benchmarks/audit_multi_gpu.py --check-placement (results in benchmarks/RESULTS.md)."""
import json

import pytest
import torch

from ddsim.errors import InputError
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.placement import describe, layer_bytes, parse_devices, plan_layers, weight_device
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree
from tests.cli_runs import one_line_error, run_cli

GPUS = [torch.device(f"cuda:{i}") for i in range(4)]  # device names only: nothing is allocated on them


@pytest.mark.parametrize("preset, n", [("qwen3-next-80b", 2), ("qwen3.6-27b", 2), ("nemotron-h-8b", 3),
                                       ("falcon-h1-7b", 4), ("micro", 4)])
def test_plan_is_contiguous_balanced_and_uses_every_device(preset, n):
    cfg = get_preset(preset)
    plan = plan_layers(cfg, GPUS[:n])
    idx = [d.index for d in plan]
    assert idx == sorted(idx) and set(idx) == set(range(n))  # contiguous blocks, in order, none idle
    per = layer_bytes(cfg)
    ends = cfg.vocab_size * cfg.hidden_size * 2
    load = [sum(b for b, d in zip(per, plan) if d.index == k) for k in range(n)]
    load[0] += ends
    load[-1] += ends
    share = sum(load) / n
    assert max(abs(x - share) for x in load) <= max(per) + ends  # within one layer (and the ends) of equal
    assert weight_device("embed", plan) == GPUS[0] and weight_device("lm_head", plan) == GPUS[n - 1]
    assert weight_device("layers.0.input_norm", plan) == GPUS[0]
    assert describe(cfg, plan).startswith("cuda:0 layers 0-")


def test_the_80b_preset_is_the_real_moe_and_splits_in_half():
    cfg = get_preset("qwen3-next-80b")
    assert cfg.num_experts == 512 and cfg.num_experts_per_tok == 10 and cfg.shared_expert_intermediate_size == 512
    assert all(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    assert describe(cfg, plan_layers(cfg, GPUS[:2])) == "cuda:0 layers 0-23, cuda:1 layers 24-47"


def test_device_lists_are_checked():
    assert parse_devices("cpu,cpu") == [torch.device("cpu")] * 2
    with pytest.raises(InputError, match="expected cpu or cuda:N"):
        parse_devices("mps:0")
    with pytest.raises(InputError, match="is not a device"):
        parse_devices("gpu0")
    with pytest.raises(InputError, match="4 devices for a model of 2 layers"):
        plan_layers(get_preset("micro").replace(layer_pattern="ga"), GPUS)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA device is available"):
            parse_devices("cuda:0,cuda:1")


def test_weights_on_one_device_per_layer_are_the_one_device_weights():
    cfg = get_preset("micro")
    a = init_weights(cfg, seed=3)
    b = init_weights(cfg, seed=3, layer_devices=[torch.device("cpu")] * cfg.num_layers)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_per_layer_path_computes_what_the_one_device_path_does(monkeypatch):
    """A model that takes itself for placed (every layer looked up, the hidden state handed on, tree
    tables per device) gives bit-identical results on one device."""
    import ddsim.model.model as model_mod
    cfg = get_preset("micro-mamba2").replace(layer_pattern="mgpaf")
    w = init_weights(cfg, seed=1)
    tree = ddtree(torch.randn(4, cfg.vocab_size, generator=torch.Generator().manual_seed(0)) * 3.0, 12)
    plain = HybridModel(cfg, w)
    monkeypatch.setattr(model_mod, "is_placed", lambda weights: True)
    placed = HybridModel(cfg, w)
    assert placed.layer_devices == [torch.device("cpu")] * cfg.num_layers
    s1, _ = plain.prefill([1, 2, 3])
    s2, _ = placed.prefill([1, 2, 3])
    for mode in ("exact", "leaky"):
        a, b = plain.verify(s1, tree, mode=mode), placed.verify(s2, tree, mode=mode)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)


def test_an_audit_placed_over_cpu_devices_is_the_unplaced_audit(tmp_path):
    args = ["--preset", "micro", "--budget", "8", "--steps", "2", "--seed", "4"]
    one = ["--device", "cpu"]  # unplaced on the one CPU (--device auto would take a GPU where there is one)
    assert run_cli("audit", *args, *one, "--out", tmp_path / "a").returncode == 0
    r = run_cli("audit", *args, "--devices", "cpu,cpu", "--out", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("a", "b"))
    assert b["config"]["devices"] == "cpu,cpu" and a["config"]["devices"] is None
    assert (a["config"]["device"], b["config"]["device"]) == ("cpu", "cpu")  # a placement names its first device
    for d in (a, b):
        for k in ("generated_at", "environment"):
            d.pop(k)
        d["config"].pop("devices")
        d["config"].pop("device")
    assert a == b


def test_bad_device_lists_are_one_line_errors(tmp_path):
    out = tmp_path / "out"
    one_line_error(run_cli("audit", "--preset", "micro", "--devices", "cpu,tpu:0", "--out", out), "--devices",
                   "'tpu:0'")
    one_line_error(run_cli("audit", "--preset", "micro", "--devices", "cpu,cpu,cpu,cpu,cpu", "--out", out),
                   "--devices", "5 devices for a model of 4 layers")
    if not torch.cuda.is_available():
        one_line_error(run_cli("audit", "--preset", "micro", "--devices", "cuda:0,cuda:1", "--out", out),
                       "--device", "no CUDA device")
    assert not out.exists()
