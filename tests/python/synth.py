"""Random checkpoints and contexts for the oracle tests, scaled so activations are O(1) and attention
is peaked (q_norm/k_norm gains ~1.7 give logits of std ~3) rather than uniform."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from alpamayo_expert import write_checkpoint, write_context  # noqa: E402

RELEASED = dict(accel_mean=0.02902694707164455, accel_std=0.6810426736454882,
                curvature_mean=0.0002692167976330542, curvature_std=0.026148280660833106)
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@dataclass(frozen=True)
class Dims:
    L: int = 2
    D: int = 64
    Hq: int = 4
    Hkv: int = 2
    d: int = 32
    I: int = 192
    ain_hidden: int = 32
    ain_layers: int = 2
    F: int = 20
    max_freq: float = 100.0
    T: int = 16
    steps: int = 4


TINY = Dims()
FULL_LAYER = Dims(L=1, D=1536, Hq=16, Hkv=8, d=128, I=6144, ain_hidden=64, ain_layers=2, T=64, steps=1)


def _randn(g, *shape, std=1.0, mean=0.0):
    return torch.randn(*shape, generator=g) * std + mean


def expert_tensors(dm: Dims, seed: int) -> dict[str, torch.Tensor]:
    """R1-named fp32 tensors for the expert, action_in_proj, action_out_proj (no derived buffers)."""
    g = torch.Generator().manual_seed(seed)
    t: dict[str, torch.Tensor] = {}
    lin = lambda o, i: _randn(g, o, i, std=1 / math.sqrt(i))  # noqa: E731  keeps outputs O(1)
    for l in range(dm.L):
        p = f"expert.layers.{l}."
        t[p + "input_layernorm.weight"] = _randn(g, dm.D, std=0.1, mean=1.0)
        t[p + "post_attention_layernorm.weight"] = _randn(g, dm.D, std=0.1, mean=1.0)
        t[p + "self_attn.q_proj.weight"] = lin(dm.Hq * dm.d, dm.D)
        t[p + "self_attn.k_proj.weight"] = lin(dm.Hkv * dm.d, dm.D)
        t[p + "self_attn.v_proj.weight"] = lin(dm.Hkv * dm.d, dm.D)
        t[p + "self_attn.o_proj.weight"] = lin(dm.D, dm.Hq * dm.d)
        t[p + "self_attn.q_norm.weight"] = _randn(g, dm.d, std=0.2, mean=1.7)
        t[p + "self_attn.k_norm.weight"] = _randn(g, dm.d, std=0.2, mean=1.7)
        t[p + "mlp.gate_proj.weight"] = lin(dm.I, dm.D)
        t[p + "mlp.up_proj.weight"] = lin(dm.I, dm.D)
        t[p + "mlp.down_proj.weight"] = lin(dm.D, dm.I)
    t["expert.norm.weight"] = _randn(g, dm.D, std=0.1, mean=1.0)
    n_in = 3 * dm.F
    p = "action_in_proj.encoder.trunk."
    t[p + "0.weight"], t[p + "0.bias"] = lin(dm.ain_hidden, n_in), _randn(g, dm.ain_hidden, std=0.1)
    # A trained velocity field is smooth in x; random weights on sin(2*pi*100*x) features make the sampler
    # chaotic (a 1e-4 change of the noise moves the action by ~1). Damping the action features' columns by
    # 1/f keeps every frequency in play (d/dx ~ 2*pi each) with a sampler gain of ~10-50.
    half = dm.F // 2
    damp = 1.0 / torch.logspace(0, math.log10(dm.max_freq), half)
    for a in range(2):
        t[p + "0.weight"][:, a * dm.F: a * dm.F + half] *= damp
        t[p + "0.weight"][:, a * dm.F + half: (a + 1) * dm.F] *= damp
    k = 2
    for j in range(dm.ain_layers):
        out = dm.D if j == dm.ain_layers - 1 else dm.ain_hidden
        t[f"{p}{k}.weight"] = _randn(g, dm.ain_hidden, std=0.1, mean=1.0)
        t[f"{p}{k + 1}.weight"], t[f"{p}{k + 1}.bias"] = lin(out, dm.ain_hidden), _randn(g, out, std=0.1)
        k += 3
    t["action_in_proj.norm.weight"] = _randn(g, dm.D, std=0.1, mean=1.0)
    t["action_in_proj.norm.bias"] = _randn(g, dm.D, std=0.1)
    t["action_out_proj.weight"] = 0.5 * lin(2, dm.D)
    t["action_out_proj.bias"] = _randn(g, 2, std=0.1)
    return t


LAYOUTS = ("r1", "1.5", "a2")  # Alpamayo-R1, Alpamayo 1.5, Alpamayo 2 Super
_PACKAGE = {"r1": "alpamayo_r1", "1.5": "alpamayo1_5", "a2": "alpamayo2_super"}


def qwen3_text_config(L: int, D: int, I: int, Hq: int, Hkv: int, d: int, eps: float = 1e-6,
                      theta: float = 5e6) -> dict:
    """A Qwen3-VL text config as transformers 4.57 saves it (top-level rope_theta, mrope in rope_scaling)."""
    hw = (d // 2) * 20 // 64
    return {"model_type": "qwen3_vl_text", "hidden_size": D, "intermediate_size": I, "num_hidden_layers": L,
            "num_attention_heads": Hq, "num_key_value_heads": Hkv, "head_dim": d, "hidden_act": "silu",
            "rms_norm_eps": eps, "rope_theta": theta, "max_position_embeddings": 262144, "vocab_size": 155776,
            "rope_scaling": {"rope_type": "default", "mrope_interleaved": True, "mrope_section": [d // 2 - 2 * hw, hw, hw]}}


def config_json(dm: Dims, layout: str = "r1", text_config: dict | None = None) -> dict:
    """config.json shaped as each release ships it. Alpamayo-R1 / 1.5: flat *_cfg keys, the VLM only named
    (vlm_name_or_path). Alpamayo 2 Super: the VLM's config under vlm_config, everything of the expert under
    expert_config (its own text config in llm_config). text_config: values of the expert's text config
    (eps, theta), which only Super's config.json carries; R1 / 1.5 take them from --vlm-config."""
    pkg = _PACKAGE[layout]
    ain = {"_target_": f"{pkg}.models.action_in_proj.PerWaypointActionInProjV2", "hidden_size": dm.ain_hidden,
           "num_enc_layers": dm.ain_layers, "num_fourier_feats": dm.F, "max_freq": dm.max_freq}
    aspace = {"_target_": f"{pkg}.action_space.UnicycleAccelCurvatureActionSpace", "n_waypoints": dm.T, "dt": 0.1,
              **RELEASED, "accel_bounds": [-9.8, 9.8], "curvature_bounds": [-0.33, 0.33], "v_lambda": 1e-6, "v_ridge": 1e-4}
    diffusion = {"_target_": f"{pkg}.diffusion.flow_matching.FlowMatching", "num_inference_steps": dm.steps,
                 "int_method": "euler"}
    if layout == "a2":
        llm = qwen3_text_config(dm.L, dm.D, dm.I, dm.Hq, dm.Hkv, dm.d)
        if text_config:
            if any(k in text_config for k in ("rope_theta", "rope_parameters", "rope_scaling")):
                for k in ("rope_theta", "rope_parameters", "rope_scaling"):
                    llm.pop(k, None)
            llm.update(text_config)
        vq = 8 * dm.Hkv  # the VLM: shares L, Hkv, d with the expert (Qwen3-VL-32B: 64 heads, hidden 5120)
        return {
            "architectures": ["Alpamayo2Super"], "model_type": "alpamayo2_super", "dtype": "bfloat16",
            "vlm_class": "Qwen3VLForConditionalGeneration", "history_vocab_size": 1000, "future_vocab_size": 3000,
            "tokens_per_history_traj": 48, "tokens_per_future_traj": 128,
            "traj_ids": {"history_id0": 151669, "future_id0": 152669, "history_start": 155674, "history_end": 155676,
                         "future_start": 155681, "future_end": 155683, "history_pad": 155684, "future_pad": 155685},
            "vlm_config": {"model_type": "qwen3_vl",
                           "text_config": qwen3_text_config(dm.L, vq * dm.d * 5 // 8, 5 * vq * dm.d * 5 // 8, vq, dm.Hkv, dm.d)},
            "expert_config": {
                "llm_config": llm,
                "expert_update_cfg": {"hidden_size": dm.D, "intermediate_size": dm.I, "num_attention_heads": dm.Hq,
                                      "head_dim": dm.d},
                "action_space_cfg": aspace, "action_in_proj_cfg": ain, "action_out_proj_cfg": {"_target_": "torch.nn.Linear"},
                "diffusion_cfg": {**diffusion, "train_timestep_sampler": "beta", "inference_guidance_weight": 3.0,
                                  "use_classifier_free_guidance": False},
                "expert_non_causal_attention": True,
            },
        }
    if text_config is not None:
        raise ValueError(f"an {layout} config.json has no text config; pass the VLM's with --vlm-config")
    if layout == "1.5":
        diffusion.update(inference_guidance_weight=1.0, use_classifier_free_guidance=False)
    return {
        "architectures": ["AlpamayoR1" if layout == "r1" else "Alpamayo1_5"],
        "model_type": pkg,
        "vlm_name_or_path": "Qwen/Qwen3-VL-8B-Instruct" if layout == "r1" else "nvidia/Cosmos-Reason2-8B",
        "expert_cfg": {"hidden_size": dm.D, "intermediate_size": dm.I, "num_attention_heads": dm.Hq,
                       "num_key_value_heads": dm.Hkv, "head_dim": dm.d},
        "action_in_proj_cfg": ain,
        "action_out_proj_cfg": {"_target_": "torch.nn.Linear"},
        "action_space_cfg": aspace,
        "diffusion_cfg": diffusion,
        "expert_non_causal_attention": True,
        "keep_same_dtype": True,
    }


def checkpoint_tensors(dm: Dims, layout: str, dtype: str, seed: int) -> dict[str, torch.Tensor]:
    """Tensors as stored: weights in `dtype`; R1 adds its f32 freqs/action-space buffers (1.5 registers them as
    non-persistent, Super's release omits them); all get vlm.* decoys."""
    from oracle import fourier_freqs
    base = {k: v.to(DTYPES[dtype]) for k, v in expert_tensors(dm, seed).items()}
    out: dict[str, torch.Tensor] = {"vlm.model.embed_tokens.weight": torch.randn(8, 16).to(DTYPES[dtype]),
                                    "vlm.lm_head.weight": torch.full((8, 16), float("nan"))}
    if layout in ("r1", "1.5"):
        out.update(base)
    if layout == "r1":
        # The release keeps these buffers in bf16; hold the bf16 values (60.0, not 59.948).
        f = fourier_freqs(dm.F, dm.max_freq).reshape(1, -1).to(torch.bfloat16)
        for i in range(2):
            out[f"action_in_proj.sinus.{i}.freqs"] = f
        out["action_in_proj.timestep_fourier_encoder.freqs"] = f
        for k, v in RELEASED.items():
            out[f"action_space.{k}"] = torch.tensor(v, dtype=torch.float32)
    elif layout == "a2":
        for k, v in base.items():
            out["expert." + ("expert." + k[len("expert."):] if k.startswith("expert.") else k)] = v
    elif layout != "1.5":
        raise ValueError(layout)
    return out


def make_checkpoint(directory, dm: Dims = TINY, layout: str = "r1", dtype: str = "f32", shards: int = 1,
                    seed: int = 0, text_config: dict | None = None) -> Path:
    return write_checkpoint(directory, checkpoint_tensors(dm, layout, dtype, seed),
                            config_json(dm, layout, text_config), shards=shards)


@dataclass
class CtxSpec:
    valid_len: tuple[int, ...] = (37, 50, 23)
    rope_delta: tuple[int, ...] = (5, -11, 0)
    P: int = 50
    kv_dtype: str = "f32"
    motion: str = "history"          # "history" | "v0" | "none"
    v0: tuple[float, ...] = (3.0, 0.0, 12.5)
    seed: int = 1
    garbage_seed: int = 2
    garbage_scale: float = 30.0      # large enough to dominate attention if it were not masked
    # Shared prompts: valid_len / prefix_pad are per prompt (G = len(valid_len)), the rest per sample.
    prompt_index: tuple[int, ...] | None = None
    prefix_pad: tuple[int, ...] | None = None
    suffix_len: tuple[int, ...] | None = None   # with Q = suffix_rows
    suffix_rows: int = 0

    @property
    def G(self) -> int:
        return len(self.valid_len)

    @property
    def B(self) -> int:
        return len(self.prompt_index) if self.prompt_index is not None else len(self.valid_len)


def ego_history(B: int, H: int = 16, dt: float = 0.1, seed: int = 3):
    """Arcs ending at the origin with heading 0 (the t0 frame): speeds 5..15 m/s, various curvatures."""
    g = torch.Generator().manual_seed(seed)
    speeds = torch.tensor([5.0, 10.0, 15.0, 8.0])[:B] if B <= 4 else 5 + 10 * torch.rand(B, generator=g)
    curv = torch.tensor([0.0, 0.02, -0.05, 0.1])[:B] if B <= 4 else 0.1 * torch.randn(B, generator=g)
    t = (torch.arange(H, dtype=torch.float64) - (H - 1)) * dt
    xyz = torch.zeros(B, H, 3, dtype=torch.float64)
    rot = torch.zeros(B, H, 3, 3, dtype=torch.float64)
    for b in range(B):
        v, c = float(speeds[b]), float(curv[b])
        yaw = c * v * t
        if abs(c) < 1e-9:
            xyz[b, :, 0] = v * t
        else:
            xyz[b, :, 0], xyz[b, :, 1] = torch.sin(yaw) / c, (1 - torch.cos(yaw)) / c
        xyz[b, :, :2] += 0.01 * torch.randn(H, 2, generator=g, dtype=torch.float64)  # GPS-like jitter
        xyz[b, :, 2] = 0.3 + 0.1 * b
        rot[b, :, 0, 0], rot[b, :, 0, 1] = torch.cos(yaw), -torch.sin(yaw)
        rot[b, :, 1, 0], rot[b, :, 1, 1], rot[b, :, 2, 2] = torch.sin(yaw), torch.cos(yaw), 1.0
    return xyz.float(), rot.float()


def context_kv(dm: Dims, spec: CtxSpec):
    """Prompt K/V [G, Hkv, P, d] per layer: rows in use ~ roped-key scale, left padding and rows >= valid_len
    large finite garbage."""
    g = torch.Generator().manual_seed(spec.seed)
    gg = torch.Generator().manual_seed(spec.garbage_seed)
    pads = spec.prefix_pad or (0,) * spec.G
    kv = []
    for _ in range(dm.L):
        k = _randn(g, spec.G, dm.Hkv, spec.P, dm.d, std=1.7)
        v = _randn(g, spec.G, dm.Hkv, spec.P, dm.d)
        for b, s in enumerate(spec.valid_len):
            n = spec.P - s
            k[b, :, s:] = _randn(gg, dm.Hkv, n, dm.d, std=spec.garbage_scale)
            v[b, :, s:] = _randn(gg, dm.Hkv, n, dm.d, std=spec.garbage_scale)
            k[b, :, :pads[b]] = _randn(gg, dm.Hkv, pads[b], dm.d, std=spec.garbage_scale)
            v[b, :, :pads[b]] = _randn(gg, dm.Hkv, pads[b], dm.d, std=spec.garbage_scale)
        kv.append((k, v))
    return kv


def suffix_kv(dm: Dims, spec: CtxSpec):
    """Suffix K/V [B, Hkv, Q, d] per layer: rows < suffix_len_b in use, the rest garbage."""
    g = torch.Generator().manual_seed(spec.seed + 100)
    gg = torch.Generator().manual_seed(spec.garbage_seed + 100)
    out = []
    for _ in range(dm.L):
        k = _randn(g, spec.B, dm.Hkv, spec.suffix_rows, dm.d, std=1.7)
        v = _randn(g, spec.B, dm.Hkv, spec.suffix_rows, dm.d)
        for b, s in enumerate(spec.suffix_len):
            n = spec.suffix_rows - s
            k[b, :, s:] = _randn(gg, dm.Hkv, n, dm.d, std=spec.garbage_scale)
            v[b, :, s:] = _randn(gg, dm.Hkv, n, dm.d, std=spec.garbage_scale)
        out.append((k, v))
    return out


def make_context(path, dm: Dims = TINY, spec: CtxSpec = CtxSpec()) -> Path:
    kv = context_kv(dm, spec)
    kw = {}
    if spec.motion == "history":
        kw["ego_history_xyz"], kw["ego_history_rot"] = ego_history(spec.B)
    elif spec.motion == "v0":
        kw["v0"] = torch.tensor(spec.v0[: spec.B])
    if spec.suffix_len is not None:
        kw["suffix"], kw["suffix_len"] = suffix_kv(dm, spec), spec.suffix_len
    write_context(path, kv, spec.valid_len, spec.rope_delta, dtype=DTYPES[spec.kv_dtype],
                  prefix_pad=spec.prefix_pad, prompt_index=spec.prompt_index, **kw)
    return Path(path)


def make_noise(B: int, dm: Dims = TINY, seed: int = 4) -> torch.Tensor:
    return torch.randn(B, dm.T, 2, generator=torch.Generator().manual_seed(seed))
