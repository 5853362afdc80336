# Helpers shared by every folder's CMakeLists.txt.

# ds_library(NAME SOURCES ... DEPS ...): a static library with the project's include root and
# warnings. Sources are listed explicitly by each folder.
function(ds_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DS_WARNINGS}>)
  if(ARG_DEPS)
    target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  endif()
endfunction()

# ds_test(NAME SOURCES ... DEPS ... [LABELS ...]): a GoogleTest binary registered with ctest.
# Labels: `unit` (default), `asan` (a unit test binary that run_tests.sh also runs under ASan +
# UBSan), `gpu` (needs a GPU; skips itself with GTEST_SKIP without one).
function(ds_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include
                                             ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DS_WARNINGS}>)
  target_compile_definitions(${name} PRIVATE DS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest_main)
  # One label per binary: gtest_discover_tests cannot pass a list-valued LABELS property.
  set(label unit)
  if(ARG_LABELS)
    list(LENGTH ARG_LABELS n)
    if(n GREATER 1)
      message(FATAL_ERROR "ds_test(${name}): give one label (unit, asan or gpu)")
    endif()
    set(label ${ARG_LABELS})
  endif()
  gtest_discover_tests(${name} PROPERTIES LABELS ${label} DISCOVERY_TIMEOUT 60)
endfunction()
