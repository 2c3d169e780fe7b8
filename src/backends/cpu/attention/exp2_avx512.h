// 2^x on 16 fp32 lanes for the AVX-512 attention kernels (attention_avx512.cpp, attention_avx512_vnni.cpp,
// attention_avx512_amx.cpp).
// Included only by ISA translation units: everything is in an anonymous namespace, so each includer gets its own
// copy compiled for its own ISA and no weak symbol (scripts/check-isa-objects.sh).
#pragma once
#include <immintrin.h>

namespace alpamayo::cpu {
namespace {

// 2^x = 2^n * 2^f, n = round(x), |f| <= 1/2, Taylor polynomial of e^(f ln2). Degree 6 (rel. error
// ~1e-7) for the rescale factors; degree 3 (at most 7.9e-4, at f = -1/2) for the probabilities, which are
// rounded to bf16 (up to 2^-8 = 3.9e-3) for PV anyway and whose fp32 sum carries the same error, so it
// cancels in O / l to first order. Very negative x underflows to 0 through scalef.
template <int Degree>
inline __m512 exp2_ps(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  constexpr float c[7] = {1.f, 6.9314718055994531e-1f, 2.4022650695910071e-1f, 5.5504108664821580e-2f,
                          9.6181291076284772e-3f, 1.3333558146428443e-3f, 1.5403530393381606e-4f};
  __m512 p = _mm512_set1_ps(c[Degree]);
#pragma GCC unroll 8
  for (int k = Degree - 1; k >= 0; --k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[k]));
  return _mm512_scalef_ps(p, n);
}

// 2^x for the probabilities in five instructions instead of six: f = x - floor(x) in [0, 1) in one (vreduceps), a
// cubic fitted to 2^f on [0, 1) for the least worst relative error (7.5e-5, below degree 3's Taylor error above),
// and scalef, which multiplies by 2^floor(x) itself. Very negative x underflows to 0 through scalef.
inline __m512 exp2_p3_ps(__m512 x) {
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(7.802452147006989e-2f), f, _mm512_set1_ps(2.260671705007553e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.958335041999817e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999251961708069e-1f));
  return _mm512_scalef_ps(p, x);
}

}  // namespace
}  // namespace alpamayo::cpu
