"""Print the accuracy numbers of docs/ACCURACY.md.

    python3 tests/python/measure_accuracy.py [--threads 2] [--skip-medium]

1. reference backend vs the transformers oracle (fp32): per-layer max|d| and PCC, bound ratios;
2. cpu backend (bf16 and int8 weights) vs the reference backend: end-to-end trajectory deviation in metres.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402

from alpamayo_expert import read_context, write_noise  # noqa: E402
from cli import REFERENCE, Backend, cli_path, sample  # noqa: E402
from compare import max_abs, pcc  # noqa: E402
from oracle import ExpertContext, Oracle, load_checkpoint  # noqa: E402
from synth import FULL_LAYER, TINY, CtxSpec, make_checkpoint, make_context, make_noise  # noqa: E402
from verify import oracle_gain, verify_sample  # noqa: E402


def setup(d: Path, dm, spec: CtxSpec, layout="a2", dtype="bf16", seed=0, noise_seed=4):
    ck = make_checkpoint(d / "ck", dm, layout, dtype, seed=seed)
    ctx = make_context(d / "ctx.safetensors", dm, spec)
    noise = make_noise(spec.B, dm, noise_seed)
    write_noise(d / "noise.safetensors", noise)
    return ck, ctx, noise


def part1(cli, tmp: Path):
    print("## 1. engine vs oracle (reference: fp32; cpu: bf16 activations) \n")
    print("| case | backend | tensor | max abs diff | PCC | bound | diff/bound | diff/(sqrt(K) term) |")
    print("|---|---|---|---|---|---|---|---|")
    cases = [
        ("tiny L2 D64 B3, r1 f32", TINY, CtxSpec(kv_dtype="f32"), "r1", "f32", None),
        ("tiny L2 D64 B3, a2 bf16, f16 ctx", TINY, CtxSpec(kv_dtype="f16"), "a2", "bf16", None),
        ("full-size layer, S 4700", FULL_LAYER,
         CtxSpec(valid_len=(4700,), rope_delta=(-1500,), P=4736, kv_dtype="bf16", motion="v0", v0=(9.0,)), "a2", "bf16", 1),
    ]
    for i, (name, dm, spec, layout, dtype, steps) in enumerate(cases):
        d = tmp / f"p1-{i}"
        ck_dir, ctx_path, noise = setup(d, dm, spec, layout, dtype)
        ck, ctx = load_checkpoint(ck_dir), read_context(ctx_path)
        oracle = Oracle(ck, ExpertContext.from_file_context(ctx))
        for be in [REFERENCE] + (CPU if steps == 1 else []):
            res = sample(cli, ck_dir, ctx_path, d, backend=be, noise=d / "noise.safetensors", steps=steps)
            checks = verify_sample(ck, oracle, res, noise, steps or ck.steps, be, ego_xyz=ctx.ego_history_xyz,
                                   ego_rot=ctx.ego_history_rot, v0_given=ctx.v0, free_running=steps is None)
            for c in checks.items:
                if c.name.startswith(("layers-out", "v_", "action (free")):
                    what = c.name.split(":")[1] if ":" in c.name else "v"
                    acc = (f"{c.err / checks.bounds.accumulation_only(what, c.scale):.2f}"
                           if be.name == "reference" and not c.name.startswith("action") else "")
                    print(f"| {name} | {be.id} | {c.name} | {c.err:.2e} | {c.pcc:.9f} | {c.bound:.2e} | "
                          f"{c.err / c.bound:.3f} | {acc} |")
            for n in checks.notes:
                print(f"| {name} | {be.id} | {n} | | | | | |")
    print()


def traj_dev(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """Per-waypoint Euclidean distance: (max over the horizon, mean, at the last waypoint), max over the batch."""
    e = (a.double() - b.double()).norm(dim=-1)
    return float(e.max()), float(e.mean()), float(e[:, -1].max())


CPU = [Backend("cpu", "bf16"), Backend("cpu", "int8")]


def part2(cli, tmp: Path, threads: str, skip_medium: bool):
    print("## 2. cpu backend vs reference backend: trajectories (metres)\n")
    cpu = CPU
    print("| model | weights | max dev (m) | mean dev (m) | final-waypoint dev (m) | action max abs | action PCC |")
    print("|---|---|---|---|---|---|---|")
    models = []
    if not skip_medium:
        models.append(("full-width L4 (D1536, I6144), T64, 10 steps, B2 S 4700/3100", replace(FULL_LAYER, L=4, steps=10),
                       CtxSpec(valid_len=(4700, 3100), rope_delta=(-1500, -900), P=4736, kv_dtype="bf16", motion="history")))
    for s in range(4):
        models.append((f"tiny L2 D64, T64, 10 steps, B3, seed {s}", replace(TINY, T=64, steps=10),
                       CtxSpec(kv_dtype="bf16", motion="history", seed=10 + s)))
    for i, (name, dm, spec) in enumerate(models):
        d = tmp / f"p2-{i}"
        ck_dir, ctx_path, _ = setup(d, dm, spec, seed=i, noise_seed=100 + i)
        t0 = time.time()
        ref = sample(cli, ck_dir, ctx_path, d, noise=d / "noise.safetensors", all_steps=False, layers=False)
        t_ref = time.time() - t0
        for b in cpu:
            r = sample(cli, ck_dir, ctx_path, d, backend=b, noise=d / "noise.safetensors", all_steps=False, layers=False)
            mx, mean, last = traj_dev(r["xyz"], ref["xyz"])
            print(f"| {name} | {b.weights} | {mx:.3f} | {mean:.4f} | {last:.3f} | "
                  f"{max_abs(r['action'], ref['action']):.3e} | {pcc(r['action'], ref['action']):.6f} |")
        if dm.D <= 128:  # the oracle is cheap here: how much the synthetic sampler amplifies differences
            ck, ctx = load_checkpoint(ck_dir), read_context(ctx_path)
            o = Oracle(ck, ExpertContext.from_file_context(ctx))
            n = make_noise(spec.B, dm, 100 + i)
            g = oracle_gain(o, n, dm.steps, o.sample(n)["action"])
            print(f"| {name} | (sampler gain max|d action|/max|d noise| = {g:.0f}) | | | | | |")
        else:
            print(f"| {name} | (reference backend run: {t_ref:.1f} s) | | | | | |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="2", help="cpu backend threads")
    ap.add_argument("--skip-medium", action="store_true", help="skip the 4-layer full-width model (~1 min)")
    a = ap.parse_args()
    import os
    os.environ["ALPAMAYO_TEST_THREADS"] = a.threads
    torch.set_num_threads(int(a.threads))
    cli = cli_path()
    print(f"CLI: {cli}\n")
    with tempfile.TemporaryDirectory() as t:
        part1(cli, Path(t))
        part2(cli, Path(t), a.threads, a.skip_medium)


if __name__ == "__main__":
    main()
