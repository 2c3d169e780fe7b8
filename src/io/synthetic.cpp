#include "alpamayo/synthetic.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "alpamayo/safetensors.h"
#include "model/fourier.h"

namespace fs = std::filesystem;

namespace alpamayo {
namespace {

// A fast seeded uniform generator (SplitMix64); each tensor gets its own stream.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f * 2.f - 1.f; }  // [-1, 1)
};

uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// How a tensor's values are drawn: center + scale * U(-1, 1), or fixed values.
struct Init {
  float center = 0.f, scale = 0.f;
  std::vector<float> fixed{};
  std::vector<float> col_scale{};  // optional per-column factor (last dimension)
  bool trained = false;  // a [N, K] matrix with a trained model's statistics (trained_weights() below)
};

void store(DType dt, const float* src, int64_t n, void* dst) {
  TensorView v{DType::F32, {n}, src, ""};
  if (dt == DType::F32) std::memcpy(dst, src, n * 4);
  else if (dt == DType::BF16) convert_to_bf16(v, static_cast<uint16_t*>(dst));
  else {
    auto* p = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(src[i]);
  }
}

struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  DType dtype;
};

// A [N, K] weight with the statistics trained LLM weights are known for, as far as a generator can give them:
// a heavy-tailed body (Laplace, excess kurtosis 3), per-output-channel and per-input-channel scales spread
// log-normally (sigma 0.35), 2% outlier output channels (x3) and 1% outlier input channels (x4), and isolated
// outlier weights (1 in 20,000, x12). Rescaled to the standard deviation `sd` of the plain initialisation.
void trained_weights(Rng& rng, int64_t N, int64_t K, float sd, float* out) {
  auto normal = [&] {  // Box-Muller
    const double u1 = std::max(0.5 * (rng.uniform() + 1.0), 1e-12), u2 = 0.5 * (rng.uniform() + 1.0);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  auto scales = [&](int64_t n, double outlier_share, double outlier_gain) {
    std::vector<double> v(n);
    double ss = 0;
    for (auto& x : v) {
      x = std::exp(0.35 * normal()) * (0.5 * (rng.uniform() + 1.0) < outlier_share ? outlier_gain : 1.0);
      ss += x * x;
    }
    for (auto& x : v) x /= std::sqrt(ss / n);
    return v;
  };
  const std::vector<double> row = scales(N, 0.02, 3.0), col = scales(K, 0.01, 4.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float u = rng.uniform();
      // Laplace with unit variance: -sign(u) ln(1 - |u|) / sqrt(2).
      double z = -std::copysign(std::log(std::max(1.0 - std::fabs(double(u)), 1e-9)), double(u)) * 0.7071067811865476;
      if ((rng.next() % 20000) == 0) z *= 12.0;
      out[n * K + k] = static_cast<float>(sd * row[n] * col[k] * z);
    }
}

void fill_entry(const Entry& e, uint64_t seed, void* dst) {
  int64_t n = 1;
  for (auto s : e.shape) n *= s;
  std::vector<float> buf(n);
  if (!e.init.fixed.empty()) {
    buf = e.init.fixed;
  } else if (e.init.trained) {
    Rng rng(hash_name(e.name, seed));
    trained_weights(rng, e.shape[0], e.shape[1], e.init.scale / std::sqrt(3.f), buf.data());
  } else {
    Rng rng(hash_name(e.name, seed));
    for (auto& v : buf) v = e.init.center + e.init.scale * rng.uniform();
    const size_t cols = e.init.col_scale.size();
    for (size_t i = 0; cols && i < buf.size(); ++i) buf[i] *= e.init.col_scale[i % cols];
  }
  store(e.dtype, buf.data(), n, dst);
}

// Uniform with the standard deviation of a variance-preserving init: std = gain / sqrt(fan_in).
Init linear_init(int64_t fan_in, float gain = 1.f) { return {0.f, gain * std::sqrt(3.f / fan_in), {}}; }
Init norm_init() { return {1.f, 0.1f, {}}; }

// A Qwen3-VL text config as transformers writes it (the fields the releases' configs carry).
nlohmann::json text_config(int L, int D, int I, int Hq, int Hkv, int d, double eps, double theta) {
  const int hw = (d / 2) * 20 / 64;  // Qwen3-VL's [24, 20, 20] split of d/2 = 64, scaled
  return {{"model_type", "qwen3_vl_text"}, {"hidden_size", D}, {"intermediate_size", I}, {"num_hidden_layers", L},
          {"num_attention_heads", Hq}, {"num_key_value_heads", Hkv}, {"head_dim", d}, {"hidden_act", "silu"},
          {"attention_bias", false}, {"rms_norm_eps", eps}, {"rope_theta", theta},
          {"rope_scaling", {{"rope_type", "default"}, {"mrope_interleaved", true}, {"mrope_section", {d / 2 - 2 * hw, hw, hw}}}},
          {"max_position_embeddings", 262144}, {"vocab_size", 155776}};
}

// config.json as the release ships it (shapes from NVIDIA's configs; tokenizer/vision fields omitted).
nlohmann::json synthetic_config(const SyntheticCheckpointSpec& s, Release release) {
  using R = ReleasedActionStats;
  const std::string pkg = release == Release::R1 ? "alpamayo_r1" : release == Release::A1_5 ? "alpamayo1_5" : "alpamayo2_super";
  nlohmann::json action_space = {
      {"_target_", pkg + ".action_space.UnicycleAccelCurvatureActionSpace"},
      {"n_waypoints", s.T}, {"dt", 0.1}, {"accel_mean", R::accel_mean}, {"accel_std", R::accel_std},
      {"curvature_mean", R::curvature_mean}, {"curvature_std", R::curvature_std},
      {"accel_bounds", {-R::accel_bound, R::accel_bound}}, {"curvature_bounds", {-R::curvature_bound, R::curvature_bound}},
      {"v_lambda", 1e-6}, {"v_ridge", 1e-4}};
  nlohmann::json action_in = {{"_target_", pkg + ".models.action_in_proj.PerWaypointActionInProjV2"},
                              {"hidden_size", s.ain_hidden}, {"num_enc_layers", s.ain_layers},
                              {"num_fourier_feats", s.n_fourier}, {"max_freq", s.max_freq}};
  nlohmann::json action_out = {{"_target_", "torch.nn.Linear"}};
  nlohmann::json diffusion = {{"_target_", pkg + ".diffusion.flow_matching.FlowMatching"},
                              {"num_inference_steps", s.steps}, {"int_method", "euler"}};
  if (release == Release::A2Super) {
    diffusion.update({{"train_timestep_sampler", "beta"}, {"train_ignore_guidance_rate", 0.1},
                      {"inference_guidance_weight", 3.0}, {"use_classifier_free_guidance", false}});
    // The VLM (Qwen3-VL-32B at full size: 64 heads, hidden 5120, MLP 25600) shares L, Hkv and d with the expert.
    const int vq = 8 * s.Hkv, vd = vq * s.d * 5 / 8;
    return {
        {"architectures", {"Alpamayo2Super"}},
        {"model_type", "alpamayo2_super"},
        {"dtype", "bfloat16"},
        {"vlm_class", "Qwen3VLForConditionalGeneration"},
        {"history_vocab_size", 1000}, {"future_vocab_size", 3000}, {"traj_vocab_size", 4000},
        {"tokens_per_history_traj", 48}, {"tokens_per_future_traj", 128},
        {"traj_ids", {{"history_id0", 151669}, {"future_id0", 152669}, {"history_start", 155674}, {"history_end", 155676},
                      {"future_start", 155681}, {"future_end", 155683}, {"history_pad", 155684}, {"future_pad", 155685}}},
        {"cotrain_expert_vlm", false},
        {"vlm_config", {{"model_type", "qwen3_vl"}, {"architectures", {"Qwen3VLForConditionalGeneration"}},
                        {"text_config", text_config(s.L, vd, 5 * vd, vq, s.Hkv, s.d, 1e-6, 5e6)}}},
        {"expert_config",
         {{"llm_config", text_config(s.L, s.D, s.I, s.Hq, s.Hkv, s.d, s.rms_eps, s.rope_theta)},
          {"expert_update_cfg", {{"hidden_size", s.D}, {"intermediate_size", s.I}, {"num_attention_heads", s.Hq}, {"head_dim", s.d}}},
          {"action_space_cfg", action_space},
          {"action_in_proj_cfg", action_in},
          {"action_out_proj_cfg", action_out},
          {"diffusion_cfg", diffusion},
          {"expert_non_causal_attention", true}}},
    };
  }
  if (release == Release::A1_5) diffusion.update({{"inference_guidance_weight", 1.0}, {"use_classifier_free_guidance", false}});
  return {
      {"architectures", {release == Release::R1 ? "AlpamayoR1" : "Alpamayo1_5"}},
      {"model_type", release_model_type(release)},
      {"vlm_name_or_path", release == Release::R1 ? "Qwen/Qwen3-VL-8B-Instruct" : "nvidia/Cosmos-Reason2-8B"},
      {"expert_non_causal_attention", true},
      {"keep_same_dtype", true},
      {"expert_cfg", {{"hidden_size", s.D}, {"intermediate_size", s.I}, {"num_attention_heads", s.Hq},
                      {"num_key_value_heads", s.Hkv}, {"head_dim", s.d}}},
      {"action_in_proj_cfg", action_in},
      {"action_out_proj_cfg", action_out},
      {"action_space_cfg", action_space},
      {"diffusion_cfg", diffusion},
  };
}

}  // namespace

Release synthetic_release(const SyntheticCheckpointSpec& s) {
  const Release r = s.release ? *s.release : (s.layout == Layout::A2 ? Release::A2Super : Release::R1);
  check(release_layout(r) == s.layout, std::string("make-checkpoint: ") + release_name(r) + " checkpoints use the " +
                                           layout_name(release_layout(r)) + " layout");
  return r;
}

// The expert's tensors in the release's layout and names: layers, final norm, action_in_proj, action_out_proj, and
// the buffers Alpamayo-R1 checkpoints carry.
std::vector<Entry> expert_entries(const SyntheticCheckpointSpec& s, Release release) {
  const bool a2 = s.layout == Layout::A2;
  const std::string ep = a2 ? "expert.expert." : "expert.", hp = a2 ? "expert." : "";
  const int64_t D = s.D, d = s.d, I = s.I, h = s.ain_hidden, A = 2, F = s.n_fourier;
  std::vector<Entry> ex;
  auto add = [&](std::string n, std::vector<int64_t> shape, Init init, DType dt) { ex.push_back({std::move(n), std::move(shape), std::move(init), dt}); };
  const DType w = s.dtype;
  // Residual branches scaled by 1/sqrt(2L) so the stream stays O(1) through deep stacks.
  const float branch = 1.f / std::sqrt(2.f * s.L);
  // The expert's weight matrices, plain (uniform) or with a trained model's statistics.
  auto lin = [&](int64_t fan_in, float gain = 1.f) {
    Init i = linear_init(fan_in, gain);
    i.trained = s.trained_weights;
    return i;
  };
  for (int l = 0; l < s.L; ++l) {
    const std::string p = ep + "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, norm_init(), w);
    add(p + "post_attention_layernorm.weight", {D}, norm_init(), w);
    add(p + "self_attn.q_proj.weight", {s.Hq * d, D}, lin(D), w);
    add(p + "self_attn.k_proj.weight", {s.Hkv * d, D}, lin(D), w);
    add(p + "self_attn.v_proj.weight", {s.Hkv * d, D}, lin(D), w);
    add(p + "self_attn.o_proj.weight", {D, s.Hq * d}, lin(s.Hq * d, branch), w);
    add(p + "self_attn.q_norm.weight", {d}, {1.5f, 0.5f, {}}, w);  // sharper than uniform attention
    add(p + "self_attn.k_norm.weight", {d}, {1.5f, 0.5f, {}}, w);
    add(p + "mlp.gate_proj.weight", {I, D}, lin(D), w);
    add(p + "mlp.up_proj.weight", {I, D}, lin(D), w);
    add(p + "mlp.down_proj.weight", {D, I}, lin(I, branch), w);
  }
  add(ep + "norm.weight", {D}, norm_init(), w);
  const std::string ip = hp + "action_in_proj.", tr = ip + "encoder.trunk.";
  // A trained velocity field is smooth in x; random weights on sin(2 pi 100 x) features make the sampler
  // chaotic (a 1e-4 change of the noise moves the action by O(1)). Damping the action features' columns
  // by 1/f keeps every frequency in play with a moderate sampler gain; the time features stay undamped.
  Init in0 = linear_init((A + 1) * F);
  const std::vector<float> fr_exact = fourier_freqs(s.n_fourier, s.max_freq, false);
  in0.col_scale.assign((A + 1) * F, 1.f);
  for (int a = 0; a < A; ++a)
    for (int j = 0; j < F / 2; ++j) in0.col_scale[a * F + j] = in0.col_scale[a * F + F / 2 + j] = 1.f / fr_exact[j];
  add(tr + "0.weight", {h, (A + 1) * F}, in0, w);
  add(tr + "0.bias", {h}, {0.f, 0.1f, {}}, w);
  for (int i = 0; i < s.ain_layers; ++i) {
    const int k = 2 + 3 * i;
    const int64_t od = i == s.ain_layers - 1 ? D : h;
    add(tr + std::to_string(k) + ".weight", {h}, norm_init(), w);
    add(tr + std::to_string(k + 1) + ".weight", {od, h}, linear_init(h), w);
    add(tr + std::to_string(k + 1) + ".bias", {od}, {0.f, 0.1f, {}}, w);
  }
  add(ip + "norm.weight", {D}, norm_init(), w);
  add(ip + "norm.bias", {D}, {0.f, 0.1f, {}}, w);
  add(hp + "action_out_proj.weight", {A, D}, linear_init(D, 0.5f), w);
  add(hp + "action_out_proj.bias", {A}, {0.f, 0.05f, {}}, w);
  if (release == Release::R1) {  // Alpamayo-R1 checkpoints carry the derived buffers
    const std::vector<float> fr = fourier_freqs(s.n_fourier, s.max_freq, true);
    for (int i = 0; i < A; ++i) add(ip + "sinus." + std::to_string(i) + ".freqs", {1, F / 2}, {0, 0, fr}, w);
    add(ip + "timestep_fourier_encoder.freqs", {1, F / 2}, {0, 0, fr}, w);
    using R = ReleasedActionStats;
    add("action_space.accel_mean", {}, {0, 0, {float(R::accel_mean)}}, DType::F32);
    add("action_space.accel_std", {}, {0, 0, {float(R::accel_std)}}, DType::F32);
    add("action_space.curvature_mean", {}, {0, 0, {float(R::curvature_mean)}}, DType::F32);
    add("action_space.curvature_std", {}, {0, 0, {float(R::curvature_std)}}, DType::F32);
  }
  return ex;
}

// Shard assignment: expert entries split evenly over s.shards files, vlm tensors in a shard of their own when
// sharded (so a correct reader never opens it), else in the single file.
std::vector<std::vector<Entry>> shard_entries(const std::vector<Entry>& ex, DType w, int shards) {
  std::vector<Entry> vlm = {{"vlm.model.language_model.embed_tokens.weight", {32, 16}, linear_init(16), w},
                            {"vlm.model.language_model.norm.weight", {16}, norm_init(), w},
                            {"vlm.lm_head.weight", {32, 16}, linear_init(16), w}};
  std::vector<std::vector<Entry>> files;
  if (shards == 1) {
    files.push_back(ex);
    files[0].insert(files[0].end(), vlm.begin(), vlm.end());
  } else {
    files.resize(shards + 1);
    for (size_t i = 0; i < ex.size(); ++i) files[i * shards / ex.size()].push_back(ex[i]);
    files[shards] = vlm;
  }
  return files;
}

void write_synthetic_checkpoint(const std::string& dir, const SyntheticCheckpointSpec& s) {
  check(s.L > 0 && s.D > 0 && s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0 && s.d > 0 && s.d % 2 == 0 && s.I > 0,
        "make-checkpoint: invalid sizes (need L, D, I > 0, even d, Hq a multiple of Hkv)");
  check(s.ain_layers >= 1 && s.n_fourier >= 4 && s.n_fourier % 2 == 0 && s.T >= 1 && s.shards >= 1,
        "make-checkpoint: invalid action_in_proj sizes, waypoints or shard count");
  const Release release = synthetic_release(s);
  const std::vector<std::vector<Entry>> files = shard_entries(expert_entries(s, release), s.dtype, s.shards);
  nlohmann::json weight_map = nlohmann::json::object();
  const int nf = static_cast<int>(files.size());
  std::vector<std::string> names(nf);
  std::vector<std::vector<NamedTensor>> specs(nf);
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  const Entry* largest = nullptr;
  double largest_n = 0;
  for (int f = 0; f < nf; ++f) {
    char name[64];
    if (nf == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, nf);
    names[f] = name;
    for (const Entry& e : files[f]) {
      specs[f].push_back({e.name, TensorView{e.dtype, e.shape, nullptr, e.name}});
      weight_map[e.name] = name;
      double n = 1;
      for (auto v : e.shape) n *= double(v);
      if (n > largest_n) largest = &e, largest_n = n;
    }
  }
  const std::string index_text =
      nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
  const std::string config_text = synthetic_config(s, release).dump(2);

  // Estimates first, before anything is created: the memory of generating the largest tensor (its bytes in
  // the file's dtype and its f32 values), and the disk of every file.
  std::string dt = dtype_name(s.dtype);
  for (char& ch : dt) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::string sizes = "make-checkpoint (--layers " + std::to_string(s.L) + " --hidden " + std::to_string(s.D) +
                            " --mlp " + std::to_string(s.I) + " --heads " + std::to_string(s.Hq) + " --kv-heads " +
                            std::to_string(s.Hkv) + " --head-dim " + std::to_string(s.d) + " --dtype " +
                            dt + " --shards " + std::to_string(s.shards) + ")";
  if (largest) {
    std::string shape;
    for (auto v : largest->shape) shape += (shape.empty() ? "" : ", ") + std::to_string(v);
    MemoryEstimate m;
    m.add("the tensor in " + dt, largest_n * double(dtype_size(largest->dtype)));
    m.add("its values in f32 while generated", 4.0 * largest_n);
    if (largest->init.trained) m.add("channel scales", 8.0 * double(largest->shape[0] + largest->shape[1]));
    check_memory(m, sizes + ": generating the largest tensor, " + largest->name + " [" + shape + "],");
  }
  double disk = double(config_text.size()) + (nf > 1 ? double(index_text.size()) : 0.0);
  std::string disk_parts;
  for (int f = 0; f < nf; ++f) {
    const double b = double(safetensors_file_size(specs[f], metadata));
    disk += b;
    if (f < 3) disk_parts += (f ? ", " : "") + names[f] + " " + format_bytes(b);
    else if (f == 3) disk_parts += ", ...";
  }
  disk_parts += std::string(disk_parts.empty() ? "" : ", ") + "config.json" + (nf > 1 ? " and the index" : "");

  OutputSet outs;       // every file of the checkpoint appears together, or none
  outs.create_dir(dir, "--out");  // removed again unless the set is committed
  std::vector<size_t> idx(nf);
  for (int f = 0; f < nf; ++f) idx[f] = outs.add((fs::path(dir) / names[f]).string(), "--out");
  const size_t o_index = nf > 1 ? outs.add((fs::path(dir) / "model.safetensors.index.json").string(), "--out") : 0;
  const size_t o_config = outs.add((fs::path(dir) / "config.json").string(), "--out");
  outs.check_space(o_config, disk, sizes + ": writing " + std::to_string(nf + (nf > 1 ? 2 : 1)) + " files", disk_parts);
  for (int f = 0; f < nf; ++f) {
    StageScope stage(sizes + ": generating " + names[f]);
    serialize_safetensors_stream(outs.sink(idx[f]), specs[f],
                                 [&](size_t i, void* dst) { fill_entry(files[f][i], s.seed, dst); }, metadata);
  }
  if (nf > 1) outs.write(o_index, index_text);
  outs.write(o_config, config_text);
  outs.commit();
}

void write_synthetic_context(const std::string& path, const ExpertConfig& c, const SyntheticContextSpec& s) {
  OutputSet outs;
  const size_t o = outs.add(path);
  write_synthetic_context(outs.sink(o), c, s, [&](double bytes, const std::string& stage) {
    outs.check_space(o, bytes, stage, "the context file");
  });
  outs.commit();
}

// Each prompt's and sample's lengths, paddings, rope deltas and prompt, from make-context's options (defaults where
// absent), checked against G, B, P and Q.
struct ContextLayout {
  std::vector<int64_t> valid, pad, delta, sfx, prompt;
};
ContextLayout context_layout(const SyntheticContextSpec& s, int64_t B, int64_t G, int64_t P, int64_t Q) {
  auto per = [&](const std::vector<int64_t>& v, int64_t n, int64_t dflt, const char* opt) {
    check(v.empty() || static_cast<int64_t>(v.size()) == n,
          std::string("make-context: ") + opt + " needs " + std::to_string(n) + " values, found " + std::to_string(v.size()));
    return v.empty() ? std::vector<int64_t>(n, dflt) : v;
  };
  ContextLayout lay{per(s.valid_len, G, P, "--valid-len"), per(s.prefix_pad, G, 0, "--prefix-pad"),
                    per(s.rope_delta, B, 0, "--rope-delta"), per(s.suffix_len, B, Q, "--suffix-len"), s.prompt_index};
  const std::vector<int64_t>& valid = lay.valid;
  const std::vector<int64_t>& pad = lay.pad;
  const std::vector<int64_t>& sfx = lay.sfx;
  std::vector<int64_t>& prompt = lay.prompt;
  if (prompt.empty()) {
    check(G == B || G == 1, "make-context: " + std::to_string(G) + " prompts for " + std::to_string(B) +
                                " samples: give --prompt-index");
    for (int64_t b = 0; b < B; ++b) prompt.push_back(G == 1 ? 0 : b);
  }
  prompt = per(prompt, B, 0, "--prompt-index");
  for (int64_t g = 0; g < G; ++g) {
    check(valid[g] >= 0 && valid[g] <= P, "make-context: valid length " + std::to_string(valid[g]) + " outside [0, P]");
    check(pad[g] >= 0 && pad[g] <= valid[g], "make-context: prefix pad " + std::to_string(pad[g]) + " outside [0, valid length]");
  }
  for (int64_t b = 0; b < B; ++b) {
    check(prompt[b] >= 0 && prompt[b] < G, "make-context: prompt index " + std::to_string(prompt[b]) + " outside [0, G)");
    check(sfx[b] >= 0 && sfx[b] <= Q, "make-context: suffix length " + std::to_string(sfx[b]) + " outside [0, Q]");
  }
  return lay;
}

// Ego history of B samples over H poses: constant speed on a gentle arc ending at the origin with heading 0.
void ego_history_arcs(Rng& rng, int64_t B, int H, double dt, std::vector<float>* xyz, std::vector<float>* rot) {
  xyz->reserve(size_t(B) * H * 3);
  rot->reserve(size_t(B) * H * 9);
  for (int64_t b = 0; b < B; ++b) {
    const double speed = 8.0 + 4.0 * rng.uniform(), kappa = 0.01 * rng.uniform();
    for (int i = 0; i < H; ++i) {
      const double sarc = -speed * dt * (H - 1 - i);  // arc length before t0 (negative)
      const double th = kappa * sarc;
      const double x = std::abs(kappa) > 1e-9 ? std::sin(th) / kappa : sarc;
      const double y = std::abs(kappa) > 1e-9 ? (1 - std::cos(th)) / kappa : 0.0;
      xyz->insert(xyz->end(), {float(x), float(y), 0.f});
      rot->insert(rot->end(), {float(std::cos(th)), float(-std::sin(th)), 0.f, float(std::sin(th)), float(std::cos(th)),
                               0.f, 0.f, 0.f, 1.f});
    }
  }
}

void write_synthetic_context(const ByteSink& out, const ExpertConfig& c, const SyntheticContextSpec& s,
                             const std::function<void(double, const std::string&)>& check_disk) {
  const int64_t B = s.B, P = s.P, H = c.Hkv, d = c.d, G = s.G > 0 ? s.G : s.B, Q = s.Q;
  check(B >= 1 && P >= 1 && G >= 1 && Q >= 0, "make-context: batch, prompts and rows must be >= 1");
  const ContextLayout lay = context_layout(s, B, G, P, Q);
  const std::vector<int64_t>& valid = lay.valid;
  const std::vector<int64_t>& pad = lay.pad;
  const std::vector<int64_t>& delta = lay.delta;
  const std::vector<int64_t>& sfx = lay.sfx;
  const std::vector<int64_t>& prompt = lay.prompt;
  std::vector<NamedTensor> specs;
  for (int l = 0; l < c.L; ++l)
    for (const char* kind : {"key.", "value."})
      specs.push_back({kind + std::to_string(l), TensorView{s.dtype, {G, H, P, d}, nullptr, ""}});
  if (Q > 0)
    for (int l = 0; l < c.L; ++l)
      for (const char* kind : {"suffix_key.", "suffix_value."})
        specs.push_back({kind + std::to_string(l), TensorView{s.dtype, {B, H, Q, d}, nullptr, ""}});
  const size_t n_cache = specs.size();
  // Ego history: constant speed on a gentle arc ending at the origin with heading 0 (generated below, after
  // the estimates).
  const int Hh = s.history;
  std::vector<float> xyz, rot, v0;
  const size_t first_history = specs.size();
  if (Hh > 0) {
    specs.push_back({"ego_history_xyz", TensorView{DType::F32, {B, Hh, 3}, nullptr, ""}});
    specs.push_back({"ego_history_rot", TensorView{DType::F32, {B, Hh, 3, 3}, nullptr, ""}});
  } else {
    specs.push_back({"v0", TensorView{DType::F32, {B}, nullptr, ""}});
  }
  specs.push_back({"valid_len", TensorView{DType::I64, {G}, valid.data(), ""}});
  specs.push_back({"rope_delta", TensorView{DType::I64, {B}, delta.data(), ""}});
  bool identity = G == B;
  for (int64_t b = 0; b < B; ++b) identity = identity && prompt[b] == b;
  if (!identity) specs.push_back({"prompt_index", TensorView{DType::I64, {B}, prompt.data(), ""}});
  if (!s.prefix_pad.empty()) specs.push_back({"prefix_pad", TensorView{DType::I64, {G}, pad.data(), ""}});
  if (Q > 0) specs.push_back({"suffix_len", TensorView{DType::I64, {B}, sfx.data(), ""}});
  // Estimates first: the memory of the ego history and of generating one cache tensor (the largest), then
  // the file's size.
  std::string dt = dtype_name(s.dtype);
  for (char& ch : dt) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::string sizes = "make-context (--batch " + std::to_string(B) + " --prompts " + std::to_string(G) +
                            " --rows " + std::to_string(P) + " --suffix-rows " + std::to_string(Q) + " --history " +
                            std::to_string(Hh) + " --dtype " + dt + "; the checkpoint's " + std::to_string(c.L) +
                            " layers, " + std::to_string(H) + " KV heads, head dim " + std::to_string(d) + ")";
  {
    const double prompt_n = double(G) * H * P * d, suffix_n = double(B) * H * Q * d;
    const bool prompt_largest = prompt_n >= suffix_n;
    const double n = std::max(prompt_n, suffix_n);
    MemoryEstimate m;
    m.add("the tensor in " + dt, n * dtype_size(s.dtype));
    m.add("its values in f32 while generated", 4.0 * n);
    if (Hh > 0) m.add("the ego history", 48.0 * double(B) * Hh);
    check_memory(m, sizes + ": generating a " + (prompt_largest ? "prompt" : "suffix") + " cache tensor [" +
                        std::to_string(prompt_largest ? G : B) + ", " + std::to_string(H) + ", " +
                        std::to_string(prompt_largest ? P : Q) + ", " + std::to_string(d) + "],");
  }
  if (check_disk) check_disk(double(safetensors_file_size(specs)), sizes + ": writing the context");
  StageScope stage(sizes + ": generating the context");
  Rng rng(s.seed ^ 0x5eedull);
  if (Hh > 0) {
    ego_history_arcs(rng, B, Hh, c.dt, &xyz, &rot);
    specs[first_history].tensor.data = xyz.data();
    specs[first_history + 1].tensor.data = rot.data();
  } else {
    for (int64_t b = 0; b < B; ++b) v0.push_back(static_cast<float>(8.0 + 4.0 * rng.uniform()));
    specs[first_history].tensor.data = v0.data();
  }
  serialize_safetensors_stream(out, specs, [&](size_t i, void* dst) {
    if (i >= n_cache) { std::memcpy(dst, specs[i].tensor.data, specs[i].tensor.nbytes()); return; }
    Rng r(hash_name(specs[i].name, s.seed));
    const bool suffix = specs[i].name.rfind("suffix_", 0) == 0;
    const int64_t N = suffix ? B : G, R = suffix ? Q : P;
    std::vector<float> buf(N * H * R * d);
    for (int64_t b = 0; b < N; ++b)
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t p = 0; p < R; ++p) {
          float* row = buf.data() + ((b * H + hh) * R + p) * d;
          // Rows some sample reads ~ unit RMS like normed keys / values; the others are large garbage.
          const bool valid_row = suffix ? p < sfx[b] : p >= pad[b] && p < valid[b];
          for (int64_t j = 0; j < d; ++j) row[j] = valid_row ? 1.7f * r.uniform() : 7.0f + 100.f * r.uniform();
        }
    store(s.dtype, buf.data(), static_cast<int64_t>(buf.size()), dst);
  });
}

}  // namespace alpamayo
