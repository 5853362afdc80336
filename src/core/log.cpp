// Logging setup (stderr, one format for every tool).
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

namespace ds {

Status init_logging(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return invalid_argument("unknown log level '" + std::string(level) +
                            "' (expected trace, debug, info, warn, error or off)");
  }
  auto logger = spdlog::stderr_color_mt("deepserve");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(parsed);
  return ok_status();
}

}  // namespace ds
