#!/usr/bin/env python3
"""Times one expert step of the cpu backend (bench_step, bf16 and int8 weights) and of PyTorch
(transformers' Qwen3VLTextModel + action_out_proj, fp32 and bf16) at the same sizes, in one run.

Each configuration runs in its own process, one after another, so peak memory stays that of one model.
The torch step: inputs_embeds [B, T, D] through the model with a DynamicCache prefilled with S random
rows per layer (own K/V appended, then cropped, as the release's step_fn does), a non-causal 4D float
mask, position_ids [3, B, T], then Linear(D -> 2). Prints a table of seconds per step and ours/torch.
Under ALPAMAYO_CPU_ISA (our kernels capped, e.g. avx512_bf16 on a machine with AMX) PyTorch's oneDNN is capped the
same way (ONEDNN_MAX_CPU_ISA, unless that is set already), so both sides run what a CPU without the rest would.

usage: bench/bench_vs_torch.py [--bench-step build-cpu/bench/bench_step] [--threads 2] [--S 4700] ...
"""
import argparse
import json
import os
import subprocess
import sys
import time


# ALPAMAYO_CPU_ISA's caps (src/backends/cpu/runtime/isa.h) as oneDNN's ONEDNN_MAX_CPU_ISA values; amx / all: no cap.
ONEDNN_ISA = {"avx2": "AVX2", "avx2_vnni": "AVX2_VNNI", "avx512": "AVX512_CORE", "avx512_vnni": "AVX512_CORE_VNNI",
              "avx512_bf16": "AVX512_CORE_BF16"}


def torch_env(environ: dict) -> dict:
    """The torch worker's environment: ONEDNN_MAX_CPU_ISA from ALPAMAYO_CPU_ISA where that caps below everything and
    the caller set no oneDNN cap of its own."""
    env = dict(environ)
    cap = ONEDNN_ISA.get(env.get("ALPAMAYO_CPU_ISA", ""))
    if cap and "ONEDNN_MAX_CPU_ISA" not in env and "DNNL_MAX_CPU_ISA" not in env:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    return env


def torch_worker(a: argparse.Namespace) -> None:
    import torch
    from transformers import DynamicCache
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.torch_worker]
    half = a.d // 2
    hw = half * 20 // 64
    cfg = Qwen3VLTextConfig(
        vocab_size=1, hidden_size=a.D, intermediate_size=a.I, num_hidden_layers=a.L,
        num_attention_heads=a.Hq, num_key_value_heads=a.Hkv, head_dim=a.d, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [half - 2 * hw, hw, hw]},
        max_position_embeddings=1 << 20)
    cfg._attn_implementation = a.attn
    with torch.device("meta"):
        model = Qwen3VLTextModel(cfg)
    model = model.to_empty(device="cpu").to(dtype).eval()
    with torch.no_grad():  # random weights, filled in place (fast; values do not matter for timing)
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            else:
                p.fill_(1.0)
    out_proj = torch.nn.Linear(a.D, 2).to(dtype)
    B, T, S = a.B, a.T, a.S
    kv = [(torch.randn(B, a.Hkv, S, a.d, dtype=dtype), torch.randn(B, a.Hkv, S, a.d, dtype=dtype))
          for _ in range(a.L)]
    cache = DynamicCache(ddp_cache_data=kv)
    pos = (torch.arange(T) + S)[None, :].expand(B, -1)
    position_ids = pos[None].expand(3, -1, -1).contiguous()
    mask = torch.zeros(B, 1, T, S + T, dtype=dtype)
    emb = torch.randn(B, T, a.D, dtype=dtype)

    def step():
        out = model(inputs_embeds=emb, position_ids=position_ids, attention_mask=mask, cache=cache,
                    use_cache=True, is_causal=False)
        cache.crop(-T)
        return out_proj(out.last_hidden_state)

    times = []
    with torch.no_grad():
        for i in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            step()
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
    assert cache.get_seq_length() == S
    print(json.dumps({"torch": a.torch_worker, "attn": a.attn, "threads": a.threads,
                      "step_s_mean": sum(times) / len(times), "step_s_min": min(times)}))


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no result line in:\n" + text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--bench-step", default=os.path.join(here, "..", "build-cpu", "bench", "bench_step"))
    for k, v in dict(L=64, D=1536, Hq=16, Hkv=8, d=128, I=6144, T=64, S=4700, Smax=8192, B=1, threads=2).items():
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--attn", default="sdpa", help="transformers attention implementation (sdpa | eager)")
    p.add_argument("--torch-worker", choices=["fp32", "bf16"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_worker:
        return torch_worker(a)

    sizes = ["--L", a.L, "--D", a.D, "--Hq", a.Hq, "--Hkv", a.Hkv, "--d", a.d, "--I", a.I, "--T", a.T,
             "--B", a.B, "--threads", a.threads, "--steps", a.steps, "--warmup", a.warmup]
    sizes = [str(x) for x in sizes]
    rows = []
    for w in ("bf16", "int8"):
        cmd = [a.bench_step, *sizes, "--S", str(a.S), "--Smax", str(a.Smax), "--weights", w, "--profile", "0"]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        res = last_json(r.stdout)
        rows.append((f"ours cpu, {w} weights", res["step_s_mean"], res["vmhwm_mib"]))
        print(r.stdout.strip(), flush=True)
    for t in ("fp32", "bf16"):
        cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", t, "--attn", a.attn, *sizes, "--S", str(a.S)]
        t0 = time.time()
        env = torch_env(os.environ)
        if env.get("ONEDNN_MAX_CPU_ISA") != os.environ.get("ONEDNN_MAX_CPU_ISA"):
            print(f"torch {t}: ONEDNN_MAX_CPU_ISA={env['ONEDNN_MAX_CPU_ISA']} (from ALPAMAYO_CPU_ISA)", flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"torch {t} failed")
        res = last_json(r.stdout)
        rows.append((f"torch {t} ({a.attn})", res["step_s_mean"], None))
        print(json.dumps(res), f"(process {time.time() - t0:.0f} s)", flush=True)

    best_torch = min(r[1] for r in rows if r[0].startswith("torch"))
    print(f"\nL={a.L} D={a.D} Hq={a.Hq} Hkv={a.Hkv} d={a.d} I={a.I} T={a.T} S={a.S} B={a.B} threads={a.threads}")
    print(f"| configuration | s/step | 10-step sample (s) | ours/torch-best | peak MiB |")
    print(f"|---|---|---|---|---|")
    for name, s, mem in rows:
        print(f"| {name} | {s:.3f} | {10 * s:.2f} | {s / best_torch:.3f} | {mem if mem else '-'} |")
    for name, s, _ in rows[:2]:
        for tname, ts, _ in rows[2:]:
            print(f"{name} vs {tname}: ours/torch = {s / ts:.3f} ({ts / s:.2f}x faster)")


if __name__ == "__main__":
    main()
