// Fuzz target: the tokenizer.json loader (reliability.md rule 25, TK1) through
// ds::tok::Tokenizer::from_json. An accepted tokenizer must encode a fixed short text (plain
// ASCII, accents, CJK, an emoji, whitespace runs and DeepSeek marker strings) with and without
// added-token parsing, give only ids it knows, decode those ids, and stream-decode them to the
// same text as the one-shot decode (ST5).
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr std::string_view kText =
    "Hello, world!  h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x99\x82\n\t"
    "<think>x</think> <sp> 123";

void check_ids(const ds::tok::Tokenizer& t, const std::vector<ds::tok::TokenId>& ids) {
  for (ds::tok::TokenId id : ids) {
    DS_FUZZ_CHECK(t.has_id(id), "encode produced an id the tokenizer lacks");
    DS_FUZZ_CHECK(size_t(id) < t.id_space(), "encode produced an id outside the id space");
  }
  for (bool skip : {false, true}) {
    ds::tok::DecodeOptions opts;
    opts.skip_special = skip;
    std::string one_shot = t.decode(ids, opts);
    DS_FUZZ_CHECK(ds::fuzz::reference_utf8_valid(one_shot), "decode produced invalid UTF-8");
    ds::tok::StreamDecoder stream(t, opts);
    std::string streamed;
    for (ds::tok::TokenId id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    DS_FUZZ_CHECK(streamed == one_shot, "streamed decode differs from the one-shot decode");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet_logging();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto loaded = ds::tok::Tokenizer::from_json(text, "fuzz tokenizer.json");
  ds::fuzz::note_result(loaded.status());
  if (!loaded.ok()) {
    DS_FUZZ_CHECK(!loaded.status().message().empty(), "an error without a message");
    return 0;
  }
  const ds::tok::Tokenizer& t = *loaded;
  for (bool special : {true, false}) {
    ds::tok::EncodeOptions opts;
    opts.parse_special = special;
    opts.deadline_ms = 10'000;
    auto ids = t.encode(kText, opts);
    if (!ids.ok()) {
      // A pathological pre-tokenizer regex may hit the PCRE2 limits; anything else is a bug.
      DS_FUZZ_CHECK(ids.status().code() == ds::StatusCode::kResourceExhausted,
                    "encode of valid UTF-8 failed: " + ids.status().to_string());
      continue;
    }
    check_ids(t, *ids);
  }
  // Every declared added token maps back to an id the tokenizer has.
  for (const auto& added : t.added_tokens()) {
    DS_FUZZ_CHECK(t.has_id(added.id), "an added token id the tokenizer lacks");
    (void)t.token_bytes(added.id);
  }
  (void)t.split_added(kText);
  return 0;
}
