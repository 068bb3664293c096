// Fuzz target: arbitrary bytes as a config.json (chapter 08's model_config.cpp).
//
// Contract (model_config.hpp): load_model_config either returns a config the model can
// be built from (every size positive, H a multiple of Hkv, D even, a finite positive
// rope_theta, a finite rms_norm_eps >= 0) or throws std::runtime_error naming the file.
#include <cmath>
#include <stdexcept>

#include "fuzz_check.hpp"
#include "model_config.hpp"

using namespace bielik;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::write_scratch(data, size, "_config.json");
  try {
    const ModelConfig c = load_model_config(path);
    const std::string shape = describe(c);
    FUZZ_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0, shape);
    FUZZ_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.vocab_size > 0, shape);
    FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, shape);
    FUZZ_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, shape);
    FUZZ_CHECK(c.max_position_embeddings > 0, shape);
    FUZZ_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0.0f, shape);
    FUZZ_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps >= 0.0f, shape);
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(fuzz::names_file(e.what(), path), std::string("the error does not name the file: ") + e.what());
  }
  return 0;
}
