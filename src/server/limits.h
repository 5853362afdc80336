// The server's limits table: every numeric cap that drives request validation, the `deepserve
// serve --help` text (each row is a flag with an environment variable) and docs/server.md
// (tests/server checks that the doc lists every row with its default). reliability.md §2 asks for
// exactly one such table; the per-request budget of RE1 follows from these rows (n = 1,
// max_tokens <= max_model_len, top_logprobs <= 20).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds::server {

struct ServerLimits {
  int64_t max_body_bytes = 8 << 20;        // request body (413 above; checked before parsing)
  int64_t max_header_count = 100;          // request headers (431 above)
  int64_t max_json_depth = 32;             // nesting of the JSON body
  int64_t max_n = 1;                       // choices per request (only 1 is supported)
  int64_t max_stop_strings = 4;            // entries of `stop`
  int64_t max_stop_string_bytes = 256;     // bytes of one stop string
  int64_t max_stop_token_ids = 64;         // entries of `stop_token_ids`
  int64_t max_top_logprobs = 20;           // `top_logprobs` (chat) / `logprobs` (completions)
  int64_t max_logit_bias_entries = 300;    // entries of `logit_bias`
  int64_t max_messages = 2048;             // chat messages
  int64_t max_tools = 128;                 // tool definitions
  int64_t max_prompt_token_ids = 1 << 20;  // ids in a token-id prompt / detokenize
  int64_t read_timeout_s = 30;             // whole body deadline; per-read timeout of heads
  int64_t write_timeout_s = 30;            // a blocked write (slow reader) aborts the request
  int64_t keep_alive_timeout_s = 5;        // idle keep-alive connections are closed after this
  int64_t request_timeout_s = 1800;        // generation time; past it finish_reason "length"
  int64_t retry_after_s = 1;               // Retry-After of 429/503 answers
  int64_t stall_timeout_s = 60;            // /health fails when work waits and no step ran
};

// One row of the table. `field` points into ServerLimits.
struct LimitSpec {
  const char* name;  // snake_case name (docs, errors)
  const char* flag;  // --flag of `deepserve serve`
  const char* env;   // environment variable mirroring the flag
  int64_t ServerLimits::*field;
  int64_t min_value;  // the flag's accepted range
  int64_t max_value;
  const char* help;  // one line for --help and the docs
};

// The table, in documentation order.
const std::vector<LimitSpec>& limit_table();

// Markdown table (name | flag | default | meaning) of the defaults, for docs/server.md.
std::string limits_markdown();

}  // namespace ds::server
