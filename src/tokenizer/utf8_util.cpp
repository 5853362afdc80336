// UTF-8 lossy conversion and incomplete-tail detection (see utf8_util.h). Written by hand: the
// rule (maximal subparts, Unicode 15 §3.9 "U+FFFD substitution of maximal subparts") is a few
// lines and must be identical for the streaming and one-shot paths.
#include "tokenizer/utf8_util.h"

#include <cstdint>

namespace ds::tok {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// For a lead byte, the number of bytes of the character and the allowed range of the second byte
// (which excludes overlongs, surrogates and code points above U+10FFFF). 0 = invalid lead byte.
struct LeadInfo {
  int len;
  uint8_t lo;
  uint8_t hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Examines the sequence at s[0]. Returns the number of bytes it spans: the full character length
// when `*complete`, else the length of the (maximal) valid prefix, which is either ill-formed
// (followed by a bad byte, `*truncated` false) or cut off by the end of `s` (`*truncated` true).
size_t scan(std::string_view s, bool* complete, bool* truncated) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  LeadInfo li = lead_info(p[0]);
  *complete = false;
  *truncated = false;
  if (li.len == 1) {
    *complete = true;
    return 1;
  }
  if (li.len == 0) return 1;
  size_t i = 1;
  for (; i < static_cast<size_t>(li.len); ++i) {
    if (i >= s.size()) {
      *truncated = true;
      return i;
    }
    uint8_t lo = i == 1 ? li.lo : 0x80;
    uint8_t hi = i == 1 ? li.hi : 0xBF;
    if (p[i] < lo || p[i] > hi) return i;
  }
  *complete = true;
  return i;
}

}  // namespace

size_t utf8_char_len(std::string_view s) {
  if (s.empty()) return 0;
  bool complete = false, truncated = false;
  size_t n = scan(s, &complete, &truncated);
  return complete ? n : 0;
}

void append_utf8_lossy(std::string_view bytes, std::string* out) {
  size_t i = 0;
  size_t run_start = 0;  // start of the current run of valid bytes, copied in one go
  while (i < bytes.size()) {
    auto c = static_cast<uint8_t>(bytes[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    bool complete = false, truncated = false;
    size_t n = scan(bytes.substr(i), &complete, &truncated);
    if (complete) {
      i += n;
      continue;
    }
    out->append(bytes.substr(run_start, i - run_start));
    out->append(kReplacement);
    i += n;
    run_start = i;
  }
  out->append(bytes.substr(run_start));
}

size_t utf8_emittable_prefix(std::string_view bytes) {
  // Only the last 3 bytes can start an incomplete character; look at most that far back.
  size_t n = bytes.size();
  size_t first = n > 3 ? n - 3 : 0;
  for (size_t i = first; i < n; ++i) {
    auto c = static_cast<uint8_t>(bytes[i]);
    if (c < 0xC0) continue;  // ASCII or continuation byte: not a lead
    bool complete = false, truncated = false;
    scan(bytes.substr(i), &complete, &truncated);
    if (truncated) return i;
  }
  return n;
}

}  // namespace ds::tok
