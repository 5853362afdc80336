// The benchmark's progress display: on a terminal a bar redrawn in place on stderr
// ("warm-up" / "benchmark", done/total, req/s, elapsed, ETA, failures); otherwise (a log file,
// CI) one plain line every 10% or 10 seconds. Thread-safe: workers call tick().
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace ds::bench {

class Progress {
 public:
  // `enabled` false prints nothing (--disable-tqdm). `tty` chooses the bar; by default whether
  // stderr is a terminal.
  Progress(std::string label, int64_t total, bool enabled, std::FILE* out = stderr, int tty = -1);
  void tick(bool success);
  void finish();

 private:
  void draw(bool final_line);
  std::mutex mu_;
  std::string label_;
  int64_t total_, done_ = 0, failed_ = 0;
  bool enabled_, tty_, finished_ = false;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  int64_t last_line_done_ = 0;
};

}  // namespace ds::bench
