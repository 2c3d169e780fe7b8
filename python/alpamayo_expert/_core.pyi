"""Type stubs of the native module (src/python/module.cpp). Use the classes of alpamayo_expert (engine.py)."""
from typing import Any, Optional, Sequence

import numpy as np

from .errors import (Error as Error, FileIOError as FileIOError, FormatError as FormatError,
                     InternalError as InternalError, InvalidArgumentError as InvalidArgumentError,
                     InvalidStateError as InvalidStateError, NonFiniteError as NonFiniteError,
                     OutOfMemoryError as OutOfMemoryError, UnsupportedError as UnsupportedError)

def backends() -> list[tuple[str, list[str], list[str], str]]: ...
def backend_formats(name: str) -> list[tuple[str, str]]: ...
# Each run of 16 consecutive values of x quantised to fmt ("bfp8_b", "bfp4_b") and back, by the engine's bfp code.
def bfp_quantize(x: np.ndarray, fmt: str) -> np.ndarray: ...
# The sampler's standard normal draw of n values for a seed (SplitMix64 + Box-Muller, docs/FORMATS.md).
def gaussian_noise(seed: int, n: int) -> np.ndarray: ...

class Model:
    def __init__(self, checkpoint: str, backend: str = "", weights: str = "", threads: int = 0,
                 vlm_config: str = "", release: str = "", exact_freqs: bool = False, profile: bool = False,
                 kv: str = "", kernels: str = "") -> None: ...
    @property
    def backend(self) -> str: ...
    @property
    def weights(self) -> str: ...
    @property
    def kv(self) -> str: ...
    @property
    def kernels(self) -> str: ...
    @property
    def checkpoint(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def values(self) -> list[tuple[str, str, str]]: ...
    @property
    def weight_bytes(self) -> int: ...
    # The checkpoint's weights whose names start with prefix, as float32 arrays named as in weights.h (layers.{l}.q,
    # ..., final_norm, action_in.*, action_out.*).
    def tensors(self, prefix: str = "") -> dict[str, np.ndarray]: ...
    # The engine's unicycle decode of one action [T, A]: (xyz [T, 3], yaw [T], rot [T, 3, 3]).
    def decode_action(self, action: np.ndarray, v0: float, z: float = 0.0) -> tuple[np.ndarray, np.ndarray,
                                                                                     np.ndarray]: ...
    # The engine's v0 from one ego history xyz [H, 3], rot [H, 3, 3].
    def estimate_v0(self, xyz: np.ndarray, rot: np.ndarray) -> float: ...

class Context:
    @staticmethod
    def open(path: str) -> Context: ...
    @staticmethod
    def from_arrays(keys: Sequence[Any], values: Sequence[Any], valid_len: Sequence[int], rope_delta: Sequence[int],
                    prefix_pad: Sequence[int], prompt_index: Sequence[int], suffix_keys: Sequence[Any],
                    suffix_values: Sequence[Any], suffix_len: Sequence[int], history_xyz: Optional[np.ndarray],
                    history_rot: Optional[np.ndarray], v0: Optional[Sequence[float]], copy: bool,
                    name: str) -> Context: ...
    @staticmethod
    def from_paged(key_pages: Sequence[Any], value_pages: Sequence[Any], block_table: Any, valid_len: Sequence[int],
                   rope_delta: Sequence[int], layout: str, history_xyz: Optional[np.ndarray],
                   history_rot: Optional[np.ndarray], v0: Optional[Sequence[float]], name: str) -> Context: ...
    paged: bool
    name: str
    batch: int
    prompts: int
    layers: int
    kv_heads: int
    head_dim: int
    rows: int
    suffix_rows: int
    valid_len: list[int]
    prefix_pad: list[int]
    prompt_index: list[int]
    suffix_len: list[int]
    offsets: list[int]
    rope_delta: list[int]
    has_history: bool
    v0: Optional[list[float]]
    copied: list[str]
    def views(self) -> list[tuple[str, int, str, str, list[int]]]: ...

class Session:
    def __init__(self, model: Model) -> None: ...
    def bind(self, context: Context, guidance: Optional[Context] = None, guidance_weight: Optional[float] = None,
             capture_step: int = -1, capture_layers: bool = True) -> None: ...
    @property
    def bound(self) -> bool: ...
    @property
    def buffer_bytes(self) -> int: ...
    def sample(self, steps: int = 0, seed: Optional[int] = None, seeds: Sequence[int] = ...,
               noise: Optional[np.ndarray] = None, temperature: float = 1.0, v0: Optional[float] = None,
               all_steps: bool = False) -> dict[str, Any]: ...
    def captures(self) -> dict[str, Any]: ...
    # Model(profile=True), cpu backend: one dict per run of the layers in the last sample (phases, kernels, ops,
    # "table": the CLI's --profile table); [] otherwise.
    def profiles(self) -> list[dict[str, Any]]: ...
