# Sources of ds_tokenizer (src/tokenizer/CMakeLists.txt).
set(DS_TOKENIZER_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/utf8_util.cpp
    ${CMAKE_CURRENT_LIST_DIR}/byte_level.cpp
    ${CMAKE_CURRENT_LIST_DIR}/pre_tokenizer.cpp
    ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
    ${CMAKE_CURRENT_LIST_DIR}/stream_decoder.cpp
    ${CMAKE_CURRENT_LIST_DIR}/default_tokenizer.cpp
    ${CMAKE_CURRENT_LIST_DIR}/chat_encoding.cpp
    ${CMAKE_CURRENT_LIST_DIR}/output_parser.cpp)
