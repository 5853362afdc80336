# Safetensors reader/writer and the sharded checkpoint directory.
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_writer.cpp)
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_files.cpp)
