#include "backends/reference/ops.h"

#include "backends/kv_int8.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace alpamayo::ref {
namespace {

float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Runs fn(begin, end) over [0, n) split into `threads` contiguous parts.
template <class Fn>
void split(int n, int threads, Fn fn) {
  threads = std::max(1, std::min(threads, n));
  if (threads == 1) { fn(0, n); return; }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int b = static_cast<int>(int64_t(n) * t / threads), e = static_cast<int>(int64_t(n) * (t + 1) / threads);
    pool.emplace_back([=] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

void matmul_nt(const float* x, int M, int K, const float* W, int N, float* y, int threads) {
  split(N, threads, [&](int n0, int n1) {
    for (int n = n0; n < n1; ++n)
      for (int m = 0; m < M; ++m) y[int64_t(m) * N + n] = dot(x + int64_t(m) * K, W + int64_t(n) * K, K);
  });
}

void rms_norm(const float* x, const float* w, int rows, int n, double eps, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + int64_t(r) * n;
    float* yr = y + int64_t(r) * n;
    const float ms = dot(xr, xr, n) / n;
    const float inv = 1.0f / std::sqrt(ms + static_cast<float>(eps));
    for (int i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void rope_apply(float* x, int T, int H, int d, const float* cos, const float* sin) {
  const int half = d / 2;
  std::vector<float> tmp(d);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float* v = x + (int64_t(t) * H + h) * d;
      const float* c = cos + int64_t(t) * d;
      const float* s = sin + int64_t(t) * d;
      for (int i = 0; i < half; ++i) tmp[i] = v[i] * c[i] - v[i + half] * s[i];
      for (int i = half; i < d; ++i) tmp[i] = v[i] * c[i] + v[i - half] * s[i];
      std::copy(tmp.begin(), tmp.end(), v);
    }
}

void attention(const float* q, const float* k_own, const float* v_own, const std::vector<KeySegment>& cache,
               int T, int Hq, int Hkv, int d, float* out, int threads) {
  const int group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  int S = 0;
  for (const KeySegment& seg : cache) S += seg.rows;
  split(Hq, threads, [&](int h0, int h1) {
    std::vector<float> p(static_cast<size_t>(S) + T);
    std::vector<const float*> krow(S), vrow(S);
    for (int h = h0; h < h1; ++h) {
      const int kvh = h / group;
      int j = 0;
      for (const KeySegment& seg : cache)
        for (int r = 0; r < seg.rows; ++r, ++j) {
          krow[j] = seg.k + kvh * seg.head_stride + int64_t(r) * d;
          vrow[j] = seg.v + kvh * seg.head_stride + int64_t(r) * d;
        }
      for (int t = 0; t < T; ++t) {
        const float* qt = q + (int64_t(t) * Hq + h) * d;
        float mx = -INFINITY;
        for (int i = 0; i < S; ++i) mx = std::max(mx, p[i] = dot(qt, krow[i], d) * scale);
        for (int i = 0; i < T; ++i)
          mx = std::max(mx, p[S + i] = dot(qt, k_own + (int64_t(i) * Hkv + kvh) * d, d) * scale);
        float sum = 0.f;
        for (int i = 0; i < S + T; ++i) sum += (p[i] = std::exp(p[i] - mx));
        float* o = out + (int64_t(t) * Hq + h) * d;
        std::fill(o, o + d, 0.f);
        for (int i = 0; i < S; ++i) {
          const float w = p[i] / sum;
          for (int c = 0; c < d; ++c) o[c] += w * vrow[i][c];
        }
        for (int i = 0; i < T; ++i) {
          const float w = p[S + i] / sum;
          const float* vr = v_own + (int64_t(i) * Hkv + kvh) * d;
          for (int c = 0; c < d; ++c) o[c] += w * vr[c];
        }
      }
    }
  });
}

void attention(const float* q, const float* k_own, const float* v_own, const float* k_cache,
               const float* v_cache, int T, int Hq, int Hkv, int d, int P, int S, float* out, int threads) {
  attention(q, k_own, v_own, {KeySegment{k_cache, v_cache, int64_t(P) * d, S}}, T, Hq, Hkv, d, out, threads);
}

void round_rows_s8(float* x, int64_t rows, int d) {
  std::vector<int8_t> q(d);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * d;
    if (!std::all_of(row, row + d, [](float v) { return std::isfinite(v); })) continue;
    const float s = quantize_row_s8(row, d, q.data());
    dequantize_row_s8(q.data(), s, d, row);
  }
}

}  // namespace alpamayo::ref
