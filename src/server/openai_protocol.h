// The OpenAI protocol: request bodies of /v1/completions and /v1/chat/completions parsed and
// validated into the engine's GenerateRequest / ChatPrompt (every limit of limits.h checked here,
// before tokenization), and the response, chunk and usage JSON built from engine events.
// Field rules (docs/server.md): unknown fields are ignored; a known field of the wrong JSON type or
// out of its range is a 400 naming the field in `param`; null means "absent" only for the fields
// OpenAI SDKs send as null (stop, seed, max_tokens, max_completion_tokens, logprobs, top_logprobs,
// logit_bias, stream_options, tools, tool_choice, response_format, user).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deepserve/engine.h"
#include "server/http_error.h"
#include "server/limits.h"

namespace ds::server {

enum class Endpoint { kCompletions, kChat };

// What the parser needs to know about the served model.
struct ModelContext {
  std::string served_model_name;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as sent ("" = absent)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Completions: the prompt as text, or as token ids.
  bool prompt_is_ids = false;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool add_special_tokens = true;
  // Chat.
  deepserve::ChatPrompt chat;
  bool chat_logprobs = false;  // chat `logprobs: true`
  // Both.
  deepserve::SamplingParams sampling;
  deepserve::OutputMode output_mode = deepserve::OutputMode::kText;
};

// Body -> JSON object: UTF-8 (HJ5), strict JSON without duplicate keys (HJ1, HJ9), depth limit
// (HJ6), an object at the top (HJ2).
std::optional<HttpError> parse_json_body(std::string_view body, const ServerLimits& limits,
                                         Json* out);

// Validates the fields of a completion / chat request (HJ7, HJ8, OP1-OP11, CX3, RE1).
std::optional<HttpError> parse_completion_request(const Json& body, const ServerLimits& limits,
                                                  const ModelContext& model, ParsedRequest* out);
std::optional<HttpError> parse_chat_request(const Json& body, const ServerLimits& limits,
                                            const ModelContext& model, ParsedRequest* out);

// The `model` field against the served name: 404 model_not_found when it differs.
std::optional<HttpError> check_model(const std::string& requested, const ModelContext& model);

// Prompt length against max_model_len (CX1, CX2): 400 context_length_exceeded with OpenAI's
// wording plus n_prompt_tokens and n_ctx.
std::optional<HttpError> check_context(int64_t prompt_tokens, int64_t max_tokens,
                                       int64_t max_model_len);

// ---- Responses ------------------------------------------------------------------------------

struct ResponseMeta {
  std::string id;
  int64_t created = 0;  // unix seconds
  std::string model;
};

// Everything a request produced (the non-streaming answer, and the stream's running totals).
struct GenerationResult {
  std::string text;
  std::string reasoning;
  std::vector<deepserve::ChatToolCall> tool_calls;
  std::vector<deepserve::TokenInfo> tokens;
  deepserve::FinishReason finish_reason = deepserve::FinishReason::kNone;
  std::string stop_reason;
  deepserve::Usage usage;
  void add(const deepserve::RequestEvent& event);
};

// "stop", "length", "tool_calls" (abort and error are not OpenAI finish reasons; the caller turns
// them into errors).
const char* finish_reason_text(deepserve::FinishReason reason);

Json usage_json(const deepserve::Usage& usage);
Json completion_response(const ResponseMeta& meta, const GenerationResult& result,
                         const ParsedRequest& request);
Json chat_response(const ResponseMeta& meta, const GenerationResult& result,
                   const ParsedRequest& request);

// One streamed chunk for `event` (nullopt when it carries nothing to send). `first` adds the role
// (chat). `text_offset` is the completion's text length before this event (completion logprobs).
std::optional<Json> completion_chunk(const ResponseMeta& meta, const deepserve::RequestEvent& event,
                                     const ParsedRequest& request, int64_t text_offset);
std::optional<Json> chat_chunk(const ResponseMeta& meta, const deepserve::RequestEvent& event,
                               const ParsedRequest& request, bool first, int* tool_call_index);
// The final chunk with choices [] and usage (stream_options.include_usage).
Json usage_chunk(const ResponseMeta& meta, const ParsedRequest& request,
                 const deepserve::Usage& usage);

// "data: <json>\n\n" (SSE framing).
std::string sse_data(const Json& value);
inline const char* sse_done() {
  return "data: [DONE]\n\n";
}

}  // namespace ds::server
