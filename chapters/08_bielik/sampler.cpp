#include "sampler.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace bielik {
namespace {

void check_logits(const float* logits, int V) {
  if (V <= 0) throw std::invalid_argument("sampler: empty logits");
  bool any_finite = false;
  for (int i = 0; i < V; ++i) {
    if (std::isnan(logits[i]) || logits[i] == INFINITY) {
      throw std::invalid_argument("sampler: logit " + std::to_string(i) + " is " +
                                  (std::isnan(logits[i]) ? "NaN" : "+inf") + " (broken forward pass?)");
    }
    any_finite = any_finite || logits[i] != -INFINITY;
  }
  if (!any_finite) throw std::invalid_argument("sampler: every logit is -inf");
}

// Scales the probabilities to sum to 1.
void normalize(std::vector<std::pair<int32_t, double>>& ranked) {
  double mass = 0;
  for (const auto& candidate : ranked) mass += candidate.second;
  for (auto& candidate : ranked) candidate.second /= mass;
}

}  // namespace

int32_t argmax(const float* logits, int V) {
  check_logits(logits, V);
  return int32_t(std::max_element(logits, logits + V) - logits);  // first of equal maxima
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), engine_(options.seed) {
  // An infinite temperature makes 1 / temperature 0 and (logit - max) * 0 NaN for a
  // -inf logit: uniform noise or NaN probabilities, never what was asked for.
  if (!std::isfinite(options.temperature)) {
    throw std::invalid_argument("sampler: temperature must be a finite number, got " +
                                std::to_string(options.temperature));
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    throw std::invalid_argument("sampler: top_p must be in (0, 1], got " + std::to_string(options.top_p));
  }
}

std::vector<std::pair<int32_t, double>> Sampler::candidates(const float* logits, int V) const {
  if (greedy()) return {{argmax(logits, V), 1.0}};
  check_logits(logits, V);

  // softmax(logits / temperature), shifted by the max so exp never overflows.
  const double inv_temperature = 1.0 / double(options_.temperature);
  const double max_logit = *std::max_element(logits, logits + V);
  std::vector<std::pair<int32_t, double>> ranked(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) ranked[i] = {int32_t(i), std::exp((double(logits[i]) - max_logit) * inv_temperature)};
  // Most likely first; equal probabilities keep the lower id first, so the order (and
  // therefore what top-k/top-p cut) is deterministic.
  auto more_likely = [](const std::pair<int32_t, double>& a, const std::pair<int32_t, double>& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  };
  size_t keep = ranked.size();
  if (options_.top_k > 0 && size_t(options_.top_k) < keep) keep = size_t(options_.top_k);
  if (keep == ranked.size() && options_.top_p < 1.0f) {
    // Top-p over every token: ranking all V (a sort of 32000 pairs, ~2-6 ms) to keep a
    // nucleus of usually tens. So the mass is summed in id order, and the tokens are
    // ranked a slice at a time, the most likely 256 (a partial sort), then four times more
    // until the nucleus fits: each later slice is picked from the rest by nth_element
    // (linear) and sorted alone, and the running sum goes on where it stopped. The same
    // nucleus, the same order; only the first normalization's sum is made in another
    // order. (A flat distribution, where the nucleus is most of V, costs about one full
    // sort.)
    double mass = 0;
    for (const auto& candidate : ranked) mass += candidate.second;
    double cumulative = 0;
    size_t nucleus = 0, ranked_until = 0;
    for (size_t ranked_size = std::min<size_t>(ranked.size(), 256);;
         ranked_size = std::min(ranked.size(), 4 * ranked_size)) {
      const auto first = ranked.begin() + long(ranked_until), middle = ranked.begin() + long(ranked_size);
      if (ranked_until == 0) {
        std::partial_sort(first, middle, ranked.end(), more_likely);  // (a heap of 256: cheapest for the first)
      } else {
        if (middle != ranked.end()) std::nth_element(first, middle, ranked.end(), more_likely);
        std::sort(first, middle, more_likely);
      }
      ranked_until = ranked_size;
      while (nucleus < ranked_size && cumulative < double(options_.top_p)) {
        cumulative += ranked[nucleus++].second / mass;
      }
      if (cumulative >= double(options_.top_p) || ranked_size == ranked.size()) {
        ranked.resize(nucleus);
        normalize(ranked);
        return ranked;
      }
    }
  }
  std::partial_sort(ranked.begin(), ranked.begin() + long(keep), ranked.end(), more_likely);
  ranked.resize(keep);
  normalize(ranked);

  if (options_.top_p < 1.0f) {
    // Nucleus: the shortest most-likely-first prefix whose mass reaches top_p.
    double cumulative = 0;
    size_t nucleus = 0;
    while (nucleus < ranked.size() && cumulative < double(options_.top_p)) cumulative += ranked[nucleus++].second;
    ranked.resize(nucleus);
    normalize(ranked);
  }
  return ranked;
}

double Sampler::draw_uniform() {
  // u in [0, 1) from the top 53 bits: exactly representable, the same on every platform.
  return double(engine_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(const float* logits, int V) {
  if (greedy()) return argmax(logits, V);
  return sample_with_uniform(logits, V, draw_uniform());
}

int32_t Sampler::sample_with_uniform(const float* logits, int V, double u) const {
  if (greedy()) return argmax(logits, V);
  if ((options_.top_k <= 0 || options_.top_k >= V) && options_.top_p >= 1.0f) {
    // Nothing to cut: draw from the full softmax in id order, no sort of V entries.
    check_logits(logits, V);
    const double max_logit = *std::max_element(logits, logits + V);
    std::vector<double> weights(static_cast<size_t>(V));
    double total = 0;
    for (int i = 0; i < V; ++i) {
      weights[i] = std::exp((double(logits[i]) - max_logit) / double(options_.temperature));
      total += weights[i];
    }
    const double target = u * total;
    double cumulative = 0;
    int32_t last_possible = 0;
    for (int i = 0; i < V; ++i) {
      cumulative += weights[i];
      if (target < cumulative) return int32_t(i);
      if (weights[i] > 0) last_possible = int32_t(i);
    }
    return last_possible;  // target landed in the rounding slack of the sum
  }
  const std::vector<std::pair<int32_t, double>> pool = candidates(logits, V);
  double cumulative = 0;
  int32_t last_possible = pool.front().first;  // the most likely: its probability is > 0
  for (const auto& candidate : pool) {
    cumulative += candidate.second;
    if (u < cumulative) return candidate.first;
    if (candidate.second > 0) last_possible = candidate.first;
  }
  // u landed in the rounding slack of the sum. The pool may end in tokens of probability
  // 0 (top-k keeps k even when fewer have any mass: -inf logits, exp underflow).
  return last_possible;
}

}  // namespace bielik
