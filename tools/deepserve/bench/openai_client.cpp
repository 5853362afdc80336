// Streaming OpenAI-API client of `deepserve bench` (see openai_client.h). Chunk timing follows
// vllm/benchmarks/lib/endpoint_request_func.py: a chunk is timed when the bytes completing it
// arrive; only chunks that carry generated text count as tokens (as SGLang's bench_serving
// does), so a role-only first chat chunk or the trailing usage chunk moves neither TTFT nor
// E2E.
#include "bench/openai_client.h"

#include <httplib.h>

#include <cctype>
#include <charconv>

#include "bench/sse_parser.h"

namespace ds::bench {
namespace {

constexpr size_t kMaxErrorBody = 2000;         // bytes of an error body kept in the message
constexpr size_t kMaxPendingBytes = 64 << 20;  // an event larger than this is a broken stream

double seconds_since(Clock::time_point origin, Clock::time_point t) {
  return std::chrono::duration<double>(t - origin).count();
}

std::optional<int64_t> json_int(const Json& obj, const char* key) {
  if (!obj.is_object()) return std::nullopt;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

std::string json_string_or_empty(const Json& obj, const char* key) {
  if (!obj.is_object()) return {};
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

}  // namespace

std::string BaseUrl::to_string() const {
  return "http://" + host + ":" + std::to_string(port) + path_prefix;
}

Result<BaseUrl> parse_base_url(std::string_view url) {
  BaseUrl out;
  std::string_view rest = url;
  if (rest.starts_with("https://"))
    return invalid_argument("base URL \"" + std::string(url) +
                            "\": https is not supported by deepserve bench (use http)");
  if (rest.starts_with("http://"))
    rest.remove_prefix(7);
  else if (rest.find("://") != std::string_view::npos)
    return invalid_argument("base URL \"" + std::string(url) + "\": only http:// is supported");
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash);
    while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    out.path_prefix = std::string(prefix);
  }
  if (hostport.empty())
    return invalid_argument("base URL \"" + std::string(url) + "\" has no host");
  size_t colon = hostport.rfind(':');
  if (hostport.front() == '[') {  // [ipv6]:port
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos)
      return invalid_argument("base URL \"" + std::string(url) + "\": unclosed '['");
    out.host = std::string(hostport.substr(1, close - 1));
    colon = close + 1 < hostport.size() && hostport[close + 1] == ':' ? close + 1
                                                                      : std::string_view::npos;
  } else {
    out.host = std::string(hostport.substr(0, colon));
  }
  if (colon != std::string_view::npos) {
    std::string_view port = hostport.substr(colon + 1);
    int value = 0;
    auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || p != port.data() + port.size() || value < 1 || value > 65535)
      return invalid_argument("base URL \"" + std::string(url) + "\": bad port \"" +
                              std::string(port) + "\"");
    out.port = value;
  }
  if (out.host.empty())
    return invalid_argument("base URL \"" + std::string(url) + "\" has no host");
  return out;
}

std::string build_request_body(ApiKind kind, const RequestSpec& spec) {
  Json body = Json::object();
  body["model"] = spec.model;
  if (kind == ApiKind::kChat) {
    body["messages"] = Json::array({Json{{"role", "user"}, {"content", spec.prompt}}});
    body["max_completion_tokens"] = spec.max_tokens;
  } else {
    body["prompt"] = spec.prompt;
  }
  body["max_tokens"] = spec.max_tokens;
  body["stream"] = true;
  body["stream_options"] = Json{{"include_usage", true}};
  if (spec.ignore_eos) body["ignore_eos"] = true;
  if (spec.temperature) body["temperature"] = *spec.temperature;
  if (spec.extra_body.is_object())
    for (auto it = spec.extra_body.begin(); it != spec.extra_body.end(); ++it)
      body[it.key()] = it.value();
  return body.dump();
}

Result<ChunkInfo> interpret_chunk(std::string_view data, ApiKind kind) {
  ChunkInfo info;
  std::string_view trimmed = data;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back())))
    trimmed.remove_suffix(1);
  if (trimmed == "[DONE]") {
    info.done = true;
    return info;
  }
  Json j = Json::parse(trimmed.begin(), trimmed.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return corrupt("stream chunk is not a JSON object: " + std::string(trimmed.substr(0, 200)));
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    std::string msg = e->is_object() ? json_string_or_empty(*e, "message") : e->dump();
    info.error = msg.empty() ? e->dump() : msg;
    return info;
  }
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const Json& choice = (*c)[0];
    if (kind == ApiKind::kChat) {
      auto d = choice.is_object() ? choice.find("delta") : choice.end();
      if (choice.is_object() && d != choice.end()) {
        info.text =
            json_string_or_empty(*d, "reasoning_content") + json_string_or_empty(*d, "content");
      }
    } else {
      info.text = json_string_or_empty(choice, "text");
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    info.completion_tokens = json_int(*u, "completion_tokens");
    info.prompt_tokens = json_int(*u, "prompt_tokens");
  }
  return info;
}

struct StreamClient::Impl {
  BaseUrl base;
  ClientOptions options;
  httplib::Client client;
  Impl(const BaseUrl& b, const ClientOptions& o) : base(b), options(o), client(b.host, b.port) {
    auto split = [](double s) {
      const time_t sec = time_t(s);
      return std::make_pair(sec, time_t((s - double(sec)) * 1e6));
    };
    auto [cs, cus] = split(o.connect_timeout_s);
    auto [rs, rus] = split(o.read_timeout_s);
    client.set_connection_timeout(cs, cus);
    client.set_read_timeout(rs, rus);
    client.set_write_timeout(rs, rus);
    client.set_keep_alive(true);
    // Headers and body go out as separate writes: without TCP_NODELAY, Nagle's algorithm and
    // the server's delayed ACK hold the body back up to ~40 ms, all of it counted as TTFT.
    client.set_tcp_nodelay(true);
  }
  httplib::Headers headers() const {
    httplib::Headers h;
    if (!options.api_key.empty()) h.emplace("Authorization", "Bearer " + options.api_key);
    return h;
  }
};

StreamClient::StreamClient(const BaseUrl& base, const ClientOptions& options)
    : impl_(std::make_unique<Impl>(base, options)) {}
StreamClient::~StreamClient() = default;

Result<std::string> StreamClient::get(const std::string& path) {
  auto res = impl_->client.Get((impl_->base.path_prefix + path).c_str(), impl_->headers());
  if (!res)
    return io_error("GET " + impl_->base.to_string() + path + ": " +
                    httplib::to_string(res.error()));
  if (res->status != 200)
    return io_error("GET " + impl_->base.to_string() + path + ": HTTP " +
                    std::to_string(res->status) + " " + res->body.substr(0, kMaxErrorBody));
  return res->body;
}

RequestRecord StreamClient::stream(const std::string& path, const std::string& body, ApiKind kind,
                                   Clock::time_point origin) {
  RequestRecord rec;
  SseParser parser;
  int status = 0;
  std::string error_body;
  bool first = true;
  Clock::time_point last_token{};
  std::string failure;

  auto handle_events = [&](const std::vector<std::string>& events, Clock::time_point t) {
    for (const std::string& data : events) {
      auto info = interpret_chunk(data, kind);
      if (!info.ok()) {
        failure = info.status().message();
        return false;
      }
      if (info->error) {
        failure = "error event in stream: " + *info->error;
        return false;
      }
      if (info->completion_tokens) {
        rec.output_tokens = *info->completion_tokens;
        rec.output_tokens_from_usage = true;
      }
      if (info->prompt_tokens) rec.prompt_len = *info->prompt_tokens;
      if (info->text.empty()) continue;
      const double now_s = seconds_since(origin, t);
      if (first) {
        rec.ttft_s = now_s - rec.start_s;
        first = false;
      } else {
        rec.itl_s.push_back(seconds_since(last_token, t));
      }
      last_token = t;
      rec.latency_s = now_s - rec.start_s;
      rec.generated_text += info->text;
    }
    return true;
  };

  httplib::Request req;
  req.method = "POST";
  req.path = impl_->base.path_prefix + path;
  req.headers = impl_->headers();
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  req.body = body;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const Clock::time_point t = Clock::now();
    if (status != 200) {
      if (error_body.size() < kMaxErrorBody) error_body.append(data, len);
      return true;
    }
    if (!handle_events(parser.feed(std::string_view(data, len)), t)) return false;
    if (parser.buffered_bytes() > kMaxPendingBytes) {
      failure = "stream event larger than 64 MiB";
      return false;
    }
    return true;
  };

  const Clock::time_point start = Clock::now();
  rec.start_s = seconds_since(origin, start);
  auto res = impl_->client.send(req);
  if (failure.empty() && status == 200) handle_events(parser.finish(), Clock::now());

  if (!failure.empty()) {
    rec.error = failure;
  } else if (!res && status == 0) {
    rec.error = "POST " + impl_->base.to_string() + path + ": " + httplib::to_string(res.error());
  } else if (status != 200) {
    if (res && error_body.empty()) error_body = res->body;
    rec.error = "HTTP " + std::to_string(status) + ": " + error_body.substr(0, kMaxErrorBody);
  } else if (!res) {
    rec.error = "stream broken: " + httplib::to_string(res.error());
  } else if (first) {
    rec.error = "the stream carried no generated text (TTFT undefined)";
  } else {
    rec.success = true;
  }
  if (!rec.success) impl_->client.stop();  // do not reuse a connection in an unknown state
  return rec;
}

Result<std::string> fetch_first_model(const BaseUrl& base, const ClientOptions& options) {
  StreamClient client(base, options);
  DS_ASSIGN_OR_RETURN(std::string body, client.get("/v1/models"));
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty() || !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string())
    return corrupt("GET " + base.to_string() +
                   "/v1/models: no model id in the answer: " + body.substr(0, 300));
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace ds::bench
