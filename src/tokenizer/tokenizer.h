// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (the format DeepSeek-V3/V4
// checkpoints ship): vocabulary, ranked merges, added/special tokens (split out before
// pre-tokenization), a Sequence of Split pre-tokenizers (PCRE2 with UTF + UCP + JIT and match
// limits) followed by ByteLevel, and the ByteLevel decoder. Loading validates the file
// (reliability.md rule 25 / TK1) and refuses unsupported constructs by name. A loaded Tokenizer
// is immutable and safe to use from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds::tok {

using TokenId = int32_t;

struct EncodeOptions {
  // Recognize added tokens (<｜User｜>, <think>, ...) written in the text. Client-supplied text
  // must be encoded with false (TK3): the strings are then tokenized as plain text.
  bool parse_special = true;
  // Inputs longer than this are refused (kResourceExhausted) before any work (TK4).
  size_t max_input_bytes = size_t{64} << 20;
  // Wall-clock budget for one call; 0 = none. Checked between pre-tokens (TK4).
  int64_t deadline_ms = 0;
};

struct DecodeOptions {
  bool skip_special = false;  // drop added tokens marked "special": true
};

// One added token as declared in tokenizer.json "added_tokens".
struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// A piece of text after splitting out added tokens: either an added token or plain text.
struct TextPiece {
  bool is_added = false;
  TokenId id = -1;        // valid when is_added
  std::string_view text;  // the plain text, or the matched token content (no stripped spaces)
};

class TokenizerImpl;

class Tokenizer {
 public:
  // Parses and validates tokenizer.json text. `what` names the source in error messages.
  static Result<Tokenizer> from_json(std::string_view json_text, std::string_view what);
  static Result<Tokenizer> from_file(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text -> ids. The text must be valid UTF-8 (kInvalidArgument otherwise; NUL bytes are fine).
  // No BOS/EOS is added: callers (the chat encoder) add them explicitly.
  Result<std::vector<TokenId>> encode(std::string_view text, const EncodeOptions& opts = {}) const;
  // Appends the ids of `text` encoded as plain text (no added-token matching) to `out`.
  Status encode_plain_append(std::string_view text, const EncodeOptions& opts,
                             std::vector<TokenId>* out) const;
  // Splits `text` at added-token matches (leftmost-longest, honouring lstrip/rstrip/single_word).
  std::vector<TextPiece> split_added(std::string_view text) const;

  // Ids -> text. Ids the tokenizer lacks (padding rows of the embedding, negative ids) decode to
  // "" (TK6). Invalid UTF-8 in the concatenated bytes becomes U+FFFD.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& opts = {}) const;
  // The raw bytes of one token ("" for ids the tokenizer lacks); may be part of a character.
  std::string_view token_bytes(TokenId id) const;
  bool is_special(TokenId id) const;
  bool has_id(TokenId id) const;

  // The id of an added token or vocabulary entry with exactly this content (as written in
  // tokenizer.json for added tokens; as decoded text for vocabulary entries).
  std::optional<TokenId> token_to_id(std::string_view content) const;
  // max id + 1 (ids below it may still be holes, see has_id).
  size_t id_space() const;
  size_t vocab_size() const;  // model.vocab entries
  const std::vector<AddedToken>& added_tokens() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

}  // namespace ds::tok
