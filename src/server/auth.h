// API-key check (reliability.md AU1, AU2): the key comes from `Authorization: Bearer <key>` or
// `X-Api-Key: <key>`; a missing, wrong, empty or doubled header is refused; the comparison takes
// the same time whatever the position of the first differing byte. Keys are never logged.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::server {

// Constant-time equality: the time depends only on the lengths, not on the contents.
bool constant_time_equal(std::string_view a, std::string_view b);

// The key a request presents, from its header values (each vector holds every occurrence of that
// header). Returns false when none is present, when a header is doubled or malformed, or when the
// two headers disagree.
bool presented_api_key(const std::vector<std::string>& authorization,
                       const std::vector<std::string>& x_api_key, std::string* key);

// True when the request may pass: no key configured, or the presented key matches.
bool api_key_matches(const std::string& configured, const std::vector<std::string>& authorization,
                     const std::vector<std::string>& x_api_key);

}  // namespace ds::server
