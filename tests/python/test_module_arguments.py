"""Arguments the Python module refuses with a message naming the argument and what was expected: paths with an
embedded NUL byte (never truncated to another file)."""
from __future__ import annotations

import pytest
import torch

import alpamayo_expert as ae
from alpamayo_expert import read_context, write_checkpoint, write_context, write_noise
from alpamayo_expert.noise import read_noise
from synth import TINY, CtxSpec, make_checkpoint, make_context, make_noise

NUL = "\0/elsewhere"
NUL_SHOWN = r"\\x00/elsewhere|\\0/elsewhere"  # the C++ side escapes it as \x00, Python's repr as \x00


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("arguments")
    ck = make_checkpoint(d / "ck", TINY, "r1", "f32")
    ctx = make_context(d / "ctx.safetensors", TINY, CtxSpec(motion="v0"))
    noise = d / "noise.safetensors"
    write_noise(noise, make_noise(3, TINY))
    return dict(dir=d, ck=ck, ctx=ctx, noise=noise, vlm=ck / "config.json")


# ---- paths with an embedded NUL byte
def test_model_refuses_nul_in_paths(files):
    with pytest.raises(ValueError, match=r"Model: checkpoint: embedded null byte in the path '.*ck\\x00/elsewhere'"):
        ae.Model(str(files["ck"]) + NUL, backend="reference")
    with pytest.raises(ValueError, match=r"Model: vlm_config: embedded null byte in the path '.*config.json\\x00/"):
        ae.Model(str(files["ck"]), backend="reference", vlm_config=str(files["vlm"]) + NUL)


def test_context_open_refuses_nul_in_path(files):
    """Python's open() refuses such a path: Context.open used to open the file before the NUL."""
    with pytest.raises(ValueError, match=r"Context.open: path: embedded null byte in the path '.*ctx.safetensors\\x00"):
        ae.Context.open(str(files["ctx"]) + NUL)
    ae.Context.open(str(files["ctx"]))  # the same path without the NUL opens


def test_python_readers_refuse_nul_in_paths(files):
    with pytest.raises(ValueError, match="read_context: path: embedded null byte"):
        read_context(str(files["ctx"]) + NUL)
    with pytest.raises(ValueError, match="read_noise: path: embedded null byte"):
        read_noise(str(files["noise"]) + NUL)


def test_python_writers_refuse_nul_in_paths(files, tmp_path):
    f = read_context(files["ctx"])
    kv = list(zip(f.keys, f.values))
    with pytest.raises(ValueError, match="write_context: path: embedded null byte"):
        write_context(str(tmp_path / "c.safetensors") + NUL, kv, f.valid_len, f.rope_delta, v0=f.v0)
    with pytest.raises(ValueError, match="write_rollout_context: path: embedded null byte"):
        ae.write_rollout_context(str(tmp_path / "r.safetensors") + NUL, kv, f.rope_delta, num_return_sequences=1,
                                 offsets=f.valid_len, share_prompt=False, v0=f.v0)
    with pytest.raises(ValueError, match="write_noise: path: embedded null byte"):
        write_noise(str(tmp_path / "n.safetensors") + NUL, make_noise(3, TINY))
    with pytest.raises(ValueError, match="write_checkpoint: directory: embedded null byte"):
        write_checkpoint(str(tmp_path / "ck2") + NUL, {"a": torch.zeros(2)}, {})
    from alpamayo_expert._atomic import save_safetensors_atomic, write_text_atomic
    with pytest.raises(ValueError, match="path: embedded null byte"):
        save_safetensors_atomic({"a": torch.zeros(2)}, str(tmp_path / "s.safetensors") + NUL)
    with pytest.raises(ValueError, match="path: embedded null byte"):
        write_text_atomic(str(tmp_path / "t.txt") + NUL, "x")
    assert list(tmp_path.iterdir()) == [], "nothing is created, not even the part before the NUL"
