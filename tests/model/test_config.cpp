// config.json: the Flash fixture, the presets, the writer's round trip, and one refused mutation
// per clause of reliability.md row WF11 (each error must name the field).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/json.h"
#include "model/config.h"

namespace ds {
namespace {

const std::string kFixtureDir = std::string(DS_SOURCE_DIR) + "/tests/fixtures/deepseek_v4_flash";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Json fixture_json() {
  auto r = parse_json_strict(read_text(kFixtureDir + "/config.json"), JsonLimits{}, "fixture");
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : Json::object();
}

// The tiny configuration exactly as printed in dsv4-model.md §14.
constexpr const char* kTinyJson = R"({
  "vocab_size": 1024, "hidden_size": 256, "num_hidden_layers": 4, "num_nextn_predict_layers": 1,
  "compress_ratios": [0, 4, 128, 4, 0],
  "num_hash_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
  "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128,
  "sliding_window": 16,
  "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 128,
  "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
  "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
  "rope_theta": 10000, "compress_rope_theta": 160000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
  "expert_dtype": "fp4",
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
})";

TEST(Config, FlashFixtureParsesToFlashPreset) {
  auto r = load_config_file(kFixtureDir);  // a directory: reads DIR/config.json
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const DeepSeekV4Config& c = *r;
  EXPECT_EQ(c, flash_config(43));
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_layers_total(), 44);
  EXPECT_EQ(c.nope_head_dim(), 448);
  EXPECT_EQ(c.expert_format, ExpertFormat::kMxfp4);  // April revision: no expert_dtype => fp4
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  // Layer schedule of §3: 2 SWA, 21 CSA (even layers 2..42), 20 HCA (odd 3..41), MTP SWA.
  int swa = 0, csa = 0, hca = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    switch (c.layer_kind(l)) {
      case LayerKind::kSwa:
        ++swa;
        break;
      case LayerKind::kCsa:
        ++csa;
        EXPECT_EQ(l % 2, 0) << l;
        break;
      case LayerKind::kHca:
        ++hca;
        EXPECT_EQ(l % 2, 1) << l;
        break;
    }
  }
  EXPECT_EQ(swa, 2);
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(c.layer_kind(43), LayerKind::kSwa);
  EXPECT_TRUE(c.is_mtp_layer(43));
  EXPECT_TRUE(c.is_hash_layer(2));
  EXPECT_FALSE(c.is_hash_layer(3));
  EXPECT_FALSE(c.is_hash_layer(43));  // MTP routes with the learned gate
}

TEST(Config, TinyJsonFromSpecMatchesTinyPreset) {
  auto r = parse_config_json(kTinyJson);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  DeepSeekV4Config expected = tiny_config();
  EXPECT_EQ(expected.vocab_size, 129280);  // the preset uses the real tokenizer's vocabulary
  expected.vocab_size = 1024;
  EXPECT_EQ(*r, expected);
  EXPECT_TRUE(validate_config(tiny_config()).ok());
  EXPECT_EQ(tiny_config().max_position_embeddings, 4096);
  EXPECT_EQ(tiny_config().nope_head_dim(), 64);
}

TEST(Config, FlashPresetWithFewerLayers) {
  DeepSeekV4Config c5 = flash_config(5);
  EXPECT_EQ(c5.compress_ratios, (std::vector<int>{0, 0, 4, 128, 4, 0}));
  EXPECT_EQ(c5.num_hash_layers, 3);
  EXPECT_TRUE(validate_config(c5).ok());
  DeepSeekV4Config c2 = flash_config(2);
  EXPECT_EQ(c2.compress_ratios, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(c2.num_hash_layers, 2);
  EXPECT_TRUE(validate_config(c2).ok());
  DeepSeekV4Config c1 = flash_config(1);
  EXPECT_EQ(c1.compress_ratios, (std::vector<int>{0, 0}));
  EXPECT_EQ(c1.num_hash_layers, 1);
  EXPECT_TRUE(validate_config(c1).ok());
  EXPECT_EQ(flash_config(0).num_hidden_layers, 1);  // clamped
  DeepSeekV4Config c43 = flash_config(43);
  std::vector<int> sched = {0, 0};
  for (int i = 0; i < 20; ++i) sched.insert(sched.end(), {4, 128});
  sched.insert(sched.end(), {4, 0});
  EXPECT_EQ(c43.compress_ratios, sched);
}

TEST(Config, RoundTripThroughJson) {
  std::vector<DeepSeekV4Config> configs = {tiny_config(), flash_config(43), flash_config(4)};
  DeepSeekV4Config fp8 = tiny_config();
  fp8.expert_format = ExpertFormat::kFp8Block;
  configs.push_back(fp8);
  DeepSeekV4Config nvfp4 = flash_config(3);
  nvfp4.expert_format = ExpertFormat::kNvfp4;
  configs.push_back(nvfp4);
  DeepSeekV4Config odd = tiny_config();  // non-default values everywhere they may vary
  odd.norm_topk_prob = false;
  odd.hc_eps = 3.0000000000000001e-7;
  odd.rms_norm_eps = 1e-5;
  odd.routed_scaling_factor = 2.5;
  odd.rope_factor = 40;
  odd.rope_beta_fast = 31.5;
  odd.num_nextn_predict_layers = 0;
  odd.compress_ratios = {128, 4, 0, 4};
  odd.num_hash_layers = 0;
  odd.n_shared_experts = 0;
  odd.eos_token_id = 129279;
  configs.push_back(odd);
  for (const auto& c : configs) {
    ASSERT_TRUE(validate_config(c).ok()) << validate_config(c).to_string();
    const std::string text = to_config_json(c);
    auto back = parse_config_json(text);
    ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
    EXPECT_EQ(*back, c) << text;
    EXPECT_EQ(to_config_json(*back), text);
  }
  // The writer's output carries the HF identification fields.
  auto j = parse_json_strict(to_config_json(flash_config()), JsonLimits{}, "w");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["architectures"][0], "DeepseekV4ForCausalLM");
  EXPECT_EQ((*j)["model_type"], "deepseek_v4");
  EXPECT_EQ((*j)["rope_scaling"]["type"], "yarn");
}

TEST(Config, ExpertFormatSelection) {
  Json j = fixture_json();
  j["expert_dtype"] = "fp8";
  auto r = parse_config_json(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->expert_format, ExpertFormat::kFp8Block);

  j = fixture_json();
  j["expert_dtype"] = "fp4";
  r = parse_config_json(j.dump());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->expert_format, ExpertFormat::kMxfp4);

  j = fixture_json();  // NVFP4 (ModelOpt MIXED_PRECISION, §10.3)
  j["quantization_config"]["quant_algo"] = "MIXED_PRECISION";
  j["quantization_config"]["expert_dtype"] = "fp4";
  j["quantization_config"]["quantized_layers"] = {
      {"layers.0.ffn.experts.0.w1", {{"quant_algo", "NVFP4"}}}};
  r = parse_config_json(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->expert_format, ExpertFormat::kNvfp4);

  j["expert_dtype"] = "fp8";  // contradicts the NVFP4 signal and the nested expert_dtype
  r = parse_config_json(j.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("field \"expert_dtype\""), std::string::npos);
}

TEST(Config, UnknownFieldsAreIgnored) {
  Json j = fixture_json();
  j["n_group"] = 8;
  j["some_future_field"] = {{"nested", {1, 2.5, "x"}}};
  j["rope_scaling"]["mscale"] = 1.0;
  j["quantization_config"]["something"] = nullptr;
  auto r = parse_config_json(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, flash_config(43));
}

TEST(Config, RopeTypeSpellings) {
  Json j = fixture_json();
  j["rope_scaling"].erase("type");
  j["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_TRUE(parse_config_json(j.dump()).ok());
  j["rope_scaling"]["type"] = "yarn";
  EXPECT_TRUE(parse_config_json(j.dump()).ok());
  j["rope_scaling"]["rope_type"] = "linear";
  EXPECT_FALSE(parse_config_json(j.dump()).ok());
}

struct Mutation {
  const char* label;
  std::function<void(Json&)> apply;
  const char* field;     // must appear as `field "<field>"` in the message
  const char* contains;  // and this text too ("" for none)
};

TEST(Config, RefusesEveryWf11Mutation) {
  const std::vector<Mutation> mutations = {
      {"wrong type (string)", [](Json& j) { j["hidden_size"] = "4096"; }, "hidden_size",
       "must be an integer, got a string"},
      {"wrong type (bool)", [](Json& j) { j["num_hidden_layers"] = true; }, "num_hidden_layers",
       "must be an integer"},
      {"wrong type (array)", [](Json& j) { j["rope_theta"] = Json::array({1}); }, "rope_theta",
       "must be a number"},
      {"wrong type (null)", [](Json& j) { j["rope_scaling"] = nullptr; }, "rope_scaling",
       "must be an object"},
      {"wrong type (bool field)", [](Json& j) { j["norm_topk_prob"] = 1; }, "norm_topk_prob",
       "true or false"},
      {"integer with a fraction", [](Json& j) { j["hidden_size"] = 4096.5; }, "hidden_size",
       "must be an integer, got 4096.5"},
      {"integer written as float", [](Json& j) { j["moe_intermediate_size"] = 2048.0; },
       "moe_intermediate_size", "must be an integer"},
      {"zero size", [](Json& j) { j["hidden_size"] = 0; }, "hidden_size", "must be positive"},
      {"negative size", [](Json& j) { j["num_attention_heads"] = -64; }, "num_attention_heads",
       "must be positive"},
      {"zero layers", [](Json& j) { j["num_hidden_layers"] = 0; }, "num_hidden_layers",
       "must be positive"},
      {"negative nextn", [](Json& j) { j["num_nextn_predict_layers"] = -1; },
       "num_nextn_predict_layers", "must not be negative"},
      {"zero window", [](Json& j) { j["sliding_window"] = 0; }, "sliding_window",
       "must be positive"},
      {"zero experts", [](Json& j) { j["n_routed_experts"] = 0; }, "n_routed_experts",
       "must be positive"},
      {"huge experts", [](Json& j) { j["n_routed_experts"] = 100000; }, "n_routed_experts",
       "out of range"},
      {"huge vocab", [](Json& j) { j["vocab_size"] = uint64_t(1) << 40; }, "vocab_size",
       "out of range"},
      {"beyond int64", [](Json& j) { j["vocab_size"] = UINT64_MAX; }, "vocab_size", "out of range"},
      {"compress_ratios short",
       [](Json& j) { j["compress_ratios"].erase(j["compress_ratios"].size() - 1); },
       "compress_ratios",
       "has 43 entries, expected num_hidden_layers + num_nextn_predict_layers = 44"},
      {"compress_ratios long", [](Json& j) { j["compress_ratios"].push_back(0); },
       "compress_ratios", "has 45 entries"},
      {"layers vs ratios", [](Json& j) { j["num_hidden_layers"] = 42; }, "compress_ratios",
       "expected num_hidden_layers + num_nextn_predict_layers = 43"},
      {"bad ratio", [](Json& j) { j["compress_ratios"][5] = 8; }, "compress_ratios",
       "entry 5 is 8"},
      {"ratio 1", [](Json& j) { j["compress_ratios"][0] = 1; }, "compress_ratios", "entry 0 is 1"},
      {"negative ratio", [](Json& j) { j["compress_ratios"][3] = -4; }, "compress_ratios[3]",
       "must not be negative"},
      {"fractional ratio", [](Json& j) { j["compress_ratios"][3] = 4.5; }, "compress_ratios[3]",
       "must be an integer"},
      {"ratios not an array", [](Json& j) { j["compress_ratios"] = 4; }, "compress_ratios",
       "must be an array"},
      {"compressed MTP", [](Json& j) { j["compress_ratios"][43] = 4; }, "compress_ratios",
       "MTP layers are sliding-window only"},
      {"FP8 hidden", [](Json& j) { j["hidden_size"] = 4000; }, "hidden_size",
       "not a multiple of 128"},
      {"FP8 q_lora_rank", [](Json& j) { j["q_lora_rank"] = 1000; }, "q_lora_rank",
       "not a multiple of 128"},
      {"FP8 o_lora_rank", [](Json& j) { j["o_lora_rank"] = 1000; }, "o_lora_rank",
       "not a multiple of 128"},
      {"FP8 head_dim", [](Json& j) { j["head_dim"] = 192; }, "head_dim", "not a multiple of 128"},
      {"FP4 K", [](Json& j) { j["moe_intermediate_size"] = 2000; }, "moe_intermediate_size",
       "not a multiple of 32"},
      {"FP8 expert inter", [](Json& j) { j["moe_intermediate_size"] = 2080; },
       "moe_intermediate_size", "not a multiple of 128"},
      {"nope not multiple of 64", [](Json& j) { j["head_dim"] = 544; }, "head_dim",
       "head_dim - qk_rope_head_dim = 480 is not a multiple of 64"},
      {"rope >= head", [](Json& j) { j["qk_rope_head_dim"] = 512; }, "qk_rope_head_dim",
       "must be smaller than head_dim"},
      {"odd rope", [](Json& j) { j["qk_rope_head_dim"] = 63; }, "qk_rope_head_dim", "must be even"},
      {"index_head_dim not pow2", [](Json& j) { j["index_head_dim"] = 96; }, "index_head_dim",
       "not a power of two"},
      {"bos >= vocab", [](Json& j) { j["bos_token_id"] = 129280; }, "bos_token_id",
       "not below vocab_size = 129280"},
      {"eos >= vocab", [](Json& j) { j["eos_token_id"] = 200000; }, "eos_token_id",
       "not below vocab_size"},
      {"negative eos", [](Json& j) { j["eos_token_id"] = -1; }, "eos_token_id",
       "must not be negative"},
      {"topk > experts", [](Json& j) { j["num_experts_per_tok"] = 300; }, "num_experts_per_tok",
       "larger than n_routed_experts = 256"},
      {"hash > layers", [](Json& j) { j["num_hash_layers"] = 44; }, "num_hash_layers",
       "larger than num_hidden_layers = 43"},
      {"heads % o_groups", [](Json& j) { j["o_groups"] = 7; }, "o_groups",
       "not divisible by o_groups = 7"},
      {"kv heads", [](Json& j) { j["num_key_value_heads"] = 2; }, "num_key_value_heads",
       "not supported"},
      {"eps zero", [](Json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps", "must be positive"},
      {"eps negative", [](Json& j) { j["hc_eps"] = -1e-6; }, "hc_eps", "must be positive"},
      {"factor zero", [](Json& j) { j["rope_scaling"]["factor"] = 0; }, "rope_scaling.factor",
       "must be positive"},
      {"factor negative", [](Json& j) { j["rope_scaling"]["factor"] = -16; }, "rope_scaling.factor",
       "must be positive"},
      {"theta zero", [](Json& j) { j["rope_theta"] = 0.0; }, "rope_theta", "must be positive"},
      {"beta string", [](Json& j) { j["rope_scaling"]["beta_fast"] = "32"; },
       "rope_scaling.beta_fast", "must be a number"},
      {"orig max zero", [](Json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 0; },
       "rope_scaling.original_max_position_embeddings", "must be positive"},
      {"rope type", [](Json& j) { j["rope_scaling"]["type"] = "linear"; }, "rope_scaling.type",
       "not supported"},
      {"rope type missing", [](Json& j) { j["rope_scaling"].erase("type"); }, "rope_scaling.type",
       "missing"},
      {"swiglu zero", [](Json& j) { j["swiglu_limit"] = 0.0; }, "swiglu_limit", "must be positive"},
      {"route scale negative", [](Json& j) { j["routed_scaling_factor"] = -1.5; },
       "routed_scaling_factor", "must be positive"},
      {"hc_mult zero", [](Json& j) { j["hc_mult"] = 0; }, "hc_mult", "must be positive"},
      {"sinkhorn zero", [](Json& j) { j["hc_sinkhorn_iters"] = 0; }, "hc_sinkhorn_iters",
       "must be positive"},
      {"scoring", [](Json& j) { j["scoring_func"] = "softmax"; }, "scoring_func", "not supported"},
      {"topk method", [](Json& j) { j["topk_method"] = "group_limited_greedy"; }, "topk_method",
       "not supported"},
      {"act", [](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act", "not supported"},
      {"dtype", [](Json& j) { j["torch_dtype"] = "float16"; }, "torch_dtype", "not supported"},
      {"tied", [](Json& j) { j["tie_word_embeddings"] = true; }, "tie_word_embeddings",
       "not supported"},
      {"quant method", [](Json& j) { j["quantization_config"]["quant_method"] = "bnb"; },
       "quantization_config.quant_method", "not supported"},
      {"quant fmt", [](Json& j) { j["quantization_config"]["fmt"] = "e5m2"; },
       "quantization_config.fmt", "not supported"},
      {"scale fmt", [](Json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; },
       "quantization_config.scale_fmt", "not supported"},
      {"block size",
       [](Json& j) {
         j["quantization_config"]["weight_block_size"] = {64, 64};
       },
       "quantization_config.weight_block_size", "expected [128, 128]"},
      {"block size len", [](Json& j) { j["quantization_config"]["weight_block_size"] = {128}; },
       "quantization_config.weight_block_size", "two integers"},
      {"block size float",
       [](Json& j) {
         j["quantization_config"]["weight_block_size"] = {128.5, 128};
       },
       "quantization_config.weight_block_size[0]", "must be an integer"},
      {"quant config type", [](Json& j) { j["quantization_config"] = "fp8"; },
       "quantization_config", "must be an object"},
      {"expert dtype", [](Json& j) { j["expert_dtype"] = "fp16"; }, "expert_dtype",
       "not supported"},
      {"expert dtype type", [](Json& j) { j["expert_dtype"] = 4; }, "expert_dtype",
       "must be a string"},
      {"quant algo", [](Json& j) { j["quantization_config"]["quant_algo"] = "W4A16"; },
       "quantization_config.quant_algo", "not supported"},
      {"too many layers x experts",
       [](Json& j) {
         j["num_hidden_layers"] = 1000;
         j["n_routed_experts"] = 4096;
         j["num_hash_layers"] = 0;
         Json r = Json::array();
         for (int i = 0; i < 1001; ++i) r.push_back(0);
         j["compress_ratios"] = r;
       },
       "n_routed_experts", "exceeds the supported"},
  };
  for (const auto& m : mutations) {
    Json j = fixture_json();
    m.apply(j);
    auto r = parse_config_json(j.dump());
    ASSERT_FALSE(r.ok()) << m.label;
    const std::string& msg = r.status().message();
    EXPECT_EQ(msg.rfind("config.json: ", 0), 0u) << m.label << ": " << msg;
    EXPECT_NE(msg.find("field \"" + std::string(m.field) + "\""), std::string::npos)
        << m.label << ": " << msg;
    EXPECT_NE(msg.find(m.contains), std::string::npos) << m.label << ": " << msg;
  }
}

TEST(Config, RefusesEveryMissingRequiredField) {
  const char* required[] = {"vocab_size",
                            "hidden_size",
                            "num_hidden_layers",
                            "num_nextn_predict_layers",
                            "num_attention_heads",
                            "num_key_value_heads",
                            "head_dim",
                            "qk_rope_head_dim",
                            "q_lora_rank",
                            "o_groups",
                            "o_lora_rank",
                            "sliding_window",
                            "compress_ratios",
                            "compress_rope_theta",
                            "rope_theta",
                            "rope_scaling",
                            "max_position_embeddings",
                            "index_n_heads",
                            "index_head_dim",
                            "index_topk",
                            "n_routed_experts",
                            "num_experts_per_tok",
                            "n_shared_experts",
                            "moe_intermediate_size",
                            "routed_scaling_factor",
                            "num_hash_layers",
                            "swiglu_limit",
                            "hc_mult",
                            "hc_sinkhorn_iters",
                            "hc_eps",
                            "rms_norm_eps",
                            "bos_token_id",
                            "eos_token_id",
                            "quantization_config"};
  for (const char* key : required) {
    Json j = fixture_json();
    ASSERT_TRUE(j.contains(key)) << key;
    j.erase(key);
    auto r = parse_config_json(j.dump());
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.status().message(),
              std::string("config.json: field \"") + key + "\": missing (required)");
  }
  const char* nested[][2] = {{"rope_scaling", "factor"},
                             {"rope_scaling", "original_max_position_embeddings"},
                             {"rope_scaling", "beta_fast"},
                             {"rope_scaling", "beta_slow"},
                             {"quantization_config", "quant_method"},
                             {"quantization_config", "fmt"},
                             {"quantization_config", "scale_fmt"},
                             {"quantization_config", "weight_block_size"},
                             {"quantization_config", "activation_scheme"}};
  for (const auto& kv : nested) {
    Json j = fixture_json();
    j[kv[0]].erase(kv[1]);
    auto r = parse_config_json(j.dump());
    ASSERT_FALSE(r.ok()) << kv[1];
    EXPECT_NE(
        r.status().message().find(std::string("field \"") + kv[0] + "." + kv[1] + "\": missing"),
        std::string::npos)
        << r.status().message();
  }
  // Fields that only restate the implemented variant may be omitted (the §14 JSON omits them).
  for (const char* key : {"scoring_func", "topk_method", "norm_topk_prob", "hidden_act",
                          "tie_word_embeddings", "torch_dtype"}) {
    Json j = fixture_json();
    j.erase(key);
    auto r = parse_config_json(j.dump());
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().to_string();
    EXPECT_EQ(*r, flash_config(43)) << key;
  }
}

TEST(Config, RefusesMalformedDocuments) {
  for (const char* text : {"", "[]", "42", "{", "{\"vocab_size\": 1, \"vocab_size\": 2}",
                           "{\"hidden_size\": 1e999}", "\xff"}) {
    auto r = parse_config_json(text);
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().message().rfind("config.json: ", 0), 0u) << r.status().message();
  }
  // A float that overflows double is refused as non-finite or as invalid JSON, never accepted.
  Json j = fixture_json();
  std::string text = j.dump();
  const std::string key = "\"rms_norm_eps\":1e-06";
  auto pos = text.find(key);
  ASSERT_NE(pos, std::string::npos) << text;
  text.replace(pos, key.size(), "\"rms_norm_eps\":1e999");
  auto r = parse_config_json(text);
  EXPECT_FALSE(r.ok());
}

TEST(Config, ValidateCatchesHandBuiltMistakes) {
  DeepSeekV4Config c = flash_config(43);
  c.compress_ratios.pop_back();
  Status s = validate_config(c, "preset");
  EXPECT_EQ(s.message(),
            "preset: field \"compress_ratios\": has 43 entries, expected num_hidden_layers + "
            "num_nextn_predict_layers = 44");
  c = tiny_config();
  c.rms_norm_eps = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(validate_config(c).message().find("field \"rms_norm_eps\": must be a finite number"),
            std::string::npos);
  c = tiny_config();
  c.scoring_func = "softmax";
  EXPECT_FALSE(validate_config(c).ok());
}

TEST(Config, LoadConfigFileErrors) {
  auto r = load_config_file("/nonexistent/deepserve/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  auto ok = load_config_file(kFixtureDir + "/config.json");
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

}  // namespace
}  // namespace ds
