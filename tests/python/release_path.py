"""The release's expert stage, rewritten for the tests (not vendored) from NVlabs/alpamayo1.5, line by line:

- src/alpamayo1_5/models/alpamayo1_5.py, class Alpamayo1_5: `_find_eos_offset`,
  `_build_expert_pos_ids_and_attn_mask`, and the `step_fn` / sampling / decode of
  `sample_trajectories_from_data_with_vlm_rollout` and `sample_trajectories_from_data_with_vlm_rollout_cfg_nav`
  (the unguided cache: nav text removed, prefilled once, `batch_repeat_interleave`, generated tokens forwarded);
- src/alpamayo1_5/diffusion/flow_matching.py, class FlowMatching: `_euler`, `_guided_v`, `_initial_noise`;
- src/alpamayo1_5/action_space/unicycle_accel_curvature.py: `action_to_traj`, `estimate_t0_states`;
  action_space/utils.py: `unwrap_angle`, `third_order_D`, `construct_DTD`, `dxy_theta_to_v_without_v0`;
  geometry/rotation.py: `so3_to_yaw_torch`, `round_2pi_torch`, `rotation_matrix_torch`, `rot_2d_to_3d`.

The expert is transformers' Qwen3VLTextModel with the checkpoint's weights (oracle.build_expert), and
action_in_proj / action_out_proj are oracle.py's (docs/ACCURACY.md). Two adaptations to transformers 5.24,
marked where they occur: the cache kwarg is `cache` (was `past_key_values`), and `crop` takes the negative
count of rows to drop (the release's `crop(prefill_seq_len)` raises there).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from transformers import (Qwen3VLConfig, Qwen3VLForConditionalGeneration, GenerationConfig, LogitsProcessor,
                          LogitsProcessorList, StoppingCriteria, StoppingCriteriaList)

from oracle import Checkpoint, action_in_proj, action_out_proj, build_expert


# ------------------------------------------------------------------ Alpamayo1_5 (models/alpamayo1_5.py)
def find_eos_offset(sequences: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Alpamayo1_5._find_eos_offset."""
    b_star = sequences.shape[0]
    mask = sequences == eos_token_id
    has_eos = mask.any(dim=1)
    eos_positions = mask.int().argmax(dim=1)
    last_positions = torch.full((b_star,), sequences.shape[1] - 1)
    return torch.where(has_eos, eos_positions, last_positions) + 1


def build_expert_pos_ids_and_attn_mask(offset, rope_deltas, kv_cache_seq_len, n_diffusion_tokens, b_star,
                                       prefix_mask=None):
    """Alpamayo1_5._build_expert_pos_ids_and_attn_mask (einops.repeat "l -> 3 b l" written with expand)."""
    position_ids = torch.arange(n_diffusion_tokens)
    position_ids = position_ids[None, None, :].expand(3, b_star, n_diffusion_tokens).clone()
    position_ids += (rope_deltas + offset[:, None]).to(position_ids.device)
    attention_mask = torch.zeros((b_star, 1, n_diffusion_tokens, kv_cache_seq_len + n_diffusion_tokens),
                                 dtype=torch.float32)
    for i in range(b_star):
        attention_mask[i, :, :, offset[i]: -n_diffusion_tokens] = torch.finfo(attention_mask.dtype).min
    if prefix_mask is not None:
        input_mask = prefix_mask[:, None, None, :]
        attention_mask[:, :, :, : input_mask.shape[-1]] = torch.where(
            input_mask == 0, torch.finfo(attention_mask.dtype).min, attention_mask[:, :, :, : input_mask.shape[-1]])
    return position_ids, attention_mask


class ReleaseExpert:
    """step_fn of `..._cfg_nav` (the plain variant is the same with the guided cache bound)."""

    def __init__(self, ck: Checkpoint):
        self.ck = ck
        self.expert = build_expert(ck)
        self.n_diffusion_tokens = ck.aspace["T"]

    @torch.no_grad()
    def step_fn(self, x, t, position_ids, past_key_values, attention_mask):
        b_star = x.shape[0]
        future_token_embeds = action_in_proj(self.ck, x, t.reshape(b_star))
        prefill_seq_len = past_key_values.get_seq_length()
        expert_out_base = self.expert(inputs_embeds=future_token_embeds, position_ids=position_ids,
                                      cache=past_key_values,  # transformers 5.24: was past_key_values=
                                      attention_mask=attention_mask, use_cache=True, is_causal=False)
        past_key_values.crop(-self.n_diffusion_tokens)  # transformers 5.24: was crop(prefill_seq_len)
        assert past_key_values.get_seq_length() == prefill_seq_len
        last_hidden = expert_out_base.last_hidden_state[:, -self.n_diffusion_tokens:]
        return action_out_proj(self.ck, last_hidden).view(-1, self.n_diffusion_tokens, 2)


# ------------------------------------------------------------------ FlowMatching (diffusion/flow_matching.py)
def initial_noise(batch_size: int, x_dims, generator=None) -> torch.Tensor:
    """FlowMatching._initial_noise."""
    if isinstance(generator, list):
        assert len(generator) == batch_size
        return torch.cat([torch.randn(1, *x_dims, generator=g) for g in generator], dim=0)
    return torch.randn(batch_size, *x_dims, generator=generator)


def guided_v(step_fn, x, t, unguided_step_fn, inference_guidance_weight):
    """FlowMatching._guided_v."""
    guided = step_fn(x=x, t=t)
    unguided = unguided_step_fn(x=x, t=t)
    return (1 - inference_guidance_weight) * unguided + inference_guidance_weight * guided


@torch.no_grad()
def euler(batch_size: int, x_dims, step_fn: Callable, unguided_step_fn: Callable | None, inference_step: int,
          inference_guidance_weight: float, use_classifier_free_guidance: bool, temperature: float, generator,
          noise_offset=None):
    """FlowMatching._euler (noise_offset: added to the drawn noise, for the tests' gain measurement)."""
    x = initial_noise(batch_size, x_dims, generator=generator)
    if noise_offset is not None:
        x = x + noise_offset
    x = x * temperature
    time_steps = torch.linspace(0.0, 1.0, inference_step + 1)
    n_dim = len(x_dims)
    for i in range(inference_step):
        dt = time_steps[i + 1] - time_steps[i]
        dt = dt.view(1, *[1] * n_dim).expand(batch_size, *[1] * n_dim)
        t_start = time_steps[i].view(1, *[1] * n_dim).expand(batch_size, *[1] * n_dim)
        if use_classifier_free_guidance:
            v = guided_v(step_fn, x, t_start, unguided_step_fn, inference_guidance_weight)
        else:
            v = step_fn(x=x, t=t_start)
        x = x + dt * v
    return x


# ------------------------------------------------------------------ the action space (action_space/, geometry/)
def so3_to_yaw_torch(rot_mat):
    return torch.atan2(rot_mat[..., 1, 0], rot_mat[..., 0, 0])


def round_2pi_torch(x):
    return torch.atan2(torch.sin(x), torch.cos(x))


def unwrap_angle(phi):
    d = round_2pi_torch(torch.diff(phi, dim=-1))
    return torch.cat([phi[..., :1], phi[..., :1] + torch.cumsum(d, dim=-1)], dim=-1)


def third_order_D(N, lead_shape, dtype):
    D = torch.zeros(*lead_shape, max(N - 3, 0), N, dtype=dtype)
    rows = torch.arange(max(N - 3, 0))
    D[..., rows, rows] = -1.0
    D[..., rows, rows + 1] = 3.0
    D[..., rows, rows + 2] = -3.0
    D[..., rows, rows + 3] = 1.0
    return D


def construct_DTD_3(N, lead, dtype, w_smooth3: float, lam: float, dt: float):
    """construct_DTD with only the third-order term (what dxy_theta_to_v_without_v0 asks for)."""
    DTD = torch.zeros(*lead, N, N, dtype=dtype)
    lam_3 = lam / dt ** 6
    w_smooth3_tensor = torch.full((*lead, max(N - 3, 0)), w_smooth3, dtype=dtype)
    D3 = third_order_D(N, lead, dtype)
    DTD += lam_3 * torch.einsum("...ij,...ik->...jk", D3 * w_smooth3_tensor.unsqueeze(-1), D3)
    return DTD


def dxy_theta_to_v_without_v0(dxy, theta, dt, v_lambda, v_ridge):
    *lead, N, _ = dxy.shape
    dtype = dxy.dtype
    g = 2 / dt * dxy
    w = torch.ones_like(dxy[..., 0])
    A_data = torch.zeros(*lead, 2 * N, N + 1, dtype=dtype)
    b_data = g.flatten(start_dim=-2)
    cos_theta, sin_theta = torch.cos(theta), torch.sin(theta)
    cos_rows, sin_rows, cols = 2 * torch.arange(N), 2 * torch.arange(N) + 1, torch.arange(N)
    A_data[..., cos_rows, cols] = cos_theta[..., :-1]
    A_data[..., cos_rows, cols + 1] = cos_theta[..., 1:]
    A_data[..., sin_rows, cols] = sin_theta[..., :-1]
    A_data[..., sin_rows, cols + 1] = sin_theta[..., 1:]
    Aw_data = A_data * torch.repeat_interleave(w, 2, dim=-1).unsqueeze(-1)
    ATA = torch.einsum("...ij,...ik->...jk", Aw_data, A_data)
    rhs = torch.einsum("...ij,...i->...j", Aw_data, b_data)
    DTD = construct_DTD_3(N + 1, lead, dtype, w_smooth3=1.0, lam=v_lambda, dt=dt)
    ridge_term = v_ridge * torch.eye(N + 1, dtype=dtype).expand(*lead, N + 1, N + 1)
    lhs = ATA + DTD + ridge_term
    L = torch.linalg.cholesky(lhs)
    return torch.cholesky_solve(rhs.unsqueeze(-1), L).squeeze(-1)


def estimate_t0_states(traj_history_xyz, traj_history_rot, aspace):
    full_xy = traj_history_xyz[..., :2]
    dxy = full_xy[..., 1:, :] - full_xy[..., :-1, :]
    theta = unwrap_angle(so3_to_yaw_torch(traj_history_rot))
    v = dxy_theta_to_v_without_v0(dxy=dxy, theta=theta, dt=aspace["dt"], v_lambda=aspace["v_lambda"],
                                  v_ridge=aspace["v_ridge"])
    return {"v": v[..., -1]}


def rotation_matrix_torch(angle):
    return torch.stack([torch.stack([torch.cos(angle), -torch.sin(angle)], dim=-1),
                        torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1)], dim=-2)


def rot_2d_to_3d(rot):
    return torch.cat([torch.cat([rot, torch.zeros_like(rot[..., :1])], dim=-1),
                      torch.tensor([0.0, 0.0, 1.0]).repeat(rot.shape[:-2] + (1, 1))], dim=-2)


def action_to_traj(action, traj_history_xyz, traj_history_rot, aspace):
    """UnicycleAccelCurvatureActionSpace.action_to_traj (t0_states=None)."""
    accel, kappa = action[..., 0], action[..., 1]
    accel = accel * torch.tensor(aspace["accel_std"]) + torch.tensor(aspace["accel_mean"])
    kappa = kappa * torch.tensor(aspace["curvature_std"]) + torch.tensor(aspace["curvature_mean"])
    v0 = estimate_t0_states(traj_history_xyz, traj_history_rot, aspace)["v"]
    dt = aspace["dt"]
    dt_2_term = 0.5 * (dt ** 2)
    velocity = torch.cat([v0.unsqueeze(-1), (v0.unsqueeze(-1) + torch.cumsum(accel * dt, dim=-1))], dim=-1)
    initial_yaw = torch.zeros_like(v0)
    theta = torch.cat([initial_yaw.unsqueeze(-1),
                       (initial_yaw.unsqueeze(-1) + torch.cumsum(kappa * velocity[..., :-1] * dt, dim=-1)
                        + torch.cumsum(kappa * accel * dt_2_term, dim=-1))], dim=-1)
    half_dt_term = 0.5 * dt
    initial_x, initial_y = torch.zeros_like(v0), torch.zeros_like(v0)
    x = (initial_x.unsqueeze(-1)
         + torch.cumsum(velocity[..., :-1] * torch.cos(theta[..., :-1]) * half_dt_term, dim=-1)
         + torch.cumsum(velocity[..., 1:] * torch.cos(theta[..., 1:]) * half_dt_term, dim=-1))
    y = (initial_y.unsqueeze(-1)
         + torch.cumsum(velocity[..., :-1] * torch.sin(theta[..., :-1]) * half_dt_term, dim=-1)
         + torch.cumsum(velocity[..., 1:] * torch.sin(theta[..., 1:]) * half_dt_term, dim=-1))
    batch_dim = traj_history_xyz.shape[:-2]
    traj_future_xyz = torch.zeros(*batch_dim, aspace["T"], 3, dtype=traj_history_xyz.dtype)
    traj_future_xyz[..., 0] = x
    traj_future_xyz[..., 1] = y
    traj_future_xyz[..., 2] = traj_history_xyz[..., -1:, 2]
    traj_future_rot = rot_2d_to_3d(rotation_matrix_torch(theta[..., 1:]))
    return traj_future_xyz, traj_future_rot, v0


@torch.no_grad()
def release_expert_stage(ck: Checkpoint, rollout: dict, num_traj_samples: int, generator, temperature: float = 1.0,
                         guided: bool = False, weight: float = 1.0, steps: int | None = None, noise_offset=None):
    """Steps 2-4 of the release's rollout functions on `rollout` (see make_rollout): returns pred_xyz, pred_rot,
    sampled_action shaped [G, 1, nj, ...] and v0."""
    rel = ReleaseExpert(ck)
    n_samples_total = num_traj_samples
    T = ck.aspace["T"]
    prompt_cache = copy.deepcopy(rollout["cache"])
    b_star = rollout["sequences"].shape[0]
    offset = find_eos_offset(rollout["sequences"], rollout["eos"])
    prefix_mask = torch.repeat_interleave(rollout["prefix_mask"], n_samples_total, dim=0)
    # rope_deltas is [G, 1] (Qwen3-VL keeps it per prompt); the release adds it to offset[:, None] of [G*N, 1],
    # which broadcasts for G = 1; per sequence, as Qwen3-VL's decoding repeats it, for any G.
    rope_deltas = rollout["rope_deltas"].repeat_interleave(b_star // rollout["rope_deltas"].shape[0], dim=0)
    position_ids, attention_mask = build_expert_pos_ids_and_attn_mask(
        offset, rope_deltas, prompt_cache.get_seq_length(), T, b_star, prefix_mask)
    step = lambda x, t: rel.step_fn(x, t, position_ids, prompt_cache, attention_mask)  # noqa: E731
    unguided_step = None
    if guided:
        u_cache = copy.deepcopy(rollout["unguided_cache"])
        u_offset = find_eos_offset(rollout["unguided_sequences"], rollout["eos"])
        u_mask = torch.repeat_interleave(rollout["unguided_prefix_mask"], n_samples_total, dim=0)
        u_rope = rollout["unguided_rope_deltas"]
        u_rope = u_rope.repeat_interleave(b_star // u_rope.shape[0], dim=0)
        u_pos, u_attn = build_expert_pos_ids_and_attn_mask(u_offset, u_rope, u_cache.get_seq_length(), T, b_star,
                                                           u_mask)
        unguided_step = lambda x, t: rel.step_fn(x, t, u_pos, u_cache, u_attn)  # noqa: E731
    sampled_action = euler(b_star, (T, 2), step, unguided_step, steps or ck.steps, weight, guided, temperature,
                           generator, noise_offset)
    hist_xyz = rollout["ego_history_xyz"][:, -1].repeat_interleave(n_samples_total, dim=0)
    hist_rot = rollout["ego_history_rot"][:, -1].repeat_interleave(n_samples_total, dim=0)
    pred_xyz, pred_rot, v0 = action_to_traj(sampled_action, hist_xyz, hist_rot, ck.aspace)
    G = b_star // n_samples_total
    r = lambda t: t.reshape(G, 1, num_traj_samples, *t.shape[1:])  # noqa: E731
    return r(pred_xyz), r(pred_rot), r(sampled_action), v0


# ------------------------------------------------------------------ a tiny VLM rollout (the release's step 1)
PAD, EOS, VSTART, VEND, IMG = 0, 57, 58, 59, 60
NAV = (61, 62)  # <|route_start|> ... <|route_end|>: the navigation text the unguided prompt drops


def tiny_vlm(L: int, Hkv: int, d: int) -> Qwen3VLForConditionalGeneration:
    torch.manual_seed(0)
    cfg = Qwen3VLConfig(
        text_config=dict(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=L,
                         num_attention_heads=4, num_key_value_heads=Hkv, head_dim=d, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                                          "mrope_interleaved": True}, max_position_embeddings=4096),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=48,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[0]),
        image_token_id=IMG, vision_start_token_id=VSTART, vision_end_token_id=VEND, video_token_id=63)
    cfg.text_config._attn_implementation = "eager"
    m = Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # O(1) activations (the default init's std 0.02 gives near-constant keys)
        for n, p in m.model.language_model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1 / p.shape[1] ** 0.5 if "embed" not in n else 1.0)
    return m


class _ForceEOS(LogitsProcessor):
    """Ends sequence b's reasoning after at[b] generated tokens with <traj_future_start> (never elsewhere)."""

    def __init__(self, prompt_len: int, at: list[int]):
        self.Lp, self.at = prompt_len, at

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.Lp
        for b in range(input_ids.shape[0]):
            if step == self.at[b]:
                scores[b, :] = -float("inf")
                scores[b, EOS] = 0
            else:
                scores[b, EOS] = -float("inf")
        return scores


class _StopAfterEOS(StoppingCriteria):
    """The release's StopAfterEOS: stop once every sequence has <traj_future_start> and one token after it
    (so the cache holds its row)."""

    def __init__(self, prompt_len: int):
        self.Lp = prompt_len

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids[:, self.Lp:-1] == EOS).any(dim=1)


def _left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    Lp = max(map(len, rows))
    ids = torch.full((len(rows), Lp), PAD)
    mask = torch.zeros(len(rows), Lp, dtype=torch.long)
    for g, r in enumerate(rows):
        ids[g, Lp - len(r):] = torch.tensor(r)
        mask[g, Lp - len(r):] = 1
    return ids, mask


@torch.no_grad()
def make_rollout(vlm, num_traj_samples: int, eos_at: list[int], seed: int = 0) -> dict:
    """Two prompts of different lengths (left-padded) with an image each (grids 4x4 and 4x8 patches: rope deltas
    differ) and navigation text; generate(num_return_sequences=N) as the release drives it, then the unguided
    cache as `..._cfg_nav` builds it. Also the ego history as the release's data holds it ([G, 1, H, 3])."""
    from synth import ego_history
    g = torch.Generator().manual_seed(seed)
    words = lambda n: torch.randint(1, 50, (n,), generator=g).tolist()  # noqa: E731
    grids = [(1, 4, 4), (1, 4, 8)]
    prompts = [words(3) + [VSTART] + [IMG] * 4 + [VEND] + words(2) + [NAV[0]] + words(3) + [NAV[1]] + words(2),
               words(6) + [VSTART] + [IMG] * 8 + [VEND] + words(4) + [NAV[0]] + words(4) + [NAV[1]] + words(3)]
    ids, mask = _left_pad(prompts)
    pixel_values = torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 4 * 4, generator=g)
    thw = torch.tensor(grids)
    Lp = ids.shape[1]
    vlm.model.rope_deltas = None
    gen = GenerationConfig(do_sample=True, top_p=0.98, temperature=0.6, num_return_sequences=num_traj_samples,
                           max_new_tokens=max(eos_at) + 4, return_dict_in_generate=True, pad_token_id=PAD)
    torch.manual_seed(seed)
    out = vlm.generate(input_ids=ids, attention_mask=mask, pixel_values=pixel_values, image_grid_thw=thw,
                       mm_token_type_ids=(ids == IMG).long(), generation_config=gen,
                       logits_processor=LogitsProcessorList([_ForceEOS(Lp, eos_at)]),
                       stopping_criteria=StoppingCriteriaList([_StopAfterEOS(Lp)]))
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    rope_deltas = vlm.model.rope_deltas.clone()
    sequences = out.sequences
    # ..._cfg_nav step 2: the unguided prompt (nav span removed, left-padded again), prefilled once per prompt,
    # repeated per sample, then the generated tokens forwarded over it.
    un = [[t for i, t in enumerate(p) if not (p.index(NAV[0]) <= i <= p.index(NAV[1]))] for p in prompts]
    u_ids, u_mask = _left_pad(un)
    vlm.model.rope_deltas = None
    pre = vlm(input_ids=u_ids, attention_mask=u_mask, pixel_values=pixel_values, image_grid_thw=thw,
              mm_token_type_ids=(u_ids == IMG).long(), use_cache=True, logits_to_keep=1)
    u_cache = pre.cache if getattr(pre, "cache", None) is not None else pre.past_key_values
    u_cache.batch_repeat_interleave(num_traj_samples)
    generated = sequences[:, Lp:]
    Lu, n_gen = u_ids.shape[1], generated.shape[1]
    full_mask = torch.cat([u_mask.repeat_interleave(num_traj_samples, dim=0), generated.ne(PAD).long()], dim=1)
    # transformers 5.24 derives these tokens' positions from the whole attention mask (a shape error): give
    # the ones the release's transformers computed, cache_position + rope_deltas.
    u_rope_rows = vlm.model.rope_deltas.repeat_interleave(num_traj_samples, dim=0)
    pos = (torch.arange(Lu, Lu + n_gen)[None, :] + u_rope_rows)[None].expand(3, -1, -1)
    post = vlm(input_ids=generated, attention_mask=full_mask, cache=u_cache, position_ids=pos,
               cache_position=torch.arange(Lu, Lu + n_gen), use_cache=True, logits_to_keep=1)
    u_cache = post.cache if getattr(post, "cache", None) is not None else post.past_key_values
    u_rope = vlm.model.rope_deltas.clone()
    u_sequences = torch.cat([u_ids.repeat_interleave(num_traj_samples, dim=0), generated], dim=1)
    xyz, rot = ego_history(2)
    return dict(cache=cache, sequences=sequences, rope_deltas=rope_deltas, prefix_mask=mask, prompt_len=Lp,
                eos=EOS, unguided_cache=u_cache, unguided_sequences=u_sequences, unguided_rope_deltas=u_rope,
                unguided_prefix_mask=u_mask, ego_history_xyz=xyz[:, None], ego_history_rot=rot[:, None])
