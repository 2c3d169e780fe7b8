"""Tables of docs/ACCURACY.md's block-format section from full-size `sample` runs (same checkpoint, context, seed).

    python3 bench/bfp_accuracy.py DIR CHECKPOINT_TAG [CHECKPOINT_TAG ...]

DIR holds TAG-BACKEND-WEIGHTS.safetensors (--all-steps) and TAG-BACKEND-WEIGHTS-layers.safetensors (--layers-out)
for reference f32 (the baseline), reference bfp8_b / bfp4_b and cpu bf16 / bfp8_b / bfp4_b. Prints, against the
fp32 reference: step 0's per-layer PCC and max abs error (each layer's output within its own model: layer l carries
the differences of layers 0..l-1), v_k per Euler step, and the trajectory deviation in metres.
"""
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

RUNS = [("reference", "bfp8_b"), ("reference", "bfp4_b"), ("cpu", "bf16"), ("cpu", "bfp8_b"), ("cpu", "bfp4_b")]


def pcc(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    a, b = a - a.mean(), b - b.mean()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def load(d: Path, tag: str, be: str, w: str):
    p = d / f"{tag}-{be}-{w}.safetensors"
    if not p.exists():
        return None, None
    lay = d / f"{tag}-{be}-{w}-layers.safetensors"
    return load_file(str(p)), (load_file(str(lay)) if lay.exists() else None)


def main(d: Path, tags):
    for tag in tags:
        ref, ref_l = load(d, tag, "reference", "f32")
        if ref is None:
            print(f"{tag}: no reference f32 run")
            continue
        runs = [(be, w, *load(d, tag, be, w)) for be, w in RUNS]
        runs = [r for r in runs if r[2] is not None]
        L = sum(1 for k in ref_l if k.startswith("layer."))
        print(f"\n### {tag}: per-layer outputs at step 0 vs the fp32 reference (PCC / max abs)\n")
        cols = [f"{be} {w}" for be, w, _, _ in runs]
        print("| tensor | max abs (ref) | " + " | ".join(cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        picks = ["emb"] + [f"layer.{l}" for l in sorted({0, 1, 2, 3, 7, 15, 31, 47, L - 2, L - 1}) if l < L] + ["hidden"]
        worst = {c: (1.0, 0.0, "") for c in cols}
        for name in ["emb"] + [f"layer.{l}" for l in range(L)] + ["hidden"]:
            r = ref_l[name]
            cells = []
            for c, (be, w, _, lay) in zip(cols, runs):
                p, e = pcc(lay[name], r), float(np.abs(lay[name] - r).max())
                if name != "emb" and p < worst[c][0]:
                    worst[c] = (p, max(worst[c][1], e), name)
                elif name != "emb":
                    worst[c] = (worst[c][0], max(worst[c][1], e), worst[c][2])
                cells.append(f"{p:.7f} / {e:.2e}")
            if name in picks:
                print(f"| {name} | {float(np.abs(r).max()):.2f} | " + " | ".join(cells) + " |")
        print("| **worst layer** | | " + " | ".join(f"{p:.7f} ({n}) / {e:.2e}" for p, e, n in worst.values()) + " |")

        print(f"\n### {tag}: v_k per Euler step vs the fp32 reference (PCC / max abs; free-running)\n")
        print("| step | max abs (ref) | " + " | ".join(cols) + " |")
        print("|---|---|" + "---|" * len(cols))
        for k in range(ref["v_steps"].shape[0]):
            r = ref["v_steps"][k]
            cells = [f"{pcc(o['v_steps'][k], r):.6f} / {float(np.abs(o['v_steps'][k] - r).max()):.2e}" for _, _, o, _ in runs]
            print(f"| {k} | {float(np.abs(r).max()):.2f} | " + " | ".join(cells) + " |")

        print(f"\n### {tag}: trajectory vs the fp32 reference (metres; per-waypoint Euclidean distance)\n")
        print("| run | max dev (m) | mean dev (m) | final-waypoint dev (m) | action max abs | action PCC |")
        print("|---|---|---|---|---|---|")
        end = ref["xyz"][0, -1]
        for c, (_, _, o, _) in zip(cols, runs):
            dev = np.linalg.norm(o["xyz"] - ref["xyz"], axis=-1)
            print(f"| {c} | {dev.max():.4f} | {dev.mean():.4f} | {dev[:, -1].max():.4f} | "
                  f"{float(np.abs(o['action'] - ref['action']).max()):.3e} | {pcc(o['action'], ref['action']):.6f} |")
        print(f"\n(reference trajectory ends at ({end[0]:.1f}, {end[1]:.1f}) m)")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2:])
