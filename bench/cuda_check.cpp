// The cuda backend's device check at full size (scripts/device-check.sh runs it on a GPU machine):
//   accuracy  the seed's model (synthetic weights, 64 layers) and a 4,700-row context against the reference
//             backend: step 0's action_in_proj output, every layer and the final hidden state (PCC, max abs
//             relative to the largest reference value), every v_k, x_N and the trajectory in metres, for bf16
//             and fp8 weights, with the cache bound from GPU memory (no copy);
//   bench     time per Euler step (device events inside the graph) and per 10-step sample (wall, the
//             host's action decode included) for bf16 / fp8 and 1 / 6 / 20 samples sharing one prompt (stored
//             once, read once per layer by the cascade), the bytes a step reads (weights + valid cache rows) as
//             GB/s against a measured device copy bandwidth.
// Prints tables and writes everything as JSON (--json). Needs nothing beyond the library and the CUDA runtime.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "alpamayo/synthetic.h"

namespace {

using namespace alpamayo;
using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Args {
  std::string work = "device-check-work";
  std::string json;
  int rows = 4700, layers = 64, ref_steps = 10, samples = 20, threads = 0;
  std::vector<std::string> formats = {"bf16", "fp8"};
  std::vector<int> batches = {1, 6, 20};  // samples sharing one prompt
  bool accuracy = true, bench = true;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

void usage() {
  std::fprintf(stderr,
               "usage: cuda_check [--work DIR] [--json FILE] [--rows S] [--layers L] [--ref-steps N] [--samples N]\n"
               "                  [--formats bf16,fp8] [--batches 1,6,20] [--threads N] [--no-accuracy] [--no-bench]\n"
               "ALPAMAYO_CUDA_GEMM=cublaslt|own picks the weight matmuls (default: cublaslt for bf16, own for fp8)\n");
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(k + ": missing value");
      return argv[++i];
    };
    if (k == "--work")
      a.work = next();
    else if (k == "--json")
      a.json = next();
    else if (k == "--rows")
      a.rows = std::stoi(next());
    else if (k == "--layers")
      a.layers = std::stoi(next());
    else if (k == "--ref-steps")
      a.ref_steps = std::stoi(next());
    else if (k == "--samples")
      a.samples = std::stoi(next());
    else if (k == "--formats")
      a.formats = split_list(next());
    else if (k == "--batches") {
      a.batches.clear();
      for (const std::string& b : split_list(next())) a.batches.push_back(std::stoi(b));
    } else if (k == "--threads")
      a.threads = std::stoi(next());
    else if (k == "--no-accuracy")
      a.accuracy = false;
    else if (k == "--no-bench")
      a.bench = false;
    else {
      usage();
      throw Error("unknown option " + k);
    }
  }
  return a;
}

// The context's cache tensors in GPU memory, stored once, with `copies` samples per prompt (the rollout's samples
// sharing one prompt: sample c * B0 + b reads prompt b), as device views.
class DeviceCache {
 public:
  DeviceCache(const Context& host, int copies) {
    kv_ = host.kv();
    const int B0 = kv_.B;
    for (auto* list : {&kv_.key, &kv_.value})
      for (TensorView& t : *list) {
        void* p = nullptr;
        cuda_check(cudaMalloc(&p, t.nbytes()), "cudaMalloc (context)");
        cuda_check(cudaMemcpy(p, t.data, t.nbytes(), cudaMemcpyHostToDevice), "upload");
        bufs_.push_back(p);
        t.data = p;
        t.device = {DeviceType::CUDA, 0};
        cuda_check(cudaGetDevice(&t.device.id), "cudaGetDevice");
      }
    kv_.B = B0 * copies;
    kv_.prompt_of.clear();
    std::vector<int64_t> rd;
    for (int c = 0; c < copies; ++c) {
      for (int b = 0; b < B0; ++b) kv_.prompt_of.push_back(host.kv().prompt(b));
      rd.insert(rd.end(), host.rope_delta().begin(), host.rope_delta().end());
    }
    rope_delta_ = rd;
    if (host.history()) {
      EgoHistory h = *host.history();
      EgoHistory r{h.H, {}, {}};
      for (int c = 0; c < copies; ++c) {
        r.xyz.insert(r.xyz.end(), h.xyz.begin(), h.xyz.end());
        r.rot.insert(r.rot.end(), h.rot.begin(), h.rot.end());
      }
      history_ = r;
    }
    if (host.v0()) {
      std::vector<float> v;
      for (int c = 0; c < copies; ++c) v.insert(v.end(), host.v0()->begin(), host.v0()->end());
      v0_ = v;
    }
  }
  ~DeviceCache() {
    for (void* p : bufs_) cudaFree(p);
  }
  Context context() const { return Context::from_views(kv_, rope_delta_, history_, v0_, "device context"); }
  // The cache rows a step reads: each prompt once (the cascade reads a shared prompt once for all its samples).
  size_t valid_cache_bytes() const {
    size_t n = 0;
    for (int64_t s : kv_.valid_len) n += size_t(s) * kv_.Hkv * kv_.d * 2 /* bf16 */ * 2 /* K, V */;
    return n * kv_.key.size();
  }

 private:
  std::vector<void*> bufs_;
  KVCache kv_;
  std::vector<int64_t> rope_delta_;
  std::optional<EgoHistory> history_;
  std::optional<std::vector<float>> v0_;
};

struct Stats {
  double pcc = 1, rel = 0;
};
Stats compare(const float* a, const float* r, size_t n) {
  double ma = 0, mr = 0;
  for (size_t i = 0; i < n; ++i) {
    ma += a[i];
    mr += r[i];
  }
  ma /= n;
  mr /= n;
  double saa = 0, srr = 0, sar = 0, mx = 0, rmax = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i] - ma, y = r[i] - mr;
    saa += x * x;
    srr += y * y;
    sar += x * y;
    const double diff = std::fabs(double(a[i]) - r[i]);
    mx = std::isnan(diff) || std::isnan(mx) ? NAN : std::max(mx, diff);
    rmax = std::max(rmax, std::fabs(double(r[i])));
  }
  return {saa == 0 && srr == 0 ? 1.0 : sar / std::sqrt(saa * srr), mx / std::max(rmax, 1e-6)};
}
Stats compare(const std::vector<float>& a, const std::vector<float>& r) {
  return compare(a.data(), r.data(), std::min(a.size(), r.size()));
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return std::isfinite(v) ? b : "null";
}

std::string json_str(const std::string& v) {
  std::string o = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

int g_errors = 0;  // formats or runs that threw: reported in the JSON, and the exit status

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy bandwidth (read + write bytes per second) of a 2 GiB buffer.
double copy_bandwidth() {
  const size_t n = size_t(1) << 31;
  void *a = nullptr, *b = nullptr;
  cuda_check(cudaMalloc(&a, n), "cudaMalloc");
  cuda_check(cudaMalloc(&b, n), "cudaMalloc");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / median(t);
}

// The cuda models, loaded once per weight format and shared by the accuracy check and the benchmark.
class Models {
 public:
  explicit Models(std::shared_ptr<const Checkpoint> ck) : ck_(std::move(ck)) {}
  std::shared_ptr<const Model> get(const std::string& fmt) {
    auto it = m_.find(fmt);
    if (it != m_.end()) return it->second;
    BackendOptions o;
    o.weights = fmt;
    options_from_environment(o, "cuda");  // ALPAMAYO_CUDA_GEMM, ALPAMAYO_CUDA_GRAPHS, ALPAMAYO_CUBLASLT
    const auto t0 = Clock::now();
    auto m = Model::load(ck_, "cuda", o);
    load_s_[fmt] = since(t0);
    std::printf("cuda %s model: loaded in %.1f s (%.2f GB on the GPU)\n", fmt.c_str(), load_s_[fmt],
                m->backend().weight_bytes() / 1e9);
    return m_[fmt] = m;
  }
  double load_seconds(const std::string& fmt) const { return load_s_.at(fmt); }

 private:
  std::shared_ptr<const Checkpoint> ck_;
  std::map<std::string, std::shared_ptr<const Model>> m_;
  std::map<std::string, double> load_s_;
};

std::string accuracy(const Args& a, const std::shared_ptr<const Checkpoint>& ck, const Context& host_ctx,
                     Models& models) {
  const ExpertConfig& cfg = ck->config();
  const int steps = a.ref_steps;
  std::printf("\n== accuracy: reference (fp32, %d steps) vs cuda, L=%d, S=%lld, B=%d\n", steps, cfg.L,
              static_cast<long long>(host_ctx.kv().valid_len[0]), host_ctx.batch());
  auto t0 = Clock::now();
  BackendOptions ro;
  ro.threads = a.threads;
  Session ref(Model::load(ck, "reference", ro));
  ref.bind(host_ctx, {.capture = {.step = 0, .layers = true}});
  const SampleResult rr = ref.sample({.steps = steps, .seed = 42, .all_steps = true});
  const Captures rc = ref.captures();
  std::printf("reference: %.1f s\n", since(t0));

  DeviceCache dev(host_ctx, 1);
  std::ostringstream js;
  js << "{\"steps\": " << steps << ", \"layers\": " << cfg.L << ", \"rows\": " << host_ctx.kv().valid_len[0]
     << ", \"formats\": {";
  std::printf(
      "| weights | emb PCC | layers min PCC (at) | layers max rel | hidden PCC | v_k min PCC | v_k max rel | "
      "x_N PCC | trajectory dev (m) of extent (m) |\n|---|---|---|---|---|---|---|---|---|\n");
  bool first_fmt = true;
  for (const std::string& fs : a.formats) {
    const char* fmt = fs.c_str();
    try {
      auto m = models.get(fs);
      Session s(m);
      s.bind(dev.context(), {.capture = {.step = 0, .layers = true}});
      const SampleResult r = s.sample({.steps = steps, .seed = 42, .all_steps = true});
      const Captures& c = s.captures();
      const Stats emb = compare(c.emb, rc.emb), hid = compare(c.hidden, rc.hidden);
      double lmin = 1, lrel = 0;
      int lat = 0;
      std::vector<Stats> per_layer;
      for (int l = 0; l < cfg.L; ++l) {
        const Stats st = compare(c.layers[l], rc.layers[l]);
        per_layer.push_back(st);
        if (st.pcc < lmin) {
          lmin = st.pcc;
          lat = l;
        }
        lrel = std::max(lrel, st.rel);
      }
      const size_t n = rr.action.size();
      double vmin = 1, vrel = 0;
      std::vector<Stats> per_v;
      for (int k = 0; k < steps; ++k) {
        const Stats st = compare(r.v_steps.data() + k * n, rr.v_steps.data() + k * n, n);
        per_v.push_back(st);
        vmin = std::min(vmin, st.pcc);
        vrel = std::max(vrel, st.rel);
      }
      const Stats act = compare(r.action, rr.action);
      double dev_m = 0, extent = 0;
      for (size_t i = 0; i + 2 < r.xyz.size(); i += 3) {
        const double dx = r.xyz[i] - rr.xyz[i], dy = r.xyz[i + 1] - rr.xyz[i + 1], dz = r.xyz[i + 2] - rr.xyz[i + 2];
        dev_m = std::max(dev_m, std::sqrt(dx * dx + dy * dy + dz * dz));
        extent = std::max(extent, std::hypot(double(rr.xyz[i]), double(rr.xyz[i + 1])));
      }
      std::printf("| %s | %.7f | %.7f (layer %d) | %.2e | %.7f | %.7f | %.2e | %.7f | %.4f of %.2f |\n", fmt, emb.pcc,
                  lmin, lat, lrel, hid.pcc, vmin, vrel, act.pcc, dev_m, extent);
      js << (first_fmt ? "" : ", ") << "\"" << fmt << "\": {\"emb_pcc\": " << num(emb.pcc)
         << ", \"emb_rel\": " << num(emb.rel) << ", \"layer_min_pcc\": " << num(lmin) << ", \"layer_min_at\": " << lat
         << ", \"layer_max_rel\": " << num(lrel) << ", \"hidden_pcc\": " << num(hid.pcc)
         << ", \"hidden_rel\": " << num(hid.rel) << ", \"v_min_pcc\": " << num(vmin) << ", \"v_max_rel\": " << num(vrel)
         << ", \"action_pcc\": " << num(act.pcc) << ", \"trajectory_dev_m\": " << num(dev_m)
         << ", \"trajectory_extent_m\": " << num(extent) << ", \"layer_pcc\": [";
      for (int l = 0; l < cfg.L; ++l) js << (l ? ", " : "") << num(per_layer[l].pcc);
      js << "], \"v_pcc\": [";
      for (int k = 0; k < steps; ++k) js << (k ? ", " : "") << num(per_v[k].pcc);
      js << "]}";
    } catch (const std::exception& e) {
      ++g_errors;
      std::printf("| %s | error: %s |\n", fmt, e.what());
      js << (first_fmt ? "" : ", ") << "\"" << fmt << "\": {\"error\": " << json_str(e.what()) << "}";
    }
    first_fmt = false;
  }
  js << "}}";
  return js.str();
}

std::string bench(const Args& a, const Context& host_ctx, Models& models) {
  const double bw = copy_bandwidth();
  std::printf("\n== bench: device copy bandwidth %.0f GB/s (read + write)\n", bw / 1e9);
  std::printf(
      "| weights | matmuls | samples | ms/step (median) | ms per 10-step sample (device) | ms per sample (wall) | "
      "GB/step | GB/s | of copy bw |\n|---|---|---|---|---|---|---|---|---|\n");
  std::ostringstream js;
  js << "{\"copy_gbps\": " << num(bw / 1e9) << ", \"runs\": [";
  bool first = true;
  for (const std::string& fs : a.formats) {
    const char* fmt = fs.c_str();
    for (int copies : a.batches) {
      try {
        auto m = models.get(fs);
        const std::string gemm = m->kernels().substr(m->kernels().find('=') + 1);  // "gemm=NAME"
        DeviceCache dev(host_ctx, copies);
        Session s(m);
        s.bind(dev.context());
        for (int w = 0; w < 3; ++w) s.sample({.steps = 10, .seed = uint64_t(w)});
        std::vector<double> step_s, dev_sample_s, wall_s;
        for (int i = 0; i < a.samples; ++i) {
          const auto t0 = Clock::now();
          const SampleResult r = s.sample({.steps = 10, .seed = uint64_t(100 + i)});
          wall_s.push_back(since(t0));
          double sum = 0;
          for (double t : r.step_seconds) {
            step_s.push_back(t);
            sum += t;
          }
          dev_sample_s.push_back(sum);
        }
        const double step = median(step_s), sample = median(dev_sample_s), wall = median(wall_s);
        const double bytes = double(m->backend().weight_bytes()) + double(dev.valid_cache_bytes());
        const double gbps = bytes / step / 1e9;
        std::printf("| %s | %s | %d | %.3f | %.2f | %.2f | %.2f | %.0f | %.0f%% |\n", fmt, gemm.c_str(),
                    copies, step * 1e3, sample * 1e3, wall * 1e3, bytes / 1e9, gbps, 100.0 * gbps * 1e9 / bw);
        js << (first ? "" : ", ") << "{\"weights\": \"" << fmt << "\", \"gemm\": \"" << gemm
           << "\", \"samples\": " << copies << ", \"ms_per_step\": " << num(step * 1e3)
           << ", \"ms_per_sample_device\": " << num(sample * 1e3) << ", \"ms_per_sample_wall\": " << num(wall * 1e3)
           << ", \"bytes_per_step\": " << num(bytes) << ", \"gbps\": " << num(gbps)
           << ", \"session_buffer_bytes\": " << s.buffer_bytes()
           << ", \"weight_bytes\": " << m->backend().weight_bytes()
           << ", \"load_seconds\": " << num(models.load_seconds(fs)) << "}";
      } catch (const std::exception& e) {
        ++g_errors;
        std::printf("| %s | %d | error: %s |\n", fmt, copies, e.what());
        js << (first ? "" : ", ") << "{\"weights\": \"" << fmt << "\", \"samples\": " << copies
           << ", \"error\": " << json_str(e.what()) << "}";
      }
      first = false;
    }
  }
  js << "]}";
  return js.str();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (const std::string why = find_backend("cuda").unavailable(); !why.empty()) {
      std::fprintf(stderr, "cuda_check: the cuda backend cannot run here: %s\n", why.c_str());
      return 2;
    }
    cudaDeviceProp prop{};
    int dev = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    std::printf("device %d: %s, sm_%d%d, %d SMs, %.0f GiB\n", dev, prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30));

    namespace fs = std::filesystem;
    fs::create_directories(a.work);
    const std::string ck_dir = (fs::path(a.work) / ("ckpt-L" + std::to_string(a.layers))).string();
    const std::string ctx_path =
        (fs::path(a.work) / ("ctx-L" + std::to_string(a.layers) + "-S" + std::to_string(a.rows) + ".safetensors"))
            .string();
    auto t0 = Clock::now();
    if (!fs::exists(fs::path(ck_dir) / "config.json")) {
      SyntheticCheckpointSpec spec;  // the seed's model
      spec.L = a.layers;
      write_synthetic_checkpoint(ck_dir, spec);
    }
    auto ck = Checkpoint::open(ck_dir);
    if (!fs::exists(ctx_path)) {
      SyntheticContextSpec cs;
      cs.B = 1;
      cs.P = a.rows;
      cs.valid_len = {a.rows};
      cs.rope_delta = {-1500};
      write_synthetic_context(ctx_path, ck->config(), cs);
    }
    const Context host_ctx = Context::open(ctx_path);
    std::printf("synthetic checkpoint and context: %.1f s (%s, %s)\n", since(t0), ck_dir.c_str(), ctx_path.c_str());

    std::string acc = "null", perf = "null";
    Models models(ck);
    if (a.accuracy) acc = accuracy(a, ck, host_ctx, models);
    if (a.bench) perf = bench(a, host_ctx, models);
    if (!a.json.empty()) {
      std::ofstream f(a.json);
      f << "{\"device\": \"" << prop.name << "\", \"sm\": \"" << prop.major << prop.minor << "\", \"accuracy\": " << acc
        << ", \"bench\": " << perf << "}\n";
      check(f.good(), a.json + ": cannot write");
    }
    if (g_errors) {
      std::fprintf(stderr, "cuda_check: %d run(s) failed (see the tables)\n", g_errors);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_check: %s\n", e.what());
    return 1;
  }
}
