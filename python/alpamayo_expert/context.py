"""Dump a transformers KV cache (the VLM prefix) into the engine's context file, and read it back.

Context file (safetensors): per layer `key.{l}`, `value.{l}` [B, Hkv, P, d] (keys after k_norm and rotary,
as the cache holds them), `valid_len` [B] int64 (rows >= S_b are padding), `rope_delta` [B] int64, and
either `ego_history_xyz` [B, H, 3] + `ego_history_rot` [B, H, 3, 3] f32, or `v0` [B] f32 (or neither).

    python -m alpamayo_expert.context --help
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from safetensors import safe_open

from ._atomic import save_safetensors_atomic

KV_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@dataclass
class Context:
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid_len: torch.Tensor
    rope_delta: torch.Tensor
    ego_history_xyz: torch.Tensor | None = None
    ego_history_rot: torch.Tensor | None = None
    v0: torch.Tensor | None = None

    @property
    def num_layers(self) -> int:
        return len(self.keys)


def _as_int64_vector(x: Any, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be integers, got dtype {t.dtype}")
    t = t.to(torch.int64).reshape(-1) if t.dim() <= 1 else t
    if t.dim() != 1:
        raise ValueError(f"{name} must be a vector [B], got shape {tuple(t.shape)}")
    return t.cpu()


def cache_layers(past_key_values: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(K, V) per layer from a transformers Cache (5.x `.layers[l].keys/.values`, older `key_cache`),
    a legacy tuple of tuples, or a list of (K, V)."""
    layers = getattr(past_key_values, "layers", None)
    if layers is not None:
        out = []
        for i, layer in enumerate(layers):
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.numel() == 0:
                raise ValueError(f"cache layer {i} holds no keys/values (uninitialized or not a full-attention layer)")
            out.append((k, v))
        return out
    if hasattr(past_key_values, "key_cache") and hasattr(past_key_values, "value_cache"):
        return list(zip(past_key_values.key_cache, past_key_values.value_cache))
    if isinstance(past_key_values, (list, tuple)):
        out = []
        for i, kv in enumerate(past_key_values):
            if not isinstance(kv, (list, tuple)) or len(kv) < 2:
                raise ValueError(f"layer {i}: expected a (key, value) pair")
            out.append((kv[0], kv[1]))
        return out
    raise TypeError(f"unsupported cache type {type(past_key_values).__name__}")


def _validate(kv: list[tuple[torch.Tensor, torch.Tensor]], valid_len: torch.Tensor,
              rope_delta: torch.Tensor) -> tuple[int, int, int, int]:
    if not kv:
        raise ValueError("the cache has no layers")
    ref = None
    for l, (k, v) in enumerate(kv):
        for name, t in (("key", k), ("value", v)):
            if t.dim() != 4:
                raise ValueError(f"layer {l} {name}: expected [B, Hkv, P, d], got shape {tuple(t.shape)}")
            if not t.is_floating_point():
                raise ValueError(f"layer {l} {name}: expected a floating dtype, got {t.dtype}")
        if k.shape != v.shape:
            raise ValueError(f"layer {l}: key shape {tuple(k.shape)} != value shape {tuple(v.shape)}")
        if ref is None:
            ref = tuple(k.shape)
        elif tuple(k.shape) != ref:
            raise ValueError(f"layer {l}: shape {tuple(k.shape)} differs from layer 0 {ref} (B, Hkv, P, d must agree)")
    B, Hkv, P, d = ref
    for name, t in (("valid_len", valid_len), ("rope_delta", rope_delta)):
        if t.shape[0] != B:
            raise ValueError(f"{name} has {t.shape[0]} entries but the cache batch is B={B}")
    if (valid_len < 1).any() or (valid_len > P).any():
        raise ValueError(f"valid_len must be in [1, P={P}], got {valid_len.tolist()}")
    return B, Hkv, P, d


def _check_float(t: Any, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    t = torch.as_tensor(t).detach().to(torch.float32).cpu()
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return t


def write_context(path: str | os.PathLike, past_key_values: Any, valid_len: Any, rope_delta: Any,
                  ego_history_xyz: Any = None, ego_history_rot: Any = None, v0: Any = None,
                  dtype: torch.dtype | str | None = None) -> None:
    """Write the context file atomically.

    past_key_values: a transformers Cache (DynamicCache) or a list of (K, V) [B, Hkv, P, d].
    valid_len: S_b per sample (rows [S_b, P) are padding); rope_delta: the VLM's M-RoPE offset per sample.
    dtype: K/V storage dtype (torch.bfloat16/float16/float32 or "bf16"/"f16"/"f32"); default keeps the cache's.
    """
    kv = cache_layers(past_key_values)
    valid_len_t = _as_int64_vector(valid_len, "valid_len")
    rope_delta_t = _as_int64_vector(rope_delta, "rope_delta")
    B, Hkv, P, d = _validate(kv, valid_len_t, rope_delta_t)

    if isinstance(dtype, str):
        if dtype not in KV_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(KV_DTYPES)}, got {dtype!r}")
        dtype = KV_DTYPES[dtype]
    if dtype is None:
        dtype = kv[0][0].dtype
    if dtype not in KV_DTYPES.values():
        raise ValueError(f"K/V dtype must be bf16, f16 or f32, got {dtype}")

    tensors: dict[str, torch.Tensor] = {}
    for l, (k, v) in enumerate(kv):
        for name, t in (("key", k), ("value", v)):
            t = t.detach().to("cpu", dtype)
            # Only valid rows must be finite: padding rows are ignored by the engine.
            for b in range(B):
                if not torch.isfinite(t[b, :, : int(valid_len_t[b])]).all():
                    raise ValueError(f"layer {l} {name}: NaN or Inf in the valid rows of sample {b}")
            tensors[f"{name}.{l}"] = t
    tensors["valid_len"] = valid_len_t
    tensors["rope_delta"] = rope_delta_t

    if (ego_history_xyz is None) != (ego_history_rot is None):
        raise ValueError("ego_history_xyz and ego_history_rot must be given together")
    if ego_history_xyz is not None and v0 is not None:
        raise ValueError("give either the ego history or v0, not both")
    if ego_history_xyz is not None:
        xyz = torch.as_tensor(ego_history_xyz)
        if xyz.dim() != 3 or xyz.shape[0] != B or xyz.shape[2] != 3:
            raise ValueError(f"ego_history_xyz: expected [B={B}, H, 3], got {tuple(xyz.shape)}")
        H = xyz.shape[1]
        if H < 2:
            raise ValueError("ego history needs at least 2 poses")
        tensors["ego_history_xyz"] = _check_float(xyz, "ego_history_xyz", (B, H, 3))
        tensors["ego_history_rot"] = _check_float(ego_history_rot, "ego_history_rot", (B, H, 3, 3))
    if v0 is not None:
        tensors["v0"] = _check_float(torch.as_tensor(v0).reshape(-1), "v0", (B,))

    save_safetensors_atomic(tensors, path, metadata={"format": "alpamayo-context", "layers": str(len(kv))})


def read_context(path: str | os.PathLike) -> Context:
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        get = f.get_tensor
        L = 0
        while f"key.{L}" in names:
            L += 1
        if L == 0:
            raise ValueError(f"{path}: no key.0 tensor")
        for l in range(L):
            if f"value.{l}" not in names:
                raise ValueError(f"{path}: key.{l} without value.{l}")
        for req in ("valid_len", "rope_delta"):
            if req not in names:
                raise ValueError(f"{path}: missing tensor {req}")
        return Context(
            keys=[get(f"key.{l}") for l in range(L)],
            values=[get(f"value.{l}") for l in range(L)],
            valid_len=get("valid_len"),
            rope_delta=get("rope_delta"),
            ego_history_xyz=get("ego_history_xyz") if "ego_history_xyz" in names else None,
            ego_history_rot=get("ego_history_rot") if "ego_history_rot" in names else None,
            v0=get("v0") if "v0" in names else None,
        )


def _main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m alpamayo_expert.context",
        description="Inspect or convert an Alpamayo expert context file. To create one from a live "
                    "transformers cache, call alpamayo_expert.write_context(path, cache, valid_len, rope_delta).")
    p.add_argument("file", help="context .safetensors file")
    p.add_argument("--convert", metavar="OUT", help="rewrite the K/V in --dtype to OUT")
    p.add_argument("--dtype", choices=sorted(KV_DTYPES), help="K/V dtype for --convert")
    a = p.parse_args(argv)
    try:
        ctx = read_context(a.file)
    except Exception as e:  # the CLI reports, the library raises
        print(f"error: {e}", file=sys.stderr)
        return 1
    B, Hkv, P, d = ctx.keys[0].shape
    print(f"layers {ctx.num_layers}  B {B}  Hkv {Hkv}  P {P}  d {d}  dtype {ctx.keys[0].dtype}")
    print(f"valid_len {ctx.valid_len.tolist()}  rope_delta {ctx.rope_delta.tolist()}")
    if ctx.ego_history_xyz is not None:
        print(f"ego history: {ctx.ego_history_xyz.shape[1]} poses")
    if ctx.v0 is not None:
        print(f"v0 {ctx.v0.tolist()}")
    if a.convert:
        write_context(a.convert, list(zip(ctx.keys, ctx.values)), ctx.valid_len, ctx.rope_delta,
                      ctx.ego_history_xyz, ctx.ego_history_rot, ctx.v0, dtype=a.dtype)
        print(f"wrote {a.convert}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
