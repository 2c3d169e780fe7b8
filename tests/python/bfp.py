"""bfp8_b / bfp4_b weight quantisation for the oracle, written from docs/BFP.md's rules (independently of the C++).

A weight W [N, K] (PyTorch Linear layout) is stored as a device port stores `W.T` in TILE layout: a block is 16
consecutive output features (rows of W) at one input index, with one shared exponent. q, k and v form one matrix
(`cat(q, k, v)`, the device's wqkv); o, gate, up and down one each.
"""
from __future__ import annotations

import torch

MANTISSA_BITS = {"bfp8_b": 7, "bfp4_b": 3}
BLOCK = 16


def quantize_blocks(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x [..., 16] fp32: each last-dim block quantised and dequantised (tt-metal's host packing and unpacking)."""
    W = MANTISSA_BITS[fmt]
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    e = (u >> 23) & 0xFF                                  # exponent fields; Inf/NaN would be 255
    E = e.amax(-1, keepdim=True)                          # shared exponent: the largest field
    sig = (u & 0x7FFFFF) | 0x800000                       # 24-bit significand with the hidden bit
    sig = torch.where(e == 0, torch.zeros_like(sig), sig)  # zeros and denormals encode as 0
    shift = E - e
    m = torch.where(shift >= 32, torch.zeros_like(sig), sig >> shift.clamp(max=31))
    drop = 24 - W                                         # bits below the kept W, rounded to nearest, ties to even
    q = m >> drop
    rem = m & ((1 << drop) - 1)
    half = 1 << (drop - 1)
    q = q + ((rem > half) | ((rem == half) & (q & 1 == 1))).to(torch.int64)
    q = q.clamp(max=(1 << W) - 1)                         # a carry saturates, never raises the exponent
    neg = (u >> 31) == 1
    val = q.to(torch.float64) * torch.pow(2.0, (E - 127 - (W - 1)).to(torch.float64))
    return torch.where(neg, -val, val).to(torch.float32)


def quantize_linear(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """W [N, K]: blocks of 16 rows (from row 0, zero-padded at the end) per column."""
    N, K = w.shape
    pad = (-N) % BLOCK
    wt = torch.cat([w.float(), torch.zeros(pad, K)]) if pad else w.float()
    blocks = wt.T.reshape(K, (N + pad) // BLOCK, BLOCK)
    return quantize_blocks(blocks, fmt).reshape(K, N + pad).T[:N].contiguous()


def quantize_checkpoint(w: dict[str, torch.Tensor], L: int, fmt: str) -> dict[str, torch.Tensor]:
    """The expert's weight matrices as the device holds them (R1 key names, as oracle.load_checkpoint gives)."""
    out = dict(w)
    for l in range(L):
        p = f"expert.layers.{l}."
        names = [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
        sizes = [w[n].shape[0] for n in names]
        for n, q in zip(names, quantize_linear(torch.cat([w[n] for n in names]), fmt).split(sizes)):
            out[n] = q
        for n in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            out[p + n + ".weight"] = quantize_linear(w[p + n + ".weight"], fmt)
    return out
