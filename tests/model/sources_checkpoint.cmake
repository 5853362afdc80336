# Tests for the safetensors reader/writer, the corrupt-file catalogue and the checkpoint directory.
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp)
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors_catalogue.cpp)
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_files.cpp)
