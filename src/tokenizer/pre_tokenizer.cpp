// Pre-tokenizer steps on PCRE2 (see pre_tokenizer.h). PCRE2 is used because the Hugging Face
// patterns need Unicode properties and lookahead, which std::regex and RE2 lack
// (conventions.md). Each thread keeps its own JIT stack, match context and match data.
#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

namespace ds::tok {

const char* const kGpt2SplitPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

// Limits per pcre2_match call. The patterns of real tokenizers need a handful of steps per
// character; these bounds only stop runaway backtracking.
constexpr uint32_t kMatchLimit = 50'000'000;
constexpr uint32_t kDepthLimit = 100'000;
constexpr uint32_t kHeapLimitKib = 64 * 1024;
constexpr size_t kJitStackMax = size_t{8} << 20;

struct ThreadMatchState {
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_data* md = nullptr;
  ThreadMatchState() {
    mctx = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, kJitStackMax, nullptr);
    md = pcre2_match_data_create(4, nullptr);
    if (mctx) {
      pcre2_set_match_limit(mctx, kMatchLimit);
      pcre2_set_depth_limit(mctx, kDepthLimit);
      pcre2_set_heap_limit(mctx, kHeapLimitKib);
      if (jit_stack) pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
    }
  }
  ~ThreadMatchState() {
    if (md) pcre2_match_data_free(md);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    if (mctx) pcre2_match_context_free(mctx);
  }
  bool ok() const { return mctx && md; }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  if (n < 0) return fmt::format("PCRE2 error {}", code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

Result<SplitBehavior> parse_behavior(const Json& v) {
  if (!v.is_string()) return corrupt("Split.behavior must be a string");
  const auto& s = v.get_ref<const std::string&>();
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return unimplemented(fmt::format("pre_tokenizer Split.behavior \"{}\" is not supported", s));
}

}  // namespace

// One Split step: a compiled pattern plus how matches and gaps become pieces.
class RegexSplitter {
 public:
  static Result<std::unique_ptr<RegexSplitter>> create(std::string_view pattern, bool literal,
                                                       SplitBehavior behavior, bool invert) {
    auto r = std::unique_ptr<RegexSplitter>(new RegexSplitter());
    r->behavior_ = behavior;
    r->invert_ = invert;
    r->pattern_ = std::string(pattern);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // PCRE2_LITERAL refuses PCRE2_UCP (it has no character classes to apply it to).
    uint32_t options = literal ? (PCRE2_UTF | PCRE2_NO_UTF_CHECK | PCRE2_LITERAL)
                               : (PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK);
    r->code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                             &err, &err_off, nullptr);
    if (!r->code_) {
      return corrupt(
          fmt::format("pre_tokenizer regex does not compile with PCRE2 at offset {}: {} "
                      "(pattern: {})",
                      err_off, pcre2_message(err), pattern));
    }
    // JIT is an optimization; the interpreter (with the same limits) is the fallback.
    pcre2_jit_compile(r->code_, PCRE2_JIT_COMPLETE);
    return r;
  }
  ~RegexSplitter() {
    if (code_) pcre2_code_free(code_);
  }

  // Calls fn on each piece of `text`.
  Status split(std::string_view text, const PreTokenizer::PieceFn& fn) const {
    ThreadMatchState& st = thread_state();
    if (!st.ok()) return resource_exhausted("PCRE2 match context allocation failed");
    // (start, end, is_match) spans that cover `text`. Isolated and Removed (what real tokenizer
    // files use) emit pieces as they are found; the merging behaviours collect spans first.
    struct Span {
      size_t b, e;
      bool m;
    };
    const bool streaming =
        behavior_ == SplitBehavior::kIsolated || behavior_ == SplitBehavior::kRemoved;
    std::vector<Span> spans;
    auto add_span = [&](size_t b, size_t e, bool m) -> Status {
      if (invert_) m = !m;
      if (!streaming) {
        spans.push_back({b, e, m});
        return ok_status();
      }
      if (behavior_ == SplitBehavior::kRemoved && m) return ok_status();
      return fn(text.substr(b, e - b));
    };
    size_t pos = 0;
    size_t last = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (pos <= text.size()) {
      int rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        return resource_exhausted(
            fmt::format("pre-tokenizer regex failed on the input ({}); pattern: {}",
                        pcre2_message(rc), pattern_));
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
      size_t b = ov[0], e = ov[1];
      if (e <= b) {
        // Empty match: produces no piece; step over one character.
        if (b >= text.size()) break;
        size_t step = 1;
        while (b + step < text.size() && (static_cast<uint8_t>(text[b + step]) & 0xC0) == 0x80)
          ++step;
        pos = b + step;
        continue;
      }
      if (b > last) DS_RETURN_IF_ERROR(add_span(last, b, false));
      DS_RETURN_IF_ERROR(add_span(b, e, true));
      last = e;
      pos = e;
    }
    if (last < text.size()) DS_RETURN_IF_ERROR(add_span(last, text.size(), false));
    if (streaming) return ok_status();

    Status status;
    auto emit = [&](size_t b, size_t e) {
      if (e > b && status.ok()) status = fn(text.substr(b, e - b));
    };
    switch (behavior_) {
      case SplitBehavior::kIsolated:
      case SplitBehavior::kRemoved:
        break;  // handled while matching
      case SplitBehavior::kContiguous: {
        // Consecutive matches become one piece.
        size_t i = 0;
        while (i < spans.size()) {
          size_t j = i + 1;
          if (spans[i].m)
            while (j < spans.size() && spans[j].m) ++j;
          emit(spans[i].b, spans[j - 1].e);
          i = j;
        }
        break;
      }
      case SplitBehavior::kMergedWithPrevious: {
        // A match is appended to the piece before it (unless that piece was a match too).
        std::vector<Span> acc;
        bool prev_match = false;
        for (const auto& s : spans) {
          if (s.m && !prev_match && !acc.empty()) {
            acc.back().e = s.e;
          } else {
            acc.push_back(s);
          }
          prev_match = s.m;
        }
        for (const auto& s : acc) emit(s.b, s.e);
        break;
      }
      case SplitBehavior::kMergedWithNext: {
        // A match is prepended to the piece after it (unless that piece is a match too).
        std::vector<Span> acc;
        bool next_match = false;
        for (size_t k = spans.size(); k-- > 0;) {
          const auto& s = spans[k];
          if (s.m && !next_match && !acc.empty()) {
            acc.back().b = s.b;
          } else {
            acc.push_back(s);
          }
          next_match = s.m;
        }
        for (size_t k = acc.size(); k-- > 0;) emit(acc[k].b, acc[k].e);
        break;
      }
    }
    return status;
  }

 private:
  RegexSplitter() = default;
  pcre2_code* code_ = nullptr;
  std::string pattern_;
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
  bool invert_ = false;
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

namespace {

Status add_step(const Json& step, PreTokenizer* pt,
                std::vector<std::unique_ptr<RegexSplitter>>* steps, bool* byte_level, int depth);

Status add_split(const Json& step, std::vector<std::unique_ptr<RegexSplitter>>* steps) {
  if (!step.contains("pattern") || !step["pattern"].is_object())
    return corrupt("pre_tokenizer Split needs a \"pattern\" object");
  const Json& pat = step["pattern"];
  std::string pattern;
  bool literal = false;
  if (pat.contains("Regex") && pat["Regex"].is_string()) {
    pattern = pat["Regex"].get<std::string>();
  } else if (pat.contains("String") && pat["String"].is_string()) {
    pattern = pat["String"].get<std::string>();
    literal = true;
  } else {
    return corrupt("pre_tokenizer Split.pattern must hold a \"Regex\" or \"String\" string");
  }
  if (pattern.empty()) return corrupt("pre_tokenizer Split.pattern is empty");
  if (!is_valid_utf8(pattern)) return corrupt("pre_tokenizer Split.pattern is not valid UTF-8");
  if (!step.contains("behavior")) return corrupt("pre_tokenizer Split needs \"behavior\"");
  DS_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(step["behavior"]));
  bool invert = false;
  if (step.contains("invert")) {
    if (!step["invert"].is_boolean()) return corrupt("pre_tokenizer Split.invert must be a bool");
    invert = step["invert"].get<bool>();
  }
  DS_ASSIGN_OR_RETURN(auto splitter, RegexSplitter::create(pattern, literal, behavior, invert));
  steps->push_back(std::move(splitter));
  return ok_status();
}

Status add_byte_level(const Json& step, std::vector<std::unique_ptr<RegexSplitter>>* steps,
                      bool* byte_level) {
  if (step.contains("add_prefix_space") && step["add_prefix_space"].is_boolean() &&
      step["add_prefix_space"].get<bool>()) {
    return unimplemented("pre_tokenizer ByteLevel with add_prefix_space=true is not supported");
  }
  bool use_regex = true;  // the Hugging Face default
  if (step.contains("use_regex")) {
    if (!step["use_regex"].is_boolean()) return corrupt("ByteLevel.use_regex must be a bool");
    use_regex = step["use_regex"].get<bool>();
  }
  if (use_regex) {
    DS_ASSIGN_OR_RETURN(auto splitter, RegexSplitter::create(kGpt2SplitPattern, false,
                                                             SplitBehavior::kIsolated, false));
    steps->push_back(std::move(splitter));
  }
  *byte_level = true;
  return ok_status();
}

Status add_step(const Json& step, PreTokenizer* pt,
                std::vector<std::unique_ptr<RegexSplitter>>* steps, bool* byte_level, int depth) {
  if (!step.is_object() || !step.contains("type") || !step["type"].is_string())
    return corrupt("pre_tokenizer step must be an object with a string \"type\"");
  const std::string type = step["type"].get<std::string>();
  if (*byte_level) {
    // ByteLevel rewrites the text into its byte alphabet; splitting after it is not supported.
    return unimplemented(
        fmt::format("pre_tokenizer step \"{}\" after ByteLevel is not supported", type));
  }
  if (type == "Sequence") {
    if (depth > 4) return corrupt("pre_tokenizer Sequence nested too deeply");
    if (!step.contains("pretokenizers") || !step["pretokenizers"].is_array())
      return corrupt("pre_tokenizer Sequence needs a \"pretokenizers\" array");
    for (const auto& s : step["pretokenizers"])
      DS_RETURN_IF_ERROR(add_step(s, pt, steps, byte_level, depth + 1));
    return ok_status();
  }
  if (type == "Split") return add_split(step, steps);
  if (type == "ByteLevel") return add_byte_level(step, steps, byte_level);
  return unimplemented(
      fmt::format("pre_tokenizer type \"{}\" is not supported (supported: "
                  "Sequence, Split, ByteLevel)",
                  type));
}

}  // namespace

Result<PreTokenizer> PreTokenizer::from_json(const Json& spec) {
  PreTokenizer pt;
  if (spec.is_null()) return pt;
  DS_RETURN_IF_ERROR(add_step(spec, &pt, &pt.steps_, &pt.byte_level_, 0));
  return pt;
}

Status PreTokenizer::run_from(size_t step, std::string_view text, const PieceFn& fn) const {
  if (step == steps_.size()) return fn(text);
  return steps_[step]->split(text,
                             [&](std::string_view piece) { return run_from(step + 1, piece, fn); });
}

Status PreTokenizer::for_each(std::string_view text, const PieceFn& fn) const {
  if (text.empty()) return ok_status();
  return run_from(0, text, fn);
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>* out) const {
  return for_each(text, [out](std::string_view piece) {
    out->push_back(piece);
    return ok_status();
  });
}

}  // namespace ds::tok
