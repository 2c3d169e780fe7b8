"""Hostile numbers, end to end through the CLI (issue 7, classes 5-7): sizes bounded and memory estimated
before allocating, every number parsed strictly, nothing non-finite written, and messages that name the
value, the stage and the tensor. Each failure must exit 1 (or 105 for a command-line value CLI11 rejects)
and leave no output behind."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import struct
import time
from pathlib import Path

import pytest

from cli import run
from st_bytes import read_raw, write_raw

SIZES = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--mlp", "128",
         "--ain-hidden", "32", "--waypoints", "8"]


@pytest.fixture()
def case(cli, tmp_path):
    r = run(cli, "make-checkpoint", "--out", tmp_path / "ck", *SIZES)
    assert r.returncode == 0, r.stderr
    ctx = tmp_path / "ctx.safetensors"
    r = run(cli, "make-context", "--checkpoint", tmp_path / "ck", "--out", ctx, "--rows", "64", "--history", "4")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    out.mkdir()
    return dict(cli=cli, tmp=tmp_path, ck=tmp_path / "ck", ctx=ctx, out=out)


def sample(c, *extra, ck=None, ctx=None, steps=2):
    return ["sample", "--checkpoint", ck or c["ck"], "--context", ctx or c["ctx"], "--out", c["out"] / "r.safetensors",
            "--backend", "reference", "--quiet", *(["--steps", steps] if steps else []), *extra]


def fails(c, args, *must_name, code=1, timeout=60):
    t0 = time.monotonic()
    r = run(c["cli"], *args, timeout=timeout)
    assert r.returncode == code, f"expected exit {code}, got {r.returncode}: {args}\nstderr: {r.stderr}"
    for part in must_name:
        assert str(part) in r.stderr, f"stderr should name {part!r}; got:\n{r.stderr}"
    assert list(c["out"].iterdir()) == [], "an output was written"
    assert time.monotonic() - t0 < timeout
    return r.stderr


def with_config(c, name, edit):
    d = c["tmp"] / name
    shutil.copytree(c["ck"], d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def aspace(key, value):
    return lambda cfg: cfg["expert_config"]["action_space_cfg"].__setitem__(key, value)


# ---- class 5: sizes bounded before allocating
@pytest.mark.parametrize("key,value,named", [
    ("n_waypoints", 20_000_000, "outside [1, 4096]"),
    ("n_waypoints", 2**32 + 8, "out of range"),
    ("n_waypoints", 0, "outside [1, 4096]"),
])
def test_absurd_waypoints_fail_before_allocating(case, key, value, named):
    ck = with_config(case, "ck_t", aspace(key, value))
    fails(case, sample(case, ck=ck), "n_waypoints", named, timeout=20)


def test_absurd_steps_and_sizes_in_config(case):
    c = case
    ck = with_config(c, "ck_s", lambda cfg: cfg["expert_config"]["diffusion_cfg"].__setitem__("num_inference_steps", 2**32 + 1))
    fails(c, sample(c, ck=ck, steps=None), "num_inference_steps", "out of range")
    ck = with_config(c, "ck_s2", lambda cfg: cfg["expert_config"]["diffusion_cfg"].__setitem__("num_inference_steps", 200000))
    fails(c, sample(c, ck=ck, steps=None), "num_inference_steps", "outside [1, 100000]")
    ck = with_config(c, "ck_h", lambda cfg: cfg["expert_config"]["action_in_proj_cfg"].__setitem__("num_enc_layers", 10**6))
    fails(c, sample(c, ck=ck), "num_enc_layers", "outside [1, 64]")
    ck = with_config(c, "ck_heads", lambda cfg: cfg["expert_config"]["llm_config"].__setitem__("num_attention_heads", 4.7))
    fails(c, sample(c, ck=ck), "num_attention_heads", "4.7")


def test_hidden_size_zero_with_a_huge_mlp_is_refused_at_once(case):
    """The issue's 12 KB checkpoint: hidden size 0 makes every [I, D] matrix empty whatever I is."""
    c = case
    d = c["tmp"] / "ck0"
    shutil.copytree(c["ck"], d)
    header, data = read_raw(d / "model.safetensors")
    meta = header.pop("__metadata__", None)
    tensors, blobs = {}, []
    off = 0
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        shape = [0 if s == 64 else s for s in v["shape"]]  # D = 64 -> 0
        if "mlp" in k:
            shape = [0 if s == 0 else 1_000_000_000 for s in shape]  # I huge (no bytes: D is 0)
        n = 1
        for s in shape:
            n *= s
        blob = data[v["data_offsets"][0]:v["data_offsets"][1]][:n * 2]
        tensors[k] = dict(dtype=v["dtype"], shape=shape, data_offsets=[off, off + len(blob)])
        blobs.append(blob)
        off += len(blob)
    if meta:
        tensors["__metadata__"] = meta
    write_raw(d / "model.safetensors", tensors, b"".join(blobs))
    cfg = json.loads((d / "config.json").read_text())
    for sec in ("llm_config", "expert_update_cfg"):
        cfg["expert_config"][sec].pop("hidden_size", None)
        cfg["expert_config"][sec].pop("intermediate_size", None)
    (d / "config.json").write_text(json.dumps(cfg))
    err = fails(c, sample(c, ck=d), timeout=10)
    assert "outside [1, " in err and ("hidden size D = 0" in err or "MLP width" in err), err


def test_long_ego_history_is_linear_time(case):
    """The v0 fit is a banded solve: 30,000 poses take well under a second, not 7 GB and minutes."""
    c = case
    ctx = c["tmp"] / "long.safetensors"
    r = run(c["cli"], "make-context", "--checkpoint", c["ck"], "--out", ctx, "--rows", "64", "--history", "30000")
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    r = run(c["cli"], *sample(c, ctx=ctx), timeout=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 20


def test_memory_estimate_refuses_before_allocating(case):
    """ALPAMAYO_MEMORY_LIMIT caps what the estimate is compared with (as a tight ulimit or a full machine would)."""
    c = case
    env = dict(os.environ, ALPAMAYO_MEMORY_LIMIT="1K")
    p = subprocess.run([str(c["cli"]), *map(str, sample(c))], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1, p.stderr
    assert "needs about" in p.stderr and "available (ALPAMAYO_MEMORY_LIMIT)" in p.stderr, p.stderr
    assert list(c["out"].iterdir()) == []


# ---- class 6: strict numbers, nothing non-finite written
@pytest.mark.parametrize("opt,value,named", [
    ("--v0", "nan", "not a finite number"),
    ("--v0", "inf", "not a finite number"),
    ("--v0", "1e39", "not in range"),
    ("--seed", "-1", "not a non-negative integer"),
    ("--seed", "18446744073709551616", "out of range"),
    ("--seed", "4.7", "not a non-negative integer"),
    ("--temperature", "nan", "not a finite number"),
    ("--steps", "4294967297", "not in range"),
])
def test_command_line_numbers_are_strict(case, opt, value, named):
    fails(case, sample(case, opt, value), opt, named, code=105)


@pytest.mark.parametrize("value", ["-1", "18446744073709551616", "1.5", ""])
def test_seeds_list_is_strict(case, value):
    fails(case, sample(case, "--seeds", value if value else ","), "--seeds")


def test_largest_seed_is_accepted(case):
    r = run(case["cli"], *sample(case, "--seed", "18446744073709551615"))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("key,value,named", [
    ("dt", 1e300, "outside [0.0001, 100]"),
    ("dt", 1e-300, "outside [0.0001, 100]"),
    ("accel_std", 1e300, "outside [0, 1000]"),
    ("accel_std", -1.0, "must be positive"),
    ("curvature_mean", 1e30, "outside [-1000, 1000]"),
    ("v_ridge", -1.0, "outside [0, 1e+06]"),
    ("v_lambda", -1.0, "outside [0, 1e+06]"),
    ("accel_bounds", [5.0, -5.0], "minimum exceeds the maximum"),
])
def test_extreme_action_space_numbers_are_refused(case, key, value, named):
    ck = with_config(case, "ck_a", aspace(key, value))
    fails(case, sample(case, ck=ck), key, named)


def test_json_number_beyond_double_is_refused(case):
    c = case
    d = with_config(c, "ck_big", aspace("dt", 0.1))
    text = (d / "config.json").read_text().replace('"dt": 0.1', '"dt": 1e400')
    assert "1e400" in text
    (d / "config.json").write_text(text)
    fails(c, sample(c, ck=d), "config.json", "number overflow", "1e400")


def test_ego_history_far_away_is_refused(case):
    c = case
    ctx = c["tmp"] / "far.safetensors"
    header, data = read_raw(c["ctx"])
    h = header["ego_history_xyz"]
    assert h["dtype"] == "F32"
    a, b = h["data_offsets"]
    data = data[:a] + struct.pack("<f", 3e38) + data[a + 4:]
    write_raw(ctx, header, data)
    fails(c, sample(c, ctx=ctx), "ego_history_xyz", "beyond 1e7 m")


# ---- class 7: messages that name the stage and the tensor
def _set_bf16(path: Path, key: str, index: int, bits: int):
    header, data = read_raw(path)
    t = header[key]
    assert t["dtype"] == "BF16", t
    off = t["data_offsets"][0] + 2 * index
    write_raw(path, header, data[:off] + struct.pack("<H", bits) + data[off + 2:])


def test_non_finite_weight_is_named_at_load(case):
    c = case
    d = c["tmp"] / "ck_inf"
    shutil.copytree(c["ck"], d)
    _set_bf16(d / "model.safetensors", "expert.expert.layers.1.mlp.down_proj.weight", 5, 0x7F80)  # +inf
    fails(c, sample(c, ck=d), "expert.expert.layers.1.mlp.down_proj.weight", "non-finite value inf at [0, 5]")


def test_overflow_names_the_layer_and_the_tensor(case):
    """Finite but huge weights overflow inside layer 1: the message names the stage, the layer and the tensor."""
    c = case
    d = c["tmp"] / "ck_huge"
    shutil.copytree(c["ck"], d)
    key = "expert.expert.layers.1.mlp.down_proj.weight"
    hdr, data = read_raw(d / "model.safetensors")
    a, b = hdr[key]["data_offsets"]
    # every value 3.39e38, the largest finite bf16
    write_raw(d / "model.safetensors", hdr, data[:a] + struct.pack("<H", 0x7F7F) * ((b - a) // 2) + data[b:])
    err = fails(c, sample(c, ck=d))
    assert "layer 1 output" in err and "Euler step 0" in err, err
    assert "inside layer 1 the first non-finite output is mlp.down_proj;" in err, err
    assert "mlp.down_proj.weight" in err and "3.39e+38" in err, err


def test_empty_and_directory_paths_are_named(case):
    c = case
    fails(c, ["sample", "--checkpoint", c["ck"], "--context", c["ctx"], "--out", "", "--backend", "reference"],
          "--out", "empty")
    d = c["tmp"] / "ck_dir"
    shutil.copytree(c["ck"], d)
    (d / "config.json").unlink()
    (d / "config.json").mkdir()
    fails(c, sample(c, ck=d), "config.json", "directory")


def test_huge_layer_index_is_named(case):
    c = case
    d = c["tmp"] / "ck_idx"
    shutil.copytree(c["ck"], d)
    header, data = read_raw(d / "model.safetensors")
    k = "expert.expert.layers.1.mlp.down_proj.weight"
    header[k.replace("layers.1", "layers.99999999999999999999")] = header.pop(k)
    write_raw(d / "model.safetensors", header, data)
    err = fails(c, sample(c, ck=d), "layers.99999999999999999999", "out of range")
    assert "stoi" not in err
