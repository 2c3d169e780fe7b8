"""CLI error paths end to end: non-zero exit, a message naming the file and the tensor/key, no output."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from alpamayo_expert import write_context, write_noise
from cli import run
from conftest import backend_listing
from st_bytes import read_raw, write_raw
from synth import TINY, CtxSpec, context_kv, make_checkpoint, make_context, make_noise

UP = "expert.layers.1.mlp.up_proj.weight"
KP = "expert.layers.0.self_attn.k_proj.weight"


@pytest.fixture()
def files(tmp_path):
    """A valid tiny case: single-file R1 checkpoint, context with v0, noise."""
    ck = make_checkpoint(tmp_path / "ck", TINY, "r1", "f32")
    ctx = make_context(tmp_path / "ctx.safetensors", TINY, CtxSpec(motion="v0"))
    noise = tmp_path / "noise.safetensors"
    write_noise(noise, make_noise(3, TINY))
    return dict(ck=ck, st=ck / "model.safetensors", ctx=ctx, noise=noise, tmp=tmp_path)


def expect_error(cli, f, *must_name, checkpoint=None, context=None, noise=None, extra=()):
    out = f["tmp"] / "out.safetensors"
    lay = f["tmp"] / "layers.safetensors"
    args = ["sample", "--checkpoint", checkpoint or f["ck"], "--context", context or f["ctx"],
            "--noise", noise or f["noise"], "--out", out, "--layers-out", lay, "--all-steps", *extra]
    r = run(cli, *args, timeout=120)
    cmd = " ".join(map(str, [cli, *args]))
    assert r.returncode > 0, f"expected a clean non-zero exit (got {r.returncode}) for: {cmd}\nstderr: {r.stderr}"
    msg = r.stderr
    assert msg.strip(), f"no message on stderr for: {cmd}"
    for name in must_name:
        assert str(name) in msg, f"stderr should name {name!r}; got:\n{msg}\ncommand: {cmd}"
    assert not out.exists() and not lay.exists(), f"an output file was left behind by: {cmd}"
    leftovers = [p.name for p in f["tmp"].iterdir() if p.name.startswith((".out", "out", ".layers", "layers"))]
    assert not leftovers, f"temporary outputs left behind: {leftovers}"


def test_sanity_valid_case_runs(cli, files):
    r = run(cli, "sample", "--checkpoint", files["ck"], "--context", files["ctx"], "--noise", files["noise"],
            "--out", files["tmp"] / "ok.safetensors")
    assert r.returncode == 0, r.stderr


# ---- options
def test_unknown_kv_format(cli, files):
    """--kv: a format the backend does not offer is refused before any work, naming the backend, the format and
    the offered ones; `backends` lists each backend's KV cache formats after '; kv'."""
    listing = run(cli, "backends", timeout=60)
    assert listing.returncode == 0, listing.stderr
    kv = {}
    for line in listing.stdout.splitlines():
        name, _, rest = line.partition(" -- unavailable: ")[0].partition(" ")
        kv[name] = rest.partition("; kv ")[2].partition("; features")[0].split()
        assert kv[name], f"no KV cache formats in: {line!r}"
    assert kv["reference"] == ["f32", "int8"]
    expect_error(cli, files, "unknown KV cache format 'bogus'", "(it offers f32, int8)",
                 extra=["--backend", "reference", "--kv", "bogus"])
    expect_error(cli, files, "backend reference: unknown KV cache format 'bf16'",
                 extra=["--backend", "reference", "--kv", "bf16"])
    for name, formats in kv.items():
        expect_error(cli, files, f"backend {name}: unknown KV cache format 'fp16'", ", ".join(formats),
                     extra=["--backend", name, "--kv", "fp16"])


def test_unknown_kv_format_demo(cli, tmp_path):
    r = run(cli, "demo", "--size", "small", "--rows", 40, "--steps", 1, "--out-dir", tmp_path / "demo",
            "--backend", "reference", "--kv", "bogus", timeout=300)
    assert r.returncode > 0 and "unknown KV cache format 'bogus'" in r.stderr, r.stderr
    assert not (tmp_path / "demo" / "trajectories.safetensors").exists()


# ---- checkpoint
def test_missing_checkpoint_dir(cli, files):
    expect_error(cli, files, "nope", checkpoint=files["tmp"] / "nope")


def test_missing_config_json(cli, files):
    (files["ck"] / "config.json").unlink()
    expect_error(cli, files, "config.json")


def test_truncated_safetensors(cli, files):
    b = files["st"].read_bytes()
    files["st"].write_bytes(b[: len(b) - 1000])
    expect_error(cli, files, "model.safetensors")


def test_header_bad_json(cli, files):
    b = bytearray(files["st"].read_bytes())
    b[8:20] = b"{not json!!!"
    files["st"].write_bytes(bytes(b))
    expect_error(cli, files, "model.safetensors")


def test_header_length_past_end_of_file(cli, files):
    b = bytearray(files["st"].read_bytes())
    b[:8] = struct.pack("<Q", len(b) * 4)
    files["st"].write_bytes(bytes(b))
    expect_error(cli, files, "model.safetensors")


def test_data_offsets_out_of_range(cli, files):
    h, data = read_raw(files["st"])
    h[UP]["data_offsets"] = [len(data) - 16, len(data) + 4096]
    write_raw(files["st"], h, data)
    expect_error(cli, files, "model.safetensors", UP)


def test_missing_tensor(cli, files):
    t = load_file(str(files["st"]))
    del t[UP]
    save_file(t, str(files["st"]))
    expect_error(cli, files, UP)


def test_wrong_shape(cli, files):
    t = load_file(str(files["st"]))
    t[KP] = torch.zeros(TINY.Hkv * TINY.d + 3, TINY.D)
    save_file(t, str(files["st"]))
    expect_error(cli, files, KP)


def test_wrong_dtype_int32_weight(cli, files):
    t = load_file(str(files["st"]))
    t[UP] = t[UP].to(torch.int32)
    save_file(t, str(files["st"]))
    expect_error(cli, files, UP)


def test_missing_shard(cli, files):
    ck = make_checkpoint(files["tmp"] / "sharded", TINY, "a2", "bf16", shards=3)
    (ck / "model-00002-of-00003.safetensors").unlink()
    expect_error(cli, files, "model-00002-of-00003.safetensors", checkpoint=ck)


def test_config_hidden_size_disagrees_with_tensors(cli, files):
    cfg = json.loads((files["ck"] / "config.json").read_text())
    cfg["expert_cfg"]["hidden_size"] = TINY.D * 2
    (files["ck"] / "config.json").write_text(json.dumps(cfg))
    expect_error(cli, files, "hidden_size")


# ---- context
def _ctx_tensors(f):
    return load_file(str(f["ctx"]))


def test_missing_context_file(cli, files):
    expect_error(cli, files, "absent.safetensors", context=files["tmp"] / "absent.safetensors")


def test_context_layer_count_differs_from_expert(cli, files):
    t = _ctx_tensors(files)
    t["key.2"], t["value.2"] = t["key.1"].clone(), t["value.1"].clone()
    save_file(t, str(files["ctx"]))
    expect_error(cli, files, "ctx.safetensors", "layer")


def test_context_missing_value_tensor(cli, files):
    t = _ctx_tensors(files)
    del t["value.1"]
    save_file(t, str(files["ctx"]))
    expect_error(cli, files, "ctx.safetensors", "value.1")


def test_valid_len_beyond_rows(cli, files):
    t = _ctx_tensors(files)
    t["valid_len"] = torch.tensor([37, 51, 23])
    save_file(t, str(files["ctx"]))
    expect_error(cli, files, "ctx.safetensors", "valid_len")


def test_context_batch_mismatch_rope_delta(cli, files):
    t = _ctx_tensors(files)
    t["rope_delta"] = torch.tensor([5, -11, 0, 2])
    save_file(t, str(files["ctx"]))
    expect_error(cli, files, "ctx.safetensors", "rope_delta")


def test_context_kv_head_dim_mismatch(cli, files):
    t = _ctx_tensors(files)
    t["key.1"] = t["key.1"][..., :16].contiguous()
    t["value.1"] = t["value.1"][..., :16].contiguous()
    save_file(t, str(files["ctx"]))
    expect_error(cli, files, "ctx.safetensors", "key.1")


def test_nan_in_context(cli, files):
    t = _ctx_tensors(files)
    t["key.1"][0, 1, 3, 5] = float("nan")   # a valid row (S_0 = 37)
    save_file(t, str(files["ctx"]))
    expect_error(cli, files, "ctx.safetensors", "key.1")


def test_inf_in_context_values(cli, files):
    t = _ctx_tensors(files)
    t["value.0"][2, 0, 10, 0] = float("inf")  # a valid row (S_2 = 23)
    save_file(t, str(files["ctx"]))
    expect_error(cli, files, "ctx.safetensors", "value.0")


# ---- noise
def test_noise_batch_differs_from_context(cli, files):
    save_file({"noise": make_noise(2, TINY)}, str(files["noise"]))
    expect_error(cli, files, "noise.safetensors", "noise")


def test_noise_wrong_shape(cli, files):
    save_file({"noise": torch.randn(3, TINY.T + 1, 2)}, str(files["noise"]))
    expect_error(cli, files, "noise.safetensors", "noise")


def test_nan_in_noise(cli, files):
    n = make_noise(3, TINY)
    n[1, 2, 0] = float("nan")
    save_file({"noise": n}, str(files["noise"]))
    expect_error(cli, files, "noise.safetensors", "noise")


def test_inf_in_noise(cli, files):
    n = make_noise(3, TINY)
    n[0, 0, 1] = float("-inf")
    save_file({"noise": n}, str(files["noise"]))
    expect_error(cli, files, "noise.safetensors", "noise")


def test_wrong_shape_consistent_multiple(cli, files):
    """up_proj with a plausible but different width than gate_proj: the message must name up_proj."""
    t = load_file(str(files["st"]))
    t[UP] = torch.zeros(TINY.I + 32, TINY.D)
    save_file(t, str(files["st"]))
    expect_error(cli, files, UP)


def test_format_help_lists_each_backend_of_this_build(cli):
    """`sample --help` and `demo --help` name every backend this build has with the weight and KV cache formats it
    takes, as `backends` lists them (one registry, not a text that can fall behind it)."""
    listing = backend_listing()
    for command in ("sample", "demo"):
        r = run(cli, command, "--help", timeout=60)
        assert r.returncode == 0, r.stderr
        text = " ".join(r.stdout.split())
        for name, (formats, kv, _features, _why) in listing.items():
            assert f"{name}: {' | '.join(formats)};" in text, (command, name, text)
            assert f"{name}: {' | '.join(kv)};" in text, (command, name, text)
