"""config.json as each release ships it (tiny sizes, written here): `inspect` names the release and the
source of every value, a full sample matches the oracle reading the same file, and missing or contradictory
keys are errors naming the file and the key. Also: `make-checkpoint --layout` writes each release's shape."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from alpamayo_expert import read_context, write_noise
from cli import REFERENCE, run, sample
from compare import max_abs
from oracle import ExpertContext, Oracle, decode, load_checkpoint
from synth import LAYOUTS, RELEASED, TINY, CtxSpec, make_checkpoint, make_context, make_noise
from verify import verify_sample

NAMES = {"r1": "Alpamayo-R1", "1.5": "Alpamayo 1.5", "a2": "Alpamayo 2 Super"}
MODEL_TYPES = {"r1": "alpamayo_r1", "1.5": "alpamayo1_5", "a2": "alpamayo2_super"}
VALUE = re.compile(r"^value\s+(\S+)\s+= (.*?)\s+<- (.*)$")


def edit_config(ck: Path, fn) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    fn(cfg)
    (ck / "config.json").write_text(json.dumps(cfg))


def section(cfg: dict, layout: str) -> tuple[dict, str]:
    """Where the release keeps its expert's sections, and that place's key prefix."""
    return (cfg["expert_config"], "expert_config.") if layout == "a2" else (cfg, "")


def inspect(cli, ck: Path, *extra) -> tuple[str, dict[str, tuple[str, str]]]:
    r = run(cli, "inspect", ck, *extra, timeout=60)
    assert r.returncode == 0, r.stderr
    values = {}
    for line in r.stdout.splitlines():
        m = VALUE.match(line)
        if m:
            values[m.group(1)] = (m.group(2).strip(), m.group(3))
    return r.stdout, values


def expect_cli_error(cli, ck: Path, *must_name, extra=()):
    r = run(cli, "inspect", ck, *extra, timeout=60)
    assert r.returncode == 1, f"expected exit 1, got {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    for n in must_name:
        assert str(n) in r.stderr, f"stderr should name {n!r}; got:\n{r.stderr}"
    return r.stderr


# A release's values moved away from the synthetic ones and from the defaults, at the release's own keys:
# a reader looking anywhere else finds other values.
STEPS, DT, ACCEL_STD, CURV_MEAN, WEIGHT = 3, 0.2, 0.5, 0.001, 2.5


def release_case(tmp: Path, layout: str, dtype: str = "bf16") -> tuple[Path, list]:
    """A tiny checkpoint of the release with edited values; returns it and the extra CLI args (--vlm-config)."""
    dm = replace(TINY, steps=STEPS)
    tc = {"rms_norm_eps": 1e-3, "rope_theta": 3e5} if layout == "a2" else None
    ck = make_checkpoint(tmp / f"ck-{layout}", dm, layout, dtype, text_config=tc)

    def edit(cfg):
        s, _ = section(cfg, layout)
        s["action_space_cfg"].update(dt=DT, accel_std=ACCEL_STD, curvature_mean=CURV_MEAN)
        del s["action_space_cfg"]["v_ridge"]  # the release default (1e-4) applies
        s["diffusion_cfg"]["inference_guidance_weight"] = WEIGHT
    edit_config(ck, edit)
    extra = []
    if layout != "a2":  # R1 / 1.5: the VLM's text config only through --vlm-config
        (tmp / "vlm.json").write_text(json.dumps({"model_type": "qwen3_vl", "text_config": {
            "num_hidden_layers": dm.L, "num_key_value_heads": dm.Hkv, "head_dim": dm.d, "rms_norm_eps": 1e-3,
            "rope_theta": 3e5}}))
        extra = ["--vlm-config", tmp / "vlm.json"]
    return ck, extra


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inspect_names_release_and_every_source(cli, tmp_path, layout):
    ck, extra = release_case(tmp_path, layout)
    out, v = inspect(cli, ck, *extra)
    assert f"release      {NAMES[layout]} (model_type '{MODEL_TYPES[layout]}'" in out, out
    p = "config.json " + ("expert_config." if layout == "a2" else "")
    dflt = f"{NAMES[layout]} default"
    expect = {
        "diffusion_cfg.num_inference_steps": (str(STEPS), p + "diffusion_cfg.num_inference_steps"),
        "diffusion_cfg.inference_guidance_weight": ("2.5", p + "diffusion_cfg.inference_guidance_weight"),
        "action_space_cfg.dt": ("0.2", p + "action_space_cfg.dt"),
        "action_space_cfg.v_ridge": ("0.0001", dflt),
        "action_space_cfg.curvature_bounds": ("[-0.33, 0.33]", p + "action_space_cfg.curvature_bounds"),
        "action_in_proj_cfg.hidden_size": (str(TINY.ain_hidden), p + "action_in_proj_cfg.hidden_size"),
        "expert_non_causal_attention": ("true", p + "expert_non_causal_attention"),
        "rms_norm_eps": ("0.001", "config.json expert_config.llm_config.rms_norm_eps" if layout == "a2"
                         else "vlm.json text_config.rms_norm_eps"),
        "rope_theta": ("300000", "config.json expert_config.llm_config.rope_theta" if layout == "a2"
                       else "vlm.json text_config.rope_theta"),
    }
    if layout == "r1":  # its checkpoint's buffers win over the config; it has no guidance switch
        f32 = float(torch.tensor(RELEASED["accel_std"], dtype=torch.float32))  # the buffer is F32
        expect["action_space_cfg.accel_std"] = (f"{f32:.9g}",
                                                "tensor action_space.accel_std (overrides the config key)")
        assert v["diffusion_cfg.use_classifier_free_guidance"][1].startswith("fixed by Alpamayo-R1")
    else:
        expect["action_space_cfg.accel_std"] = ("0.5", p + "action_space_cfg.accel_std")
        expect["diffusion_cfg.use_classifier_free_guidance"] = ("false", p + "diffusion_cfg.use_classifier_free_guidance")
    for name, want in expect.items():
        assert v.get(name) == want, f"{name}: inspect says {v.get(name)}, expected {want}\n{out}"
    assert v["hidden_size"][0] == str(TINY.D)
    keys = ("expert_config.llm_config.hidden_size", "expert_config.expert_update_cfg.hidden_size") if layout == "a2" \
        else ("expert_cfg.hidden_size",)
    for k in keys:
        assert k in v["hidden_size"][1], v["hidden_size"]
    layers_src = v["layers"][1]
    assert ("vlm_config.text_config.num_hidden_layers" if layout == "a2" else "vlm.json text_config.num_hidden_layers") \
        in layers_src, layers_src


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sample_matches_oracle_reading_the_release_config(cli, tmp_path, layout, backend):
    ck_dir, extra = release_case(tmp_path, layout)
    ctx_path = make_context(tmp_path / "ctx.safetensors", TINY, CtxSpec(kv_dtype="bf16", motion="history"))
    noise = make_noise(3, TINY)
    write_noise(tmp_path / "noise.safetensors", noise)
    res = sample(cli, ck_dir, ctx_path, tmp_path, backend=backend, noise=tmp_path / "noise.safetensors", extra=extra)
    vlm_tc = json.loads((tmp_path / "vlm.json").read_text())["text_config"] if extra else None
    ck = load_checkpoint(ck_dir, text_config=vlm_tc, weights=backend.weights)
    assert ck.steps == STEPS and ck.aspace["dt"] == DT and (ck.eps, ck.theta) == (1e-3, 3e5)
    assert ck.aspace["accel_std"] == pytest.approx(RELEASED["accel_std"] if layout == "r1" else ACCEL_STD, rel=1e-7)
    ctx = read_context(ctx_path)
    oracle = Oracle(ck, ExpertContext.from_file_context(ctx))
    verify_sample(ck, oracle, res, noise, STEPS, backend, ego_xyz=ctx.ego_history_xyz, ego_rot=ctx.ego_history_rot,
                  v0_given=ctx.v0).assert_ok()
    assert res["x_steps"].shape[0] == STEPS + 1, "the step count must come from the release's diffusion_cfg"
    # Power: decoding the engine's action with the values a wrong lookup would find (R1's synthetic values and
    # defaults) lands metres away from the engine's trajectory.
    other = load_checkpoint(ck_dir, text_config=vlm_tc)
    other.aspace.update(dt=0.1, accel_std=RELEASED["accel_std"], curvature_mean=RELEASED["curvature_mean"])
    xyz_other, _, _ = decode(other, res["action"], res["v0"])
    assert max_abs(xyz_other.float(), res["xyz"]) > 1.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_missing_and_contradictory_keys(cli, tmp_path, layout):
    ck, extra = release_case(tmp_path, layout, dtype="f32")
    orig = (ck / "config.json").read_text()
    p = "expert_config." if layout == "a2" else ""
    path = str(ck / "config.json")

    def case(fn, *must_name):
        (ck / "config.json").write_text(orig)
        edit_config(ck, fn)
        return expect_cli_error(cli, ck, path, *must_name, extra=extra)

    # Missing: a section the release cannot build its expert without.
    case(lambda c: section(c, layout)[0].pop("diffusion_cfg"), f"missing '{p}diffusion_cfg'", NAMES[layout])
    # Contradictory: a size key against the tensors, and the other release's nesting.
    if layout == "a2":
        case(lambda c: c["expert_config"]["expert_update_cfg"].update(hidden_size=2 * TINY.D),
             "expert_config.expert_update_cfg.hidden_size", str(2 * TINY.D), "contradicts",
             "expert_config.llm_config.hidden_size")
        case(lambda c: c["vlm_config"]["text_config"].update(num_key_value_heads=2 * TINY.Hkv),
             "vlm_config.text_config.num_key_value_heads", f"Hkv = {TINY.Hkv}")
        case(lambda c: c.update(action_space_cfg=c["expert_config"].pop("action_space_cfg")),
             "'action_space_cfg'", "expert_config.action_space_cfg")
    else:
        case(lambda c: c["expert_cfg"].update(hidden_size=2 * TINY.D), "'expert_cfg.hidden_size'", str(2 * TINY.D),
             f"D = {TINY.D}")
        case(lambda c: c.update(expert_config={"diffusion_cfg": c.pop("diffusion_cfg")}), "'expert_config'",
             "Is model_type right?")
        case(lambda c: c.update(text_config={"rms_norm_eps": 1e-5}), "'text_config'", "--vlm-config")
    case(lambda c: section(c, layout)[0].update(expert_non_causal_attention=False),
         f"'{p}expert_non_causal_attention' = false")
    case(lambda c: c.update(model_type="somebody_else", architectures=[]), "'somebody_else'", "alpamayo_r1",
         "alpamayo1_5", "alpamayo2_super", "--release")
    # The user's word settles an unknown model_type.
    (ck / "config.json").write_text(orig)
    edit_config(ck, lambda c: c.update(model_type="somebody_else", architectures=[]))
    out, v = inspect(cli, ck, "--release", layout, *extra)
    assert f"release      {NAMES[layout]} (--release {layout}" in out
    assert v["diffusion_cfg.num_inference_steps"][0] == str(STEPS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_make_checkpoint_writes_the_release_shape(cli, tmp_path, layout):
    """The CLI's synthetic checkpoints (and so the demo's, --layout a2) have the release's config.json shape
    and tensor layout, and sample like the oracle reading that file."""
    ck = tmp_path / "ck"
    sizes = ["--layers", 2, "--hidden", 48, "--heads", 4, "--kv-heads", 2, "--head-dim", 16, "--mlp", 96,
             "--ain-hidden", 32, "--waypoints", 8, "--steps", 2, "--dtype", "f32", "--shards", 2]
    r = run(cli, "make-checkpoint", "--out", ck, "--layout", layout, *sizes)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["model_type"] == MODEL_TYPES[layout]
    keys = set()
    for f in sorted(ck.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            keys |= set(sf.keys())
    buffers = {k for k in keys if ".freqs" in k or "action_space." in k}
    if layout == "a2":
        assert cfg["architectures"] == ["Alpamayo2Super"]
        ex = cfg["expert_config"]
        assert {"llm_config", "action_space_cfg", "action_in_proj_cfg", "diffusion_cfg", "expert_non_causal_attention"} <= set(ex)
        assert ex["llm_config"]["hidden_size"] == 48 and ex["llm_config"]["num_attention_heads"] * ex["llm_config"]["head_dim"] == 64
        assert cfg["vlm_config"]["text_config"]["num_hidden_layers"] == 2
        assert "action_space_cfg" not in cfg and "expert_cfg" not in cfg
        assert any(k.startswith("expert.expert.layers.") for k in keys) and not buffers
    else:
        assert "expert_config" not in cfg and "vlm_config" not in cfg and "text_config" not in cfg
        assert {"expert_cfg", "action_space_cfg", "action_in_proj_cfg", "diffusion_cfg"} <= set(cfg)
        assert any(k.startswith("expert.layers.") for k in keys)
        assert bool(buffers) == (layout == "r1")
    out, v = inspect(cli, ck)
    assert f"release      {NAMES[layout]}" in out
    ctx_path = tmp_path / "ctx.safetensors"
    r = run(cli, "make-context", "--checkpoint", ck, "--out", ctx_path, "--batch", 2, "--rows", 24, "--dtype", "f32")
    assert r.returncode == 0, r.stderr
    res = sample(cli, ck, ctx_path, tmp_path, seed=5, layers=True)
    oc = load_checkpoint(ck)
    assert oc.steps == 2 and oc.aspace["T"] == 8
    ctx = read_context(ctx_path)
    verify_sample(oc, Oracle(oc, ExpertContext.from_file_context(ctx)), res, res["x_steps"][0], 2, REFERENCE,
                  ego_xyz=ctx.ego_history_xyz, ego_rot=ctx.ego_history_rot, v0_given=ctx.v0).assert_ok()


def test_inspect_kernels_names_the_kernel_of_every_op(cli, tmp_path, monkeypatch):
    """`inspect --kernels` times the kernels as loading a model does and names the choice for each op: the
    attention on a bf16 and on an int8 cache and both weight formats' matmuls; a forced kernel says so, and an unknown one is an error that
    lists the candidates."""
    monkeypatch.delenv("ALPAMAYO_CPU_KERNELS", raising=False)  # timed, not the session's pin (conftest.py)
    ck = make_checkpoint(tmp_path / "ck", TINY)
    out, _ = inspect(cli, ck, "--kernels")
    if "cpu isa" not in out:
        assert "cpu kernel" not in out
        pytest.skip("this build has no cpu backend")
    line = re.compile(r"^cpu kernel\s+(\S+)\s+(\S+)\s+.*; (.*)$", re.M)
    ops = {m.group(1): (m.group(2), m.group(3)) for m in line.finditer(out)}
    assert set(ops) == {"attention", "attention_kv_int8", "matmul_bf16", "matmul_int8"}, out
    for op, (kernel, why) in ops.items():
        # Untimed where one candidate runs: "only one" (matmuls), "the only vectorised kernel runnable here"
        # (attention beside its portable kernel), e.g. on an AVX2-only CPU.
        assert why.startswith("fastest of") or why in ("only one", "the only vectorised kernel runnable here"), \
            f"{op}: {kernel} ({why})"
        # Each candidate with the rate it was timed at, the chosen one among them.
        if why.startswith("fastest of"):
            rates = dict(re.findall(r"(\w+) ([0-9]+\.[0-9]) ?,?", why.split(" (1 thread")[0]))
            assert kernel in rates and all(float(r) > 0 for r in rates.values()), f"{op}: {why}"
    assert re.search(r"^cpu peak\s+\S+", out, re.M), out
    # The value that pins every choice; with it, every op is forced to the same kernel.
    pin = re.search(r"^cpu pin\s+ALPAMAYO_CPU_KERNELS=(\S+)$", out, re.M).group(1)
    assert pin == ",".join(f"{op}={ops[op][0]}" for op in ("attention", "attention_kv_int8", "matmul_bf16",
                                                             "matmul_int8")), out
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", pin)
    out, _ = inspect(cli, ck, "--kernels")
    assert {m.group(1): m.group(2) for m in line.finditer(out)} == {op: k for op, (k, _) in ops.items()}, out
    assert all(m.group(3).startswith("forced") for m in line.finditer(out)), out
    # "attention" forces both caches' kernel, "attention_kv_int8" the int8 cache's alone.
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", "attention=avx2_fma")
    out, _ = inspect(cli, ck, "--kernels")
    forced = {m.group(1): m.group(2) for m in line.finditer(out)}
    assert forced["attention"] == forced["attention_kv_int8"] == "avx2_fma", out
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", "attention_kv_int8=avx2_fma")
    out, _ = inspect(cli, ck, "--kernels")
    forced = {m.group(1): (m.group(2), m.group(3)) for m in line.finditer(out)}
    assert forced["attention_kv_int8"][0] == "avx2_fma" and not forced["attention"][1].startswith("forced"), out
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", "matmul_int8=portable_fma")
    out, _ = inspect(cli, ck, "--kernels")
    ops = {m.group(1): (m.group(2), m.group(3)) for m in line.finditer(out)}
    assert ops["matmul_int8"] == ("portable_fma", "forced by ALPAMAYO_CPU_KERNELS"), out
    assert re.search(r"^cpu kernel\s+matmul_int8\s+portable_fma\s+not timed", out, re.M), out
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", "matmul_int8=fastest_ever")
    err = expect_cli_error(cli, ck, "matmul_int8=fastest_ever", "Candidates", "avx512_vnni", "onednn",
                           extra=("--kernels",))
    assert "unknown kernel" in err
