"""A torch emulation of the cpu backend's bf16 path (docs/CPU_BACKEND.md, "One layer" and "Attention") with a
chosen fp32 summation order for every reduction, to stand in for kernels we cannot run here (oneDNN on AMX tiles,
vdpbf16ps, other blockings).

Roundings, as the engine does them: bf16 (RNE) at the matmul inputs (the normed input of q/k/v and of gate/up, the
attention output before o_proj, silu(gate) * up before down), on q and k after q/k norm and rope, on v, on the KV
cache rows (an f32 or f16 cache is converted to bf16 at bind), on the probabilities that weight V (as the vdpbf16ps
and portable attention kernels do; the fp32-FMA ones keep them in fp32, Emulation.prob_bits = None; the normaliser
l sums them unrounded either way), and on the five weight matrices. Everything else is fp32: the residual stream, the
norms, rope (fp32 tables as src/model/sampler.cpp builds them), the softmax (base 2, scale log2(e) / sqrt(d)
applied after the dot, against the exact row max so the largest probability is exactly 1), the final norm and the
host's action_out_proj (fp32 weights).

Every sum of products (matmul K, q.k over d, p.V and l over keys, the norms' sums of squares) runs in fp32 in the
chosen order; with bf16 operands the products are exact in fp32, so only the order of the additions differs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from oracle import Checkpoint, ExpertContext

ORDERS = ("sequential", "reversed", "pairwise", "blocked16", "blocked64", "pairs", "random", "split2")
LOG2E = 1.4426950408889634


def round_bits(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Round to `bits` significant bits, to nearest even (8: bf16 RNE for normal numbers)."""
    m, e = torch.frexp(x)                       # x = m 2^e, 0.5 <= |m| < 1: m 2^bits has `bits` integer bits
    return torch.ldexp(torch.round(m * 2.0 ** bits) / 2.0 ** bits, e)  # torch.round: half to even


def _chain(t: torch.Tensor) -> torch.Tensor:
    """One left-to-right fp32 chain over dim 0."""
    acc = t[0].clone()
    for k in range(1, t.shape[0]):
        acc += t[k]
    return acc


def _pad(t: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero terms at the end (adding +0 leaves an fp32 sum unchanged)."""
    r = (-t.shape[0]) % multiple
    return t if r == 0 else torch.cat([t, t.new_zeros((r,) + t.shape[1:])])


def ordered_sum(t: torch.Tensor, order: str, seed: int = 0) -> torch.Tensor:
    """sum over dim 0 of fp32 terms t [K, ...], every addition rounded to fp32, in `order`."""
    assert t.dtype == torch.float32
    if order == "sequential":
        return _chain(t)
    if order == "reversed":
        return _chain(t.flip(0))
    if order == "pairwise":                     # balanced tree
        while t.shape[0] > 1:
            t = _pad(t, 2)
            t = t[0::2] + t[1::2]
        return t[0].clone()
    if order.startswith("blocked"):             # chains within blocks of n, then the block sums chained
        n = int(order[len("blocked"):])
        t = _pad(t, n)
        return _chain(_chain(t.view(t.shape[0] // n, n, *t.shape[1:]).transpose(0, 1)))
    if order == "pairs":                        # vdpbf16ps: each pair of adjacent products summed, then chained
        t = _pad(t, 2)
        return _chain(t[0::2] + t[1::2])
    if order == "random":
        g = torch.Generator().manual_seed(seed * 100003 + t.shape[0])
        return _chain(t[torch.randperm(t.shape[0], generator=g)])
    if order == "split2":                       # two interleaved accumulators
        return _chain(t[0::2]) + (_chain(t[1::2]) if t.shape[0] > 1 else 0.0)
    raise ValueError(f"unknown summation order {order!r}")


@dataclass(frozen=True)
class Emulation:
    order: str = "sequential"
    seed: int = 0                  # of the 'random' order's permutations
    bf16: bool = True              # False: no rounding at all (the oracle's math in fp32), to check the emulation
    prob_bits: int | None = 8      # significant bits the probabilities keep (None: fp32, as the fp32-FMA
                                   # attention kernels keep them); a bug test lowers it
    drop_down_k: int | None = None  # a bug: down_proj's sums skip this k (negative: from the end)
    drop_last_key: bool = False    # a bug: attention skips each sample's last valid cache row (an off-by-one)

    def r(self, x: torch.Tensor, bits: int | None = 8) -> torch.Tensor:
        return round_bits(x, bits) if self.bf16 and bits is not None else x

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return ordered_sum(t, self.order, self.seed)

    def matmul(self, x: torch.Tensor, w: torch.Tensor, drop_k: int | None = None) -> torch.Tensor:
        """x [M, K] @ w[N, K]^T: the K products of each output, exact for bf16 operands, summed in order."""
        terms = x.t()[:, :, None] * w.t()[:, None, :]      # [K, M, N]
        if drop_k is not None:
            k = drop_k % terms.shape[0]
            terms = torch.cat([terms[:k], terms[k + 1:]])
        return self.sum(terms.contiguous())

    def inv_rms(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        """1 / sqrt(sum(x^2) / n + eps) over the last dim (cpu_ops.cpp inv_rms), the squares summed in order."""
        n = x.shape[-1]
        ss = self.sum((x * x).movedim(-1, 0).contiguous())
        return 1.0 / torch.sqrt(ss / n + torch.tensor(eps, dtype=torch.float32))

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return w * (x * self.inv_rms(x, eps)[..., None])


def _rope_tables(ck: Checkpoint, pos: torch.Tensor):
    """pos [B, T] -> cos, sin [B, T, d] as src/model/sampler.cpp builds them: inv_freq_j = 1 / theta^(2j/d) and
    the angles p inv_freq_j in fp32."""
    d = ck.d
    base = torch.tensor(ck.theta, dtype=torch.float32)
    inv = 1.0 / torch.pow(base, torch.arange(0, d, 2, dtype=torch.float32) / torch.tensor(float(d)))
    ang = pos.to(torch.float32)[..., None] * inv
    return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)


def _head_norm_rope(x, w, eps, cos, sin, emu: Emulation):
    """x [B, T, H, d]: per-head RMSNorm then rotate_half rotary (cpu_ops.cpp head_norm_rope), fp32."""
    t = emu.rms_norm(x, w, eps)
    half = x.shape[-1] // 2
    c, s = cos[:, :, None], sin[:, :, None]
    return torch.cat([t[..., :half] * c[..., :half] - t[..., half:] * s[..., :half],
                      t[..., half:] * c[..., half:] + t[..., :half] * s[..., half:]], -1)


def _keys(ctx: ExpertContext, l: int, own: torch.Tensor, which: str, emu: Emulation):
    """Each sample's attended rows [B, Hkv, n, d]: cache rows [lo_b, S_b) (rounded as the engine converts the
    cache), then its T own rows, then zero rows up to the longest sample's n (masked: their terms are exact zeros
    at the end of every sum); also the mask [B, n] of real rows."""
    B, T = own.shape[0], own.shape[1]
    cache = (ctx.keys if which == "k" else ctx.values)[l]
    lo = ctx.lo if ctx.lo is not None else torch.zeros(B, dtype=torch.long)
    lens = [int(ctx.valid_len[b]) - int(lo[b]) - (1 if emu.drop_last_key else 0) for b in range(B)]
    n = max(lens) + T
    rows = own.new_zeros(B, own.shape[2], n, own.shape[3])
    real = torch.zeros(B, n, dtype=torch.bool)
    for b in range(B):
        L0, S = int(lo[b]), lens[b]
        rows[b, :, :S] = emu.r(cache[b, :, L0:L0 + S].float())
        rows[b, :, S:S + T] = own[b].transpose(0, 1)
        real[b, :S + T] = True
    return rows, real


def _attention(q, K, V, real, d, emu: Emulation):
    """q [B, Hq, T, d], K / V [B, Hq, n, d] (GQA expanded), real [B, n] -> o [B, T, Hq d]."""
    scale = torch.tensor(LOG2E / math.sqrt(d), dtype=torch.float32)
    s = emu.sum((q[:, :, :, None, :] * K[:, :, None, :, :]).permute(4, 0, 1, 2, 3).contiguous()) * scale  # [B,Hq,T,n]
    s = s.masked_fill(~real[:, None, None, :], -math.inf)
    p = torch.exp2(s - s.amax(-1, keepdim=True))           # the exact max: the largest probability is 1
    pb = emu.r(p, emu.prob_bits)
    l = emu.sum(p.permute(3, 0, 1, 2).contiguous())        # [B, Hq, T], from the unrounded probabilities
    o = emu.sum((pb[..., None] * V[:, :, None, :, :]).permute(3, 0, 1, 2, 4).contiguous())  # [B, Hq, T, d]
    o = o * (1.0 / l)[..., None]                           # merge_partials: O times 1 / l
    return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def expert_step(ck: Checkpoint, ctx: ExpertContext, emb: torch.Tensor, emu: Emulation = Emulation()) -> dict:
    """emb [B, T, D] (fp32) -> {'layer.l' (the residual stream after layer l), 'hidden' (after the final norm), 'v'}."""
    # Thousands of small ops: a second thread only adds waits, and each one stalls while another process holds a core.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _expert_step(ck, ctx, emb, emu)
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def _expert_step(ck: Checkpoint, ctx: ExpertContext, emb: torch.Tensor, emu: Emulation) -> dict:
    B, T, D = emb.shape
    w, d, Hq, Hkv = ck.w, ck.d, ck.Hq, ck.Hkv
    heads = torch.arange(Hq) // (Hq // Hkv)
    cos, sin = _rope_tables(ck, torch.arange(T)[None] + (ctx.rope_delta + ctx.valid_len)[:, None])
    weight = lambda name: emu.r(w[name].float())  # noqa: E731  the packed bf16 weights (RNE)
    h = emb.reshape(B * T, D).to(torch.float32).clone()
    out = {}
    for l in range(ck.L):
        p = f"expert.layers.{l}."
        x = emu.r(emu.rms_norm(h, w[p + "input_layernorm.weight"], ck.eps))
        q = emu.matmul(x, weight(p + "self_attn.q_proj.weight")).view(B, T, Hq, d)
        k = emu.matmul(x, weight(p + "self_attn.k_proj.weight")).view(B, T, Hkv, d)
        v = emu.r(emu.matmul(x, weight(p + "self_attn.v_proj.weight")).view(B, T, Hkv, d))
        q = emu.r(_head_norm_rope(q, w[p + "self_attn.q_norm.weight"], ck.eps, cos, sin, emu))
        k = emu.r(_head_norm_rope(k, w[p + "self_attn.k_norm.weight"], ck.eps, cos, sin, emu))
        K, real = _keys(ctx, l, k, "k", emu)
        V, _ = _keys(ctx, l, v, "v", emu)
        o = _attention(q.transpose(1, 2), K[:, heads], V[:, heads], real, d, emu)
        h = h + emu.matmul(emu.r(o.reshape(B * T, -1)), weight(p + "self_attn.o_proj.weight"))
        x = emu.r(emu.rms_norm(h, w[p + "post_attention_layernorm.weight"], ck.eps))
        g = emu.matmul(x, weight(p + "mlp.gate_proj.weight"))
        u = emu.matmul(x, weight(p + "mlp.up_proj.weight"))
        a = emu.r(g / (1.0 + torch.exp(-g)) * u)
        h = h + emu.matmul(a, weight(p + "mlp.down_proj.weight"), drop_k=emu.drop_down_k)
        out[f"layer.{l}"] = h.view(B, T, D).clone()
    hidden = emu.rms_norm(h, w["expert.norm.weight"], ck.eps)
    out["hidden"] = hidden.view(B, T, D)
    # The host's fp32 action_out_proj (src/backends/cpu/action_proj.cpp): one sum over D, then the bias.
    v = emu.matmul(hidden, w["action_out_proj.weight"].float()) + w["action_out_proj.bias"].float()
    out["v"] = v.view(B, T, -1)
    return out
