#include "report.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "alpamayo/safetensors.h"

namespace alpamayo::cli {

void write_result_safetensors(const ByteSink& out, const SampleResult& r, const Model& m) {
  const int64_t B = r.B, T = r.T, A = r.A, N = r.steps;
  std::vector<NamedTensor> t = {
      {"action", {DType::F32, {B, T, A}, r.action.data(), ""}},
      {"xyz", {DType::F32, {B, T, 3}, r.xyz.data(), ""}},
      {"yaw", {DType::F32, {B, T}, r.yaw.data(), ""}},
      {"rot", {DType::F32, {B, T, 3, 3}, r.rot.data(), ""}},
      {"v0", {DType::F32, {B}, r.v0.data(), ""}},
  };
  if (!r.x_steps.empty()) {
    t.push_back({"x_steps", {DType::F32, {N + 1, B, T, A}, r.x_steps.data(), ""}});
    t.push_back({"v_steps", {DType::F32, {N, B, T, A}, r.v_steps.data(), ""}});
  }
  serialize_safetensors(out, t, {{"v0_source", r.v0_source}, {"steps", std::to_string(N)}, {"backend", m.backend_name()},
                                 {"weights", m.weights()}, {"kv", m.kv()}, {"kernels", m.kernels()}});
}

void write_result_json(const ByteSink& out, const SampleResult& r, const Model& m) {
  nlohmann::json j;
  j["backend"] = m.backend_name();
  j["weights"] = m.weights();
  j["kv"] = m.kv();
  j["kernels"] = m.kernels();
  j["steps"] = r.steps;
  j["step_seconds"] = r.step_seconds;
  j["v0_source"] = r.v0_source;
  j["samples"] = nlohmann::json::array();
  for (int b = 0; b < r.B; ++b) {
    nlohmann::json s;
    s["v0"] = r.v0[b];
    for (int k = 0; k < r.T; ++k) {
      const int64_t i = int64_t(b) * r.T + k;
      s["xyz"].push_back({r.xyz[3 * i], r.xyz[3 * i + 1], r.xyz[3 * i + 2]});
      s["yaw"].push_back(r.yaw[i]);
      s["action"].push_back({r.action[i * r.A], r.action[i * r.A + 1]});
    }
    j["samples"].push_back(std::move(s));
  }
  const std::string text = j.dump(1);
  out(text.data(), text.size());
}

void write_result_svg(const ByteSink& out, const SampleResult& r, const EgoHistory* history) {
  // Ego frame: x forward (drawn upwards), y left (drawn leftwards), equal scales, origin = ego at t0.
  double xmin = 0, xmax = 1, ymin = -1, ymax = 1;
  for (int64_t i = 0; i < int64_t(r.B) * r.T; ++i) {
    xmin = std::min(xmin, double(r.xyz[3 * i]));
    xmax = std::max(xmax, double(r.xyz[3 * i]));
    ymin = std::min(ymin, double(r.xyz[3 * i + 1]));
    ymax = std::max(ymax, double(r.xyz[3 * i + 1]));
  }
  const size_t nh = history ? history->xyz.size() / 3 : 0;
  for (size_t i = 0; i < nh; ++i) {
    xmin = std::min(xmin, double(history->xyz[3 * i]));
    ymin = std::min(ymin, double(history->xyz[3 * i + 1]));
    ymax = std::max(ymax, double(history->xyz[3 * i + 1]));
  }
  const double span = std::max({xmax - xmin, ymax - ymin, 10.0}) * 1.15;
  const double cx = (xmin + xmax) / 2, cy = (ymin + ymax) / 2, W = 640, H = 640, sc = (W - 80) / span;
  auto px = [&](double y) { return W / 2 - (y - cy) * sc; };
  auto py = [&](double x) { return H / 2 - (x - cx) * sc; };
  static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H + 40 << "' font-family='sans-serif'>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n";
  const double grid = std::pow(10.0, std::floor(std::log10(span / 2)));
  for (double g = std::floor((cx - span / 2) / grid) * grid; g <= cx + span / 2; g += grid)
    s << "<line x1='0' x2='" << W << "' y1='" << py(g) << "' y2='" << py(g) << "' stroke='#eee'/>\n";
  for (double g = std::floor((cy - span / 2) / grid) * grid; g <= cy + span / 2; g += grid)
    s << "<line y1='0' y2='" << H << "' x1='" << px(g) << "' x2='" << px(g) << "' stroke='#eee'/>\n";
  for (int b = 0; history && b < r.B; ++b) {
    s << "<polyline fill='none' stroke='#999' stroke-width='2' stroke-dasharray='4 3' points='";
    for (int k = 0; k < history->H; ++k) {
      const float* p = history->xyz.data() + (int64_t(b) * history->H + k) * 3;
      s << (k ? " " : "") << px(p[1]) << "," << py(p[0]);
    }
    s << "'/>\n";
  }
  s << "<circle cx='" << px(0) << "' cy='" << py(0) << "' r='5' fill='black'/>\n";
  for (int b = 0; b < r.B; ++b) {
    s << "<polyline fill='none' stroke-width='2' stroke='" << colors[b % 8] << "' points='" << px(0) << "," << py(0);
    for (int k = 0; k < r.T; ++k) {
      const int64_t i = int64_t(b) * r.T + k;
      s << " " << px(r.xyz[3 * i + 1]) << "," << py(r.xyz[3 * i]);
    }
    s << "'/>\n";
  }
  s << "<text x='10' y='" << H + 25 << "' font-size='14'>" << r.B << " trajector" << (r.B == 1 ? "y" : "ies") << ", "
    << r.T << " waypoints" << (history ? " (ego history dashed)" : "") << "; grid " << grid
    << " m; x forward (up), y left</text>\n</svg>\n";
  const std::string text = s.str();
  out(text.data(), text.size());
}

}  // namespace alpamayo::cli
