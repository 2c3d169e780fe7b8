#include <fstream>
#include <nlohmann/json.hpp>

#include "alpamayo/checkpoint.h"
#include "io/config_json.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using namespace test;  // expect_error, TempDir, TensorSet, tiny_spec

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& fn) {
  nlohmann::json j = read_json_file(dir + "/config.json");
  fn(j);
  std::ofstream(dir + "/config.json") << j.dump();
}

TEST(Checkpoint, DetectsBothLayoutsAndDerivesSizesFromTensors) {
  for (Layout layout : {Layout::R1, Layout::A2})
    for (int shards : {1, 3}) {
      TempDir tmp;
      auto spec = tiny_spec(layout);
      spec.shards = shards;
      write_synthetic_checkpoint(tmp / "ck", spec);
      auto ck = Checkpoint::open(tmp / "ck");
      const ExpertConfig& c = ck->config();
      EXPECT_EQ(ck->layout(), layout);
      EXPECT_EQ(c.L, 2);
      EXPECT_EQ(c.D, 64);
      EXPECT_EQ(c.Hq, 4);
      EXPECT_EQ(c.Hkv, 2);
      EXPECT_EQ(c.d, 16);
      EXPECT_EQ(c.I, 128);
      EXPECT_EQ(c.T, 8);
      EXPECT_EQ(c.ain_hidden, 32);
      EXPECT_EQ(ck->expert().layers.size(), 2u);
      EXPECT_EQ(ck->action_in().linear_w.size(), 3u);
      EXPECT_EQ(ck->action_in().freqs.size(), layout == Layout::R1 ? 3u : 0u);  // A2 has no derived buffers
      EXPECT_EQ(ck->vlm_tensors_skipped(), 3);
      EXPECT_NEAR(c.accel_std, ReleasedActionStats::accel_std, 1e-7);
      // The vlm-only shard is never opened.
      EXPECT_EQ(ck->files().size(), static_cast<size_t>(shards));
      for (const auto& f : ck->files()) EXPECT_EQ(f.find("0000" + std::to_string(shards + 1) + "-of"), std::string::npos);
    }
}

TEST(Checkpoint, EpsAndThetaFromTextConfigOrVlmConfig) {
  // Alpamayo-R1: the VLM's text config only through --vlm-config, else the Qwen3-VL defaults.
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Release::R1));
  auto ck = Checkpoint::open(tmp / "ck");
  EXPECT_DOUBLE_EQ(ck->config().rms_eps, 1e-6);
  EXPECT_DOUBLE_EQ(ck->config().rope_theta, 5e6);
  EXPECT_NE(ck->config().eps_source.find("default"), std::string::npos);
  std::ofstream(tmp / "vlm.json") << R"({"text_config": {"num_hidden_layers": 2, "rms_norm_eps": 1e-5,
      "rope_parameters": {"rope_theta": 1000000.0, "mrope_section": [24, 20, 20]}}})";
  ck = Checkpoint::open(tmp / "ck", tmp / "vlm.json");
  EXPECT_DOUBLE_EQ(ck->config().rms_eps, 1e-5);
  EXPECT_DOUBLE_EQ(ck->config().rope_theta, 1e6);
  EXPECT_EQ(ck->config().eps_source, "vlm.json text_config.rms_norm_eps");
  EXPECT_EQ(ck->config().theta_source, "vlm.json text_config.rope_parameters.rope_theta");
  std::ofstream(tmp / "vlm36.json") << R"({"num_hidden_layers": 36})";
  expect_error([&] { Checkpoint::open(tmp / "ck", tmp / "vlm36.json"); }, {"vlm36.json", "num_hidden_layers", "36", "2"});
  // expert_cfg, applied on top of the VLM's text config, wins.
  edit_config(tmp / "ck", [](nlohmann::json& j) { j["expert_cfg"]["rope_theta"] = 123456.0; });
  EXPECT_DOUBLE_EQ(Checkpoint::open(tmp / "ck", tmp / "vlm.json")->config().rope_theta, 123456.0);
  // A text_config inside an R1 config.json is not where the release looks: an error, not a silent default.
  edit_config(tmp / "ck", [](nlohmann::json& j) { j["text_config"] = {{"num_hidden_layers", 2}, {"rope_theta", 1e4}}; });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "'text_config'", "Alpamayo-R1", "--vlm-config"});
}

TEST(Checkpoint, ConfigMismatchesAreErrors) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Release::R1));
  edit_config(tmp / "ck", [](nlohmann::json& j) { j["expert_cfg"]["hidden_size"] = 2048; });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "hidden_size", "2048", "64"});
  edit_config(tmp / "ck", [](nlohmann::json& j) { j["expert_cfg"]["hidden_size"] = 64; j["action_in_proj_cfg"]["num_enc_layers"] = 1; });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"num_enc_layers is 1"});
  edit_config(tmp / "ck", [](nlohmann::json& j) { j["action_in_proj_cfg"]["num_enc_layers"] = 2; j["action_in_proj_cfg"]["hidden_size"] = 33; });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"trunk.0.weight", "33"});
  edit_config(tmp / "ck", [](nlohmann::json& j) { j["action_in_proj_cfg"]["hidden_size"] = 32; j["diffusion_cfg"]["int_method"] = "heun"; });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"int_method", "heun"});
  std::ofstream(tmp / "ck/config.json") << "{ not json";
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "invalid JSON"});
  std::filesystem::remove(tmp / "ck/config.json");
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "missing"});
  expect_error([&] { Checkpoint::open(tmp / "nowhere"); }, {"nowhere", "not found"});
}

TEST(Checkpoint, EveryTensorIsChecked) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Layout::R1));
  const std::string file = tmp / "ck/model.safetensors";
  const TensorSet orig = TensorSet::read(file);

  TensorSet s = orig;
  s.erase("expert.layers.1.mlp.up_proj.weight");
  s.write(file);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"missing tensor 'expert.layers.1.mlp.up_proj.weight'"});

  s = orig;
  s.t["expert.layers.1.self_attn.k_proj.weight"].shape = {16, 128};  // same bytes, wrong shape
  s.write(file);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"expert.layers.1.self_attn.k_proj.weight", "[32, 64]", "[16, 128]"});

  s = orig;
  Tensor& t = s.t["expert.layers.0.mlp.down_proj.weight"];
  t.dtype = DType::I16;  // same byte size as bf16
  s.write(file);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"down_proj.weight", "F32, F16 or BF16", "I16"});

  s = orig;
  s.erase("action_in_proj.sinus.1.freqs");
  s.write(file);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"not all Fourier freqs"});

  s = orig;
  for (const auto& n : orig.names)
    if (n.rfind("expert.layers.1.", 0) == 0) {
      s.t[n.substr(0, 14) + "5" + n.substr(15)] = s.t[n];
      s.names.push_back(n.substr(0, 14) + "5" + n.substr(15));
      s.erase(n);
    }
  s.write(file);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"not contiguous"});

  s = orig;
  for (const auto& n : orig.names)
    if (n.rfind("expert.", 0) == 0) s.erase(n);
  s.write(file);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"no expert layers found"});
}

TEST(Checkpoint, ShardIndexErrors) {
  TempDir tmp;
  auto spec = tiny_spec();
  spec.shards = 2;
  write_synthetic_checkpoint(tmp / "ck", spec);
  std::filesystem::resize_file(tmp / "ck/model-00002-of-00003.safetensors", 100);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"model-00002-of-00003.safetensors"});
  std::filesystem::remove(tmp / "ck/model-00002-of-00003.safetensors");
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"model-00002-of-00003.safetensors", "cannot open"});
}

}  // namespace
}  // namespace alpamayo
