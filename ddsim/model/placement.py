"""Layer placement over several devices (``--devices cuda:0,cuda:1``): a model too large for one GPU
is split into contiguous blocks of layers balanced by bytes, the embedding on the first device and
the final norm and LM head on the last. Both the fast path and the oracle read the placement from
where the weights are: every tensor of layer i lives on layer i's device, and each layer moves the
hidden state (and builds its tree tables, keeps its KV, recurrent state and conv window) there.
"""
from __future__ import annotations

import math

import torch

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig


def parse_devices(spec: str) -> list[torch.device]:
    """'cuda:0,cuda:1' -> devices, checked: distinct, existing, all CUDA or all CPU (the CPU may
    be listed more than once: a placement the tests exercise without GPUs)."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if len(names) < 1:
        raise InputError(f"--devices {spec!r}: expected a comma-separated list such as cuda:0,cuda:1")
    devs = []
    for n in names:
        try:
            d = torch.device(n)
        except RuntimeError:
            raise InputError(f"--devices: {n!r} is not a device") from None
        if d.type == "cuda":
            if not torch.cuda.is_available():
                raise InputError(f"--devices: {n} requested but no CUDA device is available")
            if d.index is None:
                raise InputError(f"--devices: {n}: name the GPU (cuda:N)")
            if d.index >= torch.cuda.device_count():
                raise InputError(f"--devices: {n} does not exist ({torch.cuda.device_count()} CUDA devices)")
        elif d.type != "cpu":
            raise InputError(f"--devices: {n}: expected cpu or cuda:N")
        devs.append(d)
    if len({d.type for d in devs}) > 1:
        raise InputError(f"--devices {spec}: mixes CPU and CUDA devices")
    cuda = [d for d in devs if d.type == "cuda"]
    if len(set(cuda)) != len(cuda):
        raise InputError(f"--devices {spec}: a GPU is listed twice")
    return devs


def layer_bytes(cfg: ModelConfig, bytes_per_param: int = 2) -> list[int]:
    """Weight bytes of each layer."""
    from ddsim.model.weights import weight_shapes
    per = [0] * cfg.num_layers
    for name, shape in weight_shapes(cfg).items():
        if name.startswith("layers."):
            per[int(name.split(".")[1])] += math.prod(shape) * bytes_per_param
    return per


def plan_layers(cfg: ModelConfig, devices: list[torch.device]) -> list[torch.device]:
    """The device of each layer: contiguous blocks, cut where the running share of bytes (the
    embedding counted on the first device, the LM head on the last) passes each device's equal
    share. One device: every layer there."""
    if len(devices) == 1:
        return [devices[0]] * cfg.num_layers
    if len(devices) > cfg.num_layers:
        raise InputError(f"--devices: {len(devices)} devices for a model of {cfg.num_layers} layers")
    per = layer_bytes(cfg)
    ends = cfg.vocab_size * cfg.hidden_size * 2
    total = sum(per) + 2 * ends  # embedding and LM head
    share = total / len(devices)
    out, used, k = [], ends, 0
    for i, b in enumerate(per):
        # move on when this layer would overfill device k, keeping at least one layer per device
        remaining_layers = cfg.num_layers - i
        remaining_devices = len(devices) - k - 1
        if k < len(devices) - 1 and out and out[-1] == devices[k] and \
                (used + b / 2 > share * (k + 1) or remaining_layers <= remaining_devices):
            k += 1
        out.append(devices[k])
        used += b
    return out


def weight_device(name: str, layer_devices: list[torch.device]) -> torch.device:
    """Where one weight lives: its layer's device; the embedding on the first, the rest (final norm,
    LM head) on the last."""
    if name.startswith("layers."):
        return layer_devices[int(name.split(".")[1])]
    return layer_devices[0] if name == "embed" else layer_devices[-1]


def layer_devices_of(weights: dict, cfg: ModelConfig) -> list[torch.device]:
    """The placement a weight dict carries: the device of each layer's input norm."""
    return [weights[f"layers.{i}.input_norm"].device for i in range(cfg.num_layers)]


def is_placed(weights: dict) -> bool:
    """True when the weights live on more than one device."""
    devs = set()
    for v in weights.values():
        devs.add(v.device)
        if len(devs) > 1:
            return True
    return False


def place(weights: dict, cfg: ModelConfig, layer_devices: list[torch.device]) -> dict:
    """The same weights moved to their placement (tensors already there are not copied)."""
    return {k: v.to(weight_device(k, layer_devices)) for k, v in weights.items()}


def describe(cfg: ModelConfig, layer_devices: list[torch.device]) -> str:
    """'cuda:0 layers 0-23, cuda:1 layers 24-47' (the report and the log say where layers ran)."""
    parts, start = [], 0
    for i in range(1, cfg.num_layers + 1):
        if i == cfg.num_layers or layer_devices[i] != layer_devices[start]:
            parts.append(f"{layer_devices[start]} layers {start}-{i - 1}")
            start = i
    return ", ".join(parts)
