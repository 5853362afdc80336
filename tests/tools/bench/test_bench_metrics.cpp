// Exact tests of the pure parts of `deepserve bench`: metric arithmetic on hand-made timelines
// (expected values worked out by hand from the vLLM / SGLang definitions, numpy's linear
// percentile), SSE parsing, chunk interpretation, URL parsing, Prometheus counters, arrival
// statistics, dataset length control, report JSON fields and SVG well-formedness.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "bench/arrivals.h"
#include "bench/dataset.h"
#include "bench/metrics.h"
#include "bench/openai_client.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "bench/sse_parser.h"
#include "bench/svg_plot.h"
#include "bench/sweep.h"
#include "common/temp_dir.h"
#include "tokenizer/default_tokenizer.h"

namespace ds::bench {
namespace {

constexpr double kExact = 1e-9;  // ms: float rounding only

TEST(Percentile, NumpyLinearInterpolation) {
  // numpy.percentile([40, 60, 80, 100], p): rank p/100 * 3.
  const std::vector<double> v = {100, 40, 80, 60};
  EXPECT_NEAR(percentile(v, 50), 70.0, kExact);
  EXPECT_NEAR(percentile(v, 90), 94.0, kExact);  // 80 + 0.7 * 20
  EXPECT_NEAR(percentile(v, 99), 99.4, kExact);  // 80 + 0.97 * 20
  EXPECT_NEAR(percentile(v, 0), 40.0, kExact);
  EXPECT_NEAR(percentile(v, 100), 100.0, kExact);
  EXPECT_NEAR(percentile({5}, 99), 5.0, kExact);
  EXPECT_EQ(percentile({}, 50), 0.0);
  EXPECT_NEAR(population_std({40, 60, 80, 100}), std::sqrt(500.0), kExact);
}

// Three successful requests and one failure (times in seconds):
//   A: start 0.000, TTFT 50 ms, chunks every 20 ms, 4 tokens, E2E 110 ms, 10 prompt tokens
//   B: start 0.010, TTFT 100 ms, gaps 30 + 30 ms, 3 tokens, E2E 160 ms, 20 prompt tokens
//   C: failed
//   D: start 0.200, one token at 70 ms, 30 prompt tokens
std::vector<RequestRecord> hand_timeline() {
  RequestRecord a, b, c, d;
  a.success = true, a.start_s = 0.0, a.ttft_s = 0.050, a.itl_s = {0.020, 0.020, 0.020};
  a.latency_s = 0.110, a.output_tokens = 4, a.prompt_len = 10;
  b.success = true, b.start_s = 0.010, b.ttft_s = 0.100, b.itl_s = {0.030, 0.030};
  b.latency_s = 0.160, b.output_tokens = 3, b.prompt_len = 20;
  c.success = false, c.error = "HTTP 500", c.prompt_len = 99, c.output_tokens = 99;
  d.success = true, d.start_s = 0.200, d.ttft_s = 0.070, d.latency_s = 0.070;
  d.output_tokens = 1, d.prompt_len = 30;
  return {a, b, c, d};
}

TEST(ComputeMetrics, HandTimelineExact) {
  const BenchMetrics m = compute_metrics(hand_timeline(), 1.0, {90, 99});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 60);
  EXPECT_EQ(m.total_output_tokens, 8);
  EXPECT_NEAR(m.request_throughput, 3.0, kExact);
  EXPECT_NEAR(m.output_throughput, 8.0, kExact);
  EXPECT_NEAR(m.input_throughput, 60.0, kExact);
  EXPECT_NEAR(m.total_token_throughput, 68.0, kExact);
  // Effective concurrency: (110 + 160 + 70) ms over 1 s. Peak: A and B overlap, D alone.
  EXPECT_NEAR(m.effective_concurrency, 0.34, kExact);
  EXPECT_EQ(m.peak_concurrency, 2);
  // TTFT {50, 100, 70}.
  EXPECT_NEAR(m.ttft.mean_ms, 220.0 / 3, kExact);
  EXPECT_NEAR(m.ttft.median_ms, 70.0, kExact);
  EXPECT_NEAR(m.ttft.percentiles_ms[0].second, 94.0, kExact);  // 70 + 0.8 * 30
  EXPECT_NEAR(m.ttft.percentiles_ms[1].second, 99.4, kExact);  // 70 + 0.98 * 30
  // TPOT per request: A (110-50)/3 = 20, B (160-100)/2 = 30, D has one token (none).
  EXPECT_NEAR(m.tpot.mean_ms, 25.0, kExact);
  EXPECT_NEAR(m.tpot.median_ms, 25.0, kExact);
  EXPECT_NEAR(m.tpot.percentiles_ms[0].second, 29.0, kExact);
  EXPECT_NEAR(m.tpot.percentiles_ms[1].second, 29.9, kExact);
  EXPECT_NEAR(m.tpot.std_ms, 5.0, kExact);
  // ITL pooled {20, 20, 20, 30, 30}: mean 24, median 20, p90 rank 3.6 -> 30.
  EXPECT_NEAR(m.itl.mean_ms, 24.0, kExact);
  EXPECT_NEAR(m.itl.median_ms, 20.0, kExact);
  EXPECT_NEAR(m.itl.percentiles_ms[0].second, 30.0, kExact);
  // E2E {110, 160, 70}.
  EXPECT_NEAR(m.e2el.mean_ms, 340.0 / 3, kExact);
  EXPECT_NEAR(m.e2el.median_ms, 110.0, kExact);
  EXPECT_NEAR(m.e2el.percentiles_ms[0].second, 150.0, kExact);  // 110 + 0.8 * 50
}

TEST(ComputeMetrics, TouchingIntervalsDoNotOverlapAndAllFailedIsZero) {
  RequestRecord a, b;
  a.success = b.success = true;
  a.start_s = 0, a.latency_s = 0.5, a.ttft_s = 0.1, a.output_tokens = 1;
  b.start_s = 0.5, b.latency_s = 0.5, b.ttft_s = 0.1, b.output_tokens = 1;  // starts as A ends
  EXPECT_EQ(compute_metrics({a, b}, 1.0, {99}).peak_concurrency, 1);
  RequestRecord f;
  const BenchMetrics m = compute_metrics({f, f}, 2.0, {99});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.ttft.mean_ms, 0.0);
  EXPECT_EQ(m.request_throughput, 0.0);
}

TEST(SseParser, SplitsEventsAcrossArbitraryPieces) {
  const std::string stream =
      ": ping\r\n\r\ndata: {\"a\":1}\n\nevent: x\ndata: line1\ndata: line2\n\ndata:[DONE]\r\n\r\n";
  // Feed one byte at a time and all at once: same events.
  for (size_t piece : {size_t(1), size_t(3), stream.size()}) {
    SseParser p;
    std::vector<std::string> events;
    for (size_t i = 0; i < stream.size(); i += piece) {
      auto e = p.feed(std::string_view(stream).substr(i, piece));
      events.insert(events.end(), e.begin(), e.end());
    }
    ASSERT_EQ(events.size(), 3u) << "piece " << piece;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "line1\nline2");
    EXPECT_EQ(events[2], "[DONE]");
    EXPECT_TRUE(p.finish().empty());
  }
  SseParser p;
  EXPECT_TRUE(p.feed("data: tail-without-blank-line").empty());
  auto tail = p.finish();
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0], "tail-without-blank-line");
}

TEST(InterpretChunk, TextUsageDoneAndErrors) {
  auto c = interpret_chunk(R"({"choices":[{"index":0,"text":" hi"}]})", ApiKind::kCompletions);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, " hi");
  auto role = interpret_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})",
                              ApiKind::kChat);
  ASSERT_TRUE(role.ok());
  EXPECT_TRUE(role->text.empty());  // a role-only chunk is not a token
  auto think = interpret_chunk(
      R"({"choices":[{"delta":{"reasoning_content":"hm","content":null}}]})", ApiKind::kChat);
  ASSERT_TRUE(think.ok());
  EXPECT_EQ(think->text, "hm");
  auto usage = interpret_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}})",
      ApiKind::kCompletions);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->completion_tokens, 34);
  EXPECT_EQ(usage->prompt_tokens, 12);
  EXPECT_TRUE(usage->text.empty());
  auto done = interpret_chunk("[DONE]", ApiKind::kChat);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
  auto err = interpret_chunk(R"({"error":{"message":"overloaded","code":503}})", ApiKind::kChat);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->error, "overloaded");
  EXPECT_FALSE(interpret_chunk("{not json", ApiKind::kChat).ok());
  EXPECT_FALSE(interpret_chunk("[1,2]", ApiKind::kChat).ok());
}

TEST(RequestBody, CompletionsAndChatShapes) {
  RequestSpec s;
  s.model = "m";
  s.prompt = "hello";
  s.max_tokens = 8;
  s.ignore_eos = true;
  s.extra_body = Json{{"top_k", 5}};
  Json c = Json::parse(build_request_body(ApiKind::kCompletions, s));
  EXPECT_EQ(c["prompt"], "hello");
  EXPECT_EQ(c["max_tokens"], 8);
  EXPECT_EQ(c["stream"], true);
  EXPECT_EQ(c["stream_options"]["include_usage"], true);
  EXPECT_EQ(c["ignore_eos"], true);
  EXPECT_EQ(c["top_k"], 5);
  EXPECT_FALSE(c.contains("temperature"));
  Json ch = Json::parse(build_request_body(ApiKind::kChat, s));
  EXPECT_EQ(ch["messages"][0]["role"], "user");
  EXPECT_EQ(ch["messages"][0]["content"], "hello");
  EXPECT_EQ(ch["max_completion_tokens"], 8);
  EXPECT_FALSE(ch.contains("prompt"));
}

TEST(BaseUrlParse, AcceptsAndRejects) {
  auto u = parse_base_url("http://127.0.0.1:8123/prefix/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8123);
  EXPECT_EQ(u->path_prefix, "/prefix");
  auto v6 = parse_base_url("http://[::1]:9000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9000);
  auto bare = parse_base_url("localhost");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->port, 80);
  EXPECT_FALSE(parse_base_url("https://x:1").ok());
  EXPECT_FALSE(parse_base_url("http://x:0").ok());
  EXPECT_FALSE(parse_base_url("http://x:99999").ok());
  EXPECT_FALSE(parse_base_url("http://x:12ab").ok());
  EXPECT_FALSE(parse_base_url("http://").ok());
  EXPECT_FALSE(parse_base_url("ftp://x").ok());
}

TEST(SpecCounters, PrometheusDeltas) {
  const std::string before =
      "# HELP x\ndeepserve:spec_decode_num_drafts_total 100\n"
      "deepserve:spec_decode_num_draft_tokens_total{model=\"a b\"} 300\n"
      "deepserve:spec_decode_num_accepted_tokens_total 150\n"
      "deepserve:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 99\n";
  const std::string after =
      "vllm:spec_decode_num_drafts_total 140\nvllm:spec_decode_num_draft_tokens_total 420\n"
      "vllm:spec_decode_num_accepted_tokens_total 240\n";
  auto b = parse_spec_counters(before);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->num_drafts, 100);
  EXPECT_EQ(b->draft_tokens, 300);
  EXPECT_EQ(b->accepted_tokens, 150);  // the per-position counter is not summed in
  auto d = spec_decode_delta(b, parse_spec_counters(after));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->num_drafts, 40);
  EXPECT_EQ(d->draft_tokens, 120);
  EXPECT_EQ(d->accepted_tokens, 90);
  EXPECT_NEAR(d->acceptance_rate, 75.0, kExact);
  EXPECT_NEAR(d->acceptance_length, 1.0 + 90.0 / 40.0, kExact);
  EXPECT_FALSE(parse_spec_counters("deepserve:num_requests_running 3\n"));
  EXPECT_FALSE(spec_decode_delta(b, std::nullopt));
}

TEST(Arrivals, PoissonStatisticsWithFixedSeed) {
  const int n = 20000;
  const double rate = 50.0;
  auto t = arrival_times(n, rate, 1.0, 1234);
  ASSERT_TRUE(t.ok());
  // Rescaled so the last arrival is exactly n / rate (vLLM).
  EXPECT_NEAR(t->back(), n / rate, 1e-9);
  std::vector<double> gaps;
  double prev = 0;
  for (double v : *t) {
    ASSERT_GE(v, prev);
    gaps.push_back(v - prev);
    prev = v;
  }
  const double m = mean(gaps), sd = population_std(gaps);
  EXPECT_NEAR(m, 1.0 / rate, 1e-9);
  // Exponential gaps: coefficient of variation 1 (standard error ~1/sqrt(n) ~ 0.7%).
  EXPECT_NEAR(sd / m, 1.0, 0.03);
  // P(gap > mean) = e^-1 for an exponential.
  int above = 0;
  for (double g : gaps) above += g > m;
  EXPECT_NEAR(double(above) / n, std::exp(-1.0), 0.015);
  // Same seed, same times; another seed, different times.
  EXPECT_EQ(*arrival_times(n, rate, 1.0, 1234), *t);
  EXPECT_NE(*arrival_times(n, rate, 1.0, 99), *t);
  // Burstiness 4 (gamma shape 4): CV 1/2.
  auto g = arrival_times(n, rate, 4.0, 7);
  ASSERT_TRUE(g.ok());
  std::vector<double> g_gaps;
  prev = 0;
  for (double v : *g) g_gaps.push_back(v - prev), prev = v;
  EXPECT_NEAR(population_std(g_gaps) / mean(g_gaps), 0.5, 0.02);
  // Infinite rate: everything at 0. Bad inputs: errors.
  auto inf = arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 0);
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ(*inf, std::vector<double>(5, 0.0));
  EXPECT_FALSE(arrival_times(5, 0.0, 1.0, 0).ok());
  EXPECT_FALSE(arrival_times(5, 1.0, 0.0, 0).ok());
}

TEST(Dataset, SampledLengthsStayInVllmRange) {
  RandomDatasetOptions o;
  o.num_prompts = 2000;
  o.input_len = 100;
  o.output_len = 10;
  o.range_ratio = 0.5;
  o.seed = 3;
  auto l = sample_lengths(o);
  ASSERT_TRUE(l.ok());
  std::set<int64_t> ins, outs;
  for (auto [i, out] : *l) {
    ASSERT_GE(i, 50);
    ASSERT_LE(i, 150);
    ASSERT_GE(out, 5);
    ASSERT_LE(out, 15);
    ins.insert(i);
    outs.insert(out);
  }
  EXPECT_EQ(ins.size(), 101u);  // every value of [50, 150] drawn at least once in 2000 draws
  EXPECT_EQ(outs.size(), 11u);
  o.range_ratio = 0;
  auto fixed = sample_lengths(o);
  ASSERT_TRUE(fixed.ok());
  for (auto [i, out] : *fixed) ASSERT_TRUE(i == 100 && out == 10);
  o.range_ratio = 1.0;
  EXPECT_FALSE(sample_lengths(o).ok());
  o.range_ratio = -0.1;
  EXPECT_FALSE(sample_lengths(o).ok());
}

TEST(Dataset, BrownTagsStripped) {
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' ,/, "
      "(/( it/pps said/vbd )/) ./.\n\n\n\tA/at new/jj paragraph/nn ./.\n";
  EXPECT_EQ(strip_brown_tags(tagged),
            "The Fulton County said \"no evidence\", (it said).\n\nA new paragraph.");
}

class RandomPrompts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = tok::load_default_tokenizer();
    if (t.ok()) tokenizer_ = new tok::Tokenizer(std::move(*t));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static tok::Tokenizer* tokenizer_;
};
tok::Tokenizer* RandomPrompts::tokenizer_ = nullptr;

TEST_F(RandomPrompts, ExactTokenCountsFromBrownCorpus) {
  if (!tokenizer_) GTEST_SKIP() << "default tokenizer not installed (npm ci)";
  auto dir = locate_brown_corpus();
  if (!dir.ok()) GTEST_SKIP() << dir.status().message();
  auto text = load_corpus_text(*dir, 200 << 10, 5);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_GE(text->size(), size_t(200 << 10));
  EXPECT_EQ(text->find("/at "), std::string::npos);  // tags are gone
  tok::EncodeOptions plain;
  plain.parse_special = false;
  auto ids = tokenizer_->encode(*text, plain);
  ASSERT_TRUE(ids.ok());
  RandomDatasetOptions o;
  o.num_prompts = 24;
  o.input_len = 200;
  o.output_len = 16;
  o.range_ratio = 0.9;  // lengths from 20 to 380
  o.seed = 11;
  auto reqs = make_random_requests(*tokenizer_, *ids, o);
  ASSERT_TRUE(reqs.ok()) << reqs.status().message();
  auto lengths = sample_lengths(o);
  ASSERT_EQ(reqs->size(), 24u);
  std::set<std::string> distinct;
  for (size_t i = 0; i < reqs->size(); ++i) {
    const SampleRequest& r = (*reqs)[i];
    EXPECT_EQ(r.prompt_len, (*lengths)[i].first);
    EXPECT_EQ(r.output_len, (*lengths)[i].second);
    auto re = tokenizer_->encode(r.prompt, plain);
    ASSERT_TRUE(re.ok());
    EXPECT_EQ(int64_t(re->size()), r.prompt_len) << r.prompt;
    distinct.insert(r.prompt);
  }
  EXPECT_EQ(distinct.size(), 24u);
  // Same seed, same prompts.
  auto again = make_random_requests(*tokenizer_, *ids, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[7].prompt, (*reqs)[7].prompt);
}

TEST_F(RandomPrompts, TextFileAndShareGpt) {
  if (!tokenizer_) GTEST_SKIP() << "default tokenizer not installed (npm ci)";
  ds::test::TempDir dir;
  const std::string text_path = dir.path() + "/text.txt";
  std::ofstream(text_path) << "It was a bright cold day in April, and the clocks were striking "
                              "thirteen. Winston Smith slipped quickly through the glass doors.";
  auto text = load_corpus_text(text_path, 0, 0);
  ASSERT_TRUE(text.ok());
  tok::EncodeOptions plain;
  plain.parse_special = false;
  auto ids = tokenizer_->encode(*text, plain);
  ASSERT_TRUE(ids.ok());
  RandomDatasetOptions o;
  o.num_prompts = 3;
  o.input_len = 100;  // longer than the text: the corpus repeats
  o.output_len = 4;
  auto reqs = make_random_requests(*tokenizer_, *ids, o);
  ASSERT_TRUE(reqs.ok()) << reqs.status().message();
  for (const auto& r : *reqs) EXPECT_EQ(int64_t(tokenizer_->encode(r.prompt, plain)->size()), 100);

  const std::string sg = dir.path() + "/sharegpt.json";
  std::ofstream(sg) << R"([
    {"id":"1","conversations":[{"from":"human","value":"What is the capital city of France?"},
                               {"from":"gpt","value":"The capital city of France is Paris."}]},
    {"id":"2","conversations":[{"from":"human","value":"Hi"},{"from":"gpt","value":"Hello there friend"}]},
    {"id":"3","conversations":[{"from":"human","value":"only one turn"}]},
    {"id":"4","conversations":[{"from":"human","value":"Tell me about the ocean and its tides."},
                               {"from":"gpt","value":"Tides come from the pull of the moon and sun."}]}
  ])";
  ShareGptOptions so;
  so.num_prompts = 10;
  auto sreqs = load_sharegpt(sg, *tokenizer_, so);
  ASSERT_TRUE(sreqs.ok()) << sreqs.status().message();
  ASSERT_EQ(sreqs->size(), 2u);  // "Hi" is under 4 tokens, #3 has one turn
  for (const auto& r : *sreqs) {
    EXPECT_EQ(int64_t(tokenizer_->encode(r.prompt, plain)->size()), r.prompt_len);
    EXPECT_GE(r.output_len, 4);
  }
  so.output_len = 3;
  auto fixed = load_sharegpt(sg, *tokenizer_, so);
  ASSERT_TRUE(fixed.ok());
  for (const auto& r : *fixed) EXPECT_EQ(r.output_len, 3);
  std::ofstream(dir.path() + "/bad.json") << "{\"not\": \"a list\"}";
  EXPECT_FALSE(load_sharegpt(dir.path() + "/bad.json", *tokenizer_, so).ok());
  EXPECT_FALSE(load_sharegpt(dir.path() + "/missing.json", *tokenizer_, so).ok());
  EXPECT_FALSE(load_corpus_text(dir.path() + "/missing.txt", 0, 0).ok());
}

TEST(Report, JsonFieldsAndTable) {
  RunResult run;
  run.records = hand_timeline();
  run.duration_s = 1.0;
  run.spec_decode = SpecDecodeStats{10, 20, 15, 75.0, 2.5};
  const BenchMetrics m = compute_metrics(run.records, run.duration_s, {90, 99});
  RunDescription d;
  d.backend = "openai";
  d.model = "fake";
  d.dataset_name = "random";
  d.num_prompts = 4;
  d.request_rate = std::numeric_limits<double>::infinity();
  d.max_concurrency = 8;
  const Json j = report_json(d, m, run, /*detailed=*/false);
  for (const char* key : {"duration",
                          "completed",
                          "failed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "output_throughput",
                          "total_token_throughput",
                          "input_throughput",
                          "concurrency",
                          "max_concurrent_requests",
                          "mean_ttft_ms",
                          "median_ttft_ms",
                          "std_ttft_ms",
                          "p90_ttft_ms",
                          "p99_ttft_ms",
                          "mean_tpot_ms",
                          "p99_tpot_ms",
                          "mean_itl_ms",
                          "p90_itl_ms",
                          "mean_e2el_ms",
                          "p99_e2el_ms",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "latencies",
                          "start_times",
                          "errors",
                          "spec_decode_acceptance_rate",
                          "spec_decode_acceptance_length"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_FALSE(j.contains("generated_texts"));
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["max_concurrency"], 8);
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_NEAR(j["p90_ttft_ms"].get<double>(), 94.0, kExact);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 25.0, kExact);
  EXPECT_EQ(j["itls"][0].size(), 3u);
  EXPECT_EQ(j["output_lens"][2], 0);  // the failed request
  EXPECT_EQ(j["errors"][2], "HTTP 500");
  EXPECT_TRUE(report_json(d, m, run, true).contains("generated_texts"));
  const std::string t = format_report(d, m, run);
  for (const char* label :
       {"Successful requests:                     3", "Failed requests:                         1",
        "Mean TPOT (ms):                          25.00",
        "P90 TTFT (ms):                           94.00",
        "Median E2EL (ms):                        110.00",
        "Concurrency (effective):                 0.34",
        "Acceptance rate (%):                     75.00"})
    EXPECT_NE(t.find(label), std::string::npos) << label << "\n" << t;
}

// A minimal XML well-formedness check: balanced, properly nested tags, quoted attributes, a
// single root, escaped text.
bool well_formed_xml(const std::string& s, std::string* why) {
  std::vector<std::string> stack;
  size_t i = 0;
  int roots = 0;
  while (i < s.size()) {
    if (s[i] != '<') {
      if (s[i] == '&') {
        const size_t semi = s.find(';', i);
        const std::string ent = s.substr(i, semi - i + 1);
        if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;") {
          *why = "bad entity at " + std::to_string(i);
          return false;
        }
      }
      ++i;
      continue;
    }
    const size_t end = s.find('>', i);
    if (end == std::string::npos) return *why = "unclosed tag", false;
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.starts_with("?")) continue;
    if (tag.starts_with("/")) {
      if (stack.empty() || stack.back() != tag.substr(1))
        return *why = "mismatched </" + tag.substr(1) + ">", false;
      stack.pop_back();
      continue;
    }
    const bool self_closing = tag.ends_with("/");
    if (self_closing) tag.pop_back();
    if (std::count(tag.begin(), tag.end(), '"') % 2)
      return *why = "odd quotes in <" + tag + ">", false;
    const std::string name = tag.substr(0, tag.find(' '));
    if (stack.empty()) ++roots;
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return *why = "unclosed <" + stack.back() + ">", false;
  if (roots != 1) return *why = "roots: " + std::to_string(roots), false;
  return true;
}

TEST(SvgPlot, SweepPlotsAreWellFormedAndCarryThePoints) {
  std::vector<SweepPoint> points;
  for (int64_t c : {1, 8, 16, 64}) {
    SweepPoint p;
    p.concurrency = c;
    p.metrics.output_throughput = 100.0 * double(c) / (1 + 0.05 * double(c));
    p.metrics.total_token_throughput = 2 * p.metrics.output_throughput;
    p.metrics.tpot.mean_ms = 10 + double(c);
    p.metrics.tpot.median_ms = 9 + double(c);
    p.metrics.tpot.percentiles_ms = {{90, 12.0 + double(c)}, {99, 15.0 + double(c)}};
    points.push_back(p);
  }
  for (const PlotSpec& spec : {throughput_plot(points, "m <x> & y"), tpot_plot(points, "")}) {
    const std::string svg = render_svg(spec);
    std::string why;
    EXPECT_TRUE(well_formed_xml(svg, &why)) << why << "\n" << svg;
    EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
    // One polyline per series, each through 4 points.
    std::regex poly("<polyline[^>]*points=\"([^\"]*)\"");
    int lines = 0;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), poly); it != std::sregex_iterator();
         ++it) {
      const std::string pts = (*it)[1];
      EXPECT_EQ(std::count(pts.begin(), pts.end(), ','), 4);
      ++lines;
    }
    EXPECT_EQ(size_t(lines), spec.series.size());
  }
  EXPECT_EQ(tpot_plot(points, "").series.size(), 3u);  // mean, median, p99
  std::string why;
  EXPECT_TRUE(well_formed_xml(render_svg(PlotSpec{}), &why)) << why;  // empty plot
  EXPECT_EQ(nice_ticks(0, 97, 5), (std::vector<double>{0, 20, 40, 60, 80, 100}));
}

TEST(Sweep, ParseList) {
  auto s = parse_sweep("1,8, 16,64");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<int64_t>{1, 8, 16, 64}));
  EXPECT_FALSE(parse_sweep("1,,8").ok());
  EXPECT_FALSE(parse_sweep("0").ok());
  EXPECT_FALSE(parse_sweep("4,4").ok());
  EXPECT_FALSE(parse_sweep("x").ok());
}

}  // namespace
}  // namespace ds::bench
