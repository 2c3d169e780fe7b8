// The skinny weight matmul of our own (device code; skinny_gemm.cu launches it): Y_s [M, N] = X [M, K] W[:, ks]^T over
// the K range of split s, with X bf16 and W bf16 or fp8 e4m3 (converted to bf16 in registers, exactly: W8A16), fp32
// accumulation on tensor cores (mma.sync m16n8k16). Built for M = 64 * B token rows against wide weights: the weight
// rows are the MMA's M side (swap-AB), a CTA streams 128 weight rows x 64 tokens through a multi-stage
// cp.async pipeline, and split-K spreads small N over every SM. The splits are summed by the consumers in
// a fixed order (bitwise reproducible; no atomics).
#pragma once
#include "backends/cuda/kernels_common.cuh"

namespace alpamayo::ALP_CUDA_NS::kern {

constexpr int kGemmWarps = 4;
constexpr int kGemmThreads = kGemmWarps * 32;
constexpr int kCh = kGemmWarps * 32;  // weight rows (output channels) per CTA: 32 per warp
constexpr int kTok = 64;              // token rows per CTA
constexpr int kKC = 64;               // K per pipeline stage

template <bool kFp8>
struct GemmCfg {
  static constexpr int kStages = kFp8 ? 4 : 3;             // <= 99 KB of shared memory (sm_89, sm_120)
  static constexpr int kWRow = kKC * (kFp8 ? 1 : 2) + 16;  // bytes per weight row in shared memory
  static constexpr int kXRow = kKC * 2 + 16;               // bytes per token row
  static constexpr int kStageBytes = kCh * kWRow + kTok * kXRow;
  static constexpr int kSmem = kStages * kStageBytes;
};

// Two consecutive weights (k, k+1) of one row as a bf16 pair (low half = k).
template <bool kFp8>
__device__ __forceinline__ uint32_t weight_pair(const uint8_t* row, int k) {
  if constexpr (kFp8) {
    const __nv_fp8x2_storage_t v = *reinterpret_cast<const __nv_fp8x2_storage_t*>(row + k);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);  // exact: e4m3 values are bf16 values
    return *reinterpret_cast<const uint32_t*>(&b);
  } else {
    return *reinterpret_cast<const uint32_t*>(row + 2 * k);
  }
}

// One kernel body on purpose (about 90 lines): the per-thread accumulators stay in registers and the weight and
// activation stream's multi-stage cp.async pipeline in shared memory across the whole K loop.
template <bool kFp8>
__global__ void __launch_bounds__(kGemmThreads)
    skinny_gemm_k(const uint16_t* __restrict__ X, const uint8_t* __restrict__ W, float* __restrict__ Y, int M, int N,
                  int K, int chunks_per_split, size_t split_stride) {
  using C = GemmCfg<kFp8>;
  ALP_DYNAMIC_SMEM(uint8_t, smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int ch0 = blockIdx.x * kCh, tok0 = blockIdx.y * kTok;
  const int chunks = (K + kKC - 1) / kKC;
  const int c0 = blockIdx.z * chunks_per_split, c1 = min(chunks, c0 + chunks_per_split);
  const int nch = max(0, c1 - c0);
  constexpr int wb = kFp8 ? 1 : 2;  // bytes per weight

  auto load = [&](int chunk, int slot) {
    uint8_t* ws = smem + slot * C::kStageBytes;
    uint8_t* xs = ws + kCh * C::kWRow;
    const int k0 = chunk * kKC;
    constexpr int wchunks = kKC * wb / 16;  // 16-byte pieces per weight row
    for (int i = threadIdx.x; i < kCh * wchunks; i += kGemmThreads) {
      const int r = i / wchunks, kb = (i % wchunks) * 16;  // byte offset in the row's K range
      const int k = k0 + kb / wb;
      const bool ok = ch0 + r < N && k < K;
      const uint8_t* src = ok ? W + (size_t(ch0 + r) * K + k) * wb : W;
      cp_async16(ws + r * C::kWRow + kb, src, ok ? 16 : 0);
    }
    constexpr int xchunks = kKC * 2 / 16;
    for (int i = threadIdx.x; i < kTok * xchunks; i += kGemmThreads) {
      const int r = i / xchunks, kb = (i % xchunks) * 16;
      const int k = k0 + kb / 2;
      const bool ok = tok0 + r < M && k < K;
      const uint16_t* src = ok ? X + size_t(tok0 + r) * K + k : X;
      cp_async16(xs + r * C::kXRow + kb, src, ok ? 16 : 0);
    }
  };

  float acc[2][kTok / 8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int n = 0; n < kTok / 8; ++n) acc[a][n][0] = acc[a][n][1] = acc[a][n][2] = acc[a][n][3] = 0.f;

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nch) load(c0 + s, s);
    cp_async_commit();
  }
  for (int c = 0; c < nch; ++c) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // chunk c has landed for everyone; everyone is done with chunk c - 1's slot
    if (c + C::kStages - 1 < nch) load(c0 + c + C::kStages - 1, (c + C::kStages - 1) % C::kStages);
    cp_async_commit();
    const uint8_t* ws = smem + (c % C::kStages) * C::kStageBytes;
    const uint8_t* xs = ws + kCh * C::kWRow;
#pragma unroll
    for (int kk = 0; kk < kKC / 16; ++kk) {
      // A: weight rows (16 per tile, 2 tiles per warp) x 16 k: a0 (row g, k 2t), a1 (row g+8), a2 (k+8), a3.
      uint32_t a[2][4];
#pragma unroll
      for (int ct = 0; ct < 2; ++ct) {
        const uint8_t* r0 = ws + (warp * 32 + ct * 16 + g) * C::kWRow;
        const uint8_t* r8 = r0 + 8 * C::kWRow;
        const int k = kk * 16 + 2 * t;
        a[ct][0] = weight_pair<kFp8>(r0, k);
        a[ct][1] = weight_pair<kFp8>(r8, k);
        a[ct][2] = weight_pair<kFp8>(r0, k + 8);
        a[ct][3] = weight_pair<kFp8>(r8, k + 8);
      }
      // B: 16 k x 8 tokens: b0 = X[token g][k 2t, 2t+1], b1 = k + 8.
#pragma unroll
      for (int nt = 0; nt < kTok / 8; ++nt) {
        const uint8_t* xr = xs + (nt * 8 + g) * C::kXRow + (kk * 16 + 2 * t) * 2;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(xr);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(xr + 16);
        mma_bf16(acc[0][nt], a[0], b0, b1);
        mma_bf16(acc[1][nt], a[1], b0, b1);
      }
    }
  }
  cp_async_wait<0>();

  // acc[ct][nt][e]: channel ct*16 + g + 8*(e >> 1), token nt*8 + 2t + (e & 1).
  float* out = Y + blockIdx.z * split_stride;
#pragma unroll
  for (int ct = 0; ct < 2; ++ct)
#pragma unroll
    for (int nt = 0; nt < kTok / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ch = ch0 + warp * 32 + ct * 16 + g + 8 * (e >> 1), tok = tok0 + nt * 8 + 2 * t + (e & 1);
        if (ch < N && tok < M) out[size_t(tok) * N + ch] = acc[ct][nt][e];
      }
}

}  // namespace alpamayo::ALP_CUDA_NS::kern
