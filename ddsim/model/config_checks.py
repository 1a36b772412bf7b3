"""Checks every checkpoint reader (ddsim.model.checkpoint and its checkpoint_* modules) makes of a config.json's
fields before it builds a ModelConfig: each raises InputError naming the file and the field, in the same words for
every architecture."""
from __future__ import annotations

from pathlib import Path

from ddsim.errors import InputError


def check_silu(raw: dict, where: Path) -> None:
    """hidden_act (silu when absent) is silu, the only activation ddsim's MLPs compute."""
    if raw.get("hidden_act", "silu") != "silu":
        raise InputError(f"{where}: hidden_act {raw.get('hidden_act')!r} is not supported (silu only)")


def check_layer_types(types: list, *, n: int | None, allowed: tuple[str, ...], where: Path) -> None:
    """types (a config's layer_types) names n layers (n None: a reader that checked the count in words of its own)
    and only the types in allowed."""
    if n is not None and len(types) != n:
        raise InputError(f"{where}: {len(types)} layer_types for {n} layers")
    bad = [t for t in types if t not in allowed]
    if bad:
        raise InputError(f"{where}: unknown layer type {bad[0]!r}")


def check_default_rope(rope: dict, *, where: Path, none_allowed: bool = False) -> None:
    """rope (a config's rope_parameters, or what a reader makes of its legacy fields) asks for the default RoPE
    (rope_type absent or "default"), the only one ddsim's attention computes; none_allowed: the reader also takes a
    model without positional encoding, and the refusal says so."""
    kind = rope.get("rope_type", "default")
    if kind != "default":
        takes = "the default RoPE or none" if none_allowed else "the default RoPE only"
        raise InputError(f"{where}: rope_type {kind!r} is not supported ({takes})")
