# Each part of src/model lists its sources in its own file.
set(DS_MODEL_SOURCES "")
include(${CMAKE_CURRENT_LIST_DIR}/sources_checkpoint.cmake)  # safetensors, shard map
include(${CMAKE_CURRENT_LIST_DIR}/sources_config.cmake)      # config, tensor spec, formats, stats
include(${CMAKE_CURRENT_LIST_DIR}/sources_roofline.cmake)    # roofline calculator (§13)
include(${CMAKE_CURRENT_LIST_DIR}/sources_synthetic.cmake)   # synthetic checkpoints, validation
include(${CMAKE_CURRENT_LIST_DIR}/sources_deepseek_v4.cmake) # the model: weights, state, forward
