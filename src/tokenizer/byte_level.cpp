// The byte-level alphabet tables (see byte_level.h), built once on first use.
#include "tokenizer/byte_level.h"

#include "tokenizer/utf8_util.h"

namespace ds::tok {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};  // every alphabet code point is < 512; -1 = not in it
  Tables() {
    from_cp.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++);
      to_cp[b] = cp;
      from_cp[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

void append_codepoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) {
  return tables().to_cp[b];
}

std::optional<uint8_t> codepoint_to_byte(uint32_t cp) {
  if (cp >= 512) return std::nullopt;
  int16_t b = tables().from_cp[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::optional<std::string> byte_level_to_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t n = utf8_char_len(s.substr(i));
    if (n == 0 || n > 2) return std::nullopt;  // alphabet code points need at most 2 bytes
    uint32_t cp = n == 1 ? static_cast<uint8_t>(s[i])
                         : ((static_cast<uint8_t>(s[i]) & 0x1F) << 6) |
                               (static_cast<uint8_t>(s[i + 1]) & 0x3F);
    auto b = codepoint_to_byte(cp);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    i += n;
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_codepoint(byte_to_codepoint(static_cast<uint8_t>(c)), &out);
  return out;
}

}  // namespace ds::tok
