"""Arguments the Python module refuses with a message naming the argument and what was expected: paths with an
embedded NUL byte (never truncated to another file), tensors that hold no values ('meta'), integers beyond 64
bits, wrong dtypes and kinds, for every constructor that takes paths, tensors or integer lists."""
from __future__ import annotations

import numpy as np
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


# ---- tensors and integer lists given to the context constructors
@pytest.fixture()
def ctx_args(files):
    f = read_context(files["ctx"])
    return f


def context(f, **over):
    kw = dict(keys=f.keys, values=f.values, valid_len=f.valid_len, rope_delta=f.rope_delta, v0=f.v0)
    kw.update(over)
    return ae.Context(kw.pop("keys"), kw.pop("values"), kw.pop("valid_len"), kw.pop("rope_delta"), **kw)


def test_context_valid_arguments_build(ctx_args):
    c = context(ctx_args)
    assert c.batch == 3
    c = context(ctx_args, valid_len=np.array(ctx_args.valid_len.tolist(), dtype=np.uint64))
    assert c.valid_len == ctx_args.valid_len.tolist()


@pytest.mark.parametrize("arg", ["valid_len", "rope_delta"])
def test_context_integer_lists(ctx_args, arg):
    f = ctx_args
    good = getattr(f, arg).tolist()
    with pytest.raises(ae.Error, match=rf"{arg}: {2**63} at index 0 does not fit a signed 64-bit integer"):
        context(f, **{arg: [2**63, *good[1:]]})
    with pytest.raises(ae.Error, match=rf"{arg}: -{2**63 + 1} at index 1 does not fit a signed 64-bit integer"):
        context(f, **{arg: [good[0], -(2**63) - 1, *good[2:]]})
    with pytest.raises(ae.Error, match=rf"{arg}: {2**63} at index 0 does not fit .*dtype uint64"):
        context(f, **{arg: np.array([2**63, *[abs(x) for x in good[1:]]], dtype=np.uint64)})
    with pytest.raises(ae.Error, match=rf"{arg}: expected integers, got bool True at index 0"):
        context(f, **{arg: [True, *good[1:]]})
    with pytest.raises(ae.Error, match=rf"{arg}: expected integers, got float 1.5 at index 0"):
        context(f, **{arg: [1.5, *good[1:]]})
    with pytest.raises(ae.Error, match=rf"{arg}: expected integers, got float .* at index 0 .*dtype torch.float32"):
        context(f, **{arg: torch.tensor(good, dtype=torch.float32)})
    with pytest.raises(ae.Error, match=rf"{arg}: a tensor of shape \[3\], dtype torch.int64, on device 'meta', "
                                       "which holds no values; expected a vector of integers"):
        context(f, **{arg: torch.empty(3, dtype=torch.int64, device="meta")})
    with pytest.raises(ae.Error, match=rf"{arg}: expected shape \[N\] or \[N, 1\], got rows of 2"):
        context(f, **{arg: [[1, 2]] * 3})
    with pytest.raises(ae.Error, match=rf"{arg}"):  # the engine names the argument and the lengths
        context(f, **{arg: good[:2]})


def test_context_optional_integer_lists(ctx_args):
    f = ctx_args
    for arg in ("prefix_pad", "prompt_index"):
        with pytest.raises(ae.Error, match=rf"{arg}: {2**64} at index 0 does not fit a signed 64-bit integer"):
            context(f, **{arg: [2**64, 0, 0]})
        with pytest.raises(ae.Error, match=rf"{arg}: .*device 'meta', which holds no values"):
            context(f, **{arg: torch.zeros(3, dtype=torch.int64, device="meta")})
        with pytest.raises(ae.Error, match=rf"{arg}"):
            context(f, **{arg: [-1, 0, 0]})


def test_context_cache_tensors(ctx_args):
    f = ctx_args
    k0 = f.keys[0]
    shape = r"\[" + ", ".join(map(str, k0.shape)) + r"\]"
    meta = [torch.empty_like(k0, device="meta"), *f.keys[1:]]
    with pytest.raises(ae.Error, match=rf"context: key.0: a tensor of shape {shape}, dtype torch.float32, on device "
                                       r"'meta'; the engine reads cache tensors in cpu or cuda memory \(a 'meta' "
                                       "tensor holds no values\\)"):
        context(f, keys=meta)
    with pytest.raises(ae.Error, match=r"context: value.1: a tensor .* on device 'meta'"):
        context(f, values=[f.values[0], torch.empty_like(f.values[1], device="meta"), *f.values[2:]])
    with pytest.raises(ae.Error, match=rf"context: key.0: a tensor of shape {shape}, dtype torch.int32, on device "
                                       "'cpu'; caches must be float32, float16 or bfloat16"):
        context(f, keys=[k0.to(torch.int32), *f.keys[1:]])
    with pytest.raises(ae.Error, match=r"context: key.0: a tensor .*dtype torch.float64.*caches must be float32"):
        context(f, keys=[k0.double(), *f.keys[1:]])
    with pytest.raises(ae.Error, match=r"context: key.0: an array of shape .*dtype float64; caches must be float32"):
        context(f, keys=[k0.double().numpy(), *f.keys[1:]])
    with pytest.raises(ae.Error, match=r"context: key.0: .*layout torch.sparse_coo; expected a dense"):
        context(f, keys=[k0.to_sparse(), *f.keys[1:]])
    with pytest.raises(ae.Error, match=r"context: key.0: expected a tensor or array of numbers, got a list"):
        context(f, keys=[[["a"]]], values=[[["a"]]])
    with pytest.raises(ae.Error, match=r"context: suffix_key.0: .*device 'meta'"):
        context(f, suffix_keys=[torch.empty(3, 1, 2, 2, device="meta")], suffix_values=[torch.zeros(3, 1, 2, 2)],
                suffix_len=[1, 1, 1])
    # a non-contiguous view is copied (documented), still accepted
    nc = [k.transpose(2, 3).contiguous().transpose(2, 3) for k in f.keys]
    assert context(f, keys=nc).copied


def test_context_motion_tensors(ctx_args):
    f = ctx_args
    with pytest.raises(ae.Error, match=r"v0: a tensor of shape \[3\], dtype torch.float32, on device 'meta', which "
                                       "holds no values; expected float32 values"):
        context(f, v0=torch.empty(3, device="meta"))
    with pytest.raises(ae.Error, match=r"v0: .*complex.*expected real numbers"):
        context(f, v0=torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(ae.Error, match=r"v0: expected float32 numbers, got a list of 3"):
        context(f, v0=["a", "b", "c"])
    xyz, rot = torch.zeros(3, 4, 3), torch.eye(3).expand(3, 4, 3, 3).contiguous()
    with pytest.raises(ae.Error, match=r"ego_history_xyz: .*device 'meta', which holds no values"):
        context(f, v0=None, ego_history_xyz=xyz.to("meta"), ego_history_rot=rot)
    with pytest.raises(ae.Error, match=r"ego_history_rot: .*device 'meta', which holds no values"):
        context(f, v0=None, ego_history_xyz=xyz, ego_history_rot=rot.to("meta"))
    with pytest.raises(ae.Error, match=r"ego_history_xyz: expected shape \[B, H, 3\], found \[3, 4, 2\]"):
        context(f, v0=None, ego_history_xyz=torch.zeros(3, 4, 2), ego_history_rot=rot)
    with pytest.raises(ae.Error, match=r"ego_history_rot: expected shape \[3, 4, 3, 3\], found \[3, 4, 9\]"):
        context(f, v0=None, ego_history_xyz=xyz, ego_history_rot=torch.zeros(3, 4, 9))


def test_session_sample_integer_arguments(files, ctx_args):
    s = ae.Model(str(files["ck"]), backend="reference").session()
    s.bind(context(ctx_args))
    with pytest.raises(ae.Error, match=r"seed: expected an integer, got float 1.5"):
        s.sample(seed=1.5)
    with pytest.raises(ae.Error, match=r"seed: expected an integer, got bool True"):
        s.sample(seed=True)
    with pytest.raises(ae.Error, match=r"seed must be in \[0, 2\^64\), found 18446744073709551616"):
        s.sample(seed=2**64)
    with pytest.raises(ae.Error, match=r"seed: a tensor .*device 'meta'"):
        s.sample(seed=torch.empty((), dtype=torch.int64, device="meta"))
    with pytest.raises(ae.Error, match=r"steps: expected an integer, got float 2.5"):
        s.sample(steps=2.5)
    with pytest.raises(ae.Error, match=r"seeds: expected integers, got float 0.5 at index 1"):
        s.sample(seeds=[1, 0.5, 2])
    with pytest.raises(ae.Error, match=r"seeds: -1 at index 1 does not fit an unsigned 64-bit integer"):
        s.sample(seeds=[1, -1, 2])
    with pytest.raises(ae.Error, match=r"seeds: a tensor .*device 'meta'"):
        s.sample(seeds=torch.empty(3, dtype=torch.int64, device="meta"))
    with pytest.raises(ae.Error, match=r"noise: a tensor .*device 'meta'"):
        s.sample(noise=torch.empty(3, TINY.T, 2, device="meta"))
    c = context(ctx_args)
    with pytest.raises(ae.Error, match=r"guidance_weight: a tensor .*device 'meta'"):
        s.bind(c, guidance=c, guidance_weight=torch.empty((), device="meta"))
    with pytest.raises(ae.Error, match=r"guidance_weight: expected a number, got bool True"):
        s.bind(c, guidance=c, guidance_weight=True)
    s.bind(c)
    with pytest.raises(ae.Error, match=r"temperature: a tensor .*device 'meta'"):
        s.sample(temperature=torch.empty((), device="meta"))
    with pytest.raises(ae.Error, match=r"temperature: expected a number, got str 'hot'"):
        s.sample(temperature="hot")
    with pytest.raises(ae.Error, match=r"v0: expected a number, got complex"):
        s.sample(v0=1j)
    assert np.array_equal(s.sample(seed=1, temperature=np.float32(0.5), v0=torch.tensor(3.0)).xyz,
                          s.sample(seed=1, temperature=0.5, v0=3.0).xyz)
    big = np.array([2**64 - 1, 0, 1], dtype=np.uint64)  # seeds are unsigned 64-bit: all of it is accepted
    a, b = s.sample(seeds=big), s.sample(seeds=[2**64 - 1, 0, 1])
    assert np.array_equal(a.xyz, b.xyz)
    assert np.array_equal(s.sample(seed=np.uint64(7)).xyz, s.sample(seed=7).xyz)


# ---- the Python writers and the rollout constructors
def test_write_context_arguments(ctx_args, tmp_path):
    f = ctx_args
    kv = list(zip(f.keys, f.values))
    out = tmp_path / "c.safetensors"
    with pytest.raises(ValueError, match=rf"valid_len: a list of 3 cannot be read as a vector of 64-bit integers"):
        write_context(out, kv, [2**63, 1, 1], f.rope_delta, v0=f.v0)
    with pytest.raises(ValueError, match=r"rope_delta: an array of shape \[3\], dtype uint64 holds 9223372036854775808"):
        write_context(out, kv, f.valid_len, np.array([2**63, 0, 0], dtype=np.uint64), v0=f.v0)
    with pytest.raises(ValueError, match=r"rope_delta: .*device 'meta', which holds no values"):
        write_context(out, kv, f.valid_len, torch.zeros(3, dtype=torch.int64, device="meta"), v0=f.v0)
    with pytest.raises(ValueError, match=r"cache layer 0 key: a tensor of shape .*device 'meta', which holds no values"):
        write_context(out, [(f.keys[0].to("meta"), f.values[0]), *kv[1:]], f.valid_len, f.rope_delta, v0=f.v0)
    with pytest.raises(ValueError, match=r"cache layer 1 value: expected a floating dtype, got torch.int64 "
                                         r"\(a tensor of shape"):
        write_context(out, [kv[0], (f.keys[1], f.values[1].long()), *kv[2:]], f.valid_len, f.rope_delta, v0=f.v0)
    with pytest.raises(ValueError, match=r"v0: .*device 'meta', which holds no values"):
        write_context(out, kv, f.valid_len, f.rope_delta, v0=torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match=r"ego_history_xyz: .*device 'meta'"):
        write_context(out, kv, f.valid_len, f.rope_delta, ego_history_xyz=torch.zeros(3, 4, 3, device="meta"),
                      ego_history_rot=torch.zeros(3, 4, 3, 3))
    with pytest.raises(ValueError, match=r"prefix_pad: a list of 3 cannot be read"):
        write_context(out, kv, f.valid_len, f.rope_delta, v0=f.v0, prefix_pad=[0, 0, 2**64])
    assert not out.exists()


def test_rollout_arguments(ctx_args):
    f = ctx_args
    kv = list(zip(f.keys, f.values))
    kw = dict(num_return_sequences=1, offsets=f.valid_len, share_prompt=False)
    with pytest.raises(ae.Error, match=r"rope_deltas: a list of 3 cannot be read as a vector of 64-bit integers"):
        ae.rollout_layout(kv, [2**63, 0, 0], **kw)
    with pytest.raises(ae.Error, match=r"offsets: .*device 'meta', which holds no values"):
        ae.rollout_layout(kv, f.rope_delta, **{**kw, "offsets": torch.zeros(3, dtype=torch.int64, device="meta")})
    with pytest.raises(ae.Error, match=r"rollout: cache layer 0 key: a tensor .*device 'meta', which holds no values"):
        ae.rollout_layout([(f.keys[0].to("meta"), f.values[0]), *kv[1:]], f.rope_delta, **kw)
    with pytest.raises(ae.Error, match=r"rollout: cache layer 0 value: .*dtype torch.int64.*expected a float tensor"):
        ae.rollout_layout([(f.keys[0], f.values[0].long()), *kv[1:]], f.rope_delta, **kw)
    with pytest.raises(ae.Error, match=r"prefix_mask: .*device 'meta'"):
        ae.rollout_layout(kv, f.rope_delta, **{**kw, "prefix_mask": torch.ones(3, 4, device="meta")})
    with pytest.raises(ae.Error, match=r"ego_history_xyz: .*device 'meta'"):
        ae.rollout_context(kv, f.rope_delta, ego_history_xyz=torch.zeros(3, 4, 3, device="meta"),
                           ego_history_rot=torch.zeros(3, 4, 3, 3), **kw)
    lay = ae.rollout_layout(kv, f.rope_delta, **kw)
    with pytest.raises(ae.Error, match=r"v0: .*device 'meta'"):
        lay.context(v0=torch.zeros(3, device="meta"))
    assert lay.context(v0=f.v0).batch == 3
