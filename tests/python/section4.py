"""A second, transformers-free reading of docs/MATH.md section 4 (rope from the formula, GQA by index),
used only to check the oracle's use of Qwen3VLTextModel (position ids, mask, cache, M-RoPE)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from oracle import Checkpoint, ExpertContext


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):
    """x [T, H, d], pos [T] -> rotate_half convention with duplicated-halves tables (float64 angles)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).float()[:, None], torch.cat([ang.sin()] * 2, -1).float()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


@torch.no_grad()
def expert_layers(ck: Checkpoint, ctx: ExpertContext, emb: torch.Tensor) -> list[torch.Tensor]:
    """emb [B, T, D] -> per-layer outputs [B, T, D] (before the final norm), one sample at a time."""
    B, T, _ = emb.shape
    w, d, g = ck.w, ck.d, ck.Hq // ck.Hkv
    outs = [torch.empty_like(emb) for _ in range(ck.L)]
    for b in range(B):
        S = int(ctx.valid_len[b])
        pos = torch.arange(T) + int(ctx.rope_delta[b]) + S
        h = emb[b]
        for l in range(ck.L):
            p = f"expert.layers.{l}."
            a = _rms(h, w[p + "input_layernorm.weight"], ck.eps)
            q = _rms((a @ w[p + "self_attn.q_proj.weight"].T).view(T, ck.Hq, d), w[p + "self_attn.q_norm.weight"], ck.eps)
            k = _rms((a @ w[p + "self_attn.k_proj.weight"].T).view(T, ck.Hkv, d), w[p + "self_attn.k_norm.weight"], ck.eps)
            v = (a @ w[p + "self_attn.v_proj.weight"].T).view(T, ck.Hkv, d)
            q, k = _rope(q, pos, ck.theta), _rope(k, pos, ck.theta)
            K = torch.cat([ctx.keys[l][b, :, :S].transpose(0, 1), k], 0)      # [S+T, Hkv, d]
            V = torch.cat([ctx.values[l][b, :, :S].transpose(0, 1), v], 0)
            o = torch.empty(T, ck.Hq, d)
            for j in range(ck.Hq):
                s = (q[:, j] @ K[:, j // g].T) / d ** 0.5
                o[:, j] = torch.softmax(s, -1) @ V[:, j // g]
            h = h + o.reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
            a = _rms(h, w[p + "post_attention_layernorm.weight"], ck.eps)
            h = h + (F.silu(a @ w[p + "mlp.gate_proj.weight"].T) * (a @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
            outs[l][b] = h
    return outs
