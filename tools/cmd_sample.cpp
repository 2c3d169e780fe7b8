// `sample` and `inspect`.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "alpamayo/engine.h"
#include "alpamayo/error.h"
#include "commands.h"
#include "report.h"

namespace fs = std::filesystem;

namespace alpamayo::cli {

std::vector<int64_t> parse_int_list(const std::string& s, const std::string& option) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    const size_t end = s.find(',', pos);
    const std::string item = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      check(used == item.size(), "");
    } catch (...) {
      throw Error(option + ": '" + item + "' is not an integer");
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

namespace {

struct SampleArgs {
  std::string checkpoint, context, noise, out, json, svg, layers_out, vlm_config, backend;
  uint64_t seed = 0;
  int steps = 0, threads = 0;
  std::string weights;
  double v0 = NAN;
  bool all_steps = false, profile = false, exact_freqs = false, quiet = false;
};

std::vector<float> read_noise(const std::string& path, int B, int T, int A) {
  SafetensorsFile f(path);
  TensorView v = f.view("noise");
  check(v.dtype == DType::F32, v.name + ": expected dtype F32, found " + dtype_name(v.dtype));
  check(v.shape.size() == 3 && v.shape[0] == B,
        v.name + ": expected shape [B=" + std::to_string(B) + ", T, A] (B of the context), found " + shape_str(v.shape));
  expect_shape(v, {B, T, A});
  std::vector<float> x = to_f32(v);
  check_finite(x.data(), static_cast<int64_t>(x.size()), v.name);
  return x;
}

// Fails before any work when an output could not be written, so a bad path never leaves partial results.
void check_output_path(const std::string& path, const char* option) {
  if (path.empty()) return;
  const fs::path parent = fs::absolute(path).parent_path();
  check(fs::is_directory(parent), std::string(option) + " " + path + ": directory " + parent.string() + " does not exist");
  check(!fs::is_directory(path), std::string(option) + " " + path + ": is a directory");
}

void run_sample(const SampleArgs& a) {
  check_output_path(a.out, "--out");
  check_output_path(a.json, "--json");
  check_output_path(a.svg, "--svg");
  check_output_path(a.layers_out, "--layers-out");
  auto ck = Checkpoint::open(a.checkpoint, a.vlm_config);
  BackendOptions bo;
  bo.threads = a.threads;
  bo.weights = a.weights;
  bo.profile = a.profile;
  bo.exact_freqs = a.exact_freqs;
  Session session(Model::load(ck, a.backend, bo));
  Context ctx = Context::open(a.context);
  const int B = ctx.batch();
  const std::optional<EgoHistory> history = ctx.history();
  BindOptions bind;
  if (!a.layers_out.empty()) bind.capture = {.step = 0, .layers = true};
  session.bind(std::move(ctx), bind);
  SampleOptions so;
  so.steps = a.steps;
  so.all_steps = a.all_steps;
  if (!a.noise.empty()) so.noise = read_noise(a.noise, B, ck->config().T, ck->config().A);
  so.seed = a.seed;
  if (!std::isnan(a.v0)) so.v0 = a.v0;
  SampleResult r = session.sample(so);
  if (!a.quiet)
    for (int k = 0; k < r.steps; ++k) std::fprintf(stderr, "step %d/%d  %.3f s\n", k + 1, r.steps, r.step_seconds[k]);
  write_result_safetensors(a.out, r);
  if (!a.layers_out.empty()) {
    const Captures& cap = session.captures();
    const int64_t T = ck->config().T, D = ck->config().D;
    std::vector<NamedTensor> t = {{"emb", {DType::F32, {B, T, D}, cap.emb.data(), ""}},
                                  {"hidden", {DType::F32, {B, T, D}, cap.hidden.data(), ""}}};
    for (size_t l = 0; l < cap.layers.size(); ++l)
      t.push_back({"layer." + std::to_string(l), {DType::F32, {B, T, D}, cap.layers[l].data(), ""}});
    write_safetensors(a.layers_out, t);
  }
  if (!a.json.empty()) write_result_json(a.json, r, a.backend);
  if (!a.svg.empty()) write_result_svg(a.svg, r, history ? &*history : nullptr);
  double total = 0;
  for (double s : r.step_seconds) total += s;
  if (!a.quiet)
    std::fprintf(stderr, "%d steps, %.3f s per step (mean), backend %s (%s weights); wrote %s\n", r.steps,
                 total / r.steps, a.backend.c_str(), session.model().weights().c_str(), a.out.c_str());
}

}  // namespace

Run add_sample(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  a->backend = backend_names().front();
  app.add_option("--checkpoint", a->checkpoint, "checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--context", a->context, "context file (safetensors, docs/FORMATS.md)")->required();
  auto* noise = app.add_option("--noise", a->noise, "noise file: safetensors with 'noise' [B, T, A] F32");
  app.add_option("--seed", a->seed, "seed of the built-in noise generator (default 0)")->excludes(noise);
  app.add_option("--steps", a->steps, "Euler steps (default: diffusion_cfg.num_inference_steps)")->check(CLI::Range(1, 100000));
  app.add_option("--backend", a->backend, "backend: " + [] { std::string s; for (auto& n : backend_names()) s += n + " "; return s; }());
  app.add_option("--threads", a->threads, "threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--weights", a->weights, "weight format (cuda: bf16 | fp8; cpu: bf16 | int8; reference: f32; default: the backend's first)");
  app.add_option("--v0", a->v0, "initial speed in m/s (overrides the context's v0 / ego history)");
  app.add_option("--vlm-config", a->vlm_config, "the VLM's config.json (text_config: eps, theta, layer count)");
  app.add_option("--out", a->out, "output safetensors: action, xyz, yaw, rot, v0")->required();
  app.add_flag("--all-steps", a->all_steps, "also write x_steps [N+1, B, T, A] and v_steps [N, B, T, A]");
  app.add_option("--layers-out", a->layers_out, "write step-0 emb, layer.{l} outputs and final hidden");
  app.add_option("--json", a->json, "write the trajectories as JSON");
  app.add_option("--svg", a->svg, "write an SVG plot of the trajectories");
  app.add_flag("--profile", a->profile, "print a per-op time table (cpu backend)");
  app.add_flag("--exact-freqs", a->exact_freqs, "unrounded Fourier frequencies when the checkpoint has no buffers");
  app.add_flag("--quiet", a->quiet, "no progress on stderr");
  return [a] { run_sample(*a); };
}

Run add_backends(CLI::App&) {
  return [] {
    for (const BackendInfo& b : registered_backends()) {
      std::printf("%s", b.name.c_str());
      for (const std::string& f : b.weight_formats) std::printf(" %s", f.c_str());
      if (const std::string why = b.unavailable(); !why.empty()) std::printf(" -- unavailable: %s", why.c_str());
      std::printf("\n");
    }
  };
}

Run add_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto vlm = std::make_shared<std::string>();
  app.add_option("checkpoint", *dir, "checkpoint directory")->required();
  app.add_option("--vlm-config", *vlm, "the VLM's config.json");
  return [dir, vlm] {
    auto ck = Checkpoint::open(*dir, *vlm);
    const ExpertConfig& c = ck->config();
    std::printf("checkpoint   %s\nlayout       %s\n", dir->c_str(), layout_name(ck->layout()));
    std::printf("expert       L=%d D=%d heads=%d/%d head_dim=%d mlp=%d  (%.6g M parameters, dtype %s)\n", c.L, c.D, c.Hq,
                c.Hkv, c.d, c.I, ck->expert_parameters() / 1e6, dtype_name(ck->expert().layers[0].q.dtype));
    std::printf("action_in    hidden=%d enc_layers=%d fourier=%d max_freq=%g\n", c.ain_hidden, c.ain_layers, c.n_fourier, c.max_freq);
    std::printf("action space T=%d A=%d dt=%g accel %g+-%g curvature %g+-%g v_lambda=%g v_ridge=%g\n", c.T, c.A, c.dt,
                c.accel_mean, c.accel_std, c.curvature_mean, c.curvature_std, c.v_lambda, c.v_ridge);
    std::printf("sampler      %s, %d steps\n", c.int_method.c_str(), c.num_steps);
    for (const auto& n : ck->notes()) std::printf("note         %s\n", n.c_str());
    for (const auto& f : ck->files()) std::printf("file         %s\n", f.c_str());
    std::printf("skipped      %lld vlm.* tensors (never read)\n", static_cast<long long>(ck->vlm_tensors_skipped()));
  };
}

}  // namespace alpamayo::cli
