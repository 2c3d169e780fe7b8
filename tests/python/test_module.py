"""The Python module (alpamayo_expert._core through alpamayo_expert.engine): bitwise the CLI's results, caches read
in place through DLPack, copies only where documented, errors as alpamayo_expert.Error, the GIL released."""
from __future__ import annotations

import ctypes
import json
import re
import threading
import time

import numpy as np
import pytest
import torch
from safetensors import safe_open

import alpamayo_expert as ae
from alpamayo_expert import read_context, write_noise
from cli import REFERENCE, Backend, run, sample
from conftest import compiled_backends
from synth import TINY, CtxSpec, make_checkpoint, make_context, make_noise
from test_shared_prompts import SHARED, UNGUIDED


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("module")
    ck = make_checkpoint(d / "ck", TINY, "1.5", "bf16")
    ctx = make_context(d / "ctx.safetensors", TINY, replace_kv(SHARED, "bf16"))
    unguided = make_context(d / "unguided.safetensors", TINY, replace_kv(UNGUIDED, "bf16"))
    noise = make_noise(SHARED.B, TINY, 3)
    write_noise(d / "noise.safetensors", noise)
    return dict(dir=d, ck=ck, ctx=ctx, unguided=unguided, noise=noise)


def replace_kv(spec, dtype):
    from dataclasses import replace
    return replace(spec, kv_dtype=dtype)


def model_for(files, backend):
    return ae.Model(str(files["ck"]), backend=backend.name, weights=backend.weights or "",
                    threads=2 if backend.name == "cpu" else 0)


def context_from_file(path, **kw):
    f = read_context(path)
    return ae.Context(f.keys, f.values, f.valid_len, f.rope_delta, prefix_pad=f.prefix_pad, prompt_index=f.prompt_index,
                      suffix_keys=f.suffix_keys, suffix_values=f.suffix_values, suffix_len=f.suffix_len,
                      ego_history_xyz=f.ego_history_xyz, ego_history_rot=f.ego_history_rot, v0=f.v0, **kw), f


def test_bitwise_the_cli(cli, files, backend, tmp_path):
    """Caller tensors (bf16 torch, shared prompts, suffixes, padding) + guidance + temperature: the CLI's bits."""
    m = model_for(files, backend)
    ctx, f = context_from_file(files["ctx"])
    u, _ = context_from_file(files["unguided"])
    assert ctx.copied == [] and (ctx.batch, ctx.prompts, ctx.suffix_rows) == (5, 2, 10)
    s = m.session()
    s.bind(ctx, guidance=u, guidance_weight=2.0)
    r = s.sample(noise=files["noise"], temperature=0.7, all_steps=True)
    cli_r = sample(cli, files["ck"], files["ctx"], tmp_path, backend=backend, noise=files["dir"] / "noise.safetensors",
                   layers=False, extra=["--guidance-context", files["unguided"], "--guidance-weight", 2,
                                        "--temperature", 0.7])
    for k in ("action", "xyz", "yaw", "rot", "v0", "x_steps", "v_steps"):
        assert np.array_equal(getattr(r, k), cli_r[k].numpy()), k
    # From the file, with torch outputs: the same bits.
    s.bind(ae.Context.open(str(files["ctx"])), guidance=ae.Context.open(str(files["unguided"])), guidance_weight=2.0)
    rt = s.sample(noise=files["noise"], temperature=0.7, output="torch")
    assert isinstance(rt.xyz, torch.Tensor) and torch.equal(rt.xyz, torch.from_numpy(r.xyz))


def test_views_not_copies(files):
    """Row-major caches (torch bf16/f32, numpy f32/f16) are read in place: the engine's pointers are theirs."""
    f = read_context(files["ctx"])
    for conv in (lambda t: t, lambda t: t.float(), lambda t: t.float().numpy(), lambda t: t.half().numpy()):
        keys = [conv(k) for k in f.keys]
        values = [conv(v) for v in f.values]
        ctx = ae.Context(keys, values, f.valid_len, f.rope_delta, prefix_pad=f.prefix_pad, prompt_index=f.prompt_index,
                         suffix_keys=f.suffix_keys, suffix_values=f.suffix_values, suffix_len=f.suffix_len, v0=[1.0] * 5)
        ptr = lambda a: a.data_ptr() if isinstance(a, torch.Tensor) else a.ctypes.data  # noqa: E731
        views = {name: p for name, p, *_ in ctx.views()}
        assert ctx.copied == []
        assert views["context: key.0"] == ptr(keys[0]) and views["context: value.1"] == ptr(values[1])
        assert views["context: suffix_key.1"] == f.suffix_keys[1].data_ptr()


def test_non_contiguous_is_copied_or_refused(files, tmp_path):
    m = ae.Model(str(files["ck"]), backend="reference")
    ref, f = context_from_file(files["ctx"])
    s = m.session()
    s.bind(ref)
    want = s.sample(seed=3).action
    keys = [k.transpose(1, 2).contiguous().transpose(1, 2) for k in f.keys]  # same values, another layout
    ctx = ae.Context(keys, f.values, f.valid_len, f.rope_delta, prefix_pad=f.prefix_pad, prompt_index=f.prompt_index,
                     suffix_keys=f.suffix_keys, suffix_values=f.suffix_values, suffix_len=f.suffix_len,
                     ego_history_xyz=f.ego_history_xyz, ego_history_rot=f.ego_history_rot)
    assert ctx.copied == ["context: key.0", "context: key.1"]
    s.bind(ctx)
    assert np.array_equal(s.sample(seed=3).action, want)
    with pytest.raises(ae.Error, match=r"context: key.0: not row-major contiguous .* and copy=False"):
        ae.Context(keys, f.values, f.valid_len, f.rope_delta, prefix_pad=f.prefix_pad, prompt_index=f.prompt_index,
                   suffix_keys=f.suffix_keys, suffix_values=f.suffix_values, suffix_len=f.suffix_len, copy=False)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class FakeCuda:
    """A DLPack producer that labels host memory as cuda:0 (no GPU needed): the engine must refuse to read it."""

    def __init__(self, a: np.ndarray):
        self.a = np.ascontiguousarray(a, dtype=np.float32)
        self.shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        self.mt = _DLManagedTensor()
        self.mt.dl_tensor = _DLTensor(self.a.ctypes.data, _DLDevice(2, 0), a.ndim, _DLDataType(2, 32, 1), self.shape,
                                      None, 0)

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kwargs):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.mt), b"dltensor", None)


def test_device_memory_on_a_host_backend_is_refused(files):
    f = read_context(files["ctx"])
    keys = [FakeCuda(k.float().numpy()) for k in f.keys]
    ctx = ae.Context(keys, f.values, f.valid_len, f.rope_delta, prefix_pad=f.prefix_pad, prompt_index=f.prompt_index,
                     suffix_keys=f.suffix_keys, suffix_values=f.suffix_values, suffix_len=f.suffix_len, v0=[1.0] * 5)
    assert ctx.views()[0][2] == "cuda:0" and ctx.copied == []
    s = ae.Model(str(files["ck"]), backend="reference").session()
    with pytest.raises(ae.Error, match=r"context: key.0: lives in cuda:0 memory, which the reference backend cannot read"):
        s.bind(ctx)
    assert not s.bound


def test_errors_carry_the_engine_message(files, tmp_path):
    with pytest.raises(ae.Error, match="nope"):
        ae.Model(str(tmp_path / "nope"))
    with pytest.raises(ae.Error, match="unknown backend|backend 'gpu9'"):
        ae.Model(str(files["ck"]), backend="gpu9")
    assert issubclass(ae.Error, RuntimeError)
    f = read_context(files["ctx"])
    kw = dict(prefix_pad=f.prefix_pad, suffix_keys=f.suffix_keys, suffix_values=f.suffix_values,
              suffix_len=f.suffix_len)
    with pytest.raises(ae.Error, match=r"prompt_index\[1\] = 7 names no prompt"):
        ae.Context(f.keys, f.values, f.valid_len, f.rope_delta, prompt_index=[0, 7, 0, 1, 0], **kw)
    with pytest.raises(ae.Error, match=r"suffix_len\[0\] = 11 is outside \[0, Q = 10\]"):
        ae.Context(f.keys, f.values, f.valid_len, f.rope_delta, prompt_index=f.prompt_index,
                   **{**kw, "suffix_len": [11, 0, 0, 0, 0]})
    with pytest.raises(ae.Error, match="valid_len: expected integers"):
        ae.Context(f.keys, f.values, [40.0, 31.0], f.rope_delta, prompt_index=f.prompt_index, **kw)
    m = ae.Model(str(files["ck"]), backend="reference")
    s = m.session()
    with pytest.raises(ae.Error, match="no context bound"):
        s.sample()
    ctx = ae.Context.open(str(files["ctx"]))
    s.bind(ctx)
    with pytest.raises(ae.Error, match=r"noise: expected shape \[B=5, T=16, A=2\]"):
        s.sample(noise=np.zeros((5, 2, 16), np.float32))
    with pytest.raises(ae.Error, match="seeds: expected one per sample"):
        s.sample(seeds=[1, 2])
    other = ae.Context.open(str(make_context(tmp_path / "o.safetensors", TINY, CtxSpec(motion="v0"))))
    with pytest.raises(ae.Error, match="the guidance context has 3 samples"):
        s.bind(ctx, guidance=other)
    assert not s.bound, "a failed bind leaves the session unbound"


def test_sample_releases_the_gil(files):
    """A long sample in a thread lets Python run meanwhile; a second call into the busy Session is refused."""
    m = ae.Model(str(files["ck"]), backend="reference")
    s = m.session()
    s.bind(ae.Context.open(str(files["ctx"])))
    t0 = time.perf_counter()
    s.sample(steps=50)
    per_step = (time.perf_counter() - t0) / 50
    steps = max(200, int(1.0 / max(per_step, 1e-6)))  # ~1 s of sampling
    done = threading.Event()
    th = threading.Thread(target=lambda: (s.sample(steps=steps), done.set()))
    th.start()
    time.sleep(0.05)
    ticks = 0
    busy_refused = False
    while not done.is_set():
        ticks += 1
        if not busy_refused:
            try:
                s.sample(steps=1)
            except ae.Error as e:
                busy_refused = "in use by another thread" in str(e)
        time.sleep(0.001)
    th.join()
    assert ticks > 50, f"the main thread ran only {ticks} times during the sample: the GIL was held"
    assert busy_refused


def test_sessions_share_a_model_across_threads(files):
    m = ae.Model(str(files["ck"]), backend="reference")
    ctx = ae.Context.open(str(files["ctx"]))
    want = m.session()
    want.bind(ctx)
    ref = want.sample(seed=9).xyz
    out = [None] * 3

    def work(i):
        s = m.session()
        s.bind(ctx)
        out[i] = s.sample(seed=9).xyz

    ths = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    assert all(np.array_equal(o, ref) for o in out)


def test_use_cfg_config_needs_guidance(files, tmp_path):
    import json
    import shutil
    d = tmp_path / "ck"
    shutil.copytree(files["ck"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["diffusion_cfg"]["use_classifier_free_guidance"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    m = ae.Model(str(d), backend="reference")
    s = m.session()
    ctx = ae.Context.open(str(files["ctx"]))
    with pytest.raises(ae.Error, match="use_classifier_free_guidance is true"):
        s.bind(ctx)
    s.bind(ctx, no_guidance=True)
    s.bind(ctx, guidance=ae.Context.open(str(files["unguided"])))
    assert s.bound


def test_backend_formats_say_what_runs_here():
    """backend_formats(name): every weight format of the backend, '' where this machine runs it, else why; a
    backend that cannot run here gives its own reason for each format; an unknown name names the ones built."""
    for name, weights, _kv, why in ae.backends():
        formats = ae.backend_formats(name)
        assert list(formats) == weights
        if why:
            assert all(v == why for v in formats.values()), (name, formats)
    assert ae.backend_formats("reference") == {w: "" for w in dict((n, w) for n, w, _, _ in ae.backends())["reference"]}
    with pytest.raises(ae.Error, match=r"backend_formats: no backend 'nope' in this build \(.*reference"):
        ae.backend_formats("nope")


def test_kv_format_round_trip(cli, files, tmp_path):
    """kv= as `--kv`: the model says the format in use (the backend's first by default), backends() lists them,
    an unknown one raises the engine's message, and the reference's int8 cache gives the CLI's bits, close to but
    not equal to its f32 cache's."""
    listed = {name: kv for name, _weights, kv, _why in ae.backends()}
    assert listed["reference"] == ["f32", "int8"] and all(listed.values())
    m32 = ae.Model(str(files["ck"]), backend="reference")
    m8 = ae.Model(str(files["ck"]), backend="reference", kv="int8")
    assert (m32.kv, m8.kv, m8.weights) == ("f32", "int8", "f32")
    assert "kv='int8'" in repr(m8)
    with pytest.raises(ae.Error, match=r"backend reference: unknown KV cache format 'bf16' \(it offers f32, int8\)"):
        ae.Model(str(files["ck"]), backend="reference", kv="bf16")
    with pytest.raises(ae.Error, match="unknown KV cache format 'fp16'"):
        ae.Model(str(files["ck"]), kv="fp16")
    ctx = ae.Context.open(str(files["ctx"]))
    out = {}
    for name, m in (("f32", m32), ("int8", m8)):
        s = m.session()
        s.bind(ctx, guidance=ae.Context.open(str(files["unguided"])), guidance_weight=2.0)
        out[name] = s.sample(noise=files["noise"])
    cli_r = sample(cli, files["ck"], files["ctx"], tmp_path, noise=files["dir"] / "noise.safetensors", layers=False,
                   all_steps=False, extra=["--kv", "int8", "--guidance-context", files["unguided"],
                                           "--guidance-weight", 2])
    assert np.array_equal(out["int8"].action, cli_r["action"].numpy())
    assert not np.array_equal(out["int8"].action, out["f32"].action)
    # Close: the trajectories within 1% of their extent (measured 0.15% with this guidance weight of 2).
    assert np.abs(out["int8"].xyz - out["f32"].xyz).max() <= 0.01 * np.abs(out["f32"].xyz).max()
    assert np.corrcoef(out["int8"].action.ravel(), out["f32"].action.ravel())[0, 1] >= 0.998


def test_profiles_are_data_and_the_cli_prints_them(cli, files, tmp_path, monkeypatch):
    """Model(profile=True): Session.profiles() holds one profile per run of the layers (guided and unguided pass per
    step), as numbers and as the table; the CLI's --profile prints the same table for each, in the order they ran,
    and without --profile nothing is recorded."""
    if not any(name == "cpu" and not why for name, _, why in compiled_backends()):
        pytest.skip("this build has no cpu backend")
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", "attention=avx2_fma,matmul_bf16=avx2_fma")
    m = ae.Model(str(files["ck"]), backend="cpu", threads=2, profile=True)
    s = m.session()
    s.bind(ae.Context.open(str(files["ctx"])), guidance=ae.Context.open(str(files["unguided"])), guidance_weight=2.0)
    s.sample(seed=1, steps=2)
    prof = s.profiles()
    assert len(prof) == 4
    phases = ["rms_norm", "qkv matmul", "q/k norm + rope", "attention", "o_proj + residual", "rms_norm2",
              "gate_up + silu*mul", "down + residual"]
    for p in prof:
        assert [ph["name"] for ph in p["phases"]] == phases
        assert all(ph["seconds"] >= 0 and 0 <= ph["idle"] <= 1 for ph in p["phases"])
        # The pin names every choice this process made (other models' too).
        assert (p["weights"], p["threads"]) == ("bf16", 2)
        assert set(m.kernels.split(",")) <= set(p["kernel_pin"].split(","))
        assert [o["op"] for o in p["ops"]] == ["matmul_bf16", "attention"]
        assert [o["kernel"] for o in p["ops"]] == ["avx2_fma", "avx2_fma"]
        for o in p["ops"]:
            assert o["actual_ms"] > 0 and o["achieved"] == pytest.approx(o["gflop"] / (1e-3 * o["actual_ms"]))
            # The roofline: bytes at the read bandwidth beside flops at the peak; the floor at least the larger.
            assert o["gbytes"] > 0 and o["read_gbs"] > 0
            assert o["memory_ms"] == pytest.approx(1e3 * o["gbytes"] / o["read_gbs"])
            assert o["compute_ms"] == pytest.approx(1e3 * o["gflop"] / o["peak"])
            assert o["floor_ms"] >= max(o["compute_ms"], o["memory_ms"]) * (1 - 1e-9)
            assert o["floor_ms"] <= (o["compute_ms"] + o["memory_ms"]) * (1 + 1e-9)
        assert p["table"].startswith("cpu backend profile (bf16 weights, 2 threads, B=5 ")
        assert f"\n  pin these: ALPAMAYO_CPU_KERNELS={p['kernel_pin']}\n" in p["table"]
    assert [p["s_max"] for p in prof[:2]] == [p["s_max"] for p in prof[2:]] and prof[0]["s_max"] != prof[1]["s_max"]
    off = ae.Model(str(files["ck"]), backend="cpu", threads=2).session()
    off.bind(ae.Context.open(str(files["ctx"])))
    off.sample(seed=1, steps=1)
    assert off.profiles() == []
    # The CLI: the table of every run, between "sampling ..." and the step times.
    args = ["sample", "--checkpoint", files["ck"], "--context", files["ctx"], "--out", tmp_path / "p.safetensors",
            "--guidance-context", files["unguided"], "--guidance-weight", 2, "--backend", "cpu", "--threads", 2,
            "--steps", 2, "--seed", 1]
    p = run(cli, *args, "--profile")
    assert p.returncode == 0, p.stderr
    tables = re.findall(r"^cpu backend profile \(.*?^  floor .*?\n", p.stderr, re.M | re.S)
    assert len(tables) == 4, p.stderr
    def shape(table):
        """The layout without the timings (and the column widths they take) and without the kernel lines, which
        name every choice of the process (this one made others for other models)."""
        kept = [ln for ln in table.splitlines() if not re.match(r"  (kernel |check |pin these:)", ln)]
        return re.sub(r" +", " ", re.sub(r"\d+(\.\d+)?", "N", "\n".join(kept)))
    for got, want in zip(tables, prof):
        assert shape(got) == shape(want["table"])
        assert "\n  pin these: ALPAMAYO_CPU_KERNELS=attention=avx2_fma,matmul_bf16=avx2_fma\n" in got
        assert re.search(r"^  kernel attention +avx2_fma ", got, re.M), got
    assert p.stderr.index("sampling ...") < p.stderr.index("cpu backend profile") < p.stderr.index("step 1/2")
    p = run(cli, *args)
    assert p.returncode == 0 and "cpu backend profile" not in p.stderr, p.stderr


def test_kernels_pin_the_cpu_backend(cli, files, tmp_path, monkeypatch):
    """Model(kernels=...) loads the cpu backend's kernels it names, ahead of ALPAMAYO_CPU_KERNELS; Model.kernels
    reports them; the result is the CLI's bit for bit under the variable set to the same kernels."""
    if not any(name == "cpu" and not why for name, _, why in compiled_backends()):
        pytest.skip("this build has no cpu backend")
    monkeypatch.delenv("ALPAMAYO_CPU_KERNELS", raising=False)
    timed = ae.Model(str(files["ck"]), backend="cpu", threads=2)
    assert re.fullmatch(r"attention=\w+,matmul_bf16=\w+", timed.kernels), timed.kernels
    want = "attention=avx2_fma,matmul_bf16=avx2_fma"
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", "attention=portable")
    assert ae.Model(str(files["ck"]), backend="cpu", threads=2).kernels.startswith("attention=portable,")
    m = ae.Model(str(files["ck"]), backend="cpu", threads=2, kernels=want)
    assert m.kernels == want
    s = m.session()
    s.bind(ae.Context.open(str(files["ctx"])))
    r = s.sample(noise=files["noise"])
    monkeypatch.setenv("ALPAMAYO_CPU_KERNELS", want)
    cli_r = sample(cli, files["ck"], files["ctx"], tmp_path, backend=Backend("cpu"),
                   noise=files["dir"] / "noise.safetensors", layers=False, all_steps=False)
    assert np.array_equal(r.action, cli_r["action"].numpy()) and np.array_equal(r.xyz, cli_r["xyz"].numpy())
    # The CLI names the kernels its result came from: in its summary line, the result's metadata and its JSON.
    for backend, kernels in (("cpu", want), ("reference", "")):
        p = run(cli, "sample", "--checkpoint", files["ck"], "--context", files["ctx"], "--out", tmp_path / "k.safetensors",
                "--json", tmp_path / "k.json", "--backend", backend, "--threads", 2, "--steps", 1)
        assert p.returncode == 0 and (f"kernels {want}); wrote" in p.stderr) == bool(kernels), p.stderr
        with safe_open(str(tmp_path / "k.safetensors"), "pt") as f:
            meta = f.metadata()
        assert (meta["backend"], meta["kernels"]) == (backend, kernels), meta
        assert meta["weights"] == ("bf16" if backend == "cpu" else "f32") and meta["kv"], meta
        js = json.loads((tmp_path / "k.json").read_text())
        assert (js["backend"], js["weights"], js["kv"], js["kernels"]) == (backend, meta["weights"], meta["kv"], kernels)
    assert ae.Model(str(files["ck"]), backend="reference").kernels == ""
    with pytest.raises(ae.Error, match="backend reference: kernels .* no kernels to choose"):
        ae.Model(str(files["ck"]), backend="reference", kernels=want)
    with pytest.raises(ae.Error, match='kernels: unknown attention kernel "avx9000"'):
        ae.Model(str(files["ck"]), backend="cpu", kernels="attention=avx9000")
