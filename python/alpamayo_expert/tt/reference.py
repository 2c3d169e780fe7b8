"""The reference each TT-Lang operation is proven against: the same math in float32 torch (HF Qwen3 semantics,
docs/MATH.md section 4), on the same inputs (bf16-rounded activations, quantised weights)."""
from __future__ import annotations

import torch


def rms(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def rope_tables(positions: torch.Tensor, d: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., d] for integer positions, as transformers' default rotary embedding computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def qk_rope(qkv: torch.Tensor, gq, gk, cos, sin, Hq: int, Hkv: int, d: int, eps: float):
    """qkv [N, (Hq + 2 Hkv) d] -> q [N, Hq, d], k [N, Hkv, d] (normed, roped), v [N, Hkv, d]."""
    N = qkv.shape[0]
    q = qkv[:, :Hq * d].reshape(N, Hq, d)
    k = qkv[:, Hq * d:(Hq + Hkv) * d].reshape(N, Hkv, d)
    v = qkv[:, (Hq + Hkv) * d:].reshape(N, Hkv, d)
    q, k = rms(q, gq, eps), rms(k, gk, eps)
    c, s = cos[:, None, :], sin[:, None, :]
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v


def attention(q, keys, values, keep, scale: float) -> torch.Tensor:
    """q [T, Hq, d]; keys/values [Hkv, R, d]; keep [R] bool -> [T, Hq * d] (softmax over the kept rows)."""
    T, Hq, d = q.shape
    G = Hq // keys.shape[0]
    k = keys.repeat_interleave(G, 0)[:, keep]
    v = values.repeat_interleave(G, 0)[:, keep]
    p = torch.softmax(torch.einsum("thd,hrd->htr", q, k) * scale, -1)
    return torch.einsum("htr,hrd->thd", p, v).reshape(T, Hq * d)


def layer(x: torch.Tensor, w: dict, k_cache: torch.Tensor, v_cache: torch.Tensor, keep: torch.Tensor, cos, sin,
          Hq: int, Hkv: int, d: int, eps: float, cache_round=None):
    """One decoder layer over x [B, Tp, D] as the fused operations compute it, own K/V at the caches' tail
    ([B, Hkv, Smax, d], rows [Smax - Tp, Smax)); keep [B, Smax] the rows attended; cache_round: how the cache's
    format stores the own rows (None: exactly). Returns (x_out, k_own, v_own)."""
    B, Tp, D = x.shape
    xf = x.reshape(B * Tp, D)
    q, k, v = qk_rope(rms(xf, w["input_norm"], eps) @ w["wqkv"], w["q_norm"], w["k_norm"], cos, sin, Hq, Hkv, d,
                      eps)
    k, v = k.reshape(B, Tp, Hkv, d).transpose(1, 2), v.reshape(B, Tp, Hkv, d).transpose(1, 2)
    if cache_round is not None:
        k, v = cache_round(k), cache_round(v)
    q = q.reshape(B, Tp, Hq, d)
    Smax = k_cache.shape[2]
    out = []
    for b in range(B):
        keys, values = k_cache[b].clone(), v_cache[b].clone()
        keys[:, Smax - Tp:], values[:, Smax - Tp:] = k[b], v[b]
        out.append(attention(q[b], keys, values, keep[b], d ** -0.5))
    x1 = xf + torch.cat(out) @ w["wo"]
    n = rms(x1, w["post_norm"], eps)
    x2 = x1 + (torch.nn.functional.silu(n @ w["wgate"]) * (n @ w["wup"])) @ w["wdown"]
    return x2.reshape(B, Tp, D), k, v
