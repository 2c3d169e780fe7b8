"""Context.from_paged over torch tensors as serving engines hold their caches, read in place: vLLM (per layer
[2, num_blocks, block_size, H, d], K and V split by indexing), FlashInfer (per layer [num_pages, 2, page_size, H, d],
K and V combined), TensorRT-LLM (one pool for all layers [num_blocks, L, 2, H, page_size, d], HND), SGLang (page
size 1 with a token index table, one pool for all layers). Each is bitwise equal to the dense Context of the same
rows, on the reference and cpu backends; samples that share their leading pages are bound as one shared prompt."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import alpamayo_expert as ae
from synth import TINY, make_checkpoint

L, H, D = TINY.L, TINY.Hkv, TINY.d


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("paged") / "ck", TINY, "a2", "bf16")


def _rows(lens, shared=0, seed=0):
    """Per layer, K and V rows of each sample [len, H, d] (bf16); the first `shared` rows equal for all samples."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(L):
        kv = []
        for _ in range(2):
            common = torch.randn(shared, H, D, generator=g)
            kv.append([torch.cat([common, torch.randn(n - shared, H, D, generator=g)]).bfloat16() for n in lens])
        out.append(kv)
    return out


def _pages(lens, page, shared_pages=0, holes=3, seed=1):
    """A shuffled page assignment: sample b's logical pages (the first shared_pages common to all) -> pool pages."""
    rng = np.random.default_rng(seed)
    need = shared_pages + sum(-(-n // page) - shared_pages for n in lens)
    perm = rng.permutation(need + holes)
    table, nxt = [], shared_pages
    for n in lens:
        own = -(-n // page) - shared_pages
        table.append([int(perm[p]) for p in range(shared_pages)] + [int(perm[nxt + i]) for i in range(own)])
        nxt += own
    width = max(len(t) for t in table) + 1
    return need + holes, [t + [-1] * (width - len(t)) for t in table]


def _fill(pool, rows, table, page, hnd):
    """pool [num_pages, page, H, d] (NHD) or [num_pages, H, page, d] (HND) views of one layer's K or V."""
    for b, r in enumerate(rows):
        for i in range(r.shape[0]):
            p, o = table[b][i // page], i % page
            if hnd:
                pool[p, :, o] = r[i]
            else:
                pool[p, o] = r[i]


def _dense(rows, lens):
    """The dense binding of the same rows: per layer [B, H, P, d], NaN past each sample's rows."""
    P = max(lens)
    keys, values = [], []
    for l in range(L):
        for kv, out in ((0, keys), (1, values)):
            t = torch.full((len(lens), H, P, D), float("nan"), dtype=torch.bfloat16)
            for b, r in enumerate(rows[l][kv]):
                t[b, :, : r.shape[0]] = r.transpose(0, 1)
            out.append(t)
    return ae.Context(keys, values, lens, [-2] * len(lens), v0=[4.0] * len(lens))


def _sample(model, ctx):
    s = model.session()
    s.bind(ctx)
    return s.sample(seed=3).action


@pytest.fixture(scope="module", params=["reference", "cpu"])
def model(request, ck):
    if request.param not in [b[0] for b in ae.backends()]:
        pytest.skip(f"{request.param} not built")
    return ae.Model(str(ck), backend=request.param, threads=2 if request.param == "cpu" else 0)


@pytest.mark.parametrize("engine", ["vllm", "flashinfer_nhd", "trtllm_hnd", "sglang"])
def test_engine_layouts_equal_the_dense_binding(model, engine):
    lens = [37, 5, 20]
    page = {"vllm": 16, "flashinfer_nhd": 16, "trtllm_hnd": 8, "sglang": 1}[engine]
    hnd = engine == "trtllm_hnd"
    rows = _rows(lens)
    n, table = _pages(lens, page)
    nan = float("nan")
    bt = torch.tensor(table, dtype=torch.int32 if engine == "vllm" else torch.int64)
    if engine == "vllm":  # per layer [2, num_blocks, block_size, H, d]; K = kv[0], V = kv[1]
        caches = [torch.full((2, n, page, H, D), nan, dtype=torch.bfloat16) for _ in range(L)]
        for l in range(L):
            for kv in range(2):
                _fill(caches[l][kv], rows[l][kv], table, page, False)
        ctx = ae.Context.from_paged([c[0] for c in caches], [c[1] for c in caches], bt, lens, [-2] * 3,
                                    layout="NHD", v0=[4.0] * 3)
        assert {v[1] for v in ctx.views()} == {c[kv].data_ptr() for c in caches for kv in range(2)}
    elif engine == "sglang":  # one pool for all layers [L, tokens, H, d], a token index table (page size 1)
        kpool = torch.full((L, n, H, D), nan, dtype=torch.bfloat16)
        vpool = torch.full((L, n, H, D), nan, dtype=torch.bfloat16)
        for l in range(L):
            _fill(kpool[l].unsqueeze(1), rows[l][0], table, 1, False)
            _fill(vpool[l].unsqueeze(1), rows[l][1], table, 1, False)
        ctx = ae.Context.from_paged([kpool[l].unsqueeze(1) for l in range(L)],
                                    [vpool[l].unsqueeze(1) for l in range(L)], bt, lens, [-2] * 3, v0=[4.0] * 3)
    elif engine == "flashinfer_nhd":  # per layer [num_pages, 2, page, H, d], K and V combined
        caches = [torch.full((n, 2, page, H, D), nan, dtype=torch.bfloat16) for _ in range(L)]
        for l in range(L):
            for kv in range(2):
                _fill(caches[l][:, kv], rows[l][kv], table, page, False)
        ctx = ae.Context.from_paged(caches, None, bt, lens, [-2] * 3, v0=[4.0] * 3)
    else:  # TensorRT-LLM: one pool for all layers [num_blocks, L, 2, H, page, d]; layer l is pool[:, l]
        pool = torch.full((n, L, 2, H, page, D), nan, dtype=torch.bfloat16)
        for l in range(L):
            for kv in range(2):
                _fill(pool[:, l, kv], rows[l][kv], table, page, True)
        ctx = ae.Context.from_paged([pool[:, l] for l in range(L)], None, bt, lens, [-2] * 3, layout="HND",
                                    v0=[4.0] * 3)
    assert ctx.paged and ctx.prompts == 3
    assert np.array_equal(_sample(model, ctx), _sample(model, _dense(rows, lens)))


def test_shared_pages_become_a_shared_prompt(model):
    """Three samples of one prompt (n > 1 sampling, prefix caching): the prompt's pages bound once; the result
    equals the dense binding that expresses the same sharing with prompt_index and suffix rows."""
    page, lens, shared = 16, [40, 50, 32], 2
    rows = _rows(lens, shared=shared * page, seed=5)
    n, table = _pages(lens, page, shared_pages=shared, seed=2)
    caches = [torch.full((n, 2, page, H, D), float("nan"), dtype=torch.bfloat16) for _ in range(L)]
    for l in range(L):
        for kv in range(2):
            _fill(caches[l][:, kv], rows[l][kv], table, page, False)
    ctx = ae.Context.from_paged(caches, None, torch.tensor(table), lens, [-2] * 3, v0=[4.0] * 3)
    assert (ctx.prompts, ctx.prompt_index, ctx.valid_len) == (1, [0, 0, 0], [32])
    assert ctx.suffix_len == [8, 18, 0] and ctx.offsets == lens
    P = Q = len(table[0]) * page
    keys, values, skeys, svalues = [], [], [], []
    for l in range(L):
        for kv, pk, sk in ((0, keys, skeys), (1, values, svalues)):
            p = torch.full((1, H, P, D), float("nan"), dtype=torch.bfloat16)
            p[0, :, :32] = rows[l][kv][0][:32].transpose(0, 1)
            s = torch.full((3, H, Q, D), float("nan"), dtype=torch.bfloat16)
            for b in range(3):
                s[b, :, : lens[b] - 32] = rows[l][kv][b][32:].transpose(0, 1)
            pk.append(p)
            sk.append(s)
    dense = ae.Context(keys, values, [32], [-2] * 3, prompt_index=[0, 0, 0], suffix_keys=skeys, suffix_values=svalues,
                       suffix_len=[8, 18, 0], v0=[4.0] * 3)
    assert np.array_equal(_sample(model, ctx), _sample(model, dense))


def test_errors_name_the_tensor_and_the_page():
    pool = torch.zeros(4, 4, H, D, dtype=torch.bfloat16)
    ok = torch.tensor([[0, 3], [1, 2]])
    ae.Context.from_paged([pool] * L, [pool] * L, ok, [8, 5], [0, 0])
    with pytest.raises(ae.InvalidArgumentError, match=r"block_table\[0, 1\] = 4 is outside the pool .*key_pages\[0\]"):
        ae.Context.from_paged([pool] * L, [pool] * L, torch.tensor([[0, 4], [1, 2]]), [8, 5], [0, 0])
    with pytest.raises(ae.InvalidArgumentError, match=r"valid_len\[1\] = 9 needs more than the 2 pages"):
        ae.Context.from_paged([pool] * L, [pool] * L, ok, [8, 9], [0, 0])
    with pytest.raises(ae.InvalidArgumentError, match=r"value_pages\[0\]: 1 KV heads"):
        ae.Context.from_paged([pool] * L, [pool[:, :, :1]] * L, ok, [8, 5], [0, 0])
    with pytest.raises(ae.InvalidArgumentError, match=r"block_table must be int32 or int64"):
        ae.Context.from_paged([pool] * L, [pool] * L, ok.float(), [8, 5], [0, 0])
    with pytest.raises(ae.InvalidArgumentError, match=r"block_table must be int32 or int64"):
        ae.Context.from_paged([pool] * L, [pool] * L, ok.numpy().astype(np.int16), [8, 5], [0, 0])
    with pytest.raises(ae.InvalidArgumentError, match=r"block_table must be a \[B, max_pages\]"):
        ae.Context.from_paged([pool] * L, [pool] * L, "pages", [8, 5], [0, 0])
    with pytest.raises(ae.InvalidArgumentError, match=r"layout must be"):
        ae.Context.from_paged([pool] * L, [pool] * L, ok, [8, 5], [0, 0], layout="THD")
    # A row in use holding NaN: NonFiniteError naming the page.
    bad = pool.clone()
    bad[3, 1, 0, 0] = float("nan")
    with pytest.raises(ae.NonFiniteError, match=r"page 3"):
        ae.Context.from_paged([bad] * L, [pool] * L, ok, [8, 5], [0, 0])


def test_sample_trajectories_takes_a_paged_context(model):
    """The rollout's expert stage on a paged context: the session's result for the same noise, in the release's
    [G, ns, nj, T, ...] shape."""
    page, lens = 16, [40, 50, 32]
    rows = _rows(lens, shared=32, seed=6)
    n, table = _pages(lens, page, shared_pages=2, seed=3)
    caches = [torch.full((n, 2, page, H, D), float("nan"), dtype=torch.bfloat16) for _ in range(L)]
    for l in range(L):
        for kv in range(2):
            _fill(caches[l][:, kv], rows[l][kv], table, page, False)
    t = torch.linspace(-1.5, 0, 16)
    xyz = torch.stack([4 * t, 0.1 * t, 0 * t], -1).expand(3, 16, 3).contiguous()
    rot = torch.eye(3).expand(3, 16, 3, 3).contiguous()
    ctx = ae.Context.from_paged(caches, None, torch.tensor(table, dtype=torch.int32), lens, [-2] * 3,
                                ego_history_xyz=xyz, ego_history_rot=rot)
    xyz_out, rot_out, action = ae.sample_trajectories(model, ctx, None, ego_history_xyz=None, ego_history_rot=None,
                                                      num_traj_samples=3, use_classifier_free_guidance=False,
                                                      generator=torch.Generator().manual_seed(9))
    cfg = model.config
    noise = torch.randn(3, cfg["n_waypoints"], cfg["action_dims"], generator=torch.Generator().manual_seed(9))
    s = model.session()
    s.bind(ctx)
    want = s.sample(noise=noise)
    assert action.shape == (1, 1, 3, cfg["n_waypoints"], cfg["action_dims"])
    assert np.array_equal(action.reshape(3, *action.shape[3:]).numpy(), want.action)
    assert np.array_equal(xyz_out.reshape(3, *xyz_out.shape[3:]).numpy(), want.xyz)
