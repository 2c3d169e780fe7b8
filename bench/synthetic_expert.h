// The full-size benchmarks' random expert: every layer views one random layer's bf16 weights (the backend packs
// its own copy per layer, so the weight traffic is real), plus random action projections and fast Gaussian noise.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/tensor.h"

namespace alpamayo::bench {

struct Rng {
  uint64_t s;
  // Roughly N(0, 1) (sum of uniforms), fast enough for gigabytes.
  float normal() {
    float acc = 0.f;
    for (int i = 0; i < 4; ++i) {
      s ^= s << 13; s ^= s >> 7; s ^= s << 17;
      acc += static_cast<float>(s >> 40) / float(1 << 24);
    }
    return (acc - 2.f) * 1.7320508f;
  }
};

inline std::vector<uint16_t> random_bf16(size_t n, float scale, Rng& r) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(r.normal() * scale);
  return v;
}

// A field of /proc/self/status in kB ("VmRSS:", "VmHWM:"), -1 where it is missing.
inline long proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::string(key).size()));
  return -1;
}

// Owns the host tensors that `weights` views: neither copied nor moved.
struct SyntheticExpert {
  ExpertConfig cfg;
  ModelWeights weights;

  SyntheticExpert(int L, int D, int Hq, int Hkv, int d, int I, int T, Rng& rng) {
    cfg.L = L; cfg.D = D; cfg.Hq = Hq; cfg.Hkv = Hkv; cfg.d = d; cfg.I = I; cfg.T = T;
    cfg.ain_layers = 1; cfg.ain_hidden = 256;
    auto mat = [&](int out, int in) { return random_bf16(size_t(out) * in, 1.f / std::sqrt(float(in)), rng); };
    auto ones = [](int n) { return std::vector<uint16_t>(n, f32_to_bf16(1.f)); };
    wq = mat(Hq * d, D); wk = mat(Hkv * d, D); wv = mat(Hkv * d, D); wo = mat(D, Hq * d);
    wg = mat(I, D); wu = mat(I, D); wd = mat(D, I); nD = ones(D); nd = ones(d);
    const int F = cfg.n_fourier, h = cfg.ain_hidden;
    a0 = mat(h, (cfg.A + 1) * F); a1 = mat(D, h); b0 = ones(h); b1 = ones(D); nh = ones(h);
    ao = mat(cfg.A, D); bo = ones(cfg.A);
    auto view = [](const std::vector<uint16_t>& v, std::vector<int64_t> shape) {
      return TensorView{DType::BF16, std::move(shape), v.data(), "bench"};
    };
    for (int l = 0; l < L; ++l)
      weights.expert.layers.push_back({view(nD, {D}), view(nD, {D}), view(wq, {Hq * d, D}), view(wk, {Hkv * d, D}),
                                       view(wv, {Hkv * d, D}), view(wo, {D, Hq * d}), view(nd, {d}), view(nd, {d}),
                                       view(wg, {I, D}), view(wu, {I, D}), view(wd, {D, I})});
    weights.expert.final_norm = view(nD, {D});
    weights.action_in.linear_w = {view(a0, {h, (cfg.A + 1) * F}), view(a1, {D, h})};
    weights.action_in.linear_b = {view(b0, {h}), view(b1, {D})};
    weights.action_in.norm_w = {view(nh, {h})};
    weights.action_in.ln_w = view(b1, {D});
    weights.action_in.ln_b = view(b1, {D});
    weights.action_out = {view(ao, {cfg.A, D}), view(bo, {cfg.A})};
  }
  SyntheticExpert(const SyntheticExpert&) = delete;
  SyntheticExpert& operator=(const SyntheticExpert&) = delete;

 private:
  std::vector<uint16_t> wq, wk, wv, wo, wg, wu, wd, nD, nd, a0, a1, b0, b1, nh, ao, bo;
};

}  // namespace alpamayo::bench
