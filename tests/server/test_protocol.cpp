// Unit tests of request parsing and validation (reliability.md HJ1-HJ10, OP1-OP11, CX3) with each
// limit of the limits table at its cap and cap+1, and of the response, chunk and SSE writers.
#include <gtest/gtest.h>

#include <pthread.h>
#include <fstream>
#include <sstream>

#include <thread>

#include "server/http_error.h"
#include "server/limits.h"
#include "server/openai_protocol.h"

namespace ds::server {
namespace {

ModelContext Model() {
  return ModelContext{"m", 259, 512};
}

std::optional<HttpError> Chat(const std::string& body, ParsedRequest* out = nullptr,
                              const ServerLimits& limits = {}) {
  Json j;
  if (auto e = parse_json_body(body, limits, &j)) return e;
  ParsedRequest p;
  auto e = parse_chat_request(j, limits, Model(), out ? out : &p);
  return e;
}

std::optional<HttpError> Completion(const std::string& body, ParsedRequest* out = nullptr,
                                    const ServerLimits& limits = {}) {
  Json j;
  if (auto e = parse_json_body(body, limits, &j)) return e;
  ParsedRequest p;
  return parse_completion_request(j, limits, Model(), out ? out : &p);
}

const std::string kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

std::string ChatWith(const std::string& field) {
  return "{" + kMsgs + "," + field + "}";
}

TEST(HJ1, MalformedBodiesAre400) {
  const std::vector<std::string> bodies = {
      "",    "{",     "{\"a\":",    "{\"messages\":[}",     "nul",
      "{}x", "{} {}", "{\"a\":1,}", std::string("{}\0", 3), "{'a':1}"};
  for (const std::string& body : bodies) {
    Json j;
    auto e = parse_json_body(body, ServerLimits{}, &j);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->type, "invalid_request_error");
  }
}

TEST(HJ2, NonObjectBodiesAre400) {
  for (const char* body : {"[]", "[1,2]", "\"text\"", "42", "null", "true"}) {
    Json j;
    auto e = parse_json_body(body, ServerLimits{}, &j);
    ASSERT_TRUE(e) << body;
    EXPECT_NE(e->message.find("JSON object"), std::string::npos);
  }
}

TEST(HJ5, InvalidUtf8AndLoneSurrogatesAre400) {
  for (std::string body :
       {std::string("{\"prompt\":\"\xff\"}"), std::string("{\"prompt\":\"\xc0\xaf\"}"),
        std::string("{\"prompt\":\"\xed\xa0\x80\"}"), std::string("{\"prompt\":\"\\ud800\"}"),
        std::string("{\"prompt\":\"\xe4\xbd\"}")}) {
    Json j;
    auto e = parse_json_body(body, ServerLimits{}, &j);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->status, 400);
    // HJ10: the message is fixed text: valid UTF-8 without the client's bytes.
    EXPECT_EQ(e->message.find('\xff'), std::string::npos);
    EXPECT_NO_THROW(Json::parse(error_body(*e)));
  }
}

TEST(HJ6, DeepNestingIs400WithoutStackOverflow) {
  // Run on a thread with a 512 KiB stack (cpp-httplib workers get the default 8 MiB): 100 000
  // levels fit only if the parser does not recurse per level.
  struct Ctx {
    std::optional<HttpError> result;
  } ctx;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 512 * 1024);
  pthread_t thread;
  auto body = [](void* p) -> void* {
    auto* c = static_cast<Ctx*>(p);
    std::string deep(100000, '[');
    Json j;
    c->result = parse_json_body("{\"a\":" + deep, ServerLimits{}, &j);
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, body, &ctx), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  const auto& result = ctx.result;
  ASSERT_TRUE(result);
  EXPECT_NE(result->message.find("nested deeper"), std::string::npos);
}

TEST(HJ6, JsonDepthAtCapAndCapPlusOne) {
  ServerLimits l;
  l.max_json_depth = 8;
  auto nest = [](int depth) {  // object + (depth - 1) arrays
    return "{\"a\":" + std::string(size_t(depth - 1), '[') + std::string(size_t(depth - 1), ']') +
           "}";
  };
  Json j;
  EXPECT_FALSE(parse_json_body(nest(8), l, &j));
  EXPECT_TRUE(parse_json_body(nest(9), l, &j));
}

TEST(HJ9, DuplicateKeysAre400) {
  auto e = Completion(R"({"prompt":"x","max_tokens":1,"max_tokens":100000000})");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("duplicate key"), std::string::npos);
}

TEST(HJ7, WrongTypesNameTheField) {
  struct Case {
    std::string field, param;
  };
  const std::vector<Case> cases = {
      {R"("max_tokens":"10")", "max_tokens"},
      {R"("temperature":null)", "temperature"},
      {R"("temperature":"1")", "temperature"},
      {R"("n":1.5)", "n"},
      {R"("stop":{})", "stop"},
      {R"("stop":[1])", "stop"},
      {R"("top_p":true)", "top_p"},
      {R"("top_k":1.5)", "top_k"},
      {R"("seed":"1")", "seed"},
      {R"("stream":"yes")", "stream"},
      {R"("logit_bias":[])", "logit_bias"},
      {R"("logprobs":1)", "logprobs"},
      {R"("top_logprobs":"2","logprobs":true)", "top_logprobs"},
      {R"("stream_options":{"include_usage":1})", "stream_options.include_usage"},
      {R"("presence_penalty":[])", "presence_penalty"},
      {R"("ignore_eos":0)", "ignore_eos"},
      {R"("min_p":{})", "min_p"},
      {R"("model":5)", "model"},
      {R"("max_completion_tokens":2.0)", "max_completion_tokens"},
      {R"("stop_token_ids":"1")", "stop_token_ids"},
      {R"("tools":{})", "tools"},
      {R"("chat_template_kwargs":[])", "chat_template_kwargs"},
  };
  for (const auto& c : cases) {
    auto e = Chat(ChatWith(c.field));
    ASSERT_TRUE(e) << c.field;
    EXPECT_EQ(e->status, 400) << c.field;
    EXPECT_EQ(e->param, c.param) << c.field;
  }
  auto e = Chat(R"({"messages":"hi"})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages");
  e = Chat(R"({"messages":[{"role":"user","content":5}]})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages[0].content");
  e = Completion(R"({"prompt":{}})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
}

TEST(HJ8, OutOfRangeNumbersAre400) {
  for (const char* field : {R"("max_tokens":1e300)",
                            R"("max_tokens":0)",
                            R"("max_tokens":-1)",
                            R"("max_tokens":-0)",
                            R"("max_tokens":4294967297)",
                            R"("max_tokens":18446744073709551615)",
                            R"("n":4294967297)",
                            R"("seed":-1)",
                            R"("seed":1.5)",
                            R"("temperature":1e400)",
                            R"("temperature":-0.5)",
                            R"("temperature":2.5)",
                            R"("top_p":0)",
                            R"("top_p":1.0000001)",
                            R"("top_k":-2)",
                            R"("min_p":1.5)",
                            R"("presence_penalty":2.5)",
                            R"("frequency_penalty":-3)",
                            R"("repetition_penalty":0)",
                            R"("max_tokens":513)"}) {
    auto e = Chat(ChatWith(field));
    ASSERT_TRUE(e) << field;
    EXPECT_EQ(e->status, 400) << field;
    // 1e400 overflows the JSON number parser itself (no field to name).
    if (std::string(field).find("1e400") == std::string::npos) {
      EXPECT_FALSE(e->param.empty()) << field;
    }
  }
  // NaN / Infinity literals are not JSON.
  EXPECT_TRUE(Chat(ChatWith(R"("temperature":NaN)")));
  EXPECT_TRUE(Chat(ChatWith(R"("temperature":Infinity)")));
}

TEST(OP1, MaxTokensBoundsAndTheMaxCompletionTokensRule) {
  ParsedRequest p;
  EXPECT_FALSE(Chat(ChatWith(R"("max_tokens":512)"), &p));
  EXPECT_EQ(p.sampling.max_tokens, 512);
  EXPECT_FALSE(Chat(ChatWith(R"("max_tokens":1)"), &p));
  EXPECT_EQ(p.sampling.max_tokens, 1);
  EXPECT_FALSE(Chat(ChatWith(R"("max_tokens":7,"max_completion_tokens":9)"), &p));
  EXPECT_EQ(p.sampling.max_tokens, 9);
  EXPECT_FALSE(Chat(ChatWith(R"("max_tokens":null)"), &p));
  EXPECT_EQ(p.sampling.max_tokens, -1);
}

TEST(OP2, SamplingMeanings) {
  ParsedRequest p;
  ASSERT_FALSE(Chat(
      ChatWith(R"("top_k":-1,"temperature":0,"top_p":1,"min_p":0,"seed":18446744073709551615)"),
      &p));
  EXPECT_EQ(p.sampling.top_k, -1);
  EXPECT_EQ(p.sampling.temperature, 0.0);
  EXPECT_EQ(*p.sampling.seed, 18446744073709551615ull);
  ASSERT_FALSE(Chat(ChatWith(R"("temperature":-0.0,"top_p":4.9e-324)"), &p));
  EXPECT_EQ(p.sampling.temperature, 0.0);
}

TEST(OP3, NAtCapAndCapPlusOne) {
  EXPECT_FALSE(Chat(ChatWith(R"("n":1)")));
  auto e = Chat(ChatWith(R"("n":2)"));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "n");
  EXPECT_TRUE(Completion(R"({"prompt":"x","best_of":2})"));
}

TEST(OP4, TopLogprobsAtCapAndCapPlusOne) {
  ServerLimits l;
  ParsedRequest p;
  EXPECT_FALSE(Chat(ChatWith(R"("logprobs":true,"top_logprobs":20)"), &p));
  EXPECT_EQ(p.sampling.logprobs, 20);
  EXPECT_TRUE(Chat(ChatWith(R"("logprobs":true,"top_logprobs":21)")));
  EXPECT_TRUE(Chat(ChatWith(R"("top_logprobs":2)")));  // needs logprobs: true
  EXPECT_FALSE(Completion(R"({"prompt":"x","logprobs":20})", &p));
  EXPECT_EQ(p.sampling.logprobs, 20);
  EXPECT_TRUE(Completion(R"({"prompt":"x","logprobs":21})"));
  l.max_top_logprobs = 3;
  EXPECT_FALSE(Completion(R"({"prompt":"x","logprobs":3})", nullptr, l));
  EXPECT_TRUE(Completion(R"({"prompt":"x","logprobs":4})", nullptr, l));
}

std::string StopArray(int n, size_t bytes) {
  std::string s = "\"stop\":[";
  for (int i = 0; i < n; ++i)
    s += (i ? "," : "") + ("\"" + std::string(bytes, char('a' + i)) + "\"");
  return s + "]";
}

TEST(OP5, StopStringsAtCapAndCapPlusOne) {
  ServerLimits l;
  EXPECT_FALSE(Chat(ChatWith(StopArray(int(l.max_stop_strings), 3))));
  EXPECT_TRUE(Chat(ChatWith(StopArray(int(l.max_stop_strings) + 1, 3))));
  EXPECT_FALSE(Chat(ChatWith(StopArray(1, size_t(l.max_stop_string_bytes)))));
  auto e = Chat(ChatWith(StopArray(1, size_t(l.max_stop_string_bytes) + 1)));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "stop");
  EXPECT_TRUE(Chat(ChatWith(R"("stop":"")")));
  EXPECT_TRUE(Chat(ChatWith(R"("stop":["a",""])")));
  ParsedRequest p;
  EXPECT_FALSE(Chat(ChatWith(R"("stop":"END")"), &p));
  ASSERT_EQ(p.sampling.stop.size(), 1u);
  EXPECT_EQ(p.sampling.stop[0], "END");
}

TEST(OP5, StopTokenIdsAtCapAndCapPlusOne) {
  ServerLimits l;
  auto ids = [](int64_t n) {
    std::string s = "\"stop_token_ids\":[";
    for (int64_t i = 0; i < n; ++i) s += (i ? ",5" : "5");
    return s + "]";
  };
  EXPECT_FALSE(Chat(ChatWith(ids(l.max_stop_token_ids))));
  EXPECT_TRUE(Chat(ChatWith(ids(l.max_stop_token_ids + 1))));
  EXPECT_TRUE(Chat(ChatWith(R"("stop_token_ids":[259])")));
  EXPECT_TRUE(Chat(ChatWith(R"("stop_token_ids":[-1])")));
}

TEST(OP6, LogitBias) {
  ServerLimits l;
  auto bias = [](int64_t n) {
    std::string s = "\"logit_bias\":{";
    for (int64_t i = 0; i < n; ++i)
      s += (i ? "," : "") + ("\"" + std::to_string(i % 259 + (i / 259) * 0) + "\":1");
    return s + "}";
  };
  l.max_logit_bias_entries = 5;
  EXPECT_FALSE(Chat(ChatWith(bias(5)), nullptr, l));
  EXPECT_TRUE(Chat(ChatWith(bias(6)), nullptr, l));
  for (const char* bad :
       {R"("logit_bias":{"259":1})", R"("logit_bias":{"-1":1})", R"("logit_bias":{"abc":1})",
        R"("logit_bias":{"5":1e30})", R"("logit_bias":{"5":-101})", R"("logit_bias":{"5":"1"})",
        R"("logit_bias":{"05":1})", R"("logit_bias":{"99999999999":1})"}) {
    auto e = Chat(ChatWith(bad));
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->param, "logit_bias") << bad;
  }
  ParsedRequest p;
  ASSERT_FALSE(Chat(ChatWith(R"("logit_bias":{"258":-100,"0":100})"), &p));
  EXPECT_EQ(p.sampling.logit_bias.at(258), -100.0);
}

TEST(OP7, TokenIdPrompts) {
  ParsedRequest p;
  ASSERT_FALSE(Completion(R"({"prompt":[0,5,258]})", &p));
  EXPECT_TRUE(p.prompt_is_ids);
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{0, 5, 258}));
  ASSERT_FALSE(Completion(R"({"prompt":[[7,8]]})", &p));
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{7, 8}));
  for (const char* bad : {R"({"prompt":[259]})", R"({"prompt":[-1]})", R"({"prompt":[1.5]})",
                          R"({"prompt":[[1],[2]]})", R"({"prompt":["a","b"]})", R"({"prompt":[]})",
                          R"({"prompt":[[]]})"}) {
    auto e = Completion(bad);
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->param, "prompt") << bad;
  }
  ServerLimits l;
  l.max_prompt_token_ids = 3;
  EXPECT_FALSE(Completion(R"({"prompt":[1,2,3]})", nullptr, l));
  EXPECT_TRUE(Completion(R"({"prompt":[1,2,3,4]})", nullptr, l));
}

TEST(OP9, UnknownModelIs404AndUnknownFieldsAreIgnored) {
  auto e = Chat(ChatWith(R"("model":"gpt-4")"));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 404);
  EXPECT_EQ(e->code, "model_not_found");
  EXPECT_FALSE(Chat(ChatWith(R"("model":"m","some_future_field":{"x":[1]})")));
  EXPECT_TRUE(Chat(ChatWith(R"("response_format":{"type":"json_object"})")));
  EXPECT_FALSE(Chat(ChatWith(R"("response_format":{"type":"text"})")));
}

TEST(OP10, ToolsAndToolChoice) {
  const std::string tool =
      R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}})";
  ParsedRequest p;
  ASSERT_FALSE(Chat(ChatWith("\"tools\":[" + tool + "]"), &p));
  EXPECT_NE(p.chat.tools_json.find("get_weather"), std::string::npos);
  ASSERT_FALSE(Chat(ChatWith("\"tools\":[" + tool + "],\"tool_choice\":\"none\""), &p));
  EXPECT_TRUE(p.chat.tools_json.empty());
  for (const std::string& bad :
       {std::string(R"("tools":[{"type":"function","function":{"name":"a\"b"}}])"),
        std::string(R"("tools":[{"type":"function","function":{"name":"｜DSML｜"}}])"),
        std::string(R"("tools":[{"type":"function","function":{"name":"f","parameters":[]}}])"),
        std::string(R"("tools":[{"type":"code","function":{"name":"f"}}])"),
        "\"tools\":[" + tool +
            "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}",
        "\"tools\":[" + tool + "],\"tool_choice\":\"sometimes\""}) {
    EXPECT_TRUE(Chat(ChatWith(bad))) << bad;
  }
  ServerLimits l;
  l.max_tools = 2;
  EXPECT_FALSE(Chat(ChatWith("\"tools\":[" + tool + "," + tool + "]"), nullptr, l));
  EXPECT_TRUE(Chat(ChatWith("\"tools\":[" + tool + "," + tool + "," + tool + "]"), nullptr, l));
}

TEST(OP11, MediaAndEmbeddingsAre400) {
  EXPECT_TRUE(Chat(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]})"));
  EXPECT_TRUE(Completion(R"({"prompt":"x","prompt_embeds":"AAAA"})"));
  ParsedRequest p;
  ASSERT_FALSE(Chat(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
      &p));
  EXPECT_EQ(*p.chat.messages[0].content, "a\nb");
}

TEST(CX3, EmptyPromptsAndSystemOnlyAre400) {
  EXPECT_TRUE(Completion(R"({"prompt":""})"));
  EXPECT_TRUE(Completion(R"({})"));
  EXPECT_TRUE(Chat(R"({"messages":[]})"));
  EXPECT_TRUE(Chat(R"({"messages":[{"role":"system","content":"s"}]})"));
  EXPECT_TRUE(Chat(R"({"messages":[{"role":"wizard","content":"s"}]})"));
  EXPECT_TRUE(Chat(R"({"messages":[{"role":"user"}]})"));
  EXPECT_TRUE(Chat(R"({"messages":[1]})"));
}

TEST(Limits, MessagesAtCapAndCapPlusOne) {
  ServerLimits l;
  l.max_messages = 3;
  auto msgs = [](int n) {
    std::string s = "{\"messages\":[";
    for (int i = 0; i < n; ++i) s += std::string(i ? "," : "") + R"({"role":"user","content":"x"})";
    return s + "]}";
  };
  EXPECT_FALSE(Chat(msgs(3), nullptr, l));
  EXPECT_TRUE(Chat(msgs(4), nullptr, l));
}

TEST(CX1, ContextOverflowWording) {
  EXPECT_FALSE(check_context(511, -1, 512));
  EXPECT_FALSE(check_context(500, 12, 512));
  auto e = check_context(512, -1, 512);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "context_length_exceeded");
  EXPECT_NE(e->message.find("maximum context length is 512 tokens"), std::string::npos);
  Json j = error_json(*e);
  EXPECT_EQ(j["error"]["n_prompt_tokens"], 512);
  EXPECT_EQ(j["error"]["n_ctx"], 512);
  EXPECT_TRUE(check_context(500, 13, 512));
}

TEST(Thinking, ChatTemplateKwargs) {
  ParsedRequest p;
  ASSERT_FALSE(
      Chat(ChatWith(R"("chat_template_kwargs":{"thinking":true},"reasoning_effort":"max")"), &p));
  EXPECT_TRUE(p.chat.thinking);
  EXPECT_EQ(p.output_mode, deepserve::OutputMode::kChatThinking);
  EXPECT_EQ(p.chat.reasoning_effort, "max");
  ASSERT_FALSE(Chat(ChatWith(R"("reasoning_effort":"medium")"), &p));
  EXPECT_EQ(p.chat.reasoning_effort, "");
  EXPECT_EQ(p.output_mode, deepserve::OutputMode::kChat);
  EXPECT_TRUE(Chat(ChatWith(R"("reasoning_effort":"extreme")")));
}

TEST(Writers, ChatResponseChunksAndUsage) {
  ParsedRequest p;
  ASSERT_FALSE(Chat(
      ChatWith(
          R"("logprobs":true,"top_logprobs":1,"stream":true,"stream_options":{"include_usage":true},"chat_template_kwargs":{"thinking":true})"),
      &p));
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  ResponseMeta meta{"chatcmpl-1", 7, "m"};
  deepserve::RequestEvent ev;
  ev.text = "Hi";
  ev.reasoning = "hmm";
  ev.tokens.push_back({5, "Hi", -0.5f, {{6, "Ho", -1.5f}}});
  int index = 0;
  auto chunk = chat_chunk(meta, ev, p, /*first=*/true, &index);
  ASSERT_TRUE(chunk);
  const Json& c = (*chunk)["choices"][0];
  EXPECT_EQ(c["delta"]["role"], "assistant");
  EXPECT_EQ(c["delta"]["content"], "Hi");
  EXPECT_EQ(c["delta"]["reasoning_content"], "hmm");
  EXPECT_EQ(c["logprobs"]["content"][0]["top_logprobs"][0]["token"], "Ho");
  EXPECT_TRUE((*chunk)["usage"].is_null());
  EXPECT_EQ((*chunk)["object"], "chat.completion.chunk");
  deepserve::RequestEvent empty;
  EXPECT_FALSE(chat_chunk(meta, empty, p, false, &index));

  GenerationResult r;
  ev.finished = true;
  ev.finish_reason = deepserve::FinishReason::kToolCalls;
  ev.tool_calls.push_back({"call_1", "f", "{}"});
  ev.usage = {3, 4, 1};
  r.add(ev);
  Json resp = chat_response(meta, r, p);
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(resp["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(resp["choices"][0]["message"]["reasoning_content"], "hmm");
  EXPECT_EQ(resp["usage"]["total_tokens"], 7);
  EXPECT_EQ(resp["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  Json u = usage_chunk(meta, p, ev.usage);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 4);
}

TEST(Writers, CompletionLogprobsOffsets) {
  ParsedRequest p;
  ASSERT_FALSE(Completion(R"({"prompt":"x","logprobs":1})", &p));
  ResponseMeta meta{"cmpl-1", 7, "m"};
  GenerationResult r;
  deepserve::RequestEvent ev;
  ev.text = "abcd";
  ev.tokens = {{5, "ab", -0.5f, {{6, "x", -1.0f}}}, {7, "cd", -0.25f, {{8, "y", -2.0f}}}};
  ev.finished = true;
  ev.finish_reason = deepserve::FinishReason::kLength;
  r.add(ev);
  Json resp = completion_response(meta, r, p);
  const Json& lp = resp["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json({"ab", "cd"}));
  EXPECT_EQ(lp["text_offset"], Json({0, 2}));
  EXPECT_EQ(lp["top_logprobs"][1]["y"], -2.0);
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(resp["object"], "text_completion");
}

TEST(Writers, SseAndInvalidUtf8NeverThrow) {
  Json v = {{"t", std::string("a\xff\xfe b")}};
  std::string s;
  EXPECT_NO_THROW(s = sse_data(v));
  EXPECT_EQ(s.rfind("data: ", 0), 0u);
  EXPECT_EQ(s.substr(s.size() - 2), "\n\n");
  Json back = Json::parse(s.substr(6));
  EXPECT_EQ(back["t"], "a\xef\xbf\xbd\xef\xbf\xbd b");
  EXPECT_STREQ(sse_done(), "data: [DONE]\n\n");
}

TEST(AU6, LogEscape) {
  EXPECT_EQ(log_escape("a\nb\x1b[31m\"", 64), "a\\nb\\x1b[31m\\\"");
  EXPECT_EQ(log_escape(std::string(100, 'x'), 4), "xxxx...");
  EXPECT_EQ(log_escape("\xe4\xbd\xa0", 64), "\\xe4\\xbd\\xa0");
}

TEST(Limits, DocsListEveryLimitWithItsDefault) {
  std::ifstream f(std::string(DS_SOURCE_DIR) + "/docs/server.md");
  ASSERT_TRUE(f.good()) << "docs/server.md missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  std::istringstream rows(limits_markdown());
  std::string row;
  while (std::getline(rows, row)) {
    EXPECT_NE(doc.find(row), std::string::npos) << "docs/server.md lacks the row: " << row;
  }
}

TEST(Errors, EngineErrorMapping) {
  deepserve::ApiError a;
  a.kind = deepserve::ErrorKind::kOverloaded;
  a.message = "queue full";
  HttpError e = from_api_error(a);
  EXPECT_EQ(e.status, 503);
  EXPECT_TRUE(e.retry_after);
  a.kind = deepserve::ErrorKind::kInternal;
  a.message = "secret detail";
  e = from_api_error(a);
  EXPECT_EQ(e.status, 500);
  EXPECT_EQ(e.message.find("secret"), std::string::npos);
  a.kind = deepserve::ErrorKind::kNotFound;
  EXPECT_EQ(from_api_error(a).status, 404);
  a.kind = deepserve::ErrorKind::kUnavailable;
  EXPECT_EQ(from_api_error(a).status, 503);
  Json j = error_json(bad_request("m", "p", "c"));
  EXPECT_EQ(j["error"]["param"], "p");
  EXPECT_EQ(j["error"]["code"], "c");
  EXPECT_TRUE(error_json(bad_request("m"))["error"]["param"].is_null());
}

}  // namespace
}  // namespace ds::server
