# Tests of config.json, the expected tensor set, weight formats and model statistics.
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config.cpp)
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tensor_spec.cpp)
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_weight_format.cpp)
list(APPEND DS_TEST_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_stats.cpp)
