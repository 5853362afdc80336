# `deepserve bench`: the ds_bench library (client, datasets, metrics, report, plots; tested by
# tests/tools/bench) and the subcommand file. Included from ../sources.cmake.
set(DS_BENCH_DIR ${CMAKE_CURRENT_LIST_DIR})
if(NOT TARGET ds_bench)
  # The Debian cpp-httplib is a compiled library; its pkg-config flags (TLS, zlib, brotli
  # defines) must match the ones it was built with.
  pkg_check_modules(DS_BENCH_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
  ds_library(ds_bench
             SOURCES ${DS_BENCH_DIR}/metrics.cpp ${DS_BENCH_DIR}/sse_parser.cpp
                     ${DS_BENCH_DIR}/openai_client.cpp ${DS_BENCH_DIR}/dataset.cpp
                     ${DS_BENCH_DIR}/arrivals.cpp ${DS_BENCH_DIR}/progress.cpp
                     ${DS_BENCH_DIR}/runner.cpp ${DS_BENCH_DIR}/report.cpp
                     ${DS_BENCH_DIR}/svg_plot.cpp ${DS_BENCH_DIR}/sweep.cpp
             DEPS ds_core ds_json ds_tokenizer PkgConfig::DS_BENCH_HTTPLIB Threads::Threads)
  target_include_directories(ds_bench PUBLIC ${DS_BENCH_DIR}/..)
  target_compile_definitions(ds_bench PRIVATE DS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()
list(APPEND DS_CLI_SOURCES ${DS_BENCH_DIR}/../cmd_bench.cpp)
list(APPEND DS_CLI_DEPS ds_bench)
