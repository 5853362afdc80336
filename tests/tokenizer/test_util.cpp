// Shared helpers of the tokenizer tests (see test_util.h).
#include "tokenizer/test_util.h"

#include <fstream>
#include <memory>
#include <sstream>

namespace ds::tok::testing {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Tokenizer* v3_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    auto path = locate_v3_tokenizer_json();
    if (!path.ok()) return nullptr;
    auto t = Tokenizer::from_file(*path);
    if (!t.ok()) return nullptr;
    return std::make_unique<Tokenizer>(std::move(t).value());
  }();
  return tok.get();
}

const Tokenizer* v4_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    auto t = load_default_tokenizer();
    if (!t.ok()) return nullptr;
    return std::make_unique<Tokenizer>(std::move(t).value());
  }();
  return tok.get();
}

}  // namespace ds::tok::testing
