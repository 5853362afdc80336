// Fuzz target: ds::parse_json_strict (src/core/json.h), the strict JSON parser under every
// untrusted file and request. Each input is parsed with the default limits and with the tight
// limits of a safetensors header; an accepted text must be valid UTF-8 (checked against an
// independent validator, which must also agree with ds::is_valid_utf8 on every input), must
// respect the limits, and must survive dump() and parse back to the same value.
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "core/json.h"
#include "fuzz_util.h"

namespace {

// Depth of nesting, counting the outermost container as 1; stops counting past `cap`.
int depth_of(const ds::Json& j, int cap) {
  if (!j.is_structured() || cap <= 0) return 0;
  int d = 0;
  for (const auto& v : j) d = std::max(d, depth_of(v, cap - 1));
  return d + 1;
}

// Counts the values (scalars and containers) and checks the string limit; true when `j` holds a
// float that is not finite (such a value dumps as null).
bool walk(const ds::Json& j, const ds::JsonLimits& limits, uint64_t* values) {
  ++*values;
  bool nonfinite = j.is_number_float() && !std::isfinite(j.get<double>());
  if (j.is_string())
    DS_FUZZ_CHECK(j.get_ref<const std::string&>().size() <= limits.max_string_bytes,
                  "string limit exceeded");
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      DS_FUZZ_CHECK(k.size() <= limits.max_string_bytes, "key length limit exceeded");
      nonfinite |= walk(v, limits, values);
    }
  } else if (j.is_array()) {
    for (const auto& v : j) nonfinite |= walk(v, limits, values);
  }
  return nonfinite;
}

void check_accepted(const ds::Json& j, std::string_view text, const ds::JsonLimits& limits) {
  DS_FUZZ_CHECK(ds::fuzz::reference_utf8_valid(text), "accepted text that is not valid UTF-8");
  DS_FUZZ_CHECK(depth_of(j, limits.max_depth + 1) <= limits.max_depth, "depth limit exceeded");
  uint64_t values = 0;
  const bool nonfinite = walk(j, limits, &values);
  DS_FUZZ_CHECK(values <= limits.max_values, "value count limit exceeded");
  // The value dumps without throwing (dump() throws on invalid UTF-8 in strings) and parses back
  // to the same value with the same limits.
  std::string dumped = j.dump();
  auto again = ds::parse_json_strict(dumped, limits, "fuzz re-parse");
  DS_FUZZ_CHECK(again.ok(),
                "dump() of an accepted value is refused: " + again.status().to_string());
  DS_FUZZ_CHECK(*again == j || nonfinite, "dump() + parse does not give the same value");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  DS_FUZZ_CHECK(ds::is_valid_utf8(text) == ds::fuzz::reference_utf8_valid(text),
                "ds::is_valid_utf8 disagrees with the reference validator");

  const ds::JsonLimits defaults;
  auto parsed = ds::parse_json_strict(text, defaults, "fuzz");
  ds::fuzz::note_result(parsed.status());
  if (parsed.ok()) check_accepted(*parsed, text, defaults);

  ds::JsonLimits tight;
  tight.max_depth = 3;
  tight.max_values = 64;
  tight.max_string_bytes = 32;
  auto parsed_tight = ds::parse_json_strict(text, tight, "fuzz (tight)");
  if (parsed_tight.ok()) {
    check_accepted(*parsed_tight, text, tight);
    DS_FUZZ_CHECK(parsed.ok() && *parsed == *parsed_tight,
                  "accepted under tight limits but not under the defaults");
  }
  return 0;
}
