"""The CLI on contexts with shared prompts, suffixes, left padding, guidance and temperature, against the
transformers oracle (every backend), and its refusals of bad input (clear message, nothing written).

The oracle expands each context into the per-sample row sets the release holds (each prompt copied once per
sample, then the sample's suffix rows; left padding and rows past the offset masked) and runs transformers'
Qwen3VLTextModel over them; guidance combines two oracles as FlowMatching._guided_v does."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from alpamayo_expert import read_context, write_noise
from cli import REFERENCE, run, sample
from conftest import require_features, spec_features
import error_model as em
from compare import Checks, max_abs
from oracle import ExpertContext, GuidedOracle, Oracle, load_checkpoint
from synth import TINY, CtxSpec, make_checkpoint, make_context, make_noise
from verify import format_unit, verify_sample

# Two prompts (left padding 6 and 0 rows) shared by five samples with reasoning suffixes of 0..9 rows.
SHARED = CtxSpec(valid_len=(40, 31), P=44, prefix_pad=(6, 0), prompt_index=(0, 1, 0, 1, 0),
                 rope_delta=(-7, 3, -7, 3, -7), suffix_rows=10, suffix_len=(9, 0, 4, 10, 1), motion="history")
# The unguided context: the same samples over shorter prompts (the navigation text removed).
UNGUIDED = replace(SHARED, valid_len=(33, 25), prefix_pad=(2, 0), rope_delta=(-4, 1, -4, 1, -4), seed=11)
LEFT_PAD = CtxSpec(valid_len=(37, 50, 23), prefix_pad=(5, 0, 11), motion="v0")

CASES = {
    "shared-prompts-suffixes-left-padding": dict(spec=SHARED),
    "left-padding": dict(spec=LEFT_PAD),
    "guidance-w2.5": dict(spec=SHARED, unguided=UNGUIDED, weight=2.5),
    "guidance-w0-is-unguided": dict(spec=SHARED, unguided=UNGUIDED, weight=0.0),
    "temperature-0.6": dict(spec=SHARED, temperature=0.6),
    "guidance-temperature-0.3": dict(spec=SHARED, unguided=UNGUIDED, weight=1.5, temperature=0.3),
}


def _oracle(ck, path):
    return Oracle(ck, ExpertContext.from_file_context(read_context(path)))


@pytest.mark.every_kernel
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_oracle(cli, tmp_path, case, backend):
    c = CASES[case]
    require_features(backend, *spec_features(c["spec"], "unguided" in c))
    spec = c["spec"]
    ck_dir = make_checkpoint(tmp_path / "ck", TINY, "1.5", "bf16")
    path = make_context(tmp_path / "ctx.safetensors", TINY, spec)
    noise = make_noise(spec.B, TINY, 6)
    write_noise(tmp_path / "noise.safetensors", noise)
    extra = []
    temp = c.get("temperature", 1.0)
    if temp != 1.0:
        extra += ["--temperature", temp]
    ck = load_checkpoint(ck_dir, weights=backend.weights)
    oracle = _oracle(ck, path)
    if "unguided" in c:
        upath = make_context(tmp_path / "unguided.safetensors", TINY, c["unguided"])
        extra += ["--guidance-context", upath, "--guidance-weight", c["weight"]]
        oracle = GuidedOracle(oracle, _oracle(ck, upath), c["weight"])
    res = sample(cli, ck_dir, path, tmp_path, backend=backend, noise=tmp_path / "noise.safetensors", extra=extra)
    x0 = noise * torch.tensor(temp, dtype=torch.float32)  # the release's randn * temperature, in fp32
    ctx = read_context(path)
    verify_sample(ck, oracle, res, x0, ck.steps, backend, ego_xyz=ctx.ego_history_xyz, ego_rot=ctx.ego_history_rot,
                  v0_given=ctx.v0).assert_ok()
    if case == "guidance-w0-is-unguided" and backend.name == "reference":
        plain = sample(cli, ck_dir, tmp_path / "unguided.safetensors", tmp_path / "u", backend=backend,
                       noise=tmp_path / "noise.safetensors", layers=False)
        assert max_abs(plain["action"], res["action"]) < 1e-5  # w = 0: v = v_unguided


def test_shared_prompt_equals_its_copies(cli, tmp_path, backend):
    """The shared form gives what the same rows laid out once per sample give (the release's layout)."""
    require_features(backend, *spec_features(SHARED))
    ck_dir = make_checkpoint(tmp_path / "ck", TINY, "a2", "bf16")
    path = make_context(tmp_path / "ctx.safetensors", TINY, SHARED)
    e = ExpertContext.from_file_context(read_context(path))
    f = read_context(path)
    from alpamayo_expert import write_context
    write_context(tmp_path / "copies.safetensors", list(zip(e.keys, e.values)), e.valid_len, e.rope_delta,
                  f.ego_history_xyz, f.ego_history_rot, prefix_pad=e.lo)
    write_noise(tmp_path / "noise.safetensors", make_noise(SHARED.B, TINY))
    a = sample(cli, ck_dir, path, tmp_path / "a", backend=backend, noise=tmp_path / "noise.safetensors")
    b = sample(cli, ck_dir, tmp_path / "copies.safetensors", tmp_path / "b", backend=backend,
               noise=tmp_path / "noise.safetensors")
    if backend.name == "reference":  # the same fp32 sums in either layout
        assert max_abs(a["action"], b["action"]) < 1e-5
        return
    # The cascade over a shared prompt merges its partial softmaxes elsewhere than the per-sample copies do, so the
    # two round differently: each lies within rho of the exact result (the error model), the two within 2 rho. Step 0
    # (the same x_0) is compared; later steps carry the sampler's gain.
    unit = format_unit(load_checkpoint(ck_dir, weights=backend.weights), backend, SHARED.P + SHARED.suffix_rows + TINY.T)
    checks = Checks()
    for name, depth in [(f"layer.{l}", l + 2) for l in range(TINY.L)] + [("hidden", TINY.L + 1)]:
        ref = b["layers"][name]
        checks.add(name, a["layers"][name], ref, em.max_abs_bound(2 * unit.rho(depth), ref),
                   em.pcc_floor(2 * unit.rho(depth), ref))
    v_a, v_b = a["v_steps"][0], b["v_steps"][0]
    checks.add("v_0", v_a, v_b, em.max_abs_bound(2 * unit.rho(TINY.L + 2), v_b), em.pcc_floor(2 * unit.rho(TINY.L + 2), v_b))
    checks.note(f"free-running action: max|d| {max_abs(a['action'], b['action']):.3e}")
    checks.assert_ok()


def test_per_sample_seeds_are_reproducible_alone(cli, tmp_path):
    """--seeds: sample b's noise is its own stream: the same as sampling it alone with that seed."""
    ck_dir = make_checkpoint(tmp_path / "ck", TINY, "r1", "bf16")
    path = make_context(tmp_path / "ctx.safetensors", TINY, SHARED)
    res = sample(cli, ck_dir, path, tmp_path / "all", layers=False, extra=["--seeds", "5,6,7,8,9"])
    for b, s in enumerate((5, 6, 7, 8, 9)):
        one = sample(cli, ck_dir, path, tmp_path / f"s{b}", layers=False, extra=["--seeds", f"{s},1,1,1,1"])
        assert torch.equal(one["x_steps"][0][0], res["x_steps"][0][b])
    t = sample(cli, ck_dir, path, tmp_path / "t", layers=False, extra=["--seeds", "5,6,7,8,9", "--temperature", "0.5"])
    assert torch.equal(t["x_steps"][0], res["x_steps"][0] * torch.tensor(0.5))


# ---- bad input: a message naming what is wrong, exit 1, nothing written
@pytest.fixture()
def files(tmp_path):
    ck = make_checkpoint(tmp_path / "ck", TINY, "1.5", "f32")
    ctx = make_context(tmp_path / "ctx.safetensors", TINY, SHARED)
    unguided = make_context(tmp_path / "unguided.safetensors", TINY, UNGUIDED)
    return dict(ck=ck, ctx=ctx, unguided=unguided, tmp=tmp_path)


def expect_error(cli, f, *must_name, extra=(), context=None):
    out = f["tmp"] / "out.safetensors"
    seed = [] if "--seeds" in extra else ["--seed", 1]
    args = ["sample", "--checkpoint", f["ck"], "--context", context or f["ctx"], "--out", out, *seed,
            "--all-steps", *extra]
    r = run(cli, *args, timeout=120)
    cmd = " ".join(map(str, [cli, *args]))
    assert r.returncode > 0, f"expected an error exit for: {cmd}\nstderr: {r.stderr}"
    for name in must_name:
        assert str(name) in r.stderr, f"stderr should name {name!r}; got:\n{r.stderr}\ncommand: {cmd}"
    leftovers = [p.name for p in f["tmp"].iterdir() if p.name.startswith(("out", ".out"))]
    assert not leftovers, f"outputs left behind by: {cmd}: {leftovers}"


def _edit(path, **changes):
    t = load_file(str(path))
    for k, v in changes.items():
        if v is None:
            t.pop(k)
        else:
            t[k] = v
    save_file(t, str(path))


def test_sanity_valid_guided_case_runs(cli, files):
    r = run(cli, "sample", "--checkpoint", files["ck"], "--context", files["ctx"], "--out",
            files["tmp"] / "ok.safetensors", "--guidance-context", files["unguided"], "--guidance-weight", 2)
    assert r.returncode == 0, r.stderr


def test_sample_naming_a_prompt_that_does_not_exist(cli, files):
    _edit(files["ctx"], prompt_index=torch.tensor([0, 1, 2, 1, 0]))
    expect_error(cli, files, "ctx.safetensors", "prompt_index[2] = 2", "G = 2")


def test_negative_prompt_index(cli, files):
    _edit(files["ctx"], prompt_index=torch.tensor([0, -1, 0, 1, 0]))
    expect_error(cli, files, "ctx.safetensors", "prompt_index[1] = -1")


@pytest.mark.parametrize("lens, bad", [((9, 0, 4, 11, 1), "suffix_len[3] = 11"), ((9, -1, 4, 10, 1), "suffix_len[1] = -1")])
def test_suffix_length_out_of_range(cli, files, lens, bad):
    _edit(files["ctx"], suffix_len=torch.tensor(lens))
    expect_error(cli, files, "ctx.safetensors", bad, "Q = 10")


def test_suffix_len_of_another_batch(cli, files):
    _edit(files["ctx"], suffix_len=torch.tensor([1, 2, 3]))
    expect_error(cli, files, "ctx.safetensors", "suffix_len")


def test_prefix_pad_beyond_valid_len(cli, files):
    _edit(files["ctx"], prefix_pad=torch.tensor([41, 0]))
    expect_error(cli, files, "ctx.safetensors", "prefix_pad[0] = 41")


def test_guidance_context_of_another_batch(cli, files):
    other = make_context(files["tmp"] / "other.safetensors", TINY, CtxSpec(motion="history"))
    expect_error(cli, files, "other.safetensors", "3 samples", "5", extra=["--guidance-context", other])


def test_guidance_context_of_another_layer_count(cli, files):
    _edit(files["unguided"], **{"key.2": load_file(str(files["unguided"]))["key.1"],
                                "value.2": load_file(str(files["unguided"]))["value.1"],
                                "suffix_key.2": load_file(str(files["unguided"]))["suffix_key.1"],
                                "suffix_value.2": load_file(str(files["unguided"]))["suffix_value.1"]})
    expect_error(cli, files, "unguided.safetensors", "3 cache layers", extra=["--guidance-context", files["unguided"]])


@pytest.mark.parametrize("w", ["-0.5", "nan", "inf"])
def test_bad_guidance_weight(cli, files, w):
    expect_error(cli, files, "guidance weight", extra=["--guidance-context", files["unguided"], "--guidance-weight", w])


@pytest.mark.parametrize("t", ["-1", "nan", "inf"])
def test_bad_temperature(cli, files, t):
    expect_error(cli, files, "temperature", extra=["--temperature", t])


def test_bad_seeds(cli, files):
    expect_error(cli, files, "seeds", extra=["--seeds", "1,2,3"])
