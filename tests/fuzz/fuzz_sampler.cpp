// Fuzz target: chapter 08's CPU sampler on arbitrary logits and options (sampler.cpp).
//
// The input is read as: temperature, top_p (two floats), top_k (int32), the uniform draw
// (a uint32 scaled into [0, 1)), then the logits (floats: any bit pattern, so NaN, +-inf,
// denormals and 3e38 all occur). Contract (sampler.hpp):
//   - options: top_p outside (0, 1] or a temperature that is not finite (NaN, +-inf) are
//     refused with std::invalid_argument by the constructor, anything else is accepted;
//   - logits: a NaN or +inf logit, every logit -inf, or none at all, are refused with
//     std::invalid_argument; otherwise candidates() is a distribution: ids inside the
//     vocabulary, no id twice, finite probabilities that sum to 1, most likely first, at
//     most top_k of them, a -inf logit's probability 0 (a masked token; it may be listed
//     when every token is), and the draw lands on one of them with a probability above
//     0; greedy is the argmax.
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>

#include "fuzz_check.hpp"
#include "sampler.hpp"

using namespace bielik;

namespace {

template <typename T>
T take(const uint8_t*& data, size_t& size) {
  T value{};
  std::memcpy(&value, data, sizeof(T));
  data += sizeof(T);
  size -= sizeof(T);
  return value;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  SamplerOptions options;
  options.temperature = take<float>(data, size);
  options.top_p = take<float>(data, size);
  options.top_k = take<int32_t>(data, size);
  const double u = take<uint32_t>(data, size) / 4294967296.0;
  std::vector<float> logits(size / 4);
  if (!logits.empty()) std::memcpy(logits.data(), data, logits.size() * 4);
  const int V = int(logits.size());

  const bool options_valid = std::isfinite(options.temperature) && options.top_p > 0.0f && options.top_p <= 1.0f;
  bool logits_valid = V > 0, any_finite = false;
  for (float logit : logits) {
    if (std::isnan(logit) || logit == INFINITY) logits_valid = false;
    if (std::isfinite(logit)) any_finite = true;
  }
  logits_valid = logits_valid && any_finite;

  try {
    const Sampler sampler(options);
    FUZZ_CHECK(options_valid, "invalid options accepted");
    std::vector<std::pair<int32_t, double>> candidates;
    int32_t chosen = -1;
    try {
      candidates = sampler.candidates(logits.data(), V);
      chosen = sampler.sample_with_uniform(logits.data(), V, u);
    } catch (const std::invalid_argument& e) {
      FUZZ_CHECK(!logits_valid, std::string("valid logits refused: ") + e.what());
      return 0;
    }
    FUZZ_CHECK(logits_valid, "invalid logits accepted");
    FUZZ_CHECK(!candidates.empty(), "no candidates");
    if (options.top_k > 0) FUZZ_CHECK(int(candidates.size()) <= options.top_k, "more than top_k candidates");
    std::set<int32_t> seen;
    double total = 0.0;
    bool chosen_is_candidate = false;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const auto [id, p] = candidates[i];
      FUZZ_CHECK(id >= 0 && id < V, "id " + std::to_string(id) + " outside the vocabulary");
      FUZZ_CHECK(seen.insert(id).second, "id " + std::to_string(id) + " twice");
      FUZZ_CHECK(std::isfinite(p) && p >= 0.0, "probability " + std::to_string(p));
      if (i > 0) FUZZ_CHECK(p <= candidates[i - 1].second, "candidates not most likely first");
      if (!sampler.greedy()) FUZZ_CHECK(logits[id] != -INFINITY || p == 0.0, "a -inf logit with p > 0");
      if (id == chosen) chosen_is_candidate = p > 0.0;
      total += p;
    }
    FUZZ_CHECK(std::fabs(total - 1.0) < 1e-9, "probabilities sum to " + std::to_string(total));
    FUZZ_CHECK(chosen_is_candidate, "drew id " + std::to_string(chosen) + ", not a candidate with p > 0");
    if (sampler.greedy()) FUZZ_CHECK(chosen == argmax(logits.data(), V), "greedy is not the argmax");
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(!options_valid, std::string("valid options refused: ") + e.what());
  }
  return 0;
}
