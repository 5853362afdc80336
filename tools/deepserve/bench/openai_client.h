// The HTTP side of `deepserve bench`: the base URL, the request bodies of the OpenAI
// completions and chat-completions APIs (streaming, with stream_options.include_usage so the
// server reports token counts), the meaning of each streamed chunk, and a blocking streaming
// client (one per worker thread; cpp-httplib underneath) that times every chunk as it arrives.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "bench/metrics.h"
#include "core/json.h"
#include "core/status.h"

namespace ds::bench {

using Clock = std::chrono::steady_clock;

// http://host[:port][/prefix]. https is refused (this client is built without TLS on purpose:
// benchmarks run next to the server).
struct BaseUrl {
  std::string host;
  int port = 80;
  std::string path_prefix;  // "" or "/something", no trailing '/'
  std::string to_string() const;
};
Result<BaseUrl> parse_base_url(std::string_view url);

enum class ApiKind { kCompletions, kChat };

// What a request asks the server for.
struct RequestSpec {
  std::string model;
  std::string prompt;
  int64_t max_tokens = 0;
  bool ignore_eos = false;
  std::optional<double> temperature;
  Json extra_body = Json::object();  // merged into the body last (overrides)
};
// The JSON body: {"model", "prompt" | "messages", "max_tokens" (+ "max_completion_tokens" for
// chat), "stream": true, "stream_options": {"include_usage": true}, ["ignore_eos"],
// ["temperature"], extra...}.
std::string build_request_body(ApiKind kind, const RequestSpec& spec);

// One parsed `data:` payload of the stream.
struct ChunkInfo {
  bool done = false;  // the "[DONE]" sentinel
  std::string text;   // generated text it carries (completions: choices[0].text; chat:
                      // delta.reasoning_content + delta.content)
  std::optional<int64_t> completion_tokens, prompt_tokens;  // from "usage" when present
  std::optional<std::string> error;  // an {"error": ...} object sent inside the stream
};
Result<ChunkInfo> interpret_chunk(std::string_view data, ApiKind kind);

struct ClientOptions {
  double connect_timeout_s = 10;
  double read_timeout_s = 3600;  // longest silence allowed inside a response
  std::string api_key;           // sent as "Authorization: Bearer <key>" when not empty
};

// A keep-alive connection to one server. Not thread-safe: one per worker thread.
class StreamClient {
 public:
  StreamClient(const BaseUrl& base, const ClientOptions& options);
  ~StreamClient();
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  // POSTs `body` to `path` (after the base URL's prefix), reads the event stream and returns the
  // timeline relative to `origin` (start_s = send time). success=false with a message on a
  // non-200 status, a transport error, an error event, or a stream without generated text.
  // prompt_len / output_tokens are the usage figures when the server sent them (else 0 and
  // output_tokens_from_usage = false: the caller counts).
  RequestRecord stream(const std::string& path, const std::string& body, ApiKind kind,
                       Clock::time_point origin);

  // GET `path`; the body on status 200, else an error naming the status.
  Result<std::string> get(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The first model id the server lists at /v1/models.
Result<std::string> fetch_first_model(const BaseUrl& base, const ClientOptions& options);

}  // namespace ds::bench
