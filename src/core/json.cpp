// Strict JSON: a SAX handler that builds the DOM while refusing duplicate keys and bounding
// depth, value count and string sizes (reliability.md §3.2 rules 4-7, HJ6, HJ9).
#include "core/json.h"

#include <vector>

namespace ds {
namespace {

class StrictSax : public nlohmann::json_sax<Json> {
 public:
  StrictSax(const JsonLimits& limits) : limits_(limits) {}

  bool null() override { return add(Json(nullptr)); }
  bool boolean(bool v) override { return add(Json(v)); }
  bool number_integer(number_integer_t v) override { return add(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return add(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return add(Json(v)); }
  bool string(string_t& v) override {
    if (v.size() > limits_.max_string_bytes) return fail("string longer than the limit");
    return add(Json(std::move(v)));
  }
  bool binary(binary_t&) override { return fail("binary values are not JSON"); }

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    if (k.size() > limits_.max_string_bytes) return fail("object key longer than the limit");
    Json* obj = stack_.back();
    if (obj->contains(k)) return fail("duplicate key \"" + printable(k) + "\"");
    pending_key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    if (error_.empty()) {
      error_ = std::string("invalid JSON at byte ") + std::to_string(position) + ": " + ex.what();
    }
    return false;
  }

  Json take() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  static std::string printable(const std::string& s) {
    std::string out;
    for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7F) ? c : '?';
    return out;
  }

  bool fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }

  bool count() {
    if (++values_ > limits_.max_values) return fail("more JSON values than the limit");
    return true;
  }

  Json* place(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json* parent = stack_.back();
    if (parent->is_object()) {
      auto [it, inserted] = parent->emplace(pending_key_, std::move(v));
      return &it.value();
    }
    parent->push_back(std::move(v));
    return &parent->back();
  }

  bool add(Json&& v) {
    if (!count()) return false;
    place(std::move(v));
    return true;
  }

  bool open(Json&& v) {
    if (!count()) return false;
    if (int(stack_.size()) >= limits_.max_depth) return fail("JSON nested deeper than the limit");
    stack_.push_back(place(std::move(v)));
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  const JsonLimits& limits_;
  Json root_;
  std::vector<Json*> stack_;
  std::string pending_key_;
  uint64_t values_ = 0;
  std::string error_;
};

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) { ++i; continue; }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + size_t(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = p[i + size_t(k)];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return false;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return false;
    i += size_t(len);
  }
  return true;
}

Result<Json> parse_json_strict(std::string_view text, const JsonLimits& limits,
                               std::string_view what) {
  if (!is_valid_utf8(text)) return corrupt(std::string(what) + ": not valid UTF-8");
  // A raw NUL is never valid JSON (not whitespace, not allowed unescaped in strings), and the
  // parser would stop reading at it, accepting `{}\0garbage`.
  if (auto nul = text.find('\0'); nul != std::string_view::npos)
    return corrupt(std::string(what) + ": invalid JSON at byte " + std::to_string(nul) + ": NUL byte");
  StrictSax sax(limits);
  bool ok = Json::sax_parse(text.begin(), text.end(), &sax, Json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) {
    std::string err = sax.error().empty() ? "invalid JSON" : sax.error();
    return corrupt(std::string(what) + ": " + err);
  }
  return sax.take();
}

Result<uint64_t> json_get_u64(const Json& obj, std::string_view key, std::string_view what) {
  auto it = obj.find(std::string(key));
  if (it == obj.end()) return invalid_argument(std::string(what) + ": missing field \"" +
                                               std::string(key) + "\"");
  if (!it->is_number_unsigned())
    return invalid_argument(std::string(what) + ": field \"" + std::string(key) +
                            "\" must be a non-negative integer");
  return it->get<uint64_t>();
}

Result<double> json_get_number(const Json& obj, std::string_view key, std::string_view what) {
  auto it = obj.find(std::string(key));
  if (it == obj.end()) return invalid_argument(std::string(what) + ": missing field \"" +
                                               std::string(key) + "\"");
  if (!it->is_number())
    return invalid_argument(std::string(what) + ": field \"" + std::string(key) +
                            "\" must be a number");
  return it->get<double>();
}

}  // namespace ds
