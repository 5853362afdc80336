// Fuzz target: BPE encode -> decode round trip on the default DeepSeek tokenizer
// (tok::load_default_tokenizer, loaded once per process). Inputs that are not valid UTF-8 are
// skipped (encode refuses them by contract; that refusal is checked too). With parse_special off
// (client text, TK3) decode(encode(text)) must equal the text byte for byte; with it on, encode
// must still succeed and give known ids, and the streaming decoder must match the one-shot
// decode.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet_logging();
  const ds::tok::Tokenizer& t = ds::fuzz::default_tokenizer();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!ds::fuzz::reference_utf8_valid(text)) {
    ds::tok::EncodeOptions opts;
    opts.parse_special = false;
    auto ids = t.encode(text, opts);
    DS_FUZZ_CHECK(!ids.ok() && ids.status().code() == ds::StatusCode::kInvalidArgument,
                  "encode accepted invalid UTF-8");
    return 0;
  }

  ds::tok::EncodeOptions plain;
  plain.parse_special = false;
  auto ids = t.encode(text, plain);
  DS_FUZZ_CHECK(ids.ok(), "encode of valid UTF-8 failed: " + ids.status().to_string());
  for (ds::tok::TokenId id : *ids) {
    DS_FUZZ_CHECK(t.has_id(id), "encode produced an unknown id");
    DS_FUZZ_CHECK(!t.is_special(id), "parse_special=false produced a special token");
  }
  std::string decoded = t.decode(*ids);
  DS_FUZZ_CHECK(decoded == text, "decode(encode(text)) != text with parse_special off");

  ds::tok::EncodeOptions special;
  special.parse_special = true;
  auto ids_special = t.encode(text, special);
  DS_FUZZ_CHECK(ids_special.ok(),
                "encode (parse_special) failed: " + ids_special.status().to_string());
  for (ds::tok::TokenId id : *ids_special) DS_FUZZ_CHECK(t.has_id(id), "unknown id");
  std::string one_shot = t.decode(*ids_special);
  ds::tok::StreamDecoder stream(t);
  std::string streamed;
  for (ds::tok::TokenId id : *ids_special) streamed += stream.push(id);
  streamed += stream.flush();
  DS_FUZZ_CHECK(streamed == one_shot, "streamed decode differs from the one-shot decode");
  return 0;
}
