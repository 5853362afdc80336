// Streaming detokenizer (see stream_decoder.h).
#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8_util.h"

namespace ds::tok {

std::string StreamDecoder::push(TokenId id) {
  if (!tok_->has_id(id)) return {};
  if (opts_.skip_special && tok_->is_special(id)) return {};
  pending_.append(tok_->token_bytes(id));
  size_t n = utf8_emittable_prefix(pending_);
  std::string out;
  if (n == 0) return out;
  append_utf8_lossy(std::string_view(pending_).substr(0, n), &out);
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  append_utf8_lossy(pending_, &out);
  pending_.clear();
  return out;
}

}  // namespace ds::tok
