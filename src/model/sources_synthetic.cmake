list(APPEND DS_MODEL_SOURCES ${CMAKE_CURRENT_LIST_DIR}/synthetic.cpp ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
     ${CMAKE_CURRENT_LIST_DIR}/embedded_model.cpp
     ${CMAKE_CURRENT_LIST_DIR}/embedded_weights.cpp ${CMAKE_CURRENT_LIST_DIR}/inspect_report.cpp)
