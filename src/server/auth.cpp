// Constant-time key comparison and header extraction (see auth.h).
#include "server/auth.h"

#include <cstdint>

namespace ds::server {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Walk the longer length; every byte is compared, differences accumulate without branches.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile uint8_t diff = uint8_t(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const uint8_t x = i < a.size() ? uint8_t(a[i]) : 0;
    const uint8_t y = i < b.size() ? uint8_t(b[i]) : 0;
    diff = uint8_t(diff | (x ^ y));
  }
  return diff == 0;
}

bool presented_api_key(const std::vector<std::string>& authorization,
                       const std::vector<std::string>& x_api_key, std::string* key) {
  if (authorization.size() > 1 || x_api_key.size() > 1) return false;
  std::string from_auth, from_x;
  if (authorization.size() == 1) {
    const std::string& v = authorization[0];
    static const std::string kBearer = "Bearer ";
    if (v.size() <= kBearer.size() || v.compare(0, kBearer.size(), kBearer) != 0) return false;
    from_auth = v.substr(kBearer.size());
    if (from_auth.empty()) return false;
  }
  if (x_api_key.size() == 1) {
    from_x = x_api_key[0];
    if (from_x.empty()) return false;
  }
  if (!from_auth.empty() && !from_x.empty() && !constant_time_equal(from_auth, from_x)) {
    return false;
  }
  *key = !from_auth.empty() ? from_auth : from_x;
  return !key->empty();
}

bool api_key_matches(const std::string& configured, const std::vector<std::string>& authorization,
                     const std::vector<std::string>& x_api_key) {
  if (configured.empty()) return true;
  std::string key;
  if (!presented_api_key(authorization, x_api_key, &key)) return false;
  return constant_time_equal(key, configured);
}

}  // namespace ds::server
