# Tests of the roofline calculator against dsv4-model.md §13.
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_roofline.cpp)
