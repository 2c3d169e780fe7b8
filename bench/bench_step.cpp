// Times the denoising steps of the full-size expert (Model + Session, the action projections included)
// with random weights and a random bf16 VLM cache built in memory. Every layer gets its own packed copy of
// one random layer's weights (so the weight traffic is real) and its own cache rows.
// Prints the per-op table of every step (--profile, stderr), time per step, 10-step estimate, the memory of the
// model and of one session, and a final JSON line for scripts (bench/bench_vs_torch.py). For the cpu
// backend also the kernel chosen per op and this machine's roofline floor for the step (peaks.h): per phase
// max(flop / peak, bytes / read bandwidth), the flops of the weight matmuls (2 * M * the layers' weights) and of
// attention (4 * T * Hq * d * keys, per sample and layer) at the measured peak of the instruction its kernel uses,
// the bytes those phases must move at the measured streaming read bandwidth; the fraction of the floor the best
// step achieves, the floor with every op on the CPU's fastest unit, and (with --profile) the weight bytes per
// second of the matmul phases against the read bandwidth. The JSON line carries floor_s, floor_best_s, read_gbs
// and matmul_gbs (0 without --profile).
// --sessions 2 also binds a second session on the same model and runs both at once: it reports what the
// second session costs and checks that each gives bitwise the result it gives alone.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <thread>

#include "alpamayo/engine.h"
#include "alpamayo/environment.h"
#include "alpamayo/tensor.h"
#include "synthetic_expert.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "backends/cpu/cpu_backend_impl.h"
#include "backends/cpu/profile/peaks.h"
#include "backends/cpu/profile/profile_table.h"
#include "backends/cpu/runtime/isa.h"
#endif

namespace {

using namespace alpamayo;

long vm_hwm_kb() { return bench::proc_status_kb("VmHWM:"); }
long vm_rss_kb() { return bench::proc_status_kb("VmRSS:"); }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// --profile: the table of every step of the session's last sample, to stderr.
void print_profiles(const Session& s) {
#ifdef ALPAMAYO_WITH_CPU_BACKEND
  for (const StepProfile& p : s.profiles()) std::fputs(cpu::format_profile(p).c_str(), stderr);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  int L = 64, D = 1536, Hq = 16, Hkv = 8, d = 128, I = 6144, T = 64, S = 4700, Smax = 8192, B = 1, threads = 2,
      steps = 3, warmup = 1, sessions = 1;
  std::vector<int64_t> suffix;
  bool copies = false;
  std::string weights = "bf16", backend = "cpu", kv_format;
  std::vector<std::string> bf16_weights;
  bool profile = true;
  CLI::App app{"Time the denoising steps of the full-size expert on random weights"};
  app.add_option("--L", L, "layers");
  app.add_option("--D", D, "hidden size");
  app.add_option("--Hq", Hq, "query heads");
  app.add_option("--Hkv", Hkv, "KV heads");
  app.add_option("--d", d, "head dim");
  app.add_option("--I", I, "MLP width");
  app.add_option("--T", T, "action tokens per sample");
  app.add_option("--S", S, "valid cache rows per sample");
  app.add_option("--Smax", Smax, "cache capacity P");
  app.add_option("--B", B, "batch");
  app.add_option("--threads", threads, "threads per session (0: all cores)");
  app.add_option("--weights", weights, "weight format (cpu: bf16 | int8 | bfp8_b | bfp4_b)");
  app.add_option("--kv", kv_format, "KV cache format (cpu: bf16 | int8; default: the backend's first)");
  app.add_option("--bf16-weights", bf16_weights, "block formats: matrices kept in bf16 (qkv,o,gate,up,down)")
      ->delimiter(',');
  app.add_option("--backend", backend, "backend name");
  app.add_option("--steps", steps, "timed Euler steps (one sample)");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--profile", profile, "print the per-op table after each step (1/0)");
  app.add_option("--suffix", suffix, "per-sample suffix rows after a prompt shared by the B samples (cycled)")
      ->delimiter(',');
  app.add_option("--copies", copies, "with --suffix: store a copy of the prompt per sample instead (1/0)");
  app.add_option("--sessions", sessions, "1, or 2: also run a second session on the same model concurrently")
      ->check(CLI::Range(1, 2));
  CLI11_PARSE(app, argc, argv);

  try {
    bench::Rng rng{0x9E3779B97F4A7C15ull};
    const bench::SyntheticExpert synth(L, D, Hq, Hkv, d, I, T, rng);
    const ExpertConfig& cfg = synth.cfg;
    const ModelWeights& w = synth.weights;

    BackendOptions opts;
    opts.threads = threads;
    opts.weights = weights;
    opts.kv = kv_format;
    opts.bf16_weights = bf16_weights;
    opts.profile = profile;  // the tables go to stderr after every sample
    options_from_environment(opts, backend);  // ALPAMAYO_CPU_KERNELS, ALPAMAYO_CPU_ISA
    auto t0 = std::chrono::steady_clock::now();
    auto model = Model::from_weights(cfg, w, nullptr, backend, opts);
    const double load_s = seconds_since(t0);
    const long hwm_model = vm_hwm_kb();

    // Cache: rows in use random, the rest zero (never read). --suffix R: the B samples share one S-row prompt
    // (stored once) and each has its own suffix of R[b] rows (the reasoning text after the prompt); with
    // --copies 1 every sample instead holds a full copy of the prompt followed by its suffix, as every
    // implementation that does not share the prompt stores it.
    std::vector<int64_t> sfx;
    if (!suffix.empty())
      for (size_t b = 0; b < size_t(B); ++b) sfx.push_back(suffix[b % suffix.size()]);
    const int64_t Q = sfx.empty() ? 0 : *std::max_element(sfx.begin(), sfx.end());
    KVCache kv;
    kv.B = B; kv.Hkv = Hkv; kv.d = d;
    const bool shared = !sfx.empty() && !copies;
    kv.G = shared ? 1 : B;
    kv.P = copies && !sfx.empty() ? std::max<int64_t>(Smax, S + Q) : Smax;
    // All suffixes empty (--suffix 0): the samples share the prompt and have no suffix caches at all, as several
    // trajectories drawn for one prompt do.
    const bool suffixes = shared && Q > 0;
    if (shared) {
      kv.valid_len = {S};
      kv.prompt_of.assign(B, 0);
    } else {
      for (int b = 0; b < B; ++b) kv.valid_len.push_back(S + (sfx.empty() ? 0 : sfx[b]));
    }
    if (suffixes) {
      kv.Q = static_cast<int>(Q);
      kv.suffix_len = sfx;
    }
    std::vector<std::vector<uint16_t>> store;
    auto fill = [&](int64_t N, int64_t P, const std::vector<int64_t>& rows, const char* name) {
      auto& c = store.emplace_back(size_t(N) * Hkv * P * d, 0);
      for (int64_t bh = 0; bh < N * Hkv; ++bh)
        for (size_t i = 0; i < size_t(rows[bh / Hkv]) * d; ++i) c[bh * P * d + i] = f32_to_bf16(rng.normal());
      return TensorView{DType::BF16, {N, Hkv, P, d}, c.data(), name};
    };
    for (int l = 0; l < L; ++l)
      for (int which = 0; which < 2; ++which) {
        (which ? kv.value : kv.key).push_back(fill(kv.G, kv.P, kv.valid_len, "cache"));
        if (suffixes) (which ? kv.suffix_value : kv.suffix_key).push_back(fill(B, Q, sfx, "suffix"));
      }
    auto context = [&] { return Context::from_views(kv, std::vector<int64_t>(B, 0), std::nullopt, std::vector<float>(B, 8.f)); };
    size_t cache_bytes = 0;
    for (const auto& c : store) cache_bytes += c.size() * 2;
    std::printf("cache: %s, %.1f MiB\n", suffixes ? "one shared prompt + per-sample suffixes" : shared ? "one shared prompt" : copies && !sfx.empty() ? "a prompt copy per sample + its suffix" : "one prompt per sample",
                cache_bytes / 1048576.0);
    Session session(model);
    t0 = std::chrono::steady_clock::now();
    session.bind(context());
    const double bind_s = seconds_since(t0);
    const long hwm_one = vm_hwm_kb();
    // A new context of the same sizes, as every camera frame brings: buffers are reused, only the context's own
    // work is left (the int8 cache's quantisation, the attention plan).
    t0 = std::chrono::steady_clock::now();
    session.bind(context());
    const double rebind_s = seconds_since(t0);

    SampleOptions so;
    so.seed = 7;
    if (warmup > 0) {
      so.steps = warmup;
      session.sample(so);
      print_profiles(session);
    }
    so.steps = steps;
    const SampleResult r = session.sample(so);
    print_profiles(session);
    const std::vector<double>& times = r.step_seconds;
    double mean = 0, best = 1e30;
    for (double t : times) { mean += t; best = std::min(best, t); }
    mean /= times.size();
    std::printf("backend %s, weights %s, kv %s, threads %d: L=%d D=%d Hq=%d Hkv=%d d=%d I=%d T=%d S=%d Smax=%d B=%d\n",
                backend.c_str(), model->weights().c_str(), model->kv().c_str(), threads, L, D, Hq, Hkv, d, I, T, S, Smax, B);
    std::printf("load %.2f s, bind %.3f s (again, same sizes: %.3f s)\n", load_s, bind_s, rebind_s);
    std::printf("step: mean %.4f s, min %.4f s over %d steps; 10-step sample ~ %.2f s\n", mean, best, steps,
                10 * mean);
    std::printf("model weights %.1f MiB; session buffers %.1f MiB; peak memory (VmHWM): %.1f MiB after load, "
                "%.1f MiB after the first bind, %.1f MiB now\n",
                model->backend().weight_bytes() / 1048576.0, session.buffer_bytes() / 1048576.0, hwm_model / 1024.0,
                hwm_one / 1024.0, vm_hwm_kb() / 1024.0);
    double floor_s = 0, floor_best_s = 0, read_gbs = 0, matmul_gbs = 0;
#ifdef ALPAMAYO_WITH_CPU_BACKEND
    if (const auto* cpu_model = dynamic_cast<const cpu::CpuModel*>(&model->backend())) {  // the cpu backend's floors
      std::vector<long long> keys;
      long long rows = shared ? S : 0;  // distinct cache rows: the shared prompt read once
      for (int b = 0; b < B; ++b) {
        keys.push_back((shared ? S + sfx[b] : kv.valid_len[b]) + T);
        rows += keys.back() - (shared ? S : 0);
      }
      const int nt = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      const cpu::StepWork work =
          cpu::step_work(L, D, Hq, Hkv, d, I, T, keys, model->weights(), model->kv() == "int8", rows);
      // The peaks again after the steps, the best of both kept: one neighbour's burst at bind cannot lower them.
      cpu::remeasure_peaks(nt);
      const cpu::CpuModel& cm = *cpu_model;
      const std::vector<cpu::OpFloor> floors =
          cpu::step_floors(work, cm.kernel_choices(), model->weights(), nt, model->kv() == "int8", cm.isa().usable);
      std::printf("isa: %s\n", cm.isa().describe().c_str());
      for (const cpu::KernelChoice& c : cm.kernel_choices()) {
        std::printf("kernel %s\n", cpu::format_kernel_choice(c).c_str());
        if (!c.check.empty()) std::printf("check %s\n", cpu::format_kernel_check(c).c_str());
      }
      std::printf("peaks (%d threads, best of bind and after the steps):", nt);
      for (const cpu::PeakEntry& e : cpu::measured_peaks(nt).entries)
        std::printf("  %s %.1f", e.instruction.c_str(), e.rate);
      std::printf("  GFLOP/s (int8: GOP/s); streaming read %.1f GB/s\n", cpu::measured_peaks(nt).read_gbs);
      std::printf("%s", cpu::format_floors(floors, nt, "").c_str());
      for (const cpu::OpFloor& f : floors) floor_s += f.floor_ms * 1e-3;
      std::printf("step floor %.4f s; best step %.4f s = %.1f%% of floor\n", floor_s, best, 100.0 * floor_s / best);
      // The weight matmuls' phases (with --profile), fastest step: the bytes they must move per second, against
      // the read bandwidth.
      double mm_ms = 0;
      for (const StepProfile& pr : session.profiles())
        if (!pr.ops.empty() && pr.ops[0].actual_ms > 0)
          mm_ms = mm_ms > 0 ? std::min(mm_ms, pr.ops[0].actual_ms) : pr.ops[0].actual_ms;
      read_gbs = cpu::measured_peaks(nt).read_gbs;
      if (mm_ms > 0) {
        matmul_gbs = work.matmul_weight_gbytes / (1e-3 * mm_ms);
        std::printf("matmul phases: %.3f GB of weights in %.1f ms = %.1f GB/s = %.1f%% of the read bandwidth\n",
                    work.matmul_weight_gbytes, mm_ms, matmul_gbs, 100.0 * matmul_gbs / read_gbs);
      }
      // Every op held to the CPU's fastest unit for its operands (AMX where granted and not capped off), whatever
      // kernel ran.
      for (const cpu::OpFloor& f :
           cpu::step_floors(work, {}, model->weights(), nt, model->kv() == "int8", cm.isa().usable))
        floor_best_s += f.floor_ms * 1e-3;
      std::printf("step floor with every op on the CPU's fastest unit: %.4f s\n", floor_best_s);
    }
#endif
    if (sessions == 2) {
      // A second session on the same model: only its own buffers. Then both at once, each compared bitwise
      // with its result alone (the same context and seed, so also with each other).
      const long rss_one = vm_rss_kb();
      Session second(model);
      second.bind(context());
      so.steps = 2;
      const SampleResult alone = session.sample(so);
      print_profiles(session);
      SampleResult ra, rb;
      t0 = std::chrono::steady_clock::now();
      std::thread th([&] { rb = second.sample(so); });
      ra = session.sample(so);
      th.join();
      print_profiles(session);
      print_profiles(second);
      const double both_s = seconds_since(t0);
      const long rss_two = vm_rss_kb();  // after the second session has touched all its buffers
      const bool same = ra.action == alone.action && rb.action == alone.action;
      std::printf("second session: buffers %.1f MiB, resident memory +%.1f MiB; two sessions at once: "
                  "%.3f s for 2 steps each; bitwise equal to the solo run: %s\n",
                  second.buffer_bytes() / 1048576.0, (rss_two - rss_one) / 1024.0, both_s, same ? "yes" : "NO");
      if (!same) return 1;
    }
    std::printf("{\"backend\":\"%s\",\"weights\":\"%s\",\"threads\":%d,\"S\":%d,\"step_s_mean\":%.5f,"
                "\"step_s_min\":%.5f,\"vmhwm_mib\":%.1f,\"floor_s\":%.5f,\"floor_best_s\":%.5f,\"read_gbs\":%.2f,"
                "\"matmul_gbs\":%.2f}\n",
                backend.c_str(), model->weights().c_str(), threads, S, mean, best, vm_hwm_kb() / 1024.0, floor_s,
                floor_best_s, read_gbs, matmul_gbs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
