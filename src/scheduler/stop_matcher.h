// Stop-string matching on streamed text (reliability.md promise 4: no part of a stop string is
// ever emitted). Text arrives in pieces of whole UTF-8 characters (StreamDecoder deltas); the
// matcher emits everything that cannot be the start of a stop string and holds back the longest
// tail that is a prefix of one. A match spanning any number of pieces is found when its last byte
// arrives; the text before it is emitted and nothing after it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::sched {

class StopMatcher {
 public:
  StopMatcher() = default;
  // Empty strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds `text`; returns the text that is now safe to emit. After a match, returns the text up
  // to the match and matched() is true; later calls return "".
  std::string push(std::string_view text);
  // End of output: returns the held-back tail (it never completed a stop string).
  std::string flush();

  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return matched_stop_; }
  size_t held_bytes() const { return held_.size(); }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string matched_stop_;
};

}  // namespace ds::sched
