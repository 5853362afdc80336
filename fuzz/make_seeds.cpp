// fuzz_make_seeds: writes the generated seed inputs of the fuzz targets into a corpus root
// (`fuzz_make_seeds fuzz/corpus`): valid files made with the project's own writers (so the seeds
// follow the formats as the code evolves) plus broken variants, one per rule family of
// reliability.md §3 and §4.2 (names start with `bad_`). Seeds that are hand-written or that
// reproduce past crashes live next to them and are never overwritten by name collisions here.
// Every seed stays well under the 64 KB budget of fuzz/README.md.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "model/config.h"
#include "model/safetensors_writer.h"
#include "tokenizer/byte_level.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

fs::path g_root;

void put(const std::string& target, const std::string& name, std::string_view bytes) {
  fs::create_directories(g_root / target);
  DS_FUZZ_CHECK(bytes.size() < 64 * 1024, "seed too large: " + name);
  ds::fuzz::write_file((g_root / target / name).string(), bytes);
}

std::string read_back(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  DS_FUZZ_CHECK(f != nullptr, path);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A raw safetensors file: 8-byte length (of `header` unless given), header, `data_bytes` bytes.
std::string raw(std::string_view header, size_t data_bytes, int64_t length_field = -1) {
  std::string s = le64(length_field >= 0 ? uint64_t(length_field) : header.size());
  s += header;
  for (size_t i = 0; i < data_bytes; ++i) s += static_cast<char>(i * 7 + 1);
  return s;
}

void safetensors_seeds() {
  const std::string t = "fuzz_safetensors_header";
  ds::SafetensorsWriter w;
  std::vector<uint8_t> a(2 * 3 * 2, 0x11), b(4 * 4, 0x22), c(3, 0x33), e(8, 0x7F);
  DS_FUZZ_CHECK(w.set_metadata("format", "pt").ok(), "metadata");
  DS_FUZZ_CHECK(w.add("embed.weight", ds::DType::kBF16, {2, 3}, a).ok(), "add");
  DS_FUZZ_CHECK(w.add("layers.0.attn.wq_a.weight", ds::DType::kF32, {4}, b).ok(), "add");
  DS_FUZZ_CHECK(w.add("layers.0.ffn.experts.0.w1.weight", ds::DType::kI8, {3}, c).ok(), "add");
  DS_FUZZ_CHECK(w.add("layers.0.attn.wq_a.scale", ds::DType::kF8E8M0, {2, 4}, e).ok(), "add");
  const std::string tmp = ds::fuzz::scratch_dir() + "/seed.safetensors";
  DS_FUZZ_CHECK(w.write(tmp).ok(), "write");
  put(t, "valid_writer", read_back(tmp));
  const std::string h1 =
      R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"y":{"dtype":"U8","shape":[],"data_offsets":[4,5]}})";
  put(t, "valid_unaligned_header", raw(h1, 5));
  put(t, "valid_metadata_only_tensor",
      raw(R"({"__metadata__":{"a":"b"},"t":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]}})",
          8));
  put(t, "valid_padded",
      raw(std::string(R"({"t":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})") + "      ",
          4));
  // Broken: framing.
  put(t, "bad_short", std::string("\x05\0\0", 3));
  put(t, "bad_n_zero", raw("", 0));
  put(t, "bad_n_past_eof", raw(h1, 5, 4096));
  put(t, "bad_n_huge", raw(h1, 5, int64_t(0x7FFFFFFFFFFFFFF0)));
  // Header text.
  put(t, "bad_not_brace", raw(R"( {"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
  put(t, "bad_trailing", raw(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}x)", 1));
  put(t, "bad_dup_key",
      raw(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
          2));
  put(t, "bad_utf8",
      raw("{\"\xC0\xAF\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1));
  put(t, "bad_depth", raw(R"({"x":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", 1));
  put(t, "bad_rank9",
      raw(R"({"x":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1));
  put(t, "bad_metadata_number",
      raw(R"({"__metadata__":{"a":1},"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
  put(t, "bad_tensor_named_metadata",
      raw(R"({"__metadata__":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
  // Entry keys and numbers.
  put(t, "bad_unknown_key",
      raw(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"k":0}})", 1));
  put(t, "bad_unknown_dtype", raw(R"({"x":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", 1));
  put(t, "bad_negative_dim", raw(R"({"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1));
  put(t, "bad_float_dim", raw(R"({"x":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1));
  put(t, "bad_exponent_dim", raw(R"({"x":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}})", 1));
  put(t, "bad_offsets_len3", raw(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}})", 1));
  // Arithmetic and layout.
  put(t, "bad_numel_overflow",
      raw(R"({"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", 1));
  put(t, "bad_nbytes_overflow",
      raw(R"({"x":{"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,1]}})", 1));
  put(t, "bad_end_before_begin",
      raw(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", 1));
  put(t, "bad_size_mismatch", raw(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}})", 1));
  put(t, "bad_gap",
      raw(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"y":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
          3));
  put(t, "bad_overlap",
      raw(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
          3));
  put(t, "bad_shared_offsets",
      raw(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
          1));
  put(t, "bad_zero_element",
      raw(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
          1));
  put(t, "bad_short_data", raw(h1, 4));
  put(t, "bad_appended", raw(h1, 6));
}

void shard_index_seeds() {
  const std::string t = "fuzz_shard_index";
  auto index = [](const ordered_json& map) {
    ordered_json j;
    j["metadata"] = {{"total_size", 24}};
    j["weight_map"] = map;
    return j.dump(2);
  };
  const std::string s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  put(t, "valid_two_shards", index({{"a", s1}, {"b", s1}, {"c", s2}}));
  put(t, "valid_one_shard_subset", index({{"a", s1}, {"b", s1}}));
  put(t, "bad_not_object", "[]");
  put(t, "bad_value_not_string", index({{"a", 1}, {"b", s1}}));
  put(t, "bad_missing_shard", index({{"a", "model-00009-of-00009.safetensors"}}));
  put(t, "bad_dotdot", index({{"o", "../outside.safetensors"}}));
  put(t, "bad_absolute", index({{"a", "/etc/passwd"}}));
  put(t, "bad_separator", index({{"s", "sub/model.safetensors"}}));
  put(t, "bad_symlink_escape", index({{"o", "link.safetensors"}}));
  put(t, "bad_tensor_in_two_shards", index({{"a", "dup.safetensors"}, {"b", s1}}));
  put(t, "bad_missing_from_map", index({{"a", s1}}));
  put(t, "bad_entry_not_in_shard", index({{"a", s1}, {"b", s1}, {"z", s1}}));
  put(t, "bad_not_safetensors", index({{"n", "notes.safetensors"}}));
  put(t, "bad_no_weight_map", R"({"metadata":{}})");
  put(t, "bad_dup_key", R"({"weight_map":{"a":"x","a":"y"}})");
}

void config_seeds() {
  const std::string t = "fuzz_config_json";
  put(t, "valid_tiny", ds::to_config_json(ds::tiny_config()));
  put(t, "valid_flash_4_layers", ds::to_config_json(ds::flash_config(4)));
  ds::DeepSeekV4Config fp8 = ds::tiny_config();
  fp8.expert_format = ds::ExpertFormat::kFp8Block;
  put(t, "valid_tiny_fp8_experts", ds::to_config_json(fp8));
  ds::DeepSeekV4Config nvfp4 = ds::tiny_config();
  nvfp4.expert_format = ds::ExpertFormat::kNvfp4;
  put(t, "valid_tiny_nvfp4", ds::to_config_json(nvfp4));
  auto mutate = [&](const std::string& name, auto&& edit) {
    ordered_json j = ordered_json::parse(ds::to_config_json(ds::tiny_config()));
    edit(j);
    put(t, name, j.dump(2));
  };
  mutate("bad_ratios_length", [](ordered_json& j) { j["compress_ratios"].push_back(0); });
  mutate("bad_ratio_value", [](ordered_json& j) { j["compress_ratios"][0] = 3; });
  mutate("bad_layers_fraction", [](ordered_json& j) { j["num_hidden_layers"] = 2.5; });
  mutate("bad_negative_vocab", [](ordered_json& j) { j["vocab_size"] = -1; });
  mutate("bad_kv_heads", [](ordered_json& j) { j["num_key_value_heads"] = 2; });
  mutate("bad_topk_above_experts", [](ordered_json& j) { j["num_experts_per_tok"] = 100000; });
  mutate("bad_string_type", [](ordered_json& j) { j["hidden_size"] = "4096"; });
  mutate("bad_rope_type", [](ordered_json& j) { j["rope_scaling"]["type"] = "linear"; });
  mutate("bad_missing_hidden", [](ordered_json& j) { j.erase("hidden_size"); });
  mutate("bad_huge_experts", [](ordered_json& j) { j["n_routed_experts"] = 1 << 20; });
  put(t, "bad_not_object", "42");
  put(t, "bad_empty", "");
}

void json_seeds() {
  const std::string t = "fuzz_json_strict";
  const char* seeds[][2] = {
      {"valid_object", R"({"a":[1,-2,3.5,1e3,true,false,null],"b":{"c":"d\u00e9\ud83d\ude00"}})"},
      {"valid_scalar", " 18446744073709551615 "},
      {"valid_nested", "[[[[[[[[[[{}]]]]]]]]]]"},
      {"valid_escapes", R"(["\"\\\/\b\f\n\r\t\u0000"])"},
      {"valid_utf8", "[\"\xE2\x82\xAC\xF0\x9F\x99\x82\xEF\xBD\x9C\"]"},
      {"bad_dup_key", R"({"a":1,"a":2})"},
      {"bad_nested_dup", R"([{"x":{"k":1,"k":1}}])"},
      {"bad_trailing", "{} x"},
      {"bad_two_values", "1 2"},
      {"bad_nan", "[NaN]"},
      {"bad_infinity", "[Infinity, -Infinity]"},
      {"bad_lone_surrogate", R"(["\ud800"])"},
      {"bad_overlong", "[\"\xC0\xAF\"]"},
      {"bad_surrogate_bytes", "[\"\xED\xA0\x80\"]"},
      {"bad_comment", "[1 /* c */]"},
      {"bad_trailing_comma", "[1,]"},
      {"edge_huge_exponent", "[1e400, -1e400, 1e-400]"},
      {"edge_big_integer", "[18446744073709551616, -9223372036854775809]"},
      {"edge_negative_zero", "[-0, -0.0]"},
  };
  for (const auto& s : seeds) put(t, s[0], s[1]);
  put(t, "bad_nul", std::string("{}\0garbage", 10));
  put(t, "bad_deep", std::string(100, '[') + std::string(100, ']'));
}

ordered_json mini_tokenizer() {
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b)
    vocab[ds::tok::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}};
  ordered_json m = ordered_json::array();
  int id = 256;
  for (const auto& [x, y] : merges) {
    vocab[x + y] = id++;
    m.push_back(x + " " + y);
  }
  auto added = [](int i, const char* content, bool special) {
    return ordered_json{{"id", i},           {"content", content}, {"single_word", false},
                        {"lstrip", false},   {"rstrip", false},    {"normalized", false},
                        {"special", special}};
  };
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = ordered_json::array(
      {added(300, "<sp>", true), added(301, "<think>", false), added(302, "</think>", false)});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", "\\p{N}{1,3}"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "Split"},
                           {"pattern", {{"Regex", "\\s+|\\w+|[^\\s\\w]+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}}}}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", m}};
  return j;
}

void tokenizer_seeds() {
  const std::string t = "fuzz_tokenizer_json";
  put(t, "valid_mini", mini_tokenizer().dump());
  auto mutate = [&](const std::string& name, auto&& edit) {
    ordered_json j = mini_tokenizer();
    edit(j);
    put(t, name, j.dump());
  };
  mutate("valid_merges_arrays", [](ordered_json& j) {
    ordered_json m = ordered_json::array();
    for (const auto& s : j["model"]["merges"]) {
      std::string str = s.get<std::string>();
      m.push_back({str.substr(0, str.find(' ')), str.substr(str.find(' ') + 1)});
    }
    j["model"]["merges"] = m;
  });
  mutate("valid_strip_flags", [](ordered_json& j) {
    j["added_tokens"][0]["lstrip"] = true;
    j["added_tokens"][0]["rstrip"] = true;
    j["added_tokens"][1]["single_word"] = true;
  });
  for (const char* behavior : {"Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"}) {
    mutate(std::string("valid_split_") + behavior, [&](ordered_json& j) {
      j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"},
                                                {"pattern", {{"String", "-"}}},
                                                {"behavior", behavior},
                                                {"invert", true}};
    });
  }
  mutate("valid_decoder_sequence", [](ordered_json& j) {
    j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteLevel"}}}}};
  });
  mutate("bad_model_type", [](ordered_json& j) { j["model"]["type"] = "WordPiece"; });
  mutate("bad_duplicate_id", [](ordered_json& j) { j["model"]["vocab"]["hello"] = 5; });
  mutate("bad_id_gap", [](ordered_json& j) { j["model"]["vocab"]["hello"] = 9999; });
  mutate("bad_merge_unknown", [](ordered_json& j) { j["model"]["merges"].push_back("zz qq"); });
  mutate("bad_merge_result_missing",
         [](ordered_json& j) { j["model"]["merges"].push_back("a b"); });
  mutate("bad_missing_byte", [](ordered_json& j) { j["model"]["vocab"].erase("a"); });
  mutate("bad_regex", [](ordered_json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  });
  mutate("bad_added_id_conflict", [](ordered_json& j) { j["added_tokens"][0]["id"] = 104; });
  mutate("bad_added_empty", [](ordered_json& j) { j["added_tokens"][0]["content"] = ""; });
  mutate("bad_added_flag_type", [](ordered_json& j) { j["added_tokens"][0]["special"] = 1; });
  mutate("bad_normalizer", [](ordered_json& j) { j["normalizer"] = {{"type", "NFKC"}}; });
  mutate("bad_prefix_space", [](ordered_json& j) {
    j["pre_tokenizer"]["pretokenizers"][2]["add_prefix_space"] = true;
  });
  put(t, "bad_not_json", "{\"model\":");
}

void text_seeds() {
  const std::string bpe = "fuzz_bpe_roundtrip";
  const char* texts[][2] = {
      {"english", "The quick brown fox jumps over the lazy dog. It's 12345 o'clock!"},
      {"code", "int main(void) {\n    return printf(\"%d\\n\", 42);\n}\n"},
      {"cjk",
       "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82"
       "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF"},
      {"emoji_zwj",
       "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7"},
      {"rtl",
       "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xE2\x80\x8F"},
      {"special_strings",
       "<\xEF\xBD\x9CUser\xEF\xBD\x9C>hi<\xEF\xBD\x9C"
       "Assistant\xEF\xBD\x9C>"
       "<think>r</think>\n\n<\xEF\xBD\x9C"
       "DSML\xEF\xBD\x9Ctool_calls>"},
      {"bos_eos",
       "<\xEF\xBD\x9C"
       "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>x"
       "<\xEF\xBD\x9C"
       "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"},
      {"whitespace", "  \t\t\n\n\n   a  \r\n\xC2\xA0\xE3\x80\x80 "},
      {"numbers", "3.14159 1,000,000 0x1F 2026-11-29 \xD9\xA1\xD9\xA2\xD9\xA3"},
      {"max_codepoints", "\xF4\x8F\xBF\xBF\xEF\xBF\xBF\xEF\xBF\xBD\xC2\x80"},
  };
  for (const auto& s : texts) put(bpe, s[0], s[1]);
  put(bpe, "nul_bytes", std::string("a\0b\0\0c", 6));
  put(bpe, "skip_invalid_utf8", "ok \xC0\xAF \xED\xA0\x80 \xF8");

  const std::string out = "fuzz_output_parser";
  auto parser_seed = [&](const std::string& name, bool thinking, std::vector<uint8_t> cuts,
                         std::string_view text) {
    std::string s(1, static_cast<char>((thinking ? 1 : 0) | (cuts.size() << 1)));
    for (uint8_t c : cuts) s += static_cast<char>(c);
    s += text;
    put(out, name, s);
  };
  const std::string dsml =
      "\xEF\xBD\x9C"
      "DSML\xEF\xBD\x9C";
  const std::string call = "\n\n<" + dsml + "tool_calls>\n<" + dsml +
                           "invoke name=\"get_weather\">\n<" + dsml +
                           "parameter name=\"city\" string=\"true\">Paris</" + dsml +
                           "parameter>\n<" + dsml + "parameter name=\"days\" string=\"false\">3</" +
                           dsml + "parameter>\n</" + dsml + "invoke>\n</" + dsml + "tool_calls>";
  parser_seed("thinking_plain", true, {3, 9, 14}, "Let me think.</think>The answer is 4.");
  parser_seed("chat_plain", false, {1, 2}, "Hello <think> is not a marker here </think>");
  parser_seed("thinking_tool_call", true, {5, 20, 40, 60, 80}, "plan</think>Calling." + call);
  parser_seed("chat_tool_call", false, {7, 33}, "ok" + call);
  parser_seed("malformed_invoke", false, {10},
              "x\n\n<" + dsml + "tool_calls>\n<" + dsml + "invoke>oops</" + dsml + "invoke>");
  parser_seed("unclosed_block", true, {},
              "r</think>\n\n<" + dsml + "tool_calls>\n<" + dsml + "inv");
  parser_seed("partial_markers", true, {2, 4, 6}, "</thin</think>\n\n<" + dsml + "tool_c\n");
  parser_seed("text_after_calls", false, {}, "a" + call + "  \n more text");
  parser_seed("invalid_json_arg", false, {30},
              "\n\n<" + dsml + "tool_calls>\n<" + dsml + "invoke name=\"f\">\n<" + dsml +
                  "parameter name=\"x\" string=\"false\">{not json</" + dsml + "parameter>\n</" +
                  dsml + "invoke>\n</" + dsml + "tool_calls>");
}

void stream_seeds() {
  const std::string t = "fuzz_stream_decoder";
  auto ids = [](std::vector<uint16_t> v) {
    std::string s;
    for (uint16_t x : v) s += static_cast<char>(x & 0xFF), s += static_cast<char>(x >> 8);
    return s;
  };
  // Low ids: byte tokens and common words; high values: the added tokens and holes near the top
  // of the id space (see the mapping in fuzz_stream_decoder.cpp).
  put(t, "low_ids", ids({0, 1, 100, 200, 300, 1000, 5000, 20000, 32767}));
  put(t, "top_of_space", ids({0x8000, 0x8001, 0x800F, 0x8010, 0x8011, 0x8015, 0x801E, 0x8020}));
  put(t, "negative_and_odd", ids({0xFFFF, 65, 0xFFFF}) + "\x01");
  std::string bytes_run;
  for (uint16_t id = 100; id < 260; ++id) bytes_run += ids({id});
  put(t, "byte_tokens", bytes_run);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (e.g. fuzz/corpus)\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  safetensors_seeds();
  shard_index_seeds();
  config_seeds();
  json_seeds();
  tokenizer_seeds();
  text_seeds();
  stream_seeds();
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
