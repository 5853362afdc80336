// Implementation of the shared fuzz helpers (fuzz_util.h).
#include "fuzz_util.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>

#include "core/log.h"
#include "tokenizer/default_tokenizer.h"

namespace ds::fuzz {

void check_failed(const char* cond, std::string_view msg, const char* file, int line) {
  std::fprintf(stderr, "FUZZ CHECK FAILED %s:%d: %s: %.*s\n", file, line, cond,
               static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::abort();
}

namespace {

std::string g_scratch;

void remove_scratch() {
  std::error_code ec;
  if (!g_scratch.empty()) std::filesystem::remove_all(g_scratch, ec);
}

}  // namespace

const std::string& scratch_dir() {
  if (g_scratch.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ds_fuzz_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) check_failed("mkdtemp", tmpl, __FILE__, __LINE__);
    g_scratch = tmpl;
    std::atexit(remove_scratch);
  }
  return g_scratch;
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) check_failed("write_file", path, __FILE__, __LINE__);
}

bool reference_utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2, cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3, cp = b0 & 0x0F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4, cp = b0 & 0x07;
    } else {
      return false;  // continuation byte, C0/C1 (overlong 2-byte) or F5..FF
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (len == 3 && cp < 0x800) return false;                       // overlong
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return false;  // overlong / too large
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;                 // surrogate
    i += len;
  }
  return true;
}

const tok::Tokenizer& default_tokenizer() {
  static const std::unique_ptr<tok::Tokenizer> tokenizer = [] {
    auto t = tok::load_default_tokenizer();
    if (!t.ok()) check_failed("load_default_tokenizer", t.status().to_string(), __FILE__, __LINE__);
    return std::make_unique<tok::Tokenizer>(std::move(t).value());
  }();
  return *tokenizer;
}

void note_result(const Status& status) {
  static const bool verbose = [] {
    const char* v = std::getenv("DS_FUZZ_VERBOSE");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  if (!verbose) return;
  if (status.ok()) {
    std::fprintf(stderr, "  accepted\n");
  } else {
    std::fprintf(stderr, "  refused: %s\n", status.to_string().c_str());
  }
}

void quiet_logging() {
  static const bool done = [] {
    (void)init_logging("off");
    return true;
  }();
  (void)done;
}

}  // namespace ds::fuzz
