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

from alpamayo_expert import read_context, write_noise
from cli import REFERENCE, Backend, sample
from compare import Check, Checks
from emulated_kernels import ORDERS, Emulation, expert_step, round_bits
from oracle import Checkpoint, ExpertContext, Oracle, load_checkpoint
from synth import make_checkpoint, make_context, make_noise
from test_oracle import CASES
from verify import Bounds

CPU_BF16 = Backend("cpu", "bf16")
# f32 weights and cache (both rounded by the backend), bf16 ones (exact), and a 3-layer model with eps 1e-2 and
# other rope deltas; each B = 3 with valid lengths 37 / 50 / 23.
CASE_IDS = ("r1-f32-1file-f32ctx-history", "r1-bf16-3shards-bf16ctx-v0", "a2-bf16-L3-llm-config-eps1e-2-theta2e4")
# Bugs of a real kernel's size that the bounds must catch.
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
    return Run(ck, ctx, oracle, ref, engine, Bounds(ck, oracle, float(noise.abs().max()), CPU_BF16))


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
    """round_bits' general path (a bug test's fewer bits) agrees with torch's bf16 conversion at 8 bits."""
    x = torch.randn(10000, generator=torch.Generator().manual_seed(0)) * 10
    x = torch.cat([x, torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)])])  # ties go to even
    m, e = torch.frexp(x)
    assert torch.equal(torch.ldexp(torch.round(m * 256) / 256, e), round_bits(x, 8))


def test_emulation_without_roundings_is_the_oracle(run):
    """With no bf16 rounding the emulation is the oracle's math in fp32: within the reference backend's fp32
    bounds, so its layers, rope, GQA, masks and positions are the oracle's and only the roundings differ."""
    checks = Checks()
    _add(checks, "fp32", expert_step(run.ck, run.ctx, run.ref["emb"], Emulation(bf16=False)), run.ref,
         Bounds(run.ck, run.oracle, 1.0, REFERENCE), run.names)
    checks.assert_ok()


def test_every_summation_order_within_the_bounds(run):
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
    """The engine's step 0 against the emulation from the engine's own embedding, for every order: the emulation
    rounds where the engine does (the bounds of this test would not hold for an emulation of another backend)."""
    checks = Checks()
    names = [n for n in run.names]
    for order in ORDERS:
        emu = expert_step(run.ck, run.ctx, run.engine["emb"], Emulation(order=order))
        checks.note(_row(f"engine vs {order}", _add(checks, order, run.engine, emu, run.bounds, names)))
    checks.note(_row("engine vs oracle", _add(checks, "oracle", run.engine, run.ref, run.bounds, names)))
    checks.assert_ok()


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_bug_fails_the_checks(run, bug):
    checks = Checks()
    items = _add(checks, bug, expert_step(run.ck, run.ctx, run.ref["emb"], BUGS[bug]), run.ref, run.bounds,
                 run.names)
    print(checks.report())
    print(_row(bug, items))
    assert not all(c.ok for c in items), f"the bounds do not catch the bug '{bug}'"
