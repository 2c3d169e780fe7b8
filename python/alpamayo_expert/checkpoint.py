"""Write Hugging Face style checkpoint directories (config.json + one or N safetensors shards).

Used by the tests to build checkpoints whose every tensor they control.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from ._atomic import checked_path, save_safetensors_atomic, write_text_atomic

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def _split(keys: list[str], sizes: list[int], shards: int) -> list[list[str]]:
    """Split keys (in order) into `shards` contiguous groups of roughly equal bytes, none empty."""
    if shards > len(keys):
        raise ValueError(f"cannot split {len(keys)} tensors into {shards} shards")
    total = sum(sizes)
    groups: list[list[str]] = [[] for _ in range(shards)]
    acc = 0
    g = 0
    for i, (k, s) in enumerate(zip(keys, sizes)):
        remaining_keys = len(keys) - i
        remaining_groups = shards - g
        # Advance when this group is full by bytes, or when each later group needs one key.
        if groups[g] and g < shards - 1 and (acc >= total * (g + 1) / shards or remaining_keys < remaining_groups):
            g += 1
        groups[g].append(k)
        acc += s
    return groups


def write_checkpoint(directory: str | os.PathLike, tensors: Mapping[str, torch.Tensor],
                     config: Mapping[str, Any], shards: int = 1) -> Path:
    """Write config.json and the tensors; shards > 1 writes model-0000k-of-0000n + index.json."""
    d = Path(checked_path(directory, "write_checkpoint: directory"))
    d.mkdir(parents=True, exist_ok=True)
    write_text_atomic(d / "config.json", json.dumps(config, indent=2))
    if shards < 1:
        raise ValueError("shards must be >= 1")
    if shards == 1:
        save_safetensors_atomic(tensors, d / SINGLE_FILE, metadata={"format": "pt"})
        return d
    keys = list(tensors.keys())
    sizes = [t.numel() * t.element_size() for t in tensors.values()]
    weight_map: dict[str, str] = {}
    for i, group in enumerate(_split(keys, sizes, shards)):
        name = shard_name(i + 1, shards)
        save_safetensors_atomic({k: tensors[k] for k in group}, d / name, metadata={"format": "pt"})
        weight_map.update({k: name for k in group})
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    write_text_atomic(d / INDEX_FILE, json.dumps(index, indent=2))
    return d
