// Stop-string matcher: the emitted text never contains any part of a stop string, whatever the
// split points of the stream (every split of the text into two and into three pieces).
#include <gtest/gtest.h>

#include "scheduler/stop_matcher.h"

namespace ds::sched {
namespace {

struct Outcome {
  std::string emitted;
  bool matched = false;
  std::string stop;
};

Outcome run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  Outcome o;
  for (const auto& p : pieces) {
    o.emitted += m.push(p);
    if (m.matched()) break;
  }
  if (!m.matched()) o.emitted += m.flush();
  o.matched = m.matched();
  o.stop = m.matched_stop();
  return o;
}

void check_all_splits(const std::vector<std::string>& stops, const std::string& text,
                      const std::string& want, bool want_match) {
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      const Outcome o = run(stops, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      EXPECT_EQ(o.emitted, want) << "split at " << i << ", " << j;
      EXPECT_EQ(o.matched, want_match) << "split at " << i << ", " << j;
    }
  }
}

TEST(StopMatcher, MatchAcrossEverySplit) {
  check_all_splits({"STOP"}, "hello STOP world", "hello ", true);
  check_all_splits({"\n\n"}, "a\nb\n\nc", "a\nb", true);
  // The earliest match wins among several strings.
  check_all_splits({"world", "lo w"}, "hello world", "hel", true);
  // A partial prefix at the end is released at flush.
  check_all_splits({"STOP"}, "hello STO", "hello STO", false);
  // Overlapping prefixes: "aab" inside "aaab".
  check_all_splits({"aab"}, "xaaaby", "xa", true);
  // Multi-byte characters (stop strings are whole characters).
  check_all_splits({"世界"}, "你好世界!", "你好", true);
}

TEST(StopMatcher, HoldsBackOnlyPossiblePrefixes) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abc S"), "abc ");
  EXPECT_EQ(m.held_bytes(), 1u);
  EXPECT_EQ(m.push("T"), "");
  EXPECT_EQ(m.push("x"), "STx");  // the prefix broke: released
  EXPECT_EQ(m.held_bytes(), 0u);
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.push("OP tail"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "STOP");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({"", ""});
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.push("anything"), "anything");
  EXPECT_FALSE(m.matched());
}

}  // namespace
}  // namespace ds::sched
