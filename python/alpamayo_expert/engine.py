"""The engine from Python: Model, Context, Session (over the native module alpamayo_expert._core).

    import alpamayo_expert as ae
    model = ae.Model("/models/alpamayo1.5", backend="cpu", weights="bf16")
    ctx = ae.Context(keys, values, valid_len, rope_delta, ego_history_xyz=xyz, ego_history_rot=rot)
    session = model.session()
    session.bind(ctx)
    r = session.sample(seed=0)          # r.xyz [B, T, 3] numpy; session.sample(..., output="torch") for tensors

Caches are read through DLPack without a copy when they are row-major (contiguous) in memory a backend can
read (the cpu and reference backends read host memory). A non-contiguous host tensor is copied once into a
row-major buffer the Context owns (`Context.copied` names them; copy=False refuses instead). A CUDA tensor is
viewed as it is, and a backend that cannot read device memory refuses it at bind with a clear error. Small
per-sample vectors (lengths, rope deltas, v0, ego history, noise) are always copied. Long calls (loading,
validating, binding, sampling) release the GIL. Errors raise the subclass of alpamayo_expert.Error of their kind
(errors.py) with the engine's message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

try:
    from . import _core
except ImportError as e:  # pragma: no cover - exercised only without the native module
    _core = None
    _IMPORT_ERROR = e

from .errors import (Error, FileIOError, FormatError, InternalError, InvalidArgumentError, InvalidStateError,
                     NonFiniteError, OutOfMemoryError, UnsupportedError)

__all__ = ["Error", "InvalidArgumentError", "FormatError", "FileIOError", "UnsupportedError", "OutOfMemoryError",
           "NonFiniteError", "InvalidStateError", "InternalError", "Model", "Context", "Session", "SampleResult",
           "backends"]


def _native():
    if _core is None:
        raise ImportError("alpamayo_expert._core, the native engine, is not installed: run `pip install .` in the "
                          f"repository (README, 'Python') ({_IMPORT_ERROR})")
    return _core


def backends() -> list[tuple[str, list[str], list[str], str]]:
    """Every backend of this build: (name, weight formats, KV cache formats (the first of each is the default), why
    it cannot run here or '')."""
    return list(_native().backends())


def backend_formats(name: str) -> dict[str, str]:
    """The weight formats of backend `name`, each mapped to why this machine cannot run it, or '' where it can (a
    GPU older than sm_89 runs bf16 but not fp8; a backend that cannot run here gives its reason for every format)."""
    return dict(_native().backend_formats(name))


# ---------------------------------------------------------------------------------------------- conversions
def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


_INT64 = (-(1 << 63), (1 << 63) - 1)
_CACHE_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")
_CACHE_NP_DTYPES = (np.float32, np.float16)


def _describe(x: Any) -> str:
    """What x is, for a message: a tensor's shape, dtype and device, an array's shape and dtype."""
    if _is_torch(x):
        return f"a tensor of shape {list(x.shape)}, dtype {x.dtype}, on device '{x.device}'"
    if isinstance(x, np.ndarray):
        return f"an array of shape {list(x.shape)}, dtype {x.dtype}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"{type(x).__name__} {x!r}"[:200]


def _check_torch_host_readable(x: Any, name: str, expected: str) -> None:
    """A torch tensor whose values can be read at all: strided, on a real device (not 'meta')."""
    if not _is_torch(x):
        return
    if x.device.type == "meta":
        raise InvalidArgumentError(f"{name}: {_describe(x)}, which holds no values; expected {expected} on the cpu (or cuda)")
    if str(x.layout) != "torch.strided":
        raise InvalidArgumentError(f"{name}: {_describe(x)} with layout {x.layout}; expected {expected} as a dense (strided) tensor")


def _to_list(x: Any, name: str = "value", expected: str = "numbers") -> Any:
    if _is_torch(x):
        _check_torch_host_readable(x, name, expected)
        return x.detach().cpu().tolist()
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        return x.tolist()
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        return x.tolist()
    return x


def _int_vector(x: Any, name: str, lo: int, hi: int, kind: str, rows: bool) -> list[int]:
    """A vector of integers in [lo, hi] from a list, numpy array or tensor ([N], or [N, 1] where rows); None -> []."""
    if x is None:
        return []
    v = _to_list(x, name, "a vector of integers")
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)):
        try:
            v = list(v)
        except TypeError:
            raise InvalidArgumentError(f"{name}: expected a vector of integers, got {_describe(x)}") from None
    out = []
    for i, e in enumerate(v):
        if rows and isinstance(e, (list, tuple)):  # [N, 1], as the release keeps rope_deltas
            if len(e) != 1:
                raise InvalidArgumentError(f"{name}: expected shape [N] or [N, 1], got rows of {len(e)} ({_describe(x)})")
            e = e[0]
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)):
            raise InvalidArgumentError(f"{name}: expected integers, got {type(e).__name__} {e!r} at index {i} ({_describe(x)})")
        e = int(e)
        if not lo <= e <= hi:
            raise InvalidArgumentError(f"{name}: {e} at index {i} does not fit {kind} ({_describe(x)})")
        out.append(e)
    return out


def _ints(x: Any, name: str) -> list[int]:
    """A vector of 64-bit integers from a list, numpy array or tensor ([N] or [N, 1]); None -> []."""
    return _int_vector(x, name, _INT64[0], _INT64[1], "a signed 64-bit integer", rows=True)


def _float_scalar(x: Any, name: str) -> float:
    """One real number (a Python, numpy or one-element tensor value); bools, complex and strings refused."""
    v = _to_list(x, name, "a number")
    if isinstance(v, list) and len(v) == 1:
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name}: expected a number, got {_describe(x)}")
    return float(v)


def _uints64(x: Any, name: str) -> list[int]:
    """_ints, but for values in [0, 2^64) (seeds): numpy uint64 and Python ints above 2^63 are kept."""
    return _int_vector(x, name, 0, 2 ** 64 - 1, "an unsigned 64-bit integer", rows=False)


def _int_scalar(x: Any, name: str) -> int:
    """One integer (a Python or numpy integer, or a one-element integer tensor); bools and floats refused."""
    v = _to_list(x, name, "an integer")
    if isinstance(v, list) and len(v) == 1:
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InvalidArgumentError(f"{name}: expected an integer, got {_describe(x)}")
    return int(v)


def _f32(x: Any, name: str) -> np.ndarray:
    """A float32 row-major host array (a copy when the input is not one)."""
    if _is_torch(x):
        _check_torch_host_readable(x, name, "float32 values")
        if x.is_complex():
            raise InvalidArgumentError(f"{name}: {_describe(x)}; expected real numbers (float32)")
        x = x.detach().to("cpu").float().numpy()
    if isinstance(x, np.ndarray) and (np.iscomplexobj(x) or x.dtype.kind not in "fiub"):
        raise InvalidArgumentError(f"{name}: {_describe(x)}; expected real numbers (float32)")
    try:
        a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{name}: expected float32 numbers, got {_describe(x)} ({e})") from None
    return a


def _cache_tensor(t: Any, name: str) -> Any:
    """What nanobind reads through DLPack or the buffer protocol, unchanged (no copy)."""
    if _is_torch(t):
        if t.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"{name}: {_describe(t)}; the engine reads cache tensors in cpu or cuda memory"
                        + (" (a 'meta' tensor holds no values)" if t.device.type == "meta" else ""))
        if str(t.layout) != "torch.strided":
            raise InvalidArgumentError(f"{name}: {_describe(t)} with layout {t.layout}; expected a dense (strided) tensor")
        if str(t.dtype) not in _CACHE_DTYPES:
            raise InvalidArgumentError(f"{name}: {_describe(t)}; caches must be float32, float16 or bfloat16")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        return t.detach()
    if isinstance(t, np.ndarray):
        if t.dtype not in _CACHE_NP_DTYPES:
            raise InvalidArgumentError(f"{name}: {_describe(t)}; caches must be float32, float16 or bfloat16")
        return t
    if hasattr(t, "__dlpack__"):
        return t
    if isinstance(t, (list, tuple)):
        try:
            return np.asarray(t, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"{name}: expected a tensor or array of numbers, got {_describe(t)} ({e})") from None
    raise InvalidArgumentError(f"{name}: expected a tensor or array, got {type(t).__name__}")


def cache_layers(cache: Any) -> list[tuple[Any, Any]]:
    """(K, V) per layer from a transformers Cache (`.layers[l].keys/.values`, older `key_cache`), a legacy tuple
    of tuples, or a list of (K, V). No torch import, no copy."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        out = []
        for i, layer in enumerate(layers):
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if k is None or v is None or getattr(k, "numel", lambda: 1)() == 0:
                raise InvalidArgumentError(f"cache layer {i} holds no keys/values (uninitialized or not a full-attention layer)")
            out.append((k, v))
        return out
    if hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    if isinstance(cache, (list, tuple)):
        out = []
        for i, kv in enumerate(cache):
            if not isinstance(kv, (list, tuple)) or len(kv) < 2:
                raise InvalidArgumentError(f"layer {i}: expected a (key, value) pair")
            out.append((kv[0], kv[1]))
        return out
    raise InvalidArgumentError(f"unsupported cache type {type(cache).__name__}")


# ---------------------------------------------------------------------------------------------- classes
class Model:
    """A checkpoint's expert weights loaded once into one backend: immutable, shared by any number of Sessions.

    checkpoint: a released Hugging Face directory (config.json + safetensors, single file or sharded).
    backend: "cpu" (default) or "reference" (`backends()` lists this build's); weights: the backend's weight
    format ("bf16" | "int8" for cpu; default the first); kv: the KV cache format ("bf16" | "int8" for cpu, "f32" |
    "int8" for reference; default the first; "int8" rounds every key and value row the expert attends to to int8
    with one scale per row, docs/MATH.md). threads: 0 = all cores. vlm_config: the VLM's
    config.json for R1 / 1.5 checkpoints (eps, theta, layer count); release: "r1" | "1.5" | "a2" when a fork
    renamed config.json's model_type. kernels (cpu backend): the kernels to load, "op=kernel,..." as another
    Model's `kernels` reports them, instead of timing them at load (and of the ALPAMAYO_CPU_KERNELS variable): the
    cpu backend's results match bit for bit across processes only where its kernels do. profile (cpu backend):
    record a per-step profile, read with Session.profiles().
    """

    def __init__(self, checkpoint: str, backend: str = "", weights: str = "", threads: int = 0,
                 vlm_config: str | None = None, release: str | None = None, exact_freqs: bool = False,
                 kv: str = "", kernels: str = "", profile: bool = False):
        self._m = _native().Model(str(checkpoint), backend or "", weights or "", int(threads), str(vlm_config or ""),
                                  release or "", bool(exact_freqs), profile=bool(profile), kv=kv or "",
                                  kernels=kernels or "")

    @property
    def backend(self) -> str:
        return self._m.backend

    @property
    def weights(self) -> str:
        return self._m.weights

    @property
    def kv(self) -> str:
        """The KV cache format in use."""
        return self._m.kv

    @property
    def kernels(self) -> str:
        """The kernels chosen at load, "op=kernel,..." (what `kernels=` takes); "" for backends without a choice."""
        return self._m.kernels

    @property
    def checkpoint(self) -> str:
        return self._m.checkpoint

    @property
    def config(self) -> dict:
        """The expert's configuration as the engine read it: sizes, n_waypoints, dt, num_inference_steps,
        use_classifier_free_guidance, inference_guidance_weight, release, ..."""
        return dict(self._m.config)

    @property
    def values(self) -> list[tuple[str, str, str]]:
        """Every configuration value with its source: (name, value, config key / tensor / release default)."""
        return list(self._m.values)

    def session(self) -> "Session":
        return Session(self)

    def __repr__(self) -> str:
        return f"Model({self.checkpoint!r}, backend={self.backend!r}, weights={self.weights!r}, kv={self.kv!r})"


class Context:
    """What the VLM leaves for the expert, validated once (docs/FORMATS.md has the meaning of every field).

    keys, values: per layer [G, Hkv, P, d] float32/float16/bfloat16 tensors or arrays (the prompt caches,
    keys after k_norm and rotary as transformers' cache holds them), read in place (see the module doc for
    when they are copied). valid_len [G]: rows of each prompt; rope_delta [B]: each sample's M-RoPE offset.
    Optional: prefix_pad [G] (left padding), prompt_index [B] (each sample's prompt; default B = G),
    suffix_keys / suffix_values per layer [B, Hkv, Q, d] with suffix_len [B] (each sample's own rows after its
    prompt), ego_history_xyz [B, H, 3] with ego_history_rot [B, H, 3, 3], or v0 [B]. Sample b's expert tokens
    sit at positions i + rope_delta_b + valid_len_g + suffix_len_b. The arrays must not change while the
    Context (or a Session bound to it) lives.
    """

    def __init__(self, keys: Sequence[Any], values: Sequence[Any], valid_len: Any, rope_delta: Any, *,
                 prefix_pad: Any = None, prompt_index: Any = None, suffix_keys: Sequence[Any] | None = None,
                 suffix_values: Sequence[Any] | None = None, suffix_len: Any = None, ego_history_xyz: Any = None,
                 ego_history_rot: Any = None, v0: Any = None, copy: bool = True, name: str = "context"):
        keys = [_cache_tensor(t, f"{name}: key.{l}") for l, t in enumerate(keys)]
        values = [_cache_tensor(t, f"{name}: value.{l}") for l, t in enumerate(values)]
        sk = [_cache_tensor(t, f"{name}: suffix_key.{l}") for l, t in enumerate(suffix_keys or [])]
        sv = [_cache_tensor(t, f"{name}: suffix_value.{l}") for l, t in enumerate(suffix_values or [])]
        if (ego_history_xyz is None) != (ego_history_rot is None):
            raise InvalidArgumentError(f"{name}: ego_history_xyz and ego_history_rot must be given together")
        hx = _f32(ego_history_xyz, "ego_history_xyz") if ego_history_xyz is not None else None
        hr = _f32(ego_history_rot, "ego_history_rot") if ego_history_rot is not None else None
        v0_list = None
        if v0 is not None:
            v0_list = [float(e) for e in _f32(v0, "v0").reshape(-1)]
        self._c = _native().Context.from_arrays(
            keys, values, _ints(valid_len, "valid_len"), _ints(rope_delta, "rope_delta"),
            _ints(prefix_pad, "prefix_pad"), _ints(prompt_index, "prompt_index"), sk, sv,
            _ints(suffix_len, "suffix_len"), hx, hr, v0_list, bool(copy), str(name))

    @classmethod
    def open(cls, path: str) -> "Context":
        """Maps and validates a context file (docs/FORMATS.md)."""
        self = cls.__new__(cls)
        self._c = _native().Context.open(str(path))
        return self

    @classmethod
    def from_cache(cls, past_key_values: Any, valid_len: Any, rope_delta: Any, **kwargs) -> "Context":
        """A Context over a transformers Cache (or a list of (K, V)); kwargs as for Context()."""
        kv = cache_layers(past_key_values)
        return cls([k for k, _ in kv], [v for _, v in kv], valid_len, rope_delta, **kwargs)

    @classmethod
    def from_paged(cls, key_pages: Sequence[Any], value_pages: Sequence[Any] | None, block_table: Any, valid_len: Any,
                   rope_delta: Any, *, layout: str = "NHD", ego_history_xyz: Any = None, ego_history_rot: Any = None,
                   v0: Any = None, name: str = "context") -> "Context":
        """A serving engine's paged KV cache, read in place (docs/FORMATS.md shows vLLM's, SGLang's, FlashInfer's
        and TensorRT-LLM's). key_pages, value_pages: per layer [num_pages, page_size, Hkv, d] (layout "NHD") or
        [num_pages, Hkv, page_size, d] ("HND") tensors, any strides (views of one pool for all layers, or of a
        pool holding K and V, are fine); value_pages=None when each key_pages tensor holds both as
        [num_pages, 2, ...]. block_table [B, max_pages] int32 or int64 (host memory): sample b's rows
        [p * page_size, (p + 1) * page_size) lie in page block_table[b, p]; valid_len [B]: rows of each sample.
        Samples whose tables start with the same pages share them as one prompt, read once per step for all of
        them. page_size: a power of two from 1 to 256 (1 with a token index table: SGLang's token_to_kv_pool).
        The tensors must not change while the Context (or a Session bound to it) lives."""
        keys = [_cache_tensor(t, f"{name}: key_pages[{l}]") for l, t in enumerate(key_pages)]
        values = [_cache_tensor(t, f"{name}: value_pages[{l}]") for l, t in enumerate(value_pages or [])]
        table = block_table
        if _is_torch(table):
            if str(table.dtype) not in ("torch.int32", "torch.int64"):
                raise InvalidArgumentError(f"{name}: block_table must be int32 or int64, found {_describe(table)}")
            _check_torch_host_readable(table, f"{name}: block_table", "int32 or int64 page indices")
            table = table.detach()
        elif isinstance(table, (list, tuple)):
            table = np.asarray(table, dtype=np.int64)
        elif isinstance(table, np.ndarray) and table.dtype not in (np.int32, np.int64):
            raise InvalidArgumentError(f"{name}: block_table must be int32 or int64, found {_describe(table)}")
        elif not isinstance(table, np.ndarray) and not hasattr(table, "__dlpack__"):
            raise InvalidArgumentError(f"{name}: block_table must be a [B, max_pages] int32 or int64 tensor or array, "
                                       f"found {type(table).__name__}")
        if (ego_history_xyz is None) != (ego_history_rot is None):
            raise InvalidArgumentError(f"{name}: ego_history_xyz and ego_history_rot must be given together")
        hx = _f32(ego_history_xyz, "ego_history_xyz") if ego_history_xyz is not None else None
        hr = _f32(ego_history_rot, "ego_history_rot") if ego_history_rot is not None else None
        v0_list = [float(e) for e in _f32(v0, "v0").reshape(-1)] if v0 is not None else None
        self = cls.__new__(cls)
        self._c = _native().Context.from_paged(keys, values, table, _ints(valid_len, "valid_len"),
                                               _ints(rope_delta, "rope_delta"), str(layout), hx, hr, v0_list, str(name))
        return self

    name = property(lambda self: self._c.name)
    paged = property(lambda self: self._c.paged, doc="bound from page pools and a block table (from_paged)")
    batch = property(lambda self: self._c.batch, doc="B, the samples")
    prompts = property(lambda self: self._c.prompts, doc="G, the prompt caches")
    layers = property(lambda self: self._c.layers)
    kv_heads = property(lambda self: self._c.kv_heads)
    head_dim = property(lambda self: self._c.head_dim)
    rows = property(lambda self: self._c.rows, doc="P, the prompt caches' rows")
    suffix_rows = property(lambda self: self._c.suffix_rows, doc="Q, the suffix caches' rows (0: none)")
    valid_len = property(lambda self: list(self._c.valid_len))
    prefix_pad = property(lambda self: list(self._c.prefix_pad))
    prompt_index = property(lambda self: list(self._c.prompt_index))
    suffix_len = property(lambda self: list(self._c.suffix_len))
    offsets = property(lambda self: list(self._c.offsets), doc="each sample's rotary offset valid_len_g + suffix_len_b")
    rope_delta = property(lambda self: list(self._c.rope_delta))
    has_history = property(lambda self: self._c.has_history)
    copied = property(lambda self: list(self._c.copied),
                      doc="names of the cache tensors that were copied (non-contiguous inputs); [] when all are views")

    def views(self) -> list[tuple[str, int, str, str, list[int]]]:
        """(name, data pointer, device, dtype, shape) of every cache tensor the engine reads."""
        return list(self._c.views())

    def __repr__(self) -> str:
        return (f"Context({self.name!r}, B={self.batch}, G={self.prompts}, layers={self.layers}, P={self.rows}, "
                f"Q={self.suffix_rows})")


@dataclass
class SampleResult:
    """One sample's outputs (numpy arrays, or torch tensors with output="torch"); all float32."""
    action: Any          # [B, T, A] the sampler's x_N (normalized acceleration, curvature)
    xyz: Any             # [B, T, 3] waypoints in the ego frame at t0
    yaw: Any             # [B, T]
    rot: Any             # [B, T, 3, 3]
    v0: Any              # [B] the initial speed used
    steps: int
    seconds: float       # wall time of the denoising loop
    step_seconds: list[float]
    v0_source: str
    x_steps: Any = None  # [N+1, B, T, A] with all_steps
    v_steps: Any = None  # [N, B, T, A] with all_steps
    extra: dict = field(default_factory=dict)


def _convert(a: Any, output: str) -> Any:
    if output == "numpy" or a is None:
        return a
    import torch
    return torch.from_numpy(a)


def _check_output(output: str) -> None:
    if output not in ("numpy", "torch"):
        raise InvalidArgumentError(f"output must be 'numpy' or 'torch', got {output!r}")


class Session:
    """One bound context on a shared Model, with its own buffers and threads. One call at a time (a second
    thread calling into a busy Session gets an Error); sessions of one Model run in parallel threads."""

    def __init__(self, model: Model):
        if not isinstance(model, Model):
            raise InvalidArgumentError(f"Session: expected a Model, got {type(model).__name__}")
        self.model = model
        self._s = _native().Session(model._m)
        self._ctx: Context | None = None
        self._guidance: Context | None = None

    def bind(self, context: Context, guidance: Context | None = None, guidance_weight: float | None = None,
             no_guidance: bool = False, capture_step: int | None = None, capture_layers: bool = True) -> None:
        """Validates the context against the model and binds it (a failed bind leaves the session unbound).

        guidance: the unguided context (the prompt without the navigation text, same samples and layers) for
        classifier-free guidance, v = (1 - w) v_unguided + w v_guided at every step (Alpamayo 1.5's
        FlowMatching._guided_v); guidance_weight w: default the config's inference_guidance_weight; must be
        finite and >= 0. A config with use_classifier_free_guidance needs guidance, or no_guidance=True.
        capture_step: record per-layer outputs of that Euler step (read with captures()).
        """
        if not isinstance(context, Context):
            raise InvalidArgumentError(f"bind: expected a Context, got {type(context).__name__}")
        if guidance is not None and not isinstance(guidance, Context):
            raise InvalidArgumentError(f"bind: guidance must be the unguided Context, got {type(guidance).__name__}")
        cfg = self.model.config
        if guidance is None and cfg["use_classifier_free_guidance"] and not no_guidance:
            raise InvalidArgumentError(f"{self.model.checkpoint}/config.json: use_classifier_free_guidance is true: give the "
                        "unguided context (guidance=...), or sample without guidance with no_guidance=True")
        if guidance_weight is not None and guidance is None:
            raise InvalidArgumentError("guidance_weight needs a guidance context (the unguided context)")
        w = None if guidance_weight is None else _float_scalar(guidance_weight, "guidance_weight")
        self._ctx = self._guidance = None
        self._s.bind(context._c, guidance._c if guidance is not None else None, w,
                     -1 if capture_step is None else int(capture_step), bool(capture_layers))
        self._ctx, self._guidance = context, guidance

    @property
    def bound(self) -> bool:
        return self._s.bound

    @property
    def context(self) -> Context | None:
        return self._ctx

    @property
    def buffer_bytes(self) -> int:
        return self._s.buffer_bytes

    def sample(self, *, seed: int | None = None, seeds: Sequence[int] | None = None, noise: Any = None,
               temperature: float = 1.0, steps: int | None = None, v0: float | None = None,
               all_steps: bool = False, output: str = "numpy") -> SampleResult:
        """Samples every bound sample's trajectory (N Euler steps, then the unicycle decode).

        Initial noise, the first given of: noise [B, T, A] (the caller's, e.g. drawn with torch as the release
        draws it); seeds (one per sample: sample b from its own stream, reproducible alone); seed (one for the
        batch); seed 0. It is multiplied by temperature (finite, >= 0) in float32, as the release's
        `randn(...) * temperature`. steps: default the config's num_inference_steps. v0 overrides the
        context's v0 / ego-history estimate. output: "numpy" or "torch" (zero-copy torch.from_numpy).
        """
        _check_output(output)
        nz = None
        if noise is not None:
            nz = _f32(noise, "noise")
            cfg = self.model.config
            B, T, A = (self._ctx.batch if self._ctx else 0), cfg["n_waypoints"], cfg["action_dims"]
            if self._ctx is not None and nz.shape != (B, T, A):
                raise InvalidArgumentError(f"noise: expected shape [B={B}, T={T}, A={A}], got {list(nz.shape)}")
        seed_list = []
        for s in _uints64(seeds, "seeds"):
            if s < 0 or s >= 1 << 64:
                raise InvalidArgumentError(f"seeds: seeds must be in [0, 2^64), found {s}")
            seed_list.append(s)
        if seed is not None:
            seed = _int_scalar(seed, "seed")
            if seed < 0 or seed >= 1 << 64:
                raise InvalidArgumentError(f"seed must be in [0, 2^64), found {seed}")
        if steps is not None:
            steps = _int_scalar(steps, "steps")
            if not 1 <= steps <= 100000:
                raise InvalidArgumentError(f"steps must be in [1, 100000], found {steps}")
        r = self._s.sample(0 if steps is None else int(steps), None if seed is None else int(seed), seed_list, nz,
                           _float_scalar(temperature, "temperature"), None if v0 is None else _float_scalar(v0, "v0"),
                           bool(all_steps))
        c = lambda k: _convert(r.get(k), output)  # noqa: E731
        return SampleResult(action=c("action"), xyz=c("xyz"), yaw=c("yaw"), rot=c("rot"), v0=c("v0"),
                            steps=r["steps"], seconds=r["seconds"], step_seconds=list(r["step_seconds"]),
                            v0_source=r["v0_source"], x_steps=c("x_steps"), v_steps=c("v_steps"))

    def captures(self, output: str = "numpy") -> dict:
        """The captures of the last sample (bind with capture_step=k): {'step', 'emb', 'hidden', 'layers'}."""
        _check_output(output)
        d = dict(self._s.captures())
        for k in ("emb", "hidden"):
            if k in d:
                d[k] = _convert(d[k], output)
        if "layers" in d:
            d["layers"] = [_convert(a, output) for a in d["layers"]]
        return d

    def profiles(self) -> list[dict]:
        """Model(profile=True), cpu backend: one dict per run of the layers in the last sample, in the order they ran
        (with guidance: guided, then unguided, per step): 'phases' (name, seconds, idle), 'kernels', 'ops' (gflop,
        peak, gbytes, read_gbs, compute_ms, memory_ms, floor_ms: the roofline per phase, actual_ms, achieved),
        'wall_seconds', ... and 'table', the CLI's --profile table. [] otherwise."""
        return list(self._s.profiles())
