// Host-side launchers of the cuda backend's kernels. Every launcher enqueues on `s` and never
// synchronizes, so all of them may be captured into a CUDA graph. Tensors are row-major; bf16 values travel
// as uint16_t and fp8 e4m3 values as uint8_t, so this header needs no CUDA math headers.
// Sizes are validated by the caller (the session); kernels assume them.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cuda_ns.h"

namespace alpamayo::ALP_CUDA_NS {

// What a row kernel writes for the next matmul: bf16, fp8 e4m3 with one scale per row, or fp32.
enum class Act { BF16, FP8, F32 };

// Largest e4m3 magnitude; per-row and per-channel scales map each row's max |x| onto it.
constexpr float kFp8Max = 448.f;

// A weight matmul's fp32 output [M, ld] as the next kernel reads it: the sum of `splits` split-K partial
// products (`stride` floats apart, summed in order), times rs[m] (the row scales of fp8 activations) and
// cs[c] (the per-channel scales of fp8 weights) where those are non-null.
struct MatOut {
  const float* y = nullptr;
  int ld = 0;
  int splits = 1;
  size_t stride = 0;
  const float* rs = nullptr;
  const float* cs = nullptr;
};

// ---- the skinny weight matmul of our own (skinny_gemm.cu) -----------------------------------------------
// Y_s [M, N] (fp32, split s at Y + s * split_stride) = X [M, K] (bf16) W^T over split s's K range, W [N, K]
// bf16 or fp8 e4m3 (unscaled; the consumer applies the channel scales). K must be a multiple of 16.
struct SkinnyPlan {
  int N = 0, K = 0, M = 0;
  bool fp8 = false;
  int splits = 1, chunks_per_split = 1;
};
SkinnyPlan plan_skinny_gemm(int N, int K, int M, int sm_count, bool fp8);
void skinny_gemm(cudaStream_t s, const SkinnyPlan& p, const uint16_t* X, const void* W, float* Y, size_t split_stride);

// ---- expert layer (layer.cu) ------------------------------------------------------------------
// For rows m < M: h[m] += y[m] (no add when y.y is null), then out[m] = w * (h[m] / sqrt(mean(h[m]^2) + eps))
// as `mode` (FP8: out_rs[m] gets the row scale). out_rs may be y.rs: each row reads its scale first.
void residual_rmsnorm(cudaStream_t s, float* h, const MatOut& y, const float* w, int M, int D, float eps, Act mode,
                      void* out, float* out_rs);

// qkv [M, (Hq + 2 Hkv) d] -> per head RMSNorm over d (q_norm / k_norm) and rotate_half rotary with cos/sin
// [M, d] for q and k; writes bf16 q [B, Hq, T, d], k and v [B, Hkv, T, d]. Row m is token t = m % T of
// sample b = m / T.
void qk_norm_rope(cudaStream_t s, const MatOut& qkv, const float* q_norm, const float* k_norm, const float* cos,
                  const float* sin, int B, int T, int Hq, int Hkv, int d, float eps, uint16_t* q, uint16_t* k,
                  uint16_t* v);

// gu [M, 2I] (gate columns then up columns) -> out [M, I] = silu(gate) * up as `mode` (bf16, or fp8 with
// out_rs, which may be gu.rs).
void silu_mul(cudaStream_t s, const MatOut& gu, int M, int I, Act mode, void* out, float* out_rs);

// Symmetric per-row e4m3: rs[m] = max|x[m]| / 448 (1 for a zero row), q = x / rs[m] (saturating).
void quantize_rows_fp8(cudaStream_t s, const float* x, int M, int n, uint8_t* q, float* rs);

// Weights [N, K] fp32 -> e4m3 with per-output-channel scales scale[n] = max|w[n]| / 448.
void quantize_weight_fp8(cudaStream_t s, const float* w, int N, int K, uint8_t* q, float* scale);

// ---- action projections and the Euler update (action.cu) ---------------------------------------
// Fourier features of x [M, A] and the time times[k]: out [M, (A+1) F] (docs/MATH.md section 3), freqs
// [(A+1), F/2] (A action sets then the timestep set).
void fourier_features(cudaStream_t s, const float* x, const float* times, int k, const float* freqs, int M, int A,
                      int F, float* out);
// y [M, N] = x [M, K] W^T + b, fp32 (W [N, K]); silu applied when asked.
void linear_f32(cudaStream_t s, const float* x, int M, int K, const float* W, const float* b, int N, bool silu,
                float* y);
// y = w * (x / sqrt(mean(x^2) + eps)) per row (in place allowed).
void rms_norm_f32(cudaStream_t s, const float* x, const float* w, int M, int n, float eps, float* y);
// LayerNorm per row with biased variance (two passes), eps as given.
void layer_norm_f32(cudaStream_t s, const float* x, const float* w, const float* b, int M, int n, float eps, float* y);
// v [M, A] = hidden [M, D] W^T + b (fp32); with classifier-free guidance (hidden_u non-null, the unguided
// pass's output) v = wu (hidden_u W^T + b) + wg v, fp32 products as the host loop. x += (times[k+1] - times[k]) v;
// no FMA contraction anywhere, as the host does; writes v to v_out and the new x to x_out.
void out_proj_euler(cudaStream_t s, const float* hidden, const float* hidden_u, float wu, float wg, const float* W,
                    const float* b, int M, int D, int A, const float* times, int k, float* x, float* v_out,
                    float* x_out);

// ---- KV caches (cache.cu) ---------------------------------------------------------------------
enum class CacheType { F32, F16, BF16 };

// A cache tensor as the kernels address it, as kv_row_offset (alpamayo/backend.h) does: row i of head h of
// sequence n (a prompt, or a sample's suffix) starts `kv_view_offset` elements past base. Dense: n * seq +
// h * head + i * row. Paged: pages[n * width + i / page_size] * seq + h * head + (i % page_size) * row, the page
// table in device memory (bound once per binding, so a captured graph reads it from a fixed address).
struct KVView {
  const void* base = nullptr;
  int64_t seq = 0, head = 0, row = 0;  // strides in elements (seq: between pages when paged)
  const int64_t* pages = nullptr;      // device; null: dense
  int width = 0;                       // page table entries per sequence
  int page_shift = 0;                  // log2 of the page size
};

// Smallest logical flat index ((n * H + h) * P + i) * d + c of a NaN/Inf among the rows read, [lo[n], hi[n]) of
// each sequence (lo, hi on the device), atomically min-ed into *first (initialize it to ~0ull).
void scan_nonfinite(cudaStream_t s, const KVView& v, CacheType t, int B, int H, int P, int d, const int* lo,
                    const int* hi, unsigned long long* first);
// Rows [lo[n], hi[n]) of the view -> bf16 in the dense [B, H, P, d] dst (other rows are left as they are).
void convert_cache_bf16(cudaStream_t s, const KVView& v, CacheType t, int B, int H, int P, int d, const int* lo,
                        const int* hi, uint16_t* dst);

// ---- attention (attention.cu) -------------------------------------------------------------------------
// Split-KV flash decoding for the expert, as a cascade over shared prompts: per sample b and KV head g, the
// group = Hq/Hkv query heads times T tokens form R = group * T query rows. A work item is a key range
// [j0, j1) of one key sequence and the query rows of the samples that read it: a prompt shared by k samples
// is one sequence (its rows after the left padding) read once for all k * R rows, and each sample's own
// sequence is its suffix rows then its T own rows (preceded by its prompt's rows when no other sample reads
// that prompt). One CTA runs (item, g, 128-row tile) and writes, per query sample, unnormalized partial
// outputs with their running max and sum (base 2) into that sample's slot; the merge combines each sample's
// slots by log-sum-exp.
constexpr int kAttnRowsPerCta = 128;
constexpr int kAttnKeysPerBlock = 64;
constexpr int kAttnMaxHeadDim = 128;

// Key rows [j0, j1) of the sequence: prompt rows [pad, pad + np) of prompt `prompt`, then suffix rows [0, ns)
// of sample sb, then own rows [0, nown) of sample sb (a prompt pass has ns = nown = 0). Query samples:
// members[q0 .. q0 + nq); the partials of member i go to slot `slot + i`.
struct AttnItem {
  int j0, j1;
  int prompt, pad, np;
  int sb, ns, nown;
  int q0, nq, slot;
};

struct AttnParams {
  const uint16_t* q = nullptr;        // [B, Hkv, R, d] (= [B, Hq, T, d])
  KVView k_cache, v_cache;          // bf16 prompts (G sequences of P rows), rows 16-byte aligned
  KVView k_suffix, v_suffix;        // bf16 suffixes (B sequences of Q rows); null base without suffixes
  const uint16_t* k_own = nullptr;  // [B, Hkv, T, d]
  const uint16_t* v_own = nullptr;
  const AttnItem* items = nullptr;  // device, n_items
  const int* members = nullptr;     // device: the query samples of the items
  const int* slot_list = nullptr;   // device: each sample's slots, in merge order
  const int* slot_range = nullptr;  // device, [B, 2]: first entry in slot_list and slot count of each sample
  float* part_o = nullptr;          // [slots, Hkv, R, d]
  float* part_m = nullptr;          // [slots, Hkv, R]
  float* part_l = nullptr;
  int n_items = 0, B = 0, Hkv = 0, group = 0, T = 0, P = 0, Q = 0, d = 0;
  int R = 0;      // query rows per (b, g)
  int tiles = 1;  // 128-row query tiles of the widest item (the grid's z)
};

void attention_partial(cudaStream_t s, const AttnParams& p);
// Merges the partials by log-sum-exp into out [B*T, Hq*d] as bf16 (mode BF16) or fp32 (mode F32).
void attention_merge(cudaStream_t s, const AttnParams& p, Act mode, void* out);

// Kernel attributes (the attention kernel's shared memory) and module loading for the current device;
// called once per model before any capture. Returns the attention CTAs that fit on one SM.
int prepare_kernels();
// Skinny matmul CTAs that fit on one SM.
int skinny_gemm_ctas_per_sm(bool fp8);

}  // namespace alpamayo::ALP_CUDA_NS
