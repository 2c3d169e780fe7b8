// The unicycle action space with acceleration and curvature (docs/MATH.md section 6).
#pragma once
#include <vector>

#include "alpamayo/config.h"

namespace alpamayo {

struct Trajectory {
  std::vector<float> xyz;  // [T, 3] waypoints k = 1..T in the ego frame at t0
  std::vector<float> yaw;  // [T]
  std::vector<float> rot;  // [T, 3, 3] = Rz(yaw)
};

// Decodes one normalized action [T, 2] with initial speed v0; z is the last history height.
Trajectory decode_action(const float* action, int T, double v0, double z, const ExpertConfig& cfg);

// Estimates the speed at t0 from H >= 2 history poses (xyz [H, 3], rot [H, 3, 3], spacing cfg.dt):
// least squares on the trapezoid rule with third-difference smoothing and a ridge; returns s_{H-1}.
double estimate_v0(const float* xyz, const float* rot, int H, const ExpertConfig& cfg);

}  // namespace alpamayo
