// Server-Sent Events parsing (format rules in sse_parser.h).
#include "bench/sse_parser.h"

namespace ds::bench {

void SseParser::take_line(std::string_view line, std::vector<std::string>* out) {
  if (line.empty()) {  // blank line: dispatch
    if (has_data_) out->push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment
  const size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value =
      colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> out;
  for (char c : bytes) {
    if (last_was_cr_) {
      last_was_cr_ = false;
      if (c == '\n') continue;
    }
    if (c == '\n' || c == '\r') {
      take_line(line_, &out);
      line_.clear();
      last_was_cr_ = c == '\r';
    } else {
      line_.push_back(c);
    }
  }
  return out;
}

std::vector<std::string> SseParser::finish() {
  std::vector<std::string> out;
  if (!line_.empty()) take_line(line_, &out);
  take_line("", &out);
  line_.clear();
  last_was_cr_ = false;
  return out;
}

}  // namespace ds::bench
