"""alpamayo_expert.sample_trajectories (the engine as the release's expert stage) against the release's own code
path (release_path.py: step_fn, position ids and mask, FlowMatching Euler and guidance, action_to_traj,
rewritten from NVlabs/alpamayo1.5), on a real rollout of a tiny random Qwen3-VL: two left-padded prompts with
an image each (non-zero rope deltas), generate(num_return_sequences=6) with reasoning of different lengths,
and the unguided cache as the `_cfg_nav` variant builds it. Both sides get the same initial noise: per-row
torch generators, drawn by FlowMatching._initial_noise on the release side and by the function on ours.

Bounds (docs/ACCURACY.md): the action differs by the per-step velocity differences amplified by the sampler's
gain g (measured on the release path with a 1e-4 perturbation of the noise): 2 g e_v, e_v the velocity bound of
the backend (fp32: u scale depth (sqrt(K) + phase)), times (|1 - w| + |w|) with guidance. The bf16 / int8 / block
formats are bounded step by step elsewhere (teacher-forced, test_shared_prompts.py); their free-running figures are
printed here. The trajectory: v0 (fp32 solves, 64 H u |v0|) and the decode of the action difference (verify.py's
end-to-end formula); the rotation by the yaw difference.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import alpamayo_expert as ae
from alpamayo_expert import read_context, write_noise, write_rollout_context
from cli import REFERENCE, Backend, sample
from compare import U32, Checks, fp32_bound, max_abs, pcc
from release_path import make_rollout, release_expert_stage, tiny_vlm
from oracle import load_checkpoint
from synth import TINY, make_checkpoint
from verify import pcc_implied
from conftest import require_features

NJ = 6                                        # num_traj_samples, as the release's default
EOS_AT = [3, 5, 1, 7, 2, 4, 6, 2, 8, 1, 3, 5]  # generated tokens before <traj_future_start>, per sequence
WEIGHT = 2.5


@pytest.fixture(scope="module")
def rollout():
    return make_rollout(tiny_vlm(TINY.L, TINY.Hkv, TINY.d), NJ, EOS_AT)


@pytest.fixture(scope="module", params=["r1", "a2"])
def checkpoint(request, tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp(f"ck-{request.param}"), TINY, request.param, "bf16")


def generators(n: int, seed: int = 7):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def engine_model(checkpoint, backend: Backend) -> ae.Model:
    threads = 2 if backend.name == "cpu" else 0
    return ae.Model(str(checkpoint), backend=backend.name, weights=backend.weights or "", threads=threads)


def run_engine(model, rollout, guided: bool, **kw):
    g = dict(unguided_past_key_values=rollout["unguided_cache"], unguided_rope_deltas=rollout["unguided_rope_deltas"],
             unguided_sequences=rollout["unguided_sequences"], unguided_prefix_mask=rollout["unguided_prefix_mask"],
             use_classifier_free_guidance=True, guidance_weight=WEIGHT) if guided else {}
    g.update(kw)
    g.setdefault("generator", generators(len(EOS_AT)))
    return ae.sample_trajectories(
        model, rollout["cache"], rollout["rope_deltas"], sequences=rollout["sequences"], eos_token_id=rollout["eos"],
        prefix_mask=rollout["prefix_mask"], ego_history_xyz=rollout["ego_history_xyz"],
        ego_history_rot=rollout["ego_history_rot"], num_traj_samples=NJ, **g)


def test_rollout_is_realistic(rollout):
    """The fixture is what the test claims: shared prompt rows, left padding, different offsets, rope deltas."""
    seq, Lp = rollout["sequences"], rollout["prompt_len"]
    assert seq.shape[0] == 2 * NJ and rollout["cache"].layers[0].keys.shape[0] == 2 * NJ
    assert rollout["prefix_mask"][0, 0] == 0 and rollout["prefix_mask"][1].all(), "prompt 0 must be left-padded"
    off = ae.find_eos_offset(seq, rollout["eos"])
    assert off.tolist() == [Lp + a + 1 for a in EOS_AT]
    assert rollout["rope_deltas"].flatten().tolist()[0] != rollout["rope_deltas"].flatten().tolist()[1] != 0
    k = rollout["cache"].layers[0].keys
    assert torch.equal(k[0, :, :Lp], k[NJ - 1, :, :Lp]) and not torch.equal(k[0, :, :Lp], k[NJ, :, :Lp])


@pytest.mark.parametrize("guided", [False, True], ids=["plain", "guided"])
def test_matches_release(rollout, checkpoint, backend, guided):
    # The fixture's context: shared prompts, suffixes, left padding (test_the_rollout_is_what_it_claims).
    require_features(backend, "shared-prompts", "suffix-rows", "left-padding", *(["guidance"] if guided else []))
    ck = load_checkpoint(checkpoint, weights=backend.weights)
    model = engine_model(checkpoint, backend)
    xyz, rot, action = run_engine(model, rollout, guided)
    gens = generators(len(EOS_AT))
    r_xyz, r_rot, r_action, r_v0 = release_expert_stage(ck, rollout, NJ, gens, guided=guided, weight=WEIGHT)
    assert xyz.shape == r_xyz.shape == (2, 1, NJ, ck.aspace["T"], 3)
    assert rot.shape == r_rot.shape == (2, 1, NJ, ck.aspace["T"], 3, 3)
    assert action.shape == r_action.shape and xyz.dtype == torch.float32

    # The sampler's gain, on the release path: max|d action| / max|d noise| for a 1e-4 perturbation.
    delta = 1e-4 * (2 * torch.rand(r_action.reshape(-1, ck.aspace["T"], 2).shape,
                                   generator=torch.Generator().manual_seed(5)) - 1)
    _, _, pert_action, _ = release_expert_stage(ck, rollout, NJ, generators(len(EOS_AT)), guided=guided,
                                                weight=WEIGHT, noise_offset=delta)
    gain = max_abs(pert_action, r_action) / float(delta.abs().max())

    checks = Checks()
    if backend.name != "reference":
        # bf16 activations: every Euler step is bounded teacher-forced, under the error model, on these layouts
        # (shared prompts, suffixes, left padding: test_shared_prompts.py); a free-running sample only sums those
        # steps' differences through the sampler, whose gain bound (2 g e_v) is two orders of magnitude above what
        # it does (docs/ACCURACY.md), so here it is reported, not asserted.
        print(f"[{backend.id}] free-running vs the release path: action pcc {pcc(action, r_action):.7f} max|d| "
              f"{max_abs(action, r_action):.3e}; xyz max|d| {max_abs(xyz, r_xyz):.3e} m (gain {gain:.0f})")
        assert torch.isfinite(action).all() and torch.isfinite(xyz).all() and torch.isfinite(rot).all()
        return
    wf = abs(1 - WEIGHT) + abs(WEIGHT) if guided else 1.0
    L, T = ck.L, ck.aspace["T"]
    vscale = 2 * max(1.0, float(r_action.abs().max()))
    K = max(ck.D, ck.Hq * ck.d, ck.I, rollout["cache"].get_seq_length() + T)
    e_v = fp32_bound(vscale, K, 0.0, L + 2)  # per-step velocity: the accumulation term (ACCURACY.md)
    tol_action = 2 * max(gain, 1.0) * wf * e_v + 2 * ck.steps * U32 * float(r_action.abs().max())
    checks.add(f"sampled_action (gain {gain:.0f})", action, r_action, tol_action, pcc_implied(tol_action, r_action))
    Tt, astd = T * ck.aspace["dt"], ck.aspace["accel_std"]
    vmax = float(r_v0.abs().max()) + Tt * astd * (float(r_action[..., 0].abs().max()) + 1)
    tol_v0 = 64 * rollout["ego_history_xyz"].shape[2] * U32 * max(1.0, vmax)
    tol_dec = 8 * T * U32 * (float(r_xyz.abs().max()) + vmax * Tt + 1)
    tol_xyz = Tt * (tol_v0 + Tt * astd * tol_action) + Tt * Tt * vmax * vmax * ck.aspace["curvature_std"] * tol_action + tol_dec
    tol_rot = Tt * vmax * ck.aspace["curvature_std"] * tol_action + 8 * T * U32 * 4
    checks.add("pred_xyz (m)", xyz, r_xyz, tol_xyz, pcc_implied(tol_xyz, r_xyz))
    checks.add("pred_rot", rot, r_rot, tol_rot, pcc_implied(tol_rot, r_rot))
    checks.assert_ok()


def test_share_prompt_false_reads_the_cache_in_place(rollout, checkpoint):
    """share_prompt=False binds the generate cache itself (no copy: the engine's views are the cache's
    tensors), and samples what share_prompt=True samples."""
    model = engine_model(checkpoint, REFERENCE)
    ctx, lay = ae.rollout_context(rollout["cache"], rollout["rope_deltas"], num_return_sequences=NJ,
                                  sequences=rollout["sequences"], eos_token_id=rollout["eos"],
                                  prefix_mask=rollout["prefix_mask"], ego_history_xyz=rollout["ego_history_xyz"],
                                  ego_history_rot=rollout["ego_history_rot"], share_prompt=False)
    assert ctx.copied == [] and ctx.prompts == 2 * NJ
    ptrs = {name: ptr for name, ptr, *_ in ctx.views()}
    for l, layer in enumerate(rollout["cache"].layers):
        assert ptrs[f"rollout: key.{l}"] == layer.keys.data_ptr()
        assert ptrs[f"rollout: value.{l}"] == layer.values.data_ptr()
    a = run_engine(model, rollout, False, share_prompt=False)
    b = run_engine(model, rollout, False, share_prompt=True)
    for x, y in zip(a, b):
        assert max_abs(x, y) < 1e-4


def test_shared_layout(rollout):
    """Prompts stored once (G = 2 prompts for 12 samples), suffixes = generated rows up to each offset."""
    lay = ae.rollout_layout(rollout["cache"], rollout["rope_deltas"], num_return_sequences=NJ,
                            sequences=rollout["sequences"], eos_token_id=rollout["eos"],
                            prefix_mask=rollout["prefix_mask"])
    Lp = rollout["prompt_len"]
    assert lay.prompts == 2 and lay.batch == 12 and lay.prompt_kv[0][0].shape[0] == 2
    assert lay.valid_len.tolist() == [Lp, Lp] and lay.prefix_pad.tolist() == [int((rollout["prefix_mask"][g] == 0).sum()) for g in range(2)]
    assert lay.suffix_len.tolist() == [a + 1 for a in EOS_AT]
    assert lay.prompt_index.tolist() == [0] * NJ + [1] * NJ
    assert lay.rope_delta.tolist() == rollout["rope_deltas"].flatten().repeat_interleave(NJ).tolist()


def test_dump_helper_file_samples_like_the_module(rollout, checkpoint, cli, tmp_path):
    """write_rollout_context writes the shared form; the CLI on that file (and the same noise) gives bitwise
    the module's result, for the guided context too."""
    path, upath = tmp_path / "ctx.safetensors", tmp_path / "unguided.safetensors"
    kw = dict(num_return_sequences=NJ, eos_token_id=rollout["eos"], ego_history_xyz=rollout["ego_history_xyz"],
              ego_history_rot=rollout["ego_history_rot"])
    write_rollout_context(path, rollout["cache"], rollout["rope_deltas"], sequences=rollout["sequences"],
                          prefix_mask=rollout["prefix_mask"], **kw)
    write_rollout_context(upath, rollout["unguided_cache"], rollout["unguided_rope_deltas"],
                          sequences=rollout["unguided_sequences"], prefix_mask=rollout["unguided_prefix_mask"], **kw)
    f = read_context(path)
    Lp = rollout["prompt_len"]
    assert f.keys[0].shape[:3] == (2, TINY.Hkv, Lp) and f.prompt_index.tolist() == [0] * NJ + [1] * NJ
    assert torch.equal(f.keys[0], rollout["cache"].layers[0].keys[::NJ, :, :Lp])
    assert torch.equal(f.suffix_keys[1], rollout["cache"].layers[1].keys[:, :, Lp:])
    assert f.suffix_len.tolist() == [a + 1 for a in EOS_AT] and f.ego_history_xyz.shape[0] == 12
    noise = torch.cat([torch.randn(1, TINY.T, 2, generator=g) for g in generators(12)])
    write_noise(tmp_path / "noise.safetensors", noise)
    model = engine_model(checkpoint, REFERENCE)
    xyz, rot, action = run_engine(model, rollout, True, noise=noise, generator=None)
    res = sample(cli, checkpoint, path, tmp_path, noise=tmp_path / "noise.safetensors", all_steps=False,
                 layers=False, extra=["--guidance-context", upath, "--guidance-weight", WEIGHT])
    assert torch.equal(res["xyz"], xyz.reshape(12, TINY.T, 3))
    assert torch.equal(res["action"], action.reshape(12, TINY.T, 2))


# ---- the ways a rollout is refused
def test_prompt_rows_are_checked_not_assumed(rollout):
    cache = [(l.keys.clone(), l.values.clone()) for l in rollout["cache"].layers]
    cache[1][1][NJ + 3, 0, rollout["prompt_len"] - 1, 5] += 1e-3  # layer 1 value, sequence 9 (prompt 1)
    with pytest.raises(ae.Error, match=r"layer 1 value: the prompt rows .* of sequence 9 differ from those of "
                                       r"sequence 6 \(same prompt 1\) by up to 1\.0"):
        ae.rollout_layout(cache, rollout["rope_deltas"], num_return_sequences=NJ, sequences=rollout["sequences"],
                          eos_token_id=rollout["eos"], prefix_mask=rollout["prefix_mask"])
    ae.rollout_layout(cache, rollout["rope_deltas"], num_return_sequences=NJ, sequences=rollout["sequences"],
                      eos_token_id=rollout["eos"], prefix_mask=rollout["prefix_mask"], prompt_atol=2e-3)
    # Differences in the left padding rows do not matter (no sample reads them).
    cache = [(l.keys.clone(), l.values.clone()) for l in rollout["cache"].layers]
    cache[0][0][1, :, 0] += 5.0
    ae.rollout_layout(cache, rollout["rope_deltas"], num_return_sequences=NJ, sequences=rollout["sequences"],
                      eos_token_id=rollout["eos"], prefix_mask=rollout["prefix_mask"])


@pytest.mark.parametrize("mask, match", [
    ("right", "row 0 is not left padding"),
    ("hole", "row 1 is not left padding"),
    ("values", "0/1 values"),
    ("rows", "rows; expected one per prompt"),
])
def test_prefix_mask_of_another_form_is_refused(rollout, tmp_path, mask, match):
    m = rollout["prefix_mask"].clone()
    if mask == "right":
        m[0] = m[0].flip(0)
    elif mask == "hole":
        m[1, 5] = 0
    elif mask == "values":
        m[1, 5] = 2
    else:
        m = m[:1]
    with pytest.raises(ae.Error, match=match):
        write_rollout_context(tmp_path / "c.safetensors", rollout["cache"], rollout["rope_deltas"],
                              num_return_sequences=NJ, sequences=rollout["sequences"], eos_token_id=rollout["eos"],
                              prefix_mask=m)
    assert not list(tmp_path.iterdir()), "nothing may be written on error"


def test_rollout_argument_errors(rollout, checkpoint):
    model = engine_model(checkpoint, REFERENCE)
    base = dict(sequences=rollout["sequences"], eos_token_id=rollout["eos"], prefix_mask=rollout["prefix_mask"],
                ego_history_xyz=rollout["ego_history_xyz"], ego_history_rot=rollout["ego_history_rot"])
    with pytest.raises(ae.Error, match="not a multiple of num_return_sequences = 5"):
        ae.sample_trajectories(model, rollout["cache"], rollout["rope_deltas"], num_traj_samples=5, **base)
    with pytest.raises(ae.Error, match="classifier-free guidance is on: give the unguided cache"):
        ae.sample_trajectories(model, rollout["cache"], rollout["rope_deltas"], num_traj_samples=NJ,
                               use_classifier_free_guidance=True, **base)
    with pytest.raises(ae.Error, match="inside the prompt"):
        ae.sample_trajectories(model, rollout["cache"], rollout["rope_deltas"], num_traj_samples=NJ,
                               **{**base, "sequences": None, "offsets": torch.full((12,), 5)})
    for w in (-1.0, float("nan")):
        with pytest.raises(ae.Error, match=r"guidance weight must be finite and in \[0, 1000\]"):
            run_engine(model, rollout, True, guidance_weight=w)
    for t in (-0.5, float("nan")):
        with pytest.raises(ae.Error, match=r"temperature( must be finite, found nan| = -0\.5 is outside \[0, )"):
            run_engine(model, rollout, False, temperature=t)


def test_temperature_and_seeds(rollout, checkpoint):
    """temperature scales the initial noise (the release's randn * temperature); seeds give per-sample streams."""
    model = engine_model(checkpoint, REFERENCE)
    ck = load_checkpoint(checkpoint)
    xyz, rot, action = run_engine(model, rollout, False, temperature=0.4)
    r_xyz, _, r_action, _ = release_expert_stage(ck, rollout, NJ, generators(12), temperature=0.4)
    assert max_abs(action, r_action) < 1e-3 and max_abs(xyz, r_xyz) < 1e-2
    a = run_engine(model, rollout, False, seeds=list(range(100, 112)), generator=None)
    b = run_engine(model, rollout, False, seeds=list(range(100, 112)), generator=None)
    assert torch.equal(a[0], b[0])
