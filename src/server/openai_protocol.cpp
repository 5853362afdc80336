// Request validation and response building for the OpenAI endpoints (see openai_protocol.h).
// Every numeric field is range-checked on its JSON type before any conversion: a float is never
// converted to an integer (HJ8), and error messages carry field names and numbers, never raw
// client strings (HJ10).
#include "server/openai_protocol.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/json.h"

namespace ds::server {
namespace {

using deepserve::ChatMessage;
using deepserve::ChatToolCall;
using deepserve::FinishReason;
using deepserve::RequestEvent;
using deepserve::TokenInfo;

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Typed access to the fields of one JSON object; the first error is kept and later calls no-op.
class Fields {
 public:
  Fields(const Json& obj, std::string prefix = "") : obj_(obj), prefix_(std::move(prefix)) {}

  std::optional<HttpError>& error() { return error_; }
  bool ok() const { return !error_; }

  // The value of `key`, or nullptr when absent (or null and `nullable`).
  const Json* get(const char* key, bool nullable) {
    if (error_) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end()) return nullptr;
    if (it->is_null()) {
      if (nullable) return nullptr;
      fail(key, "must not be null");
      return nullptr;
    }
    return &*it;
  }

  void fail(const std::string& key, const std::string& what) {
    if (!error_) error_ = bad_request("'" + name(key) + "' " + what, name(key));
  }
  void fail_code(const std::string& key, const std::string& what, const std::string& code) {
    if (!error_) error_ = bad_request("'" + name(key) + "' " + what, name(key), code);
  }

  std::string name(const std::string& key) const { return prefix_ + key; }

  bool get_bool(const char* key, bool* out, bool nullable = false) {
    const Json* v = get(key, nullable);
    if (!v) return false;
    if (!v->is_boolean()) return fail(key, "must be a boolean"), false;
    *out = v->get<bool>();
    return true;
  }

  bool get_int(const char* key, int64_t lo, int64_t hi, int64_t* out, bool nullable = false) {
    const Json* v = get(key, nullable);
    if (!v) return false;
    if (!v->is_number_integer()) return fail(key, "must be an integer"), false;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > uint64_t(hi)) {
        return fail(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                             ", got " + std::to_string(u)),
               false;
      }
      *out = int64_t(u);
    } else {
      *out = v->get<int64_t>();
    }
    if (*out < lo || *out > hi) {
      return fail(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                           ", got " + std::to_string(*out)),
             false;
    }
    return true;
  }

  // A finite number in [lo, hi] (lo exclusive when `lo_open`).
  bool get_number(const char* key, double lo, double hi, bool lo_open, double* out,
                  bool nullable = false) {
    const Json* v = get(key, nullable);
    if (!v) return false;
    if (!v->is_number()) return fail(key, "must be a number"), false;
    const double d = v->get<double>();
    if (!std::isfinite(d) || (lo_open ? d <= lo : d < lo) || d > hi) {
      return fail(key, std::string("must be in ") + (lo_open ? "(" : "[") + num(lo) + ", " +
                           num(hi) + "]" + (std::isfinite(d) ? ", got " + num(d) : "")),
             false;
    }
    *out = d;
    return true;
  }

  bool get_string(const char* key, std::string* out, bool nullable = false) {
    const Json* v = get(key, nullable);
    if (!v) return false;
    if (!v->is_string()) return fail(key, "must be a string"), false;
    *out = v->get<std::string>();
    return true;
  }

 private:
  const Json& obj_;
  std::string prefix_;
  std::optional<HttpError> error_;
};

// Fields deepserve does not support: present and meaningful -> 400 (OP11 and friends).
std::optional<HttpError> reject_unsupported(const Json& body) {
  for (const char* key : {"prompt_embeds", "audio", "modalities", "prediction", "guided_json",
                          "guided_regex", "guided_grammar", "guided_choice"}) {
    auto it = body.find(key);
    if (it != body.end() && !it->is_null()) {
      return bad_request(std::string("'") + key + "' is not supported by this server", key);
    }
  }
  return std::nullopt;
}

// Sampling fields common to both endpoints.
void parse_sampling(Fields& f, const Json& body, const ServerLimits& limits,
                    const ModelContext& model, Endpoint endpoint, ParsedRequest* out) {
  auto& s = out->sampling;
  f.get_number("temperature", 0.0, 2.0, false, &s.temperature);
  f.get_number("top_p", 0.0, 1.0, /*lo_open=*/true, &s.top_p);
  int64_t top_k = 0;
  if (f.get_int("top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) s.top_k = top_k;
  f.get_number("min_p", 0.0, 1.0, false, &s.min_p);
  f.get_number("presence_penalty", -2.0, 2.0, false, &s.presence_penalty);
  f.get_number("frequency_penalty", -2.0, 2.0, false, &s.frequency_penalty);
  f.get_number("repetition_penalty", 0.0, 2.0, /*lo_open=*/true, &s.repetition_penalty);
  f.get_bool("ignore_eos", &s.ignore_eos);

  // seed: a non-negative integer that fits u64 (-1 and floats are 400).
  if (const Json* v = f.get("seed", /*nullable=*/true)) {
    if (!v->is_number_unsigned()) {
      f.fail("seed", "must be a non-negative integer");
    } else {
      s.seed = v->get<uint64_t>();
    }
  }

  // max_tokens / max_completion_tokens (chat): [1, max_model_len]; max_completion_tokens wins.
  const int64_t cap = std::max<int64_t>(1, model.max_model_len);
  int64_t max_tokens = -1;
  f.get_int("max_tokens", 1, cap, &max_tokens, /*nullable=*/true);
  if (endpoint == Endpoint::kChat) {
    int64_t mct = -1;
    if (f.get_int("max_completion_tokens", 1, cap, &mct, /*nullable=*/true)) max_tokens = mct;
  }
  s.max_tokens = max_tokens;
  int64_t min_tokens = 0;
  if (f.get_int("min_tokens", 0, max_tokens > 0 ? max_tokens : cap, &min_tokens)) {
    s.min_tokens = min_tokens;
  }

  // n (only 1) and best_of (completions: only 1).
  int64_t n = 1;
  if (const Json* v = f.get("n", /*nullable=*/true)) {
    if (!v->is_number_integer()) {
      f.fail("n", "must be an integer");
    } else if (!(v->is_number_unsigned() && v->get<uint64_t>() >= 1 &&
                 v->get<uint64_t>() <= uint64_t(limits.max_n))) {
      f.fail("n", "must be between 1 and " + std::to_string(limits.max_n) +
                      " (only one choice per request is supported)");
    } else {
      n = v->get<int64_t>();
    }
  }
  (void)n;
  if (endpoint == Endpoint::kCompletions) {
    int64_t best_of = 1;
    f.get_int("best_of", 1, 1, &best_of, /*nullable=*/true);
  }

  // stop: a string or an array of strings.
  if (const Json* v = f.get("stop", /*nullable=*/true)) {
    std::vector<std::string> stops;
    if (v->is_string()) {
      stops.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (int64_t(v->size()) > limits.max_stop_strings) {
        f.fail("stop", "has more than " + std::to_string(limits.max_stop_strings) + " entries");
      }
      for (const Json& e : *v) {
        if (!e.is_string()) {
          f.fail("stop", "must be a string or an array of strings");
          break;
        }
        stops.push_back(e.get<std::string>());
      }
    } else {
      f.fail("stop", "must be a string or an array of strings");
    }
    for (const std::string& st : stops) {
      if (st.empty()) f.fail("stop", "must not contain an empty string");
      if (int64_t(st.size()) > limits.max_stop_string_bytes) {
        f.fail("stop", "entries must be at most " + std::to_string(limits.max_stop_string_bytes) +
                           " bytes");
      }
    }
    if (int64_t(stops.size()) > limits.max_stop_strings) {
      f.fail("stop", "has more than " + std::to_string(limits.max_stop_strings) + " entries");
    }
    s.stop = std::move(stops);
  }
  if (const Json* v = f.get("stop_token_ids", /*nullable=*/true)) {
    if (!v->is_array()) {
      f.fail("stop_token_ids", "must be an array of token ids");
    } else if (int64_t(v->size()) > limits.max_stop_token_ids) {
      f.fail("stop_token_ids",
             "has more than " + std::to_string(limits.max_stop_token_ids) + " entries");
    } else {
      for (const Json& e : *v) {
        if (!e.is_number_unsigned() || e.get<uint64_t>() >= uint64_t(model.vocab_size)) {
          f.fail("stop_token_ids",
                 "entries must be token ids in [0, " + std::to_string(model.vocab_size) + ")");
          break;
        }
        s.stop_token_ids.push_back(int32_t(e.get<uint64_t>()));
      }
    }
  }

  // logit_bias: {"<token id>": bias in [-100, 100]}.
  if (const Json* v = f.get("logit_bias", /*nullable=*/true)) {
    if (!v->is_object()) {
      f.fail("logit_bias", "must be an object mapping token ids to numbers");
    } else if (int64_t(v->size()) > limits.max_logit_bias_entries) {
      f.fail("logit_bias",
             "has more than " + std::to_string(limits.max_logit_bias_entries) + " entries");
    } else {
      for (auto it = v->begin(); it != v->end() && f.ok(); ++it) {
        const std::string& key = it.key();
        bool digits = !key.empty() && key.size() <= 10;
        for (char c : key) digits = digits && c >= '0' && c <= '9';
        if (!digits || (key.size() > 1 && key[0] == '0')) {
          f.fail("logit_bias", "keys must be token ids written as decimal integers");
          break;
        }
        const int64_t id = std::stoll(key);
        if (id >= model.vocab_size) {
          f.fail("logit_bias", "token id " + std::to_string(id) +
                                   " is out of vocabulary (vocab size " +
                                   std::to_string(model.vocab_size) + ")");
          break;
        }
        if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < -100 ||
            it->get<double>() > 100) {
          f.fail("logit_bias", "values must be numbers in [-100, 100]");
          break;
        }
        s.logit_bias[int32_t(id)] = it->get<double>();
      }
    }
  }

  // stream / stream_options.
  f.get_bool("stream", &out->stream, /*nullable=*/true);
  if (const Json* v = f.get("stream_options", /*nullable=*/true)) {
    if (!v->is_object()) {
      f.fail("stream_options", "must be an object");
    } else {
      Fields so(*v, "stream_options.");
      so.get_bool("include_usage", &out->include_usage, /*nullable=*/true);
      if (so.error()) f.error() = so.error();
    }
  }

  // response_format: only {"type": "text"} (no constrained decoding yet, OP9).
  if (const Json* v = f.get("response_format", /*nullable=*/true)) {
    if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string()) {
      f.fail("response_format", "must be an object with a string 'type'");
    } else if ((*v)["type"].get<std::string>() != "text") {
      f.fail("response_format", "only type \"text\" is supported (no constrained decoding)");
    }
  }
  (void)body;
}

// Content of a message: a string, or an array of text parts (joined with "\n").
bool parse_content(Fields& f, const Json& v, const std::string& key, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_array()) {
    std::string text;
    bool first = true;
    for (const Json& part : v) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
        f.fail(key, "parts must be objects with a string 'type'");
        return false;
      }
      if (part["type"].get<std::string>() != "text") {
        f.fail(key, "only text parts are supported (this server is text-only)");
        return false;
      }
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) {
        f.fail(key, "text parts need a string 'text'");
        return false;
      }
      if (!first) text += "\n";
      text += t->get<std::string>();
      first = false;
    }
    *out = std::move(text);
    return true;
  }
  f.fail(key, "must be a string or an array of text parts");
  return false;
}

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::optional<HttpError> parse_json_body(std::string_view body, const ServerLimits& limits,
                                         Json* out) {
  if (body.empty()) return bad_request("the request body is empty; expected a JSON object");
  if (!is_valid_utf8(body)) return bad_request("the request body is not valid UTF-8");
  JsonLimits jl;
  jl.max_depth = int(limits.max_json_depth);
  jl.max_values = uint64_t(limits.max_body_bytes);
  jl.max_string_bytes = uint64_t(limits.max_body_bytes);
  auto parsed = parse_json_strict(body, jl, "request body");
  if (!parsed.ok()) {
    // Fixed text (HJ10): the rule that failed and the byte offset, never the client's bytes.
    const std::string& m = parsed.status().message();
    if (m.find("duplicate key") != std::string::npos) {
      return bad_request("the request body has a duplicate key", "", "invalid_json");
    }
    if (m.find("deeper than") != std::string::npos) {
      return bad_request("the request body is nested deeper than " +
                             std::to_string(limits.max_json_depth) + " levels",
                         "", "invalid_json");
    }
    std::string where;
    if (size_t at = m.find("at byte "); at != std::string::npos) {
      for (size_t i = at + 8; i < m.size() && m[i] >= '0' && m[i] <= '9'; ++i) where += m[i];
    }
    return bad_request("the request body is not valid JSON" +
                           (where.empty() ? std::string() : " (at byte " + where + ")"),
                       "", "invalid_json");
  }
  if (!parsed->is_object()) {
    return bad_request("the request body must be a JSON object", "", "invalid_json");
  }
  *out = std::move(parsed).value();
  return std::nullopt;
}

std::optional<HttpError> check_model(const std::string& requested, const ModelContext& model) {
  if (requested.empty() || requested == model.served_model_name) return std::nullopt;
  HttpError e;
  e.status = 404;
  e.type = "not_found_error";
  e.message = "The model does not exist; this server serves '" + model.served_model_name + "'";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

std::optional<HttpError> check_context(int64_t prompt_tokens, int64_t max_tokens,
                                       int64_t max_model_len) {
  const int64_t total = prompt_tokens + std::max<int64_t>(max_tokens, 0);
  if (prompt_tokens < max_model_len && total <= max_model_len) return std::nullopt;
  HttpError e = bad_request(
      "This model's maximum context length is " + std::to_string(max_model_len) +
          " tokens. However, you requested " + std::to_string(total) + " tokens (" +
          std::to_string(prompt_tokens) + " in the messages, " +
          std::to_string(std::max<int64_t>(max_tokens, 0)) +
          " in the completion). Please reduce the length of the messages or completion.",
      max_tokens > 0 && prompt_tokens < max_model_len ? "max_tokens" : "messages",
      "context_length_exceeded");
  e.n_prompt_tokens = prompt_tokens;
  e.n_ctx = max_model_len;
  return e;
}

std::optional<HttpError> parse_completion_request(const Json& body, const ServerLimits& limits,
                                                  const ModelContext& model, ParsedRequest* out) {
  *out = ParsedRequest{};
  out->endpoint = Endpoint::kCompletions;
  out->output_mode = deepserve::OutputMode::kText;
  if (auto e = reject_unsupported(body)) return e;
  Fields f(body);
  f.get_string("model", &out->model);
  if (!f.ok()) return f.error();
  if (auto e = check_model(out->model, model)) return e;

  // prompt: a string, [string], [ids] or [[ids]] (one prompt per request).
  const Json* p = f.get("prompt", /*nullable=*/false);
  if (!f.ok()) return f.error();
  if (!p) return bad_request("'prompt' is required", "prompt");
  auto parse_ids = [&](const Json& arr) -> std::optional<HttpError> {
    if (arr.empty()) return bad_request("'prompt' must not be empty", "prompt");
    if (int64_t(arr.size()) > limits.max_prompt_token_ids) {
      return bad_request(
          "'prompt' has more than " + std::to_string(limits.max_prompt_token_ids) + " token ids",
          "prompt");
    }
    out->prompt_ids.reserve(arr.size());
    for (const Json& e : arr) {
      if (!e.is_number_integer()) {
        return bad_request("'prompt' token ids must be integers", "prompt");
      }
      if (!e.is_number_unsigned() || e.get<uint64_t>() >= uint64_t(model.vocab_size)) {
        return bad_request("'prompt' contains a token id out of vocabulary (valid ids are 0 to " +
                               std::to_string(model.vocab_size - 1) + ")",
                           "prompt", "out_of_vocabulary");
      }
      out->prompt_ids.push_back(int32_t(e.get<uint64_t>()));
    }
    out->prompt_is_ids = true;
    return std::nullopt;
  };
  if (p->is_string()) {
    out->prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) return bad_request("'prompt' must not be empty", "prompt");
    const Json& first = (*p)[0];
    if (first.is_string() || first.is_array()) {
      if (p->size() != 1) {
        return bad_request("'prompt' must hold one prompt (batched prompts are not supported)",
                           "prompt");
      }
      if (first.is_string()) {
        out->prompt_text = first.get<std::string>();
      } else if (auto e = parse_ids(first)) {
        return e;
      }
    } else if (auto e = parse_ids(*p)) {
      return e;
    }
  } else {
    return bad_request(
        "'prompt' must be a string, an array of token ids, or an array of one of "
        "those",
        "prompt");
  }
  if (!out->prompt_is_ids && out->prompt_text.empty()) {
    return bad_request("'prompt' must not be empty", "prompt");
  }
  f.get_bool("add_special_tokens", &out->add_special_tokens);

  parse_sampling(f, body, limits, model, Endpoint::kCompletions, out);
  // logprobs: an integer 0..max_top_logprobs (legacy completions).
  int64_t logprobs = -1;
  if (f.get_int("logprobs", 0, limits.max_top_logprobs, &logprobs, /*nullable=*/true)) {
    out->sampling.logprobs = logprobs;
  }
  bool echo = false;
  if (f.get_bool("echo", &echo, /*nullable=*/true) && echo) {
    f.fail("echo", "is not supported");
  }
  std::string suffix;
  if (f.get_string("suffix", &suffix, /*nullable=*/true) && !suffix.empty()) {
    f.fail("suffix", "is not supported");
  }
  if (!f.ok()) return f.error();
  return std::nullopt;
}

std::optional<HttpError> parse_chat_request(const Json& body, const ServerLimits& limits,
                                            const ModelContext& model, ParsedRequest* out) {
  *out = ParsedRequest{};
  out->endpoint = Endpoint::kChat;
  if (auto e = reject_unsupported(body)) return e;
  Fields f(body);
  f.get_string("model", &out->model);
  if (!f.ok()) return f.error();
  if (auto e = check_model(out->model, model)) return e;

  // messages.
  const Json* msgs = f.get("messages", /*nullable=*/false);
  if (!f.ok()) return f.error();
  if (!msgs) return bad_request("'messages' is required", "messages");
  if (!msgs->is_array()) return bad_request("'messages' must be an array", "messages");
  if (msgs->empty()) return bad_request("'messages' must not be empty", "messages");
  if (int64_t(msgs->size()) > limits.max_messages) {
    return bad_request(
        "'messages' has more than " + std::to_string(limits.max_messages) + " entries", "messages");
  }
  bool has_non_system = false;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const Json& m = (*msgs)[i];
    const std::string prefix = "messages[" + std::to_string(i) + "].";
    if (!m.is_object()) {
      return bad_request("'messages[" + std::to_string(i) + "]' must be an object", "messages");
    }
    Fields mf(m, prefix);
    ChatMessage msg;
    if (!mf.get_string("role", &msg.role) && mf.ok()) {
      return bad_request("'" + prefix + "role' is required", prefix + "role");
    }
    if (!mf.ok()) return mf.error();
    static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant",
                                                 "tool"};
    if (!kRoles.count(msg.role)) {
      return bad_request(
          "'" + prefix + "role' must be one of system, developer, user, assistant, tool",
          prefix + "role");
    }
    if (msg.role != "system" && msg.role != "developer") has_non_system = true;
    const bool content_optional = msg.role == "assistant";
    if (const Json* c = mf.get("content", /*nullable=*/content_optional)) {
      std::string text;
      if (!parse_content(mf, *c, "content", &text)) return mf.error();
      msg.content = std::move(text);
    } else if (!mf.ok()) {
      return mf.error();
    } else if (!content_optional) {
      return bad_request("'" + prefix + "content' is required", prefix + "content");
    }
    if (msg.role == "assistant") {
      std::string reasoning;
      if (mf.get_string("reasoning_content", &reasoning, /*nullable=*/true)) {
        msg.reasoning_content = std::move(reasoning);
      }
      if (const Json* tc = mf.get("tool_calls", /*nullable=*/true)) {
        if (!tc->is_array())
          return bad_request("'" + prefix + "tool_calls' must be an array", prefix + "tool_calls");
        for (const Json& call : *tc) {
          ChatToolCall out_call;
          const Json* fn =
              call.is_object() && call.contains("function") ? &call["function"] : nullptr;
          if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
            return bad_request(
                "'" + prefix + "tool_calls' entries need a function with a string name",
                prefix + "tool_calls");
          }
          out_call.name = (*fn)["name"].get<std::string>();
          if (fn->contains("arguments")) {
            if (!(*fn)["arguments"].is_string()) {
              return bad_request("'" + prefix + "tool_calls' arguments must be a JSON string",
                                 prefix + "tool_calls");
            }
            out_call.arguments = (*fn)["arguments"].get<std::string>();
          }
          if (call.contains("id") && call["id"].is_string()) out_call.id = call["id"];
          msg.tool_calls.push_back(std::move(out_call));
        }
      }
      if (!msg.content && msg.tool_calls.empty()) {
        return bad_request("'" + prefix + "content' is required without tool_calls",
                           prefix + "content");
      }
    }
    if (msg.role == "tool") {
      mf.get_string("tool_call_id", &msg.tool_call_id);
    }
    if (!mf.ok()) return mf.error();
    out->chat.messages.push_back(std::move(msg));
  }
  if (!has_non_system) {
    return bad_request("'messages' needs at least one user, assistant or tool message", "messages");
  }

  // tools / tool_choice.
  std::set<std::string> tool_names;
  Json tools_out = Json::array();
  if (const Json* tools = f.get("tools", /*nullable=*/true)) {
    if (!tools->is_array()) return bad_request("'tools' must be an array", "tools");
    if (int64_t(tools->size()) > limits.max_tools) {
      return bad_request("'tools' has more than " + std::to_string(limits.max_tools) + " entries",
                         "tools");
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string name = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
          !t.contains("function") || !t["function"].is_object()) {
        return bad_request("'" + name + "' must be {\"type\": \"function\", \"function\": {...}}",
                           name);
      }
      const Json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string() ||
          !valid_tool_name(fn["name"].get<std::string>())) {
        return bad_request(
            "'" + name + ".function.name' must be 1-64 characters of a-z, A-Z, 0-9, _ or -",
            name + ".function.name");
      }
      if (fn.contains("parameters") && !fn["parameters"].is_object()) {
        return bad_request("'" + name + ".function.parameters' must be an object",
                           name + ".function.parameters");
      }
      if (fn.contains("description") && !fn["description"].is_string() &&
          !fn["description"].is_null()) {
        return bad_request("'" + name + ".function.description' must be a string",
                           name + ".function.description");
      }
      tool_names.insert(fn["name"].get<std::string>());
      tools_out.push_back(t);
    }
  }
  bool tools_enabled = !tools_out.empty();
  if (const Json* tc = f.get("tool_choice", /*nullable=*/true)) {
    if (tc->is_string()) {
      const std::string choice = tc->get<std::string>();
      if (choice == "none") {
        tools_enabled = false;
      } else if (choice == "required") {
        return bad_request("'tool_choice' \"required\" is not supported (use \"auto\")",
                           "tool_choice");
      } else if (choice != "auto") {
        return bad_request("'tool_choice' must be \"none\", \"auto\" or a named function",
                           "tool_choice");
      }
    } else if (tc->is_object()) {
      const Json* fn = tc->contains("function") ? &(*tc)["function"] : nullptr;
      if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
        return bad_request("'tool_choice' must name a function", "tool_choice");
      }
      if (!tool_names.count((*fn)["name"].get<std::string>())) {
        return bad_request("'tool_choice' names a function that is not in 'tools'", "tool_choice");
      }
      return bad_request("'tool_choice' naming a function is not supported (use \"auto\")",
                         "tool_choice");
    } else {
      return bad_request("'tool_choice' must be a string or an object", "tool_choice");
    }
  }
  if (tools_enabled) out->chat.tools_json = dump_json(tools_out);

  // Thinking mode: chat_template_kwargs.thinking (DeepSeek; enable_thinking accepted too) and
  // reasoning_effort ("high" | "max"; OpenAI's lower levels mean the default).
  bool thinking = false;
  std::string effort;
  if (const Json* kw = f.get("chat_template_kwargs", /*nullable=*/true)) {
    if (!kw->is_object())
      return bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    Fields kf(*kw, "chat_template_kwargs.");
    kf.get_bool("thinking", &thinking, /*nullable=*/true);
    kf.get_bool("enable_thinking", &thinking, /*nullable=*/true);
    kf.get_string("reasoning_effort", &effort, /*nullable=*/true);
    if (!kf.ok()) return kf.error();
  }
  f.get_string("reasoning_effort", &effort, /*nullable=*/true);
  if (!f.ok()) return f.error();
  if (effort == "low" || effort == "medium" || effort == "minimal") effort.clear();
  if (!effort.empty() && effort != "high" && effort != "max") {
    return bad_request("'reasoning_effort' must be one of minimal, low, medium, high, max",
                       "reasoning_effort");
  }
  out->chat.thinking = thinking;
  out->chat.reasoning_effort = effort;
  out->output_mode = thinking ? deepserve::OutputMode::kChatThinking : deepserve::OutputMode::kChat;

  parse_sampling(f, body, limits, model, Endpoint::kChat, out);
  // logprobs (bool) + top_logprobs (0..max_top_logprobs, needs logprobs).
  f.get_bool("logprobs", &out->chat_logprobs, /*nullable=*/true);
  int64_t top = 0;
  const bool has_top = f.get_int("top_logprobs", 0, limits.max_top_logprobs, &top,
                                 /*nullable=*/true);
  if (!f.ok()) return f.error();
  if (has_top && !out->chat_logprobs) {
    return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  }
  out->sampling.logprobs = out->chat_logprobs ? top : -1;
  return std::nullopt;
}

// ---- Responses ------------------------------------------------------------------------------

void GenerationResult::add(const RequestEvent& event) {
  text += event.text;
  reasoning += event.reasoning;
  tool_calls.insert(tool_calls.end(), event.tool_calls.begin(), event.tool_calls.end());
  tokens.insert(tokens.end(), event.tokens.begin(), event.tokens.end());
  if (event.finished) {
    finish_reason = event.finish_reason;
    stop_reason = event.stop_reason;
    usage = event.usage;
  }
}

const char* finish_reason_text(FinishReason reason) {
  return reason == FinishReason::kNone ? nullptr : finish_reason_name(reason);
}

namespace {

Json finish_json(FinishReason reason) {
  const char* r = finish_reason_text(reason);
  return r ? Json(r) : Json(nullptr);
}

Json tool_calls_json(const std::vector<ChatToolCall>& calls, int* index) {
  Json out = Json::array();
  for (const ChatToolCall& c : calls) {
    Json call = {{"id", c.id},
                 {"type", "function"},
                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
    if (index) call["index"] = (*index)++;
    out.push_back(std::move(call));
  }
  return out;
}

Json bytes_json(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
Json chat_logprobs_json(const std::vector<TokenInfo>& tokens) {
  Json content = Json::array();
  for (const TokenInfo& t : tokens) {
    Json top = Json::array();
    for (const auto& alt : t.top) {
      top.push_back(
          {{"token", alt.token}, {"logprob", alt.logprob}, {"bytes", bytes_json(alt.token)}});
    }
    content.push_back({{"token", t.token},
                       {"logprob", t.logprob},
                       {"bytes", bytes_json(t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return Json{{"content", std::move(content)}};
}

// Completion logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
Json completion_logprobs_json(const std::vector<TokenInfo>& tokens, int64_t text_offset,
                              bool with_top) {
  Json toks = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
  int64_t off = text_offset;
  for (const TokenInfo& t : tokens) {
    toks.push_back(t.token);
    lps.push_back(t.logprob);
    if (with_top) {
      Json m = Json::object();
      for (const auto& alt : t.top) m[alt.token] = alt.logprob;
      tops.push_back(std::move(m));
    } else {
      tops.push_back(nullptr);
    }
    offs.push_back(off);
    off += int64_t(t.token.size());
  }
  return Json{{"tokens", std::move(toks)},
              {"token_logprobs", std::move(lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offs)}};
}

Json stop_reason_json(const GenerationResult& r) {
  return r.stop_reason.empty() ? Json(nullptr) : Json(r.stop_reason);
}

}  // namespace

Json usage_json(const deepserve::Usage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

Json completion_response(const ResponseMeta& meta, const GenerationResult& result,
                         const ParsedRequest& request) {
  Json choice = {{"index", 0},
                 {"text", result.text},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_json(result.finish_reason)},
                 {"stop_reason", stop_reason_json(result)}};
  if (request.sampling.logprobs >= 0) {
    choice["logprobs"] = completion_logprobs_json(result.tokens, 0, request.sampling.logprobs > 0);
  }
  return Json{{"id", meta.id},
              {"object", "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", Json::array({std::move(choice)})},
              {"usage", usage_json(result.usage)}};
}

Json chat_response(const ResponseMeta& meta, const GenerationResult& result,
                   const ParsedRequest& request) {
  Json message = {{"role", "assistant"}, {"content", result.text}};
  if (request.output_mode == deepserve::OutputMode::kChatThinking || !result.reasoning.empty()) {
    message["reasoning_content"] = result.reasoning;
  }
  if (!result.tool_calls.empty()) {
    message["tool_calls"] = tool_calls_json(result.tool_calls, nullptr);
    if (result.text.empty()) message["content"] = nullptr;
  }
  Json choice = {{"index", 0},
                 {"message", std::move(message)},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_json(result.finish_reason)},
                 {"stop_reason", stop_reason_json(result)}};
  if (request.chat_logprobs) choice["logprobs"] = chat_logprobs_json(result.tokens);
  return Json{{"id", meta.id},
              {"object", "chat.completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", Json::array({std::move(choice)})},
              {"usage", usage_json(result.usage)}};
}

std::optional<Json> completion_chunk(const ResponseMeta& meta, const RequestEvent& event,
                                     const ParsedRequest& request, int64_t text_offset) {
  const bool with_logprobs = request.sampling.logprobs >= 0 && !event.tokens.empty();
  const char* finish = event.finished ? finish_reason_text(event.finish_reason) : nullptr;
  if (event.text.empty() && !with_logprobs && !finish) return std::nullopt;
  Json choice = {{"index", 0},
                 {"text", event.text},
                 {"logprobs", nullptr},
                 {"finish_reason", finish ? Json(finish) : Json(nullptr)}};
  if (event.finished) {
    choice["stop_reason"] = event.stop_reason.empty() ? Json(nullptr) : Json(event.stop_reason);
  }
  if (with_logprobs) {
    choice["logprobs"] =
        completion_logprobs_json(event.tokens, text_offset, request.sampling.logprobs > 0);
  }
  Json chunk = {{"id", meta.id},
                {"object", "text_completion"},
                {"created", meta.created},
                {"model", meta.model},
                {"choices", Json::array({std::move(choice)})}};
  if (request.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

std::optional<Json> chat_chunk(const ResponseMeta& meta, const RequestEvent& event,
                               const ParsedRequest& request, bool first, int* tool_call_index) {
  const bool with_logprobs = request.chat_logprobs && !event.tokens.empty();
  const char* finish = event.finished ? finish_reason_text(event.finish_reason) : nullptr;
  Json delta = Json::object();
  if (first) {
    delta["role"] = "assistant";
    delta["content"] = "";
  }
  if (!event.text.empty()) delta["content"] = event.text;
  if (!event.reasoning.empty()) delta["reasoning_content"] = event.reasoning;
  if (!event.tool_calls.empty())
    delta["tool_calls"] = tool_calls_json(event.tool_calls, tool_call_index);
  if (delta.empty() && !with_logprobs && !finish) return std::nullopt;
  Json choice = {{"index", 0},
                 {"delta", std::move(delta)},
                 {"logprobs", with_logprobs ? chat_logprobs_json(event.tokens) : Json(nullptr)},
                 {"finish_reason", finish ? Json(finish) : Json(nullptr)}};
  if (event.finished) {
    choice["stop_reason"] = event.stop_reason.empty() ? Json(nullptr) : Json(event.stop_reason);
  }
  Json chunk = {{"id", meta.id},
                {"object", "chat.completion.chunk"},
                {"created", meta.created},
                {"model", meta.model},
                {"choices", Json::array({std::move(choice)})}};
  if (request.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

Json usage_chunk(const ResponseMeta& meta, const ParsedRequest& request,
                 const deepserve::Usage& usage) {
  return Json{
      {"id", meta.id},
      {"object", request.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
      {"created", meta.created},
      {"model", meta.model},
      {"choices", Json::array()},
      {"usage", usage_json(usage)}};
}

std::string sse_data(const Json& value) {
  return "data: " + dump_json(value) + "\n\n";
}

}  // namespace ds::server
