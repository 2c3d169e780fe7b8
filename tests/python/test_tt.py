"""alpamayo_expert.tt in tt-lang-sim against the reference: every fused operation against its reference op (bf16 and
bfp8_b weights), the layer, and whole samples teacher-forced against the engine's reference backend, on tiny
checkpoints of both layouts with B > 1. Bounds: docs/ACCURACY.md, "TT-Lang backend (simulated)"."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

import bfp
import synth
from alpamayo_expert import Context, Model, UnsupportedError, InvalidArgumentError
from alpamayo_expert import _core

# ALPAMAYO_TT_BACKEND=tt runs the same checks on a Blackhole (never done: docs/TT_BACKEND.md).
BACKEND = os.environ.get("ALPAMAYO_TT_BACKEND", "tt-sim")
pytestmark = pytest.mark.skipif(BACKEND == "tt-sim" and (importlib.util.find_spec("ttl") is None
                                                         or importlib.util.find_spec("ttl.sim") is None),
                                reason="tt-lang-sim is not installed (pip install 'alpamayo-expert[tt-sim]')")

from alpamayo_expert.tt import TTExpert, kernels as K, quantize_weight, reference as R, round_bf16  # noqa: E402
from alpamayo_expert.tt._runtime import open_runtime  # noqa: E402

GRID = (4, 2)   # small grids keep the simulator fast; one test runs Blackhole's 11 x 10
FORMATS = ("bf16", "bfp8_b")
# Per operation against its reference on the same (bf16) inputs: the simulator computes in float32, so what is
# left is float32 summation order (docs/ACCURACY.md).
OP_REL = 1e-5
# Teacher-forced v_k against the engine's reference backend: the device rounds the embedding, the caches and the
# rope tables to bf16 (the engine keeps them float32); derived in docs/ACCURACY.md.
V_ABS, V_PCC = 0.05, 0.9995
# With cache="bfp8_b" the cache's rounding grows from u to 4u (half a step of 2^-6 of a block's largest
# magnitude): the error in v by up to 4x, 1 - PCC by up to 16x (docs/ACCURACY.md section 5).
V_ABS_CACHE8, V_PCC_CACHE8 = 4 * V_ABS, 1 - 16 * (1 - V_PCC)


def pcc(a, b) -> float:
    return float(np.corrcoef(np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel())[0, 1])


def close(out, ref, rel=OP_REL):
    out, ref = torch.as_tensor(out).float(), torch.as_tensor(ref).float()
    err = (out - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rel * max(scale, 1.0), f"max error {err} at scale {scale}"
    assert pcc(out, ref) > 0.999999


@pytest.fixture(scope="module")
def rt():
    return open_runtime(BACKEND)


def up(rt, t, dtype=None):
    return rt.ttnn.from_torch(t.float().contiguous(), dtype=dtype or rt.ttnn.bfloat16, layout=rt.ttnn.TILE_LAYOUT,
                              device=rt.device)


def down(rt, t):
    return rt.ttnn.to_torch(t).float().clone()


def consts(rt, D, eps, d):
    return up(rt, K.constants(D, eps, d), rt.ttnn.float32)


def bf(*shape, g):
    return round_bf16(torch.randn(*shape, generator=g))


def test_bfp8_quantiser_is_the_engines():
    """The module's bfp_quantize (the engine's C++) and tests/python/bfp.py agree bit for bit."""
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 64)
    assert torch.equal(quantize_weight(w.T, "bfp8_b").T, bfp.quantize_linear(w, "bfp8_b"))


@pytest.mark.parametrize("mb", [1, 3])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["norm", "norm_gated", "residual"])
def test_linear(rt, fmt, kind, mb):
    """RMSNorm + matmul, (e) RMSNorm + gate/up + SiLU * up, (d)/(f) matmul + residual; a work unit of one row tile
    or of all three (each weight block read once)."""
    g = torch.Generator().manual_seed(1)
    M, Kd, N = 96, 128, 96
    x, res, gain = bf(M, Kd, g=g), bf(M, N, g=g), round_bf16(1 + 0.1 * torch.randn(Kd, generator=g))
    w = quantize_weight(torch.randn(Kd, N, generator=g) / 10, fmt)
    w2 = quantize_weight(torch.randn(Kd, N, generator=g) / 10, fmt)
    wdt = rt.ttnn.bfloat8_b if fmt == "bfp8_b" else rt.ttnn.bfloat16
    norm, gated = kind != "residual", kind == "norm_gated"
    op = K.make_linear(rt.ttl, GRID, M // 32, Kd // 32, N // 32, 2, 1, norm=norm, gated=gated, residual=not norm,
                       mb=mb)
    y = up(rt, torch.zeros(M, N))
    op(up(rt, x), up(rt, w, wdt), up(rt, w2, wdt), up(rt, gain.expand(32, Kd)), up(rt, res), consts(rt, Kd, 1e-6, 32),
       y)
    n = R.rms(x, gain, 1e-6)
    ref = {"norm": n @ w, "norm_gated": torch.nn.functional.silu(n @ w) * (n @ w2), "residual": x @ w + res}[kind]
    close(down(rt, y), ref)


def test_final_rmsnorm(rt):
    g = torch.Generator().manual_seed(2)
    x, gain = bf(64, 96, g=g), round_bf16(torch.rand(96, generator=g) + 0.5)
    y = up(rt, torch.zeros(64, 96))
    K.make_rmsnorm(rt.ttl, GRID, 2, 3)(up(rt, x), up(rt, gain.expand(32, 96)), consts(rt, 96, 1e-6, 32), y)
    close(down(rt, y), R.rms(x, gain, 1e-6))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("d", [32, 64])
def test_qkv_rope_head_split(rt, d, fmt):
    """(a) RMSNorm + qkv + q/k RMSNorm + RoPE + head split in one operation: q GQA-packed, own k/v into the caches'
    scratch tail and no other cache row touched."""
    g = torch.Generator().manual_seed(3)
    B, Tp, Hq, Hkv, Smax, D = 2, 64, 4, 2, 128, 96
    N = (Hq + 2 * Hkv) * d
    x, gain = bf(B * Tp, D, g=g), round_bf16(1 + 0.1 * torch.randn(D, generator=g))
    w = quantize_weight(torch.randn(D, N, generator=g) / 10, fmt)
    wdt = rt.ttnn.bfloat8_b if fmt == "bfp8_b" else rt.ttnn.bfloat16
    gq, gk = round_bf16(1 + 0.2 * torch.randn(d, generator=g)), round_bf16(1 + 0.2 * torch.randn(d, generator=g))
    pos = (torch.tensor([17, 40])[:, None] + torch.arange(Tp)).reshape(-1)
    cos, sin = (round_bf16(t) for t in R.rope_tables(pos, d, 5e6))
    rot = torch.zeros(d, d)
    h = d // 2
    rot[torch.arange(h) + h, torch.arange(h)], rot[torch.arange(h), torch.arange(h) + h] = -1.0, 1.0
    kc0, vc0 = bf(B * Hkv * Smax, d, g=g), bf(B * Hkv * Smax, d, g=g)
    q_dev, kc, vc = up(rt, torch.zeros(B * Hq * Tp, d)), up(rt, kc0), up(rt, vc0)
    op = K.make_qkv_rope(rt.ttl, GRID, B, Tp // 32, D // 32, 1, Hq, Hkv, d // 32, Smax // 32)
    op(up(rt, x), up(rt, w, wdt), up(rt, gain.expand(32, D)), up(rt, gq.expand(32, d)), up(rt, gk.expand(32, d)),
       up(rt, cos), up(rt, sin), up(rt, rot), consts(rt, D, 1e-6, d), q_dev, kc, vc)
    q, k, v = R.qk_rope(R.rms(x, gain, 1e-6) @ w, gq, gk, cos, sin, Hq, Hkv, d, 1e-6)
    G = Hq // Hkv
    close(down(rt, q_dev).reshape(B, Hkv, G, Tp, d), q.reshape(B, Tp, Hkv, G, d).permute(0, 2, 3, 1, 4))
    for dev, before, own in ((kc, kc0, k), (vc, vc0, v)):
        got, want = down(rt, dev).reshape(B, Hkv, Smax, d), before.reshape(B, Hkv, Smax, d).clone()
        want[:, :, Smax - Tp:] = own.reshape(B, Tp, Hkv, d).transpose(1, 2)
        close(got, want)
        assert torch.equal(got[:, :, :Smax - Tp], before.reshape(B, Hkv, Smax, d)[:, :, :Smax - Tp])


@pytest.mark.parametrize("nsplit", [1, 3])
def test_attention_split_and_merge(rt, nsplit):
    """(c) attention over the cache rows plus the own tokens, the key sequence split over nodes and merged by
    log-sum-exp, GQA heads packed; left padding, unused rows and the own padding masked. Only the chunks up to
    the run-time valid length and the own tail are read: the chunks between hold NaN, which any read (masked or
    not) would carry into the result; likewise the mask of the chunks wholly context."""
    g = torch.Generator().manual_seed(4)
    B, Tp, Tw, Hq, Hkv, d, Smax, kc = 2, 32, 20, 4, 2, 64, 512, 2
    G, S, pads = Hq // Hkv, [150, 97], [3, 0]
    q = bf(B, Hkv, G * Tp, d, g=g) * 1.5
    kcache, vcache = bf(B, Hkv, Smax, d, g=g) * 1.7, bf(B, Hkv, Smax, d, g=g)
    chunk = kc * 32
    n_ctx = [-(-S[b] // chunk) for b in range(B)]
    tail0 = (Smax - Tp) // chunk * chunk  # the own tail's first chunk, read whole (its rows before Smax - Tp masked)
    for b in range(B):
        kcache[b, :, n_ctx[b] * chunk:tail0] = float("nan")
        vcache[b, :, n_ctx[b] * chunk:tail0] = float("nan")
    kv_chunks = K.kv_chunk_counts(S, pads, chunk)
    keep = torch.zeros(B, Smax, dtype=torch.bool)
    for b in range(B):
        keep[b, pads[b]:S[b]] = True
        keep[b, Smax - Tp:Smax - Tp + Tw] = True
    mask = torch.where(keep, 0.0, -1e9).repeat_interleave(32, 0)
    # The chunks wholly context need no mask and must not read it: NaN there would reach the result.
    lead, full = (-(-pads[b] // chunk) for b in range(B)), (S[b] // chunk for b in range(B))
    for b, (c0, c1) in enumerate(zip(lead, full)):
        assert c1 > c0  # the test covers such chunks
        mask[b * 32:(b + 1) * 32, c0 * chunk:c1 * chunk] = float("nan")
    Rt, dt = G * Tp // 32, d // 32
    U = B * Hkv * Rt * nsplit
    o_p, m_p, l_p = (up(rt, torch.zeros(U * 32, c), rt.ttnn.float32) for c in (d, 32, 32))
    out = up(rt, torch.zeros(B * Tp, Hq * d))
    K.make_attention_partial(rt.ttl, GRID, B, Hkv, Rt, dt, Smax // 32, kc, nsplit, Tp // 32)(
        up(rt, q.reshape(-1, d)), up(rt, kcache.reshape(-1, d)), up(rt, vcache.reshape(-1, d)), up(rt, mask),
        up(rt, kv_chunks, rt.ttnn.float32), consts(rt, 64, 1e-6, d), o_p, m_p, l_p)
    K.make_attention_merge(rt.ttl, GRID, B, Hkv, G, Tp // 32, dt, nsplit, Smax // 32, kc)(
        o_p, m_p, l_p, up(rt, kv_chunks, rt.ttnn.float32), out)
    for b in range(B):
        qb = q[b].reshape(Hkv, G, Tp, d).permute(2, 0, 1, 3).reshape(Tp, Hq, d)
        ref = R.attention(qb, kcache[b].nan_to_num(), vcache[b].nan_to_num(), keep[b], d ** -0.5)
        close(down(rt, out)[b * Tp:(b + 1) * Tp], ref)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny checkpoints of both layouts and a B = 3 context (history, so v0 is estimated), T padded 16 -> 32."""
    d = tmp_path_factory.mktemp("tt")
    cks = {lay: synth.make_checkpoint(d / lay, synth.TINY, layout=lay) for lay in ("r1", "a2")}
    return cks, synth.make_context(d / "ctx.safetensors", synth.TINY, synth.CtxSpec())


@pytest.mark.parametrize("fmt", FORMATS)
def test_layer(tiny, fmt):
    """One whole layer on Blackhole's 11 x 10 grid against the reference layer on what the device holds."""
    cks, ctx = tiny
    e = TTExpert(cks["r1"], backend=BACKEND, weights=fmt, grid=(11, 10), key_chunk=1, keep_host=True)
    e.bind(ctx)
    assert e.nsplit > 1
    B, Tp = e._bound.B, e.Tp
    x = round_bf16(torch.randn(B, Tp, e.D, generator=torch.Generator().manual_seed(5)))
    e._write(e.buf["x"], x.reshape(-1, e.D))
    e.run_layer(0)
    ref, k, v = R.layer(x, e.host_layers[0], e.k_host[0], e.v_host[0], e.keep, e.cos_host, e.sin_host, e.Hq,
                        e.Hkv, e.d, e.eps)
    close(down(e.rt, e.buf["x"]).reshape(B, Tp, e.D), ref, rel=1e-4)
    tail = down(e.rt, e.k_cache[0]).reshape(B, e.Hkv, e.Smax, e.d)[:, :, e.Smax - Tp:]
    close(tail, k)


def test_layer_bfp8_cache(tiny):
    """cache="bfp8_b": the context rows on the device are the engine's bfp8_b quantiser's values of the bf16 rows,
    the own rows are rounded as the packer writes them, and the layer matches the reference layer on those."""
    cks, ctx = tiny
    e = TTExpert(cks["r1"], backend=BACKEND, weights="bfp8_b", grid=GRID, key_chunk=1, keep_host=True,
                 cache="bfp8_b")
    e.bind(ctx)
    B, Tp, Smax = e._bound.B, e.Tp, e.Smax
    k0 = down(e.rt, e.k_cache[0]).reshape(B, e.Hkv, Smax, e.d)
    assert torch.equal(k0, e.k_host[0])
    x = round_bf16(torch.randn(B, Tp, e.D, generator=torch.Generator().manual_seed(5)))
    e._write(e.buf["x"], x.reshape(-1, e.D))
    e.run_layer(0)
    ref, k, _ = R.layer(x, e.host_layers[0], e.k_host[0], e.v_host[0], e.keep, e.cos_host, e.sin_host, e.Hq,
                        e.Hkv, e.d, e.eps, cache_round=e._cache_values)
    close(down(e.rt, e.buf["x"]).reshape(B, Tp, e.D), ref, rel=1e-4)
    tail = down(e.rt, e.k_cache[0]).reshape(B, e.Hkv, Smax, e.d)[:, :, Smax - Tp:]
    assert torch.equal(e._cache_values(tail), tail)  # on the format's grid
    # Float32 summation order can put a value on the other side of a rounding boundary: one step of its block
    # (2^-6 of the block's largest magnitude) in a few values, no more.
    diff = (tail - k).abs()
    assert diff.max() <= 2 ** -6 * k.abs().max() and (diff > 0).float().mean() < 0.01
    e.cache = "bf16"  # the same context's bf16 rows, for the quantiser's check
    e.bind(ctx)
    bf = e.k_host[0]
    assert torch.equal(quantize_weight(bf.reshape(-1, e.d), "bfp8_b").reshape(bf.shape), k0)
    assert not torch.equal(k0, bf)  # the format rounded something


@pytest.mark.parametrize("layout,fmt,cache", [("r1", "bfp8_b", "bf16"), ("a2", "bfp8_b", "bf16"),
                                              ("r1", "bf16", "bf16"), ("a2", "bfp8_b", "bfp8_b")])
def test_sample_teacher_forced(tiny, layout, fmt, cache):
    """Every v_k of a whole sample from the engine's x_k, against the engine's reference backend with the same
    weights (bfp8_b quantised by the same code; bf16 against float32), and the decoded trajectory."""
    cks, ctx = tiny
    e = TTExpert(cks[layout], backend=BACKEND, weights=fmt, grid=GRID, key_chunk=1, cache=cache)
    v_abs, v_pcc = (V_ABS, V_PCC) if cache == "bf16" else (V_ABS_CACHE8, V_PCC_CACHE8)
    e.bind(ctx)
    m = Model(str(cks[layout]), backend="reference", weights="bfp8_b" if fmt == "bfp8_b" else "f32")
    s = m.session()
    s.bind(Context.open(str(ctx)))
    noise = synth.make_noise(e._bound.B, synth.TINY)
    r = s.sample(noise=noise.numpy(), all_steps=True)
    xs, vs = np.asarray(r.x_steps), np.asarray(r.v_steps)
    times = torch.linspace(0, 1, vs.shape[0] + 1)
    for k in range(vs.shape[0]):
        v = e.step(torch.from_numpy(xs[k]), float(times[k])).numpy()
        assert np.abs(v - vs[k]).max() < v_abs, (k, np.abs(v - vs[k]).max())
        assert pcc(v, vs[k]) > v_pcc
    if (layout, fmt) != ("r1", "bfp8_b"):
        return  # the free-running sample and its decode once (each sample costs seconds in the simulator)
    out = e.sample(noise)
    assert out["x_steps"].shape == xs.shape and out["v_steps"].shape == vs.shape
    assert np.abs(out["action"] - np.asarray(r.action)).max() < V_ABS
    assert np.abs(out["xyz"] - np.asarray(r.xyz)).max() < 0.1  # metres over 6.4 s at the context's speeds


def test_graph_independent_of_S_and_scratch_rows(tiny, tmp_path):
    """The operations depend on (B, Smax) only: rebinding a context of other lengths keeps them; a context that
    reaches into the own tokens' scratch tail (S > Smax - Tp) is refused."""
    cks, ctx = tiny
    e = TTExpert(cks["r1"], backend=BACKEND, grid=GRID, smax=128, key_chunk=1, keep_host=True)
    e.bind(ctx)
    ops, chunks = dict(e.ops), e.buf["kv_chunks"]
    other = synth.make_context(tmp_path / "short.safetensors", synth.TINY,
                               synth.CtxSpec(valid_len=(20, 30, 11), P=30, v0=(3.0, 1.0, 2.0), motion="v0"))
    e.bind(other)
    assert all(e.ops[k] is ops[k] for k in ops) and e.buf["kv_chunks"] is chunks
    # The attention's run-time bound follows the new lengths: the layer still gives the reference's result.
    assert down(e.rt, chunks)[::32, 0].tolist() == [-(-s // 32) for s in e._bound.S]
    B, Tp = e._bound.B, e.Tp
    x = round_bf16(torch.randn(B, Tp, e.D, generator=torch.Generator().manual_seed(6)))
    e._write(e.buf["x"], x.reshape(-1, e.D))
    e.run_layer(0)
    ref, _, _ = R.layer(x, e.host_layers[0], e.k_host[0], e.v_host[0], e.keep, e.cos_host, e.sin_host, e.Hq,
                        e.Hkv, e.d, e.eps)
    close(down(e.rt, e.buf["x"]).reshape(B, Tp, e.D), ref, rel=1e-4)
    with pytest.raises(InvalidArgumentError, match="S <= Smax - 32"):
        TTExpert(cks["r1"], backend=BACKEND, grid=GRID, key_chunk=1, smax=64).bind(ctx)


@pytest.mark.skipif(BACKEND != "tt-sim", reason="the refusal of a machine without a Blackhole")
def test_refusals(tiny):
    cks, _ = tiny
    with pytest.raises(UnsupportedError, match="backend tt"):
        TTExpert(cks["r1"], backend="tt")
    with pytest.raises(InvalidArgumentError, match="weights"):
        TTExpert(cks["r1"], weights="bfp4_b")
    with pytest.raises(InvalidArgumentError, match="cache"):
        TTExpert(cks["r1"], cache="bfp4_b")


def test_module_weights_are_the_loaders(tiny):
    """Model.tensors() (what the TT backend converts) holds the checkpoint's values under weights.h's names."""
    cks, _ = tiny
    w = _core.Model(str(cks["a2"]), backend="reference").tensors()
    L = synth.TINY.L
    assert {f"layers.{l}.{n}" for l in range(L) for n in ("q", "k", "v", "o", "gate", "up", "down")} <= set(w)
    assert np.asarray(w["layers.0.q"]).shape == (synth.TINY.Hq * synth.TINY.d, synth.TINY.D)
    one = _core.Model(str(cks["a2"]), backend="reference").tensors("layers.1.")
    assert set(one) == {k for k in w if k.startswith("layers.1.")} and len(one) == 11
    assert all(np.array_equal(one[k], w[k]) for k in one)


def test_cli_sample_result_file(tiny, tmp_path):
    """python -m alpamayo_expert.tt sample writes the CLI's result file; --seed draws the engine's noise; --kv
    picks the device cache's format."""
    from safetensors import safe_open

    from alpamayo_expert.tt.__main__ import main
    cks, ctx = tiny
    out, js = tmp_path / "r.safetensors", tmp_path / "r.json"
    assert main(["sample", "--checkpoint", str(cks["r1"]), "--context", str(ctx), "--out", str(out), "--seed", "7",
                 "--steps", "1", "--all-steps", "--grid", "4x2", "--json", str(js), "--backend", BACKEND,
                 "--kv", "bfp8_b"]) == 0
    s = Model(str(cks["r1"]), backend="reference", weights="bfp8_b").session()
    s.bind(Context.open(str(ctx)))
    r = s.sample(seed=7, steps=1, all_steps=True)
    with safe_open(str(out), framework="np") as f:
        assert set(f.keys()) == {"action", "xyz", "yaw", "rot", "v0", "x_steps", "v_steps"}
        meta = f.metadata()
        assert np.array_equal(f.get_tensor("x_steps")[0], np.asarray(r.x_steps)[0])
        assert np.array_equal(f.get_tensor("v0"), np.asarray(r.v0, dtype=np.float32))
        assert np.abs(f.get_tensor("v_steps") - np.asarray(r.v_steps)).max() < V_ABS_CACHE8
        assert f.get_tensor("rot").shape == np.asarray(r.rot).shape
    assert meta["backend"] == BACKEND and meta["weights"] == "bfp8_b" and meta["steps"] == "1"
    assert meta["kv"] == "bfp8_b"
    assert meta["v0_source"] == r.v0_source
    if BACKEND == "tt-sim":  # no Blackhole here: refused with a message, exit status 2
        assert main(["sample", "--checkpoint", str(cks["r1"]), "--context", str(ctx), "--out", str(tmp_path / "x"),
                     "--backend", "tt"]) == 2


def test_performance_model_against_the_seed():
    """The model's formulas on the seed's own ops land within 30% of its measured op table; its fused layer's
    weight traffic is the seed's 40.5 MB; the fused layer is estimated faster than the seed's 521 us, and a step
    with the bfp8_b cache under 15 ms."""
    from dataclasses import replace

    from alpamayo_expert.tt import perf_model as P
    s = P.Shape()
    for op in P.seed_ops(s):
        assert 0.7 <= op.us() / P.SEED_US[op.name] <= 1.3, (op.name, op.us(), P.SEED_US[op.name])
    fused = P.fused_ops(s)
    own_kv = 2 * s.B * s.T * s.Hkv * s.d * s.kv_bytes   # (a) writes the own K/V rows into the DRAM caches
    weights = sum(op.dram for op in fused if op.name[1] in "adef") - own_kv
    assert abs(weights / 40.5e6 - 1) < 0.02
    assert sum(op.us() for op in fused) < 521
    assert P.step_ms(s) < P.SEED_STEP_MS
    assert P.step_ms(replace(s, kv_bytes=1088 / 1024)) < 15.0
    # Attention reads the chunks holding the S context rows and the own tail's chunk, whatever Smax is.
    attn = lambda v: next(op for op in P.fused_ops(v) if op.name.startswith("(c) attention, partials"))  # noqa: E731
    # The mask only for the chunk holding S's boundary and the own tail's (S = 4,700 is not a chunk multiple),
    # plus those holding left padding.
    chunk = s.key_chunk * 32
    rows = (-(-s.S // chunk) + 1) * chunk
    kv_row, mask_row = 2 * s.B * s.Hkv * s.d * s.kv_bytes, s.B * s.Hkv * 32 * s.act_bytes
    # The mask lives in L1: NoC bytes, not DRAM.
    assert attn(s).dram == rows * kv_row == attn(replace(s, smax=5120)).dram
    assert attn(replace(s, pad=chunk + 1)).dram == attn(s).dram
    assert attn(replace(s, pad=chunk + 1)).noc - attn(s).noc == 2 * chunk * mask_row
    assert attn(replace(s, S=None)).dram == s.smax * kv_row
    # Every weight byte is read once per operation at B = 1; with B = 16 (32 row tiles, 8 per unit) 4 times.
    weights_16 = sum(op.dram for op in P.fused_ops(replace(s, B=16)) if op.name[1] in "def")
    assert weights_16 == 4 * sum(op.dram for op in fused if op.name[1] in "def")


def test_action_in_proj_is_the_engines(tiny):
    """The host's action_in_proj (the checkpoint's weights from the engine's loader, bf16-rounded default Fourier
    frequencies) against the embedding the engine's reference backend captures at step 0."""
    cks, ctx = tiny
    for layout in ("r1", "a2"):
        e = TTExpert(cks[layout], backend=BACKEND, grid=GRID)
        s = Model(str(cks[layout]), backend="reference").session()
        s.bind(Context.open(str(ctx)), capture_step=0, capture_layers=False)
        noise = synth.make_noise(3, synth.TINY)
        s.sample(noise=noise.numpy(), steps=1)
        close(e.action_in_proj(noise, torch.zeros(3)), s.captures()["emb"])


def test_shared_prompts_left_padding_and_suffixes(tiny, tmp_path):
    """A context of 2 prompts shared by 3 samples, one prompt left-padded, per-sample suffix rows: v_0 against the
    engine's reference backend (the device holds each sample's rows, prompt then suffix, and nothing else)."""
    cks, _ = tiny
    spec = synth.CtxSpec(valid_len=(37, 50), prefix_pad=(3, 0), prompt_index=(0, 1, 1), suffix_len=(5, 0, 9),
                         suffix_rows=9, rope_delta=(5, -11, 0))
    ctx = synth.make_context(tmp_path / "shared.safetensors", synth.TINY, spec)
    e = TTExpert(cks["r1"], backend=BACKEND, grid=GRID, key_chunk=1)
    e.bind(ctx)
    assert e._bound.S == [42, 50, 59] and e._bound.pads == [3, 0, 0]
    s = Model(str(cks["r1"]), backend="reference", weights="bfp8_b").session()
    s.bind(Context.open(str(ctx)))
    noise = synth.make_noise(3, synth.TINY)
    r = s.sample(noise=noise.numpy(), steps=1, all_steps=True)
    v = e.step(noise, 0.0).numpy()
    assert np.abs(v - np.asarray(r.v_steps)[0]).max() < V_ABS
    assert pcc(v, np.asarray(r.v_steps)[0]) > V_PCC


def test_simulator_leaves_torch_dtypes(rt):
    """tt-lang-sim rebinds torch.bfloat16 / float16 to float32 on import; the runtime puts them back, so the tests
    that run after these in one process keep real bf16."""
    assert torch.bfloat16 is not torch.float32 and torch.float16 is not torch.float32
    assert torch.tensor([1.0 + 2 ** -10]).to(torch.bfloat16).item() == 1.0
