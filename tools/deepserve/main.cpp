// deepserve: the one binary with subcommands (serve, generate, bench, roofline, profile, inspect,
// make-checkpoint, tokenize). Parses global flags, sets up logging and runs the subcommand.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <stdlib.h>
#include <exception>
#include <string>

#include "core/log.h"
#include "commands.h"

int main(int argc, char** argv) {
  // The CPU backend's OpenMP threads sleep when idle unless the user chose otherwise: spinning
  // threads steal the cores of other processes (or of each other on a small machine) and made
  // decode 100x slower on a loaded 2-core machine. Must be set before the first parallel region.
  setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
  CLI::App app{"deepserve: inference engine and OpenAI-compatible server for DeepSeek-V4 models"};
  app.set_version_flag("--version", std::string("deepserve ") + DS_VERSION);
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->envname("DEEPSERVE_LOG_LEVEL");
  ds::cli::CommandFn run;
  ds::cli::register_all(app, &run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (auto s = ds::init_logging(log_level); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  try {
    return run ? run() : 2;
  } catch (const std::exception& e) {
    // Library code reports errors through Status; this is a last line against bugs.
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 70;
  }
}
