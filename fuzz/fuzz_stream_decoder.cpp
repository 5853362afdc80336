// Fuzz target: the streaming detokenizer (tok::StreamDecoder, ST5/ST6) against the one-shot
// Tokenizer::decode on the default DeepSeek tokenizer. Every 2 input bytes (little-endian u16 v)
// give one token id: v < 0x8000 -> id v (the byte tokens and the common vocabulary); otherwise
// id_space() + 15 - (v & 0x7FFF), which reaches the top of the vocabulary, the DeepSeek-V4 added
// tokens, the holes between them and 16 ids past the id space (these decode to ""); 0xFFFF is id
// -1. The ids are pushed one at a time: each delta must be valid UTF-8 (U+FFFD for ill-formed
// bytes, never half a character), at most 3 bytes are held back, and the concatenated deltas plus
// flush() must equal decode(all ids), with and without skip_special.
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet_logging();
  const ds::tok::Tokenizer& t = ds::fuzz::default_tokenizer();
  const auto id_space = static_cast<int64_t>(t.id_space());
  std::vector<ds::tok::TokenId> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    const uint32_t v = data[i] | (uint32_t(data[i + 1]) << 8);
    int64_t id;
    if (v == 0xFFFF) {
      id = -1;
    } else if (v < 0x8000) {
      id = v;
    } else {
      id = id_space + 15 - int64_t(v & 0x7FFF);
    }
    ids.push_back(static_cast<ds::tok::TokenId>(id));
  }
  for (bool skip : {false, true}) {
    ds::tok::DecodeOptions opts;
    opts.skip_special = skip;
    const std::string one_shot = t.decode(ids, opts);
    DS_FUZZ_CHECK(ds::fuzz::reference_utf8_valid(one_shot), "decode produced invalid UTF-8");
    ds::tok::StreamDecoder stream(t, opts);
    std::string streamed;
    for (ds::tok::TokenId id : ids) {
      std::string delta = stream.push(id);
      DS_FUZZ_CHECK(ds::fuzz::reference_utf8_valid(delta), "a delta is not valid UTF-8");
      DS_FUZZ_CHECK(stream.pending_bytes() <= 3, "more than 3 bytes held back");
      streamed += delta;
    }
    std::string tail = stream.flush();
    DS_FUZZ_CHECK(ds::fuzz::reference_utf8_valid(tail), "flush() is not valid UTF-8");
    DS_FUZZ_CHECK(stream.pending_bytes() == 0, "bytes held back after flush()");
    streamed += tail;
    DS_FUZZ_CHECK(streamed == one_shot, "streamed decode differs from the one-shot decode");
  }
  return 0;
}
