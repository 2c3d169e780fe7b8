"""The cpu backend's bf16 bounds (error_model.py via verify.Bounds) hold for any fp32 summation order a correct
kernel may use, not only for the kernels this machine runs: emulated_kernels.py computes the expert with the
backend's roundings and each order of ORDERS, from the oracle's own action_in_proj output, and every layer,
'hidden' and v must lie within the bounds of the fp32 oracle. The emulation is itself held to the engine (the
engine's step 0 within the same bounds of it) and to the oracle (without its roundings it is the oracle's math),
and the bounds are shown to catch bugs of a real kernel's size."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch
from safetensors import safe_open

from alpamayo_expert import read_context, write_noise
from cli import REFERENCE, Backend, sample
from compare import Check, Checks
from emulated_kernels import ORDERS, Emulation, expert_step, round_bits
from oracle import Checkpoint, ExpertContext, Oracle, load_checkpoint
from synth import make_checkpoint, make_context, make_noise
from test_oracle import CASES
from verify import Bounds

CPU_BF16 = Backend("cpu", "bf16")
FP32_ATTENTION = ("avx512_fma", "avx2_fma")   # attention kernels with fp32 probabilities (CPU_BACKEND.md)
# f32 weights and cache (both rounded by the backend), bf16 ones (exact), and a 3-layer model with eps 1e-2 and
# other rope deltas; each B = 3 with valid lengths 37 / 50 / 23.
CASE_IDS = ("r1-f32-1file-f32ctx-history", "r1-bf16-3shards-bf16ctx-v0", "a2-bf16-L3-llm-config-eps1e-2-theta2e4")
# Bugs of a real kernel's size that the bounds must catch. Smaller ones they do not: the probabilities rounded to
# 6 bits (or 3), or truncation instead of RNE at every bf16 site, stay within the bounds here, whose margin over the
# measured rounding error is about 5x (worst ratios ~0.2).
BUGS = {
    "down_proj drops its last K term": Emulation(drop_down_k=-1),
    "attention skips the last cache row": Emulation(drop_last_key=True),
}


@dataclass
class Run:
    ck: Checkpoint
    ctx: ExpertContext
    oracle: Oracle
    ref: dict       # the oracle's step 0: 'emb', 'layer.l', 'hidden', 'v'
    engine: dict    # the engine's step 0, the same names
    kernels: dict   # the engine's kernel per op, from its output's metadata
    bounds: Bounds  # of the cpu backend with bf16 weights

    @property
    def names(self) -> list[str]:
        return [f"layer.{l}" for l in range(self.ck.L)] + ["hidden", "v"]


@pytest.fixture(scope="module", params=CASE_IDS)
def run(request, cli, tmp_path_factory) -> Run:
    case = CASES[request.param]
    d = tmp_path_factory.mktemp(request.param)
    dm = case.dims
    ck_dir = make_checkpoint(d / "ck", dm, case.layout, case.dtype, case.shards, text_config=case.text_config)
    ctx_path = make_context(d / "ctx.safetensors", dm, case.spec)
    noise = make_noise(case.spec.B, dm, 4)
    write_noise(d / "noise.safetensors", noise)
    extra, vlm_tc = [], None
    if case.vlm_config is not None:
        (d / "vlm_config.json").write_text(json.dumps(case.vlm_config))
        extra += ["--vlm-config", d / "vlm_config.json"]
        vlm_tc = case.vlm_config["text_config"]
    if case.v0 is not None:
        extra += ["--v0", case.v0]
    res = sample(cli, ck_dir, ctx_path, d, backend=CPU_BF16, noise=d / "noise.safetensors", steps=1, extra=extra)
    ck = load_checkpoint(ck_dir, text_config=vlm_tc, weights=CPU_BF16.weights)
    ctx = ExpertContext.from_file_context(read_context(ctx_path))
    oracle = Oracle(ck, ctx)
    v, ref = oracle.step(noise, torch.zeros(noise.shape[0]), capture=True)
    ref["v"] = v
    engine = {**res["layers"], "v": res["v_steps"][0]}
    with safe_open(str(d / f"out-{CPU_BF16.id}.safetensors"), framework="pt") as f:
        kernels = dict(kv.split("=") for kv in f.metadata()["kernels"].split(","))
    return Run(ck, ctx, oracle, ref, engine, kernels, Bounds(ck, oracle, float(noise.abs().max()), CPU_BF16))


def _add(checks: Checks, tag: str, got: dict, ref: dict, bounds: Bounds, names: list[str]) -> list[Check]:
    return [checks.add(f"{tag}:{n}", got[n], ref[n], *bounds.max_abs_and_pcc(n, ref[n])) for n in names]


def _ratios(items: list[Check]) -> tuple[float, float]:
    """The worst max-abs ratio err / bound and PCC ratio sqrt((1 - pcc) / (1 - floor)) (as compare.Check prints)."""
    err = max(c.err / c.bound for c in items)
    pcc = max(math.sqrt(max(1 - c.pcc, 0) / (1 - c.min_pcc)) for c in items)
    return err, pcc


def _row(label: str, items: list[Check]) -> str:
    err, pcc = _ratios(items)
    return f"{label:36s} worst ratio: max-abs {err:.3f}, pcc {pcc:.3f}"


def test_round_bits_is_bf16_rne():
    x = torch.randn(10000, generator=torch.Generator().manual_seed(0)) * 10
    x = torch.cat([x, torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)])])  # ties go to even
    assert torch.equal(round_bits(x, 8), x.bfloat16().float())


def test_emulation_without_roundings_is_the_oracle(run):
    """With no bf16 rounding the emulation is the oracle's math in fp32: within the reference backend's fp32
    bounds, so its layers, rope, GQA, masks and positions are the oracle's and only the roundings differ."""
    checks = Checks()
    _add(checks, "fp32", expert_step(run.ck, run.ctx, run.ref["emb"], Emulation(bf16=False)), run.ref,
         Bounds(run.ck, run.oracle, 1.0, REFERENCE), run.names)
    checks.assert_ok()


def test_every_summation_order_within_the_bounds(run):
    """Every layer, 'hidden' and v of the emulation in each order within the cpu-bf16 bounds of the oracle."""
    checks = Checks()
    outs, rows = {}, []
    for order in ORDERS:
        outs[order] = expert_step(run.ck, run.ctx, run.ref["emb"], Emulation(order=order))
        rows.append(_row(order, _add(checks, order, outs[order], run.ref, run.bounds, run.names)))
    # The orders must really differ, or passing proves nothing about other kernels.
    layers = {o: torch.cat([outs[o][n].flatten() for n in run.names]) for o in ORDERS}
    distinct = {o: next(p for p in ORDERS if torch.equal(layers[p], layers[o])) for o in ORDERS}
    spread = max((layers[o] - layers["sequential"]).abs().max().item() for o in ORDERS)
    checks.note(f"{len(set(distinct.values()))} of {len(ORDERS)} orders give distinct layer outputs; the largest "
                f"difference from 'sequential' is {spread:.3e}")
    checks.notes += rows
    assert len(set(distinct.values())) >= 2, "every summation order gave the same bits: the test proves nothing"
    checks.assert_ok()


def test_engine_within_the_bounds_of_the_emulation(run):
    """The engine's step 0 against the emulation from the engine's own embedding, for every order. Where the
    engine's attention is an fp32-FMA kernel, which keeps the probabilities in fp32, the emulation does too and
    then rounds everywhere the engine does: it must be at least twice closer to the engine than the oracle is
    (max-abs and 1 - PCC of every tensor), which the bounds alone would not show. The vdpbf16ps kernel's
    probabilities (a polynomial exp2 against the first block's max) round differently from the emulation's."""
    checks = Checks()
    att = run.kernels.get("attention", "")
    fp32_att = att in FP32_ATTENTION
    checks.note(f"engine kernels {run.kernels}; emulated probabilities: {'fp32' if fp32_att else 'bf16'}")
    to_oracle = _add(checks, "oracle", run.engine, run.ref, run.bounds, run.names)
    for order in ORDERS:
        emu = expert_step(run.ck, run.ctx, run.engine["emb"], Emulation(order=order, prob_bits=None if fp32_att else 8))
        items = _add(checks, order, run.engine, emu, run.bounds, run.names)
        checks.note(_row(f"engine vs {order}", items))
        if fp32_att:
            for c, o in zip(items, to_oracle):
                if not (c.err <= o.err / 2 and 1 - c.pcc <= (1 - o.pcc) / 4):
                    checks.add(f"{c.name} not 2x closer than the oracle ({c.err:.3e} vs {o.err:.3e}, pcc "
                               f"{c.pcc:.9f} vs {o.pcc:.9f})", torch.ones(1), torch.zeros(1), 0.0)
    checks.note(_row("engine vs oracle", to_oracle))
    checks.assert_ok()


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_bug_fails_the_checks(run, bug):
    """The same checks fail for an emulation with a bug: the bounds have the power to see it."""
    checks = Checks()
    items = _add(checks, bug, expert_step(run.ck, run.ctx, run.ref["emb"], BUGS[bug]), run.ref, run.bounds,
                 run.names)
    print(checks.report())
    print(_row(bug, items))
    assert not all(c.ok for c in items), f"the bounds do not catch the bug '{bug}'"
