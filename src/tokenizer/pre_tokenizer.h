// The pre-tokenizer of a tokenizer.json: a Sequence of Split steps (regex or literal pattern,
// one of the five Hugging Face split behaviours, optional invert) ending in ByteLevel. Splitting
// only cuts the text, so pieces are views into the caller's string. Regexes run on PCRE2 with
// UTF + UCP (Unicode properties for \s, \p{L}, ...) and JIT, with match, depth and heap limits so
// a pathological input fails the call instead of spinning (TK4).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "core/status.h"

namespace ds::tok {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class RegexSplitter;

class PreTokenizer {
 public:
  // `spec` is the "pre_tokenizer" value of tokenizer.json (null = whole text is one piece).
  static Result<PreTokenizer> from_json(const Json& spec);

  PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Calls `fn` on each pre-token of `text` (non-empty views into `text`), in order, stopping at
  // the first error `fn` returns. `text` must be valid UTF-8 (checked once by the caller).
  // Steps run depth-first, so no list of all pre-tokens of a large input is ever built.
  using PieceFn = std::function<Status(std::string_view)>;
  Status for_each(std::string_view text, const PieceFn& fn) const;
  // Appends the pre-tokens of `text` to `out`.
  Status split(std::string_view text, std::vector<std::string_view>* out) const;

  // True when the file's ByteLevel step was found (byte-level BPE requires it).
  bool byte_level() const { return byte_level_; }

 private:
  Status run_from(size_t step, std::string_view text, const PieceFn& fn) const;
  std::vector<std::unique_ptr<RegexSplitter>> steps_;
  bool byte_level_ = false;
};

// The GPT-2 pattern ByteLevel uses when its "use_regex" is true.
extern const char* const kGpt2SplitPattern;

}  // namespace ds::tok
