// Environment switches for A/B measurements: DEEPSERVE_<FEATURE>=0 turns a feature off. Header-only,
// so the CUDA kernel libraries (which link nothing of core) can use it too.
#pragma once

#include <cstdlib>
#include <cstring>

namespace ds {

// A switch that either value can force: "1" on, "0" off, anything else (unset included) `fallback`.
inline bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::strcmp(v, "1") == 0) return true;
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  return fallback;
}

// Whether the environment variable `name` is set to exactly "0" (unset, empty or any other value
// leaves the feature on).
inline bool env_switched_off(const char* name) { return !env_switch(name, true); }

}  // namespace ds
