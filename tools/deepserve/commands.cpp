// The list of subcommands. Each subcommand file adds its declaration and one call below.
#include "commands.h"

namespace ds::cli {

// Declarations of the register functions (one per cmd_<name>.cpp).
// (none yet)

void register_all(CLI::App& app, CommandFn* run) {
  (void)app;
  (void)run;
}

}  // namespace ds::cli
