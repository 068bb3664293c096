# Chapter 08, host-side loaders (plain C++, no CUDA): safetensors checkpoints,
# config.json, tokenizer.json and the ChatML chat template. Included by this chapter's
# CMakeLists.txt, which builds the model on top of `bielik_ch08_loaders`.
add_library(bielik_ch08_loaders STATIC
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_config.cpp)
target_include_directories(bielik_ch08_loaders PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(bielik_ch08_loaders PUBLIC nlohmann_json::nlohmann_json bielik_common)

bielik_add_test(test_ch08_safetensors CHAPTER 08 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp
                LIBS bielik_ch08_loaders)
bielik_add_test(test_ch08_config_template CHAPTER 08 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config_template.cpp
                LIBS bielik_ch08_loaders)
