// config.json -> ModelConfig, with every error naming the file and the key.
#include "model_config.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace bielik {

namespace {

using nlohmann::json;

// Reads keys from one JSON object and phrases every problem as "<file>: <key> ...".
class ConfigReader {
 public:
  ConfigReader(std::string path, const json& root) : path_(std::move(path)), root_(root) {}

  [[noreturn]] void fail(const std::string& problem) const { throw std::runtime_error(path_ + ": " + problem); }

  bool present(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }

  int integer(const char* key) const {
    if (!present(key)) fail(std::string("missing required key '") + key + "'");
    return integer_value(key, root_[key]);
  }
  int integer(const char* key, int fallback) const { return present(key) ? integer(key) : fallback; }

  float number(const char* key, float fallback) const {
    if (!present(key)) return fallback;
    if (!root_[key].is_number()) fail(std::string("key '") + key + "' must be a number, got " + root_[key].dump());
    const double value = root_[key].get<double>();
    // 1e39 is a valid JSON number and an infinite float: refused rather than run.
    if (!std::isfinite(float(value))) fail(std::string("key '") + key + "' does not fit a float: " + root_[key].dump());
    return float(value);
  }

  bool boolean(const char* key, bool fallback) const {
    if (!present(key)) return fallback;
    if (!root_[key].is_boolean()) fail(std::string("key '") + key + "' must be true or false, got " + root_[key].dump());
    return root_[key].get<bool>();
  }

  std::string text(const char* key) const {
    if (!present(key)) return "";
    if (!root_[key].is_string()) fail(std::string("key '") + key + "' must be a string, got " + root_[key].dump());
    return root_[key].get<std::string>();
  }

  // eos_token_id is an int in most configs and a list in some (Llama 3, some chat models).
  std::vector<int> integer_list(const char* key) const {
    if (!present(key)) return {};
    const json& value = root_[key];
    if (!value.is_array()) return {integer_value(key, value)};
    std::vector<int> result;
    for (const json& item : value) result.push_back(integer_value(key, item));
    return result;
  }

  const json& root() const { return root_; }

 private:
  int integer_value(const char* key, const json& value) const {
    if (!value.is_number_integer())
      fail(std::string("key '") + key + "' must be an integer, got " + value.dump());
    // An unsigned JSON integer past INT64_MAX would wrap to a negative long long (and
    // 2^64 - 1 read as -1 would pass as "no id"), so it is range-checked as unsigned.
    const bool in_range = value.is_number_unsigned() ? value.get<unsigned long long>() <= 2147483647ULL
                                                     : value.get<long long>() >= -2147483648LL &&
                                                           value.get<long long>() <= 2147483647LL;
    if (!in_range) fail(std::string("key '") + key + "' is out of range: " + value.dump());
    return int(value.get<long long>());
  }

  std::string path_;
  const json& root_;
};

}  // namespace

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open model config (config.json)");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& error) {  // parse_error, or out_of_range for a number like 4e335
    throw std::runtime_error(path + ": malformed JSON: " + error.what());
  }
  if (!root.is_object()) throw std::runtime_error(path + ": config is not a JSON object");
  ConfigReader read(path, root);

  std::string model_type = read.text("model_type");
  if (!model_type.empty() && model_type != "llama")
    read.fail("model_type '" + model_type + "' is not supported: only Llama-architecture ('llama') models are");
  std::string act = read.text("hidden_act");
  if (!act.empty() && act != "silu") read.fail("hidden_act '" + act + "' is not supported: only 'silu' (SwiGLU)");
  // rope_scaling changes the RoPE frequencies (linear, dynamic NTK, llama3, yarn...).
  // We implement plain RoPE only; running a scaled model without it would silently
  // produce wrong logits, so refuse it.
  if (read.present("rope_scaling"))
    read.fail("key 'rope_scaling' = " + root["rope_scaling"].dump() +
              " is not supported (only plain RoPE is implemented; it must be null or absent)");

  ModelConfig c;
  c.hidden_size = read.integer("hidden_size");
  c.intermediate_size = read.integer("intermediate_size");
  c.num_hidden_layers = read.integer("num_hidden_layers");
  c.num_attention_heads = read.integer("num_attention_heads");
  c.vocab_size = read.integer("vocab_size");
  c.num_key_value_heads = read.integer("num_key_value_heads", c.num_attention_heads);
  c.max_position_embeddings = read.integer("max_position_embeddings", 2048);  // HF LlamaConfig's default
  c.rope_theta = read.number("rope_theta", 10000.0f);
  c.rms_norm_eps = read.number("rms_norm_eps", 1e-6f);
  c.attention_bias = read.boolean("attention_bias", false);
  c.mlp_bias = read.boolean("mlp_bias", false);
  c.tie_word_embeddings = read.boolean("tie_word_embeddings", false);  // LlamaConfig's default
  c.bos_token_id = read.integer("bos_token_id", -1);
  c.eos_token_ids = read.integer_list("eos_token_id");
  c.torch_dtype = read.text("torch_dtype");

  auto require_positive = [&](const char* key, int value) {
    if (value <= 0) read.fail(std::string("key '") + key + "' must be positive, got " + std::to_string(value));
  };
  require_positive("hidden_size", c.hidden_size);
  require_positive("intermediate_size", c.intermediate_size);
  require_positive("num_hidden_layers", c.num_hidden_layers);
  require_positive("num_attention_heads", c.num_attention_heads);
  require_positive("num_key_value_heads", c.num_key_value_heads);
  require_positive("vocab_size", c.vocab_size);
  require_positive("max_position_embeddings", c.max_position_embeddings);
  // RoPE divides by powers of rope_theta; RMSNorm adds eps under a square root, and an
  // all-zero row would divide by zero with eps 0. (<< prints 1e-06, not to_string's 0.000001.)
  auto require_positive_number = [&](const char* key, float value) {
    std::ostringstream text;
    text << value;
    if (!(value > 0.0f)) read.fail(std::string("key '") + key + "' must be positive, got " + text.str());
  };
  require_positive_number("rope_theta", c.rope_theta);
  require_positive_number("rms_norm_eps", c.rms_norm_eps);

  if (c.num_attention_heads % c.num_key_value_heads != 0)
    read.fail("num_attention_heads (" + std::to_string(c.num_attention_heads) +
              ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ") for GQA");
  if (read.present("head_dim")) {
    c.head_dim = read.integer("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      read.fail("no 'head_dim' and hidden_size (" + std::to_string(c.hidden_size) +
                ") is not divisible by num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  require_positive("head_dim", c.head_dim);
  if (c.head_dim % 2 != 0)
    read.fail("key 'head_dim' must be even for rotate-half RoPE, got " + std::to_string(c.head_dim));

  if (c.bos_token_id >= c.vocab_size)
    read.fail("key 'bos_token_id' = " + std::to_string(c.bos_token_id) + " is outside the vocabulary (vocab_size " +
              std::to_string(c.vocab_size) + ")");
  for (int id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      read.fail("key 'eos_token_id' holds " + std::to_string(id) + ", outside the vocabulary (vocab_size " +
                std::to_string(c.vocab_size) + ")");
  return c;
}

std::string describe(const ModelConfig& c) {
  std::ostringstream out;
  out << "C=" << c.hidden_size << " F=" << c.intermediate_size << " L=" << c.num_hidden_layers
      << " H=" << c.num_attention_heads << " Hkv=" << c.num_key_value_heads << " D=" << c.head_dim
      << " V=" << c.vocab_size << " rope_theta=" << c.rope_theta << " eps=" << c.rms_norm_eps
      << " attention_bias=" << c.attention_bias << " mlp_bias=" << c.mlp_bias
      << " tied_head=" << c.tie_word_embeddings << " max_pos=" << c.max_position_embeddings;
  return out.str();
}

int context_length_of(const ModelConfig& config, int requested) {
  if (requested < 0) throw std::invalid_argument("max_context must be >= 0, got " + std::to_string(requested));
  if (requested == 0) {
    if (config.max_position_embeddings <= 0) {
      throw std::invalid_argument("config.json has no max_position_embeddings: give a context length");
    }
    return config.max_position_embeddings;
  }
  if (config.max_position_embeddings > 0 && requested > config.max_position_embeddings) {
    throw std::invalid_argument("a context of " + std::to_string(requested) +
                                " tokens exceeds the model's max_position_embeddings (" +
                                std::to_string(config.max_position_embeddings) + ")");
  }
  return requested;
}

}  // namespace bielik
