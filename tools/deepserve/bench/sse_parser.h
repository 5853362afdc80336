// Incremental parser of a Server-Sent Events stream (the WHATWG event-stream format that
// OpenAI-compatible servers use for `stream: true`): bytes arrive in arbitrary pieces; complete
// events come out as their `data` payload (several data lines joined by '\n'). Lines end in
// "\n", "\r\n" or "\r"; comment lines (":" first, used as keep-alive pings) and other fields
// (event, id, retry) are ignored; an event ends at a blank line. Hand-written because no
// packaged C++ SSE library exists here and cpp-httplib only hands over raw body bytes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::bench {

class SseParser {
 public:
  // Appends `bytes` and returns the data payloads of the events they complete, in order.
  std::vector<std::string> feed(std::string_view bytes);
  // At the end of the stream: the data of an event that was not closed by a blank line (some
  // servers omit the last one), or nothing. Resets the parser.
  std::vector<std::string> finish();
  // Bytes held while waiting for the end of a line or event (bounded by the caller's checks).
  size_t buffered_bytes() const { return line_.size() + data_.size(); }

 private:
  void take_line(std::string_view line, std::vector<std::string>* out);
  std::string line_;  // the current, unfinished line
  std::string data_;  // data lines of the current event, joined by '\n'
  bool has_data_ = false;
  bool last_was_cr_ = false;  // a "\r" ended the previous line: skip a following "\n"
};

}  // namespace ds::bench
