"""PyTorch oracle for the Alpamayo action expert (docs/MATH.md sections 3-6), written for the tests.

The expert layers run in transformers' own Qwen3VLTextModel, loaded from the same safetensors the
engine reads, with a DynamicCache prefilled from the context, position_ids [3, B, T] and a 4D additive
mask hiding cache rows [S_b, P), exactly as the release's step_fn drives it. Everything is fp32;
the action-space math (section 6) is float64, the exact value the engine's fp32/f64 code approximates.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import DynamicCache

import bfp
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

A2_PREFIXES = {  # Alpamayo 2 prefix -> R1 prefix
    "expert.expert.": "expert.",
    "expert.action_in_proj.": "action_in_proj.",
    "expert.action_out_proj.": "action_out_proj.",
    "expert.action_space.": "action_space.",
}
RELEASES = {"alpamayo_r1": "r1", "alpamayo1_5": "1.5", "alpamayo2_super": "a2"}  # model_type -> release
# Buffers the releases load from a checkpoint: Alpamayo 1.5 registers them non-persistent (never loaded).
BUFFERS = ("action_in_proj.sinus.", "action_in_proj.timestep_fourier_encoder.", "action_space.")
QWEN3VL_EPS, QWEN3VL_THETA = 1e-6, 5e6


def _checkpoint_files(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        return [d / s for s in sorted(set(wm.values()))]
    return [d / "model.safetensors"]


def _rope_theta(tc: dict) -> float | None:
    if tc.get("rope_theta") is not None:
        return float(tc["rope_theta"])
    for k in ("rope_parameters", "rope_scaling"):
        if isinstance(tc.get(k), dict) and "rope_theta" in tc[k]:
            return float(tc[k]["rope_theta"])
    return None


@dataclass
class Checkpoint:
    config: dict
    w: dict[str, torch.Tensor]  # fp32, R1 key names, vlm.* dropped
    layout: str
    L: int = 0
    D: int = 0
    Hq: int = 0
    Hkv: int = 0
    d: int = 0
    I: int = 0
    eps: float = QWEN3VL_EPS
    theta: float = QWEN3VL_THETA
    ain: dict = field(default_factory=dict)
    aspace: dict = field(default_factory=dict)
    steps: int = 10


def load_checkpoint(directory, text_config: dict | None = None, release: str | None = None,
                    weights: str | None = None) -> Checkpoint:
    """Reads config.json as its release ships it (the release from model_type, or `release`):
    Alpamayo-R1 / 1.5 keep flat *_cfg keys and take eps / theta from the VLM's text config (`text_config`,
    as --vlm-config gives the engine), else the Qwen3-VL defaults; Alpamayo 2 Super keeps everything under
    expert_config, eps / theta in its llm_config (or expert_update_cfg over vlm_config.text_config).
    `text_config` given for Super replaces those (to build counterfactual oracles).
    weights: a block format (bfp8_b, bfp4_b): the expert's weight matrices as a backend with that format holds
    them (bfp.py); any other value leaves the checkpoint's values."""
    d = Path(directory)
    cfg = json.loads((d / "config.json").read_text())
    release = release or RELEASES[cfg["model_type"]]
    w: dict[str, torch.Tensor] = {}
    layout = "r1"
    for f in _checkpoint_files(d):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                if k.startswith("vlm."):
                    continue
                name = k
                for a2, r1 in A2_PREFIXES.items():
                    if k.startswith(a2):
                        name, layout = r1 + k[len(a2):], "a2"
                        break
                if release == "1.5" and name.startswith(BUFFERS):
                    continue
                w[name] = sf.get_tensor(k).to(torch.float32)
    assert layout == ("a2" if release == "a2" else "r1"), (release, layout)
    ck = Checkpoint(config=cfg, w=w, layout=layout)
    ck.L = sum(1 for k in w if k.startswith("expert.layers.") and k.endswith(".input_layernorm.weight"))
    q = w["expert.layers.0.self_attn.q_proj.weight"]
    ck.d = w["expert.layers.0.self_attn.q_norm.weight"].shape[0]
    ck.D, ck.Hq = q.shape[1], q.shape[0] // ck.d
    ck.Hkv = w["expert.layers.0.self_attn.k_proj.weight"].shape[0] // ck.d
    ck.I = w["expert.layers.0.mlp.gate_proj.weight"].shape[0]
    if release == "a2":
        sec = cfg["expert_config"]
        if text_config is not None:
            chain = [text_config]
        elif "llm_config" in sec:
            chain = [sec.get("expert_update_cfg", {}), sec["llm_config"]]
        else:
            chain = [sec.get("expert_update_cfg", {}), cfg.get("vlm_config", {}).get("text_config", {})]
    else:
        sec = cfg
        chain = [cfg.get("expert_cfg") or {}, text_config or {}]
    ck.eps = next((float(t["rms_norm_eps"]) for t in chain if "rms_norm_eps" in t), QWEN3VL_EPS)
    ck.theta = next((th for th in map(_rope_theta, chain) if th is not None), QWEN3VL_THETA)
    ai = sec["action_in_proj_cfg"]
    ck.ain = dict(hidden=ai.get("hidden_size", 1024), layers=ai.get("num_enc_layers", 4),
                  F=ai.get("num_fourier_feats", 20), max_freq=float(ai.get("max_freq", 100.0)))
    asp = sec["action_space_cfg"]
    ck.aspace = dict(T=asp.get("n_waypoints", 64), dt=float(asp.get("dt", 0.1)),
                     v_lambda=float(asp.get("v_lambda", 1e-6)), v_ridge=float(asp.get("v_ridge", 1e-4)))
    for s in ("accel_mean", "accel_std", "curvature_mean", "curvature_std"):
        buf = w.get(f"action_space.{s}")
        ck.aspace[s] = float(buf) if buf is not None else float(asp.get(s, 0.0 if s.endswith("mean") else 1.0))
    ck.steps = int(sec["diffusion_cfg"].get("num_inference_steps", 10))
    if weights in bfp.MANTISSA_BITS:
        ck.w = bfp.quantize_checkpoint(ck.w, ck.L, weights)
    return ck


# ---------------------------------------------------------------- section 3: action_in_proj
def fourier_freqs(F_: int, max_freq: float) -> torch.Tensor:
    """logspace(0, log10(max_freq), F/2), rounded to bf16 as the release's bf16 buffers hold them."""
    f = torch.logspace(0, math.log10(max_freq), F_ // 2, dtype=torch.float32)
    return f.to(torch.bfloat16).to(torch.float32)


def fourier(z: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    arg = z[..., None] * freqs.reshape(-1) * 2 * math.pi
    return torch.cat([arg.sin(), arg.cos()], -1) * math.sqrt(2)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def action_in_proj(ck: Checkpoint, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x [B, T, A], t [B] -> [B, T, D]."""
    B, T, A = x.shape
    w, a = ck.w, ck.ain
    default = fourier_freqs(a["F"], a["max_freq"])
    feats = [fourier(x[:, :, i], w.get(f"action_in_proj.sinus.{i}.freqs", default)) for i in range(A)]
    tf = fourier(t.reshape(B, 1), w.get("action_in_proj.timestep_fourier_encoder.freqs", default))
    h = torch.cat(feats + [tf.expand(B, T, -1)], -1)
    p = "action_in_proj.encoder.trunk."
    h = F.silu(F.linear(h, w[p + "0.weight"], w[p + "0.bias"]))
    k = 2
    for j in range(a["layers"]):  # RMSNorm, Linear, (SiLU except after the last)
        h = _rms(h, w[f"{p}{k}.weight"], 1e-5)
        h = F.linear(h, w[f"{p}{k + 1}.weight"], w[f"{p}{k + 1}.bias"])
        if j < a["layers"] - 1:
            h = F.silu(h)
        k += 3
    return F.layer_norm(h, (ck.D,), w["action_in_proj.norm.weight"], w["action_in_proj.norm.bias"], eps=1e-5)


def action_out_proj(ck: Checkpoint, h: torch.Tensor) -> torch.Tensor:
    return F.linear(h, ck.w["action_out_proj.weight"], ck.w["action_out_proj.bias"])


# ---------------------------------------------------------------- section 4: expert via transformers
def _mrope_section(d: int) -> list[int]:
    """Some valid split of d/2 (equal position rows make the split irrelevant; Qwen3-VL: [24, 20, 20])."""
    hw = (d // 2) * 20 // 64
    return [d // 2 - 2 * hw, hw, hw]


def build_expert(ck: Checkpoint) -> Qwen3VLTextModel:
    tc = Qwen3VLTextConfig(
        vocab_size=1, hidden_size=ck.D, intermediate_size=ck.I, num_hidden_layers=ck.L,
        num_attention_heads=ck.Hq, num_key_value_heads=ck.Hkv, head_dim=ck.d, rms_norm_eps=ck.eps,
        rope_parameters={"rope_type": "default", "rope_theta": ck.theta, "mrope_section": _mrope_section(ck.d)},
        max_position_embeddings=1 << 20)
    tc._attn_implementation = "eager"  # plain matmul + fp32 softmax + additive mask
    model = Qwen3VLTextModel(tc).eval().to(torch.float32)
    sd = {}
    for k, v in ck.w.items():
        if k.startswith("expert."):
            sd[k[len("expert."):]] = v
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert set(missing) == {"embed_tokens.weight"}, missing
    assert not unexpected, unexpected
    return model


@dataclass
class ExpertContext:
    """Per-sample caches as the release's step_fn sees them: sample b's own row set [B, Hkv, R, d] (prompt rows,
    then its generated rows), rows [0, lo_b) left padding and rows >= valid_len_b (its offset) masked."""
    keys: list[torch.Tensor]    # fp32 [B, Hkv, R, d]
    values: list[torch.Tensor]
    valid_len: torch.Tensor     # [B] int64: the offset (index after <traj_future_start>)
    rope_delta: torch.Tensor    # [B] int64
    lo: torch.Tensor | None = None  # [B] int64 left-padding rows (default 0)

    @classmethod
    def from_file_context(cls, ctx) -> "ExpertContext":
        """Expands a context file's G shared prompts and B suffixes into the B row sets the release holds
        (each prompt copied once per sample, as generate(num_return_sequences) leaves it): sample b's rows are
        prompt g(b)'s rows [0, valid_len_g) followed by its suffix rows [0, suffix_len_b)."""
        if ctx.prompt_index is None and ctx.suffix_len is None:
            return cls([k.float() for k in ctx.keys], [v.float() for v in ctx.values], ctx.valid_len.long(),
                       ctx.rope_delta.long(), ctx.pads())
        g_of, vl, sl, pads = ctx.prompt_of(), ctx.valid_len.long(), ctx.suffix_lens(), ctx.pads()
        B = g_of.shape[0]
        off = vl[g_of] + sl
        R = int(off.max())
        keys, values = [], []
        for l in range(ctx.num_layers):
            for src, sfx, out in ((ctx.keys[l], ctx.suffix_keys, keys), (ctx.values[l], ctx.suffix_values, values)):
                _, H, _, d = src.shape
                t = torch.zeros(B, H, R, d)
                for b in range(B):
                    g, n = int(g_of[b]), int(vl[g_of[b]])
                    t[b, :, :n] = src[g, :, :n].float()
                    if sfx is not None:
                        t[b, :, n:n + int(sl[b])] = sfx[l][b, :, :int(sl[b])].float()
                out.append(t)
        return cls(keys, values, off, ctx.rope_delta.long(), pads[g_of])


class Oracle:
    def __init__(self, ck: Checkpoint, ctx: ExpertContext, mask_padding: bool = True):
        if len(ctx.keys) != ck.L:
            raise ValueError(f"context has {len(ctx.keys)} layers, expert {ck.L}")
        self.ck, self.ctx = ck, ctx
        self.model = build_expert(ck)
        self.B, _, self.P, _ = ctx.keys[0].shape
        self.T = ck.aspace["T"]
        # One cache for the whole sample; each step appends T rows and crops them again (release step_fn).
        self.cache = DynamicCache(ddp_cache_data=[(k.clone(), v.clone()) for k, v in zip(ctx.keys, ctx.values)])
        i = torch.arange(self.T)
        pos = i[None, :] + (ctx.rope_delta + ctx.valid_len)[:, None]       # [B, T]
        self.position_ids = pos[None].expand(3, -1, -1).contiguous()       # all M-RoPE rows equal
        mask = torch.zeros(self.B, 1, self.T, self.P + self.T)
        if mask_padding:
            for b in range(self.B):
                mask[b, :, :, int(ctx.valid_len[b]): self.P] = torch.finfo(torch.float32).min
                if ctx.lo is not None:
                    mask[b, :, :, : int(ctx.lo[b])] = torch.finfo(torch.float32).min
        self.mask = mask

    @torch.no_grad()
    def step(self, x: torch.Tensor, t: torch.Tensor, capture: bool = False):
        """One step_fn: returns v [B, T, A] and, if capture, {'emb', 'layer.l', 'hidden'}."""
        emb = action_in_proj(self.ck, x, t)
        captured: dict[str, torch.Tensor] = {}
        hooks = []
        if capture:
            captured["emb"] = emb.clone()
            for l, layer in enumerate(self.model.layers):
                hooks.append(layer.register_forward_hook(
                    lambda m, args, out, l=l: captured.__setitem__(f"layer.{l}", (out[0] if isinstance(out, tuple) else out).clone())))
        try:
            out = self.model(inputs_embeds=emb, position_ids=self.position_ids, attention_mask=self.mask,
                             cache=self.cache, use_cache=True, is_causal=False)
        finally:
            for h in hooks:
                h.remove()
            self.cache.crop(-self.T)  # transformers 5.x: a negative count removes that many rows
        assert self.cache.get_seq_length() == self.P
        hidden = out.last_hidden_state
        if capture:
            captured["hidden"] = hidden.clone()
        return action_out_proj(self.ck, hidden), captured

    @torch.no_grad()
    def sample(self, noise: torch.Tensor, steps: int | None = None):
        """Section 5. Returns dict(action, x_steps [N+1,B,T,A], v_steps [N,B,T,A], layers (step 0))."""
        N = steps or self.ck.steps
        times = torch.linspace(0.0, 1.0, N + 1, dtype=torch.float32)
        x = noise.to(torch.float32).clone()
        xs, vs, layers = [x], [], {}
        for k in range(N):
            v, cap = self.step(x, times[k].expand(self.B), capture=(k == 0))
            if k == 0:
                layers = cap
            x = x + (times[k + 1] - times[k]) * v
            xs.append(x)
            vs.append(v)
        return dict(action=x, x_steps=torch.stack(xs), v_steps=torch.stack(vs), layers=layers, times=times)


# ---------------------------------------------------------------- section 6: action space (float64)
def _wrap(a):
    return torch.atan2(torch.sin(a), torch.cos(a))


def v0_from_history(xyz: torch.Tensor, rot: torch.Tensor, dt: float, v_lambda: float, v_ridge: float) -> torch.Tensor:
    """Least-squares speeds s_0..s_n from the history (trapezoid model + third-difference smoothing); v0 = s_n."""
    xyz, rot = xyz.double(), rot.double()
    B, H, _ = xyz.shape
    n = H - 1
    yaw = torch.atan2(rot[..., 1, 0], rot[..., 0, 0])
    yaw = torch.cat([yaw[:, :1], yaw[:, :1] + torch.cumsum(_wrap(yaw.diff(dim=1)), 1)], 1)
    g = 2.0 / dt * (xyz[:, 1:, :2] - xyz[:, :-1, :2])          # [B, n, 2]
    M = torch.zeros(B, 2 * n, n + 1, dtype=torch.float64)
    r = torch.arange(n)
    M[:, 2 * r, r], M[:, 2 * r, r + 1] = torch.cos(yaw[:, :-1]), torch.cos(yaw[:, 1:])
    M[:, 2 * r + 1, r], M[:, 2 * r + 1, r + 1] = torch.sin(yaw[:, :-1]), torch.sin(yaw[:, 1:])
    D3 = torch.zeros(max(n + 1 - 3, 0), n + 1, dtype=torch.float64)
    for i in range(D3.shape[0]):
        D3[i, i:i + 4] = torch.tensor([-1.0, 3.0, -3.0, 1.0])
    lhs = M.transpose(1, 2) @ M + (v_lambda / dt ** 6) * (D3.T @ D3) + v_ridge * torch.eye(n + 1, dtype=torch.float64)
    rhs = M.transpose(1, 2) @ g.reshape(B, 2 * n, 1)
    s = torch.cholesky_solve(rhs, torch.linalg.cholesky(lhs)).squeeze(-1)
    return s[:, -1]


def decode(ck: Checkpoint, action: torch.Tensor, v0: torch.Tensor, z: torch.Tensor | None = None):
    """Unicycle rollout: normalized action [B, T, 2] -> xyz [B, T, 3], yaw [B, T], rot [B, T, 3, 3]."""
    s = ck.aspace
    dt = s["dt"]
    a = action[..., 0].double() * s["accel_std"] + s["accel_mean"]
    kap = action[..., 1].double() * s["curvature_std"] + s["curvature_mean"]
    B, T = a.shape
    v = torch.cat([v0.double().reshape(B, 1), v0.double().reshape(B, 1) + torch.cumsum(a * dt, 1)], 1)
    dth = kap * v[:, :-1] * dt + kap * a * dt * dt / 2
    th = torch.cat([torch.zeros(B, 1, dtype=torch.float64), torch.cumsum(dth, 1)], 1)
    x = torch.cumsum(dt / 2 * (v[:, :-1] * torch.cos(th[:, :-1]) + v[:, 1:] * torch.cos(th[:, 1:])), 1)
    y = torch.cumsum(dt / 2 * (v[:, :-1] * torch.sin(th[:, :-1]) + v[:, 1:] * torch.sin(th[:, 1:])), 1)
    zz = (z.double().reshape(B, 1) if z is not None else torch.zeros(B, 1, dtype=torch.float64)).expand(B, T)
    yaw = th[:, 1:]
    c, sn = torch.cos(yaw), torch.sin(yaw)
    rot = torch.zeros(B, T, 3, 3, dtype=torch.float64)
    rot[..., 0, 0], rot[..., 0, 1], rot[..., 1, 0], rot[..., 1, 1], rot[..., 2, 2] = c, -sn, sn, c, 1.0
    return torch.stack([x, y, zz], -1), yaw, rot


class GuidedOracle:
    """Classifier-free guidance (NVlabs/alpamayo1.5 FlowMatching._guided_v): each step runs step_fn over the
    guided and the unguided context and returns (1 - w) v_unguided + w v_guided. Same interface as Oracle."""

    def __init__(self, guided: Oracle, unguided: Oracle, weight: float):
        self.g, self.u, self.w = guided, unguided, weight
        self.ck, self.B, self.T = guided.ck, guided.B, guided.T
        self.P = max(guided.P, unguided.P)
        self.position_ids = torch.cat([guided.position_ids, unguided.position_ids], -1)

    @torch.no_grad()
    def step(self, x: torch.Tensor, t: torch.Tensor, capture: bool = False):
        vg, cap = self.g.step(x, t, capture)  # the engine captures the guided pass
        vu, _ = self.u.step(x, t)
        return (1 - self.w) * vu + self.w * vg, cap

    sample = Oracle.sample
