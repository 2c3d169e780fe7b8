// config.json as each release ships it: recognition, where every value is read from, release defaults,
// derived buffers, and the errors for missing or contradictory keys.
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpamayo/checkpoint.h"
#include "io/config_json.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using nlohmann::json;
using test::expect_error;
using test::TempDir;
using test::TensorSet;
using test::tiny_spec;

void edit_config(const std::string& dir, const std::function<void(json&)>& fn) {
  json j = read_json_file(dir + "/config.json");
  fn(j);
  std::ofstream(dir + "/config.json") << j.dump();
}

const ConfigValue& value(const Checkpoint& ck, const std::string& name) {
  for (const ConfigValue& v : ck.values())
    if (v.name == name) return v;
  throw Error("no value '" + name + "' recorded");
}

std::shared_ptr<const Checkpoint> open_as(const std::string& dir, Release r) {
  CheckpointOptions o;
  o.release = r;
  return Checkpoint::open(dir, o);
}

TEST(Releases, RecognisedFromModelTypeWithTheirLayouts) {
  for (Release r : {Release::R1, Release::A1_5, Release::A2Super}) {
    TempDir tmp;
    write_synthetic_checkpoint(tmp / "ck", tiny_spec(r));
    const json j = read_json_file(tmp / "ck/config.json");
    EXPECT_EQ(j["model_type"], release_model_type(r));
    auto ck = Checkpoint::open(tmp / "ck");
    EXPECT_EQ(ck->release(), r);
    EXPECT_EQ(ck->config().release, r);
    EXPECT_EQ(ck->layout(), release_layout(r));
    EXPECT_NE(ck->release_evidence().find(std::string("model_type '") + release_model_type(r) + "'"), std::string::npos);
    // architectures alone is enough.
    edit_config(tmp / "ck", [](json& c) { c.erase("model_type"); });
    EXPECT_EQ(Checkpoint::open(tmp / "ck")->release(), r);
    EXPECT_EQ(Checkpoint::open(tmp / "ck")->release_evidence().find("model_type"), std::string::npos);
  }
  EXPECT_EQ(release_layout(Release::A1_5), Layout::R1);
  EXPECT_EQ(release_layout(Release::A2Super), Layout::A2);
  EXPECT_EQ(parse_release("1.5", "--release"), Release::A1_5);
  EXPECT_EQ(parse_release("alpamayo2_super", "--release"), Release::A2Super);
  expect_error([] { parse_release("r2", "--release"); }, {"--release", "'r2'", "alpamayo_r1", "alpamayo1_5", "alpamayo2_super"});
}

TEST(Releases, UnknownModelTypeNeedsTheUsersWord) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Release::A2Super));
  edit_config(tmp / "ck", [](json& c) { c["model_type"] = "my_fork"; c.erase("architectures"); });
  expect_error([&] { Checkpoint::open(tmp / "ck"); },
               {"config.json", "model_type 'my_fork'", "alpamayo_r1", "alpamayo1_5", "alpamayo2_super", "--release"});
  auto ck = open_as(tmp / "ck", Release::A2Super);
  EXPECT_EQ(ck->release(), Release::A2Super);
  EXPECT_NE(ck->release_evidence().find("my_fork"), std::string::npos);
  // The user's word must fit the file: an R1 reading of a nested config is an error naming both.
  expect_error([&] { open_as(tmp / "ck", Release::R1); }, {"config.json", "action_in_proj_cfg", "expert_config", "Alpamayo-R1"});
  edit_config(tmp / "ck", [](json& c) { c.erase("model_type"); });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "no 'model_type'", "alpamayo2_super"});
  // A known model_type the user contradicts is an error, as is model_type against architectures.
  edit_config(tmp / "ck", [](json& c) { c["model_type"] = "alpamayo2_super"; });
  expect_error([&] { open_as(tmp / "ck", Release::A1_5); }, {"config.json", "Alpamayo 2 Super", "--release", "Alpamayo 1.5"});
  edit_config(tmp / "ck", [](json& c) { c["architectures"] = {"AlpamayoR1"}; });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "model_type 'alpamayo2_super'", "contradicts", "AlpamayoR1"});
}

TEST(Releases, TensorLayoutMustBeTheReleases) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Release::A2Super));
  write_synthetic_checkpoint(tmp / "r1", tiny_spec(Release::R1));
  std::filesystem::copy_file(tmp / "r1/config.json", tmp / "ck/config.json", std::filesystem::copy_options::overwrite_existing);
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"Alpamayo-R1", "expert.layers.*", "expert.expert.layers.*"});
}

TEST(Releases, SuperValuesComeFromExpertConfig) {
  TempDir tmp;
  auto spec = tiny_spec(Release::A2Super);
  spec.rms_eps = 1e-5;
  spec.rope_theta = 2e4;
  spec.steps = 7;
  spec.T = 6;
  write_synthetic_checkpoint(tmp / "ck", spec);
  edit_config(tmp / "ck", [](json& c) {
    c["expert_config"]["action_space_cfg"]["accel_std"] = 0.5;
    c["expert_config"]["action_space_cfg"]["dt"] = 0.25;
    c["expert_config"]["action_space_cfg"]["curvature_bounds"] = {-0.1, 0.2};
    c["expert_config"]["diffusion_cfg"]["inference_guidance_weight"] = 2.5;
  });
  auto ck = Checkpoint::open(tmp / "ck");
  const ExpertConfig& c = ck->config();
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 2e4);
  EXPECT_EQ(c.num_steps, 7);
  EXPECT_EQ(c.T, 6);
  EXPECT_DOUBLE_EQ(c.accel_std, 0.5);
  EXPECT_DOUBLE_EQ(c.dt, 0.25);
  EXPECT_DOUBLE_EQ(c.curvature_bounds[0], -0.1);
  EXPECT_DOUBLE_EQ(c.curvature_bounds[1], 0.2);
  EXPECT_FALSE(c.use_cfg);
  EXPECT_DOUBLE_EQ(c.guidance_weight, 2.5);
  EXPECT_EQ(value(*ck, "rms_norm_eps").source, "config.json expert_config.llm_config.rms_norm_eps");
  EXPECT_EQ(value(*ck, "rope_theta").source, "config.json expert_config.llm_config.rope_theta");
  EXPECT_EQ(value(*ck, "diffusion_cfg.num_inference_steps").source, "config.json expert_config.diffusion_cfg.num_inference_steps");
  EXPECT_EQ(value(*ck, "diffusion_cfg.inference_guidance_weight").value, "2.5");
  EXPECT_EQ(value(*ck, "diffusion_cfg.use_classifier_free_guidance").source,
            "config.json expert_config.diffusion_cfg.use_classifier_free_guidance");
  EXPECT_EQ(value(*ck, "action_space_cfg.accel_std").source, "config.json expert_config.action_space_cfg.accel_std");
  EXPECT_EQ(value(*ck, "expert_non_causal_attention").source, "config.json expert_config.expert_non_causal_attention");
  EXPECT_EQ(value(*ck, "hidden_size").source,
            "tensors; matches config.json expert_config.llm_config.hidden_size, config.json expert_config.expert_update_cfg.hidden_size");
  EXPECT_NE(value(*ck, "layers").source.find("vlm_config.text_config.num_hidden_layers"), std::string::npos);
  EXPECT_NE(value(*ck, "head_dim").source.find("vlm_config.text_config.head_dim"), std::string::npos);

  // A flat key left at the top level next to its expert_config counterpart is not read (as the release).
  edit_config(tmp / "ck", [](json& c) { c["diffusion_cfg"] = {{"num_inference_steps", 99}}; });
  ck = Checkpoint::open(tmp / "ck");
  EXPECT_EQ(ck->config().num_steps, 7);
  bool noted = false;
  for (const auto& n : ck->notes()) noted |= n.find("top-level 'diffusion_cfg' ignored") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Releases, DefaultsAreTheReleasesAndSaySo) {
  for (Release r : {Release::R1, Release::A1_5, Release::A2Super}) {
    TempDir tmp;
    write_synthetic_checkpoint(tmp / "ck", tiny_spec(r));
    const bool super = r == Release::A2Super;
    edit_config(tmp / "ck", [&](json& c) {
      json& b = super ? c["expert_config"] : c;
      b["diffusion_cfg"] = {{"int_method", "euler"}};
      b["action_space_cfg"] = {{"n_waypoints", 8}};
      b.erase("expert_non_causal_attention");
      b["action_in_proj_cfg"].erase("max_freq");
      if (super) {
        b["llm_config"].erase("rms_norm_eps");
        b["llm_config"].erase("rope_theta");
        b["llm_config"].erase("rope_scaling");
      }
    });
    auto ck = Checkpoint::open(tmp / "ck");
    const ExpertConfig& c = ck->config();
    const std::string dflt = std::string(release_name(r)) + " default";
    EXPECT_EQ(c.num_steps, 10);
    EXPECT_EQ(value(*ck, "diffusion_cfg.num_inference_steps").source, dflt);
    EXPECT_DOUBLE_EQ(c.guidance_weight, 1.0);
    EXPECT_FALSE(c.use_cfg);
    EXPECT_TRUE(c.non_causal);
    EXPECT_EQ(value(*ck, "expert_non_causal_attention").source, dflt);
    EXPECT_DOUBLE_EQ(c.dt, 0.1);
    EXPECT_DOUBLE_EQ(c.curvature_bounds[1], 0.2);  // the action space class default, not the release's trained 0.33
    EXPECT_EQ(value(*ck, "action_space_cfg.curvature_bounds").value, "[-0.2, 0.2]");
    EXPECT_DOUBLE_EQ(c.max_freq, 100.0);
    EXPECT_DOUBLE_EQ(c.rms_eps, 1e-6);
    EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
    EXPECT_NE(value(*ck, "rms_norm_eps").source.find("Qwen3-VL"), std::string::npos);
    if (r == Release::R1) {  // the buffers in the checkpoint still give the statistics
      EXPECT_NEAR(c.accel_std, ReleasedActionStats::accel_std, 1e-7);
      EXPECT_EQ(value(*ck, "action_space_cfg.accel_std").source, "tensor action_space.accel_std (overrides the config key)");
      EXPECT_EQ(value(*ck, "diffusion_cfg.use_classifier_free_guidance").source.find("fixed by Alpamayo-R1"), 0u);
    } else {
      EXPECT_DOUBLE_EQ(c.accel_std, 1.0);
      EXPECT_DOUBLE_EQ(c.accel_mean, 0.0);
      EXPECT_EQ(value(*ck, "action_space_cfg.accel_std").source, dflt);
      EXPECT_EQ(value(*ck, "diffusion_cfg.use_classifier_free_guidance").source, dflt);
    }
  }
}

TEST(Releases, DerivedBuffersAsEachReleaseLoadsThem) {
  // Alpamayo-R1 loads its buffers; Alpamayo 1.5 never does (non-persistent), even when a checkpoint has them.
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Release::R1));
  edit_config(tmp / "ck", [](json& c) { c["action_space_cfg"]["accel_std"] = 0.5; });
  auto ck = Checkpoint::open(tmp / "ck");
  EXPECT_NEAR(ck->config().accel_std, ReleasedActionStats::accel_std, 1e-7);
  EXPECT_EQ(ck->action_in().freqs.size(), 3u);
  edit_config(tmp / "ck", [](json& c) { c["model_type"] = "alpamayo1_5"; c["architectures"] = {"Alpamayo1_5"}; });
  ck = Checkpoint::open(tmp / "ck");
  EXPECT_EQ(ck->release(), Release::A1_5);
  EXPECT_DOUBLE_EQ(ck->config().accel_std, 0.5);
  EXPECT_EQ(value(*ck, "action_space_cfg.accel_std").source, "config.json action_space_cfg.accel_std");
  EXPECT_TRUE(ck->action_in().freqs.empty());
  int ignored = 0;
  for (const auto& n : ck->notes()) ignored += n.find("ignored: Alpamayo 1.5") != std::string::npos;
  EXPECT_EQ(ignored, 5);  // the freqs note and one per statistic

  // Alpamayo 2 Super would load its (expert.-prefixed) buffers; its release omits them.
  write_synthetic_checkpoint(tmp / "a2", tiny_spec(Release::A2Super));
  TensorSet s = TensorSet::read(tmp / "a2/model.safetensors");
  Tensor t;
  t.dtype = DType::F32;
  t.shape = {};
  const float v = 0.75f;
  t.bytes.assign(reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + 4);
  s.t["expert.action_space.accel_std"] = t;
  s.names.push_back("expert.action_space.accel_std");
  s.write(tmp / "a2/model.safetensors");
  ck = Checkpoint::open(tmp / "a2");
  EXPECT_DOUBLE_EQ(ck->config().accel_std, 0.75);
  EXPECT_EQ(value(*ck, "action_space_cfg.accel_std").source, "tensor expert.action_space.accel_std (overrides the config key)");
}

TEST(Releases, SuperWithExpertUpdateCfgOnly) {
  // Versions that carry expert_update_cfg instead of llm_config: the update applies on top of the VLM's text config.
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Release::A2Super));
  edit_config(tmp / "ck", [](json& c) {
    c["expert_config"].erase("llm_config");
    c["vlm_config"]["text_config"]["rms_norm_eps"] = 1e-4;
    c["vlm_config"]["text_config"]["rope_theta"] = 3e5;
  });
  auto ck = Checkpoint::open(tmp / "ck");
  EXPECT_DOUBLE_EQ(ck->config().rms_eps, 1e-4);
  EXPECT_DOUBLE_EQ(ck->config().rope_theta, 3e5);
  EXPECT_EQ(value(*ck, "rms_norm_eps").source, "config.json vlm_config.text_config.rms_norm_eps");
  edit_config(tmp / "ck", [](json& c) { c["expert_config"]["expert_update_cfg"]["rms_norm_eps"] = 2e-6; });
  EXPECT_DOUBLE_EQ(Checkpoint::open(tmp / "ck")->config().rms_eps, 2e-6);
  edit_config(tmp / "ck", [](json& c) { c["expert_config"].erase("expert_update_cfg"); });
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "llm_config", "expert_update_cfg"});
}

TEST(Releases, MissingAndContradictoryKeysAreErrors) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec(Release::A2Super));
  const json orig = read_json_file(tmp / "ck/config.json");
  auto expect_config_error = [&](const std::function<void(json&)>& edit, std::initializer_list<std::string> parts) {
    json j = orig;
    edit(j);
    std::ofstream(tmp / "ck/config.json") << j.dump();
    expect_error([&] { Checkpoint::open(tmp / "ck"); }, parts);
  };
  // Missing.
  expect_config_error([](json& c) { c.erase("expert_config"); }, {"config.json", "missing 'expert_config'", "Alpamayo 2 Super"});
  expect_config_error([](json& c) { c["expert_config"].erase("action_space_cfg"); },
                      {"config.json", "missing 'expert_config.action_space_cfg'"});
  expect_config_error([](json& c) { c["expert_config"].erase("diffusion_cfg"); }, {"missing 'expert_config.diffusion_cfg'"});
  // Flat (R1) keys under a Super model_type, without their expert_config counterpart.
  expect_config_error([](json& c) { c["action_in_proj_cfg"] = c["expert_config"]["action_in_proj_cfg"];
                                    c["expert_config"].erase("action_in_proj_cfg"); },
                      {"config.json", "'action_in_proj_cfg'", "expert_config.action_in_proj_cfg", "missing"});
  expect_config_error([](json& c) { c["action_space_cfg"] = c["expert_config"]["action_space_cfg"]; c.erase("expert_config"); },
                      {"config.json", "no 'expert_config'", "action_space_cfg", "Is model_type right?"});
  expect_config_error([](json& c) { c["expert_non_causal_attention"] = false; c["expert_config"].erase("expert_non_causal_attention"); },
                      {"config.json", "'expert_non_causal_attention'", "expert_config.expert_non_causal_attention"});
  {  // the same key saying what the release's default says anyway is only noted
    json j = orig;
    j["expert_non_causal_attention"] = true;
    j["expert_config"].erase("expert_non_causal_attention");
    std::ofstream(tmp / "ck/config.json") << j.dump();
    EXPECT_TRUE(Checkpoint::open(tmp / "ck")->config().non_causal);
  }
  // Contradictions: between keys, between keys and tensors.
  expect_config_error([](json& c) { c["expert_config"]["expert_update_cfg"]["num_attention_heads"] = 8; },
                      {"config.json", "expert_config.expert_update_cfg.num_attention_heads", "8", "contradicts",
                       "expert_config.llm_config.num_attention_heads", "4"});
  expect_config_error([](json& c) { c["expert_config"]["llm_config"]["intermediate_size"] = 256;
                                    c["expert_config"]["expert_update_cfg"]["intermediate_size"] = 256; },
                      {"config.json", "expert_config.llm_config.intermediate_size", "256", "I = 128"});
  expect_config_error([](json& c) { c["vlm_config"]["text_config"]["num_hidden_layers"] = 64; },
                      {"config.json", "vlm_config.text_config.num_hidden_layers", "64", "L = 2"});
  expect_config_error([](json& c) { c["vlm_config"]["text_config"]["num_key_value_heads"] = 8; },
                      {"config.json", "vlm_config.text_config.num_key_value_heads", "8", "Hkv = 2", "KV cache"});
  expect_config_error([](json& c) { c["expert_config"]["action_in_proj_cfg"]["hidden_size"] = 1024; },
                      {"trunk.0.weight", "32", "1024", "config.json expert_config.action_in_proj_cfg.hidden_size"});
  expect_config_error([](json& c) { c["expert_config"]["action_in_proj_cfg"].erase("hidden_size"); },
                      {"trunk.0.weight", "32", "1024", "Alpamayo 2 Super default"});
  // Unsupported modes, each named with its key and file.
  expect_config_error([](json& c) { c["expert_config"]["expert_non_causal_attention"] = false; },
                      {"config.json", "'expert_config.expert_non_causal_attention' = false", "causal"});
  expect_config_error([](json& c) { c["expert_config"]["diffusion_cfg"]["int_method"] = "heun"; },
                      {"config.json", "expert_config.diffusion_cfg.int_method", "heun", "euler"});
  expect_config_error([](json& c) { c["expert_config"]["action_in_proj_cfg"]["_target_"] = "x.PerWaypointActionInProjV3"; },
                      {"config.json", "expert_config.action_in_proj_cfg._target_", "PerWaypointActionInProjV3", "PerWaypointActionInProjV2"});
  // Wrong types.
  expect_config_error([](json& c) { c["expert_config"]["diffusion_cfg"]["num_inference_steps"] = "10"; },
                      {"config.json", "expert_config.diffusion_cfg.num_inference_steps", "integer", "\"10\""});
  expect_config_error([](json& c) { c["expert_config"]["expert_non_causal_attention"] = 1; },
                      {"expert_config.expert_non_causal_attention", "true or false"});
  expect_config_error([](json& c) { c["expert_config"]["action_space_cfg"]["accel_bounds"] = {1}; },
                      {"expert_config.action_space_cfg.accel_bounds", "[min, max]"});
}

TEST(Releases, FlatReleasesErrors) {
  for (Release r : {Release::R1, Release::A1_5}) {
    TempDir tmp;
    write_synthetic_checkpoint(tmp / "ck", tiny_spec(r));
    const std::string name = release_name(r);
    edit_config(tmp / "ck", [](json& c) { c["expert_non_causal_attention"] = false; });
    expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "'expert_non_causal_attention' = false"});
    edit_config(tmp / "ck", [](json& c) { c["expert_non_causal_attention"] = true; c.erase("diffusion_cfg"); });
    expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "missing 'diffusion_cfg'", name});
    // Super's nesting under a flat model_type: the flat key's absence is explained.
    edit_config(tmp / "ck", [](json& c) { c["expert_config"] = {{"diffusion_cfg", {{"num_inference_steps", 3}}}}; });
    expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "'diffusion_cfg'", "'expert_config'", "Is model_type right?"});
    edit_config(tmp / "ck", [](json& c) { c["diffusion_cfg"] = {{"num_inference_steps", 4}}; });
    auto ck = Checkpoint::open(tmp / "ck");  // expert_config is ignored when the flat keys are there
    EXPECT_EQ(ck->config().num_steps, 4);
    edit_config(tmp / "ck", [](json& c) { c["expert_cfg"]["head_dim"] = 32; });
    expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "'expert_cfg.head_dim' = 32", "d = 16"});
  }
  // Guidance: Alpamayo 1.5 reads the switch and the weight; Alpamayo-R1 has none and ignores it.
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "a15", tiny_spec(Release::A1_5));
  edit_config(tmp / "a15", [](json& c) {
    c["diffusion_cfg"]["use_classifier_free_guidance"] = true;
    c["diffusion_cfg"]["inference_guidance_weight"] = 2.5;
  });
  EXPECT_TRUE(Checkpoint::open(tmp / "a15")->config().use_cfg);
  EXPECT_EQ(Checkpoint::open(tmp / "a15")->config().guidance_weight, 2.5);
  write_synthetic_checkpoint(tmp / "r1", tiny_spec(Release::R1));
  edit_config(tmp / "r1", [](json& c) { c["diffusion_cfg"]["use_classifier_free_guidance"] = true; });
  auto ck = Checkpoint::open(tmp / "r1");
  EXPECT_FALSE(ck->config().use_cfg);
  EXPECT_NE(value(*ck, "diffusion_cfg.use_classifier_free_guidance").source.find("is not read"), std::string::npos);
}

TEST(Releases, SyntheticSpecMustMatchItsLayout) {
  TempDir tmp;
  auto spec = tiny_spec(Layout::A2);
  spec.release = Release::A1_5;
  expect_error([&] { write_synthetic_checkpoint(tmp / "ck", spec); }, {"Alpamayo 1.5", "expert.layers.*"});
}

}  // namespace
}  // namespace alpamayo
