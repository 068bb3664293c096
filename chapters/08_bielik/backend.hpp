/// @file backend.hpp
/// @brief What the chat loop needs from a model: run tokens through it, keep its KV cache.
///
/// Two implementations: CpuModel (model_cpu.hpp, fp32 math, runs anywhere) and the CUDA
/// backend (later in this chapter). The chat session, the sampler and the CLI only see
/// this interface, so the device is one flag (`--device cpu|cuda`).
///
/// The contract every backend keeps:
///   * the KV cache holds the keys/values of positions 0..position()-1;
///   * prefill(tokens) runs tokens at positions position()..position()+T-1, appends
///     them to the cache and returns logits; a new chat turn prefills only its tokens;
///   * decode(token) is prefill of one token (a backend may make it faster, never different);
///   * a call that would not fit throws std::length_error BEFORE touching the cache, and
///     a bad token id throws std::out_of_range, so the session stays usable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_config.hpp"
#include "sampler.hpp"

namespace bielik {

/// Which logits prefill returns.
enum class Logits {
  kLast,  ///< (V) of the last token: all that generation needs
  kAll,   ///< (T, V) of every prompt token: for tests against a reference
};

class Backend {
 public:
  virtual ~Backend() = default;

  /// Runs `tokens` (T >= 1) at the next T positions. Returns (V) logits of the last
  /// token, or (T, V) with Logits::kAll. Throws std::length_error
  /// ("prompt of N tokens exceeds the context of M tokens ...") when
  /// position() + T > context_size(), std::out_of_range for an id outside [0, V),
  /// std::invalid_argument for an empty list; the cache is untouched when it throws.
  virtual std::vector<float> prefill(const std::vector<int32_t>& tokens, Logits which = Logits::kLast) = 0;

  /// One token at position(): the generation step. Returns (V) logits.
  virtual std::vector<float> decode(int32_t token) = 0;

  /// The generation step with its draw: runs `token` as decode() does and returns the
  /// next token `sampler` draws from the logits. The default is exactly
  /// sampler.sample(decode(token)); a backend may sample where its logits are (the CUDA
  /// backend: on the GPU, sample_kernels.cuh) if it draws the same way, from the same
  /// sampler's draws.
  virtual int32_t decode_sample(int32_t token, Sampler& sampler) { return sampler.sample(decode(token)); }

  /// Forgets the cache: the next prefill starts at position 0.
  virtual void reset() = 0;

  /// Number of tokens in the KV cache (= the position of the next token).
  virtual int position() const = 0;

  /// The most tokens the KV cache holds.
  virtual int context_size() const = 0;

  virtual const ModelConfig& config() const = 0;

  /// "cpu (8 threads)", "cuda (NVIDIA H200)": for the CLI's banner and /stats.
  virtual std::string name() const = 0;
};

}  // namespace bielik
