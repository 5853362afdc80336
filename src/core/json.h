// Strict JSON parsing for untrusted files and requests (safetensors headers, index.json,
// config.json, tokenizer.json, HTTP bodies). On top of nlohmann-json's RFC 8259 parser (which
// already rejects invalid UTF-8 in strings, lone surrogate escapes and NaN/Infinity literals) it
// rejects duplicate object keys at any depth, bounds the nesting depth and the number of values,
// and reports the byte offset of the first problem. Number classification is kept: integers that
// fit u64 are `number_unsigned`, negatives `number_integer`, everything with a fraction or an
// exponent (or too large for 64 bits) `number_float`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace ds {

using Json = nlohmann::json;

struct JsonLimits {
  int max_depth = 64;                  // nesting of objects/arrays
  uint64_t max_values = 50'000'000;    // scalars + containers
  uint64_t max_string_bytes = 1 << 24; // any single string or key
};

// Parses exactly one JSON value (surrounded only by JSON whitespace). `what` names the input in
// error messages ("config.json", "safetensors header of shard-00001.safetensors", ...).
Result<Json> parse_json_strict(std::string_view text, const JsonLimits& limits,
                               std::string_view what);

// True when `bytes` is well-formed UTF-8 (no overlong forms, no surrogates, max U+10FFFF).
bool is_valid_utf8(std::string_view bytes);

// Typed field access with messages that name the field. `obj` must be an object.
// A JSON integer that fits in u64 (no fraction, no exponent, not negative).
Result<uint64_t> json_get_u64(const Json& obj, std::string_view key, std::string_view what);
// Any JSON number, as double (finite).
Result<double> json_get_number(const Json& obj, std::string_view key, std::string_view what);

}  // namespace ds
