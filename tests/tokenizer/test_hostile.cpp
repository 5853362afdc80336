// Hostile input (TK2/TK4, reliability.md §4.2): invalid UTF-8, NUL bytes, a 10 MB string,
// 100,000 special tokens, 1 MB of one character. Each gets a clear result in bounded time; the
// suite also runs under AddressSanitizer (label asan).
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>

#include "tokenizer/chat_encoding.h"
#include "tokenizer/test_util.h"

namespace ds::tok {
namespace {

// Under AddressSanitizer the ratio measures the sanitizer's allocator, not the algorithm; the
// sanitizer run still executes every input for memory safety.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kTimingIsMeaningful = false;
#else
constexpr bool kTimingIsMeaningful = true;
#endif

double seconds_to_encode(const Tokenizer& t, const std::string& s, size_t* n_ids) {
  auto start = std::chrono::steady_clock::now();
  auto r = t.encode(s);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  *n_ids = r.ok() ? r->size() : 0;
  return secs;
}

TEST(Hostile, InvalidUtf8IsRefused) {
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  for (std::string bad : {std::string("\xFF"), std::string("ab\xC3"), std::string("\xED\xA0\x80"),
                          std::string("\xC0\xAF"), std::string("ok\xF4\x90\x80\x80")}) {
    auto r = t->encode(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(t->encode(bad, EncodeOptions{.parse_special = false}).ok());
  }
}

TEST(Hostile, NulBytesRoundTrip) {
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  const std::string s("a\0b\0\0<think>\0", 13);
  auto r = t->encode(s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(t->decode(*r), s);
}

TEST(Hostile, TenMegabyteString) {
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  std::string s;
  const std::string chunk = "The quick brown fox 1234567 jumps over 你好世界 😀 the lazy dog.\n\t  ";
  while (s.size() < (10u << 20)) s += chunk;
  size_t n = 0;
  double secs = seconds_to_encode(*t, s, &n);
  EXPECT_GT(n, s.size() / 8);
  EXPECT_LT(secs, 60.0);
  std::printf("10 MB mixed text: %.2f s, %zu ids\n", secs, n);
  // The byte cap gives a clear error instead.
  EncodeOptions capped;
  capped.max_input_bytes = 1 << 20;
  auto r = t->encode(s, capped);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(Hostile, HundredThousandSpecialTokens) {
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  std::string s;
  for (int i = 0; i < 100000; ++i) s += i % 2 ? "<｜User｜>" : "<think>";
  size_t n = 0;
  double secs = seconds_to_encode(*t, s, &n);
  EXPECT_EQ(n, 100000u);
  EXPECT_LT(secs, 10.0);
  // As client text inside a chat: plain text, no added ids (TK3), still bounded.
  ChatMessage m;
  m.role = "user";
  m.content = s;
  auto ids = encode_chat(*t, {m}, ChatEncodeOptions{});
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  size_t added = 0;
  for (TokenId id : *ids) added += id >= 128000 || id <= 1;
  EXPECT_EQ(added, 4u);  // BOS, <｜User｜>, <｜Assistant｜>, <think>
}

TEST(Hostile, OneCharacterRunsScaleLinearly) {
  // TK4: 1 MB of one character takes about 10x the 100 KB case (not 100x).
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  for (const std::string unit : {"a", " ", "7", "你"}) {
    std::string small, big;
    while (small.size() < 100'000) small += unit;
    while (big.size() < 1'000'000) big += unit;
    size_t n_small = 0, n_big = 0;
    // Best of three runs each: one slow run on a loaded machine must not decide the ratio.
    double t_small = 1e9, t_big = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      t_small = std::min(t_small, seconds_to_encode(*t, small, &n_small));
      t_big = std::min(t_big, seconds_to_encode(*t, big, &n_big));
    }
    if (kTimingIsMeaningful) {
      EXPECT_LT(t_big, 30 * t_small + 0.05) << "unit " << unit;
      EXPECT_LT(t_big, 20.0);
    }
    std::string back = t->decode(t->encode(big).value());
    EXPECT_EQ(back, big);
  }
}

TEST(Hostile, DeadlineStopsLongEncodes) {
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  std::string s;
  for (int i = 0; i < 400000; ++i) s += "w" + std::to_string(i) + " ";
  EncodeOptions o;
  o.deadline_ms = 1;
  auto r = t->encode(s, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ds::tok
