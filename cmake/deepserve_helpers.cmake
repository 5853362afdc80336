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
# Tests that need a GPU carry the label `gpu` and skip themselves (GTEST_SKIP) without one.
function(ds_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include
                                             ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DS_WARNINGS}>)
  target_compile_definitions(${name} PRIVATE DS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest_main)
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  gtest_discover_tests(${name} PROPERTIES LABELS "${labels}" DISCOVERY_TIMEOUT 60)
endfunction()
