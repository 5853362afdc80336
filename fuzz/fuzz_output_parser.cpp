// Fuzz target: tok::OutputParser, the incremental reasoning / content / DSML tool-call splitter
// (ST11). Input layout: byte 0 picks the mode (bit 0: thinking) and the number of split points
// (bits 1-4); that many bytes follow, each a split position (its value modulo the text length
// + 1); the rest is the model output text. The text is fed three ways: in one piece, in chunks cut
// at the split positions, and one byte at a time; all three must give the same reasoning, content,
// tool calls, error and saw_tool_calls(), so a marker cut by a chunk boundary can never leak (a
// leaked part of a marker makes the chunked result differ from the one-piece result).
//
// Markers in the result: the parser treats `</think>` as the end of the reasoning (thinking mode)
// and `<｜DSML｜tool_calls>` as the start of a tool-call block (content); `<think>` and stray
// `｜DSML｜` text are not markers to it and pass through as text. So the checks on whole markers
// are: the reasoning never contains `</think>`, and the content never contains
// `<｜DSML｜tool_calls>` unless an error was reported (after a malformed block the rest of the
// output is returned as text, by design). Tool-call arguments must be a JSON object
// when the text is valid UTF-8 (as it always is in the server).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/output_parser.h"

namespace {

struct Outcome {
  std::string reasoning;
  std::string content;
  std::vector<ds::tok::ParsedToolCall> calls;
  std::string errors;
  bool saw_tool_calls = false;

  void add(ds::tok::OutputDelta d) {
    reasoning += d.reasoning;
    content += d.content;
    for (auto& c : d.tool_calls) calls.push_back(std::move(c));
    if (!d.error.empty()) errors += d.error + "\n";
  }
  bool operator==(const Outcome& o) const {
    if (calls.size() != o.calls.size()) return false;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i].name != o.calls[i].name || calls[i].arguments != o.calls[i].arguments)
        return false;
    return reasoning == o.reasoning && content == o.content && errors == o.errors &&
           saw_tool_calls == o.saw_tool_calls;
  }
};

Outcome run(ds::tok::ThinkingMode mode, std::string_view text, const std::vector<size_t>& cuts) {
  ds::tok::OutputParser parser(mode);
  Outcome out;
  size_t begin = 0;
  for (size_t cut : cuts) {
    out.add(parser.push(text.substr(begin, cut - begin)));
    begin = cut;
  }
  out.add(parser.push(text.substr(begin)));
  out.add(parser.finish());
  out.saw_tool_calls = parser.saw_tool_calls();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto mode = (data[0] & 1) ? ds::tok::ThinkingMode::kThinking : ds::tok::ThinkingMode::kChat;
  const size_t num_cuts = std::min<size_t>((data[0] >> 1) & 15, size - 1);
  std::string_view text(reinterpret_cast<const char*>(data) + 1 + num_cuts, size - 1 - num_cuts);
  std::vector<size_t> cuts;
  for (size_t i = 0; i < num_cuts; ++i) cuts.push_back(data[1 + i] % (text.size() + 1));
  std::sort(cuts.begin(), cuts.end());

  const Outcome whole = run(mode, text, {});
  const Outcome chunked = run(mode, text, cuts);
  DS_FUZZ_CHECK(chunked == whole, "feeding in chunks differs from feeding in one piece");
  if (text.size() <= 4096) {
    std::vector<size_t> every;
    for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
    DS_FUZZ_CHECK(run(mode, text, every) == whole,
                  "feeding one byte at a time differs from feeding in one piece");
  }

  DS_FUZZ_CHECK(whole.reasoning.find("</think>") == std::string::npos,
                "the reasoning contains </think>");
  if (mode == ds::tok::ThinkingMode::kChat)
    DS_FUZZ_CHECK(whole.reasoning.empty(), "reasoning in chat mode");
  if (whole.errors.empty())
    DS_FUZZ_CHECK(whole.content.find("<\xEF\xBD\x9C"
                                     "DSML\xEF\xBD\x9Ctool_calls>") == std::string::npos,
                  "the content contains a tool_calls marker without an error");
  DS_FUZZ_CHECK(whole.calls.empty() || whole.saw_tool_calls, "tool calls without saw_tool_calls");
  // The parser is fed decoded text (valid UTF-8) in the server; only then must the arguments
  // parse as JSON (invalid bytes pass through into the argument strings unchanged).
  if (!ds::fuzz::reference_utf8_valid(text)) return 0;
  for (const auto& call : whole.calls) {
    auto args = nlohmann::json::parse(call.arguments, nullptr, false);
    DS_FUZZ_CHECK(!args.is_discarded() && args.is_object(),
                  "tool-call arguments are not a JSON object: " + call.arguments);
  }
  return 0;
}
