# The roofline calculator (`deepserve roofline`, dsv4-model.md §13).
list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/roofline.cpp)
