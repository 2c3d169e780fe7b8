// The fp32-FMA attention kernel on AVX2 + FMA (ymm: 8 lanes; attention_fma_impl.h): the vectorised path of
// every x86-64 CPU the portable build runs on. An ISA translation unit (AVX2 flags, CMakeLists.txt).
#include <immintrin.h>

namespace alpamayo::cpu {
namespace {

struct VecY {
  using F = __m256;
  // 16 registers: QK tile 24 rows x 4 keys, PV tile 4 rows x 24 columns (12 accumulators each), the fastest of
  // the tiles tried (docs/PERFORMANCE.md, "Measurements behind design choices").
  static constexpr int W = 8, kQkVecs = 3, kQkKeys = 4, kPvRows = 4, kPvVecs = 3;
  static F load(const float* p) { return _mm256_load_ps(p); }
  static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F zero() { return _mm256_setzero_ps(); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  // 2^x as in the AVX-512 kernel; 2^n built in the exponent field, x clamped to >= -126 (normal numbers)
  // and the result forced to 0 below that.
  static F exp2(F x) {
    const F lo = _mm256_set1_ps(-126.f);
    const F under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const F xc = _mm256_max_ps(x, lo);
    const F n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = _mm256_sub_ps(xc, n);
    F p = _mm256_set1_ps(1.5403530393381606e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }
};

}  // namespace
}  // namespace alpamayo::cpu

#include "backends/cpu/attention/attention_fma_impl.h"

namespace alpamayo::cpu {

void attend_chunk_avx2fma(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1, float* O,
                          float* m, float* l, const AttnWork& w) {
  attend_fma<VecY>(g, qp, kv, j0, j1, O, m, l, w);
}

}  // namespace alpamayo::cpu
