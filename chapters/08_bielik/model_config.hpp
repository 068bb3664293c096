/// @file model_config.hpp
/// @brief The model's shape and options, read from a HuggingFace config.json.
///
/// Everything that differs between the three models this program runs (Bielik-1.5B,
/// SmolLM2-135M, the tiny test models) is here: biases, GQA, head_dim, tied head.
/// Symbols: C hidden_size, F intermediate_size, H heads, Hkv kv heads, D head_dim,
/// V vocab_size.
#pragma once

#include <string>
#include <vector>

namespace bielik {

struct ModelConfig {
  int hidden_size = 0;              ///< C
  int intermediate_size = 0;        ///< F (SwiGLU inner width)
  int num_hidden_layers = 0;        ///< L decoder blocks
  int num_attention_heads = 0;      ///< H query heads
  int num_key_value_heads = 0;      ///< Hkv (GQA: H % Hkv == 0; defaults to H)
  int head_dim = 0;                 ///< D (defaults to C / H)
  int vocab_size = 0;               ///< V
  int max_position_embeddings = 0;  ///< longest context the RoPE was trained for (default 2048)
  float rope_theta = 10000.0f;      ///< RoPE base
  float rms_norm_eps = 1e-6f;       ///< RMSNorm epsilon
  bool attention_bias = false;      ///< biases on q, k, v, o projections
  bool mlp_bias = false;            ///< biases on gate, up, down projections
  bool tie_word_embeddings = false; ///< lm_head shares embed_tokens (no lm_head.weight tensor)
  int bos_token_id = -1;            ///< -1 when the config has none
  std::vector<int> eos_token_ids;   ///< one id or a list in config.json; may be empty
  std::string torch_dtype;          ///< e.g. "bfloat16"; "" when absent
};

/// Reads and validates config.json. Only Llama-architecture models are accepted
/// (model_type "llama" or absent, hidden_act "silu" or absent). Required keys:
/// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size.
/// Throws std::runtime_error naming the file and the key: missing/mistyped keys,
/// numbers that do not fit (an integer beyond int, a float beyond float), non-positive
/// sizes, rope_theta or rms_norm_eps, H % Hkv != 0, odd head_dim, a non-null
/// rope_scaling (not implemented), unparsable JSON, missing file.
ModelConfig load_model_config(const std::string& config_json_path);

/// One line for logs: "C=1536 F=8960 L=32 H=12 Hkv=2 D=128 V=32000 theta=1e+06 ...".
std::string describe(const ModelConfig& config);

/// The KV-cache length a backend should allocate: `requested` tokens, or the model's
/// max_position_embeddings when `requested` is 0. Throws std::invalid_argument for a
/// negative request, a request beyond max_position_embeddings, or 0 with no limit known.
int context_length_of(const ModelConfig& config, int requested);

}  // namespace bielik
