// Helpers shared by the fuzz targets: the LLVMFuzzerTestOneInput declaration, a check macro that
// turns a broken invariant into a crash the fuzzer (or the replay main) reports, a per-process
// scratch directory for targets whose parser reads files, file writing, an independent UTF-8
// validator to compare the library's against, and the default DeepSeek tokenizer loaded once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// Aborts with a message when `cond` is false: a fuzz finding, never an input error.
#define DS_FUZZ_CHECK(cond, msg)                                             \
  do {                                                                       \
    if (!(cond)) ::ds::fuzz::check_failed(#cond, (msg), __FILE__, __LINE__); \
  } while (0)

namespace ds::fuzz {

[[noreturn]] void check_failed(const char* cond, std::string_view msg, const char* file, int line);

// A fresh directory under $TMPDIR (or /tmp), made on first use and removed at process exit.
const std::string& scratch_dir();

// Writes `bytes` to `path` (replacing it); aborts when the OS refuses (that is the environment,
// not the input).
void write_file(const std::string& path, std::string_view bytes);

// Well-formed UTF-8 by the Unicode definition (no overlong forms, no surrogates, <= U+10FFFF),
// written independently of the library's validators so the two can be compared.
bool reference_utf8_valid(std::string_view s);

// The default DeepSeek-V4 tokenizer (tok::load_default_tokenizer), loaded on first use. Aborts
// with the loader's message when it cannot be loaded (node_modules missing: run `npm ci`).
const tok::Tokenizer& default_tokenizer();

// With DS_FUZZ_VERBOSE=1 in the environment, prints whether the parser accepted the input (and
// the refusal message), to check by hand which seeds reach the code past validation.
void note_result(const Status& status);

// Silences library logging (warnings about refused files would flood the fuzzer's output).
void quiet_logging();

}  // namespace ds::fuzz
