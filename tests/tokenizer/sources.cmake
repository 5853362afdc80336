# Sources of test_tokenizer (tests/tokenizer/CMakeLists.txt).
set(DS_TEST_TOKENIZER_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/test_util.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_bpe.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_goldens.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_chat_encoding.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_output_parser.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_hostile.cpp)
