// The limits table (see limits.h): names, flags, ranges and help text of every server cap.
#include "server/limits.h"

#include <string>

namespace ds::server {

const std::vector<LimitSpec>& limit_table() {
  using L = ServerLimits;
  static const std::vector<LimitSpec> table = {
      {"max_body_bytes", "--max-body-bytes", "DEEPSERVE_MAX_BODY_BYTES", &L::max_body_bytes, 1024,
       int64_t(1) << 30, "request body bytes (413 above)"},
      {"max_header_count", "--max-header-count", "DEEPSERVE_MAX_HEADER_COUNT", &L::max_header_count,
       8, 10000, "request headers (431 above)"},
      {"max_json_depth", "--max-json-depth", "DEEPSERVE_MAX_JSON_DEPTH", &L::max_json_depth, 4, 256,
       "nesting depth of a JSON body (400 above)"},
      {"max_n", "--max-n", "DEEPSERVE_MAX_N", &L::max_n, 1, 1,
       "choices per request (`n`); only 1 is supported"},
      {"max_stop_strings", "--max-stop-strings", "DEEPSERVE_MAX_STOP_STRINGS", &L::max_stop_strings,
       0, 64, "entries of `stop`"},
      {"max_stop_string_bytes", "--max-stop-string-bytes", "DEEPSERVE_MAX_STOP_STRING_BYTES",
       &L::max_stop_string_bytes, 1, 4096, "bytes of one stop string"},
      {"max_stop_token_ids", "--max-stop-token-ids", "DEEPSERVE_MAX_STOP_TOKEN_IDS",
       &L::max_stop_token_ids, 0, 1024, "entries of `stop_token_ids`"},
      {"max_top_logprobs", "--max-top-logprobs", "DEEPSERVE_MAX_TOP_LOGPROBS", &L::max_top_logprobs,
       0, 20, "`top_logprobs` (chat) and `logprobs` (completions)"},
      {"max_logit_bias_entries", "--max-logit-bias-entries", "DEEPSERVE_MAX_LOGIT_BIAS_ENTRIES",
       &L::max_logit_bias_entries, 0, 100000, "entries of `logit_bias`"},
      {"max_messages", "--max-messages", "DEEPSERVE_MAX_MESSAGES", &L::max_messages, 1, 1 << 20,
       "chat messages per request"},
      {"max_tools", "--max-tools", "DEEPSERVE_MAX_TOOLS", &L::max_tools, 0, 10000,
       "tool definitions per request"},
      {"max_prompt_token_ids", "--max-prompt-token-ids", "DEEPSERVE_MAX_PROMPT_TOKEN_IDS",
       &L::max_prompt_token_ids, 1, int64_t(1) << 24,
       "token ids in a token-id prompt or a /detokenize request"},
      {"read_timeout_s", "--read-timeout", "DEEPSERVE_READ_TIMEOUT", &L::read_timeout_s, 1, 3600,
       "seconds for a whole request body to arrive (408 after); also the per-read timeout of "
       "heads"},
      {"write_timeout_s", "--write-timeout", "DEEPSERVE_WRITE_TIMEOUT", &L::write_timeout_s, 1,
       3600, "seconds a blocked write may wait (a reader that stalls is aborted)"},
      {"keep_alive_timeout_s", "--keep-alive-timeout", "DEEPSERVE_KEEP_ALIVE_TIMEOUT",
       &L::keep_alive_timeout_s, 1, 3600, "seconds an idle keep-alive connection stays open"},
      {"request_timeout_s", "--request-timeout", "DEEPSERVE_REQUEST_TIMEOUT", &L::request_timeout_s,
       0, int64_t(1) << 31,
       "seconds of generation per request, then finish_reason \"length\" (0 = none)"},
      {"retry_after_s", "--retry-after", "DEEPSERVE_RETRY_AFTER", &L::retry_after_s, 1, 3600,
       "Retry-After seconds on 429/503 answers"},
      {"stall_timeout_s", "--stall-timeout", "DEEPSERVE_STALL_TIMEOUT", &L::stall_timeout_s, 1,
       86400, "/health answers 503 when requests are active and no engine step ran this long"},
  };
  return table;
}

std::string limits_markdown() {
  ServerLimits defaults;
  std::string out = "| limit | flag | default | meaning |\n|---|---|---|---|\n";
  for (const LimitSpec& s : limit_table()) {
    out += std::string("| `") + s.name + "` | `" + s.flag + "` | " +
           std::to_string(defaults.*(s.field)) + " | " + s.help + " |\n";
  }
  return out;
}

}  // namespace ds::server
