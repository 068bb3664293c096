/// @file model_cpu.hpp
/// @brief The whole model on the CPU: fp32 math on bf16 weights, with a KV cache.
///
/// The forward pass, one line per step (x is the residual stream, (T, C)):
///
///     x = embed_tokens[tokens]
///     for each of the L layers:
///         h = rmsnorm(x) * input_norm
///         q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv     (biases: Bielik yes, SmolLM2 no)
///         q, k = rope_rotate_half(q, k) at absolute positions P..P+T-1
///         append k, v to this layer's cache
///         a = causal GQA attention of q over the cache        (query head h reads kv head h/(H/Hkv))
///         x = x + a Wo^T + bo
///         h = rmsnorm(x) * post_norm
///         x = x + (silu(h Wg^T + bg) * (h Wu^T + bu)) Wd^T + bd
///     logits = rmsnorm(x) * final_norm  lm_head^T              (lm_head = embed_tokens when tied)
///
/// It is the reference the CUDA backend is tested against end to end, and the backend
/// of the chat on a machine without a GPU (slow, but every step is real).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "model_config.hpp"
#include "thread_pool.hpp"

namespace bielik {

struct CpuModelOptions {
  int threads = 0;      ///< worker threads, calling thread included; 0: all hardware threads
  int max_context = 0;  ///< KV cache length in tokens; 0: max_position_embeddings
};

class CpuModel final : public Backend {
 public:
  /// Reads `model_dir`/config.json and the safetensors checkpoint, checks every tensor
  /// (model_weights.hpp) and copies the weights into aligned memory. Throws
  /// std::runtime_error naming the missing file, the bad tensor or the config field.
  explicit CpuModel(const std::string& model_dir, const CpuModelOptions& options = {});

  std::vector<float> prefill(const std::vector<int32_t>& tokens, Logits which = Logits::kLast) override;
  std::vector<float> decode(int32_t token) override;
  void reset() override { position_ = 0; }
  int position() const override { return position_; }
  int context_size() const override { return context_; }
  const ModelConfig& config() const override { return config_; }
  std::string name() const override;

  /// Prefill runs at most this many tokens through the layers at a time: it bounds the
  /// scratch memory (T x F activations) for long prompts; results do not depend on it.
  static constexpr int kPrefillChunk = 128;

 private:
  struct Layer {
    std::vector<float> input_norm;  // (C)
    std::vector<uint16_t> wq;       // (H*D, C) bf16
    std::vector<float> bq;          // (H*D), empty without attention_bias
    std::vector<uint16_t> wk;       // (Hkv*D, C) bf16
    std::vector<float> bk;          // (Hkv*D) or empty
    std::vector<uint16_t> wv;       // (Hkv*D, C) bf16
    std::vector<float> bv;          // (Hkv*D) or empty
    std::vector<uint16_t> wo;       // (C, H*D) bf16
    std::vector<float> bo;          // (C) or empty
    std::vector<float> post_norm;   // (C)
    std::vector<uint16_t> w_gate;   // (F, C) bf16
    std::vector<float> b_gate;      // (F) or empty
    std::vector<uint16_t> w_up;     // (F, C) bf16
    std::vector<float> b_up;        // (F) or empty
    std::vector<uint16_t> w_down;   // (C, F) bf16
    std::vector<float> b_down;      // (C) or empty
    std::unique_ptr<float[]> k_cache;  // (context, Hkv, D) fp32, RoPE applied
    std::unique_ptr<float[]> v_cache;  // (context, Hkv, D) fp32
  };

  // Runs T <= kPrefillChunk tokens at positions position_..position_+T-1 and writes
  // logits (T, V) when all_logits, else (1, V) of the last token. Advances position_.
  void forward_chunk(const int32_t* tokens, int T, bool all_logits, float* logits);
  void check_fits(size_t count) const;

  ModelConfig config_;
  int context_ = 0;
  int position_ = 0;
  ThreadPool pool_;
  std::vector<uint16_t> embed_;    // (V, C) bf16
  std::vector<Layer> layers_;      // (L)
  std::vector<float> final_norm_;  // (C)
  std::vector<uint16_t> lm_head_;  // (V, C) bf16; empty when tied (embed_ is used)
  std::vector<float> rope_;        // (context, D/2, 2): cos, sin of every angle

  // Scratch for one chunk, sized for kPrefillChunk tokens.
  std::vector<float> x_, h_, q_, attn_, proj_;  // (T, C) (T, C) (T, H*D) (T, H*D) (T, C)
  std::vector<float> gate_, up_;                // (T, F) each
};

}  // namespace bielik
