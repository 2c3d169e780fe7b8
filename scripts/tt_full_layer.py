#!/usr/bin/env python3
"""One full-size expert layer (D 1536, 16 / 8 heads of 128, I 6144, 64 tokens, S 4,700 cache rows) through
alpamayo_expert.tt's fused TT-Lang operations in tt-lang-sim on Blackhole's 11 x 10 grid, against the reference
layer on what the device holds (docs/TT_BACKEND.md, "Full-size check"). A benchmark-time check, not in CI: the
simulator runs every tile operation in Python.

    ~/.cache/alpamayo-expert/venv/bin/python scripts/tt_full_layer.py [--backend tt-sim|tt] [--weights bfp8_b|bf16]
        [--S rows] [--smax N]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "python"))

import synth  # noqa: E402
from alpamayo_expert.tt import TTExpert, reference as R, round_bf16  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default="bfp8_b", choices=("bfp8_b", "bf16"))
    ap.add_argument("--backend", default="tt-sim", choices=("tt-sim", "tt"))
    ap.add_argument("--kv", default="bf16", choices=("bf16", "bfp8_b"), help="the device cache's format")
    ap.add_argument("--S", type=int, default=4700, help="cache rows in use")
    ap.add_argument("--smax", type=int, default=None, help="device cache rows (default: S + 64 rounded up to 128)")
    args = ap.parse_args()
    dm = synth.FULL_LAYER
    with tempfile.TemporaryDirectory() as d:
        ck = synth.make_checkpoint(Path(d) / "ck", dm, layout="r1")
        spec = synth.CtxSpec(valid_len=(args.S,), rope_delta=(0,), P=args.S, v0=(10.0,), motion="v0")
        ctx = synth.make_context(Path(d) / "ctx.safetensors", dm, spec)
        t0 = time.perf_counter()
        e = TTExpert(ck, backend=args.backend, weights=args.weights, smax=args.smax, keep_host=True,
                     cache=args.kv)
        e.bind(ctx)
        t_load = time.perf_counter() - t0
    x = round_bf16(torch.randn(1, e.Tp, e.D, generator=torch.Generator().manual_seed(0)))
    e._write(e.buf["x"], x.reshape(-1, e.D))
    t0 = time.perf_counter()
    e.run_layer(0)
    t_layer = time.perf_counter() - t0
    out = e.ttnn.to_torch(e.buf["x"]).float().reshape(1, e.Tp, e.D)
    ref, _, _ = R.layer(x, e.host_layers[0], e.k_host[0], e.v_host[0], e.keep, e.cos_host, e.sin_host, e.Hq, e.Hkv,
                        e.d, e.eps, cache_round=e._cache_values if args.kv == "bfp8_b" else None)
    err = (out - ref).abs().max().item()
    pcc = torch.corrcoef(torch.stack([out.flatten().double(), ref.flatten().double()]))[0, 1].item()
    print(f"full-size layer on {args.backend}, {args.weights} weights, {args.kv} cache, S {args.S}, "
          f"Smax {e.Smax}, grid {e.grid}, "
          f"{e.nsplit} key splits: PCC {pcc:.7f}, max error {err:.3g} (|ref| max {ref.abs().max().item():.3g}); "
          f"load + bind {t_load:.1f} s, simulated layer {t_layer:.1f} s wall")
    return 0 if pcc > 0.9999 else 1


if __name__ == "__main__":
    sys.exit(main())
