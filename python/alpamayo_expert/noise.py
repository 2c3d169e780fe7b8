"""Noise files for `alpamayo-expert sample --noise`: safetensors with `noise` [B, T, A] f32."""
from __future__ import annotations

import os

import torch
from safetensors.torch import load_file

from ._atomic import checked_path, save_safetensors_atomic


def write_noise(path: str | os.PathLike, noise: torch.Tensor, check_finite: bool = True) -> None:
    checked_path(path, "write_noise: path")
    if noise.dim() != 3:
        raise ValueError(f"noise must be [B, T, A], got shape {tuple(noise.shape)}")
    noise = noise.detach().to(torch.float32)
    if check_finite and not torch.isfinite(noise).all():
        raise ValueError("noise contains NaN or Inf")
    save_safetensors_atomic({"noise": noise}, path)


def read_noise(path: str | os.PathLike) -> torch.Tensor:
    return load_file(checked_path(path, "read_noise: path"))["noise"]
