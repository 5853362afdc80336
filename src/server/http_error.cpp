// OpenAI error bodies, the ApiError -> HTTP mapping, the non-throwing JSON writer and log escaping.
#include "server/http_error.h"

#include <cstdio>

namespace ds::server {

HttpError bad_request(std::string message, std::string param, std::string code) {
  HttpError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

HttpError unavailable(std::string message) {
  HttpError e;
  e.status = 503;
  e.type = "unavailable_error";
  e.message = std::move(message);
  e.retry_after = true;
  return e;
}

HttpError from_api_error(const deepserve::ApiError& error) {
  HttpError e;
  e.message = error.message;
  e.param = error.param;
  e.code = error.code;
  switch (error.kind) {
    case deepserve::ErrorKind::kInvalidRequest:
      e.status = 400;
      e.type = "invalid_request_error";
      if (error.code == "context_length_exceeded") {
        e.n_prompt_tokens = error.n_prompt_tokens;
        e.n_ctx = error.n_ctx;
      }
      break;
    case deepserve::ErrorKind::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case deepserve::ErrorKind::kOverloaded:
      e.status = 503;
      e.type = "overloaded_error";
      if (e.code.empty()) e.code = "server_overloaded";
      e.retry_after = true;
      break;
    case deepserve::ErrorKind::kUnavailable:
      e.status = 503;
      e.type = "unavailable_error";
      e.retry_after = true;
      break;
    case deepserve::ErrorKind::kInternal:
    default:
      e.status = 500;
      e.type = "internal_error";
      e.message = "internal error";  // details only in the log
      e.param.clear();
      e.code.clear();
      break;
  }
  if (e.message.empty()) e.message = "request failed";
  return e;
}

Json error_json(const HttpError& error) {
  Json inner = {{"message", error.message},
                {"type", error.type},
                {"param", error.param.empty() ? Json(nullptr) : Json(error.param)},
                {"code", error.code.empty() ? Json(nullptr) : Json(error.code)}};
  if (error.n_prompt_tokens >= 0) inner["n_prompt_tokens"] = error.n_prompt_tokens;
  if (error.n_ctx >= 0) inner["n_ctx"] = error.n_ctx;
  return Json{{"error", std::move(inner)}};
}

std::string error_body(const HttpError& error) {
  return dump_json(error_json(error));
}

std::string dump_json(const Json& value) {
  try {
    return value.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
  } catch (...) {
    // dump with the replace handler does not throw; this keeps the promise if that ever changes.
    return "{\"error\":{\"message\":\"internal error\",\"type\":\"internal_error\",\"param\":null,"
           "\"code\":null}}";
  }
}

std::string log_escape(std::string_view text, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(text.size(), max_bytes);
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c >= 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

}  // namespace ds::server
