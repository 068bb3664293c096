#include "model_weights.hpp"

#include <set>
#include <stdexcept>

namespace bielik {
namespace {

// One projection: the weight always, the bias iff `has_bias`.
struct Projection {
  const TensorView* weight;
  const TensorView* bias;
};

Projection map_projection(const Checkpoint& checkpoint, const std::string& name, int64_t out_dim, int64_t in_dim,
                          bool has_bias, const char* bias_flag) {
  Projection p;
  p.weight = &checkpoint.tensor_checked(name + ".weight", "BF16", {out_dim, in_dim});
  const std::string bias_name = name + ".bias";
  if (has_bias) {
    if (!checkpoint.contains(bias_name)) {
      throw std::runtime_error(checkpoint.dir() + ": config.json says " + bias_flag + "=true but tensor '" +
                               bias_name + "' is missing");
    }
    p.bias = &checkpoint.tensor_checked(bias_name, "BF16", {out_dim});
  } else {
    if (checkpoint.contains(bias_name)) {
      throw std::runtime_error(checkpoint.dir() + ": tensor '" + bias_name + "' is present but config.json says " +
                               bias_flag + "=false (it would be silently ignored)");
    }
    p.bias = nullptr;
  }
  return p;
}

}  // namespace

ModelWeights map_model_weights(const Checkpoint& checkpoint, const ModelConfig& config) {
  const int64_t C = config.hidden_size, F = config.intermediate_size, V = config.vocab_size;
  const int64_t HD = int64_t(config.num_attention_heads) * config.head_dim;
  const int64_t HkvD = int64_t(config.num_key_value_heads) * config.head_dim;
  const bool attn_bias = config.attention_bias, mlp_bias = config.mlp_bias;

  ModelWeights w;
  w.embed = &checkpoint.tensor_checked("model.embed_tokens.weight", "BF16", {V, C});
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.input_norm = &checkpoint.tensor_checked(p + "input_layernorm.weight", "BF16", {C});
    Projection q = map_projection(checkpoint, p + "self_attn.q_proj", HD, C, attn_bias, "attention_bias");
    Projection k = map_projection(checkpoint, p + "self_attn.k_proj", HkvD, C, attn_bias, "attention_bias");
    Projection v = map_projection(checkpoint, p + "self_attn.v_proj", HkvD, C, attn_bias, "attention_bias");
    Projection o = map_projection(checkpoint, p + "self_attn.o_proj", C, HD, attn_bias, "attention_bias");
    l.post_norm = &checkpoint.tensor_checked(p + "post_attention_layernorm.weight", "BF16", {C});
    Projection gate = map_projection(checkpoint, p + "mlp.gate_proj", F, C, mlp_bias, "mlp_bias");
    Projection up = map_projection(checkpoint, p + "mlp.up_proj", F, C, mlp_bias, "mlp_bias");
    Projection down = map_projection(checkpoint, p + "mlp.down_proj", C, F, mlp_bias, "mlp_bias");
    l.wq = q.weight, l.bq = q.bias, l.wk = k.weight, l.bk = k.bias;
    l.wv = v.weight, l.bv = v.bias, l.wo = o.weight, l.bo = o.bias;
    l.w_gate = gate.weight, l.b_gate = gate.bias, l.w_up = up.weight, l.b_up = up.bias;
    l.w_down = down.weight, l.b_down = down.bias;
    w.layers.push_back(l);
  }
  w.final_norm = &checkpoint.tensor_checked("model.norm.weight", "BF16", {C});
  // A tied head reuses the embedding matrix (SmolLM2). Some tied checkpoints still
  // carry a copy named lm_head.weight; HF ignores it, and so do we.
  w.lm_head = config.tie_word_embeddings ? w.embed : &checkpoint.tensor_checked("lm_head.weight", "BF16", {V, C});

  // Every tensor of the checkpoint must have been used: layers past num_hidden_layers
  // (a config edited or taken from a smaller sibling) would otherwise load and babble.
  // Tolerated: the tied copy of lm_head above, and the RoPE frequency buffers older
  // exports saved (self_attn.rotary_emb.inv_freq), which we compute from rope_theta.
  std::set<std::string> used;
  auto use = [&](const TensorView* t) {
    if (t != nullptr) used.insert(t->name);
  };
  use(w.embed), use(w.final_norm), use(w.lm_head);
  for (const LayerWeights& l : w.layers)
    for (const TensorView* t : {l.input_norm, l.wq, l.bq, l.wk, l.bk, l.wv, l.bv, l.wo, l.bo, l.post_norm, l.w_gate,
                                l.b_gate, l.w_up, l.b_up, l.w_down, l.b_down})
      use(t);
  auto tolerated = [&](const std::string& name) {
    const std::string inv_freq = ".rotary_emb.inv_freq";
    const bool ends_inv_freq =
        name.size() > inv_freq.size() && name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
    return ends_inv_freq || (config.tie_word_embeddings && name == "lm_head.weight");
  };
  std::vector<std::string> extra;
  for (const std::string& name : checkpoint.names())
    if (used.count(name) == 0 && !tolerated(name)) extra.push_back(name);
  if (!extra.empty()) {
    std::string listed;
    for (size_t i = 0; i < extra.size() && i < 3; ++i) listed += (i ? ", '" : "'") + extra[i] + "'";
    if (extra.size() > 3) listed += " and " + std::to_string(extra.size() - 3) + " more";
    throw std::runtime_error(checkpoint.file_of(extra.front()) + ": " + std::to_string(extra.size()) +
                             " tensors are not part of the model config.json describes (num_hidden_layers " +
                             std::to_string(config.num_hidden_layers) + "): " + listed +
                             "; is config.json this checkpoint's own?");
  }
  return w;
}

}  // namespace bielik
