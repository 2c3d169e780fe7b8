"""Atomic safetensors writes: a reader never sees a half-written file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import save_file


def save_safetensors_atomic(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike,
                            metadata: Mapping[str, str] | None = None) -> Path:
    """Write `tensors` to `path` via a temp file in the same directory, then rename.

    rename() within one directory is atomic on POSIX, so a crash leaves either the old file or the new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        # safetensors refuses non-contiguous tensors and tensors sharing storage.
        save_file({k: v.detach().contiguous().cpu().clone() for k, v in tensors.items()}, tmp,
                  metadata=dict(metadata) if metadata else None)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
