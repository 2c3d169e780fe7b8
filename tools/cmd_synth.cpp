// `make-checkpoint`, `make-context` and `demo`.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "alpamayo/environment.h"
#include "alpamayo/engine.h"
#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "alpamayo/output.h"
#include "alpamayo/synthetic.h"
#include "commands.h"
#include "report.h"

namespace fs = std::filesystem;

namespace alpamayo::cli {
namespace {

DType parse_float_dtype(const std::string& s, const std::string& option) {
  if (s == "bf16") return DType::BF16;
  if (s == "f16") return DType::F16;
  if (s == "f32") return DType::F32;
  throw Error(option + ": expected bf16, f16 or f32, found '" + s + "'");
}

struct CkArgs {
  std::string out, layout = "a2", dtype = "bf16";
  SyntheticCheckpointSpec spec;
};

void add_checkpoint_size_options(CLI::App& app, SyntheticCheckpointSpec& s) {
  app.add_option("--layers", s.L, "expert layers L (= VLM layers)")->check(CLI::Range(1, 4096));
  app.add_option("--hidden", s.D, "hidden size D")->check(CLI::Range(1, 1 << 16));
  app.add_option("--heads", s.Hq, "query heads")->check(CLI::Range(1, 1024));
  app.add_option("--kv-heads", s.Hkv, "KV heads")->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", s.d, "head dim (even)")->check(CLI::Range(2, 1024));
  app.add_option("--mlp", s.I, "MLP width I")->check(CLI::Range(1, 1 << 18));
  app.add_option("--ain-hidden", s.ain_hidden, "action_in_proj hidden size")->check(CLI::Range(1, 1 << 16));
  app.add_option("--ain-layers", s.ain_layers, "action_in_proj encoder layers")->check(CLI::Range(1, 64));
  app.add_option("--fourier", s.n_fourier, "Fourier features per input (even)")->check(CLI::Range(4, 1024));
  app.add_option("--max-freq", s.max_freq, "Fourier max frequency")->check(finite_number())->check(CLI::Range(1e-6, 1e6));
  app.add_option("--waypoints", s.T, "action tokens / waypoints T")->check(CLI::Range(1, 4096));
  app.add_option("--steps", s.steps, "diffusion_cfg.num_inference_steps")->check(CLI::Range(1, 100000));
}

}  // namespace

Run add_make_checkpoint(CLI::App& app) {
  auto a = std::make_shared<CkArgs>();
  app.add_option("--out", a->out, "output directory")->required();
  app.add_option("--layout", a->layout,
                 "release whose config.json and tensor layout are written: r1 (Alpamayo-R1: flat config, buffers) | "
                 "1.5 (Alpamayo 1.5: flat config, no buffers) | a2 (Alpamayo 2 Super: nested config, expert.expert.*)");
  app.add_option("--dtype", a->dtype, "bf16 | f16 | f32");
  app.add_option("--shards", a->spec.shards, "number of expert shards (> 1: sharded with an index)")->check(CLI::Range(1, 1000));
  app.add_option("--seed", a->spec.seed, "seed")->check(unsigned64());
  app.add_flag("--trained-stats", a->spec.trained_weights,
               "expert weight matrices with a trained model's statistics (heavy tails, per-channel scales, outliers)");
  add_checkpoint_size_options(app, a->spec);
  return [a] {
    a->spec.release = parse_release(a->layout, "--layout");
    a->spec.layout = release_layout(*a->spec.release);
    a->spec.dtype = parse_float_dtype(a->dtype, "--dtype");
    write_synthetic_checkpoint(a->out, a->spec);
    std::fprintf(stderr, "wrote %s\n", a->out.c_str());
  };
}

Run add_make_context(CLI::App& app) {
  struct Args {
    std::string checkpoint, out, dtype = "bf16", valid, delta, release, prompt_index, pad, suffix;
    SyntheticContextSpec spec;
  };
  auto a = std::make_shared<Args>();
  app.add_option("--checkpoint", a->checkpoint, "checkpoint the context is for (layers, KV heads, head dim)")->required();
  app.add_option("--out", a->out, "output context file")->required();
  app.add_option("--batch", a->spec.B, "samples B")->check(CLI::Range(1, 4096));
  app.add_option("--rows", a->spec.P, "prompt cache rows P")->check(CLI::Range(1, 1 << 24));
  app.add_option("--prompts", a->spec.G, "prompts G stored once (default: one per sample)")->check(CLI::Range(1, 4096));
  app.add_option("--prompt-index", a->prompt_index, "each sample's prompt, comma-separated");
  app.add_option("--valid-len", a->valid, "rows in use per prompt, comma-separated (default P)");
  app.add_option("--prefix-pad", a->pad, "left-padding rows per prompt, comma-separated (default 0)");
  app.add_option("--suffix-rows", a->spec.Q, "suffix cache rows Q per sample (default 0: none)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--suffix-len", a->suffix, "suffix rows in use per sample, comma-separated (default Q)");
  app.add_option("--rope-delta", a->delta, "rope delta per sample, comma-separated (default 0)");
  app.add_option("--dtype", a->dtype, "cache dtype bf16 | f16 | f32");
  app.add_option("--history", a->spec.history, "ego history poses (0: write v0 instead)")->check(CLI::Range(0, 100000));
  app.add_option("--seed", a->spec.seed, "seed")->check(unsigned64());
  add_release_option(app, a->release);
  return [a] {
    OutputSet outs;
    outs.add_input(a->checkpoint, "--checkpoint");
    const size_t o = outs.add(a->out, "--out");
    auto ck = Checkpoint::open(a->checkpoint, checkpoint_options("", a->release));
    a->spec.dtype = parse_float_dtype(a->dtype, "--dtype");
    if (!a->valid.empty()) a->spec.valid_len = parse_int_list(a->valid, "--valid-len");
    if (!a->delta.empty()) a->spec.rope_delta = parse_int_list(a->delta, "--rope-delta");
    if (!a->prompt_index.empty()) a->spec.prompt_index = parse_int_list(a->prompt_index, "--prompt-index");
    if (!a->pad.empty()) a->spec.prefix_pad = parse_int_list(a->pad, "--prefix-pad");
    if (!a->suffix.empty()) a->spec.suffix_len = parse_int_list(a->suffix, "--suffix-len");
    check(a->spec.history != 1, "--history: need 0 or at least 2 poses");
    write_synthetic_context(outs.sink(o), ck->config(), a->spec, [&](double bytes, const std::string& stage) {
      outs.check_space(o, bytes, stage, "the context file");
    });
    outs.commit();
    std::fprintf(stderr, "wrote %s\n", a->out.c_str());
  };
}

Run add_demo(CLI::App& app) {
  struct Args {
    std::string out_dir = "demo-out", size = "full", backend;
    int rows = 4700, batch = 1, threads = 0, steps = 0;
    std::string weights, kv;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  a->backend = backend_names().front();
  app.add_option("--out-dir", a->out_dir, "where the checkpoint, context and results go (reused when present)");
  app.add_option("--size", a->size, "full (the seed's model: 64 layers, D 1536, ...) | small (4 layers, D 256)");
  app.add_option("--rows", a->rows, "VLM cache rows S")->check(CLI::Range(1, 1 << 20));
  app.add_option("--batch", a->batch, "trajectories sampled at once")->check(CLI::Range(1, 64));
  app.add_option("--backend", a->backend, "backend");
  app.add_option("--threads", a->threads, "threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--weights", a->weights, formats_help(false));
  app.add_option("--kv", a->kv, formats_help(true));
  app.add_option("--steps", a->steps, "Euler steps (default from config)")->check(CLI::Range(1, 100000));
  app.add_option("--seed", a->seed, "noise seed")->check(unsigned64());
  return [a] {
    check(a->size == "full" || a->size == "small", "--size: expected full or small, found '" + a->size + "'");
    SyntheticCheckpointSpec spec;  // defaults: the seed's architecture
    if (a->size == "small") { spec.L = 4; spec.D = 256; spec.Hq = 4; spec.Hkv = 2; spec.d = 64; spec.I = 1024; spec.ain_hidden = 128; }
    const fs::path dir = fs::path(a->out_dir) / ("checkpoint-" + a->size);
    fs::create_directories(a->out_dir);
    bool reuse = fs::exists(dir / "config.json");
    if (reuse) {
      try {  // a checkpoint an older version wrote (R1-shaped config over Alpamayo 2 tensors) is written anew
        Checkpoint::open(dir.string());
      } catch (const Error& e) {
        std::fprintf(stderr, "the synthetic checkpoint in %s does not load (%s); writing it anew\n", dir.c_str(), e.what());
        reuse = false;
      }
    }
    if (!reuse) {
      std::fprintf(stderr, "writing a synthetic %s checkpoint to %s ...\n", a->size.c_str(), dir.c_str());
      write_synthetic_checkpoint(dir.string(), spec);
    }
    auto ck = Checkpoint::open(dir.string());
    const fs::path ctx_path = fs::path(a->out_dir) / ("context-" + a->size + "-" + std::to_string(a->batch) + "x" +
                                                      std::to_string(a->rows) + ".safetensors");
    if (!fs::exists(ctx_path)) {
      SyntheticContextSpec cs;
      cs.B = a->batch;
      cs.P = a->rows;
      for (int b = 0; b < a->batch; ++b) {
        cs.valid_len.push_back(a->rows - 37 * b);  // padded batch: shorter prompts for later samples
        cs.rope_delta.push_back(-1200 + 5 * b);    // multimodal rope offsets are typically negative
      }
      check(cs.valid_len.back() > 0, "--rows too small for --batch");
      std::fprintf(stderr, "writing a synthetic context (%d x %d rows) to %s ...\n", a->batch, a->rows, ctx_path.c_str());
      write_synthetic_context(ctx_path.string(), ck->config(), cs);
    }
    const ExpertConfig& c = ck->config();
    BackendOptions bo;
    bo.threads = a->threads;
    bo.weights = a->weights;
    bo.kv = a->kv;
    options_from_environment(bo, a->backend);
    const auto t0 = std::chrono::steady_clock::now();
    options_from_environment(bo, a->backend);  // ALPAMAYO_CPU_KERNELS, ALPAMAYO_CPU_ISA
    Session session(Model::load(ck, a->backend, bo));
    Context ctx = Context::open(ctx_path.string());
    const std::optional<EgoHistory> history = ctx.history();
    session.bind(std::move(ctx));
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SampleOptions so;
    so.steps = a->steps;
    so.seed = a->seed;
    const std::string out = (fs::path(a->out_dir) / "trajectories.safetensors").string();
    const std::string js = (fs::path(a->out_dir) / "trajectories.json").string();
    const std::string svg = (fs::path(a->out_dir) / "trajectories.svg").string();
    OutputSet outs;
    outs.add_input(dir.string(), "the checkpoint");
    outs.add_input(ctx_path.string(), "the context");
    const size_t o_out = outs.add(out), o_js = outs.add(js), o_svg = outs.add(svg);
    SampleResult r = session.sample(so);
    for (int k = 0; k < r.steps; ++k) std::fprintf(stderr, "  step %d/%d  %.3f s\n", k + 1, r.steps, r.step_seconds[k]);
    write_result_safetensors(outs.sink(o_out), r, session.model());
    write_result_json(outs.sink(o_js), r, session.model());
    write_result_svg(outs.sink(o_svg), r, history ? &*history : nullptr);
    outs.commit();
    double total = 0;
    for (double s : r.step_seconds) total += s;
    std::printf("Alpamayo action expert demo (%s model, backend %s, %s weights, %s KV cache)\n", a->size.c_str(),
                a->backend.c_str(), session.model().weights().c_str(), session.model().kv().c_str());
    std::printf("  expert   L=%d D=%d heads=%d/%d head_dim=%d mlp=%d T=%d, %.2f B parameters\n", c.L, c.D, c.Hq, c.Hkv,
                c.d, c.I, c.T, ck->expert_parameters() / 1e9);
    std::printf("  context  B=%d, %d cache rows\n", a->batch, a->rows);
    std::printf("  load+bind %.2f s; %d Euler steps: %.3f s per step, %.2f s per sample\n", load_s, r.steps,
                total / r.steps, total);
    for (int b = 0; b < r.B; ++b) {
      const int64_t last = (int64_t(b) * r.T + r.T - 1) * 3;
      std::printf("  sample %d: v0 %.2f m/s (%s) -> endpoint (%.1f, %.1f) m after %.1f s, yaw %.1f deg\n", b, r.v0[b],
                  r.v0_source.c_str(), r.xyz[last], r.xyz[last + 1], r.T * c.dt,
                  r.yaw[int64_t(b) * r.T + r.T - 1] * 180.0 / M_PI);
    }
    std::printf("  wrote %s, %s, %s\n", out.c_str(), js.c_str(), svg.c_str());
  };
}

}  // namespace alpamayo::cli
