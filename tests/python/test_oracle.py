"""The engine's `sample` against the PyTorch/transformers oracle, layer by layer and step by step."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import pytest
import torch

from alpamayo_expert import read_context, write_noise
from cli import REFERENCE, sample
from compare import Checks, max_abs
from oracle import ExpertContext, Oracle, load_checkpoint
import section4
from synth import FULL_LAYER, TINY, CtxSpec, Dims, make_checkpoint, make_context, make_noise
from verify import Bounds, pcc_implied, verify_sample


@dataclass
class Case:
    layout: str
    dtype: str
    shards: int
    spec: CtxSpec
    dims: Dims = TINY
    text_config: dict | None = None     # the expert's text config in config.json (Super: expert_config.llm_config)
    vlm_config: dict | None = None      # passed with --vlm-config
    extra: tuple = ()
    v0: float | None = None             # --v0 on the command line


def _tc(dm: Dims, eps: float, theta: float, form: str) -> dict:
    sec = [dm.d // 2 - 2 * (dm.d // 2 * 20 // 64)] + [dm.d // 2 * 20 // 64] * 2
    tc = {"num_hidden_layers": dm.L, "num_key_value_heads": dm.Hkv, "rms_norm_eps": eps, "head_dim": dm.d}
    if form == "rope_parameters":
        tc["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, "mrope_section": sec}
    else:  # Qwen3-VL's released config.json: top-level rope_theta, rope_scaling with the mrope section
        tc["rope_theta"] = theta
        tc["rope_scaling"] = {"rope_type": "default", "mrope_section": sec, "mrope_interleaved": True}
    return tc


L3 = replace(TINY, L=3, D=96, I=288)
CASES = {
    "r1-f32-1file-f32ctx-history": Case("r1", "f32", 1, CtxSpec(kv_dtype="f32", motion="history")),
    "r1-bf16-3shards-bf16ctx-v0": Case("r1", "bf16", 3, CtxSpec(kv_dtype="bf16", motion="v0")),
    "a2-bf16-1file-f16ctx-history": Case("a2", "bf16", 1, CtxSpec(kv_dtype="f16", motion="history")),
    "a2-f32-2shards-bf16ctx-cli-v0": Case("a2", "f32", 2, CtxSpec(kv_dtype="bf16", motion="none"), v0=7.5),
    "1.5-bf16-2shards-f16ctx-history": Case("1.5", "bf16", 2, CtxSpec(kv_dtype="f16", motion="history")),
    "a2-bf16-L3-llm-config-eps1e-2-theta2e4": Case(
        "a2", "bf16", 1, CtxSpec(kv_dtype="bf16", motion="history", rope_delta=(-30, 4, 17)), dims=L3,
        text_config=_tc(L3, 1e-2, 2e4, "rope_parameters")),
    "r1-bf16-vlm-config-eps1e-3-theta1e6": Case(
        "r1", "bf16", 2, CtxSpec(kv_dtype="f32", motion="v0"),
        vlm_config={"model_type": "qwen3_vl", "text_config": _tc(TINY, 1e-3, 1e6, "rope_scaling")}),
}


def _run_case(cli, tmp_path, case: Case, backend, seed_noise: int = 4):
    dm = case.dims
    ck_dir = make_checkpoint(tmp_path / "ck", dm, case.layout, case.dtype, case.shards, text_config=case.text_config)
    ctx_path = make_context(tmp_path / "ctx.safetensors", dm, case.spec)
    noise = make_noise(case.spec.B, dm, seed_noise)
    write_noise(tmp_path / "noise.safetensors", noise)
    extra = list(case.extra)
    vlm_tc = None
    if case.vlm_config is not None:
        (tmp_path / "vlm_config.json").write_text(json.dumps(case.vlm_config))
        extra += ["--vlm-config", tmp_path / "vlm_config.json"]
        vlm_tc = case.vlm_config["text_config"]
    if case.v0 is not None:
        extra += ["--v0", case.v0]
    res = sample(cli, ck_dir, ctx_path, tmp_path, backend=backend, noise=tmp_path / "noise.safetensors", extra=extra)
    ck = load_checkpoint(ck_dir, text_config=vlm_tc, weights=backend.weights)
    ctx = read_context(ctx_path)
    oracle = Oracle(ck, ExpertContext.from_file_context(ctx))
    v0_given = case.v0 if case.v0 is not None else ctx.v0
    checks = verify_sample(ck, oracle, res, noise, ck.steps, backend, ego_xyz=ctx.ego_history_xyz,
                           ego_rot=ctx.ego_history_rot, v0_given=v0_given)
    tc = case.text_config or (case.vlm_config or {}).get("text_config")
    if tc is not None and backend.name == "reference":  # the bf16 bounds are too wide to tell
        _check_follows_text_config(checks, ck_dir, ctx, noise, res, tc, backend.weights)
    return checks


def _check_follows_text_config(checks, ck_dir, ctx, noise, res, tc, weights=None):
    """Give the check power: an oracle with eps (or theta) back at the Qwen3-VL default must be more than
    twice the bound away from the engine, so passing means the engine really took each value from the config."""
    tight = checks.items[[c.name for c in checks.items].index("layers-out:hidden")]
    for key, default in (("rms_norm_eps", 1e-6), ("rope_theta", 5e6)):
        other = dict(tc)
        if key == "rms_norm_eps":
            other["rms_norm_eps"] = default
        else:
            for k in ("rope_parameters", "rope_scaling"):
                if isinstance(other.get(k), dict):
                    other[k] = {**other[k], "rope_theta": default}
            if "rope_theta" in other:
                other["rope_theta"] = default
        ck_o = load_checkpoint(ck_dir, text_config=other, weights=weights)
        _, cap = Oracle(ck_o, ExpertContext.from_file_context(ctx)).step(noise, torch.zeros(noise.shape[0]), capture=True)
        d = max_abs(res["layers"]["hidden"], cap["hidden"])
        checks.note(f"with {key} at the default {default:g} the oracle is {d:.3e} away (bound {tight.bound:.3e})")
        if d <= 2 * tight.bound:
            checks.add(f"engine distinguishable from {key}={default:g}", torch.tensor([d]), torch.tensor([0.0]),
                       -1.0)  # always fails: the case cannot tell whether the engine read the config


@pytest.mark.every_kernel
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_sample_matches_oracle(cli, tmp_path, case, backend):
    _run_case(cli, tmp_path, CASES[case], backend).assert_ok()


@pytest.mark.every_kernel
def test_full_size_layer(cli, tmp_path, backend):
    """One layer at the seed model's sizes with a 4700-row cache: per-layer and velocity vs the oracle."""
    dm = FULL_LAYER
    spec = CtxSpec(valid_len=(4700,), rope_delta=(-1500,), P=4736, kv_dtype="bf16", motion="v0", v0=(9.0,))
    ck_dir = make_checkpoint(tmp_path / "ck", dm, "a2", "bf16", shards=2)
    ctx_path = make_context(tmp_path / "ctx.safetensors", dm, spec)
    noise = make_noise(1, dm)
    write_noise(tmp_path / "noise.safetensors", noise)
    res = sample(cli, ck_dir, ctx_path, tmp_path, backend=backend, noise=tmp_path / "noise.safetensors", steps=1)
    ck = load_checkpoint(ck_dir, weights=backend.weights)
    ctx = read_context(ctx_path)
    oracle = Oracle(ck, ExpertContext.from_file_context(ctx))
    verify_sample(ck, oracle, res, noise, 1, backend, v0_given=ctx.v0, free_running=False).assert_ok()


def test_padding_rows_are_masked(cli, tmp_path, backend):
    """Rows >= S_b hold large garbage: changing it must change nothing, and only because it is masked."""
    dm = TINY
    spec_a = CtxSpec(motion="v0")
    spec_b = replace(spec_a, garbage_seed=77)
    ck_dir = make_checkpoint(tmp_path / "ck", dm, "r1", "bf16")
    pa = make_context(tmp_path / "a.safetensors", dm, spec_a)
    pb = make_context(tmp_path / "b.safetensors", dm, spec_b)
    ca, cb = read_context(pa), read_context(pb)
    assert max_abs(ca.keys[0][0, :, 40:], cb.keys[0][0, :, 40:]) > 10, "the garbage must differ"
    noise = make_noise(spec_a.B, dm)
    write_noise(tmp_path / "noise.safetensors", noise)
    ck = load_checkpoint(ck_dir)
    # The oracle: identical with the mask, very different without it (so the mask is what hides the garbage).
    ra = Oracle(ck, ExpertContext.from_file_context(ca)).sample(noise)["action"]
    rb = Oracle(ck, ExpertContext.from_file_context(cb)).sample(noise)["action"]
    assert torch.equal(ra, rb)
    ru = Oracle(ck, ExpertContext.from_file_context(ca), mask_padding=False).sample(noise)["action"]
    assert max_abs(ru, ra) > 1e-2, "unmasked garbage should change the result; the test would prove nothing"
    # The engine: bitwise identical outputs for both garbages.
    ea = sample(cli, ck_dir, pa, tmp_path / "a", backend=backend, noise=tmp_path / "noise.safetensors")
    eb = sample(cli, ck_dir, pb, tmp_path / "b", backend=backend, noise=tmp_path / "noise.safetensors")
    for k in ("action", "xyz", "v_steps"):
        assert torch.equal(ea[k], eb[k]), f"{k} changed with the padding rows' contents (max diff {max_abs(ea[k], eb[k]):.3e})"
    for k in ea["layers"]:
        assert torch.equal(ea["layers"][k], eb["layers"][k]), f"layers-out {k} changed with the padding garbage"


def test_seeded_noise(cli, tmp_path):
    """--seed: x_0 is the engine's own noise (reported in x_steps); the rest must match the oracle from it,
    the same seed must give the same noise and another seed another."""
    dm = TINY
    ck_dir = make_checkpoint(tmp_path / "ck", dm, "r1", "bf16")
    ctx_path = make_context(tmp_path / "ctx.safetensors", dm, CtxSpec(motion="v0"))
    r1 = sample(cli, ck_dir, ctx_path, tmp_path / "1", seed=123, layers=False)
    r2 = sample(cli, ck_dir, ctx_path, tmp_path / "2", seed=123, layers=False)
    r3 = sample(cli, ck_dir, ctx_path, tmp_path / "3", seed=124, layers=False)
    assert torch.equal(r1["x_steps"][0], r2["x_steps"][0]) and torch.equal(r1["action"], r2["action"])
    assert not torch.equal(r1["x_steps"][0], r3["x_steps"][0])
    noise = r1["x_steps"][0]
    assert noise.shape == (3, dm.T, 2)
    assert abs(float(noise.mean())) < 0.3 and 0.7 < float(noise.std()) < 1.3, "noise should look like N(0, 1)"
    ck = load_checkpoint(ck_dir)
    ctx = read_context(ctx_path)
    verify_sample(ck, Oracle(ck, ExpertContext.from_file_context(ctx)), r1, noise, ck.steps, REFERENCE,
                  v0_given=ctx.v0).assert_ok()


def test_steps_flag_overrides_config(cli, tmp_path):
    dm = TINY
    ck_dir = make_checkpoint(tmp_path / "ck", dm, "a2", "bf16")
    ctx_path = make_context(tmp_path / "ctx.safetensors", dm, CtxSpec(motion="v0"))
    noise = make_noise(3, dm)
    write_noise(tmp_path / "noise.safetensors", noise)
    res = sample(cli, ck_dir, ctx_path, tmp_path, noise=tmp_path / "noise.safetensors", steps=7, layers=False)
    assert res["x_steps"].shape == (8, 3, dm.T, 2) and res["v_steps"].shape == (7, 3, dm.T, 2)
    ck = load_checkpoint(ck_dir)
    ctx = read_context(ctx_path)
    verify_sample(ck, Oracle(ck, ExpertContext.from_file_context(ctx)), res, noise, 7, REFERENCE,
                  v0_given=ctx.v0).assert_ok()


def test_oracle_matches_plain_section4(tmp_path):
    """The oracle's transformers path (cache, mask, M-RoPE positions) vs a plain reading of section 4."""
    ck_dir = make_checkpoint(tmp_path / "ck", L3, "a2", "bf16", text_config=_tc(L3, 1e-5, 2e4, "rope_parameters"))
    ctx_path = make_context(tmp_path / "ctx.safetensors", L3, CtxSpec(kv_dtype="bf16"))
    ck = load_checkpoint(ck_dir)
    assert (ck.eps, ck.theta) == (1e-5, 2e4)
    ctx = ExpertContext.from_file_context(read_context(ctx_path))
    oracle = Oracle(ck, ctx)
    noise = make_noise(3, L3)
    _, cap = oracle.step(noise, torch.full((3,), 0.3), capture=True)
    plain = section4.expert_layers(ck, ctx, cap["emb"])
    # Two fp32 readings of the same math (section4's rope angles in float64): the fp32 bound, angle term included.
    bounds = Bounds(ck, oracle, float(noise.abs().max()), REFERENCE)
    checks = Checks()
    for l in range(ck.L):
        r = cap[f"layer.{l}"]
        b = bounds(f"layer.{l}", float(r.abs().max()))
        checks.add(f"layer.{l}", plain[l], r, b, pcc_implied(b, r))
    checks.assert_ok()
