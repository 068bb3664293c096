# Chapter 08, host-side loaders (plain C++, no CUDA): safetensors checkpoints,
# config.json, tokenizer.json and the ChatML chat template. Included by this chapter's
# CMakeLists.txt, which builds the model on top of `bielik_ch08_loaders`.
set(loaders_dir ${CMAKE_CURRENT_LIST_DIR})
add_library(bielik_ch08_loaders STATIC
  ${loaders_dir}/safetensors.cpp
  ${loaders_dir}/model_config.cpp
  ${loaders_dir}/utf8.cpp
  ${loaders_dir}/pretokenizer.cpp
  ${loaders_dir}/tokenizer_bpe.cpp
  ${loaders_dir}/tokenizer.cpp
  ${loaders_dir}/chat_template.cpp)
target_include_directories(bielik_ch08_loaders PUBLIC ${loaders_dir})
target_link_libraries(bielik_ch08_loaders PUBLIC nlohmann_json::nlohmann_json bielik_common)

# Golden data: small tokenizers trained with HF `tokenizers` + their ids for test strings.
bielik_add_golden(08_tokenizer gen_08_tokenizer.py)

bielik_add_test(test_ch08_safetensors CHAPTER 08 SOURCES ${loaders_dir}/test_safetensors.cpp
                LIBS bielik_ch08_loaders)
bielik_add_test(test_ch08_config_template CHAPTER 08 SOURCES ${loaders_dir}/test_config_template.cpp
                LIBS bielik_ch08_loaders)
bielik_add_test(test_ch08_tokenizer CHAPTER 08 SOURCES ${loaders_dir}/test_tokenizer.cpp
                LIBS bielik_ch08_loaders GOLDEN 08_tokenizer)
bielik_add_test(test_ch08_unicode CHAPTER 08 SOURCES ${loaders_dir}/test_unicode_classes.cpp
                LIBS bielik_ch08_loaders GOLDEN 08_tokenizer)
# Where models/smollm2-135m-instruct is looked for (optional tests on the real SmolLM2,
# skipped with a warning until scripts/prepare_smollm2.py has run; BIELIK_SMOLLM2_DIR
# in the environment overrides the path).
foreach(test_name test_ch08_safetensors test_ch08_tokenizer)
  target_compile_definitions(${test_name} PRIVATE BIELIK_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endforeach()
