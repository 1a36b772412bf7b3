"""Checks every checkpoint reader (ddsim.model.checkpoint and its checkpoint_* modules) makes of a config.json's
fields before it builds a ModelConfig: each raises InputError naming the file and the field, in the same words for
every architecture."""
from __future__ import annotations

import json
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


# where a config names its RoPE: transformers reads rope_parameters, and the older rope_scaling (with a legacy
# "type" for "rope_type") as the same table
ROPE_FIELDS = ("rope_parameters", "rope_scaling")


def rope_parameters(raw: dict, *, where: Path) -> dict:
    """raw's rope_parameters ({} where absent or null), each of ROPE_FIELDS first checked to be an object or null (a
    string or a list there is refused in one line, where a reader's .get of it would raise an AttributeError)."""
    for field in ROPE_FIELDS:
        if raw.get(field) is not None and not isinstance(raw[field], dict):
            raise InputError(f"{where}: {field} must be an object or null, got {json.dumps(raw[field])}")
    return raw.get("rope_parameters") or {}


def check_default_rope(raw: dict, *, where: Path, none_allowed: bool = False) -> None:
    """raw (a config's fields, or its text_config's) asks for the default RoPE, the only one ddsim's attention
    computes: each of ROPE_FIELDS null, or naming no type but "default" (a yarn, linear, dynamic, llama3 or longrope
    scaling would be read as the default and the audit would run another model). For the readers whose model uses
    RoPE; none_allowed: the reader also takes a model without positional encoding, and the refusal says so."""
    rope_parameters(raw, where=where)
    for field in ROPE_FIELDS:
        rope = raw.get(field) or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            takes = "the default RoPE or none" if none_allowed else "the default RoPE only"
            raise InputError(f"{where}: {field}.rope_type {kind!r} is not supported ({takes})")
