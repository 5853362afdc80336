// Progress bar / periodic progress lines (see progress.h).
#include "bench/progress.h"

#include <unistd.h>

#include <algorithm>

namespace ds::bench {

Progress::Progress(std::string label, int64_t total, bool enabled, std::FILE* out, int tty)
    : label_(std::move(label)), total_(total), enabled_(enabled), out_(out) {
  tty_ = tty >= 0 ? tty != 0 : isatty(fileno(out)) != 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
  if (enabled_ && tty_) draw(false);
}

void Progress::tick(bool success) {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  if (!success) ++failed_;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ >= std::chrono::milliseconds(100) || done_ == total_) draw(false);
    return;
  }
  const int64_t step = std::max<int64_t>(1, total_ / 10);
  if (done_ - last_line_done_ >= step || now - last_draw_ >= std::chrono::seconds(10) ||
      done_ == total_) {
    draw(false);
    last_line_done_ = done_;
  }
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (tty_)
    draw(true);
  else if (last_line_done_ != done_)
    draw(true);
}

void Progress::draw(bool final_line) {
  const auto now = std::chrono::steady_clock::now();
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? double(done_) / elapsed : 0.0;
  const double eta = rate > 0 ? double(total_ - done_) / rate : 0.0;
  char tail[160];
  std::snprintf(tail, sizeof(tail), " %lld/%lld [%.1fs<%.1fs, %.2f req/s%s]", (long long)done_,
                (long long)total_, elapsed, eta, rate,
                failed_ ? (", " + std::to_string(failed_) + " failed").c_str() : "");
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? int(kWidth * done_ / total_) : kWidth;
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\r%s |%s|%s\x1b[K", label_.c_str(), bar.c_str(), tail);
    if (final_line) std::fputc('\n', out_);
  } else {
    std::fprintf(out_, "%s:%s\n", label_.c_str(), tail);
  }
  std::fflush(out_);
}

}  // namespace ds::bench
