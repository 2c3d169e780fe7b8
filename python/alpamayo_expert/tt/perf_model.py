"""A performance model of the expert layer on Blackhole p150 (docs/TT_BACKEND.md, "Performance model").

Estimated, never measured: nothing of alpamayo_expert.tt has run on a chip. Per operation it counts DRAM bytes
(weights, caches), NoC bytes (activations and the small tensors every node reads, which live in L1, read and
written by the nodes, re-reads included) and FPU arithmetic, and takes

    time = launch + max(DRAM bytes / DRAM rate, NoC bytes / (nodes busy x NoC rate), flops / (nodes busy x FPU rate))

The rates are the published p150 figures, except DRAM, where the seed's measured average for its weight streams
(255 GB/s of the 512 GB/s peak) stands for what a kernel achieves. The same formulas applied to the seed's own
ops (`seed_ops`) are checked against its measured op table (`SEED_US`).

    python -m alpamayo_expert.tt.perf_model
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .kernels import CONST_ROWS

# Blackhole p150 (docs.tenstorrent.com, "Blackhole PCIe cards"): 512 GB/s GDDR6, 1.35 GHz, 120 Tensix cores
# enabled, 332 TFLOPS bf16 (664 block-fp8) over them.
DRAM_PEAK_GBS = 512.0
CLOCK_GHZ = 1.35
TENSIX = 120
BF16_TFLOPS = 332.0
# The seed's measured average over its weight streams (EXPERT_NOTES: 40.5 MB per layer in ~158 us).
DRAM_ACHIEVED_GBS = 255.0
# NoC bytes per cycle a node receives (an assumption: 64 B per cycle per link; Wormhole's links carry 32).
NOC_BYTES_PER_CYCLE = 64
# An operation's launch inside a trace: the seed's fill_cache moved 16-131 KB in 3.8-3.9 us.
LAUNCH_US = 3.5

# The seed's measured per-op device times of one layer (EXPERT_NOTES, S = 4700, Smax = 8192, bf16 cache, bfp8
# weights, trace-timed), for the ops the model covers.
SEED_US = {"wqkv": 25.6, "wo": 18.6, "w1_silu": 40.2, "w3": 37.3, "w2": 44.6, "attention": 175.3, "rms_norm": 17.3,
           "nlp_create_qkv_heads": 52.8, "concat_heads": 27.7}
SEED_STEP_MS = 32.5
TILE = 32


@dataclass(frozen=True)
class Shape:
    B: int = 1
    T: int = 64          # own tokens (padded to tiles)
    D: int = 1536
    Hq: int = 16
    Hkv: int = 8
    d: int = 128
    I: int = 6144
    L: int = 64
    smax: int = 8192
    S: int | None = 4700                # context rows in use; None: the whole cache read (the seed's kernel)
    pad: int = 0                        # left padding rows of the context
    weight_bytes: float = 1088 / 1024   # bfp8_b: 1024 mantissa bytes + 64 exponent bytes per tile
    kv_bytes: float = 2.0               # bf16 cache
    act_bytes: float = 2.0
    nodes: int = 110                    # the 11 x 10 grid
    key_chunk: int = 4                  # tiles


@dataclass
class Op:
    name: str
    dram: float      # bytes
    noc: float       # bytes into and out of nodes (activations in L1)
    flops: float
    busy: int        # nodes with work

    def us(self, dram_gbs: float = DRAM_ACHIEVED_GBS) -> float:
        noc_gbs = NOC_BYTES_PER_CYCLE * CLOCK_GHZ * max(self.busy, 1)
        fpu_tflops = BF16_TFLOPS / TENSIX * max(self.busy, 1)
        return LAUNCH_US + max(self.dram / dram_gbs / 1e3, self.noc / noc_gbs / 1e3, self.flops / fpu_tflops / 1e6)


def _linear(name: str, s: Shape, K: int, N: int, *, mats: int = 1, norm: bool, nb: int = 1,
            mb: int | None = None) -> Op:
    """kernels.make_linear: a unit is mb row tiles (by default all of them, up to 8, as expert.py builds it) x nb output
    tiles; it reads those rows of x (twice with the fused norm, and the gains once), streams its weight block from
    DRAM (so each weight byte is read once per block of mb row tiles), writes its output block."""
    Mt = s.B * s.T // TILE
    mb = max(k for k in range(1, min(Mt, CONST_ROWS) + 1) if Mt % k == 0) if mb is None else mb
    units = (Mt // mb) * (N // TILE // nb)
    x_reads = units * K * TILE * s.act_bytes * (2 * mb + 1 if norm else mb)
    out = Mt * TILE * N * s.act_bytes * (1 if norm else 2)             # the output, and the residual read
    return Op(name, mats * K * N * s.weight_bytes * (Mt // mb), x_reads + out, 2.0 * Mt * TILE * K * N * mats,
              min(units, s.nodes))


def _qkv_rope(s: Shape) -> Op:
    """kernels.make_qkv_rope: a unit is one sample's Tp rows x one head; it reads the sample's rows of x twice and
    the gains, streams the head's weight columns (once per sample), and for a q / k head reads the head's gain,
    the rotation [d, d] and the sample's cos / sin rows; it writes q to L1 and the own k / v rows to the DRAM
    caches. The head's norm and RoPE work on the block the node holds: no qkv tensor is written or read."""
    M, heads, qk = s.B * s.T, s.Hq + 2 * s.Hkv, s.Hq + s.Hkv
    units = s.B * heads
    x_reads = units * s.D * s.act_bytes * (2 * s.T + TILE)
    rope_reads = s.B * qk * s.d * s.act_bytes * (TILE + s.d + 2 * s.T)
    return Op("(a) + (b) norm + qkv + q/k norm + rope + split",
              s.B * s.D * heads * s.d * s.weight_bytes + 2 * M * s.Hkv * s.d * s.kv_bytes,
              x_reads + rope_reads + M * s.Hq * s.d * s.act_bytes,
              2.0 * M * s.D * heads * s.d + 2.0 * M * qk * s.d * s.d, min(units, s.nodes))


def fused_ops(s: Shape) -> list[Op]:
    """The operations of kernels.py for one layer, as expert.py runs them."""
    G = s.Hq // s.Hkv
    Rt, dt, smaxt = G * s.T // TILE, s.d // TILE, s.smax // TILE
    nsplit = max(1, min(s.nodes // (s.B * s.Hkv), smaxt // s.key_chunk))
    tile = TILE * TILE
    # The key chunks attention reads (kernels.make_attention_partial): those holding context rows and those of
    # the own tail, or all of them; the splits stay over Smax, so only the splits holding such chunks are busy.
    n_chunks, chunk_rows = smaxt // s.key_chunk, s.key_chunk * TILE
    tail0 = (smaxt - s.T // TILE) // s.key_chunk
    n_ctx = n_chunks if s.S is None else -(-s.S // chunk_rows)
    read = [ch for ch in range(n_chunks) if ch < n_ctx or ch >= tail0]
    splits = [(i * n_chunks // nsplit, (i + 1) * n_chunks // nsplit) for i in range(nsplit)]
    busy_splits = sum(any(c0 <= ch < c1 for ch in read) for c0, c1 in splits)
    rows = len(read) * chunk_rows
    kv = 2 * s.B * s.Hkv * rows * s.d * s.kv_bytes
    # The mask (in L1) is read for the chunks holding left padding, S's boundary or the own tail (all, for the
    # seed's kernel); every unit reads its sample's three chunk counts (float32 tiles, in L1).
    lead, full = -(-s.pad // chunk_rows), (n_chunks if s.S is None else s.S // chunk_rows)
    masked = [ch for ch in read if s.S is None or ch < lead or ch >= full]
    mask = s.B * s.Hkv * len(masked) * s.key_chunk * tile * s.act_bytes
    counts = s.B * s.Hkv * nsplit * 3 * tile * 4
    attn = Op("(c) attention, partials", kv,
              s.B * s.Hkv * busy_splits * (Rt * dt * tile * s.act_bytes + Rt * (dt + 2) * tile * 4) + mask + counts,
              4.0 * s.B * s.Hq * s.T * rows * s.d, min(s.B * s.Hkv * busy_splits, s.nodes))
    # The merge: a unit per query row tile x column tile of a head, one pass over the splits that attended a
    # chunk (m, l and o, float32 tiles, read once each), its count tile, and its output tile.
    merge_units = s.B * s.Hkv * Rt * dt
    merge = Op("(c) attention, merge", 0, merge_units * ((busy_splits * 3 + 1) * tile * 4 + tile * s.act_bytes),
               0, min(merge_units, s.nodes))
    return [_qkv_rope(s), attn, merge,
            _linear("(d) o_proj + residual", s, s.Hq * s.d, s.D, norm=False),
            _linear("(e) norm + gate/up + silu", s, s.D, s.I, mats=2, norm=True),
            _linear("(f) down + residual", s, s.I, s.D, norm=False)]


def seed_ops(s: Shape) -> list[Op]:
    """The seed's ops that the model covers, as the seed ran them (separate matmuls with x multicast once, the
    SDPA decode kernel reading the whole cache and a bfp4 mask [128, Smax] per KV head)."""
    M, Nqkv = s.B * s.T, (s.Hq + 2 * s.Hkv) * s.d

    def mm(name, K, N):
        return Op(name, K * N * s.weight_bytes, M * (K + N) * s.act_bytes, 2.0 * M * K * N, s.nodes)
    kv = 2 * s.B * s.Hkv * s.smax * s.d * s.kv_bytes
    mask = s.Hkv * 128 * s.smax * 576 / 1024   # bfp4_b: 512 + 64 bytes per tile
    return [mm("wqkv", s.D, Nqkv), mm("wo", s.Hq * s.d, s.D), mm("w1_silu", s.D, s.I), mm("w3", s.D, s.I),
            mm("w2", s.I, s.D), Op("attention", kv + mask, 0, 4.0 * s.B * s.Hq * s.T * s.smax * s.d, s.nodes)]


def step_ms(s: Shape, dram_gbs: float = DRAM_ACHIEVED_GBS, host_ms: float = SEED_STEP_MS - 64 * 0.497) -> float:
    """Estimated device time of one Euler step: L fused layers, the final norm (one more launch), and the
    per-step transfers the seed measured (its traced step minus 64 back-to-back layers)."""
    return s.L * sum(op.us(dram_gbs) for op in fused_ops(s)) / 1e3 + LAUNCH_US / 1e3 + host_ms


def configurations(s: Shape) -> list[tuple[str, Shape]]:
    bfp8 = 1088 / 1024
    return [("Smax 8192, bf16 cache, whole cache read (the seed's attention)", replace(s, S=None)),
            ("Smax 8192, bf16 cache, valid rows read", s),
            ("Smax 8192, bfp8_b cache, valid rows read", replace(s, kv_bytes=bfp8)),
            ("Smax 5120, bfp8_b cache, valid rows read", replace(s, smax=5120, kv_bytes=bfp8))]


def report(s: Shape = Shape()) -> str:
    lines = ["| seed op | model (us) | seed measured (us) | model / seed |", "| --- | --- | --- | --- |"]
    for op in seed_ops(s):
        lines.append(f"| {op.name} | {op.us():.1f} | {SEED_US[op.name]} | {op.us() / SEED_US[op.name]:.2f} |")
    s8 = replace(s, kv_bytes=1088 / 1024)
    lines += ["", "| fused op | DRAM (MB) | NoC (MB) | GFLOP | nodes busy | model (us) | with the bfp8_b cache (us) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for op, op8 in zip(fused_ops(s), fused_ops(s8)):
        lines.append(f"| {op.name} | {op.dram / 1e6:.2f} | {op.noc / 1e6:.2f} | {op.flops / 1e9:.2f} | {op.busy} | "
                     f"{op.us():.1f} | {op8.us():.1f} |")
    lines.append(f"| layer | | | | | {sum(op.us() for op in fused_ops(s)):.1f} | "
                 f"{sum(op.us() for op in fused_ops(s8)):.1f} |")
    lines += ["", f"| configuration (S = {s.S:,}) | ms per step (255 GB/s achieved) | at 80% of peak DRAM |",
              "| --- | --- | --- |"]
    for label, v in configurations(s):
        lines.append(f"| {label} | {step_ms(v):.2f} | {step_ms(v, 0.8 * DRAM_PEAK_GBS):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
