// Split-KV flash-decoding attention over the bound cache rows plus the expert's own tokens, on bf16 tensor
// cores (mma.sync m16n8k16, fp32 accumulation), and the log-sum-exp merge of the splits.
//
// One CTA = one work item (a key range [j0, j1) of one sample) x one KV head g x one tile of 128 query
// rows. The query rows of (b, g) are the group = Hq/Hkv heads sharing g times the T tokens (GQA heads
// packed: R = group * T = 128 rows for the seed, one tile), so every key is read once per tile. 8 warps,
// 16 query rows each; keys stream through shared memory in blocks of 64 with a two-stage cp.async
// pipeline; scores, online softmax (base 2) and the output stay in registers (FlashAttention-2 layout).
#include "backends/cuda/kernels_common.cuh"

namespace alpamayo::cuda {

void preload_layer_kernels();
void preload_action_kernels();
void preload_cache_kernels();
void preload_gemm_kernels();

namespace {

constexpr int kWarps = kAttnRowsPerCta / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kKB = kAttnKeysPerBlock;
constexpr int kDP = kAttnMaxHeadDim;
constexpr int kLD = kDP + 8;  // shared row stride in bf16: 272 bytes, so fragment loads hit distinct banks
constexpr int kStage = 2 * kKB * kLD;  // K block then V block
constexpr size_t kSmemBytes = size_t(2) * kStage * sizeof(uint16_t);
constexpr float kMaskScore = -1e30f;  // finite, so exp2 of differences never sees inf - inf

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// D = A B + D, A 16x16 bf16 (row), B 16x8 bf16 (col), D 16x8 fp32.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices, transposed on load: lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__global__ void __launch_bounds__(kThreads, 1) attention_partial_k(AttnParams p, float scale_log2) {
  extern __shared__ __align__(16) uint16_t smem[];
  const AttnItem it = p.items[blockIdx.x];
  const int g = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const int d = p.d, T = p.T;
  const size_t bg = size_t(it.b) * p.Hkv + g;
  const int row0 = blockIdx.z * kAttnRowsPerCta + warp * 16;  // this warp's first query row
  const int nks = (d + 15) / 16;                               // k-steps of the score matmul
  const int d16 = nks * 16;                                    // head dim padded with zeros in shared memory

  // Query fragments (A operand, row-major 16 x 16 per k-step): a0 (row gr, col 2tq), a1 (row gr+8),
  // a2 (col +8), a3 (row +8, col +8). Rows >= R and columns >= d are zero.
  uint32_t qf[kDP / 16][4];
  const uint16_t* qb = p.q + bg * p.R * d;
#pragma unroll
  for (int ks = 0; ks < kDP / 16; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = row0 + gr + (r & 1) * 8, col = ks * 16 + tq * 2 + (r >> 1) * 8;
      qf[ks][r] = row < p.R && col < d ? *reinterpret_cast<const uint32_t*>(qb + size_t(row) * d + col) : 0u;
    }

  const uint16_t* kc = p.k_cache + bg * p.P * d;
  const uint16_t* vc = p.v_cache + bg * p.P * d;
  const uint16_t* ko = p.k_own + bg * T * d;
  const uint16_t* vo = p.v_own + bg * T * d;
  // Keys [jb, jb + 64) of the virtual sequence cache[0, S) ++ own[0, T) into stage st; zero beyond j1 and d.
  auto load_block = [&](int jb, int st) {
    uint16_t* ks = smem + st * kStage;
    uint16_t* vs = ks + kKB * kLD;
    const int cpr = d16 / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < kKB * cpr; c += kThreads) {
      const int r = c / cpr, col = (c % cpr) * 8, j = jb + r;
      const bool ok = j < it.j1 && col < d;
      size_t off = 0;
      const uint16_t *ksrc = kc, *vsrc = vc;
      if (ok) {
        if (j < it.S) {
          off = size_t(j) * d + col;
        } else {
          off = size_t(j - it.S) * d + col;
          ksrc = ko;
          vsrc = vo;
        }
      }
      cp_async16(ks + r * kLD + col, ksrc + off, ok ? 16 : 0);
      cp_async16(vs + r * kLD + col, vsrc + off, ok ? 16 : 0);
    }
    cp_async_commit();
  };

  float o[kDP / 8][4];
#pragma unroll
  for (int i = 0; i < kDP / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {kMaskScore, kMaskScore}, lrow[2] = {0.f, 0.f};

  const int nblocks = (it.j1 - it.j0 + kKB - 1) / kKB;
  load_block(it.j0, 0);
  for (int ib = 0; ib < nblocks; ++ib) {
    const int st = ib & 1, jb = it.j0 + ib * kKB;
    if (ib + 1 < nblocks) {
      load_block(jb + kKB, st ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* ks = smem + st * kStage;
    const uint16_t* vs = ks + kKB * kLD;

    // Scores S = Q K^T for 64 keys: 8 n-tiles of 8 keys. B fragment: b0 = K[key gr][2tq..], b1 = +8 columns.
    float sc[kKB / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKB / 8; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
      const uint16_t* krow = ks + (nt * 8 + gr) * kLD + tq * 2;
#pragma unroll
      for (int kk = 0; kk < kDP / 16; ++kk)
        if (kk < nks)
          mma_bf16(sc[nt], qf[kk], *reinterpret_cast<const uint32_t*>(krow + kk * 16),
                   *reinterpret_cast<const uint32_t*>(krow + kk * 16 + 8));
    }
    // Scale to base 2, mask keys beyond j1, and the block's row maxima (rows gr and gr+8; the 4 threads
    // of a quad share a row).
    float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
    for (int nt = 0; nt < kKB / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = jb + nt * 8 + tq * 2 + (e & 1);
        const float v = key < it.j1 ? sc[nt][e] * scale_log2 : kMaskScore;
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
    for (int nt = 0; nt < kKB / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(sc[nt][e] - mrow[e >> 1]);
        sc[nt][e] = pe;
        psum[e >> 1] += pe;
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) lrow[i] = lrow[i] * alpha[i] + psum[i];
#pragma unroll
    for (int nd = 0; nd < kDP / 8; ++nd) {
      o[nd][0] *= alpha[0];
      o[nd][1] *= alpha[0];
      o[nd][2] *= alpha[1];
      o[nd][3] *= alpha[1];
    }
    // O += P V: the score accumulators of n-tiles 2kk, 2kk+1 are exactly the A fragment of k-step kk.
    // V B fragments come transposed from shared memory: matrices (keys +0/+8) x (columns +0/+8).
#pragma unroll
    for (int kk = 0; kk < kKB / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const uint16_t* vrow = vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLD + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < kDP / 16; ++np)
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
  const size_t slot = size_t(blockIdx.x) * p.Hkv + g;
  float* po = p.part_o + slot * p.Rp * d;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + gr + half * 8;
    if (row >= p.R) continue;
#pragma unroll
    for (int nd = 0; nd < kDP / 8; ++nd) {
      const int col = nd * 8 + tq * 2;
      if (col < d)
        *reinterpret_cast<float2*>(po + size_t(row) * d + col) = make_float2(o[nd][half * 2], o[nd][half * 2 + 1]);
    }
    if (tq == 0) {
      p.part_m[slot * p.Rp + row] = mrow[half];
      p.part_l[slot * p.Rp + row] = lrow[half];
    }
  }
}

// One warp per query row (b, g, r): O = sum_c 2^(m_c - M) O_c / sum_c 2^(m_c - M) l_c, written to the
// token-major attention output [B*T, Hq*d] at row b*T + t, columns of head g*group + r/T.
__global__ void attention_merge_k(AttnParams p, Act mode, void* out) {
  const int unit = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (unit >= p.B * p.Hkv * p.R) return;
  const int r = unit % p.R, bg = unit / p.R, g = bg % p.Hkv, b = bg / p.Hkv, d = p.d;
  const int first = p.item_range[2 * b], count = p.item_range[2 * b + 1];
  float M = kMaskScore;
  for (int c = 0; c < count; ++c) M = fmaxf(M, p.part_m[(size_t(first + c) * p.Hkv + g) * p.Rp + r]);
  float L = 0.f, acc[kDP / 32] = {};
  for (int c = 0; c < count; ++c) {
    const size_t slot = size_t(first + c) * p.Hkv + g;
    const float w = exp2f(p.part_m[slot * p.Rp + r] - M);
    L += p.part_l[slot * p.Rp + r] * w;
    const float* po = p.part_o + (slot * p.Rp + r) * d;
#pragma unroll
    for (int i = 0; i < kDP / 32; ++i)
      if (lane + 32 * i < d) acc[i] += po[lane + 32 * i] * w;
  }
  const int t = r % p.T, h = g * p.group + r / p.T, ld = p.Hkv * p.group * d;
  const size_t base = size_t(b * p.T + t) * ld + size_t(h) * d;
  const float inv = 1.0f / L;
#pragma unroll
  for (int i = 0; i < kDP / 32; ++i) {
    const int c = lane + 32 * i;
    if (c >= d) continue;
    if (mode == Act::BF16)
      static_cast<uint16_t*>(out)[base + c] = to_bf16_bits(acc[i] * inv);
    else
      static_cast<float*>(out)[base + c] = acc[i] * inv;
  }
}

}  // namespace

void attention_partial(cudaStream_t s, const AttnParams& p) {
  const float scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(p.d));
  const dim3 grid(p.n_items, p.Hkv, p.Rp / kAttnRowsPerCta);
  attention_partial_k<<<grid, kThreads, kSmemBytes, s>>>(p, scale_log2);
  ALP_LAUNCHED("attention_partial");
}

void attention_merge(cudaStream_t s, const AttnParams& p, Act mode, void* out) {
  const int threads = p.B * p.Hkv * p.R * 32;
  attention_merge_k<<<(threads + 255) / 256, 256, 0, s>>>(p, mode, out);
  ALP_LAUNCHED("attention_merge");
}

int prepare_kernels() {
  ALP_CUDA(cudaFuncSetAttribute(attention_partial_k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kSmemBytes)));
  cudaFuncAttributes attr;
  ALP_CUDA(cudaFuncGetAttributes(&attr, attention_merge_k));
  preload_layer_kernels();
  preload_action_kernels();
  preload_cache_kernels();
  preload_gemm_kernels();
  int ctas = 0;
  ALP_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, attention_partial_k, kThreads, kSmemBytes));
  return ctas > 0 ? ctas : 1;
}

}  // namespace alpamayo::cuda
