"""Dump a transformers KV cache (the VLM prefix) into the engine's context file, and read it back.

Context file (safetensors, docs/FORMATS.md): G prompt caches stored once and B samples over them. Per layer
`key.{l}`, `value.{l}` [G, Hkv, P, d] (keys after k_norm and rotary, as the cache holds them), `valid_len` [G]
int64 (rows >= valid_len_g are ignored), optional `prefix_pad` [G] (leading rows that are left padding),
optional `prompt_index` [B] (each sample's prompt; default B = G, sample b uses prompt b), optional
`suffix_key.{l}`, `suffix_value.{l}` [B, Hkv, Q, d] with `suffix_len` [B] (each sample's own rows after its
prompt), `rope_delta` [B] int64, and either `ego_history_xyz` [B, H, 3] + `ego_history_rot` [B, H, 3, 3] f32,
or `v0` [B] f32 (or neither).

`write_context` writes any of these shapes from caches you laid out; `write_rollout_context` writes the shared
form straight from what the release's `generate(num_return_sequences=N)` leaves (alpamayo_expert.rollout).

    python -m alpamayo_expert.context --help
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from safetensors import safe_open

from ._atomic import checked_path, save_safetensors_atomic

KV_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@dataclass
class Context:
    """A context file's tensors. keys/values are the G prompt caches; the optional fields are None when absent."""
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid_len: torch.Tensor
    rope_delta: torch.Tensor
    ego_history_xyz: torch.Tensor | None = None
    ego_history_rot: torch.Tensor | None = None
    v0: torch.Tensor | None = None
    prefix_pad: torch.Tensor | None = None
    prompt_index: torch.Tensor | None = None
    suffix_keys: list[torch.Tensor] | None = None
    suffix_values: list[torch.Tensor] | None = None
    suffix_len: torch.Tensor | None = None

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_prompts(self) -> int:
        return self.keys[0].shape[0]

    @property
    def batch(self) -> int:
        return self.rope_delta.shape[0]

    def prompt_of(self) -> torch.Tensor:
        """[B] each sample's prompt."""
        return self.prompt_index.long() if self.prompt_index is not None else torch.arange(self.num_prompts)

    def pads(self) -> torch.Tensor:
        """[G] left-padding rows of each prompt."""
        return self.prefix_pad.long() if self.prefix_pad is not None else torch.zeros(self.num_prompts, dtype=torch.long)

    def suffix_lens(self) -> torch.Tensor:
        """[B] suffix rows in use per sample."""
        return self.suffix_len.long() if self.suffix_len is not None else torch.zeros(self.batch, dtype=torch.long)

    def offsets(self) -> torch.Tensor:
        """[B] each sample's rotary offset: valid_len of its prompt + its suffix rows."""
        return self.valid_len.long()[self.prompt_of()] + self.suffix_lens()


def describe(x: Any) -> str:
    """What x is, for a message: a tensor's shape, dtype and device, an array's shape and dtype."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}, dtype {x.dtype}, on device '{x.device}'"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {list(x.shape)}, dtype {x.dtype}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"{type(x).__name__} {x!r}"[:200]


def as_tensor_checked(x: Any, name: str, expected: str, exc: type[Exception] = ValueError) -> torch.Tensor:
    """torch.as_tensor(x), refused with `exc` naming the argument, what it is and what was expected when its
    values cannot be read (a 'meta' tensor, a sparse one, a list that is not numbers, integers beyond 64 bits,
    unsigned 64-bit values above 2^63 - 1)."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise exc(f"{name}: {describe(x)}, which holds no values; expected {expected}")
        if x.layout != torch.strided:
            raise exc(f"{name}: {describe(x)} with layout {x.layout}; expected {expected} as a dense tensor")
        t = x
    else:
        if isinstance(x, np.ndarray) and x.dtype == np.uint64 and x.size and int(x.max()) > (1 << 63) - 1:
            raise exc(f"{name}: {describe(x)} holds {int(x.max())}, which does not fit a signed 64-bit integer; "
                      f"expected {expected}")
        try:
            t = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError, OverflowError) as e:
            raise exc(f"{name}: {describe(x)} cannot be read as {expected} ({e})") from None
    if t.dtype == getattr(torch, "uint64", None) and t.numel() and bool((t.view(torch.int64) < 0).any()):
        raise exc(f"{name}: {describe(t)} holds values of 2^63 or more, which do not fit a signed 64-bit "
                  f"integer; expected {expected}")
    return t


def _as_int64_vector(x: Any, name: str) -> torch.Tensor:
    t = as_tensor_checked(x, name, "a vector of 64-bit integers")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be integers, got dtype {t.dtype} ({describe(t)})")
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


def _check_layers(kv: list[tuple[torch.Tensor, torch.Tensor]], what: str) -> tuple[int, int, int, int]:
    if not kv:
        raise ValueError(f"the {what} has no layers")
    ref = None
    for l, (k, v) in enumerate(kv):
        for name, t in (("key", k), ("value", v)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{what} layer {l} {name}: expected a torch tensor, got {describe(t)}")
            as_tensor_checked(t, f"{what} layer {l} {name}", "a float tensor [N, Hkv, rows, d] on the cpu or cuda")
            if t.dim() != 4:
                raise ValueError(f"{what} layer {l} {name}: expected [N, Hkv, rows, d], got shape {tuple(t.shape)}")
            if not t.is_floating_point():
                raise ValueError(f"{what} layer {l} {name}: expected a floating dtype, got {t.dtype} ({describe(t)})")
        if k.shape != v.shape:
            raise ValueError(f"{what} layer {l}: key shape {tuple(k.shape)} != value shape {tuple(v.shape)}")
        if ref is None:
            ref = tuple(k.shape)
        elif tuple(k.shape) != ref:
            raise ValueError(f"{what} layer {l}: shape {tuple(k.shape)} differs from layer 0 {ref} "
                             "(N, Hkv, rows, d must agree)")
    return ref


def _check_float(t: Any, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    t = as_tensor_checked(t, name, f"float32 values of shape {list(shape)}")
    if t.is_complex():
        raise ValueError(f"{name}: {describe(t)}; expected real float32 values")
    t = t.detach().to(torch.float32).cpu()
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return t


def write_context(path: str | os.PathLike, past_key_values: Any, valid_len: Any, rope_delta: Any,
                  ego_history_xyz: Any = None, ego_history_rot: Any = None, v0: Any = None,
                  dtype: torch.dtype | str | None = None, *, prefix_pad: Any = None, prompt_index: Any = None,
                  suffix: Any = None, suffix_len: Any = None) -> None:
    """Write the context file atomically (nothing is written when an argument is refused).

    past_key_values: a transformers Cache (DynamicCache) or a list of (K, V) [G, Hkv, P, d]: the prompt caches.
    valid_len: [G] rows of each prompt (rows [valid_len_g, P) are ignored); rope_delta: [B] the VLM's M-RoPE
    offset per sample. Optional: prefix_pad [G] leading rows of each prompt that are left padding;
    prompt_index [B] each sample's prompt (default: G = B, sample b uses prompt b); suffix (a Cache or list of
    (K, V) [B, Hkv, Q, d]) with suffix_len [B]: each sample's own rows after its prompt. Sample b's expert tokens
    sit at positions i + rope_delta_b + valid_len_g + suffix_len_b.
    ego_history_xyz [B, H, 3] with ego_history_rot [B, H, 3, 3], or v0 [B]: the motion state (optional).
    dtype: K/V storage dtype (torch.bfloat16/float16/float32 or "bf16"/"f16"/"f32"); default keeps the cache's.
    """
    checked_path(path, "write_context: path")
    kv = cache_layers(past_key_values)
    valid_len_t = _as_int64_vector(valid_len, "valid_len")
    rope_delta_t = _as_int64_vector(rope_delta, "rope_delta")
    G, Hkv, P, d = _check_layers(kv, "cache")
    if valid_len_t.shape[0] != G:
        raise ValueError(f"valid_len has {valid_len_t.shape[0]} entries but the cache batch is B={G}"
                         if prompt_index is None else
                         f"valid_len has {valid_len_t.shape[0]} entries but the cache holds G={G} prompts")
    if (valid_len_t < 1).any() or (valid_len_t > P).any():
        raise ValueError(f"valid_len must be in [1, P={P}], got {valid_len_t.tolist()}")
    pad_t = None
    if prefix_pad is not None:
        pad_t = _as_int64_vector(prefix_pad, "prefix_pad")
        if pad_t.shape[0] != G:
            raise ValueError(f"prefix_pad has {pad_t.shape[0]} entries but the cache holds G={G} prompts")
        if (pad_t < 0).any() or (pad_t > valid_len_t).any():
            raise ValueError(f"prefix_pad must be in [0, valid_len] per prompt, got {pad_t.tolist()} "
                             f"(valid_len {valid_len_t.tolist()})")
    prompt_t = None
    B = G
    if prompt_index is not None:
        prompt_t = _as_int64_vector(prompt_index, "prompt_index")
        B = prompt_t.shape[0]
        if B < 1:
            raise ValueError("prompt_index is empty: a context needs at least one sample")
        if (prompt_t < 0).any() or (prompt_t >= G).any():
            bad = int(prompt_t[(prompt_t < 0) | (prompt_t >= G)][0])
            raise ValueError(f"prompt_index names prompt {bad}, which does not exist (the cache holds G={G} prompts)")
    if rope_delta_t.shape[0] != B:
        raise ValueError(f"rope_delta has {rope_delta_t.shape[0]} entries but the cache batch is B={B}"
                         if prompt_index is None else
                         f"rope_delta has {rope_delta_t.shape[0]} entries but there are B={B} samples")
    skv, slen_t, Q = None, None, 0
    if (suffix is None) != (suffix_len is None):
        raise ValueError("suffix and suffix_len must be given together")
    if suffix is not None:
        skv = cache_layers(suffix)
        Bs, Hs, Q, ds = _check_layers(skv, "suffix cache")
        if len(skv) != len(kv):
            raise ValueError(f"the suffix cache has {len(skv)} layers, the prompt cache {len(kv)}")
        if (Bs, Hs, ds) != (B, Hkv, d):
            raise ValueError(f"suffix cache: expected [B={B}, Hkv={Hkv}, Q, d={d}], got {(Bs, Hs, Q, ds)}")
        slen_t = _as_int64_vector(suffix_len, "suffix_len")
        if slen_t.shape[0] != B:
            raise ValueError(f"suffix_len has {slen_t.shape[0]} entries but there are B={B} samples")
        if (slen_t < 0).any() or (slen_t > Q).any():
            raise ValueError(f"suffix_len must be in [0, Q={Q}], got {slen_t.tolist()}")

    if isinstance(dtype, str):
        if dtype not in KV_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(KV_DTYPES)}, got {dtype!r}")
        dtype = KV_DTYPES[dtype]
    if dtype is None:
        dtype = kv[0][0].dtype
    if dtype not in KV_DTYPES.values():
        raise ValueError(f"K/V dtype must be bf16, f16 or f32, got {dtype}")

    tensors: dict[str, torch.Tensor] = {}
    lo = pad_t if pad_t is not None else torch.zeros(G, dtype=torch.int64)
    for l, (k, v) in enumerate(kv):
        for name, t in (("key", k), ("value", v)):
            t = t.detach().to("cpu", dtype)
            # Only rows some sample reads must be finite: padding rows are ignored by the engine.
            for g in range(G):
                if not torch.isfinite(t[g, :, int(lo[g]): int(valid_len_t[g])]).all():
                    raise ValueError(f"layer {l} {name}: NaN or Inf in the valid rows of "
                                     f"{'sample' if prompt_index is None else 'prompt'} {g}")
            tensors[f"{name}.{l}"] = t
    if skv is not None:
        for l, (k, v) in enumerate(skv):
            for name, t in (("suffix_key", k), ("suffix_value", v)):
                t = t.detach().to("cpu", dtype)
                for b in range(B):
                    if not torch.isfinite(t[b, :, : int(slen_t[b])]).all():
                        raise ValueError(f"layer {l} {name}: NaN or Inf in the suffix rows of sample {b}")
                tensors[f"{name}.{l}"] = t
        tensors["suffix_len"] = slen_t
    tensors["valid_len"] = valid_len_t
    if pad_t is not None:
        tensors["prefix_pad"] = pad_t
    if prompt_t is not None:
        tensors["prompt_index"] = prompt_t
    tensors["rope_delta"] = rope_delta_t

    if (ego_history_xyz is None) != (ego_history_rot is None):
        raise ValueError("ego_history_xyz and ego_history_rot must be given together")
    if ego_history_xyz is not None and v0 is not None:
        raise ValueError("give either the ego history or v0, not both")
    if ego_history_xyz is not None:
        xyz = as_tensor_checked(ego_history_xyz, "ego_history_xyz", "float32 values [B, H, 3]")
        if xyz.dim() != 3 or xyz.shape[0] != B or xyz.shape[2] != 3:
            raise ValueError(f"ego_history_xyz: expected [B={B}, H, 3], got {tuple(xyz.shape)}")
        H = xyz.shape[1]
        if H < 2:
            raise ValueError("ego history needs at least 2 poses")
        tensors["ego_history_xyz"] = _check_float(xyz, "ego_history_xyz", (B, H, 3))
        tensors["ego_history_rot"] = _check_float(ego_history_rot, "ego_history_rot", (B, H, 3, 3))
    if v0 is not None:
        tensors["v0"] = _check_float(as_tensor_checked(v0, "v0", f"float32 values [{B}]").reshape(-1), "v0", (B,))

    save_safetensors_atomic(tensors, path, metadata={"format": "alpamayo-context", "layers": str(len(kv))})


def write_rollout_context(path: str | os.PathLike, past_key_values: Any, rope_deltas: Any, *,
                          num_return_sequences: int, sequences: Any = None, eos_token_id: int | None = None,
                          offsets: Any = None, prefix_mask: Any = None, prompt_len: int | None = None,
                          ego_history_xyz: Any = None, ego_history_rot: Any = None, v0: Any = None,
                          share_prompt: bool = True, prompt_atol: float = 0.0,
                          dtype: torch.dtype | str | None = None) -> None:
    """Write the context of a VLM rollout as the release leaves it after `generate(num_return_sequences=N)`.

    past_key_values: the rollout's cache, [G*N, Hkv, R, d] per layer (sequence g*N + j is prompt g's j-th
    sample, as generate's repeat_interleave lays them out). rope_deltas: the VLM's (`model.model.rope_deltas`,
    [G*N, 1] or [G, 1]). sequences with eos_token_id (the id of `<traj_future_start>`): the offsets are found as
    the release's `_find_eos_offset` finds them (first occurrence + 1; the sequence length when absent); or
    give offsets [G*N] directly. prefix_mask: the tokenizer's attention_mask of the prompts, [G, Lp] or
    [G*N, Lp], left padding (zeros, then ones); another form is refused. prompt_len: Lp when there is no mask.
    ego_history_xyz [G, 1, H, 3] or [G, H, 3] (and _rot) or v0 [G*N]: the motion state, repeated per sample.

    share_prompt=True stores the prompt rows [0, Lp) once per prompt, after checking that they are identical
    across the N sequences of each prompt (max |difference| <= prompt_atol; the error names the layer and the
    sequence), and each sequence's generated rows [Lp, offset) as its suffix. share_prompt=False writes every
    sequence's rows [0, offset) (the simple form, G*N prompts).
    """
    checked_path(path, "write_rollout_context: path")
    from .rollout import rollout_layout
    lay = rollout_layout(past_key_values, rope_deltas, num_return_sequences=num_return_sequences,
                         sequences=sequences, eos_token_id=eos_token_id, offsets=offsets, prefix_mask=prefix_mask,
                         prompt_len=prompt_len, share_prompt=share_prompt, prompt_atol=prompt_atol)
    hist_xyz, hist_rot = (None, None)
    if ego_history_xyz is not None or ego_history_rot is not None:
        from .rollout import repeat_history
        hist_xyz, hist_rot = repeat_history(ego_history_xyz, ego_history_rot, num_return_sequences, lay.batch)
    write_context(path, lay.prompt_kv, lay.valid_len, lay.rope_delta, hist_xyz, hist_rot, v0, dtype,
                  prefix_pad=lay.prefix_pad, prompt_index=lay.prompt_index,
                  suffix=lay.suffix_kv, suffix_len=lay.suffix_len)


def read_context(path: str | os.PathLike) -> Context:
    with safe_open(checked_path(path, "read_context: path"), framework="pt") as f:
        names = set(f.keys())
        get = f.get_tensor
        opt = lambda k: get(k) if k in names else None  # noqa: E731
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
        suffix = "suffix_key.0" in names
        return Context(
            keys=[get(f"key.{l}") for l in range(L)],
            values=[get(f"value.{l}") for l in range(L)],
            valid_len=get("valid_len"),
            rope_delta=get("rope_delta"),
            ego_history_xyz=opt("ego_history_xyz"),
            ego_history_rot=opt("ego_history_rot"),
            v0=opt("v0"),
            prefix_pad=opt("prefix_pad"),
            prompt_index=opt("prompt_index"),
            suffix_keys=[get(f"suffix_key.{l}") for l in range(L)] if suffix else None,
            suffix_values=[get(f"suffix_value.{l}") for l in range(L)] if suffix else None,
            suffix_len=opt("suffix_len"),
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
    G, Hkv, P, d = ctx.keys[0].shape
    print(f"layers {ctx.num_layers}  B {ctx.batch}  G {G}  Hkv {Hkv}  P {P}  d {d}  dtype {ctx.keys[0].dtype}")
    print(f"valid_len {ctx.valid_len.tolist()}  rope_delta {ctx.rope_delta.tolist()}")
    if ctx.prefix_pad is not None:
        print(f"prefix_pad {ctx.prefix_pad.tolist()}")
    if ctx.prompt_index is not None:
        print(f"prompt_index {ctx.prompt_index.tolist()}")
    if ctx.suffix_len is not None:
        print(f"suffix rows Q {ctx.suffix_keys[0].shape[2]}  suffix_len {ctx.suffix_len.tolist()}")
    if ctx.ego_history_xyz is not None:
        print(f"ego history: {ctx.ego_history_xyz.shape[1]} poses")
    if ctx.v0 is not None:
        print(f"v0 {ctx.v0.tolist()}")
    if a.convert:
        write_context(a.convert, list(zip(ctx.keys, ctx.values)), ctx.valid_len, ctx.rope_delta,
                      ctx.ego_history_xyz, ctx.ego_history_rot, ctx.v0, dtype=a.dtype, prefix_pad=ctx.prefix_pad,
                      prompt_index=ctx.prompt_index,
                      suffix=list(zip(ctx.suffix_keys, ctx.suffix_values)) if ctx.suffix_keys else None,
                      suffix_len=ctx.suffix_len)
        print(f"wrote {a.convert}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
