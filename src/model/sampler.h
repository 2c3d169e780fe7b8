// Rope tables, the Euler time grid and the documented noise generator (docs/MATH.md sections 2, 4, 5).
#pragma once
#include <cstdint>
#include <vector>

#include "alpamayo/backend.h"

namespace alpamayo {

// inv_freq_j = 1 / theta^(2j/d) in fp32, as transformers computes it.
std::vector<float> rope_inv_freq(int d, double theta);

// cos/sin [B, T, d] for positions p = i + rope_delta_b + offset_b (i < T), HF rotate_half layout.
RopeTables make_rope_tables(const std::vector<int64_t>& offset, const std::vector<int64_t>& rope_delta, int T,
                            int d, double theta);

// torch.linspace(0, 1, n + 1) in fp32, bit for bit (the upper half is filled from the end).
std::vector<float> euler_time_grid(int n);

// Standard normal fp32 values, element i of a row-major buffer in order: SplitMix64 stream seeded with
// `seed`, Box-Muller in double on consecutive pairs (u1 = (k1 >> 11 + 1) 2^-53, u2 = (k2 >> 11) 2^-53;
// z0 = r cos(2 pi u2), z1 = r sin(2 pi u2), r = sqrt(-2 ln u1)). Sample b of a [B, T, A] draw does not
// depend on B.
std::vector<float> gaussian_noise(uint64_t seed, int64_t n);

}  // namespace alpamayo
