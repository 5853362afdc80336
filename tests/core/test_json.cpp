// Strict JSON parser: duplicate keys, depth and size limits, UTF-8, number classification.
#include <gtest/gtest.h>

#include <string>

#include "core/json.h"

namespace ds {
namespace {

Result<Json> parse(std::string_view s, JsonLimits lim = {}) {
  return parse_json_strict(s, lim, "test");
}

TEST(JsonStrict, ParsesAndClassifiesNumbers) {
  auto r = parse(R"({"a": 1, "b": -1, "c": 1.5, "d": 1e3, "e": 18446744073709551615,
                     "f": 18446744073709551616, "g": [true, null, "x"]})");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Json& j = *r;
  EXPECT_TRUE(j["a"].is_number_unsigned());
  EXPECT_TRUE(j["b"].is_number_integer() && !j["b"].is_number_unsigned());
  EXPECT_TRUE(j["c"].is_number_float());
  EXPECT_TRUE(j["d"].is_number_float());
  EXPECT_TRUE(j["e"].is_number_unsigned());
  EXPECT_TRUE(j["f"].is_number_float());  // does not fit u64
  EXPECT_EQ(j["g"].size(), 3u);
  auto u = json_get_u64(j, "a", "test");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(*u, 1u);
  EXPECT_FALSE(json_get_u64(j, "b", "test").ok());
  EXPECT_FALSE(json_get_u64(j, "c", "test").ok());
  EXPECT_FALSE(json_get_u64(j, "d", "test").ok());
  EXPECT_NE(json_get_u64(j, "zz", "test").status().message().find("missing field \"zz\""),
            std::string::npos);
}

TEST(JsonStrict, RejectsDuplicateKeysAtAnyDepth) {
  auto r = parse(R"({"a": 1, "a": 2})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate key \"a\""), std::string::npos);
  EXPECT_FALSE(parse(R"({"x": {"a": 1, "b": 2, "a": 3}})").ok());
  EXPECT_TRUE(parse(R"({"x": {"a": 1}, "y": {"a": 1}})").ok());  // same key, different objects
}

TEST(JsonStrict, RejectsDeepNestingWithoutRecursion) {
  std::string deep(100000, '[');
  auto r = parse(deep);
  ASSERT_FALSE(r.ok());
  JsonLimits lim;
  lim.max_depth = 3;
  EXPECT_TRUE(parse(R"({"a": {"b": [1]}})", lim).ok());
  auto r2 = parse(R"({"a": {"b": [[1]]}})", lim);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("deeper"), std::string::npos);
}

TEST(JsonStrict, RejectsBadTextAndTrailingBytes) {
  EXPECT_FALSE(parse("").ok());
  EXPECT_FALSE(parse("{} x").ok());
  EXPECT_TRUE(parse("{}   \n\t ").ok());
  EXPECT_FALSE(parse(R"({"a": NaN})").ok());
  EXPECT_FALSE(parse(R"({"a": Infinity})").ok());
  EXPECT_FALSE(parse("{\"a\": \"\xC0\xAF\"}").ok());       // overlong
  EXPECT_FALSE(parse("{\"a\": \"\xED\xA0\x80\"}").ok());   // surrogate
  EXPECT_FALSE(parse(R"({"a": "\ud800"})").ok());          // lone surrogate escape
  EXPECT_FALSE(parse("{\"a\": 1,}").ok());
  EXPECT_TRUE(parse("{\"a\": \"\xE2\x82\xAC\"}").ok());    // euro sign
  EXPECT_FALSE(parse(std::string_view("{\"a\":1}\0garbage{[", 18)).ok());  // NUL stops the parser
  EXPECT_FALSE(parse(std::string_view("{\"a\":\"x\0y\"}", 11)).ok());
}

TEST(JsonStrict, BoundsValueCountAndStringSize) {
  JsonLimits lim;
  lim.max_values = 4;
  EXPECT_TRUE(parse("[1,2,3]", lim).ok());
  EXPECT_FALSE(parse("[1,2,3,4]", lim).ok());
  lim = {};
  lim.max_string_bytes = 4;
  EXPECT_TRUE(parse(R"(["abcd"])", lim).ok());
  EXPECT_FALSE(parse(R"(["abcde"])", lim).ok());
  EXPECT_FALSE(parse(R"({"abcde": 1})", lim).ok());
}

TEST(Utf8, Validator) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("\xF0\x9F\x98\x80"));  // emoji
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE0\x80\x80"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xC3"));              // truncated
  EXPECT_FALSE(is_valid_utf8("\x80"));              // stray continuation
}

}  // namespace
}  // namespace ds
