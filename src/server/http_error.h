// HTTP errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the status
// codes of conventions.md (400, 401, 404, 405, 413, 415, 429/503 with Retry-After, 500), the
// mapping from the engine's ApiError, and the two text helpers every answer goes through: a JSON
// writer that never throws and replaces invalid UTF-8 (HJ10), and log escaping (AU6).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "deepserve/engine.h"

namespace ds::server {

using Json = nlohmann::json;

struct HttpError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;           // fixed text plus numbers and field names, never raw client bytes
  std::string param;             // "" = null
  std::string code;              // "" = null
  int64_t n_prompt_tokens = -1;  // context_length_exceeded details (-1 = absent)
  int64_t n_ctx = -1;
  bool retry_after = false;  // 429/503: send Retry-After
};

// 400 invalid_request_error naming `param`.
HttpError bad_request(std::string message, std::string param = "", std::string code = "");
// The HTTP answer for an engine error (400/404/503/500). Internal details stay in the log.
HttpError from_api_error(const deepserve::ApiError& error);
// 503 unavailable_error with Retry-After (loading, draining).
HttpError unavailable(std::string message);

// {"error": {...}} (plus n_prompt_tokens/n_ctx for context overflow).
Json error_json(const HttpError& error);
std::string error_body(const HttpError& error);

// Serializes `value`; invalid UTF-8 in strings becomes U+FFFD. Never throws.
std::string dump_json(const Json& value);

// A value for one log line: control characters, quotes, backslashes and non-ASCII bytes escaped
// (\n, \x1b, ...), cut to `max_bytes` of input with "..." appended.
std::string log_escape(std::string_view text, size_t max_bytes = 64);

}  // namespace ds::server
