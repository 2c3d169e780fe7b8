"""Compare two `alpamayo-expert sample` result files (e.g. cpu vs reference backend, same seed).

    python3 bench/compare_trajectories.py REFERENCE.safetensors OTHER.safetensors [...]

Prints per-waypoint Euclidean deviation (max, mean, final waypoint) in metres, the action's max abs
difference and PCC, and, when both have --all-steps, the worst velocity difference per Euler step.
"""
import sys

import numpy as np
from safetensors.numpy import load_file


def pcc(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(np.corrcoef(a, b)[0, 1])


def main(paths):
    ref = load_file(paths[0])
    print("| file | max dev (m) | mean dev (m) | final-waypoint dev (m) | action max abs | action PCC | v max abs, step 0 / last |")
    print("|---|---|---|---|---|---|---|")
    for p in paths[1:]:
        o = load_file(p)
        dev = np.linalg.norm(o["xyz"] - ref["xyz"], axis=-1)
        v = ""
        if "v_steps" in o and "v_steps" in ref:
            dv = np.abs(o["v_steps"] - ref["v_steps"]).reshape(o["v_steps"].shape[0], -1).max(axis=1)
            v = f"{dv[0]:.2e} / {dv[-1]:.2e}"
        print(f"| {p} | {dev.max():.4f} | {dev.mean():.4f} | {dev[:, -1].max():.4f} | "
              f"{np.abs(o['action'] - ref['action']).max():.3e} | {pcc(o['action'], ref['action']):.6f} | {v} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:])
