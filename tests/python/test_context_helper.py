"""write_context on a real transformers cache: a tiny Qwen3-VL text model prefills two padded prompts;
the dumped file must round-trip exactly and drive the engine to the oracle's result."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

from alpamayo_expert import cache_layers, read_context, write_context, write_noise
from cli import REFERENCE, sample
from oracle import ExpertContext, Oracle, load_checkpoint
from synth import TINY, make_checkpoint, make_noise
from verify import verify_sample

LENGTHS = (13, 20)      # prompt lengths; right padding to P = 20 (rows >= S_b are padding)
DELTAS = (0, -4)        # M-RoPE offsets: sample 1's positions lag its indices, as with image tokens


def _vlm() -> Qwen3VLTextModel:
    torch.manual_seed(0)
    cfg = Qwen3VLTextConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=TINY.L,
                            num_attention_heads=4, num_key_value_heads=TINY.Hkv, head_dim=TINY.d,
                            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                                "mrope_section": [6, 5, 5]})
    cfg._attn_implementation = "eager"
    m = Qwen3VLTextModel(cfg).eval()
    with torch.no_grad():  # O(1) activations; the default init (std 0.02) would give near-constant keys
        for n, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1 / p.shape[1] ** 0.5 if "embed" not in n else 1.0)
    return m


@pytest.fixture(scope="module")
def prefilled():
    """A DynamicCache from a real, padded prefill, and the positions each sample used."""
    m = _vlm()
    B, P = len(LENGTHS), max(LENGTHS)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (B, P), generator=g)
    mask = torch.zeros(B, P, dtype=torch.long)
    for b, s in enumerate(LENGTHS):
        mask[b, :s] = 1
        ids[b, s:] = 0  # pad token
    pos = torch.arange(P)[None, :] + torch.tensor(DELTAS)[:, None]
    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(input_ids=ids, attention_mask=mask, position_ids=pos[None].expand(3, -1, -1), cache=cache, use_cache=True)
    assert cache.get_seq_length() == P
    return cache


def test_roundtrip_exact(prefilled, tmp_path):
    p = tmp_path / "ctx.safetensors"
    write_context(p, prefilled, LENGTHS, DELTAS, v0=[4.0, 11.0])
    ctx = read_context(p)
    assert ctx.num_layers == TINY.L
    for l, layer in enumerate(prefilled.layers):
        assert ctx.keys[l].dtype == layer.keys.dtype and torch.equal(ctx.keys[l], layer.keys)
        assert torch.equal(ctx.values[l], layer.values)
    assert ctx.valid_len.dtype == torch.int64 and ctx.valid_len.tolist() == list(LENGTHS)
    assert ctx.rope_delta.dtype == torch.int64 and ctx.rope_delta.tolist() == list(DELTAS)
    assert ctx.v0.tolist() == [4.0, 11.0] and ctx.ego_history_xyz is None


@pytest.mark.parametrize("dtype", ["bf16", torch.float16])
def test_roundtrip_converted(prefilled, tmp_path, dtype):
    p = tmp_path / "ctx.safetensors"
    write_context(p, prefilled, LENGTHS, DELTAS, dtype=dtype)
    want = {"bf16": torch.bfloat16}.get(dtype, dtype)
    ctx = read_context(p)
    for l, layer in enumerate(prefilled.layers):
        assert torch.equal(ctx.keys[l], layer.keys.to(want)) and torch.equal(ctx.values[l], layer.values.to(want))


def test_list_of_pairs_same_file_content(prefilled, tmp_path):
    write_context(tmp_path / "a.safetensors", prefilled, LENGTHS, DELTAS)
    write_context(tmp_path / "b.safetensors", cache_layers(prefilled), LENGTHS, DELTAS)
    a, b = read_context(tmp_path / "a.safetensors"), read_context(tmp_path / "b.safetensors")
    assert all(torch.equal(x, y) for x, y in zip(a.keys + a.values, b.keys + b.values))


def test_engine_on_real_cache(cli, prefilled, tmp_path):
    ck_dir = make_checkpoint(tmp_path / "ck", TINY, "r1", "bf16")
    ctx_path = tmp_path / "ctx.safetensors"
    write_context(ctx_path, prefilled, LENGTHS, DELTAS, dtype="bf16", v0=[4.0, 11.0])
    noise = make_noise(2, TINY)
    write_noise(tmp_path / "noise.safetensors", noise)
    res = sample(cli, ck_dir, ctx_path, tmp_path, noise=tmp_path / "noise.safetensors")
    ck, ctx = load_checkpoint(ck_dir), read_context(ctx_path)
    verify_sample(ck, Oracle(ck, ExpertContext.from_file_context(ctx)), res, noise, ck.steps, REFERENCE,
                  v0_given=ctx.v0).assert_ok()


# ---- errors
def _kv(B=2, Hkv=2, P=20, d=32, L=2):
    return [(torch.randn(B, Hkv, P, d), torch.randn(B, Hkv, P, d)) for _ in range(L)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(valid_len=[13, 20, 5], rope_delta=[0, 0]), "valid_len has 3 entries"),
    (dict(valid_len=[13, 20], rope_delta=[0]), "rope_delta has 1 entries"),
    (dict(valid_len=[13, 21], rope_delta=[0, 0]), r"valid_len must be in \[1, P=20\]"),
    (dict(valid_len=[0, 20], rope_delta=[0, 0]), "valid_len must be in"),
    (dict(valid_len=[13.0, 20.0], rope_delta=[0, 0]), "valid_len must be integers"),
    (dict(valid_len=[13, 20], rope_delta=[0, 0], v0=[1.0, 2.0], ego_history_xyz=torch.zeros(2, 4, 3),
          ego_history_rot=torch.eye(3).expand(2, 4, 3, 3)), "either the ego history or v0"),
    (dict(valid_len=[13, 20], rope_delta=[0, 0], ego_history_xyz=torch.zeros(2, 4, 3)), "together"),
    (dict(valid_len=[13, 20], rope_delta=[0, 0], v0=[1.0]), r"v0: expected shape \(2,\)"),
    (dict(valid_len=[13, 20], rope_delta=[0, 0], dtype=torch.int8), "bf16, f16 or f32"),
])
def test_write_context_rejects(tmp_path, kwargs, match):
    p = tmp_path / "ctx.safetensors"
    with pytest.raises(ValueError, match=match):
        write_context(p, _kv(), **kwargs)
    assert not p.exists() and not list(tmp_path.iterdir()), "nothing may be written on error"


def test_write_context_rejects_mismatched_layers(tmp_path):
    kv = _kv()
    kv[1] = (torch.randn(3, 2, 20, 32), torch.randn(3, 2, 20, 32))  # B differs in layer 1
    with pytest.raises(ValueError, match="layer 1"):
        write_context(tmp_path / "c.safetensors", kv, [13, 20], [0, 0])
    kv[1] = (torch.randn(2, 2, 20, 16), torch.randn(2, 2, 20, 16))  # d differs
    with pytest.raises(ValueError, match="layer 1"):
        write_context(tmp_path / "c.safetensors", kv, [13, 20], [0, 0])
    kv[1] = (torch.randn(2, 2, 20, 32), torch.randn(2, 2, 19, 32))  # K/V differ
    with pytest.raises(ValueError, match="key shape"):
        write_context(tmp_path / "c.safetensors", kv, [13, 20], [0, 0])


def test_write_context_nan_only_matters_in_valid_rows(tmp_path):
    kv = _kv()
    kv[0][0][0, 1, 15, 3] = float("nan")   # sample 0 row 15 >= S_0 = 13: padding, ignored
    write_context(tmp_path / "ok.safetensors", kv, [13, 20], [0, 0])
    kv[1][1][1, 0, 19, 0] = float("inf")   # sample 1 row 19 < S_1 = 20: valid
    with pytest.raises(ValueError, match="layer 1 value.*sample 1"):
        write_context(tmp_path / "bad.safetensors", kv, [13, 20], [0, 0])


def test_overwrite_is_atomic(tmp_path):
    """A failed write leaves the previous file intact."""
    p = tmp_path / "ctx.safetensors"
    write_context(p, _kv(), [13, 20], [0, 0])
    before = p.read_bytes()
    with pytest.raises(ValueError):
        write_context(p, _kv(), [13, 99], [0, 0])
    assert p.read_bytes() == before
