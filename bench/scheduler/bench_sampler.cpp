// Host cost of the engine's per-row sampling path at DeepSeek-V4's vocabulary (129280): the
// finite check the engine makes on every logits row, then Sampler::sample for the common request
// settings, Sampler::distribution (speculative decoding of sampled requests: one per draft and
// per verified row) and the logprobs of a row. Rows rotate over 64 distinct logits rows (33 MB,
// more than this machine's caches), as a B = 64 decode step hands them over. Prints microseconds
// per row and per 64-row step, one thread; then a whole 64-row step over every OpenMP thread, as
// the engine runs it; and writes JSON to bench/results/sampler_cpu.json (or
// --out PATH).
//
// Usage: bench_sampler [--out PATH] [--rows-per-case N]
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif
#include "core/rng.h"
#include "deepserve/engine.h"
#include "kernels/cpu/parallel.h"
#include "scheduler/sampler.h"

#ifndef DS_SOURCE_DIR
#define DS_SOURCE_DIR "."
#endif

namespace {

constexpr int64_t kVocab = 129280;
constexpr int64_t kRows = 64;

std::string commit() {
  if (const char* c = std::getenv("DS_COMMIT")) return c;
  std::string out;
  const std::string cmd =
      "git -C " + std::string(DS_SOURCE_DIR) + " rev-parse --short HEAD 2>/dev/null";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[128];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out.empty() ? "unknown" : out;
}

struct Case {
  std::string name;
  std::function<void(const float*)> run;  // one row
};

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = std::string(DS_SOURCE_DIR) + "/bench/results/sampler_cpu.json";
  int64_t rows_per_case = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (a == "--rows-per-case" && i + 1 < argc) {
      rows_per_case = std::max<int64_t>(kRows, std::atoll(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--out PATH] [--rows-per-case N]\n", argv[0]);
      return 2;
    }
  }
  // Logits like a language model's: mostly small, a heavy upper tail (a few dozen plausible
  // tokens), no ties to speak of.
  ds::Rng rng(7);
  std::vector<float> logits(size_t(kRows * kVocab));
  for (float& v : logits) {
    const float n = rng.normal();
    v = 2.0f * n + (n > 2.5f ? 6.0f * (n - 2.5f) : 0.0f);
  }
  auto make = [](double temperature, double top_p, int64_t top_k) {
    deepserve::SamplingParams p;
    p.temperature = temperature;
    p.top_p = top_p;
    p.top_k = top_k;
    return p;
  };
  const std::vector<int32_t> prompt = {1, 2, 3};
  ds::sched::Sampler greedy(make(0, 1, 0), 1, kVocab, 1, prompt);
  ds::sched::Sampler plain(make(1.0, 1, 0), 2, kVocab, 1, prompt);
  ds::sched::Sampler top_p(make(0.7, 0.9, 0), 3, kVocab, 1, prompt);
  ds::sched::Sampler top_k(make(1.0, 1, 50), 4, kVocab, 1, prompt);
  deepserve::SamplingParams pen = make(0.8, 0.95, 0);
  pen.repetition_penalty = 1.1;
  pen.frequency_penalty = 0.5;
  ds::sched::Sampler penalized(pen, 5, kVocab, 1, prompt);
  for (int32_t t = 0; t < 200; ++t) penalized.accept(t * 37 % int32_t(kVocab));
  ds::sched::Sampler spec(make(1.0, 0.95, 0), 6, kVocab, 1, prompt);
  std::vector<double> q;
  std::vector<ds::sched::LogprobEntry> best;
  volatile int64_t sink = 0;
  const std::vector<Case> cases = {
      {"all_finite (every row)",
       [&](const float* l) { sink = sink + ds::sched::all_finite(l, kVocab); }},
      {"sample greedy", [&](const float* l) { sink = sink + greedy.sample(l); }},
      {"all_finite + sample greedy",
       [&](const float* l) {
         sink = sink + (ds::sched::all_finite(l, kVocab) ? greedy.sample(l) : -1);
       }},
      {"sample_finite greedy (engine)",
       [&](const float* l) {
         int32_t t = -1;
         sink = sink + (greedy.sample_finite(l, &t) ? t : -1);
       }},
      {"sample temperature 1", [&](const float* l) { sink = sink + plain.sample(l); }},
      {"sample temperature 0.7 top_p 0.9", [&](const float* l) { sink = sink + top_p.sample(l); }},
      {"sample top_k 50", [&](const float* l) { sink = sink + top_k.sample(l); }},
      {"sample top_p 0.95 + penalties", [&](const float* l) { sink = sink + penalized.sample(l); }},
      {"distribution top_p 0.95 (speculative)",
       [&](const float* l) {
         spec.distribution(l, &q);
         sink = sink + int64_t(q.size());
       }},
      {"token_logprob top 5",
       [&](const float* l) {
         sink = sink + int64_t(1000 * ds::sched::token_logprob(l, kVocab, 7, 5, &best));
       }},
  };
  struct Result {
    std::string name;
    double us_per_row;
  };
  std::vector<Result> results;
  std::printf("%-40s %12s %14s\n", "case (vocab 129280, 1 thread)", "us / row", "ms / 64 rows");
  for (const Case& c : cases) {
    for (int64_t r = 0; r < kRows; ++r) c.run(logits.data() + r * kVocab);  // warm-up
    std::vector<double> per_row;
    for (int64_t r = 0; r < rows_per_case; ++r) {
      const float* row = logits.data() + (r % kRows) * kVocab;
      const auto t0 = std::chrono::steady_clock::now();
      c.run(row);
      per_row.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(per_row.begin(), per_row.begin() + per_row.size() / 2, per_row.end());
    const double us = per_row[per_row.size() / 2] * 1e6;
    results.push_back({c.name, us});
    std::printf("%-40s %12.1f %14.2f\n", c.name.c_str(), us, us * kRows / 1000);
  }
  // A whole 64-row step as the engine samples it (one sampler per request, rows in parallel over
  // the OpenMP threads: engine.cpp step() phase 1), temperature 0.7 top_p 0.9.
  std::vector<ds::sched::Sampler> step_samplers;
  for (int64_t r = 0; r < kRows; ++r) {
    step_samplers.emplace_back(make(0.7, 0.9, 0), 100 + uint64_t(r), kVocab, 1, prompt);
  }
  std::vector<int32_t> step_tokens(static_cast<size_t>(kRows));
  auto step = [&]() {
    DS_OMP_PARALLEL_FOR_DYNAMIC
    for (int64_t r = 0; r < kRows; ++r) {
      const float* row = logits.data() + r * kVocab;
      if (ds::sched::all_finite(row, kVocab))
        step_tokens[size_t(r)] = step_samplers[size_t(r)].sample(row);
    }
  };
  step();  // warm-up (starts the threads)
  std::vector<double> step_s;
  for (int i = 0; i < 9; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(step_s.begin(), step_s.end());
  const double step_ms = step_s[step_s.size() / 2] * 1e3;
#if defined(_OPENMP)
  const int step_threads = omp_get_max_threads();
#else
  const int step_threads = 1;
#endif
  std::printf("64-row step, all_finite + sample t0.7 top_p 0.9, %d thread(s): %.2f ms\n",
              step_threads, step_ms);
  utsname u{};
  uname(&u);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::ofstream f(out_path);
  f << "{\n  \"benchmark\": \"sampler_cpu\",\n  \"date\": \"" << date << "\",\n"
    << "  \"machine\": {\"host\": \"" << u.nodename << "\", \"kernel\": \"" << u.release
    << "\", \"hardware_threads\": " << std::thread::hardware_concurrency() << ", \"threads\": 1},\n"
    << "  \"commit\": \"" << commit() << "\",\n  \"vocab\": " << kVocab
    << ",\n  \"distinct_rows\": " << kRows << ",\n  \"rows_timed_per_case\": " << rows_per_case
    << ",\n  \"statistic\": \"median per row\",\n  \"parallel_step\": {\"rows\": " << kRows
    << ", \"case\": \"all_finite + sample temperature 0.7 top_p 0.9\", \"threads\": "
    << step_threads << ", \"ms\": " << step_ms << "},\n  \"cases\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    f << "    {\"case\": \"" << results[i].name << "\", \"us_per_row\": " << results[i].us_per_row
      << ", \"ms_per_64_rows\": " << results[i].us_per_row * kRows / 1000 << "}"
      << (i + 1 < results.size() ? ",\n" : "\n");
  }
  f << "  ]\n}\n";
  std::printf("wrote %s\n", out_path.c_str());
  return sink == 42 ? 1 : 0;
}
