// The list of subcommands. New subcommands add their register function here.
#include "commands.h"

namespace ds::cli {

void register_all(CLI::App& app, CommandFn* run) {
  (void)app;
  (void)run;
}

}  // namespace ds::cli
