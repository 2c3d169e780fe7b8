#!/usr/bin/env python3
"""The TT-Lang backend's teacher-forced accuracy in tt-lang-sim (docs/ACCURACY.md section 5): on the tests' tiny
checkpoints (both layouts, B = 3), every v_k from the engine's x_k against the engine's reference backend, and
the free-running trajectory.

    ~/.cache/alpamayo-expert/venv/bin/python scripts/tt_accuracy.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "python"))

import synth  # noqa: E402
from alpamayo_expert import Context, Model  # noqa: E402
from alpamayo_expert.tt import TTExpert  # noqa: E402


def main() -> int:
    print("| layout | TT weights | TT cache | reference weights | worst v_k max abs error | max abs v | "
          "worst v_k PCC | trajectory max error (m) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        ctx = synth.make_context(Path(d) / "ctx.safetensors", synth.TINY, synth.CtxSpec())
        for layout in ("r1", "a2"):
            ck = synth.make_checkpoint(Path(d) / layout, synth.TINY, layout=layout)
            for fmt, cache, ref_w in (("bfp8_b", "bf16", "bfp8_b"), ("bf16", "bf16", "f32"),
                                      ("bfp8_b", "bf16", "f32"), ("bfp8_b", "bfp8_b", "bfp8_b"),
                                      ("bfp8_b", "bfp8_b", "f32")):
                e = TTExpert(ck, weights=fmt, grid=(4, 2), key_chunk=1, cache=cache)
                e.bind(ctx)
                s = Model(str(ck), backend="reference", weights=ref_w).session()
                s.bind(Context.open(str(ctx)))
                noise = synth.make_noise(3, synth.TINY)
                r = s.sample(noise=noise.numpy(), all_steps=True)
                xs, vs = np.asarray(r.x_steps), np.asarray(r.v_steps)
                times = torch.linspace(0, 1, vs.shape[0] + 1)
                errs, pccs = [], []
                for k in range(vs.shape[0]):
                    v = e.step(torch.from_numpy(xs[k]), float(times[k])).numpy()
                    errs.append(np.abs(v - vs[k]).max())
                    pccs.append(np.corrcoef(v.ravel(), vs[k].ravel())[0, 1])
                out = e.sample(noise)
                traj = np.linalg.norm(out["xyz"] - np.asarray(r.xyz), axis=-1).max()
                print(f"| {layout} | {fmt} | {cache} | {ref_w} | {max(errs):.2g} | "
                      f"{np.abs(vs).max():.2f} | {min(pccs):.6f} | "
                      f"{traj:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
