# config.json, the expected tensor set, weight formats and model statistics.
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/config.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/tensor_spec.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/weight_format.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_stats.cpp)
