// The DeepSeek-V4 chat format (dsv4-model.md §12; rules of the reference encoder
// encoding/encoding_dsv4.py of deepseek-ai/DeepSeek-V4-Flash): BOS, system prompt with the
// "## Tools" block and response format, <｜User｜>/<｜Assistant｜> turns, thinking and chat modes
// (<think> / </think> after <｜Assistant｜>), dropping of reasoning before the last user turn,
// DSML tool calls in assistant turns, tool results merged into user turns as <tool_result>, the
// latest_reminder role and quick-instruction task tokens.
//
// The encoder renders a list of segments, each either scaffolding (the encoder's own text, where
// special-token strings become special ids) or client text (content, reasoning, tool names,
// arguments, schemas, results), which is always tokenized as plain text (TK3). For client text
// without special-token strings the ids equal those of tokenizing the rendered string as a whole.
// chat_template fields of model files are never used (TK5).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace ds::tok {

// Key order matters for the rendered tool schemas (the reference prints them in the order the
// client sent), so tool definitions and response formats are ordered JSON.
using OrderedJson = nlohmann::ordered_json;

enum class ThinkingMode { kChat, kThinking };
// The reference accepts None, "high" and "max"; only "max" changes the prompt.
enum class ReasoningEffort { kNone, kHigh, kMax };

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of an object, as in the OpenAI API
};

struct ChatMessage {
  // system, developer, user, assistant, tool or latest_reminder.
  std::string role;
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;  // assistant
  std::vector<ToolCall> tool_calls;              // assistant
  std::string tool_call_id;                      // tool
  OrderedJson tools;  // system/developer: OpenAI tools array ({"type","function"}); null = none
  OrderedJson response_format;      // system/developer; null = none
  std::optional<std::string> task;  // action, query, authority, domain, title, read_url
  bool wo_eos = false;              // assistant turn without the closing EOS (prefill)
};

struct ChatEncodeOptions {
  ThinkingMode mode = ThinkingMode::kThinking;
  bool drop_thinking = true;  // forced off when any message defines tools
  bool add_bos = true;
  ReasoningEffort effort = ReasoningEffort::kNone;
};

struct PromptSegment {
  std::string text;
  bool trusted = false;  // encoder scaffolding (special strings become special ids)
};

// The prompt as segments (adjacent segments of the same kind merged).
Result<std::vector<PromptSegment>> render_chat_segments(const std::vector<ChatMessage>& messages,
                                                        const ChatEncodeOptions& opts);
// The prompt as one string (what the reference encoder returns).
Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                const ChatEncodeOptions& opts);
// The prompt as token ids; only scaffolding produces added-token ids (TK3). Fails
// (kFailedPrecondition) when the tokenizer lacks a token the format needs.
Result<std::vector<TokenId>> encode_chat(const Tokenizer& tokenizer,
                                         const std::vector<ChatMessage>& messages,
                                         const ChatEncodeOptions& opts,
                                         const EncodeOptions& encode_opts = {});

// Load-time check (reliability.md rule 22): every token the chat format writes (BOS, EOS,
// <｜User｜>, <｜Assistant｜>, <think>, </think>, ｜DSML｜) exists as one token with an id below
// `embedding_rows` (the model's vocab_size). kFailedPrecondition naming the first one that fails.
Status validate_chat_tokens(const Tokenizer& tokenizer, size_t embedding_rows);

// OpenAI chat messages (parsed with ordered_json to keep key order) -> ChatMessage list. Accepts
// role, content (string, null, or an array of {"type": "text", "text": ...} parts),
// reasoning_content, tool_calls ([{id, type, function: {name, arguments}}], arguments as a string
// or an object), tool_call_id, and the DeepSeek extensions task and wo_eos. `tools` (the request's
// tools array, may be null) goes on the first system message; when the conversation has none, a
// system message with empty content is inserted first (the reference only reads tools from
// system/developer messages). Errors name the message index and field.
Result<std::vector<ChatMessage>> chat_messages_from_json(const OrderedJson& messages,
                                                         const OrderedJson& tools);

// Python json.dumps(value, ensure_ascii=False) formatting (", " and ": " separators), which the
// reference uses for tool schemas and non-string arguments.
std::string python_json_dumps(const OrderedJson& value);

}  // namespace ds::tok
