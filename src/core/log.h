// Logging: spdlog, configured once by the tools. Library code logs through spdlog's default
// logger (spdlog::info(...)); this header only adds the setup helpers.
#pragma once

#include <string_view>

#include "core/status.h"

namespace ds {

// level: trace, debug, info, warn, error, off. Logs go to stderr.
Status init_logging(std::string_view level);

}  // namespace ds
