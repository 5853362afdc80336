// Incremental parser for DeepSeek-V4 model output (the reverse of chat_encoding.h): splits the
// reasoning (everything before </think> in thinking mode) from the content, and parses DSML tool
// calls (\n\n<｜DSML｜tool_calls> ... </｜DSML｜tool_calls>) into name + JSON arguments. Text is
// pushed as it is decoded (whole UTF-8 characters, see StreamDecoder); markers split across
// pushes are held back and never leak into reasoning or content, whatever the split point (ST11).
// A malformed tool-call block is returned as content with `error` set, and everything after it
// is content too (no further markup parsing); nothing throws.
// The caller stops on the EOS id and does not feed the EOS text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_encoding.h"

namespace ds::tok {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON object text, as in the OpenAI API
};

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;  // complete calls only
  std::string error;                       // set once when a tool-call block is malformed
};

class OutputParser {
 public:
  // In thinking mode the prompt ended with <think>, so output starts inside the reasoning.
  explicit OutputParser(ThinkingMode mode);

  OutputDelta push(std::string_view text);
  // End of output: returns whatever was held back (an unfinished marker is plain text then; an
  // unfinished tool-call block is returned as content with an error).
  OutputDelta finish();

  bool in_reasoning() const { return state_ == State::kReasoning; }
  bool saw_tool_calls() const { return saw_tool_calls_; }

 private:
  enum class State { kReasoning, kContent, kToolCalls, kAfterToolCalls, kRaw };
  void step(OutputDelta* d, bool final);
  bool parse_invoke(std::string_view block, ParsedToolCall* out, std::string* err) const;

  State state_;
  std::string buf_;
  bool saw_tool_calls_ = false;
  bool reported_error_ = false;
};

}  // namespace ds::tok
