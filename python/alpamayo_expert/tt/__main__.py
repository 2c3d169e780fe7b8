"""python -m alpamayo_expert.tt sample: the CLI's `sample` on a TT backend, writing the same result file.

    python -m alpamayo_expert.tt sample --checkpoint DIR --context ctx.safetensors --out result.safetensors
        [--noise noise.safetensors | --seed N] [--steps N] [--backend tt-sim|tt] [--weights bfp8_b|bf16]
        [--kv bf16|bfp8_b] [--vlm-config VLM_CONFIG.json] [--all-steps] [--json out.json] [--grid COLSxROWS]
        [--smax N]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

import numpy as np
import torch

from .. import _core
from .._atomic import save_safetensors_atomic, write_text_atomic
from ..errors import Error
from ..noise import read_noise
from ._runtime import BACKENDS
from .expert import BLACKHOLE_GRID, CACHE_FORMATS, WEIGHT_FORMATS, TTExpert


def _grid(s: str) -> tuple[int, int]:
    cols, rows = (int(v) for v in s.lower().split("x"))
    if cols < 1 or rows < 1:
        raise ValueError(s)
    return cols, rows


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m alpamayo_expert.tt", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="sample trajectories for a context")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--context", required=True)
    s.add_argument("--out", required=True, help="result file (safetensors, docs/FORMATS.md)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--noise", help="noise file [B, T, A]")
    g.add_argument("--seed", type=int, default=None, help="the engine's noise generator's seed (default 0)")
    s.add_argument("--steps", type=int, default=None)
    s.add_argument("--backend", default="tt-sim", choices=BACKENDS)
    s.add_argument("--weights", default="bfp8_b", choices=WEIGHT_FORMATS)
    s.add_argument("--kv", default="bf16", choices=CACHE_FORMATS, help="the device's K/V cache format")
    s.add_argument("--vlm-config", default="")
    s.add_argument("--all-steps", action="store_true", help="also write x_steps and v_steps")
    s.add_argument("--json", help="also write a JSON summary")
    s.add_argument("--grid", type=_grid, default=BLACKHOLE_GRID, help="node grid COLSxROWS (default 11x10)")
    s.add_argument("--smax", type=int, default=None, help="device cache rows per sample and KV head")
    return ap.parse_args(argv)


def sample(a: argparse.Namespace) -> int:
    e = TTExpert(a.checkpoint, backend=a.backend, weights=a.weights, vlm_config=a.vlm_config, grid=a.grid,
                 smax=a.smax, cache=a.kv)
    e.bind(a.context)
    B = e._require_bound().B
    if a.noise:
        noise = read_noise(a.noise).float()
    else:
        seed = 0 if a.seed is None else a.seed
        noise = torch.from_numpy(np.asarray(_core.gaussian_noise(seed, B * e.Tw * e.A))).reshape(B, e.Tw, e.A)
    t0 = time.perf_counter()
    r = e.sample(noise, steps=a.steps)
    seconds = time.perf_counter() - t0
    steps = r["v_steps"].shape[0]
    names = ["action", "xyz", "yaw", "rot", "v0"] + (["x_steps", "v_steps"] if a.all_steps else [])
    meta = {"v0_source": r["v0_source"], "steps": str(steps), "backend": a.backend, "weights": a.weights,
            "kv": a.kv, "kernels": ""}
    inputs = [a.context] + ([a.noise] if a.noise else [])
    save_safetensors_atomic({n: torch.from_numpy(np.ascontiguousarray(r[n])) for n in names}, a.out, metadata=meta,
                            inputs=inputs)
    if a.json:
        doc = {"backend": a.backend, "weights": a.weights, "kv": a.kv, "kernels": "", "steps": steps,
               "step_seconds": seconds / steps, "v0_source": r["v0_source"],
               "samples": [{"v0": float(r["v0"][b]), "xyz": r["xyz"][b].tolist(), "yaw": r["yaw"][b].tolist(),
                            "action": r["action"][b].tolist()} for b in range(B)]}
        write_text_atomic(a.json, json.dumps(doc, indent=1), inputs=inputs)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    try:
        return sample(a)
    except (Error, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
