// Byte-level BPE (see tokenizer.h): loading and validation of tokenizer.json, added-token
// splitting with a byte trie, the merge loop and decoding.
//
// The merge loop is the classic "lowest rank first" BPE over a doubly linked list of symbols with
// a min-heap of candidate pairs: O(n log n) per pre-token, so a 1 MB pre-token costs about ten
// times a 100 KB one (TK4). Results for short pre-tokens are memoized in a per-thread cache.
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/json.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8_util.h"

namespace ds::tok {
namespace {

// Ids above this refuse the load: they would only make the id tables huge (DeepSeek uses ~129k).
constexpr uint64_t kMaxTokenId = uint64_t{1} << 22;
// Per-thread direct-mapped cache of short pre-tokens (no locks; a collision just overwrites).
constexpr size_t kCacheEntries = 1 << 14;
constexpr size_t kCacheMaxWordBytes = 22;
constexpr size_t kCacheMaxIds = 8;

enum class Kind : uint8_t { kHole, kVocab, kAdded };

struct TrieNode {
  std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
  int32_t added_index = -1;                       // index into added_ when a token ends here
};

uint64_t pair_key(TokenId a, TokenId b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct MergeInfo {
  int32_t rank;
  TokenId result;
};

// Open-addressing hash table (linear probing, power-of-two size) from a token pair to its merge.
// The merge loop does one lookup per candidate pair; a flat table keeps that to about one cache
// miss, where std::unordered_map costs several.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, {0, 0}});
    mask_ = cap - 1;
  }
  // Inserts or overwrites.
  void put(uint64_t key, MergeInfo v) {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = {key, v};
        return;
      }
    }
  }
  const MergeInfo* find(uint64_t key) const {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are < 2^22, so never a real key
  struct Slot {
    uint64_t key;
    MergeInfo value;
  };
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

struct CacheEntry {
  uint64_t hash = 0;
  uint64_t owner = 0;  // Tokenizer instance; 0 = empty
  uint8_t word_len = 0;
  uint8_t n_ids = 0;
  char word[kCacheMaxWordBytes];
  TokenId ids[kCacheMaxIds];
};

std::atomic<uint64_t> g_next_instance{1};

// Decodes the code point that ends just before `pos`; returns its start or npos on bad UTF-8.
size_t prev_char_start(std::string_view s, size_t pos) {
  if (pos == 0) return std::string_view::npos;
  size_t i = pos - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80 && pos - i < 4) --i;
  return i;
}

uint32_t decode_cp(std::string_view s, size_t pos, size_t* len) {
  size_t n = utf8_char_len(s.substr(pos));
  *len = n;
  if (n == 0) return 0xFFFFFFFF;
  auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[pos + k])); };
  if (n == 1) return b(0);
  if (n == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (n == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

// Unicode White_Space (what Rust's char::is_whitespace tests for lstrip/rstrip).
bool is_unicode_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_byte(uint8_t c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

Status check_flag(const Json& obj, const char* key, bool def, bool* out, std::string_view what) {
  if (!obj.contains(key)) {
    *out = def;
    return ok_status();
  }
  if (!obj[key].is_boolean()) return corrupt(fmt::format("{}: \"{}\" must be a bool", what, key));
  *out = obj[key].get<bool>();
  return ok_status();
}

Status check_normalizer(const Json& n, int depth) {
  if (n.is_null()) return ok_status();
  if (!n.is_object() || !n.contains("type") || !n["type"].is_string())
    return corrupt("normalizer must be null or an object with a string \"type\"");
  const auto type = n["type"].get<std::string>();
  if (type == "Sequence" && depth < 4) {
    if (!n.contains("normalizers") || !n["normalizers"].is_array())
      return corrupt("normalizer Sequence needs a \"normalizers\" array");
    for (const auto& s : n["normalizers"]) DS_RETURN_IF_ERROR(check_normalizer(s, depth + 1));
    return ok_status();
  }
  return unimplemented(
      fmt::format("normalizer \"{}\" is not supported (only null or an empty Sequence)", type));
}

Status check_decoder(const Json& d, int depth) {
  if (!d.is_object() || !d.contains("type") || !d["type"].is_string())
    return unimplemented("decoder must be ByteLevel for a byte-level BPE tokenizer");
  const auto type = d["type"].get<std::string>();
  if (type == "ByteLevel") return ok_status();
  if (type == "Sequence" && depth < 4 && d.contains("decoders") && d["decoders"].is_array()) {
    bool any = false;
    for (const auto& s : d["decoders"]) {
      DS_RETURN_IF_ERROR(check_decoder(s, depth + 1));
      any = true;
    }
    if (any) return ok_status();
  }
  return unimplemented(fmt::format("decoder \"{}\" is not supported (only ByteLevel)", type));
}

}  // namespace

class TokenizerImpl {
 public:
  // Per-id tables, indexed by id (size = id space).
  std::vector<std::string> bytes;  // raw bytes to emit when decoding
  std::vector<Kind> kind;
  std::vector<uint8_t> special;
  std::vector<uint8_t> mappable;  // vocab entry written in the byte alphabet
  size_t vocab_count = 0;

  std::unordered_map<std::string, TokenId> bytes_to_id;  // vocabulary, keyed by raw bytes
  std::unordered_map<std::string, TokenId> added_by_content;
  std::array<TokenId, 256> byte_token{};
  MergeTable merges;
  uint64_t instance = g_next_instance.fetch_add(1);
  bool ignore_merges = false;

  std::vector<AddedToken> added;
  std::vector<TrieNode> trie;
  std::array<bool, 256> trie_first{};

  PreTokenizer pre;

  Status load(std::string_view json_text, std::string_view what);
  Status load_vocab(const Json& model, std::string_view what);
  Status load_merges(const Json& model, std::string_view what);
  Status load_added(const Json& list, std::string_view what);
  void build_trie();

  void bpe_word(std::string_view word, std::vector<TokenId>* out) const;
  void bpe_word_cached(std::string_view word, std::vector<TokenId>* out) const;
};

Status TokenizerImpl::load_vocab(const Json& model, std::string_view what) {
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return corrupt(fmt::format("{}: model.vocab must be an object", what));
  const Json& vocab = model["vocab"];
  size_t n = vocab.size();
  if (n == 0) return corrupt(fmt::format("{}: model.vocab is empty", what));
  if (n > kMaxTokenId) return corrupt(fmt::format("{}: model.vocab has {} entries", what, n));
  bytes.assign(n, {});
  kind.assign(n, Kind::kHole);
  special.assign(n, 0);
  mappable.assign(n, 0);
  bytes_to_id.reserve(n * 2);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const Json& v = it.value();
    if (!v.is_number_unsigned())
      return corrupt(
          fmt::format("{}: model.vocab[\"{}\"] is not a non-negative integer", what, it.key()));
    uint64_t id = v.get<uint64_t>();
    if (id >= n)
      return corrupt(
          fmt::format("{}: model.vocab id {} of \"{}\" is not below the vocabulary "
                      "size {} (ids must be dense)",
                      what, id, it.key(), n));
    if (kind[id] != Kind::kHole)
      return corrupt(fmt::format("{}: model.vocab id {} is used twice", what, id));
    kind[id] = Kind::kVocab;
    auto raw = byte_level_to_bytes(it.key());
    if (raw) {
      mappable[id] = 1;
      bytes[id] = std::move(*raw);
    } else {
      bytes[id] = it.key();  // like the Hugging Face decoder: such tokens decode as written
    }
    if (!bytes_to_id.emplace(bytes[id], static_cast<TokenId>(id)).second)
      return corrupt(
          fmt::format("{}: model.vocab has two entries for the bytes of \"{}\"", what, it.key()));
  }
  vocab_count = n;
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_to_id.end() || !mappable[it->second])
      return corrupt(fmt::format("{}: model.vocab lacks the byte token for 0x{:02X}", what, b));
    byte_token[b] = it->second;
  }
  return ok_status();
}

Status TokenizerImpl::load_merges(const Json& model, std::string_view what) {
  if (!model.contains("merges") || !model["merges"].is_array())
    return corrupt(fmt::format("{}: model.merges must be an array", what));
  const Json& list = model["merges"];
  const Json& vocab = model["vocab"];
  merges.reserve(list.size());
  int32_t rank = 0;
  // Vocabulary strings as written (byte alphabet) -> id; nlohmann's object is a std::map, too
  // slow for ~400k lookups.
  std::unordered_map<std::string_view, TokenId> by_string;
  by_string.reserve(vocab.size() * 2);
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    by_string.emplace(it.key(), static_cast<TokenId>(it.value().get<uint64_t>()));
  auto lookup = [&](const std::string& s) -> std::optional<TokenId> {
    auto it = by_string.find(s);
    if (it == by_string.end()) return std::nullopt;
    return it->second;
  };
  for (const auto& m : list) {
    std::string a, b;
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return corrupt(fmt::format("{}: merge {} \"{}\" is not two tokens separated by one space",
                                   what, rank, s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return corrupt(fmt::format("{}: merge {} must be \"a b\" or [\"a\", \"b\"]", what, rank));
    }
    auto ia = lookup(a), ib = lookup(b), ir = lookup(a + b);
    if (!ia || !ib)
      return corrupt(fmt::format("{}: merge {} names a token missing from the vocabulary: \"{}\"",
                                 what, rank, !ia ? a : b));
    if (!ir)
      return corrupt(fmt::format("{}: merge {} result \"{}\" is missing from the vocabulary", what,
                                 rank, a + b));
    // Like the reference implementation, a repeated pair keeps its last rank.
    merges.put(pair_key(*ia, *ib), MergeInfo{rank, *ir});
    ++rank;
  }
  return ok_status();
}

Status TokenizerImpl::load_added(const Json& list, std::string_view what) {
  if (list.is_null()) return ok_status();
  if (!list.is_array()) return corrupt(fmt::format("{}: added_tokens must be an array", what));
  for (const auto& t : list) {
    if (!t.is_object())
      return corrupt(fmt::format("{}: added_tokens entry is not an object", what));
    AddedToken at;
    DS_ASSIGN_OR_RETURN(uint64_t id, json_get_u64(t, "id", "added_tokens entry"));
    if (id >= kMaxTokenId)
      return corrupt(fmt::format("{}: added token id {} is out of range", what, id));
    if (!t.contains("content") || !t["content"].is_string() ||
        t["content"].get_ref<const std::string&>().empty())
      return corrupt(fmt::format("{}: added token {} needs a non-empty string content", what, id));
    at.id = static_cast<TokenId>(id);
    at.content = t["content"].get<std::string>();
    std::string ctx = fmt::format("{}: added token {}", what, id);
    DS_RETURN_IF_ERROR(check_flag(t, "special", false, &at.special, ctx));
    DS_RETURN_IF_ERROR(check_flag(t, "lstrip", false, &at.lstrip, ctx));
    DS_RETURN_IF_ERROR(check_flag(t, "rstrip", false, &at.rstrip, ctx));
    DS_RETURN_IF_ERROR(check_flag(t, "normalized", !at.special, &at.normalized, ctx));
    DS_RETURN_IF_ERROR(check_flag(t, "single_word", false, &at.single_word, ctx));
    if (id >= kind.size()) {
      kind.resize(id + 1, Kind::kHole);
      bytes.resize(id + 1);
      special.resize(id + 1, 0);
      mappable.resize(id + 1, 0);
    }
    if (kind[id] == Kind::kAdded)
      return corrupt(fmt::format("{}: added token id {} is declared twice", what, id));
    if (kind[id] == Kind::kVocab) {
      // The vocabulary entry must be this very token.
      auto raw = byte_level_to_bytes(at.content);
      bool same = bytes[id] == at.content || (raw && mappable[id] && bytes[id] == *raw);
      if (!same)
        return corrupt(
            fmt::format("{}: added token {} \"{}\" disagrees with the vocabulary "
                        "entry for that id",
                        what, id, at.content));
    } else {
      auto it = bytes_to_id.find(at.content);
      if (it != bytes_to_id.end() && !mappable[it->second])
        return corrupt(fmt::format("{}: added token {} \"{}\" is already vocabulary id {}", what,
                                   id, at.content, it->second));
    }
    if (!added_by_content.emplace(at.content, at.id).second)
      return corrupt(
          fmt::format("{}: added token content \"{}\" is declared twice", what, at.content));
    kind[id] = Kind::kAdded;
    bytes[id] = at.content;
    special[id] = at.special ? 1 : 0;
    added.push_back(std::move(at));
  }
  return ok_status();
}

void TokenizerImpl::build_trie() {
  trie.assign(1, TrieNode{});
  trie_first.fill(false);
  for (size_t i = 0; i < added.size(); ++i) {
    int32_t node = 0;
    const std::string& s = added[i].content;
    trie_first[static_cast<uint8_t>(s[0])] = true;
    for (char ch : s) {
      auto c = static_cast<uint8_t>(ch);
      auto& nx = trie[node].next;
      auto it = std::lower_bound(nx.begin(), nx.end(), c,
                                 [](const auto& p, uint8_t v) { return p.first < v; });
      if (it != nx.end() && it->first == c) {
        node = it->second;
      } else {
        int32_t child = static_cast<int32_t>(trie.size());
        nx.insert(it, {c, child});
        trie.emplace_back();
        node = child;
      }
    }
    trie[node].added_index = static_cast<int32_t>(i);
  }
}

Status TokenizerImpl::load(std::string_view json_text, std::string_view what) {
  JsonLimits limits;
  limits.max_depth = 32;
  DS_ASSIGN_OR_RETURN(Json root, parse_json_strict(json_text, limits, what));
  if (!root.is_object()) return corrupt(fmt::format("{}: top level is not an object", what));
  if (!root.contains("model") || !root["model"].is_object())
    return corrupt(fmt::format("{}: missing \"model\" object", what));
  const Json& model = root["model"];
  if (!model.contains("type") || !model["type"].is_string() || model["type"] != "BPE")
    return unimplemented(fmt::format("{}: model.type must be \"BPE\"", what));
  auto null_or_absent = [&](const char* key) {
    return !model.contains(key) || model[key].is_null() ||
           (model[key].is_string() && model[key].get_ref<const std::string&>().empty());
  };
  if (!null_or_absent("dropout") && !(model["dropout"].is_number() && model["dropout"] == 0))
    return unimplemented(fmt::format("{}: BPE dropout is not supported", what));
  if (!null_or_absent("continuing_subword_prefix"))
    return unimplemented(fmt::format("{}: BPE continuing_subword_prefix is not supported", what));
  if (!null_or_absent("end_of_word_suffix"))
    return unimplemented(fmt::format("{}: BPE end_of_word_suffix is not supported", what));
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() &&
      model["byte_fallback"].get<bool>())
    return unimplemented(fmt::format("{}: BPE byte_fallback is not supported", what));
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean())
    ignore_merges = model["ignore_merges"].get<bool>();

  if (root.contains("normalizer"))
    DS_RETURN_IF_ERROR(check_normalizer(root["normalizer"], 0).with_context(std::string(what)));
  if (!root.contains("decoder"))
    return unimplemented(fmt::format("{}: decoder must be ByteLevel", what));
  DS_RETURN_IF_ERROR(check_decoder(root["decoder"], 0).with_context(std::string(what)));
  // post_processor only adds BOS/EOS around encodings; deepserve never asks for that (the chat
  // encoder writes them itself), so it is not interpreted.

  DS_RETURN_IF_ERROR(load_vocab(model, what));
  DS_RETURN_IF_ERROR(load_merges(model, what));
  DS_RETURN_IF_ERROR(
      load_added(root.contains("added_tokens") ? root["added_tokens"] : Json(), what));
  build_trie();

  auto pre_or =
      PreTokenizer::from_json(root.contains("pre_tokenizer") ? root["pre_tokenizer"] : Json());
  if (!pre_or.ok()) return pre_or.status().with_context(std::string(what));
  pre = std::move(pre_or).value();
  if (!pre.byte_level())
    return unimplemented(fmt::format("{}: pre_tokenizer must end with ByteLevel", what));
  return ok_status();
}

void TokenizerImpl::bpe_word(std::string_view word, std::vector<TokenId>* out) const {
  const size_t n = word.size();
  if (n == 1) {
    out->push_back(byte_token[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (ignore_merges) {
    auto it = bytes_to_id.find(std::string(word));
    if (it != bytes_to_id.end() && mappable[it->second]) {
      out->push_back(it->second);
      return;
    }
  }
  struct Sym {
    TokenId id;
    int32_t prev, next;
  };
  // Reused per thread: most pre-tokens are short, and allocation would dominate.
  thread_local std::vector<Sym> sym;
  sym.resize(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] = {byte_token[static_cast<uint8_t>(word[i])], static_cast<int32_t>(i) - 1,
              i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  struct Cand {
    int32_t rank;
    int32_t left;
    TokenId left_id, right_id;
    bool operator>(const Cand& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;  // leftmost among equal ranks
    }
  };
  thread_local std::vector<Cand> heap;  // min-heap on (rank, position)
  heap.clear();
  auto push = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = sym[left].next;
    if (right < 0) return;
    const MergeInfo* mi = merges.find(pair_key(sym[left].id, sym[right].id));
    if (mi) {
      heap.push_back({mi->rank, left, sym[left].id, sym[right].id});
      std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    Cand c = heap.back();
    heap.pop_back();
    Sym& l = sym[c.left];
    if (l.id != c.left_id || l.next < 0) continue;  // stale: the left symbol changed
    Sym& r = sym[l.next];
    if (r.id != c.right_id) continue;  // stale: the right neighbour changed
    l.id = merges.find(pair_key(c.left_id, c.right_id))->result;
    int32_t rn = r.next;
    r.id = -1;  // dead
    l.next = rn;
    if (rn >= 0) sym[rn].prev = c.left;
    push(l.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

void TokenizerImpl::bpe_word_cached(std::string_view word, std::vector<TokenId>* out) const {
  if (word.size() > kCacheMaxWordBytes || word.size() <= 1) {
    bpe_word(word, out);
    return;
  }
  thread_local std::vector<CacheEntry> cache(kCacheEntries);
  const uint64_t h = std::hash<std::string_view>{}(word);
  CacheEntry& e = cache[h & (kCacheEntries - 1)];
  if (e.owner == instance && e.hash == h && e.word_len == word.size() &&
      std::memcmp(e.word, word.data(), word.size()) == 0) {
    out->insert(out->end(), e.ids, e.ids + e.n_ids);
    return;
  }
  size_t start = out->size();
  bpe_word(word, out);
  size_t n = out->size() - start;
  if (n > kCacheMaxIds) return;
  e.owner = instance;
  e.hash = h;
  e.word_len = static_cast<uint8_t>(word.size());
  e.n_ids = static_cast<uint8_t>(n);
  std::memcpy(e.word, word.data(), word.size());
  std::copy(out->begin() + start, out->end(), e.ids);
}

// ---- Tokenizer ----------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, std::string_view what) {
  auto impl = std::make_unique<TokenizerImpl>();
  try {
    DS_RETURN_IF_ERROR(impl->load(json_text, what));
  } catch (const std::exception& e) {
    // nlohmann-json throws on type mismatches we did not foresee; never let it escape.
    return corrupt(fmt::format("{}: {}", what, e.what()));
  }
  return Tokenizer(std::move(impl));
}

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(fmt::format("cannot open tokenizer file {}", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(fmt::format("cannot read tokenizer file {}", path));
  return from_json(ss.str(), path);
}

std::vector<TextPiece> Tokenizer::split_added(std::string_view text) const {
  const TokenizerImpl& im = *impl_;
  std::vector<TextPiece> out;
  size_t seg_start = 0;
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    if (!im.trie_first[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest added token starting at pos.
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < n; ++i) {
      const auto& nx = im.trie[node].next;
      auto c = static_cast<uint8_t>(text[i]);
      auto it = std::lower_bound(nx.begin(), nx.end(), c,
                                 [](const auto& p, uint8_t v) { return p.first < v; });
      if (it == nx.end() || it->first != c) break;
      node = it->second;
      int32_t ai = im.trie[node].added_index;
      if (ai >= 0) {
        const AddedToken& at = im.added[ai];
        bool ok = true;
        if (at.single_word) {
          bool before = pos > 0 && is_word_byte(static_cast<uint8_t>(text[pos - 1]));
          bool after = i + 1 < n && is_word_byte(static_cast<uint8_t>(text[i + 1]));
          ok = !before && !after;
        }
        if (ok) {
          best = ai;
          best_end = i + 1;
        }
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& at = im.added[best];
    size_t start = pos, end = best_end;
    if (at.lstrip) {
      while (start > seg_start) {
        size_t ps = prev_char_start(text, start);
        size_t len = 0;
        if (ps == std::string_view::npos || !is_unicode_space(decode_cp(text, ps, &len)) ||
            ps + len != start)
          break;
        start = ps;
      }
    }
    if (at.rstrip) {
      while (end < n) {
        size_t len = 0;
        uint32_t cp = decode_cp(text, end, &len);
        if (len == 0 || !is_unicode_space(cp)) break;
        end += len;
      }
    }
    if (start > seg_start) out.push_back({false, -1, text.substr(seg_start, start - seg_start)});
    out.push_back({true, at.id, text.substr(pos, best_end - pos)});
    pos = end;
    seg_start = end;
  }
  if (seg_start < n) out.push_back({false, -1, text.substr(seg_start)});
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_of(const EncodeOptions& opts) {
  return opts.deadline_ms > 0 ? Clock::now() + std::chrono::milliseconds(opts.deadline_ms)
                              : Clock::time_point::max();
}

Status check_input(std::string_view text, const EncodeOptions& opts) {
  if (text.size() > opts.max_input_bytes)
    return resource_exhausted(fmt::format("input of {} bytes is over the tokenizer limit of {}",
                                          text.size(), opts.max_input_bytes));
  if (!is_valid_utf8(text)) return invalid_argument("text to tokenize is not valid UTF-8");
  return ok_status();
}

// Pre-tokenizes and BPEs already validated text, checking `deadline` every 256 pre-tokens.
Status encode_valid_plain(const TokenizerImpl& im, std::string_view text, const EncodeOptions& opts,
                          Clock::time_point deadline, std::vector<TokenId>* out) {
  size_t k = 0;
  return im.pre.for_each(text, [&](std::string_view word) -> Status {
    im.bpe_word_cached(word, out);
    if ((++k & 255) == 0 && opts.deadline_ms > 0 && Clock::now() > deadline)
      return resource_exhausted(
          fmt::format("tokenization exceeded its deadline of {} ms", opts.deadline_ms));
    return ok_status();
  });
}

}  // namespace

Status Tokenizer::encode_plain_append(std::string_view text, const EncodeOptions& opts,
                                      std::vector<TokenId>* out) const {
  DS_RETURN_IF_ERROR(check_input(text, opts));
  return encode_valid_plain(*impl_, text, opts, deadline_of(opts), out);
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text,
                                               const EncodeOptions& opts) const {
  DS_RETURN_IF_ERROR(check_input(text, opts));
  const auto deadline = deadline_of(opts);  // one budget for the whole call
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (!opts.parse_special) {
    DS_RETURN_IF_ERROR(encode_valid_plain(*impl_, text, opts, deadline, &out));
    return out;
  }
  for (const auto& piece : split_added(text)) {
    if (piece.is_added) {
      out.push_back(piece.id);
    } else {
      DS_RETURN_IF_ERROR(encode_valid_plain(*impl_, piece.text, opts, deadline, &out));
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& opts) const {
  std::string raw;
  for (TokenId id : ids) {
    if (!has_id(id)) continue;
    if (opts.skip_special && impl_->special[id]) continue;
    raw += impl_->bytes[id];
  }
  std::string out;
  out.reserve(raw.size());
  append_utf8_lossy(raw, &out);
  return out;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (!has_id(id)) return {};
  return impl_->bytes[id];
}

bool Tokenizer::has_id(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kind.size() && impl_->kind[id] != Kind::kHole;
}

bool Tokenizer::is_special(TokenId id) const {
  return has_id(id) && impl_->special[id];
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view content) const {
  std::string key(content);
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end())
    return it->second;
  if (auto it = impl_->bytes_to_id.find(key); it != impl_->bytes_to_id.end()) return it->second;
  return std::nullopt;
}

size_t Tokenizer::id_space() const {
  return impl_->kind.size();
}
size_t Tokenizer::vocab_size() const {
  return impl_->vocab_count;
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

}  // namespace ds::tok
