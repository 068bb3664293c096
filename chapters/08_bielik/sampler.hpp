/// @file sampler.hpp
/// @brief From logits to the next token: greedy, temperature, top-k, top-p.
///
/// The steps, in the order they apply (the usual order of HF and llama.cpp):
///   1. temperature <= 0 (or top_k == 1): greedy, the argmax; nothing random happens.
///   2. probabilities p = softmax(logits / temperature), in double;
///   3. top-k: keep the k most likely tokens (k <= 0: all);
///   4. top-p (nucleus): of those, keep the most likely ones until their mass reaches
///      top_p (always at least one). With no top-k only as many tokens are ranked as the
///      nucleus needs (its mass then summed in id order);
///   5. renormalize what is left and draw one token with the seeded generator.
/// A fixed seed gives the same tokens on every machine: the uniform draw is made from
/// the raw 64-bit output of std::mt19937_64 (whose sequence the standard fixes), not
/// from std::uniform_real_distribution (whose algorithm it does not).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace bielik {

struct SamplerOptions {
  float temperature = 0.0f;  ///< <= 0: greedy; finite
  int top_k = 0;             ///< <= 0: no limit
  float top_p = 1.0f;        ///< in (0, 1]; 1: no limit
  uint64_t seed = 0;
};

class Sampler {
 public:
  /// Throws std::invalid_argument for top_p outside (0, 1] or a temperature that is NaN
  /// or infinite.
  explicit Sampler(const SamplerOptions& options);

  /// The next token for `logits` (V). Throws std::invalid_argument when a logit is NaN
  /// (a broken forward pass must not turn into plausible-looking text).
  int32_t sample(const float* logits, int V);
  int32_t sample(const std::vector<float>& logits) { return sample(logits.data(), int(logits.size())); }

  /// The next uniform draw in [0, 1), from the seeded generator: what sample() draws
  /// once per non-greedy call. A GPU sampler takes it from here, so that a seed gives the
  /// same draws on both backends.
  double draw_uniform();

  /// sample() with the draw `u` given instead of made (greedy ignores it). sample(l, V)
  /// is sample_with_uniform(l, V, draw_uniform()) for a non-greedy sampler.
  int32_t sample_with_uniform(const float* logits, int V, double u) const;

  /// The distribution step 5 draws from: (token, probability) pairs, most likely first,
  /// probabilities summing to 1. Greedy gives the argmax with probability 1.
  std::vector<std::pair<int32_t, double>> candidates(const float* logits, int V) const;

  const SamplerOptions& options() const { return options_; }
  bool greedy() const { return options_.temperature <= 0.0f || options_.top_k == 1; }

 private:
  SamplerOptions options_;
  std::mt19937_64 engine_;
};

/// Index of the largest logit (the lowest index on a tie). Throws on NaN or V <= 0.
int32_t argmax(const float* logits, int V);

}  // namespace bielik
