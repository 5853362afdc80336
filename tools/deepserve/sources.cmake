# Subcommand sources and the libraries they need (one line per subcommand).
set(DS_CLI_SOURCES ${CMAKE_CURRENT_LIST_DIR}/commands.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cmd_inspect.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cmd_make_checkpoint.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cmd_tokenize.cpp)
set(DS_CLI_DEPS ds_core ds_model ds_tokenizer)
list(APPEND DS_CLI_SOURCES ${CMAKE_CURRENT_LIST_DIR}/cmd_generate.cpp)
list(APPEND DS_CLI_DEPS ds_kernels_cpu ds_scheduler ds_backend)
list(APPEND DS_CLI_SOURCES ${CMAKE_CURRENT_LIST_DIR}/cmd_roofline.cpp)
list(APPEND DS_CLI_SOURCES ${CMAKE_CURRENT_LIST_DIR}/cmd_profile.cpp)
include(${CMAKE_CURRENT_LIST_DIR}/bench/bench.cmake)  # ds_bench + cmd_bench.cpp
list(APPEND DS_CLI_SOURCES ${CMAKE_CURRENT_LIST_DIR}/cmd_serve.cpp)
list(APPEND DS_CLI_DEPS ds_server ds_engine)
