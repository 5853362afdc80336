// Subcommand registration for the deepserve binary. Each cmd_<name>.cpp defines one
// register_<name>() that adds its CLI11 subcommand and a callback returning an exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>

#include "core/status.h"

namespace ds::cli {

// The callback a subcommand runs; its return value is the process exit code.
using CommandFn = std::function<int()>;

// Prints "error: <message>" to stderr and returns `exit_code`: the one way subcommands report a
// failed Status (1 = the operation failed, 2 = bad arguments).
inline int fail(const Status& status, int exit_code = 1) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return exit_code;
}

// Adds every subcommand to `app`; the chosen one's callback is stored in `*run`.
void register_all(CLI::App& app, CommandFn* run);

}  // namespace ds::cli
