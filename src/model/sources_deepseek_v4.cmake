# list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/deepseek_v4/<file>.cpp)
