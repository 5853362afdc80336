// Streaming detokenizer: turns token ids into text as they arrive without ever emitting half a
// UTF-8 character (ST5). It keeps the raw bytes, emits the longest prefix that no later byte can
// change, and holds back at most 3 bytes of an incomplete character; those become U+FFFD only at
// the final flush (ST6). Bytes that no continuation can make valid are replaced right away, exactly
// as the one-shot decode does, so the concatenated deltas always equal Tokenizer::decode of the
// whole id sequence. Work per token is O(token length): nothing is re-decoded.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace ds::tok {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, DecodeOptions opts = {})
      : tok_(&tokenizer), opts_(opts) {}

  // Returns the text that became complete with this token (often "", e.g. mid-character).
  std::string push(TokenId id);
  // End of generation: returns the held-back bytes, each ill-formed part as U+FFFD.
  std::string flush();
  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  DecodeOptions opts_;
  std::string pending_;
};

}  // namespace ds::tok
