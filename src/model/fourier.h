// The Fourier features of action_in_proj (docs/MATH.md section 3), shared by every backend: they are
// checked against torch directly (tests/cpp/test_model.cpp), not against another backend.
#pragma once
#include <vector>

namespace alpamayo {

// torch.logspace(0, log10(max_freq), F/2), optionally rounded to bf16 as the release's buffers are.
std::vector<float> fourier_freqs(int n_fourier, double max_freq, bool round_bf16);

// Fourier(z) = sqrt(2) [sin(2 pi f z), cos(2 pi f z)] written to out[0 .. 2*freqs.size()).
void fourier_features(float z, const std::vector<float>& freqs, float* out);

}  // namespace alpamayo
