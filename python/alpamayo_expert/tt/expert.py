"""The expert on TT-Lang: weights converted once, the layers as fused operations, the sampler on the host.

What runs where (docs/TT_BACKEND.md): action_in_proj, action_out_proj, the Euler update and the unicycle decode on
the host (float32 torch, the decode and v0 the engine's own through the native module); the L layers and the final
norm as the TT-Lang operations of kernels.py on a grid of nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import _core
from ..context import Context as ContextFile, read_context
from ..errors import InvalidArgumentError, UnsupportedError
from . import kernels as K
from ._runtime import open_runtime
from .reference import rope_tables

WEIGHT_FORMATS = ("bfp8_b", "bf16")
CACHE_FORMATS = ("bf16", "bfp8_b")
BLACKHOLE_GRID = (11, 10)   # the p150's Tensix grid the seed used
MASKED = -1.0e9             # additive mask of a hidden cache row: exp() of it is 0, and never inf - inf
T = K.TILE


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> nearest bf16 (ties to even) -> float32, by bits (independent of torch.bfloat16, which
    tt-lang-sim may rebind)."""
    u = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return torch.from_numpy(u.numpy().astype(np.uint32).view(np.float32)).reshape(x.shape)


def quantize_weight(wt: torch.Tensor, fmt: str) -> torch.Tensor:
    """A weight as the device holds it, W.T [K, N] in TILE layout: bfp8_b blocks are 16 consecutive values of a
    row (one face row), quantised with the engine's own code (the simulator backs bfloat8_b with float32 and does
    not round); bf16 rounded to nearest even."""
    wt = wt.float().contiguous()
    if fmt == "bfp8_b":
        return torch.from_numpy(np.asarray(_core.bfp_quantize(wt.numpy(), "bfp8_b")))
    return round_bf16(wt)


def _pad_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _divisor_at_most(n: int, cap: int) -> int:
    return max(k for k in range(1, min(n, cap) + 1) if n % k == 0)


@dataclass
class Bound:
    """A context bound to the device: per-sample rows in use and the rotary offsets."""
    B: int
    S: list[int]
    pads: list[int]
    offsets: list[int]
    rope_delta: list[int]
    v0: list[float] | None
    z: list[float]
    v0_source: str = ""


class TTExpert:
    """The expert of a checkpoint on a TT backend ("tt-sim" or "tt").

    grid: the node grid the operations run on (Blackhole's 11 x 10 by default); key_chunk: key tiles per attention
    chunk; smax: the cache rows per (sample, KV head) on the device, scratch tail included (default: the least
    multiple of the chunk that holds the longest context plus the own tokens); keep_host: keep host copies of what
    the device holds (host_layers, k_host, v_host) for checks against the reference ops; cache: the K/V cache's
    format on the device, bf16 or bfp8_b (the context's rows quantised once at bind, the own rows by the packer
    as qkv_rope writes them; docs/ACCURACY.md section 5)."""

    def __init__(self, checkpoint: str | Path, backend: str = "tt-sim", weights: str = "bfp8_b",
                 vlm_config: str = "", release: str = "", grid: tuple[int, int] = BLACKHOLE_GRID,
                 key_chunk: int = 4, smax: int | None = None, keep_host: bool = False, cache: str = "bf16"):
        if weights not in WEIGHT_FORMATS:
            raise InvalidArgumentError(f"weights: {weights!r} is not one of {', '.join(WEIGHT_FORMATS)}")
        if cache not in CACHE_FORMATS:
            raise InvalidArgumentError(f"cache: {cache!r} is not one of {', '.join(CACHE_FORMATS)}")
        self.cache = cache
        self.rt = open_runtime(backend)
        self.ttl, self.ttnn = self.rt.ttl, self.rt.ttnn
        self.backend, self.weights, self.grid, self.key_chunk, self.smax_arg = backend, weights, grid, key_chunk, smax
        # The engine's loader: one reading of configs and tensors for every backend.
        self.model = _core.Model(str(checkpoint), backend="reference", vlm_config=vlm_config, release=release)
        c = self.cfg = dict(self.model.config)
        self.L, self.D, self.Hq, self.Hkv, self.d, self.I = (c[k] for k in (
            "layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))
        self.Tw, self.A, self.eps = c["n_waypoints"], c["action_dims"], float(c["rms_norm_eps"])
        for name, v in (("hidden_size", self.D), ("head_dim", self.d), ("intermediate_size", self.I)):
            if v % T:
                raise UnsupportedError(f"backend {backend}: {name} {v} is not a multiple of the 32-wide tile")
        self.Tp = _pad_to(self.Tw, T)  # own tokens padded to whole tiles; the padding rows are masked as keys
        self.keep_host = keep_host
        self.host = self._tensors("action_")
        self._convert_weights()
        self._bound: Bound | None = None
        self._smax_bound = 0

    # ------------------------------------------------------------------------------------------ weights
    def _up(self, t: torch.Tensor, dtype=None, l1: bool = False):
        """A device tensor: DRAM, or L1 (l1) for the activations and the small tensors every node reads
        (docs/TT_BACKEND.md)."""
        ttnn = self.ttnn
        mc = ttnn.L1_MEMORY_CONFIG if l1 else ttnn.DRAM_MEMORY_CONFIG
        return ttnn.from_torch(t.float().contiguous(), dtype=dtype or ttnn.bfloat16, layout=ttnn.TILE_LAYOUT,
                               device=self.rt.device, memory_config=mc)

    def _tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.asarray(v)) for k, v in self.model.tensors(prefix).items()}

    def _convert_weights(self) -> None:
        """Once: the layers' matrices transposed (W.T, the device's layout), wq/wk/wv fused, quantised; one layer
        at a time through host memory."""
        ttnn = self.ttnn
        wdt = ttnn.bfloat8_b if self.weights == "bfp8_b" else ttnn.bfloat16
        rep = lambda g: round_bf16(g).reshape(1, -1).expand(T, -1)  # noqa: E731 - gains replicated down a tile
        self.layers, self.host_layers = [], []
        for l in range(self.L):
            p = f"layers.{l}."
            w = self._tensors(p)
            mats = {"wqkv": torch.cat([w[p + "q"], w[p + "k"], w[p + "v"]]).T, "wo": w[p + "o"].T,
                    "wgate": w[p + "gate"].T, "wup": w[p + "up"].T, "wdown": w[p + "down"].T}
            q = {k: quantize_weight(m, self.weights) for k, m in mats.items()}
            gains = {k: round_bf16(w[p + k]) for k in ("input_norm", "post_norm", "q_norm", "k_norm")}
            if self.keep_host:
                self.host_layers.append({**q, **gains})  # what the device holds, for the per-operation checks
            dev = {k: self._up(m, wdt) for k, m in q.items()}
            dev.update({k: self._up(rep(g)) for k, g in gains.items()})
            self.layers.append(dev)
        self.final_norm = self._up(rep(self._tensors("final_norm")["final_norm"]))
        self.consts = self._up(K.constants(self.D, self.eps, self.d), ttnn.float32)
        rot = torch.zeros(self.d, self.d)
        h = self.d // 2
        rot[torch.arange(h) + h, torch.arange(h)] = -1.0
        rot[torch.arange(h), torch.arange(h) + h] = 1.0
        self.rot = self._up(rot)

    # ------------------------------------------------------------------------------------------ context
    def bind(self, context: str | Path | ContextFile) -> None:
        """Loads a context: the device caches (rows in use; the rest zero), the mask and the rope tables, and every
        buffer the layers use; all persistent buffers exist before the first step (the seed's trace rule)."""
        ctx = read_context(context) if not isinstance(context, ContextFile) else context
        if ctx.num_layers != self.L:
            raise InvalidArgumentError(f"context has {ctx.num_layers} layers, the expert {self.L}")
        if ctx.keys[0].shape[1] != self.Hkv or ctx.keys[0].shape[3] != self.d:
            raise InvalidArgumentError(f"context caches [G, {ctx.keys[0].shape[1]}, P, {ctx.keys[0].shape[3]}] do "
                                       f"not match the expert's {self.Hkv} KV heads of {self.d}")
        g_of, vl, sl, pads = ctx.prompt_of(), ctx.valid_len.long(), ctx.suffix_lens(), ctx.pads()
        B = int(g_of.shape[0])
        S = [int(vl[g_of[b]] + sl[b]) for b in range(B)]
        chunk = self.key_chunk * T
        smax = self.smax_arg or _pad_to(max(S) + self.Tp, chunk)
        if smax % chunk:
            raise InvalidArgumentError(f"smax {smax} is not a multiple of the key chunk ({chunk} rows)")
        if max(S) > smax - self.Tp:  # the last Tp rows of every cache are the own tokens' scratch
            raise InvalidArgumentError(f"context of {max(S)} rows: the device cache holds S <= Smax - {self.Tp} = "
                                       f"{smax - self.Tp}")
        self.Smax = smax
        self._upload_caches(ctx, g_of, S, [int(pads[g_of[b]]) for b in range(B)])
        keep = torch.zeros(B, smax, dtype=torch.bool)
        for b in range(B):
            keep[b, int(pads[g_of[b]]):S[b]] = True
            keep[b, smax - self.Tp:smax - self.Tp + self.Tw] = True
        self.keep = keep
        mask = torch.where(keep, 0.0, MASKED).repeat_interleave(T, 0)  # rows replicated down a tile per sample
        # At least G*Tp rows: the scores' dataflow buffer takes its shape from this tensor (a buffer's likeness
        # tensor must be as large as its blocks); the rows past B*32 are never read.
        rows = max(B, self.Hq // self.Hkv * self.Tp // T) * T
        mask = torch.cat([mask, torch.zeros(rows - mask.shape[0], smax)]) if rows > mask.shape[0] else mask
        # Per sample, the key chunks holding context rows (attention's run-time loop bound), left padding and whole
        # context rows (which chunks read the mask): kernels.kv_chunk_counts.
        self.kv_chunks_host = K.kv_chunk_counts(S, [int(pads[g_of[b]]) for b in range(B)], chunk)
        kv_chunks = self.kv_chunks_host
        offsets = [S[b] + int(ctx.rope_delta[b]) for b in range(B)]
        pos = torch.tensor(offsets)[:, None] + torch.arange(self.Tp)[None]  # padding rows: any position
        cos, sin = rope_tables(pos.reshape(-1), self.d, float(self.cfg["rope_theta"]))
        self.cos_host, self.sin_host = round_bf16(cos), round_bf16(sin)
        v0 = ctx.v0.float().tolist() if ctx.v0 is not None else None
        v0_source = "context v0" if v0 is not None else ""
        z = [0.0] * B
        if v0 is None and ctx.ego_history_xyz is not None:
            v0_source = "ego history"
            xyz, rot = ctx.ego_history_xyz.float().numpy(), ctx.ego_history_rot.float().numpy()
            v0 = [float(self.model.estimate_v0(np.ascontiguousarray(xyz[b]), np.ascontiguousarray(rot[b])))
                  for b in range(B)]
        if ctx.ego_history_xyz is not None:
            z = [float(ctx.ego_history_xyz[b, -1, 2]) for b in range(B)]
        self._allocate(B, mask, kv_chunks)
        self._bound = Bound(B, S, [int(pads[g_of[b]]) for b in range(B)], offsets, ctx.rope_delta.tolist(), v0, z,
                            v0_source)
        self._smax_bound = self.Smax

    def _upload_caches(self, ctx: ContextFile, g_of, S: list[int], pads: list[int]) -> None:
        """Per layer K and V [B*Hkv*Smax, d] in the cache format: sample b's prompt rows [pad, valid_len) then its
        suffix rows, zero elsewhere (rows outside use never reach the device, so their contents cannot matter).
        bfp8_b: the bf16 rows quantised by the engine's code, blocks of 16 consecutive values of a row as for the
        weights (the simulator would hold them unrounded)."""
        B = len(S)
        reuse = self._bound is not None and (self._bound.B, self._smax_bound) == (B, self.Smax)
        if not reuse:
            self.k_cache, self.v_cache = [], []
        self.k_host, self.v_host = [], []
        vl, sl = ctx.valid_len.long(), ctx.suffix_lens()
        for l in range(self.L):
            for src, sfx, host, dev in ((ctx.keys[l], ctx.suffix_keys, self.k_host, self.k_cache),
                                        (ctx.values[l], ctx.suffix_values, self.v_host, self.v_cache)):
                t = torch.zeros(B, self.Hkv, self.Smax, self.d)
                for b in range(B):
                    g, n = int(g_of[b]), int(vl[g_of[b]])
                    t[b, :, pads[b]:n] = src[g, :, pads[b]:n].float()
                    if sfx is not None and int(sl[b]):
                        t[b, :, n:S[b]] = sfx[l][b, :, :int(sl[b])].float()
                t = self._cache_values(round_bf16(t))
                if reuse:  # same sizes: the same device buffers, rewritten
                    self._write(dev[l], t.reshape(-1, self.d))
                else:
                    dev.append(self._up(t.reshape(-1, self.d), self._cache_dtype()))
                if self.keep_host:
                    host.append(t)

    def _cache_dtype(self):
        return self.ttnn.bfloat8_b if self.cache == "bfp8_b" else self.ttnn.bfloat16

    def _cache_values(self, t: torch.Tensor) -> torch.Tensor:
        """Cache rows [..., d] (bf16 values) as the cache format holds them."""
        if self.cache == "bf16":
            return t
        return quantize_weight(t.reshape(-1, self.d), "bfp8_b").reshape(t.shape)

    def _pack_own_rows(self, l: int) -> None:
        """bfp8_b cache in the simulator: qkv_rope's own K/V rows rounded to bfp8_b as the chip's packer writes
        them into a bfp8_b tensor (the simulator stores them unrounded). The packer rounds ties up where this
        quantiser rounds them to even (docs/BFP.md), which differs only at exact ties."""
        B, Tp = len(self.kv_chunks_host) // T, self.Tp
        for buf in (self.k_cache[l], self.v_cache[l]):
            t = self.ttnn.to_torch(buf).view(B * self.Hkv, self.Smax, self.d)
            t[:, self.Smax - Tp:] = self._cache_values(t[:, self.Smax - Tp:].float().clone())

    def _allocate(self, B: int, mask: torch.Tensor, kv_chunks: torch.Tensor) -> None:
        """The layers' buffers and operations, for (B, Smax): kept while those stay (a new context of other
        lengths only rewrites the mask, the context chunk counts, the rope tables and the caches in place)."""
        if self._bound is not None and (self._bound.B, self._smax_bound) == (B, self.Smax):
            for name, value in (("mask", mask), ("kv_chunks", kv_chunks), ("cos", self.cos_host),
                                ("sin", self.sin_host)):
                self._write(self.buf[name], value)
            return
        ttnn, ttl, grid = self.ttnn, self.ttl, self.grid
        M, Tpt, dt, Smaxt = B * self.Tp, self.Tp // T, self.d // T, self.Smax // T
        G = self.Hq // self.Hkv
        nodes = grid[0] * grid[1]
        items = B * self.Hkv * G * Tpt  # query row tiles
        # The key sequence split so that every node has a (sample, KV head, split) to attend over.
        self.nsplit = max(1, min(nodes // (B * self.Hkv), Smaxt // self.key_chunk))
        zeros = lambda r, c, dtype=None: self._up(torch.zeros(r, c), dtype, l1=True)  # noqa: E731
        U = items * self.nsplit
        self.buf = {
            "x": zeros(M, self.D), "x1": zeros(M, self.D), "q": zeros(items * T, self.d),
            "o_part": zeros(U * T, self.d, ttnn.float32), "m_part": zeros(U * T, T, ttnn.float32),
            "l_part": zeros(U * T, T, ttnn.float32), "attn": zeros(M, self.Hq * self.d), "act": zeros(M, self.I),
            # The mask and the chunk counts in L1 too: every attention unit reads them, and in DRAM they would
            # take a share of the cache's stream.
            "hidden": zeros(M, self.D), "mask": self._up(mask, l1=True),
            "kv_chunks": self._up(kv_chunks, ttnn.float32, l1=True),
            "cos": self._up(self.cos_host, l1=True),
            "sin": self._up(self.sin_host, l1=True), "none": zeros(T, T),
        }
        Dt, It = self.D // T, self.I // T
        # A linear's unit: as many row tiles as the constants tensor allows (all of them up to B = 4 at 64 tokens,
        # so each weight block is read once) x one output tile (the most units, so the most nodes streaming).
        mb = _divisor_at_most(M // T, K.CONST_ROWS)
        lin = lambda Kt, Nt_, **kw: K.make_linear(ttl, grid, M // T, Kt, Nt_, _divisor_at_most(Kt, 8),  # noqa: E731
                                                  1, mb=mb, **kw)
        self.ops = {
            "qkv_rope": K.make_qkv_rope(ttl, grid, B, Tpt, Dt, _divisor_at_most(Dt, 8), self.Hq, self.Hkv, dt, Smaxt),
            "attn": K.make_attention_partial(ttl, grid, B, self.Hkv, G * Tpt, dt, Smaxt, self.key_chunk, self.nsplit,
                                             Tpt),
            "merge": K.make_attention_merge(ttl, grid, B, self.Hkv, G, Tpt, dt, self.nsplit, Smaxt,
                                           self.key_chunk),
            "o": lin(self.Hq * dt, Dt, norm=False, gated=False, residual=True),
            "mlp": lin(Dt, It, norm=True, gated=True, residual=False),
            "down": lin(It, Dt, norm=False, gated=False, residual=True),
            "final": K.make_rmsnorm(ttl, grid, M // T, Dt),
        }

    def _write(self, buf, value: torch.Tensor) -> None:
        """Host -> an existing device buffer (its address stays, as a captured trace needs)."""
        ttnn = self.ttnn
        if hasattr(ttnn, "copy_host_to_device_tensor"):
            ttnn.copy_host_to_device_tensor(ttnn.from_torch(value.float(), dtype=buf.dtype,
                                                            layout=ttnn.TILE_LAYOUT), buf)
        else:  # the simulator: a device tensor is its backing torch tensor
            ttnn.to_torch(buf).copy_(value.float())

    # ------------------------------------------------------------------------------------------ the layer
    def run_layer(self, l: int) -> None:
        """Layer l on buf['x'] in place, through the fused operations (a) .. (f), (a) and (b) in one."""
        b, dev, ops, none = self.buf, self.layers[l], self.ops, self.buf["none"]
        ops["qkv_rope"](b["x"], dev["wqkv"], dev["input_norm"], dev["q_norm"], dev["k_norm"], b["cos"], b["sin"],
                        self.rot, self.consts, b["q"], self.k_cache[l], self.v_cache[l])              # (a) + (b)
        if self.cache == "bfp8_b" and self.backend == "tt-sim":
            self._pack_own_rows(l)
        ops["attn"](b["q"], self.k_cache[l], self.v_cache[l], b["mask"], b["kv_chunks"], self.consts, b["o_part"],
                    b["m_part"], b["l_part"])                                                                      # (c)
        ops["merge"](b["o_part"], b["m_part"], b["l_part"], b["kv_chunks"], b["attn"])
        ops["o"](b["attn"], dev["wo"], none, none, b["x"], self.consts, b["x1"])                      # (d)
        ops["mlp"](b["x1"], dev["wgate"], dev["wup"], dev["post_norm"], none, self.consts, b["act"])  # (e)
        ops["down"](b["act"], dev["wdown"], none, none, b["x1"], self.consts, b["x"])                 # (f)

    def run_layers(self, emb: torch.Tensor) -> torch.Tensor:
        """emb [B, Tw, D] -> final-normed hidden [B, Tw, D] (float32, read back from the device)."""
        B = self._require_bound().B
        x = torch.zeros(B, self.Tp, self.D)
        x[:, :self.Tw] = emb
        self._write(self.buf["x"], round_bf16(x.reshape(-1, self.D)))
        for l in range(self.L):
            self.run_layer(l)
        self.ops["final"](self.buf["x"], self.final_norm, self.consts, self.buf["hidden"])
        h = self.ttnn.to_torch(self.buf["hidden"]).float().clone()
        return h.reshape(B, self.Tp, self.D)[:, :self.Tw]

    def _require_bound(self) -> Bound:
        if self._bound is None:
            raise InvalidArgumentError("no context bound: call bind(context) first")
        return self._bound

    # ------------------------------------------------------------------------------------------ host stages
    def action_in_proj(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x [B, T, A], t [B] -> [B, T, D] in float32, with the checkpoint's (bf16-rounded) Fourier frequencies."""
        w, c = self.host, self.cfg
        B, Tw, A = x.shape
        n = c["ain_layers"]
        default = fourier_freqs(int(c["num_fourier_feats"]), float(c["max_freq"]))
        fr = lambda i: w.get(f"action_in.freqs.{i}", default)  # noqa: E731
        feats = [fourier(x[:, :, i], fr(i)) for i in range(A)]
        h = torch.cat(feats + [fourier(t.reshape(B, 1), fr(A)).expand(B, Tw, -1)], -1)
        h = F.silu(F.linear(h, w["action_in.linear_w.0"], w["action_in.linear_b.0"]))
        e = float(c["ain_norm_eps"])
        for j in range(n):
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + e) * w[f"action_in.norm_w.{j}"]
            h = F.linear(h, w[f"action_in.linear_w.{j + 1}"], w[f"action_in.linear_b.{j + 1}"])
            if j < n - 1:
                h = F.silu(h)
        return F.layer_norm(h, (self.D,), w["action_in.ln_w"], w["action_in.ln_b"], eps=e)

    def step(self, x: torch.Tensor, t: float) -> torch.Tensor:
        """One velocity evaluation: x [B, T, A] -> v [B, T, A]."""
        B = self._require_bound().B
        emb = self.action_in_proj(x.float(), torch.full((B,), float(t)))
        h = self.run_layers(emb)
        return F.linear(h, self.host["action_out.w"], self.host["action_out.b"])

    def sample(self, noise: torch.Tensor, steps: int | None = None, v0: float | None = None) -> dict[str, Any]:
        """The N-step Euler sample from noise [B, T, A] and the engine's unicycle decode: x_steps [N+1, B, T, A],
        v_steps [N, B, T, A], action, xyz [B, T, 3], yaw [B, T], rot [B, T, 3, 3], v0 [B] (numpy float32, the
        result file's names). v0: the initial speed of every sample, else the context's (given or estimated)."""
        bd = self._require_bound()
        N = steps or int(self.cfg["num_inference_steps"])
        times = torch.linspace(0.0, 1.0, N + 1, dtype=torch.float32)
        x = torch.as_tensor(noise, dtype=torch.float32).clone()
        if tuple(x.shape) != (bd.B, self.Tw, self.A):
            raise InvalidArgumentError(f"noise: expected shape [{bd.B}, {self.Tw}, {self.A}], got {list(x.shape)}")
        v0s = [float(v0)] * bd.B if v0 is not None else bd.v0
        if v0s is None:
            raise InvalidArgumentError("the context has neither v0 nor ego_history_xyz/ego_history_rot; give v0")
        xs, vs = [x], []
        for k in range(N):
            v = self.step(x, float(times[k]))
            x = x + (times[k + 1] - times[k]) * v
            xs.append(x)
            vs.append(v)
        out = {"x_steps": torch.stack(xs).numpy(), "v_steps": torch.stack(vs).numpy(), "action": x.numpy()}
        xyz, yaw, rot = zip(*(self.model.decode_action(np.ascontiguousarray(x[b].numpy()), v0s[b], bd.z[b])
                              for b in range(bd.B)))
        out.update(xyz=np.stack(xyz), yaw=np.stack(yaw), rot=np.stack(rot), v0=np.asarray(v0s, np.float32),
                   v0_source="given" if v0 is not None else bd.v0_source)
        return out


def fourier_freqs(n: int, max_freq: float) -> torch.Tensor:
    """logspace(0, log10(max_freq), n/2) rounded to bf16, as the release's bf16 buffers hold them."""
    return round_bf16(torch.logspace(0, math.log10(max_freq), n // 2, dtype=torch.float32))


def fourier(z: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    arg = z[..., None] * freqs.reshape(-1) * 2 * math.pi
    return torch.cat([arg.sin(), arg.cos()], -1) * math.sqrt(2)

