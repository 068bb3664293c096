/// @file model_weights.hpp
/// @brief The weight map: every tensor of a Llama-family checkpoint by its HuggingFace
/// name, its shape checked against config.json before any backend touches it.
///
/// Names and shapes (nn.Linear stores weights as (out, in); "L" is num_hidden_layers):
///
///   model.embed_tokens.weight                        (V, C)
///   model.layers.{i}.input_layernorm.weight          (C)
///   model.layers.{i}.self_attn.q_proj.weight / bias  (H*D, C)   / (H*D)
///   model.layers.{i}.self_attn.k_proj.weight / bias  (Hkv*D, C) / (Hkv*D)
///   model.layers.{i}.self_attn.v_proj.weight / bias  (Hkv*D, C) / (Hkv*D)
///   model.layers.{i}.self_attn.o_proj.weight / bias  (C, H*D)   / (C)
///   model.layers.{i}.post_attention_layernorm.weight (C)
///   model.layers.{i}.mlp.gate_proj.weight / bias     (F, C)     / (F)
///   model.layers.{i}.mlp.up_proj.weight / bias       (F, C)     / (F)
///   model.layers.{i}.mlp.down_proj.weight / bias     (C, F)     / (C)
///   model.norm.weight                                (C)
///   lm_head.weight                                   (V, C)  absent when tie_word_embeddings
///
/// The attention biases exist iff config.attention_bias (Bielik: true, SmolLM2: false),
/// the MLP biases iff config.mlp_bias. "iff" both ways: a missing bias would be a crash
/// later, an unexpected one would be silently ignored and give wrong text, so both are
/// load errors here. Every tensor must be BF16. For the same reason a tensor the config
/// does not use (layers past num_hidden_layers) is an error; only a tied model's copy of
/// lm_head.weight and saved RoPE buffers (*.rotary_emb.inv_freq) are ignored.
#pragma once

#include <string>
#include <vector>

#include "model_config.hpp"
#include "safetensors.hpp"

namespace bielik {

/// One decoder layer. Pointers into the Checkpoint's mapping (alive as long as it is);
/// a bias is nullptr when the config says the model has none.
struct LayerWeights {
  const TensorView* input_norm;  // (C)
  const TensorView* wq;          // (H*D, C)
  const TensorView* bq;          // (H*D) or nullptr
  const TensorView* wk;          // (Hkv*D, C)
  const TensorView* bk;          // (Hkv*D) or nullptr
  const TensorView* wv;          // (Hkv*D, C)
  const TensorView* bv;          // (Hkv*D) or nullptr
  const TensorView* wo;          // (C, H*D)
  const TensorView* bo;          // (C) or nullptr
  const TensorView* post_norm;   // (C)
  const TensorView* w_gate;      // (F, C)
  const TensorView* b_gate;      // (F) or nullptr
  const TensorView* w_up;        // (F, C)
  const TensorView* b_up;        // (F) or nullptr
  const TensorView* w_down;      // (C, F)
  const TensorView* b_down;      // (C) or nullptr
};

struct ModelWeights {
  const TensorView* embed;           // (V, C)
  std::vector<LayerWeights> layers;  // (L)
  const TensorView* final_norm;      // (C)
  const TensorView* lm_head;         // (V, C); == embed when tie_word_embeddings
};

/// Maps every tensor with Checkpoint::tensor_checked. `config` comes from
/// load_model_config, which has already checked its sizes (positive, H divisible by
/// Hkv, even D). Throws std::runtime_error naming the
/// tensor, its shape and the expected shape; for a bias that disagrees with the
/// config, naming the bias and the config flag; for tensors the config does not use,
/// naming the file and the first few of them.
ModelWeights map_model_weights(const Checkpoint& checkpoint, const ModelConfig& config);

}  // namespace bielik
