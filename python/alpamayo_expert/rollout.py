"""The expert stage of the release's VLM rollout, run by the engine.

NVlabs/alpamayo1.5 `Alpamayo1_5.sample_trajectories_from_data_with_vlm_rollout` (src/alpamayo1_5/models/
alpamayo1_5.py) generates the reasoning with `vlm.generate(num_return_sequences=N)`, then runs the expert
over the generate cache: offsets from `_find_eos_offset` (the index after the first `<traj_future_start>`),
position ids and a 4D mask from `_build_expert_pos_ids_and_attn_mask` (positions arange(T) + rope_deltas +
offset; cache rows at or after the offset and rows where the prompt's attention mask is 0 are masked),
`FlowMatching` Euler steps (with `_guided_v` when classifier-free guidance is on: the
`..._cfg_nav` variant's unguided cache from the prompt without the navigation text), and the unicycle
`action_to_traj`. `sample_trajectories` takes what generate leaves and returns what that function returns:
pred_xyz [G, ns, nj, T, 3], pred_rot [G, ns, nj, T, 3, 3], sampled_action [G, ns, nj, T, 2].

The cache layout the engine gets (`rollout_layout`): with share_prompt=True (default) the prompt rows
[0, Lp) of each prompt are stored once, after checking that they are identical across its N sequences, and
each sequence's generated rows [Lp, offset) are its suffix; both are copied out of the generate cache once
(G*Lp + G*N*(R - Lp) rows per layer), and every Euler step then reads each prompt once for all its samples.
share_prompt=False binds the generate cache itself without any copy (when it is row-major), each sequence
attending its own rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .context import as_tensor_checked, cache_layers, describe
from .engine import Context, InvalidArgumentError, Model, Session

__all__ = ["RolloutLayout", "find_eos_offset", "rollout_layout", "repeat_history", "rollout_context",
           "sample_trajectories"]


def find_eos_offset(sequences: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """The release's `_find_eos_offset`: first position of eos_token_id + 1 per sequence; the sequence length
    when it does not occur (the release warns and falls back to the last token)."""
    sequences = torch.as_tensor(sequences)
    if sequences.dim() != 2:
        raise InvalidArgumentError(f"sequences: expected [B, L] token ids, got shape {tuple(sequences.shape)}")
    mask = sequences == eos_token_id
    has_eos = mask.any(dim=1)
    first = mask.int().argmax(dim=1)
    last = torch.full_like(first, sequences.shape[1] - 1)
    return (torch.where(has_eos, first, last) + 1).to(torch.int64).cpu()


def _vector(x: Any, n: int, groups: int, name: str) -> torch.Tensor:
    """[n] int64 from [n], [n, 1], [groups] or [groups, 1] (repeated per group's n // groups sequences)."""
    t = as_tensor_checked(x, name, "a vector of 64-bit integers", InvalidArgumentError).detach().cpu()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise InvalidArgumentError(f"{name}: expected integers, got dtype {t.dtype} ({describe(t)})")
    if t.dim() == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dim() != 1:
        raise InvalidArgumentError(f"{name}: expected shape [B] or [B, 1], got {tuple(t.shape)}")
    t = t.to(torch.int64)
    if t.shape[0] == n:
        return t
    if t.shape[0] == groups or t.shape[0] == 1:
        return t.repeat_interleave(n // t.shape[0])
    raise InvalidArgumentError(f"{name} has {t.shape[0]} entries; expected one per sequence ({n}) or per prompt ({groups})")


def _left_pads(prefix_mask: Any, n: int, groups: int, name: str) -> tuple[torch.Tensor, int]:
    """Left-padding rows per prompt [G] and the prompt width Lp from a tokenizer attention mask [G or B, Lp]."""
    m = as_tensor_checked(prefix_mask, name, "the tokenizer's attention_mask [B, Lp] of 0/1", InvalidArgumentError).detach().cpu()
    if m.dim() != 2:
        raise InvalidArgumentError(f"{name}: expected the tokenizer's attention_mask [B, Lp], got shape {tuple(m.shape)}")
    if m.is_floating_point():
        if not ((m == 0) | (m == 1)).all():
            raise InvalidArgumentError(f"{name}: expected 0/1 values")
    m = m.to(torch.int64)
    if not ((m == 0) | (m == 1)).all():
        raise InvalidArgumentError(f"{name}: expected 0/1 values, found {sorted(set(m.unique().tolist()) - {0, 1})[:3]}")
    rows = m.shape[0]
    if rows == n and n != groups:
        per = n // groups
        for g in range(groups):
            block = m[g * per:(g + 1) * per]
            if not (block == block[0]).all():
                j = int((block != block[0]).any(dim=1).nonzero()[0])
                raise InvalidArgumentError(f"{name}: rows {g * per} and {g * per + j} differ, but both are sequences of prompt {g}")
        m = m[::per]
    elif rows != groups:
        raise InvalidArgumentError(f"{name} has {rows} rows; expected one per prompt ({groups}) or per sequence ({n})")
    Lp = m.shape[1]
    pads = torch.zeros(groups, dtype=torch.int64)
    for g in range(groups):
        ones = m[g].nonzero()
        p = int(ones[0]) if len(ones) else Lp
        if p == Lp or not bool((m[g, p:] == 1).all()):
            raise InvalidArgumentError(f"{name}: row {g} is not left padding (zeros, then ones): {m[g].tolist()}. The release "
                        "left-pads its prompts; the engine masks one run of padding at the start of each prompt")
        pads[g] = p
    return pads, Lp


@dataclass
class RolloutLayout:
    """The engine's view of a rollout cache (docs/FORMATS.md): G prompts, B = G*N samples."""
    prompt_kv: list[tuple[torch.Tensor, torch.Tensor]]         # [G, Hkv, P, d] per layer (or [B, ...] unshared)
    valid_len: torch.Tensor                                     # [G]
    prefix_pad: torch.Tensor                                    # [G]
    prompt_index: torch.Tensor | None                           # [B]; None: sample b uses prompt b
    suffix_kv: list[tuple[torch.Tensor, torch.Tensor]] | None   # [B, Hkv, Q, d] per layer
    suffix_len: torch.Tensor | None                             # [B]
    rope_delta: torch.Tensor                                    # [B]
    offsets: torch.Tensor                                       # [B] the release's offsets
    batch: int
    prompts: int

    def context(self, *, ego_history_xyz=None, ego_history_rot=None, v0=None, name: str = "rollout") -> Context:
        return Context([k for k, _ in self.prompt_kv], [v for _, v in self.prompt_kv], self.valid_len,
                       self.rope_delta, prefix_pad=self.prefix_pad, prompt_index=self.prompt_index,
                       suffix_keys=[k for k, _ in self.suffix_kv] if self.suffix_kv else None,
                       suffix_values=[v for _, v in self.suffix_kv] if self.suffix_kv else None,
                       suffix_len=self.suffix_len, ego_history_xyz=ego_history_xyz,
                       ego_history_rot=ego_history_rot, v0=v0, name=name)


def rollout_layout(past_key_values: Any, rope_deltas: Any, *, num_return_sequences: int, sequences: Any = None,
                   eos_token_id: int | None = None, offsets: Any = None, prefix_mask: Any = None,
                   prompt_len: int | None = None, share_prompt: bool = True, prompt_atol: float = 0.0,
                   name: str = "rollout") -> RolloutLayout:
    """Lays out a generate cache for the engine. See `write_rollout_context` for the arguments.

    Sequence b = g*N + j attends, as the release's mask lets it, prompt rows [pad_g, Lp) and its generated
    rows [Lp, min(offset_b, R)); its expert tokens sit at arange(T) + rope_deltas_b + offset_b. (When a
    sequence never generated `<traj_future_start>` the release's offset is the sequence length, one past the
    cache: the rows are all attended and the position is kept by adding offset_b - min(offset_b, R) to the
    rope delta.)
    """
    kv = cache_layers(past_key_values)
    if not kv:
        raise InvalidArgumentError(f"{name}: the cache has no layers")
    for l, (k, v) in enumerate(kv):
        for what, t in (("key", k), ("value", v)):
            if not isinstance(t, torch.Tensor):
                raise InvalidArgumentError(f"{name}: cache layer {l} {what}: expected a torch tensor, got {describe(t)}")
            as_tensor_checked(t, f"{name}: cache layer {l} {what}", "a float tensor [B, Hkv, R, d] on the cpu or cuda",
                              InvalidArgumentError)
            if not t.is_floating_point():
                raise InvalidArgumentError(f"{name}: cache layer {l} {what}: {describe(t)}; expected a float tensor")
    k0 = kv[0][0]
    if k0.dim() != 4:
        raise InvalidArgumentError(f"{name}: cache layer 0 key: expected [B, Hkv, R, d], got shape {tuple(k0.shape)}")
    B, _, R, _ = k0.shape
    N = int(num_return_sequences)
    if N < 1 or B % N:
        raise InvalidArgumentError(f"{name}: the cache holds {B} sequences, not a multiple of num_return_sequences = {N}")
    G = B // N
    if offsets is not None:
        off = _vector(offsets, B, G, "offsets")
    elif sequences is not None:
        if eos_token_id is None:
            raise InvalidArgumentError(f"{name}: sequences need eos_token_id (the id of <traj_future_start>)")
        seq = as_tensor_checked(sequences, "sequences", "token ids [B, L]", InvalidArgumentError)
        if seq.shape[0] != B:
            raise InvalidArgumentError(f"{name}: sequences has {seq.shape[0]} rows, the cache {B}")
        off = find_eos_offset(seq, eos_token_id)
    else:
        raise InvalidArgumentError(f"{name}: give the sequences (with eos_token_id) or the offsets")
    rd = _vector(rope_deltas, B, G, "rope_deltas")
    if prefix_mask is not None:
        pads, Lp = _left_pads(prefix_mask, B, G, "prefix_mask")
        if prompt_len is not None and int(prompt_len) != Lp:
            raise InvalidArgumentError(f"{name}: prompt_len {prompt_len} != the prefix mask's width {Lp}")
    else:
        pads = torch.zeros(G, dtype=torch.int64)
        Lp = int(prompt_len) if prompt_len is not None else None
    if Lp is not None and not 0 < Lp <= R:
        raise InvalidArgumentError(f"{name}: the prompt has {Lp} columns, the cache {R} rows")
    if (off < 1).any():
        raise InvalidArgumentError(f"{name}: offsets must be >= 1, got {off.tolist()}")
    end = off.clamp(max=R)             # rows [0, end_b) are attended (minus the padding)
    rope = rd + (off - end)            # keeps positions arange(T) + rope_deltas + offset
    prompt_of = torch.arange(B) // N
    for b in range(B):
        lo = int(pads[prompt_of[b]])
        if Lp is not None and share_prompt and int(off[b]) <= Lp:
            raise InvalidArgumentError(f"{name}: sequence {b}'s <traj_future_start> is at index {int(off[b]) - 1}, inside the "
                        f"prompt (columns [0, {Lp})): the prompt cannot be shared; offsets must lie after it")
        if int(end[b]) < lo:
            raise InvalidArgumentError(f"{name}: sequence {b}'s offset {int(off[b])} lies inside its left padding ({lo} rows)")
    if not share_prompt:
        return RolloutLayout(prompt_kv=kv, valid_len=end, prefix_pad=pads[prompt_of], prompt_index=None,
                             suffix_kv=None, suffix_len=None, rope_delta=rope, offsets=off, batch=B, prompts=B)
    if Lp is None:
        raise InvalidArgumentError(f"{name}: sharing the prompt needs its length: give prefix_mask (the tokenizer's attention "
                    "mask) or prompt_len")
    _check_prompts_equal(kv, N, pads, Lp, prompt_atol, name)
    first = torch.arange(0, B, N)
    prompt_kv = [(k[first.to(k.device), :, :Lp].contiguous(), v[first.to(v.device), :, :Lp].contiguous())
                 for k, v in kv]
    Q = R - Lp
    suffix_kv = [(k[:, :, Lp:].contiguous(), v[:, :, Lp:].contiguous()) for k, v in kv] if Q > 0 else None
    suffix_len = (end - Lp) if Q > 0 else None
    return RolloutLayout(prompt_kv=prompt_kv, valid_len=torch.full((G,), Lp, dtype=torch.int64), prefix_pad=pads,
                         prompt_index=prompt_of, suffix_kv=suffix_kv, suffix_len=suffix_len, rope_delta=rope,
                         offsets=off, batch=B, prompts=G)


def _check_prompts_equal(kv, N: int, pads: torch.Tensor, Lp: int, atol: float, name: str) -> None:
    """The prompt rows each sequence attends must be the same in all N sequences of a prompt: checked, not assumed."""
    if N == 1:
        return
    for l, (k, v) in enumerate(kv):
        for what, t in (("key", k), ("value", v)):
            G = t.shape[0] // N
            for g in range(G):
                lo = int(pads[g])
                ref = t[g * N, :, lo:Lp]
                rest = t[g * N + 1:(g + 1) * N, :, lo:Lp]
                if atol == 0:
                    same = (rest == ref).flatten(1).all(dim=1)
                else:
                    same = ((rest.float() - ref.float()).abs() <= atol).flatten(1).all(dim=1)
                if not bool(same.all()):
                    j = int((~same).nonzero()[0]) + 1
                    d = float((rest[j - 1].float() - ref.float()).abs().max())
                    raise InvalidArgumentError(f"{name}: layer {l} {what}: the prompt rows [{lo}, {Lp}) of sequence {g * N + j} differ "
                                f"from those of sequence {g * N} (same prompt {g}) by up to {d:.3e}; "
                                f"{'give prompt_atol to accept that, or ' if atol == 0 else ''}"
                                "use share_prompt=False")


def repeat_history(ego_history_xyz: Any, ego_history_rot: Any, n: int, batch: int):
    """The release's `einops.repeat(ego_history_xyz[:, -1], "b ... -> (b n) ...", n=n)`: [G, ng, H, 3] or
    [G, H, 3] (and rot) -> [G*n, H, 3], [G*n, H, 3, 3] float32."""
    if (ego_history_xyz is None) != (ego_history_rot is None):
        raise InvalidArgumentError("ego_history_xyz and ego_history_rot must be given together")
    xyz = as_tensor_checked(ego_history_xyz, "ego_history_xyz", "float values [G, H, 3]", InvalidArgumentError).detach().float().cpu()
    rot = as_tensor_checked(ego_history_rot, "ego_history_rot", "float values [G, H, 3, 3]", InvalidArgumentError).detach().float().cpu()
    if xyz.dim() == 4:
        xyz, rot = xyz[:, -1], rot[:, -1]
    if xyz.dim() != 3 or xyz.shape[-1] != 3 or rot.dim() != 4 or rot.shape[-2:] != (3, 3):
        raise InvalidArgumentError(f"ego history: expected xyz [G, 1, H, 3] / [G, H, 3] and rot [G, 1, H, 3, 3] / [G, H, 3, 3], got "
                    f"{tuple(torch.as_tensor(ego_history_xyz).shape)} and {tuple(torch.as_tensor(ego_history_rot).shape)}")
    if xyz.shape[0] * n == batch:
        return xyz.repeat_interleave(n, dim=0), rot.repeat_interleave(n, dim=0)
    if xyz.shape[0] == batch:
        return xyz, rot
    raise InvalidArgumentError(f"ego history has {xyz.shape[0]} rows; expected one per prompt ({batch // n}) or per sample ({batch})")


def rollout_context(past_key_values: Any, rope_deltas: Any, *, num_return_sequences: int, ego_history_xyz: Any,
                    ego_history_rot: Any, name: str = "rollout", **layout_kwargs) -> tuple[Context, RolloutLayout]:
    """An engine Context over a generate cache (rollout_layout's arguments), with the ego history repeated."""
    lay = rollout_layout(past_key_values, rope_deltas, num_return_sequences=num_return_sequences, name=name,
                         **layout_kwargs)
    xyz, rot = repeat_history(ego_history_xyz, ego_history_rot, num_return_sequences, lay.batch)
    return lay.context(ego_history_xyz=xyz, ego_history_rot=rot, name=name), lay


def sample_trajectories(model: Model, past_key_values: Any, rope_deltas: Any, *, ego_history_xyz: Any,
                        ego_history_rot: Any, sequences: Any = None, eos_token_id: int | None = None,
                        offsets: Any = None, prefix_mask: Any = None, prompt_len: int | None = None,
                        num_traj_samples: int = 6, num_traj_sets: int = 1,
                        unguided_past_key_values: Any = None, unguided_rope_deltas: Any = None,
                        unguided_sequences: Any = None, unguided_offsets: Any = None,
                        unguided_prefix_mask: Any = None, unguided_prompt_len: int | None = None,
                        use_classifier_free_guidance: bool | None = None, guidance_weight: float | None = None,
                        temperature: float = 1.0, noise: Any = None,
                        generator: torch.Generator | Sequence[torch.Generator] | None = None,
                        seeds: Sequence[int] | None = None, steps: int | None = None, share_prompt: bool = True,
                        prompt_atol: float = 0.0, session: Session | None = None):
    """The expert stage of `sample_trajectories_from_data_with_vlm_rollout` (and of its `_cfg_nav` variant)
    on the engine. Returns (pred_xyz [G, ns, nj, T, 3], pred_rot [G, ns, nj, T, 3, 3], sampled_action
    [G, ns, nj, T, 2]) as float32 torch tensors, ns = num_traj_sets, nj = num_traj_samples.

    From the rollout: past_key_values (generate's cache: `outputs.past_key_values`, or `.cache` in newer
    transformers), rope_deltas (`vlm.model.rope_deltas`), sequences with eos_token_id (the id of
    `<traj_future_start>`) or the offsets, prefix_mask (`tokenized_data["attention_mask"]`, left padding) or
    prompt_len, and data["ego_history_xyz"] / ["ego_history_rot"] ([G, 1, H, 3] / [G, 1, H, 3, 3]).
    Guidance: the unguided cache the `_cfg_nav` variant builds (prompt without the navigation text, prefilled,
    repeated and extended with the generated tokens) with its rope deltas, sequences or offsets, and prefix
    mask; it is used when use_classifier_free_guidance (default: the config's) is on, with guidance_weight
    (default: the config's inference_guidance_weight): v = (1 - w) v_unguided + w v_guided.
    Initial noise, as FlowMatching draws it, the first given of: noise [G*ns*nj, T, 2] (the caller's);
    generator (a torch.Generator, or a list with one per sample: drawn with torch exactly as the release's
    `_initial_noise`); seeds (one per sample, the engine's own generator); else torch's global generator, as
    the release with generator=None. It is multiplied by temperature (FlowMatching's noise temperature, not
    the VLM's sampling temperature). steps: default the config's num_inference_steps.
    share_prompt, prompt_atol: see rollout_layout (the cache is read in place with share_prompt=False).
    session: reuse a Session of this model (one is created otherwise).
    past_key_values (and unguided_past_key_values) may also be a Context bound already, e.g. Context.from_paged over
    a serving engine's page pools with the samples of one prompt sharing its pages (its ego history or v0 inside;
    rope_deltas and the layout arguments are then unused); the outputs are then on the cpu.
    """
    n = int(num_traj_samples) * int(num_traj_sets)
    if isinstance(past_key_values, Context):  # bound already (Context.from_paged: a serving engine's pages)
        ctx = past_key_values
        if ctx.batch % n:
            raise InvalidArgumentError(f"the context has {ctx.batch} samples, not a multiple of num_traj_samples * "
                                       f"num_traj_sets = {n}")
        batch, device = ctx.batch, torch.device("cpu")
    else:
        ctx, lay = rollout_context(past_key_values, rope_deltas, num_return_sequences=n,
                                   ego_history_xyz=ego_history_xyz, ego_history_rot=ego_history_rot,
                                   sequences=sequences, eos_token_id=eos_token_id, offsets=offsets,
                                   prefix_mask=prefix_mask, prompt_len=prompt_len, share_prompt=share_prompt,
                                   prompt_atol=prompt_atol, name="rollout")
        batch, device = lay.batch, cache_layers(past_key_values)[0][0].device
    cfg = model.config
    use_cfg = cfg["use_classifier_free_guidance"] if use_classifier_free_guidance is None else bool(use_classifier_free_guidance)
    unguided = None
    if use_cfg:
        if unguided_past_key_values is None:
            raise InvalidArgumentError("classifier-free guidance is on: give the unguided cache (unguided_past_key_values, "
                        "unguided_rope_deltas, unguided_sequences or unguided_offsets, unguided_prefix_mask), "
                        "or use_classifier_free_guidance=False")
        unguided = unguided_past_key_values if isinstance(unguided_past_key_values, Context) else rollout_context(
            unguided_past_key_values, unguided_rope_deltas if unguided_rope_deltas is not None else rope_deltas,
            num_return_sequences=n, ego_history_xyz=ego_history_xyz, ego_history_rot=ego_history_rot,
            sequences=unguided_sequences, eos_token_id=eos_token_id, offsets=unguided_offsets,
            prefix_mask=unguided_prefix_mask, prompt_len=unguided_prompt_len, share_prompt=share_prompt,
            prompt_atol=prompt_atol, name="unguided rollout")[0]
    if session is None:
        session = Session(model)
    elif session.model is not model:
        raise InvalidArgumentError("session: a Session of another Model")
    session.bind(ctx, guidance=unguided, guidance_weight=guidance_weight if unguided is not None else None,
                 no_guidance=not use_cfg)
    B, T, A = batch, cfg["n_waypoints"], cfg["action_dims"]
    if noise is None and seeds is None:
        # FlowMatching._initial_noise: one randn for the batch, or one per row with a list of generators.
        if isinstance(generator, (list, tuple)):
            if len(generator) != B:
                raise InvalidArgumentError(f"generator list length {len(generator)} must equal the batch size {B}")
            noise = torch.cat([torch.randn(1, T, A, device=g.device, generator=g) for g in generator], dim=0)
        else:
            noise = torch.randn(B, T, A, device=generator.device if generator is not None else device,
                                generator=generator)
    r = session.sample(noise=noise, seeds=seeds if noise is None else None, temperature=temperature, steps=steps,
                       output="torch")
    G, ns, nj = B // n, int(num_traj_sets), int(num_traj_samples)
    shape = lambda t: t.reshape(G, ns, nj, *t.shape[1:]).to(device)  # noqa: E731  "(b ns nj) ... -> b ns nj ..."
    return shape(r.xyz), shape(r.rot), shape(r.action)
