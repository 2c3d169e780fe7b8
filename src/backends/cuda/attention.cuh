// Split-KV flash-decoding attention over the bound cache rows plus the expert's own tokens, on bf16 tensor
// cores (mma.sync m16n8k16, fp32 accumulation), and the log-sum-exp merge of the splits (device code;
// attention.cu launches it).
//
// One CTA = one work item (a key range [j0, j1) of one key sequence) x one KV head g x one tile of 128 query
// rows. The query rows of (b, g) are the group = Hq/Hkv heads sharing g times the T tokens (GQA heads
// packed: R = group * T = 128 rows for the seed, one tile); an item over a shared prompt takes the rows of all
// k samples reading it (k * R rows), so every key is read once per tile, not once per sample. 8 warps,
// 16 query rows each; keys stream through shared memory in blocks of 64 with a two-stage cp.async
// pipeline; scores, online softmax (base 2) and the output stay in registers (FlashAttention-2 layout).
#pragma once
#include "backends/cuda/kernels_common.cuh"

namespace alpamayo::ALP_CUDA_NS::kern {

constexpr int kAttnWarps = kAttnRowsPerCta / 16;
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int kAttnKB = kAttnKeysPerBlock;
constexpr int kAttnDP = kAttnMaxHeadDim;
constexpr int kAttnLD = kAttnDP + 8;  // shared row stride in bf16: 272 bytes, so fragment loads hit distinct banks
constexpr int kAttnStage = 2 * kAttnKB * kAttnLD;  // K block then V block
constexpr size_t kAttnSmemBytes = size_t(2) * kAttnStage * sizeof(uint16_t);
constexpr float kAttnMask = -1e30f;  // finite, so exp2 of differences never sees inf - inf

// One kernel body on purpose (about 180 lines): the tensor-core fragments, the online-softmax state and the
// cp.async pipeline live in registers and shared memory for the whole key loop; device functions taking them by
// reference would be inlined back into this shape anyway, and the pipeline's stages read best in order.
__global__ void __launch_bounds__(kAttnThreads, 1) attention_partial_k(AttnParams p, float scale_log2) {
  ALP_DYNAMIC_SMEM(uint16_t, smem);
  const AttnItem it = p.items[blockIdx.x];
  const int g = blockIdx.y, rows = it.nq * p.R;  // query rows: member i's rows are [i R, (i + 1) R)
  if (int(blockIdx.z) * kAttnRowsPerCta >= rows) return;  // the grid covers the widest item
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const int d = p.d, T = p.T;
  const int row0 = blockIdx.z * kAttnRowsPerCta + warp * 16;  // this warp's first query row
  const int nks = (d + 15) / 16;                              // k-steps of the score matmul
  const int d16 = nks * 16;                                   // head dim padded with zeros in shared memory

  // Query fragments (A operand, row-major 16 x 16 per k-step): a0 (row gr, col 2tq), a1 (row gr+8),
  // a2 (col +8), a3 (row +8, col +8). Rows >= nq R and columns >= d are zero.
  uint32_t qf[kAttnDP / 16][4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = row0 + gr + (r & 1) * 8;
    const uint16_t* qrow =
        row < rows ? p.q + ((size_t(p.members[it.q0 + row / p.R]) * p.Hkv + g) * p.R + row % p.R) * d : nullptr;
#pragma unroll
    for (int ks = 0; ks < kAttnDP / 16; ++ks) {
      const int col = ks * 16 + tq * 2 + (r >> 1) * 8;
      qf[ks][r] = qrow && col < d ? *reinterpret_cast<const uint32_t*>(qrow + col) : 0u;
    }
  }

  const size_t sg = size_t(it.sb) * p.Hkv + g;
  const uint16_t* kc = static_cast<const uint16_t*>(p.k_cache.base);
  const uint16_t* vc = static_cast<const uint16_t*>(p.v_cache.base);
  const uint16_t* kx = static_cast<const uint16_t*>(p.k_suffix.base);
  const uint16_t* vx = static_cast<const uint16_t*>(p.v_suffix.base);
  const uint16_t* ko = p.k_own + sg * T * d;
  const uint16_t* vo = p.v_own + sg * T * d;
  const int sx = it.np + it.ns;  // first own row in the sequence
  // Keys [jb, jb + 64) of the sequence prompt[pad, pad + np) ++ suffix[0, ns) ++ own[0, nown) into stage st;
  // zero beyond j1 and d. Cache rows are found through their views (strided or paged, kv_view_offset).
  auto load_block = [&](int jb, int st) {
    uint16_t* ks = smem + st * kAttnStage;
    uint16_t* vs = ks + kAttnKB * kAttnLD;
    const int cpr = d16 / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < kAttnKB * cpr; c += kAttnThreads) {
      const int r = c / cpr, col = (c % cpr) * 8, j = jb + r;
      const bool ok = j < it.j1 && col < d;
      const uint16_t *ksrc = ko, *vsrc = vo;
      if (ok) {
        if (j < it.np) {
          ksrc = kc + kv_view_offset(p.k_cache, it.prompt, g, it.pad + j) + col;
          vsrc = vc + kv_view_offset(p.v_cache, it.prompt, g, it.pad + j) + col;
        } else if (j < sx) {
          ksrc = kx + kv_view_offset(p.k_suffix, it.sb, g, j - it.np) + col;
          vsrc = vx + kv_view_offset(p.v_suffix, it.sb, g, j - it.np) + col;
        } else {
          ksrc = ko + size_t(j - sx) * d + col;
          vsrc = vo + size_t(j - sx) * d + col;
        }
      }
      cp_async16(ks + r * kAttnLD + col, ksrc, ok ? 16 : 0);
      cp_async16(vs + r * kAttnLD + col, vsrc, ok ? 16 : 0);
    }
    cp_async_commit();
  };

  float o[kAttnDP / 8][4];
#pragma unroll
  for (int i = 0; i < kAttnDP / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {kAttnMask, kAttnMask}, lrow[2] = {0.f, 0.f};

  const int nblocks = (it.j1 - it.j0 + kAttnKB - 1) / kAttnKB;
  load_block(it.j0, 0);
  for (int ib = 0; ib < nblocks; ++ib) {
    const int st = ib & 1, jb = it.j0 + ib * kAttnKB;
    if (ib + 1 < nblocks) {
      load_block(jb + kAttnKB, st ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* ks = smem + st * kAttnStage;
    const uint16_t* vs = ks + kAttnKB * kAttnLD;

    // Scores S = Q K^T for 64 keys: 8 n-tiles of 8 keys. B fragment: b0 = K[key gr][2tq..], b1 = +8 columns.
    float sc[kAttnKB / 8][4];
#pragma unroll
    for (int nt = 0; nt < kAttnKB / 8; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
      const uint16_t* krow = ks + (nt * 8 + gr) * kAttnLD + tq * 2;
#pragma unroll
      for (int kk = 0; kk < kAttnDP / 16; ++kk)
        if (kk < nks)
          mma_bf16(sc[nt], qf[kk], *reinterpret_cast<const uint32_t*>(krow + kk * 16),
                   *reinterpret_cast<const uint32_t*>(krow + kk * 16 + 8));
    }
    // Scale to base 2, mask keys beyond j1, and the block's row maxima (rows gr and gr+8; the 4 threads
    // of a quad share a row).
    float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
    for (int nt = 0; nt < kAttnKB / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = jb + nt * 8 + tq * 2 + (e & 1);
        const float v = key < it.j1 ? sc[nt][e] * scale_log2 : kAttnMask;
        sc[nt][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      alpha[i] = exp2f(mrow[i] - mx[i]);
      mrow[i] = mx[i];
    }
    float psum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < kAttnKB / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(sc[nt][e] - mrow[e >> 1]);
        sc[nt][e] = pe;
        psum[e >> 1] += pe;
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) lrow[i] = lrow[i] * alpha[i] + psum[i];
#pragma unroll
    for (int nd = 0; nd < kAttnDP / 8; ++nd) {
      o[nd][0] *= alpha[0];
      o[nd][1] *= alpha[0];
      o[nd][2] *= alpha[1];
      o[nd][3] *= alpha[1];
    }
    // O += P V: the score accumulators of n-tiles 2kk, 2kk+1 are exactly the A fragment of k-step kk.
    // V B fragments come transposed from shared memory: matrices (keys +0/+8) x (columns +0/+8).
#pragma unroll
    for (int kk = 0; kk < kAttnKB / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const uint16_t* vrow = vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kAttnLD + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < kAttnDP / 16; ++np)
        if (np < nks) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, vrow + np * 16);
          mma_bf16(o[2 * np], pa, vb[0], vb[1]);
          mma_bf16(o[2 * np + 1], pa, vb[2], vb[3]);
        }
    }
    __syncthreads();  // every warp is done with stage st before the next iteration refills it
  }

  // Row sums over the quad, then the partial results of this item.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
    lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + gr + half * 8;
    if (row >= rows) continue;
    const size_t at = (size_t(it.slot + row / p.R) * p.Hkv + g) * p.R + row % p.R;  // member's slot, its row
    float* po = p.part_o + at * d;
#pragma unroll
    for (int nd = 0; nd < kAttnDP / 8; ++nd) {
      const int col = nd * 8 + tq * 2;
      if (col < d) *reinterpret_cast<float2*>(po + col) = make_float2(o[nd][half * 2], o[nd][half * 2 + 1]);
    }
    if (tq == 0) {
      p.part_m[at] = mrow[half];
      p.part_l[at] = lrow[half];
    }
  }
}

// One warp per query row (b, g, r): O = sum_c 2^(m_c - M) O_c / sum_c 2^(m_c - M) l_c, written to the
// token-major attention output [B*T, Hq*d] at row b*T + t, columns of head g*group + r/T.
__global__ void attention_merge_k(AttnParams p, Act mode, void* out) {
  const int unit = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (unit >= p.B * p.Hkv * p.R) return;
  const int r = unit % p.R, bg = unit / p.R, g = bg % p.Hkv, b = bg / p.Hkv, d = p.d;
  const int* slots = p.slot_list + p.slot_range[2 * b];
  const int count = p.slot_range[2 * b + 1];
  float M = kAttnMask;
  for (int c = 0; c < count; ++c) M = fmaxf(M, p.part_m[(size_t(slots[c]) * p.Hkv + g) * p.R + r]);
  float L = 0.f, acc[kAttnDP / 32] = {};
  for (int c = 0; c < count; ++c) {
    const size_t at = (size_t(slots[c]) * p.Hkv + g) * p.R + r;
    const float w = exp2f(p.part_m[at] - M);
    L += p.part_l[at] * w;
    const float* po = p.part_o + at * d;
#pragma unroll
    for (int i = 0; i < kAttnDP / 32; ++i)
      if (lane + 32 * i < d) acc[i] += po[lane + 32 * i] * w;
  }
  const int t = r % p.T, h = g * p.group + r / p.T, ld = p.Hkv * p.group * d;
  const size_t base = size_t(b * p.T + t) * ld + size_t(h) * d;
  const float inv = 1.0f / L;
#pragma unroll
  for (int i = 0; i < kAttnDP / 32; ++i) {
    const int c = lane + 32 * i;
    if (c >= d) continue;
    if (mode == Act::BF16)
      static_cast<uint16_t*>(out)[base + c] = to_bf16_bits(acc[i] * inv);
    else
      static_cast<float*>(out)[base + c] = acc[i] * inv;
  }
}

}  // namespace alpamayo::ALP_CUDA_NS::kern
