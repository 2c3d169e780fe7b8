// `sample`.
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>

#include "alpamayo/environment.h"
#include "alpamayo/engine.h"
#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "alpamayo/output.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "backends/cpu/profile/profile_table.h"
#endif
#include "commands.h"
#include "report.h"

namespace alpamayo::cli {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (!s.empty()) {
    const size_t end = s.find(',', pos);
    out.push_back(s.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

std::vector<int64_t> parse_int_list(const std::string& s, const std::string& option) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    const size_t end = s.find(',', pos);
    const std::string item = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    errno = 0;
    char* stop = nullptr;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    check(!item.empty() && stop != item.c_str() && *stop == '\0' && !std::isspace(static_cast<unsigned char>(item[0])),
          option + ": '" + item + "' is not an integer");
    check(errno != ERANGE, option + ": " + item + " is out of range [-2^63, 2^63 - 1]");
    out.push_back(v);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

namespace {

struct SampleArgs {
  std::string checkpoint, context, noise, out, json, svg, layers_out, vlm_config, backend, release;
  std::string guidance_context, seeds;
  uint64_t seed = 0;
  int steps = 0, threads = 0;
  std::string weights, kv;
  std::vector<std::string> bf16_weights;
  double v0 = NAN, guidance_weight = NAN, temperature = 1.0;
  bool all_steps = false, profile = false, exact_freqs = false, quiet = false, no_guidance = false;
  bool guidance_weight_given = false;  // --guidance-weight nan is an error, not "the default"
  bool v0_given = false;               // --v0 nan is an error, not "no --v0"
};

std::vector<float> read_noise(const std::string& path, int B, int T, int A) {
  SafetensorsFile f(path);
  TensorView v = f.view("noise");
  check(v.dtype == DType::F32, v.name + ": expected dtype F32, found " + dtype_name(v.dtype));
  check(v.shape.size() == 3 && v.shape[0] == B,
        v.name + ": expected shape [B=" + std::to_string(B) + ", T, A] (B of the context), found " + shape_str(v.shape));
  expect_shape(v, {B, T, A});
  std::vector<float> x = to_f32(v);
  f.check_intact();  // the copy is complete: the file was not truncated under the read
  check_finite(x.data(), static_cast<int64_t>(x.size()), v.name);
  return x;
}

void run_sample(const SampleArgs& a) {
  // Outputs are checked and reserved before any work (output.h); they appear together at the end, or not at all.
  OutputSet outs;
  outs.add_input(a.checkpoint, "--checkpoint");
  outs.add_input(a.context, "--context");
  outs.add_input(a.noise, "--noise");
  outs.add_input(a.vlm_config, "--vlm-config");
  outs.add_input(a.guidance_context, "--guidance-context");
  constexpr size_t none = SIZE_MAX;
  const size_t o_out = outs.add(a.out, "--out");
  const size_t o_layers = a.layers_out.empty() ? none : outs.add(a.layers_out, "--layers-out");
  const size_t o_json = a.json.empty() ? none : outs.add(a.json, "--json");
  const size_t o_svg = a.svg.empty() ? none : outs.add(a.svg, "--svg");
  auto ck = Checkpoint::open(a.checkpoint, checkpoint_options(a.vlm_config, a.release));
  for (const auto& f : ck->files()) outs.add_input(f, "--checkpoint");  // shards in subdirectories too
  BackendOptions bo;
  bo.threads = a.threads;
  bo.weights = a.weights;
  bo.kv = a.kv;
  bo.bf16_weights = a.bf16_weights;
  bo.profile = a.profile;
  bo.exact_freqs = a.exact_freqs;
  options_from_environment(bo, a.backend);  // ALPAMAYO_CPU_KERNELS, ALPAMAYO_CPU_ISA
  Session session(Model::load(ck, a.backend, bo));
  Context ctx = Context::open(a.context);
  const int B = ctx.batch();
  const std::optional<EgoHistory> history = ctx.history();
  BindOptions bind;
  if (!a.layers_out.empty()) bind.capture = {.step = 0, .layers = true};
  const ExpertConfig& cfg = ck->config();
  check(!(cfg.use_cfg && a.guidance_context.empty() && !a.no_guidance),
        a.checkpoint + "/config.json: use_classifier_free_guidance is true: give the unguided context with "
                       "--guidance-context FILE, or sample without guidance with --no-guidance");
  check(!a.guidance_weight_given || !a.guidance_context.empty(), "--guidance-weight needs --guidance-context");
  if (!a.guidance_context.empty())
    bind.guidance = Guidance{Context::open(a.guidance_context),
                             a.guidance_weight_given ? a.guidance_weight : cfg.guidance_weight};
  session.bind(std::move(ctx), bind);
  SampleOptions so;
  so.steps = a.steps;
  so.all_steps = a.all_steps;
  so.temperature = a.temperature;
  if (!a.noise.empty()) so.noise = read_noise(a.noise, B, ck->config().T, ck->config().A);
  for (const std::string& s : split_list(a.seeds)) {
    std::string item = s;
    const std::string why = unsigned64()(item);
    check(why.empty(), "--seeds: " + why);
    so.seeds.push_back(std::strtoull(s.c_str(), nullptr, 10));
  }
  so.seed = a.seed;
  if (a.v0_given) so.v0 = a.v0;
  // The sample runs all Euler steps in one call (docs/ARCHITECTURE.md): say when it starts, the times follow.
  if (!a.quiet) std::fprintf(stderr, "sampling ...\n");
  SampleResult r = session.sample(so);
#ifdef ALPAMAYO_WITH_CPU_BACKEND
  // --profile: the table of every run of the layers, in the order they ran (only the cpu backend records them).
  for (const StepProfile& p : session.profiles()) std::fputs(cpu::format_profile(p).c_str(), stderr);
#endif
  check_mapped_files();  // an input truncated or rewritten under the run: stop before writing, naming it
  if (!a.quiet)
    for (int k = 0; k < r.steps; ++k) std::fprintf(stderr, "step %d/%d  %.3f s\n", k + 1, r.steps, r.step_seconds[k]);
  write_result_safetensors(outs.sink(o_out), r, session.model());
  if (o_layers != none) {
    const Captures& cap = session.captures();
    const int64_t T = ck->config().T, D = ck->config().D;
    std::vector<NamedTensor> t = {{"emb", {DType::F32, {B, T, D}, cap.emb.data(), ""}},
                                  {"hidden", {DType::F32, {B, T, D}, cap.hidden.data(), ""}}};
    for (size_t l = 0; l < cap.layers.size(); ++l)
      t.push_back({"layer." + std::to_string(l), {DType::F32, {B, T, D}, cap.layers[l].data(), ""}});
    serialize_safetensors(outs.sink(o_layers), t);
  }
  if (o_json != none) write_result_json(outs.sink(o_json), r, session.model());
  if (o_svg != none) write_result_svg(outs.sink(o_svg), r, history ? &*history : nullptr);
  outs.commit();
  double total = 0;
  for (double s : r.step_seconds) total += s;
  // The kernels too where the backend chose them: its bits depend on them (ALPAMAYO_CPU_KERNELS pins them).
  const std::string kernels = session.model().kernels();
  if (!a.quiet)
    std::fprintf(stderr, "%d steps, %.3f s per step (mean), backend %s (%s weights, %s KV cache%s%s); wrote %s\n",
                 r.steps, total / r.steps, a.backend.c_str(), session.model().weights().c_str(),
                 session.model().kv().c_str(), kernels.empty() ? "" : ", kernels ", kernels.c_str(), a.out.c_str());
}

}  // namespace

Run add_sample(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  a->backend = backend_names().front();
  app.add_option("--checkpoint", a->checkpoint, "checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--context", a->context, "context file (safetensors, docs/FORMATS.md)")->required();
  auto* noise = app.add_option("--noise", a->noise, "noise file: safetensors with 'noise' [B, T, A] F32");
  auto* seed = app.add_option("--seed", a->seed, "seed of the built-in noise generator for the batch (default 0)")
                   ->check(unsigned64())
                   ->excludes(noise);
  app.add_option("--seeds", a->seeds, "one seed per sample, comma-separated (sample b reproducible alone)")
      ->excludes(noise)
      ->excludes(seed);
  app.add_option("--temperature", a->temperature, "scale of the initial noise (default 1)")
      ->check(finite_number())
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--guidance-context", a->guidance_context,
                 "unguided context (the prompt without the navigation text): classifier-free guidance");
  app.add_option("--guidance-weight", a->guidance_weight,
                 "w of v = (1 - w) v_unguided + w v_guided, in [0, 1000] (default: diffusion_cfg.inference_guidance_weight)")
      ->each([a](const std::string&) { a->guidance_weight_given = true; });
  app.add_flag("--no-guidance", a->no_guidance, "sample without guidance where config.json asks for it");
  app.add_option("--steps", a->steps, "Euler steps (default: diffusion_cfg.num_inference_steps)")->check(CLI::Range(1, 100000));
  app.add_option("--backend", a->backend, "backend: " + [] { std::string s; for (auto& n : backend_names()) s += n + " "; return s; }());
  app.add_option("--threads", a->threads, "threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--weights", a->weights, formats_help(false));
  app.add_option("--kv", a->kv, formats_help(true));
  app.add_option("--bf16-weights", a->bf16_weights,
                 "block formats: matrices kept in bf16, comma-separated: qkv,o,gate,up,down (default: none)")
      ->delimiter(',');
  app.add_option("--v0", a->v0, "initial speed in m/s, |v0| <= 1000 (overrides the context's v0 / ego history)")
      ->check(finite_number())
      ->check(CLI::Range(-1e3, 1e3))
      ->each([a](const std::string&) { a->v0_given = true; });
  app.add_option("--vlm-config", a->vlm_config, "the VLM's config.json (text_config: eps, theta, layer count)");
  add_release_option(app, a->release);
  app.add_option("--out", a->out, "output safetensors: action, xyz, yaw, rot, v0")->required();
  app.add_flag("--all-steps", a->all_steps, "also write x_steps [N+1, B, T, A] and v_steps [N, B, T, A]");
  app.add_option("--layers-out", a->layers_out, "write step-0 emb, layer.{l} outputs and final hidden");
  app.add_option("--json", a->json, "write the trajectories as JSON");
  app.add_option("--svg", a->svg, "write an SVG plot of the trajectories");
  app.add_flag("--profile", a->profile, "print a per-op time table of every step (cpu backend)");
  app.add_flag("--exact-freqs", a->exact_freqs, "unrounded Fourier frequencies when the checkpoint has no buffers");
  app.add_flag("--quiet", a->quiet, "no progress on stderr");
  return [a] { run_sample(*a); };
}

Run add_backends(CLI::App&) {
  return [] {
    for (const BackendInfo& b : registered_backends()) {
      std::printf("%s", b.name.c_str());
      for (const std::string& f : b.weight_formats) std::printf(" %s", f.c_str());
      std::printf("; kv");
      for (const std::string& f : b.kv_formats) std::printf(" %s", f.c_str());
      // The context features it runs (BackendInfo::features), as one word each.
      std::printf("; features");
      const BackendFeatures& f = b.features;
      for (const auto& [on, word] : {std::pair{f.shared_prompts, "shared-prompts"}, {f.suffix_rows, "suffix-rows"},
                                     {f.left_padding, "left-padding"}, {f.guidance, "guidance"},
                                     {f.device_memory, "device-memory"}, {f.strided_cache, "strided-cache"},
                                     {f.paged_cache, "paged-cache"}})
        if (on) std::printf(" %s", word);
      if (const std::string why = b.unavailable(); !why.empty()) {
        std::printf(" -- unavailable: %s", why.c_str());
      } else {
        // The formats this machine runs, where it cannot run them all (a GPU too old for fp8).
        std::string runs, not_here;
        for (const std::string& w : b.weight_formats) {
          const std::string no = b.format_unavailable(w);
          (no.empty() ? runs : not_here) += (no.empty() ? " " + w : "; not " + w + ": " + no);
        }
        if (!not_here.empty()) std::printf("; runs%s (%s)", runs.c_str(), not_here.substr(2).c_str());
      }
      std::printf("\n");
    }
  };
}

}  // namespace alpamayo::cli
