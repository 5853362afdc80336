list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_semantics.cpp)
