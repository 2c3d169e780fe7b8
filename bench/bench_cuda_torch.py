#!/usr/bin/env python3
"""PyTorch on the same GPU, for the cuda backend's benchmark (scripts/device-check.sh): one denoising step of
the expert (all layers, final norm, Linear(D -> 2)) at full size with random bf16 weights and S random cache
rows per sample (each sample its own copy, as the release holds them), for 1, 6 and 20 samples (--batches):

  transformers  Qwen3VLTextModel with a DynamicCache prefilled with the rows, appended to and cropped per step,
                a 4D float mask and position_ids [3, B, T]: what the release's step_fn runs (eager).
  torch         the same math in plain torch ops over caches preallocated with room for the own rows
                (scaled_dot_product_attention with GQA), eager and captured as one CUDA graph.

Times are per step (CUDA events, median of --reps after --warmup). Writes JSON (--json) and prints a table.
`--device cpu --tiny` runs the same code at toy sizes on a machine without a GPU (a smoke test).
"""
import argparse
import json
import statistics
import sys
import time


def rms(x, w, eps=1e-6):
    import torch
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, cos, sin):
    import torch
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class Timer:
    def __init__(self, dev):
        import torch
        self.torch, self.dev = torch, dev

    def __call__(self, fn, warmup, reps):
        torch = self.torch
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(reps):
            if self.dev.type == "cuda":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                out.append(e0.elapsed_time(e1))
            else:
                t0 = time.perf_counter()
                fn()
                out.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(out)


def build_model(a, dev):
    import torch
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel
    half = a.d // 2
    hw = half * 20 // 64
    cfg = Qwen3VLTextConfig(
        vocab_size=1, hidden_size=a.D, intermediate_size=a.I, num_hidden_layers=a.L,
        num_attention_heads=a.Hq, num_key_value_heads=a.Hkv, head_dim=a.d, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [half - 2 * hw, hw, hw]},
        max_position_embeddings=1 << 20)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = Qwen3VLTextModel(cfg)
    model = model.to_empty(device=dev).to(torch.bfloat16).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            else:
                p.fill_(1.0)
    return model


def transformers_step(a, model, out_proj, B, dev):
    """The release's way: DynamicCache prefilled with S rows, extended by T and cropped back every step."""
    import torch
    from transformers import DynamicCache
    T, S = a.T, a.S
    kv = [(torch.randn(B, a.Hkv, S, a.d, dtype=torch.bfloat16, device=dev),
           torch.randn(B, a.Hkv, S, a.d, dtype=torch.bfloat16, device=dev)) for _ in range(a.L)]
    try:
        cache = DynamicCache(ddp_cache_data=kv)
    except TypeError:
        cache = DynamicCache()
        for l, (k, v) in enumerate(kv):
            cache.update(k, v, l)
    pos = (torch.arange(T, device=dev) + S)[None, :].expand(B, -1)
    position_ids = pos[None].expand(3, -1, -1).contiguous()
    mask = torch.zeros(B, 1, T, S + T, dtype=torch.bfloat16, device=dev)
    emb = torch.randn(B, T, a.D, dtype=torch.bfloat16, device=dev)

    # The cache argument is `cache` in recent transformers and `past_key_values` before.
    import inspect
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def step():
        out = model(inputs_embeds=emb, position_ids=position_ids, attention_mask=mask, use_cache=True, **{key: cache})
        cache.crop(-T)  # a negative count removes the T own rows again
        return out_proj(out.last_hidden_state)

    step()
    assert cache.get_seq_length() == S, f"the cache holds {cache.get_seq_length()} rows after a step, expected {S}"
    return step


def plain_step(a, model, out_proj, B, dev):
    """The same math over preallocated [B, Hkv, S + T, d] caches: static shapes, so it can be graph-captured."""
    import torch
    import torch.nn.functional as F
    T, S, d = a.T, a.S, a.d
    K = [torch.randn(B, a.Hkv, S + T, d, dtype=torch.bfloat16, device=dev) for _ in range(a.L)]
    V = [torch.randn(B, a.Hkv, S + T, d, dtype=torch.bfloat16, device=dev) for _ in range(a.L)]
    inv = 1.0 / (5e6 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    ang = (torch.arange(T, device=dev, dtype=torch.float32) + S)[:, None] * inv[None, :]
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(torch.bfloat16)[None, :, None, :]
    sin = torch.cat((ang.sin(), ang.sin()), -1).to(torch.bfloat16)[None, :, None, :]
    layers = [(m.input_layernorm.weight, m.post_attention_layernorm.weight, m.self_attn.q_proj.weight,
               m.self_attn.k_proj.weight, m.self_attn.v_proj.weight, m.self_attn.o_proj.weight,
               m.self_attn.q_norm.weight, m.self_attn.k_norm.weight, m.mlp.gate_proj.weight, m.mlp.up_proj.weight,
               m.mlp.down_proj.weight) for m in model.layers]
    final = model.norm.weight
    emb = torch.randn(B, T, a.D, dtype=torch.bfloat16, device=dev)

    def step():
        h = emb
        for l, (wi, wp, wq, wk, wv, wo, qn, kn, wg, wu, wd) in enumerate(layers):
            x = rms(h, wi)
            q = rope(rms((x @ wq.T).view(B, T, a.Hq, d), qn), cos, sin).transpose(1, 2)
            k = rope(rms((x @ wk.T).view(B, T, a.Hkv, d), kn), cos, sin).transpose(1, 2)
            v = (x @ wv.T).view(B, T, a.Hkv, d).transpose(1, 2)
            K[l][:, :, S:] = k
            V[l][:, :, S:] = v
            o = F.scaled_dot_product_attention(q, K[l], V[l], enable_gqa=True)
            h = h + o.transpose(1, 2).reshape(B, T, a.Hq * d) @ wo.T
            x = rms(h, wp)
            h = h + (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T
        return out_proj(rms(h, final))

    return step


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in dict(L=64, D=1536, Hq=16, Hkv=8, d=128, I=6144, T=64, S=4700).items():
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--batches", default="1,6", help="samples per step, comma-separated")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="toy sizes (smoke test)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    if a.tiny:
        a.L, a.D, a.Hq, a.Hkv, a.d, a.I, a.T, a.S, a.reps, a.warmup = 2, 64, 4, 2, 16, 128, 8, 40, 2, 1
    import torch
    import transformers
    dev = torch.device(a.device)
    torch.manual_seed(0)
    timer = Timer(dev)
    res = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(dev),
           "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "sizes": dict(L=a.L, D=a.D, Hq=a.Hq, Hkv=a.Hkv, d=a.d, I=a.I, T=a.T, S=a.S), "runs": []}
    with torch.no_grad():
        model = build_model(a, dev)
        out_proj = torch.nn.Linear(a.D, 2).to(device=dev, dtype=torch.bfloat16)
        for B in [int(x) for x in a.batches.split(",")]:
            run = {"samples": B}
            try:
                run["transformers_eager_ms"] = timer(transformers_step(a, model, out_proj, B, dev), a.warmup, a.reps)
            except Exception as e:  # an API difference of this transformers version: say so, keep going
                run["transformers_error"] = f"{type(e).__name__}: {e}"[:300]
            step = plain_step(a, model, out_proj, B, dev)
            run["torch_eager_ms"] = timer(step, a.warmup, a.reps)
            if dev.type == "cuda":
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        step()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step()
                run["torch_graph_ms"] = timer(g.replay, a.warmup, a.reps)
                del g
                torch.cuda.empty_cache()
            res["runs"].append(run)
            print(json.dumps(run), flush=True)
    print("| samples | transformers eager (ms/step) | torch eager | torch CUDA graph |\n|---|---|---|---|")
    for r in res["runs"]:
        f = lambda k: f"{r[k]:.2f}" if k in r else "-"
        print(f"| {r['samples']} | {f('transformers_eager_ms')} | {f('torch_eager_ms')} | {f('torch_graph_ms')} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
