// Subcommand registration for the deepserve binary. Each cmd_<name>.cpp defines one
// register_<name>() that adds its CLI11 subcommand and a callback returning an exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace ds::cli {

// The callback a subcommand runs; its return value is the process exit code.
using CommandFn = std::function<int()>;

// Adds every subcommand to `app`; the chosen one's callback is stored in `*run`.
void register_all(CLI::App& app, CommandFn* run);

}  // namespace ds::cli
