// The list of subcommands. Each subcommand file adds its declaration and one call below.
#include "commands.h"

namespace ds::cli {

// Declarations of the register functions (one per cmd_<name>.cpp).
void register_bench(CLI::App& app, CommandFn* run);
void register_generate(CLI::App& app, CommandFn* run);
void register_inspect(CLI::App& app, CommandFn* run);
void register_make_checkpoint(CLI::App& app, CommandFn* run);
void register_profile(CLI::App& app, CommandFn* run);
void register_roofline(CLI::App& app, CommandFn* run);
void register_serve(CLI::App& app, CommandFn* run);
void register_tokenize(CLI::App& app, CommandFn* run);

void register_all(CLI::App& app, CommandFn* run) {
  register_bench(app, run);
  register_generate(app, run);
  register_inspect(app, run);
  register_make_checkpoint(app, run);
  register_profile(app, run);
  register_roofline(app, run);
  register_serve(app, run);
  register_tokenize(app, run);
}

}  // namespace ds::cli
