// `inspect`: what a checkpoint holds, which release it is, and where every value the engine uses came from.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "alpamayo/backend.h"
#include "alpamayo/checkpoint.h"
#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "commands.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "backends/cpu/attention/attention.h"
#include "backends/cpu/cpu_backend_impl.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/profile/peaks.h"
#endif

namespace alpamayo::cli {

std::string formats_help(bool kv) {
  std::string s = kv ? "KV cache format (" : "weight format (";
  for (const BackendInfo& b : registered_backends()) {
    s += b.name + ":";
    const std::vector<std::string>& f = kv ? b.kv_formats : b.weight_formats;
    for (size_t i = 0; i < f.size(); ++i) s += (i ? " | " : " ") + f[i];
    s += "; ";
  }
  return s + "default: the backend's first)";
}

void add_release_option(CLI::App& app, std::string& release) {
  app.add_option("--release", release,
                 "the release whose config.json layout the checkpoint follows, when its model_type is not a known "
                 "one: r1 | 1.5 | a2 (or alpamayo_r1, alpamayo1_5, alpamayo2_super)");
}

CheckpointOptions checkpoint_options(const std::string& vlm_config, const std::string& release) {
  CheckpointOptions o;
  o.vlm_config = vlm_config;
  if (!release.empty()) o.release = parse_release(release, "--release");
  return o;
}

Run add_inspect(CLI::App& app) {
  struct Args {
    std::string dir, vlm, release;
    bool kernels = false;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  app.add_option("checkpoint", a->dir, "checkpoint directory")->required();
  app.add_flag("--kernels", a->kernels,
               "cpu backend: time the kernels as loading a model does (attention on bf16 and int8 caches, bf16 and int8 weight matmuls), "
               "print the choice per op, the ALPAMAYO_CPU_KERNELS value that pins them all, the instruction peaks (AMX included) and the streaming read bandwidth (~1.5 s)");
  app.add_option("--threads", a->threads, "with --kernels: threads the peaks are measured on (0: all cores)");
  app.add_option("--vlm-config", a->vlm, "the VLM's config.json (or its text_config)");
  add_release_option(app, a->release);
  return [a] {
    auto ck = Checkpoint::open(a->dir, checkpoint_options(a->vlm, a->release));
    const ExpertConfig& c = ck->config();
    std::printf("checkpoint   %s\n", a->dir.c_str());
    std::printf("release      %s (%s)\n", release_name(ck->release()), ck->release_evidence().c_str());
    std::printf("layout       %s\n", layout_name(ck->layout()));
    std::printf("expert       L=%d D=%d heads=%d/%d head_dim=%d mlp=%d eps=%g theta=%g  (%.6g M parameters, dtype %s)\n",
                c.L, c.D, c.Hq, c.Hkv, c.d, c.I, c.rms_eps, c.rope_theta, ck->expert_parameters() / 1e6,
                dtype_name(ck->expert().layers[0].q.dtype));
    std::printf("action_in    hidden=%d enc_layers=%d fourier=%d max_freq=%g\n", c.ain_hidden, c.ain_layers, c.n_fourier,
                c.max_freq);
    std::printf("action space T=%d A=%d dt=%g accel %g+-%g curvature %g+-%g v_lambda=%g v_ridge=%g\n", c.T, c.A, c.dt,
                c.accel_mean, c.accel_std, c.curvature_mean, c.curvature_std, c.v_lambda, c.v_ridge);
    std::printf("sampler      %s, %d steps; classifier-free guidance %s (weight %g); attention %s\n",
                c.int_method.c_str(), c.num_steps, c.use_cfg ? "on" : "off", c.guidance_weight,
                c.non_causal ? "non-causal" : "causal");
    // One line per value: `value  NAME = VALUE  <- SOURCE` (a config key, a tensor, or a default).
    for (const ConfigValue& v : ck->values())
      std::printf("value        %-44s = %-22s <- %s\n", v.name.c_str(), v.value.c_str(), v.source.c_str());
    for (const auto& n : ck->notes()) std::printf("note         %s\n", n.c_str());
    for (const auto& f : ck->files()) std::printf("file         %s\n", f.c_str());
    std::printf("skipped      %lld vlm.* tensors (never read)\n", static_cast<long long>(ck->vlm_tensors_skipped()));
#ifdef ALPAMAYO_WITH_CPU_BACKEND
    // The instruction sets the cpu backend may use here (after ALPAMAYO_CPU_ISA), and the kernels it would choose
    // under ALPAMAYO_CPU_KERNELS: what a model loaded by `sample` in this environment gets.
    BackendOptions bo;
    options_from_environment(bo, "cpu");
    const cpu::KernelScope scope = cpu::kernel_scope(bo);
    std::printf("cpu isa      %s\n", scope.isa.describe().c_str());
    if (a->kernels) {
      cpu::KernelChoices made;
      for (bool kv_int8 : {false, true})
        cpu::select_attention_kernel(cpu::kRepHeadDim, cpu::kRepGroup, cpu::kRepTokens, 2048, kv_int8, scope, &made);
      const int k_model = std::max({c.D, c.Hq * c.d, c.I});
      for (cpu::WeightType t : {cpu::WeightType::BF16, cpu::WeightType::INT8})
        cpu::record_kernel_choice(made, cpu::select_matmul_kernel(t, k_model, scope));
      for (const cpu::KernelChoice& k : made) {
        std::printf("cpu kernel   %s\n", cpu::format_kernel_choice(k).c_str());
        if (!k.check.empty()) std::printf("cpu check    %s\n", cpu::format_kernel_check(k).c_str());
      }
      // Timed choices can differ between processes where kernels are close: this value reproduces these.
      std::printf("cpu pin      ALPAMAYO_CPU_KERNELS=%s\n", cpu::kernel_pin(made).c_str());
      const cpu::Peaks& p = cpu::measured_peaks(a->threads);
      for (const cpu::PeakEntry& e : p.entries)
        if (e.rate > 0)
          std::printf("cpu peak     %-16s %8.1f %s on %d threads\n", e.instruction.c_str(), e.rate, e.unit.c_str(),
                      p.threads);
        else
          std::printf("cpu peak     %-16s %8s (%s)\n", e.instruction.c_str(), "-", e.why_not.c_str());
      // The roofline's other side: the weight matmuls stream their weights from memory once per step.
      std::printf("cpu read     %-16s %8.1f GB/s on %d threads\n", "streaming", p.read_gbs, p.threads);
    }
#endif
  };
}

}  // namespace alpamayo::cli
