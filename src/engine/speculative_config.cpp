// parse_speculative_config (include/deepserve/engine.h): the JSON of --speculative-config.
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "deepserve/engine.h"

namespace deepserve {

bool parse_speculative_config(const std::string& json, SpeculativeConfig* out,
                              std::string* error) {
  auto fail = [&](std::string msg) {
    if (error) *error = "--speculative-config: " + std::move(msg);
    return false;
  };
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded()) return fail("not valid JSON: " + json);
  if (!j.is_object()) {
    return fail("must be a JSON object, e.g. {\"method\":\"mtp\",\"num_speculative_tokens\":2}");
  }
  SpeculativeConfig c;
  for (const auto& [key, value] : j.items()) {
    if (key == "method") {
      if (!value.is_string()) return fail("\"method\" must be a string");
      c.method = value.get<std::string>();
    } else if (key == "num_speculative_tokens") {
      if (!value.is_number_integer())
        return fail("\"num_speculative_tokens\" must be an integer");
      c.num_speculative_tokens = value.get<int64_t>();
    } else if (key == "adaptive") {
      if (!value.is_boolean()) return fail("\"adaptive\" must be true or false");
      c.adaptive = value.get<bool>();
    } else {
      return fail("unknown field \"" + key +
                  "\" (known: method, num_speculative_tokens, adaptive)");
    }
  }
  if (c.method != "mtp") {
    return fail(c.method.empty() ? "\"method\" is required (only \"mtp\" is supported)"
                                 : "method \"" + c.method + "\" is not supported (only \"mtp\")");
  }
  if (!j.contains("num_speculative_tokens")) return fail("\"num_speculative_tokens\" is required");
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > 8) {
    return fail("\"num_speculative_tokens\" must be between 1 and 8, got " +
                std::to_string(c.num_speculative_tokens));
  }
  *out = c;
  return true;
}

}  // namespace deepserve
