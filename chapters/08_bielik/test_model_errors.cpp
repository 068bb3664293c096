// Chapter 08: bad inputs to the model fail with a message that says what is wrong,
// and a failed call leaves the model usable. The broken checkpoints are edited copies
// of the golden tiny ones (test_checkpoint_edit.hpp).
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "model_cpu.hpp"
#include "npy.hpp"
#include "test_checkpoint_edit.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

std::string tiny(const std::string& model) { return golden_path("08_bielik", model); }


}  // namespace

TEST_CASE("model loading: a missing directory or file is named", "[ch08][cpu][errors]") {
  std::string message = error_of<std::runtime_error>([] { CpuModel("/nonexistent/bielik-model"); });
  INFO(message);
  CHECK(contains(message, "/nonexistent/bielik-model"));
  CHECK(contains(message, "does not exist"));

  // A folder with weights but no config.json.
  TempDir no_config = edited_copy(tiny("tiny_bielik"), "no_config", nullptr);
  std::filesystem::remove(no_config.path + "/config.json");
  message = error_of<std::runtime_error>([&] { CpuModel m(no_config.path); });
  INFO(message);
  CHECK(contains(message, "config.json"));

  // A folder with config.json but no weights.
  TempDir no_weights = edited_copy(tiny("tiny_bielik"), "no_weights", nullptr);
  std::filesystem::remove(no_weights.path + "/model.safetensors");
  message = error_of<std::runtime_error>([&] { CpuModel m(no_weights.path); });
  INFO(message);
  CHECK(contains(message, "model.safetensors"));
}

TEST_CASE("model loading: a tensor of the wrong shape is named with both shapes", "[ch08][cpu][errors]") {
  const std::string name = "model.layers.1.self_attn.q_proj.weight";  // (H*D, C) = (64, 64)
  TempDir dir = edited_copy(tiny("tiny_bielik"), "wrong_shape", [&](TensorMap& t) {
    t[name].shape = {64, 63};
    t[name].bytes.resize(64 * 63 * 2);
  });
  std::string message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
  INFO(message);
  CHECK(contains(message, name));
  CHECK(contains(message, "(64, 63)"));
  CHECK(contains(message, "(64, 64)"));

  // A transposed matrix has the right element count but the wrong shape: (C, F) vs (F, C).
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  dir = edited_copy(tiny("tiny_bielik"), "transposed", [&](TensorMap& t) { t[down].shape = {96, 64}; });
  message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
  INFO(message);
  CHECK(contains(message, down));
}

TEST_CASE("model loading: biases must agree with attention_bias / mlp_bias", "[ch08][cpu][errors]") {
  // Bielik's config says attention_bias: true; drop one attention and one MLP bias.
  for (const char* bias : {"model.layers.1.self_attn.k_proj.bias", "model.layers.0.mlp.down_proj.bias"}) {
    TempDir dir = edited_copy(tiny("tiny_bielik"), "missing_bias", [&](TensorMap& t) { t.erase(bias); });
    std::string message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
    INFO(message);
    CHECK(contains(message, bias));
    CHECK(contains(message, contains(bias, "mlp") ? "mlp_bias" : "attention_bias"));
  }

  // The config flag off while the checkpoint has the biases: running without them
  // would give wrong text silently, so it is an error too.
  TempDir dir = edited_copy(tiny("tiny_bielik"), "bias_flag_off", nullptr, [](std::string& config) {
    config.replace(config.find("\"attention_bias\": true"), 22, "\"attention_bias\": false");
  });
  std::string message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
  INFO(message);
  CHECK(contains(message, "q_proj.bias"));
  CHECK(contains(message, "attention_bias"));

  // SmolLM2-like model (no biases, tied head): an untied config needs lm_head.weight.
  dir = edited_copy(tiny("tiny_smollm"), "untied_without_head", nullptr, [](std::string& config) {
    config.replace(config.find("\"tie_word_embeddings\": true"), 27, "\"tie_word_embeddings\": false");
  });
  message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
  INFO(message);
  CHECK(contains(message, "lm_head.weight"));
}

TEST_CASE("model loading: tensors the config does not use are refused, saved RoPE buffers ignored",
          "[ch08][cpu][errors]") {
  // tiny_smollm has 3 layers; a config saying 2 used to load and run on layers 0-1 alone.
  TempDir dir = edited_copy(tiny("tiny_smollm"), "fewer_layers", nullptr, [](std::string& config) {
    config.replace(config.find("\"num_hidden_layers\": 3"), 22, "\"num_hidden_layers\": 2");
  });
  std::string message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
  INFO(message);
  CHECK(contains(message, dir.path + "/model.safetensors"));
  CHECK(contains(message, "'model.layers.2.input_layernorm.weight'"));  // the first extras, sorted
  CHECK(contains(message, "num_hidden_layers 2"));
  CHECK(contains(message, "9 tensors"));  // layer 2's two norms and seven projections (no biases)

  // A tensor no Llama layer has.
  dir = edited_copy(tiny("tiny_bielik"), "stray_tensor", [](TensorMap& t) {
    t["model.extra_gate.weight"] = t["model.norm.weight"];
  });
  message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
  INFO(message);
  CHECK(contains(message, "1 tensors are not part of the model"));
  CHECK(contains(message, "'model.extra_gate.weight'"));

  // Tolerated extras: RoPE's inv_freq buffers (computed from rope_theta here), and a tied
  // model's copy of the embedding as lm_head.weight. Both checkpoints load and give the
  // unedited model's logits.
  dir = edited_copy(tiny("tiny_bielik"), "inv_freq", [](TensorMap& t) {
    for (int layer = 0; layer < 2; ++layer) {
      EditableTensor inv_freq{"F32", {8}, std::vector<uint8_t>(8 * 4, 0)};
      t["model.layers." + std::to_string(layer) + ".self_attn.rotary_emb.inv_freq"] = inv_freq;
    }
  });
  const std::vector<int32_t> prompt = {1, 5, 9};
  CHECK(CpuModel(dir.path, CpuModelOptions{1, 8}).prefill(prompt) ==
        CpuModel(tiny("tiny_bielik"), CpuModelOptions{1, 8}).prefill(prompt));
  dir = edited_copy(tiny("tiny_smollm"), "tied_head_copy",
                    [](TensorMap& t) { t["lm_head.weight"] = t["model.embed_tokens.weight"]; });
  CHECK(CpuModel(dir.path, CpuModelOptions{1, 8}).prefill(prompt) ==
        CpuModel(tiny("tiny_smollm"), CpuModelOptions{1, 8}).prefill(prompt));
}

TEST_CASE("model loading: a weight in the wrong dtype is rejected", "[ch08][cpu][errors]") {
  const std::string name = "model.norm.weight";
  TempDir dir = edited_copy(tiny("tiny_bielik"), "wrong_dtype", [&](TensorMap& t) {
    t[name].dtype = "F32";
    t[name].shape = {32};  // same bytes, read as 32 floats
  });
  std::string message = error_of<std::runtime_error>([&] { CpuModel m(dir.path); });
  INFO(message);
  CHECK(contains(message, name));
}

TEST_CASE("context: a prompt longer than the context is a clear error, the cache survives",
          "[ch08][cpu][errors]") {
  std::vector<int32_t> prompt = load_npy(golden_path("08_bielik", "tiny_bielik_prompt.npy")).to_int32();
  REQUIRE(prompt.size() == 19);
  CpuModel model(tiny("tiny_bielik"), CpuModelOptions{2, 16});
  REQUIRE(model.context_size() == 16);

  std::string message = error_of<std::length_error>([&] { model.prefill(prompt); });
  CHECK(message == "prompt of 19 tokens exceeds the context of 16 tokens");
  REQUIRE(model.position() == 0);

  std::vector<int32_t> first(prompt.begin(), prompt.begin() + 10), second(prompt.begin() + 10, prompt.begin() + 17);
  model.prefill(first);
  message = error_of<std::length_error>([&] { model.prefill(second); });
  CHECK(message == "prompt of 7 tokens exceeds the context of 16 tokens (10 already used, 6 left)");
  REQUIRE(model.position() == 10);

  // The failed call wrote nothing: what follows equals a clean run of the same tokens.
  second.pop_back();
  std::vector<float> after_error = model.prefill(second);
  CpuModel clean(tiny("tiny_bielik"), CpuModelOptions{2, 16});
  clean.prefill(first);
  REQUIRE(after_error == clean.prefill(second));
  REQUIRE(model.position() == 16);
  CHECK_THROWS_AS(model.decode(prompt[0]), std::length_error);
  REQUIRE(model.position() == 16);

  // The default context is max_position_embeddings (192 for tiny_bielik); a longer one is refused.
  CpuModel full(tiny("tiny_bielik"), CpuModelOptions{1, 0});
  CHECK(full.context_size() == 192);
  CHECK_THROWS_AS(full.prefill(std::vector<int32_t>(193, 5)), std::length_error);
  CHECK_THROWS_AS(CpuModel(tiny("tiny_bielik"), CpuModelOptions{1, 193}), std::invalid_argument);
}

TEST_CASE("token ids outside the vocabulary and empty prompts are rejected", "[ch08][cpu][errors]") {
  CpuModel model(tiny("tiny_bielik"), CpuModelOptions{1, 32});
  const int V = model.config().vocab_size;
  std::string message = error_of<std::out_of_range>([&] { model.prefill({1, 2, V}); });
  CHECK(message == "token id 300 at index 2 is outside the vocabulary [0, 300)");
  CHECK_THROWS_AS(model.decode(-1), std::out_of_range);
  CHECK_THROWS_AS(model.prefill({}), std::invalid_argument);
  REQUIRE(model.position() == 0);
}
