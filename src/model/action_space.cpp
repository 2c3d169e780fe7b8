#include "alpamayo/action_space.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "alpamayo/error.h"

namespace alpamayo {

Trajectory decode_action(const float* action, int T, double v0, double z, const ExpertConfig& c) {
  Trajectory tr;
  tr.xyz.resize(int64_t(T) * 3);
  tr.yaw.resize(T);
  tr.rot.assign(int64_t(T) * 9, 0.f);
  const double dt = c.dt;
  double v = v0, th = 0.0, x = 0.0, y = 0.0;
  for (int k = 0; k < T; ++k) {
    const double a = action[2 * k] * c.accel_std + c.accel_mean;
    const double kap = action[2 * k + 1] * c.curvature_std + c.curvature_mean;
    const double v1 = v + a * dt;
    const double th1 = th + kap * v * dt + kap * a * dt * dt / 2;
    x += dt / 2 * (v * std::cos(th) + v1 * std::cos(th1));
    y += dt / 2 * (v * std::sin(th) + v1 * std::sin(th1));
    v = v1;
    th = th1;
    tr.xyz[3 * k] = static_cast<float>(x);
    tr.xyz[3 * k + 1] = static_cast<float>(y);
    tr.xyz[3 * k + 2] = static_cast<float>(z);
    tr.yaw[k] = static_cast<float>(th);
    float* R = tr.rot.data() + 9 * k;
    R[0] = static_cast<float>(std::cos(th));
    R[1] = static_cast<float>(-std::sin(th));
    R[3] = static_cast<float>(std::sin(th));
    R[4] = static_cast<float>(std::cos(th));
    R[8] = 1.f;
  }
  return tr;
}

double estimate_v0(const float* xyz, const float* rot, int H, const ExpertConfig& c) {
  check(H >= 2, "estimate_v0: need at least 2 history poses, found " + std::to_string(H));
  const int n = H;  // unknown speeds s_0 .. s_{H-1}
  const double dt = c.dt;
  std::vector<double> raw(n), yaw(n);
  for (int i = 0; i < n; ++i) raw[i] = std::atan2(rot[9 * i + 3], rot[9 * i + 0]);
  yaw[0] = raw[0];
  for (int i = 1; i < n; ++i) {  // unwrap: successive differences wrapped into [-pi, pi]
    const double dy = raw[i] - raw[i - 1];
    yaw[i] = yaw[i - 1] + std::atan2(std::sin(dy), std::cos(dy));
  }
  // Normal equations (A^T A + lambda/dt^6 D3^T D3 + ridge I) s = A^T g. M is symmetric with bandwidth 3
  // (A^T A couples neighbours, D3^T D3 four consecutive speeds), so it is stored as its lower band
  // M(i, i - k) = band[i * W + k], k < W = 4, and factored by a banded Cholesky: O(H) time and memory. A band
  // factor has no fill-in outside the band and every product left out of a dense factorisation is an exact
  // zero, so the result is bitwise the dense solve's, in the same order of operations.
  constexpr int W = 4;
  std::vector<double> band(int64_t(n) * W, 0.0), rhs(n, 0.0);
  auto at = [&](int i, int j) -> double& { return band[int64_t(i) * W + (i - j)]; };  // j <= i, i - j < W
  for (int i = 0; i + 1 < n; ++i) {
    const double g[2] = {2.0 / dt * (xyz[3 * (i + 1)] - xyz[3 * i]), 2.0 / dt * (xyz[3 * (i + 1) + 1] - xyz[3 * i + 1])};
    const double u0[2] = {std::cos(yaw[i]), std::sin(yaw[i])}, u1[2] = {std::cos(yaw[i + 1]), std::sin(yaw[i + 1])};
    for (int r = 0; r < 2; ++r) {  // row: u0[r] s_i + u1[r] s_{i+1} = g[r]
      at(i, i) += u0[r] * u0[r];
      at(i + 1, i) += u1[r] * u0[r];
      at(i + 1, i + 1) += u1[r] * u1[r];
      rhs[i] += u0[r] * g[r];
      rhs[i + 1] += u1[r] * g[r];
    }
  }
  const double lam = c.v_lambda / std::pow(dt, 6);
  const double d3[4] = {-1.0, 3.0, -3.0, 1.0};
  for (int r = 0; r + 3 < n; ++r)
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b <= a; ++b) at(r + a, r + b) += lam * d3[a] * d3[b];
  for (int i = 0; i < n; ++i) at(i, i) += c.v_ridge;
  // Cholesky M = L L^T, in place (lower band).
  for (int j = 0; j < n; ++j) {
    const int k0 = std::max(0, j - (W - 1));
    double s = at(j, j);
    for (int k = k0; k < j; ++k) s -= at(j, k) * at(j, k);
    check(s > 0 && std::isfinite(s), "estimate_v0: the normal equations are not positive definite (v_ridge too small?)");
    const double ljj = std::sqrt(s);
    at(j, j) = ljj;
    for (int i = j + 1; i < std::min(n, j + W); ++i) {
      double t = at(i, j);
      for (int k = std::max(0, i - (W - 1)); k < j; ++k) t -= at(i, k) * at(j, k);
      at(i, j) = t / ljj;
    }
  }
  std::vector<double> y(n);
  for (int i = 0; i < n; ++i) {
    double t = rhs[i];
    for (int k = std::max(0, i - (W - 1)); k < i; ++k) t -= at(i, k) * y[k];
    y[i] = t / at(i, i);
  }
  for (int i = n - 1; i >= 0; --i) {
    double t = y[i];
    for (int k = i + 1; k < std::min(n, i + W); ++k) t -= at(k, i) * y[k];
    y[i] = t / at(i, i);
  }
  return y[n - 1];
}

}  // namespace alpamayo
