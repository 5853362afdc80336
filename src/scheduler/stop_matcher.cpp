// Stop-string matcher (see stop_matcher.h). Work per push is O(held + text) per stop string.
#include "scheduler/stop_matcher.h"

#include <algorithm>

namespace ds::sched {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return "";
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  // The earliest complete match (ties: the longest stop string at that position... the first
  // listed, which is what a left-to-right scan of the client's list gives).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos != std::string::npos && pos < best) {
      best = pos;
      best_stop = &s;
    }
  }
  if (best_stop != nullptr) {
    matched_ = true;
    matched_stop_ = *best_stop;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return "";
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace ds::sched
