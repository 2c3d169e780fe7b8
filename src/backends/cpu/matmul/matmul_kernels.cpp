// matmul_kernels.h: packing, dispatch, and the portable kernel (plain C++, std::fma: the same FMA chain as the ISA
// kernels, so the same bits; the fallback where neither AVX2 nor AVX-512 runs, and the tests' oracle).
#include "backends/cpu/matmul/matmul_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {
namespace {

float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

const char* matmul_kernel_name(MatmulKernel k) {
  switch (k) {
    case MatmulKernel::Avx512: return "avx512_fma";
    case MatmulKernel::Avx2: return "avx2_fma";
    case MatmulKernel::Portable: return "portable_fma";
    case MatmulKernel::Avx512Vnni: return "avx512_vnni";
    case MatmulKernel::Avx512Bf16: return "avx512_bf16";
    case MatmulKernel::Avx2Int8: return "avx2_int8";
    case MatmulKernel::AmxBf16: return "amx_bf16";
    case MatmulKernel::AmxInt8: return "amx_int8";
  }
  return "?";
}

bool matmul_kernel_takes_bf16(MatmulKernel k) {
  return k != MatmulKernel::Avx512Vnni && k != MatmulKernel::Avx2Int8 && k != MatmulKernel::AmxInt8;
}
bool matmul_kernel_takes_int8(MatmulKernel k) { return k != MatmulKernel::Avx512Bf16 && k != MatmulKernel::AmxBf16; }

bool matmul_kernel_runnable(MatmulKernel k, const IsaInfo& i) {
  switch (k) {
    case MatmulKernel::Avx512: return i.has(kAvx512);
    case MatmulKernel::Avx2:
    case MatmulKernel::Avx2Int8: return i.has(kAvx2Fma);
    case MatmulKernel::Portable: return true;
    case MatmulKernel::Avx512Vnni: return i.has(kAvx512) && i.has(kAvx512Vnni);
    case MatmulKernel::Avx512Bf16: return i.has(kAvx512) && i.has(kAvx512Bf16);
    case MatmulKernel::AmxBf16: return i.has(kAvx512) && i.has(kAmxBf16);
    case MatmulKernel::AmxInt8: return i.has(kAvx512) && i.has(kAmxInt8);
  }
  return false;
}

std::string matmul_kernel_unavailable(MatmulKernel k, const IsaInfo& i) {
  if (matmul_kernel_runnable(k, i)) return "";
  const char* needs = k == MatmulKernel::Avx512       ? "needs AVX-512"
                      : k == MatmulKernel::Avx2 || k == MatmulKernel::Avx2Int8 ? "needs AVX2 + FMA"
                      : k == MatmulKernel::Avx512Vnni ? "needs AVX-512 with AVX512-VNNI"
                      : k == MatmulKernel::AmxBf16    ? "needs AVX-512 with AMX-BF16 (and the OS's permission for tiles)"
                      : k == MatmulKernel::AmxInt8    ? "needs AVX-512 with AMX-INT8 (and the OS's permission for tiles)"
                                                   : "needs AVX-512 with AVX512-BF16";
  return std::string(needs) + " (usable here: " + i.describe() + ")";
}

std::string matmul_kernel_refuses(MatmulKernel k, bool int8, int K) {
  if (!int8 && !matmul_kernel_takes_bf16(k)) return "multiplies int8 weights only";
  if (int8 && !matmul_kernel_takes_int8(k)) return "multiplies bf16 weights only";
  if ((k == MatmulKernel::Avx512Vnni || k == MatmulKernel::AmxInt8) && K > kVnniMaxK)
    return "sums K = " + std::to_string(K) + " products in int32; at most " + std::to_string(kVnniMaxK) +
           " cannot overflow";
  if (k == MatmulKernel::Avx2Int8 && K > kAvx2Int8MaxK)
    return "sums K = " + std::to_string(K) + " products in int32; at most " + std::to_string(kAvx2Int8MaxK) +
           " cannot overflow";
  return "";
}

const char* matmul_kernel_instruction(MatmulKernel k) {
  switch (k) {
    case MatmulKernel::Avx512: return "vfmadd231ps zmm";
    case MatmulKernel::Avx2: return "vfmadd231ps ymm";
    case MatmulKernel::Portable: return "";
    case MatmulKernel::Avx512Vnni: return "vpdpbusd zmm";
    case MatmulKernel::Avx512Bf16: return "vdpbf16ps zmm";
    case MatmulKernel::Avx2Int8: return "vpmaddwd ymm";
    case MatmulKernel::AmxBf16: return "tdpbf16ps tmm";
    case MatmulKernel::AmxInt8: return "tdpbusd tmm";
  }
  return "";
}

bool matmul_kernel_from_name(const std::string& name, MatmulKernel* k) {
  for (MatmulKernel c : kMatmulKernels)
    if (name == matmul_kernel_name(c)) {
      *k = c;
      return true;
    }
  return false;
}

int matmul_k_span(MatmulKernel k) {
  return k == MatmulKernel::Avx512Vnni || k == MatmulKernel::Avx512Bf16 || k == MatmulKernel::AmxBf16 ||
                 k == MatmulKernel::AmxInt8
             ? kDotKSpan
             : kFmaKSpan;
}

int matmul_panel_width(MatmulKernel k) {
  return k == MatmulKernel::Avx2 || k == MatmulKernel::Portable || k == MatmulKernel::Avx2Int8 ? 16 : 64;
}

int matmul_packed_slot(MatmulKernel k, bool int8, int j) {
  if (k != MatmulKernel::Avx512 || int8) return j;
  return j / 32 * 32 + j % 16 * 2 + j % 32 / 16;
}

int matmul_k_group(MatmulKernel k) {
  return k == MatmulKernel::Avx512Vnni || k == MatmulKernel::AmxInt8 ? 4
         : k == MatmulKernel::Avx2Int8 || k == MatmulKernel::Avx512Bf16 || k == MatmulKernel::AmxBf16 ? 2
                                                                                                       : 1;
}

namespace {
// Bytes of the packed layout of an [N, K] matrix: whole panels of matmul_panel_width(k) columns, K rounded up to the
// k-group.
size_t layout_bytes(MatmulKernel k, bool int8, int K, int N) {
  const int g = matmul_k_group(k), w = matmul_panel_width(k);
  const size_t panels = (size_t(std::max(N, 0)) + w - 1) / w, Kq = (size_t(std::max(K, 0)) + g - 1) / g * g;
  return panels * Kq * w * (int8 ? 1 : 2);
}
}  // namespace

size_t MatmulWeights::packed_bytes(MatmulKernel k, bool int8, int K, int N) {
  return (layout_bytes(k, int8, K, N) + 63) / 64 * 64;
}

template <class T>
void MatmulWeights::pack_with(MatmulKernel k, int K, int N, const T* W, MatmulArena* arena) {
  if (K < 1 || N < 0) throw Error(ErrorCode::Internal, "run_matmul: cannot pack a " + std::to_string(N) + "x" + std::to_string(K) + " matrix");
  if (const std::string why = matmul_kernel_refuses(k, std::is_same_v<T, int8_t>, K); !why.empty())
    throw Error(ErrorCode::Unsupported, std::string("run_matmul: kernel ") + matmul_kernel_name(k) + " " + why);
  kernel_ = k;
  K_ = K;
  N_ = N;
  // The dot-product kernels: each span's rows in groups of g, [ceil(ks / g)][w][g] (dot_matmul_avx512.cpp,
  // dot_matmul_avx2.cpp); the others [ks][w].
  const int g = matmul_k_group(k);
  const int w = matmul_panel_width(k), panels = (N + w - 1) / w;
  bytes_ = layout_bytes(k, std::is_same_v<T, int8_t>, K, N);
  buf_.reset();
  off_ = 0;
  if (bytes_ == 0) return;
  std::shared_ptr<HugeBuf> buf;
  if (arena) {
    const size_t need = packed_bytes(k, std::is_same_v<T, int8_t>, K, N);
    const size_t left = arena->size - std::min(arena->size, arena->used);
    if (left < need)
      throw Error(ErrorCode::Internal, "run_matmul: a packed " + std::to_string(N) + "x" + std::to_string(K) + " matrix needs " +
                  std::to_string(need) + " bytes of its arena, which has " + std::to_string(left) + " left");
    buf = arena->buf;
    off_ = arena->used;
    arena->used += need;
  } else {
    buf = std::make_shared<HugeBuf>(bytes_);
  }
  auto* dst = reinterpret_cast<T*>(static_cast<char*>(buf->data()) + off_);
  std::vector<int> slot(w);
  for (int j = 0; j < w; ++j) slot[j] = matmul_packed_slot(k, std::is_same_v<T, int8_t>, j);
  // Written in order, a packed row (one k-group of the panel's columns) at a time: column-major writes, a
  // strided store per element, made packing a full-size model take seconds.
  const int span = matmul_k_span(k);
  for (int k0 = 0; k0 < K; k0 += span) {
    const int ks = std::min(span, K - k0), ksq = (ks + g - 1) / g * g;
    for (int p = 0; p < panels; ++p) {
      T* panel = dst + size_t(k0) * panels * w + size_t(p) * ksq * w;
      const int cols = std::min(w, N - p * w);
      for (int kq = 0; kq < ksq; kq += g) {
        T* row = panel + size_t(kq) * w;
        const int kn = std::min(g, ks - kq);  // valid k of this group
        for (int j = 0; j < w; ++j) {
          T* out = row + size_t(slot[j]) * g;
          const int n = p * w + j;
          int e = 0;
          if (j < cols) {
            const T* from = W + size_t(n) * K + k0 + kq;
            if (kn == g && sizeof(T) * g == 4) {
              std::memcpy(out, from, 4);  // the dot-product kernels' groups: one word, a copy of a constant size
              continue;
            }
            if (kn == g && sizeof(T) * g == 2) {
              std::memcpy(out, from, 2);
              continue;
            }
            for (; e < kn; ++e) out[e] = from[e];
          }
          for (; e < g; ++e) out[e] = T(0);
        }
      }
    }
  }
  buf_ = std::move(buf);
}

void MatmulWeights::pack(MatmulKernel k, const float* W, int K, int N, MatmulArena* arena) {
  // Rounded in one vectorised pass, then copied: rounding inside the packing's transposition took most of a
  // bf16 model's packing time.
  std::vector<uint16_t> b(size_t(std::max(N, 0)) * std::max(K, 0));
  const size_t n = b.size();
#pragma omp simd
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(W[i]);
  pack_bf16(k, b.data(), K, N, arena);
}

void MatmulWeights::pack_bf16(MatmulKernel k, const uint16_t* W, int K, int N, MatmulArena* arena) {
  pack_with<uint16_t>(k, K, N, W, arena);
  type_ = MatmulType::BF16;
  corr_.clear();
  scale_.clear();
}

void MatmulWeights::pack_s8(MatmulKernel k, const int8_t* Wq, const float* scales, int K, int N, MatmulArena* arena) {
  pack_with<int8_t>(k, K, N, Wq, arena);
  type_ = MatmulType::INT8;
  corr_.assign(N, 0.f);
  scale_.assign(scales, scales + N);
  colsum_.clear();
  if (k == MatmulKernel::Avx512Vnni || k == MatmulKernel::AmxInt8) {
    colsum_.assign(N, 0);
    for (int n = 0; n < N; ++n) {
      const int8_t* w = Wq + size_t(n) * K;
      int32_t sum = 0;  // a local: int8_t may alias colsum_, so a sum kept there is reloaded and stored per term
#pragma omp simd reduction(+ : sum)
      for (int kk = 0; kk < K; ++kk) sum += w[kk];
      colsum_[n] = sum;
    }
  }
}

void MatmulWeights::pack_int8(MatmulKernel k, const float* W, int K, int N, MatmulArena* arena) {
  std::vector<int8_t> q(size_t(std::max(N, 0)) * std::max(K, 0));
  std::vector<float> scales(std::max(N, 0));
  quantize_weight_rows(W, K, N, q.data(), scales.data(), nullptr);
  pack_s8(k, q.data(), scales.data(), K, N, arena);
}

size_t matmul_scratch_bytes(MatmulKernel k, int M, int K) {
  if (k == MatmulKernel::AmxBf16) return amx_matmul_scratch_bytes(M, K);
  if (k == MatmulKernel::AmxInt8) return amx_int8_matmul_scratch_bytes(M, K);
  if (const int g = matmul_k_group(k); g > 1) {  // the dot-product kernels: x in rows of K rounded up to the group
    const size_t rows = size_t(std::max(M, 0)) * ((std::max(K, 0) + g - 1) / g * g);
    if (k == MatmulKernel::Avx2Int8)  // q as int16, then one int16 weight block of 16 columns and a panel's int32 sums
      return (rows * 2 + 63) / 64 * 64 + size_t(kAvx2Int8KBlock) * 16 * 2 + size_t(std::max(M, 0)) * 16 * 4;
    return rows * (k == MatmulKernel::Avx512Vnni ? 1 : 2) + 64;
  }
  const size_t xf = (size_t(std::max(M, 0)) * std::max(K, 0) + 15) / 16 * 16;
  return (xf + size_t(kFmaKBlock) * 64 + size_t(std::max(M, 0)) * 64) * sizeof(float);
}

namespace {

template <class T, class X>
void portable(const T* w, int K, int N, const X* x, int M, int ldx, float* y, int ldy, float* scratch, bool x_ready) {
  constexpr int kW = 16;
  auto wv = [](T v) { return std::is_same_v<T, int8_t> ? float(v) : widen(uint16_t(v)); };
  float* xf = scratch;
  for (int m = 0; m < M && !x_ready; ++m)
    for (int k = 0; k < K; ++k) {
      const X v = x[size_t(m) * ldx + k];
      xf[size_t(m) * K + k] = std::is_same_v<X, uint8_t> ? float(int(v) - 128) : widen(uint16_t(v));
    }
  const int panels = (N + kW - 1) / kW;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) y[size_t(m) * ldy + n] = 0.f;
  for (int k0 = 0; k0 < K; k0 += kFmaKSpan) {
    const int ks = std::min(kFmaKSpan, K - k0);
    for (int p = 0; p < panels; ++p) {
      const T* panel = w + size_t(k0) * panels * kW + size_t(p) * ks * kW;
      const int valid = std::min(kW, N - p * kW);
      for (int m = 0; m < M; ++m) {
        float acc[kW];
        float* yr = y + size_t(m) * ldy + size_t(p) * kW;
        for (int j = 0; j < kW; ++j) acc[j] = j < valid ? yr[j] : 0.f;
        const float* xr = xf + size_t(m) * K + k0;
        for (int k = 0; k < ks; ++k) {
          const T* wr = panel + size_t(k) * kW;
          for (int j = 0; j < kW; ++j) acc[j] = std::fma(xr[k], wv(wr[j]), acc[j]);
        }
        std::copy(acc, acc + valid, yr);
      }
    }
  }
}

}  // namespace

void fma_matmul_portable(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                         float* scratch, bool x_ready) {
  portable(w, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

void fma_matmul_s8_portable(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                            float* scratch, bool x_ready) {
  portable(w, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

void run_matmul(const MatmulWeights& w, const void* x, int M, int ldx, float* y, int ldy, void* scratch, bool x_ready) {
  if (M <= 0 || w.N() == 0) return;
  if (!matmul_kernel_runnable(w.kernel()))
    throw Error(ErrorCode::Unsupported, std::string("run_matmul: kernel ") + matmul_kernel_name(w.kernel()) + " cannot run on this CPU (" +
                isa().describe() + ")");
  auto* s = static_cast<float*>(scratch);
  if (w.type() == MatmulType::INT8) {
    const auto* xq = static_cast<const uint8_t*>(x);
    switch (w.kernel()) {
      case MatmulKernel::Avx512: fma_matmul_s8_avx512(w.data_s8(), w.K(), w.N(), xq, M, ldx, y, ldy, s, x_ready); break;
      case MatmulKernel::Avx2: fma_matmul_s8_avx2(w.data_s8(), w.K(), w.N(), xq, M, ldx, y, ldy, s, x_ready); break;
      case MatmulKernel::Portable: fma_matmul_s8_portable(w.data_s8(), w.K(), w.N(), xq, M, ldx, y, ldy, s, x_ready); break;
      case MatmulKernel::Avx512Vnni:
        fma_matmul_s8_avx512vnni(w.data_s8(), w.col_sums(), w.K(), w.N(), xq, M, ldx, y, ldy,
                                 static_cast<uint8_t*>(scratch), x_ready);
        break;
      case MatmulKernel::Avx2Int8:
        dot_matmul_s8_avx2(w.data_s8(), w.K(), w.N(), xq, M, ldx, y, ldy, static_cast<uint8_t*>(scratch), x_ready);
        break;
      case MatmulKernel::AmxInt8:
        amx_matmul_s8(w.data_s8(), w.col_sums(), w.K(), w.N(), xq, M, ldx, y, ldy, scratch, x_ready);
        break;
      case MatmulKernel::Avx512Bf16:
      case MatmulKernel::AmxBf16: break;  // refused at packing
    }
    return;
  }
  const auto* xb = static_cast<const uint16_t*>(x);
  switch (w.kernel()) {
    case MatmulKernel::Avx512: fma_matmul_avx512(w.data(), w.K(), w.N(), xb, M, ldx, y, ldy, s, x_ready); break;
    case MatmulKernel::Avx2: fma_matmul_avx2(w.data(), w.K(), w.N(), xb, M, ldx, y, ldy, s, x_ready); break;
    case MatmulKernel::Portable: fma_matmul_portable(w.data(), w.K(), w.N(), xb, M, ldx, y, ldy, s, x_ready); break;
    case MatmulKernel::Avx512Bf16: dot_matmul_avx512bf16(w.data(), w.K(), w.N(), xb, M, ldx, y, ldy, scratch, x_ready); break;
    case MatmulKernel::AmxBf16: amx_matmul_bf16(w.data(), w.K(), w.N(), xb, M, ldx, y, ldy, scratch, x_ready); break;
    case MatmulKernel::Avx512Vnni:
    case MatmulKernel::Avx2Int8:
    case MatmulKernel::AmxInt8: break;  // refused at packing
  }
}

void run_matmul_many(const MatmulOut* out, int n, const void* x, int M, int ldx, void* scratch, bool x_ready) {
  if (M <= 0 || n <= 0) return;
  if (out[0].w->kernel() != MatmulKernel::AmxBf16 || out[0].w->type() != MatmulType::BF16) {
    for (int i = 0; i < n; ++i, x_ready = true)
      run_matmul(*out[i].w, x, M, ldx, out[i].y, out[i].ldy, scratch, x_ready);
    return;
  }
  if (!matmul_kernel_runnable(MatmulKernel::AmxBf16))
    throw Error(ErrorCode::Unsupported,
                "run_matmul: kernel amx_bf16 cannot run on this CPU (" + isa().describe() + ")");
  constexpr int kMaxParts = 64;
  AmxBf16Part parts[kMaxParts];
  for (int i0 = 0; i0 < n; i0 += kMaxParts, x_ready = true) {
    const int m = std::min(kMaxParts, n - i0);
    for (int i = 0; i < m; ++i) {
      const MatmulWeights& w = *out[i0 + i].w;
      if (w.kernel() != MatmulKernel::AmxBf16 || w.type() != MatmulType::BF16 || w.K() != out[0].w->K())
        throw Error(ErrorCode::Internal, "run_matmul_many: the matrices differ in kernel, type or K");
      parts[i] = {w.data(), w.N(), out[i0 + i].y, out[i0 + i].ldy};
    }
    amx_matmul_bf16_parts(parts, m, out[0].w->K(), static_cast<const uint16_t*>(x), M, ldx, scratch, x_ready);
  }
}

int matmul_many_columns(MatmulKernel k, int M) {
  return k == MatmulKernel::AmxBf16 && M >= kAmxManyRows ? kAmxManyColumns : 0;
}

}  // namespace alpamayo::cpu
