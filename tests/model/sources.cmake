set(DS_TEST_MODEL_SOURCES "")
include(${CMAKE_CURRENT_LIST_DIR}/sources_checkpoint.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/sources_config.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/sources_synthetic.cmake)
