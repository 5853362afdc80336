# Subcommand sources and the libraries they need (one line per subcommand).
set(DS_CLI_SOURCES ${CMAKE_CURRENT_LIST_DIR}/commands.cpp)
set(DS_CLI_DEPS ds_core)
