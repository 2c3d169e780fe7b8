// The fp32-FMA attention kernel on AVX-512F (zmm: 16 lanes; attention_fma_impl.h). An ISA translation unit
// (compiled with the AVX-512 flags, CMakeLists.txt): no weak symbols, no inline functions of headers called.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: _mm512_undefined_ps in roundscale/scalef
#include <immintrin.h>

namespace alpamayo::cpu {
namespace {

struct VecZ {
  using F = __m512;
  // QK tile 48 rows x 8 keys (24 accumulators, each query load feeding 8 FMAs), PV tile 8 rows x 32 columns: the
  // fastest of the tiles tried (docs/PERFORMANCE.md, "Measurements behind design choices").
  static constexpr int W = 16, kQkVecs = 3, kQkKeys = 8, kPvRows = 8, kPvVecs = 2;
  static F load(const float* p) { return _mm512_load_ps(p); }
  static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F zero() { return _mm512_setzero_ps(); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  // 2^x = 2^n * 2^f, n = round(x), |f| <= 1/2, degree-6 Taylor polynomial of e^(f ln2) (rel. error ~1e-7);
  // scalef underflows very negative x to 0.
  static F exp2(F x) {
    const F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = _mm512_sub_ps(x, n);
    F p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
  }
};

}  // namespace
}  // namespace alpamayo::cpu

#include "backends/cpu/attention/attention_fma_impl.h"

namespace alpamayo::cpu {

void attend_chunk_avx512fma(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1, float* O,
                            float* m, float* l, const AttnWork& w) {
  attend_fma<VecZ>(g, qp, kv, j0, j1, O, m, l, w);
}

}  // namespace alpamayo::cpu
