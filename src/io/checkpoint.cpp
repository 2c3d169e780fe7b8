#include "alpamayo/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "io/config_json.h"
#include "io/inputs.h"

namespace fs = std::filesystem;

namespace alpamayo {

const char* layout_name(Layout l) {
  return l == Layout::R1 ? "R1/1.5 (expert.layers.*)" : "Alpamayo 2 (expert.expert.layers.*)";
}

class CheckpointLoader {
 public:
  CheckpointLoader(Checkpoint* ck, const std::string& dir) : ck_(ck), dir_(dir) {}

  void run(const CheckpointOptions& opts) {
    check(fs::is_directory(dir_), ErrorCode::IO, dir_ + ": checkpoint directory not found");
    const std::string cfg_path = (fs::path(dir_) / "config.json").string();
    check(fs::exists(cfg_path), ErrorCode::IO, cfg_path + ": missing (a checkpoint directory needs config.json)");
    const nlohmann::json root = read_json_file(cfg_path);
    check(root.is_object(), ErrorCode::Format, cfg_path + ": expected a JSON object");
    nlohmann::json vlm;
    if (!opts.vlm_config.empty()) vlm = read_json_file(opts.vlm_config);
    const ReleaseConfig rc(root, cfg_path, opts.vlm_config.empty() ? nullptr : &vlm, opts.vlm_config, opts.release);
    ck_->release_evidence_ = rc.evidence();
    info_ = &release_info(rc.release());

    index_keys();
    detect_layout();
    check(ck_->layout_ == info_->layout, ErrorCode::Format,
          dir_ + ": config.json says " + info_->name + " (" + rc.evidence() + "), whose tensors are " +
              layout_name(info_->layout) + ", but the checkpoint holds " + layout_name(ck_->layout_) + " tensors");
    ExpertConfig& c = ck_->cfg_;
    load_layers(&c);
    rc.apply(&c, &ck_->values_);
    rc.check_sizes(c, &ck_->values_);
    load_heads(&c);
    for (const auto& [file, sf] : opened_) ck_->files_.push_back(file);
    for (const auto& n : rc.notes()) ck_->notes_.push_back(n);
    ck_->notes_.push_back(std::string("layout ") + layout_name(ck_->layout_));
  }

 private:
  void index_keys() {
    const fs::path index = fs::path(dir_) / "model.safetensors.index.json";
    const fs::path single = fs::path(dir_) / "model.safetensors";
    if (fs::exists(index)) {
      const nlohmann::json j = read_json_file(index.string());
      check(j.contains("weight_map") && j["weight_map"].is_object(), ErrorCode::Format,
            index.string() + ": missing 'weight_map' object");
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        check(it.value().is_string(), ErrorCode::Format,
              index.string() + ": weight_map['" + it.key() + "'] must be a file name");
        add_key(it.key(), confined_shard_path(dir_, it.value().get<std::string>(), index.string(), it.key()));
      }
    } else {
      check(fs::exists(single), ErrorCode::IO, dir_ + ": no model.safetensors or model.safetensors.index.json");
      const SafetensorsFile& f = open(single.string());
      for (const auto& [k, ti] : f.tensors()) add_key(k, single.string());
    }
  }

  void add_key(const std::string& key, const std::string& file) {
    if (key.rfind("vlm.", 0) == 0) { ++ck_->n_vlm_skipped_; return; }  // never mapped or read
    key_file_[key] = file;
  }

  const SafetensorsFile& open(const std::string& file) {
    auto it = opened_.find(file);
    if (it != opened_.end()) return *it->second;
    auto sf = std::make_unique<SafetensorsFile>(file);
    const SafetensorsFile& ref = *sf;
    opened_[file] = sf.get();
    ck_->shards_.push_back(std::move(sf));
    return ref;
  }

  bool has(const std::string& key) const { return key_file_.count(key) != 0; }

  TensorView get(const std::string& key) {
    auto it = key_file_.find(key);
    check(it != key_file_.end(), ErrorCode::Format, dir_ + ": missing tensor '" + key + "'");
    const SafetensorsFile& f = open(it->second);
    check(f.contains(key), ErrorCode::Format,
          it->second + ": tensor '" + key + "' listed in the index is not in this shard");
    TensorView v = f.view(key);
    expect_float(v, ErrorCode::Format);
    ck_->n_params_ += v.numel();
    return v;
  }

  TensorView get(const std::string& key, const std::vector<int64_t>& shape) {
    TensorView v = get(key);
    expect_shape(v, shape, ErrorCode::Format);
    return v;
  }

  void detect_layout() {
    bool r1 = false, a2 = false;
    for (const auto& [k, f] : key_file_) {
      if (k.rfind("expert.expert.layers.", 0) == 0) a2 = true;
      else if (k.rfind("expert.layers.", 0) == 0) r1 = true;
    }
    check(r1 || a2, ErrorCode::Format,
          dir_ +
              ": no expert layers found (expected keys expert.layers.* (R1/1.5) or "
              "expert.expert.layers.* (Alpamayo 2))");
    check(!(r1 && a2), ErrorCode::Format,
          dir_ + ": both expert.layers.* and expert.expert.layers.* keys present; ambiguous layout");
    ck_->layout_ = a2 ? Layout::A2 : Layout::R1;
    expert_ = a2 ? "expert.expert." : "expert.";
    heads_ = a2 ? "expert." : "";
  }

  void load_layers(ExpertConfig* c) {
    const std::string lp = expert_ + "layers.";
    std::set<int> idx;
    for (const auto& [k, f] : key_file_) {
      if (k.rfind(lp, 0) != 0) continue;
      const size_t dot = k.find('.', lp.size());
      const std::string num = k.substr(lp.size(), dot - lp.size());
      check(!num.empty() && num.find_first_not_of("0123456789") == std::string::npos, ErrorCode::Format,
            dir_ + ": unexpected key '" + k + "'");
      check(num.size() <= 6, ErrorCode::Format, dir_ + ": key '" + k + "': layer index out of range");
      idx.insert(std::stoi(num));
    }
    c->L = static_cast<int>(idx.size());
    check(*idx.rbegin() == c->L - 1, ErrorCode::Format,
          dir_ + ": expert layer indices are not contiguous from 0 (found " + std::to_string(c->L) +
              " layers, highest index " + std::to_string(*idx.rbegin()) + ")");
    const std::string p0 = lp + "0.";
    const TensorView q = get(p0 + "self_attn.q_proj.weight"), qn = get(p0 + "self_attn.q_norm.weight"),
                     kk = get(p0 + "self_attn.k_proj.weight"), g = get(p0 + "mlp.gate_proj.weight");
    check(q.shape.size() == 2 && qn.shape.size() == 1 && kk.shape.size() == 2 && g.shape.size() == 2, ErrorCode::Format,
          dir_ + ": layer 0 projections must be 2-D and q_norm 1-D");
    // Sizes from the tensors' shapes, each within its bound (limits.h) before any is narrowed to int or used
    // to size anything: a 12 KB file may declare a hidden size of 0 and a huge MLP width.
    auto size = [&](const TensorView& t, int dim, int64_t hi, const char* what) {
      const int64_t v = t.shape[dim];
      check(v >= 1 && v <= hi, ErrorCode::Format,
            t.name + ": shape " + shape_str(t.shape) + " gives " + what + " = " + std::to_string(v) + ", outside [1, " +
                std::to_string(hi) + "]");
      return v;
    };
    check(c->L <= limits::kMaxLayers, ErrorCode::Format,
          dir_ + ": " + std::to_string(c->L) + " expert layers, more than " + std::to_string(limits::kMaxLayers));
    size(q, 1, limits::kMaxHidden, "the hidden size D");
    size(qn, 0, limits::kMaxHeadDim, "the head dim d");
    size(g, 0, limits::kMaxMlp, "the MLP width I");
    size(g, 1, limits::kMaxHidden, "the hidden size D");
    c->D = static_cast<int>(q.shape[1]);
    c->d = static_cast<int>(qn.shape[0]);
    check(c->d > 0 && c->d % 2 == 0, ErrorCode::Format,
          qn.name + ": head dim must be even and positive, found " + std::to_string(c->d));
    for (const TensorView* t : {&q, &kk})
      check(t->shape[0] % c->d == 0, ErrorCode::Format,
            t->name + ": " + std::to_string(t->shape[0]) + " rows are not a multiple of the head dim " +
                std::to_string(c->d) + " (from q_norm)");
    for (const TensorView* t : {&q, &kk})
      check(t->shape[0] >= c->d && t->shape[0] / c->d <= limits::kMaxHeads, ErrorCode::Format,
            t->name + ": shape " + shape_str(t->shape) + " gives " + std::to_string(t->shape[0] / c->d) +
                " heads of dim " + std::to_string(c->d) + ", outside [1, " + std::to_string(limits::kMaxHeads) + "]");
    c->Hq = static_cast<int>(q.shape[0] / c->d);
    c->Hkv = static_cast<int>(kk.shape[0] / c->d);
    check(c->Hkv > 0 && c->Hq % c->Hkv == 0, ErrorCode::Format,
          kk.name + ": query heads " + std::to_string(c->Hq) + " must be a multiple of KV heads " +
              std::to_string(c->Hkv));
    c->I = static_cast<int>(g.shape[0]);
    ck_->n_params_ = 0;
    const int64_t D = c->D, d = c->d, Hq = c->Hq, Hkv = c->Hkv, I = c->I;
    for (int l = 0; l < c->L; ++l) {
      const std::string p = lp + std::to_string(l) + ".";
      LayerWeights w;
      w.input_norm = get(p + "input_layernorm.weight", {D});
      w.post_norm = get(p + "post_attention_layernorm.weight", {D});
      w.q = get(p + "self_attn.q_proj.weight", {Hq * d, D});
      w.k = get(p + "self_attn.k_proj.weight", {Hkv * d, D});
      w.v = get(p + "self_attn.v_proj.weight", {Hkv * d, D});
      w.o = get(p + "self_attn.o_proj.weight", {D, Hq * d});
      w.q_norm = get(p + "self_attn.q_norm.weight", {d});
      w.k_norm = get(p + "self_attn.k_norm.weight", {d});
      w.gate = get(p + "mlp.gate_proj.weight", {I, D});
      w.up = get(p + "mlp.up_proj.weight", {I, D});
      w.down = get(p + "mlp.down_proj.weight", {D, I});
      ck_->expert_.layers.push_back(std::move(w));
    }
    ck_->expert_.final_norm = get(expert_ + "norm.weight", {D});
  }

  void load_heads(ExpertConfig* c) {
    const std::string out = heads_ + "action_out_proj.";
    ck_->aout_.w = get(out + "weight");
    check(ck_->aout_.w.shape.size() == 2 && ck_->aout_.w.shape[1] == c->D, ErrorCode::Format,
          ck_->aout_.w.name + ": expected shape [A, " + std::to_string(c->D) + "], found " +
              shape_str(ck_->aout_.w.shape));
    c->A = static_cast<int>(ck_->aout_.w.shape[0]);
    check(c->A == 2, ErrorCode::Format,
          ck_->aout_.w.name + ": the unicycle action space needs A = 2 (acceleration, curvature), found " +
              std::to_string(c->A));
    ck_->aout_.b = get(out + "bias", {c->A});

    const std::string ip = heads_ + "action_in_proj.";
    const std::string tr = ip + "encoder.trunk.";
    const int n = c->ain_layers, F = c->n_fourier;
    // A trunk longer than the config says: report the config mismatch, not a shape error.
    const std::string extra = tr + std::to_string(3 * int64_t(n) + 1) + ".weight";
    const std::string extra2 = tr + std::to_string(3 * int64_t(n) + 2) + ".weight";
    check(!has(extra) && !has(extra2), ErrorCode::Format,
          dir_ + ": tensor '" + (has(extra) ? extra : extra2) + "' exists but action_in_proj_cfg.num_enc_layers is " +
              std::to_string(n) + " (" + source_of("action_in_proj_cfg.num_enc_layers") + ")");
    const TensorView w0 = get(tr + "0.weight");
    check(w0.shape.size() == 2, ErrorCode::Format, w0.name + ": expected a 2-D Linear weight");
    const int64_t h = w0.shape[0], in = int64_t(c->A + 1) * F;
    check(h == c->ain_hidden, ErrorCode::Format,
          w0.name + ": hidden size " + std::to_string(h) + " differs from action_in_proj_cfg.hidden_size " +
              std::to_string(c->ain_hidden) + " (" + source_of("action_in_proj_cfg.hidden_size") + ")");
    expect_shape(w0, {h, in}, ErrorCode::Format);
    auto& a = ck_->ain_;
    a.linear_w.push_back(w0);
    a.linear_b.push_back(get(tr + "0.bias", {h}));
    for (int i = 0; i < n; ++i) {
      const int k = 2 + 3 * i;
      const int64_t od = (i == n - 1) ? c->D : h;
      a.norm_w.push_back(get(tr + std::to_string(k) + ".weight", {h}));
      a.linear_w.push_back(get(tr + std::to_string(k + 1) + ".weight", {od, h}));
      a.linear_b.push_back(get(tr + std::to_string(k + 1) + ".bias", {od}));
    }
    a.ln_w = get(ip + "norm.weight", {c->D});
    a.ln_b = get(ip + "norm.bias", {c->D});

    // Derived buffers: the Fourier frequencies and the action-space statistics. Alpamayo-R1 saves them;
    // Alpamayo 2 Super would load them but its release omits them; Alpamayo 1.5 registers them as
    // non-persistent, so it never reads them from a checkpoint (and neither does the engine for it).
    std::vector<std::string> fk;
    for (int i = 0; i < c->A; ++i) fk.push_back(ip + "sinus." + std::to_string(i) + ".freqs");
    fk.push_back(ip + "timestep_fourier_encoder.freqs");
    int present = 0;
    for (const auto& k : fk) present += has(k);
    const std::string rel = info_->name;
    if (!info_->reads_buffers) {
      if (present) ck_->notes_.push_back("Fourier freqs tensors ignored: " + rel + " does not load them");
      present = 0;
    }
    check(present == 0 || present == static_cast<int>(fk.size()), ErrorCode::Format,
          dir_ + ": some but not all Fourier freqs buffers are present (e.g. '" + fk.back() + "')");
    if (present) {
      for (const auto& k : fk) a.freqs.push_back(get(k, {1, F / 2}));
      set_value("fourier_freqs", "[1, " + std::to_string(F / 2) + "] x " + std::to_string(fk.size()),
                "tensors " + ip + "sinus.*.freqs, " + ip + "timestep_fourier_encoder.freqs");
    } else {
      set_value("fourier_freqs", "logspace(0, log10(max_freq), " + std::to_string(F / 2) + ")",
                "computed from action_in_proj_cfg (bf16-rounded, as the release's buffers)");
    }

    const char* stats[] = {"accel_mean", "accel_std", "curvature_mean", "curvature_std"};
    double* dst[] = {&c->accel_mean, &c->accel_std, &c->curvature_mean, &c->curvature_std};
    for (int i = 0; i < 4; ++i) {
      const std::string k = heads_ + "action_space." + std::string(stats[i]);
      if (!has(k)) continue;
      if (!info_->reads_buffers) {
        ck_->notes_.push_back("tensor '" + k + "' ignored: " + rel + " takes action_space_cfg." + stats[i] + " from config");
        continue;
      }
      const TensorView v = get(k);
      check(v.numel() == 1, ErrorCode::Format, v.name + ": expected a scalar, found shape " + shape_str(v.shape));
      float val;
      convert_to_f32(v, &val);
      *dst[i] = val;  // the buffer is what the released model uses
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(val));
      set_value(std::string("action_space_cfg.") + stats[i], buf, "tensor " + k + " (overrides the config key)");
    }
    check(c->accel_std > 0 && c->curvature_std > 0, ErrorCode::Format, dir_ + ": action-space stds must be positive");
  }

  std::string source_of(const std::string& name) const {
    for (const ConfigValue& v : ck_->values_)
      if (v.name == name) return v.source;
    return "not recorded";
  }

  // Replaces the recorded value `name` (a buffer overriding a config key) or appends it.
  void set_value(const std::string& name, const std::string& value, const std::string& source) {
    for (ConfigValue& v : ck_->values_)
      if (v.name == name) {
        v.value = value;
        v.source = source;
        return;
      }
    ck_->values_.push_back({name, value, source});
  }

  Checkpoint* ck_;
  const ReleaseInfo* info_ = nullptr;
  std::string dir_, expert_, heads_;
  std::map<std::string, std::string> key_file_;
  std::map<std::string, const SafetensorsFile*> opened_;
};

std::shared_ptr<const Checkpoint> Checkpoint::open(const std::string& dir, const CheckpointOptions& options) {
  check_no_nul(dir, "checkpoint directory");
  check_no_nul(options.vlm_config, "vlm config");
  const StageScope stage("opening the checkpoint " + dir);
  std::shared_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  CheckpointLoader(ck.get(), dir).run(options);
  return ck;
}

std::shared_ptr<const Checkpoint> Checkpoint::open(const std::string& dir, const std::string& vlm_config) {
  CheckpointOptions o;
  o.vlm_config = vlm_config;
  return open(dir, o);
}

}  // namespace alpamayo
