// Incremental output parser tests (ST11): reasoning/content split and DSML tool calls give the same
// result whatever the split points of the text, markers never leak into reasoning or content, and
// malformed markup is returned as text with an error, never a crash.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/output_parser.h"
#include "tokenizer/utf8_util.h"

namespace ds::tok {
namespace {

struct Collected {
  std::string reasoning, content, error;
  std::vector<ParsedToolCall> calls;
  void add(const OutputDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    if (!d.error.empty()) error += d.error + ";";
    calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  }
};

// Splits `text` at character boundaries `cuts` (byte offsets) and parses the pieces.
Collected parse_pieces(ThinkingMode mode, std::string_view text, const std::vector<size_t>& cuts) {
  OutputParser p(mode);
  Collected c;
  size_t prev = 0;
  for (size_t cut : cuts) {
    c.add(p.push(text.substr(prev, cut - prev)));
    prev = cut;
  }
  c.add(p.push(text.substr(prev)));
  c.add(p.finish());
  return c;
}

std::vector<size_t> char_boundaries(std::string_view s) {
  std::vector<size_t> b;
  for (size_t i = 1; i < s.size(); ++i)
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) b.push_back(i);
  return b;
}

void expect_same(const Collected& a, const Collected& b, const std::string& where) {
  EXPECT_EQ(a.reasoning, b.reasoning) << where;
  EXPECT_EQ(a.content, b.content) << where;
  EXPECT_EQ(a.error.empty(), b.error.empty()) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// Every single split point, then one character at a time: all equal the one-shot parse.
Collected check_all_splits(ThinkingMode mode, const std::string& text) {
  Collected whole = parse_pieces(mode, text, {});
  auto bounds = char_boundaries(text);
  for (size_t cut : bounds)
    expect_same(whole, parse_pieces(mode, text, {cut}), "cut at " + std::to_string(cut));
  expect_same(whole, parse_pieces(mode, text, bounds), "one character at a time");
  // Every pair of split points for short texts.
  if (bounds.size() < 120)
    for (size_t i = 0; i < bounds.size(); ++i)
      for (size_t j = i + 1; j < bounds.size(); ++j)
        expect_same(whole, parse_pieces(mode, text, {bounds[i], bounds[j]}), "two cuts");
  return whole;
}

const std::string kCall =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
    "name=\"city\" string=\"true\">Paris \"Île\"</｜DSML｜parameter>\n<｜DSML｜parameter "
    "name=\"days\" "
    "string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"noop\">\n\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

TEST(OutputParser, ThinkingSplitsReasoningFromContent) {
  auto c =
      check_all_splits(ThinkingMode::kThinking, "Let me think: 2+2 < 5.</think>The answer is 4.");
  EXPECT_EQ(c.reasoning, "Let me think: 2+2 < 5.");
  EXPECT_EQ(c.content, "The answer is 4.");
  EXPECT_TRUE(c.calls.empty());
  EXPECT_TRUE(c.error.empty());
}

TEST(OutputParser, ChatModeIsAllContent) {
  auto c = check_all_splits(ThinkingMode::kChat, "Line one\n\nLine <two> 你好\n\n");
  EXPECT_EQ(c.reasoning, "");
  EXPECT_EQ(c.content, "Line one\n\nLine <two> 你好\n\n");
}

TEST(OutputParser, ToolCalls) {
  auto c = check_all_splits(ThinkingMode::kThinking, "Need weather.</think>Checking." + kCall);
  EXPECT_EQ(c.reasoning, "Need weather.");
  EXPECT_EQ(c.content, "Checking.");
  ASSERT_EQ(c.calls.size(), 2u);
  EXPECT_EQ(c.calls[0].name, "get_weather");
  EXPECT_EQ(c.calls[0].arguments, "{\"city\": \"Paris \\\"Île\\\"\", \"days\": 3}");
  EXPECT_EQ(c.calls[1].name, "noop");
  EXPECT_EQ(c.calls[1].arguments, "{}");
  EXPECT_TRUE(c.error.empty()) << c.error;
  auto chat = check_all_splits(ThinkingMode::kChat, kCall);
  EXPECT_EQ(chat.content, "");
  EXPECT_EQ(chat.calls.size(), 2u);
}

TEST(OutputParser, MarkersNeverLeak) {
  const std::string text = "r</think>c" + kCall;
  auto bounds = char_boundaries(text);
  for (size_t cut : bounds) {
    OutputParser p(ThinkingMode::kThinking);
    OutputDelta a = p.push(text.substr(0, cut));
    for (const std::string* s : {&a.reasoning, &a.content}) {
      EXPECT_EQ(s->find('<'), std::string::npos) << "cut " << cut << ": " << *s;
      EXPECT_EQ(s->find("｜"), std::string::npos) << "cut " << cut;
    }
  }
}

TEST(OutputParser, MalformedToolCallsBecomeTextWithAnError) {
  const std::vector<std::string> bad = {
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke "
      "name=\"x\">garbage</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"true\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" "
      "string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\n",  // never closed
      "<｜DSML｜tool_calls>\nstray text\n</｜DSML｜tool_calls>",
  };
  for (const auto& b : bad) {
    auto c = check_all_splits(ThinkingMode::kChat, "Answer." + b);
    EXPECT_FALSE(c.error.empty()) << b;
    EXPECT_TRUE(c.calls.empty()) << b;
    EXPECT_NE(c.content.find("Answer."), std::string::npos);
  }
  // Non-JSON string="false" values are kept as JSON strings.
  auto c =
      parse_pieces(ThinkingMode::kChat,
                   "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\n<｜DSML｜parameter "
                   "name=\"a\" string=\"false\">not json</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                   "</｜DSML｜tool_calls>",
                   {});
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].arguments, "{\"a\": \"not json\"}");
  // A NUL byte makes a value non-JSON even when its prefix parses (`1\0junk`; found by fuzzing):
  // it is kept as an escaped JSON string, so the arguments stay valid JSON.
  const std::string with_nul = std::string(
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"false\">1") + '\0' + "junk</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  auto n = parse_pieces(ThinkingMode::kChat, with_nul, {});
  ASSERT_EQ(n.calls.size(), 1u);
  EXPECT_EQ(n.calls[0].arguments, "{\"a\": \"1\\u0000junk\"}");
}

TEST(OutputParser, UnfinishedMarkersAtTheEndAreText) {
  auto c = parse_pieces(ThinkingMode::kThinking, "thinking </thi", {});
  EXPECT_EQ(c.reasoning, "thinking </thi");
  auto d = parse_pieces(ThinkingMode::kChat, "text\n\n<｜DSML｜tool", {});
  EXPECT_EQ(d.content, "text\n\n<｜DSML｜tool");
}

TEST(OutputParser, FuzzNeverCrashes) {
  const std::vector<std::string> frags = {"<",
                                          "</",
                                          ">",
                                          "think",
                                          "</think>",
                                          "｜DSML｜",
                                          "tool_calls",
                                          "invoke",
                                          " name=\"",
                                          "\"",
                                          "parameter",
                                          " string=\"true\"",
                                          "\n",
                                          "\n\n",
                                          "x",
                                          "é",
                                          "<｜DSML｜tool_calls>",
                                          "</｜DSML｜invoke>",
                                          "</｜DSML｜tool_calls>"};
  std::mt19937 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    for (int k = 0, n = 1 + rng() % 30; k < n; ++k) text += frags[rng() % frags.size()];
    auto mode = iter % 2 ? ThinkingMode::kThinking : ThinkingMode::kChat;
    Collected whole = parse_pieces(mode, text, {});
    auto bounds = char_boundaries(text);
    std::vector<size_t> cuts;
    for (size_t b : bounds)
      if (rng() % 3 == 0) cuts.push_back(b);
    expect_same(whole, parse_pieces(mode, text, cuts), "fuzz: " + text);
    EXPECT_LE(whole.reasoning.size() + whole.content.size(), text.size() + 32);
  }
}

}  // namespace
}  // namespace ds::tok
