# The DeepSeek-V4 model: weights bound to kernel views, per-sequence state, the forward.
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/deepseek_v4/weights.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/deepseek_v4/state.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/deepseek_v4/cpu_ops.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/deepseek_v4/forward.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/deepseek_v4/profile.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/deepseek_v4/sharding.cpp)
