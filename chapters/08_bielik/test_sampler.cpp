// Chapter 08: the sampler. Greedy is the argmax; the random paths are checked as
// distributions: with a fixed seed, 20000 draws land within a few standard deviations
// (sqrt(p(1-p)/n) <= 0.0036) of the probabilities the test computes itself.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "catch_compat.hpp"
#include "sampler.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

constexpr int kDraws = 20000;
constexpr double kFrequencyTolerance = 0.015;  // > 4 standard deviations at n = 20000

// softmax(logits / temperature), computed plainly here, independent of the sampler.
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double max_logit = logits[0];
  for (float l : logits) max_logit = std::max(max_logit, double(l));
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp((logits[i] - max_logit) / temperature);
  for (double& v : p) v /= total;
  return p;
}

std::vector<double> frequencies(Sampler& sampler, const std::vector<float>& logits) {
  std::vector<double> counts(logits.size(), 0.0);
  for (int i = 0; i < kDraws; ++i) {
    int32_t token = sampler.sample(logits);
    REQUIRE(token >= 0);
    REQUIRE(size_t(token) < logits.size());
    counts[size_t(token)] += 1.0 / kDraws;
  }
  return counts;
}

void require_close(const std::vector<double>& observed, const std::vector<double>& expected) {
  REQUIRE(observed.size() == expected.size());
  for (size_t i = 0; i < observed.size(); ++i) {
    INFO("token " << i << ": observed " << observed[i] << ", expected " << expected[i]);
    CHECK(std::fabs(observed[i] - expected[i]) <= kFrequencyTolerance);
  }
}

const std::vector<float> kLogits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f};

}  // namespace

TEST_CASE("greedy sampling is the argmax, lowest index on ties", "[ch08][cpu][sampler]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Sampler sampler(SamplerOptions{0.0f, 0, 1.0f, seed});
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(301);
    for (float& l : logits) l = normal(engine);
    int32_t expected = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
      if (logits[i] > logits[size_t(expected)]) expected = int32_t(i);
    }
    REQUIRE(sampler.sample(logits) == expected);
  }
  REQUIRE(sampler.sample(std::vector<float>{1.0f, 7.0f, 7.0f, -2.0f}) == 1);
  REQUIRE(sampler.sample(std::vector<float>{-INFINITY, -5.0f, -INFINITY}) == 1);
}

TEST_CASE("top-k = 1 is greedy at any temperature", "[ch08][cpu][sampler]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Sampler top1(SamplerOptions{5.0f, 1, 1.0f, seed});
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(97);
    for (float& l : logits) l = normal(engine);
    REQUIRE(top1.sample(logits) == argmax(logits.data(), int(logits.size())));
  }
}

TEST_CASE("temperature sampling follows softmax(logits / temperature)", "[ch08][cpu][sampler]") {
  for (double temperature : {1.0, 0.7, 2.0}) {
    INFO("temperature " << temperature);
    Sampler sampler(SamplerOptions{float(temperature), 0, 1.0f, 1234});
    require_close(frequencies(sampler, kLogits), softmax(kLogits, temperature));
  }
}

TEST_CASE("top-k keeps the k most likely tokens, renormalized", "[ch08][cpu][sampler]") {
  Sampler sampler(SamplerOptions{1.0f, 3, 1.0f, 99});
  // Top 3 of kLogits: ids 4 (3.0), 5 (2.5), 1 (2.0).
  std::vector<double> p = softmax(kLogits, 1.0);
  const double mass = p[4] + p[5] + p[1];
  std::vector<double> expected(kLogits.size(), 0.0);
  for (int id : {4, 5, 1}) expected[size_t(id)] = p[size_t(id)] / mass;
  require_close(frequencies(sampler, kLogits), expected);
}

TEST_CASE("top-p removes the tail beyond the nucleus", "[ch08][cpu][sampler]") {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (as logits: their logs). top_p = 0.75 keeps the
  // shortest prefix reaching 0.75: {0.5, 0.3}; the tail must never be drawn.
  const std::vector<float> logits = {float(std::log(0.15)), float(std::log(0.5)), float(std::log(0.05)),
                                     float(std::log(0.3))};
  Sampler sampler(SamplerOptions{1.0f, 0, 0.75f, 7});
  std::vector<double> observed = frequencies(sampler, logits);
  REQUIRE(observed[0] == 0.0);
  REQUIRE(observed[2] == 0.0);
  require_close(observed, {0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8});

  auto candidates = sampler.candidates(logits.data(), int(logits.size()));
  REQUIRE(candidates.size() == 2);
  REQUIRE(candidates[0].first == 1);
  REQUIRE(candidates[1].first == 3);
  REQUIRE(candidates[0].second + candidates[1].second == Approx(1.0));

  // A tiny top_p still keeps the single most likely token.
  Sampler narrow(SamplerOptions{1.0f, 0, 0.01f, 7});
  for (int i = 0; i < 100; ++i) REQUIRE(narrow.sample(logits) == 1);
}

TEST_CASE("top-p over every token finds the nucleus a full sort finds, however long", "[ch08][cpu][sampler]") {
  // The sampler ranks only as many tokens as the nucleus needs (256, then 4x more);
  // the reference here sorts all V. A peaked distribution (a nucleus of a few tokens), a
  // flat one (thousands: the ranking grows 256 -> 1024 -> 4096 -> V) and one with ties.
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  for (const float spread : {5.0f, 0.05f, 0.0f}) {
    std::normal_distribution<float> normal(0.0f, spread > 0 ? spread : 1.0f);
    std::vector<float> logits(5003);
    for (float& l : logits) l = spread > 0 ? normal(engine) : std::round(normal(engine)) * 0.5f;
    for (const float top_p : {0.9f, 0.3f, 0.999f}) {
      INFO("spread " << spread << ", top_p " << top_p);
      const float temperature = 0.8f;
      Sampler sampler(SamplerOptions{temperature, 0, top_p, 1});
      const auto nucleus = sampler.candidates(logits.data(), int(logits.size()));
      // The reference: every token ranked (more likely first, the lower id on a tie).
      double max_logit = logits[0];
      for (float l : logits) max_logit = std::max(max_logit, double(l));
      std::vector<std::pair<int32_t, double>> all(logits.size());
      double mass = 0;
      for (size_t i = 0; i < logits.size(); ++i) {
        all[i] = {int32_t(i), std::exp((double(logits[i]) - max_logit) * (1.0 / double(temperature)))};
        mass += all[i].second;
      }
      std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
      });
      double cumulative = 0;
      size_t kept = 0;
      while (kept < all.size() && cumulative < double(top_p)) cumulative += all[kept++].second / mass;
      double kept_mass = 0;
      for (size_t i = 0; i < kept; ++i) kept_mass += all[i].second;
      REQUIRE(nucleus.size() == kept);
      for (size_t i = 0; i < kept; ++i) {
        INFO("rank " << i);
        REQUIRE(nucleus[i].first == all[i].first);
        REQUIRE(nucleus[i].second == Approx(all[i].second / kept_mass).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("top-k and top-p together: top-p measures mass within the top k", "[ch08][cpu][sampler]") {
  // Top 3 of kLogits renormalized: p4 > p5 > p1. top_p just above p4's share keeps two.
  std::vector<double> p = softmax(kLogits, 1.0);
  const double mass = p[4] + p[5] + p[1];
  const float top_p = float(p[4] / mass + 0.01);
  Sampler sampler(SamplerOptions{1.0f, 3, top_p, 5});
  std::vector<double> expected(kLogits.size(), 0.0);
  expected[4] = p[4] / (p[4] + p[5]);
  expected[5] = p[5] / (p[4] + p[5]);
  require_close(frequencies(sampler, kLogits), expected);
}

TEST_CASE("a seed fixes the draws; another seed changes them", "[ch08][cpu][sampler]") {
  std::vector<float> flat(50, 0.0f);  // uniform: every draw is pure randomness
  Sampler a(SamplerOptions{1.0f, 0, 1.0f, 42}), b(SamplerOptions{1.0f, 0, 1.0f, 42}),
      c(SamplerOptions{1.0f, 0, 1.0f, 43});
  std::vector<int32_t> from_a, from_b, from_c;
  for (int i = 0; i < 64; ++i) {
    from_a.push_back(a.sample(flat));
    from_b.push_back(b.sample(flat));
    from_c.push_back(c.sample(flat));
  }
  REQUIRE(from_a == from_b);
  REQUIRE(from_a != from_c);
}

TEST_CASE("the sampler rejects NaN logits and bad options", "[ch08][cpu][sampler]") {
  std::vector<float> bad = {0.0f, NAN, 1.0f};
  Sampler greedy(SamplerOptions{0.0f, 0, 1.0f, 1});
  Sampler random(SamplerOptions{1.0f, 0, 1.0f, 1});
  Sampler nucleus(SamplerOptions{1.0f, 0, 0.9f, 1});
  REQUIRE_THROWS_AS(greedy.sample(bad), std::invalid_argument);
  REQUIRE_THROWS_AS(random.sample(bad), std::invalid_argument);
  REQUIRE_THROWS_AS(nucleus.sample(bad), std::invalid_argument);
  REQUIRE_THROWS_AS(random.sample(std::vector<float>{0.0f, INFINITY}), std::invalid_argument);
  REQUIRE_THROWS_AS(random.sample(std::vector<float>{-INFINITY, -INFINITY}), std::invalid_argument);
  REQUIRE_THROWS_AS(random.sample(std::vector<float>{}), std::invalid_argument);
  REQUIRE_THROWS_AS(Sampler(SamplerOptions{1.0f, 0, 0.0f, 1}), std::invalid_argument);
  REQUIRE_THROWS_AS(Sampler(SamplerOptions{1.0f, 0, 1.5f, 1}), std::invalid_argument);
  REQUIRE_THROWS_AS(Sampler(SamplerOptions{NAN, 0, 1.0f, 1}), std::invalid_argument);
  // 1 / inf = 0 made every probability equal (or NaN next to a -inf logit).
  CHECK(contains(error_of<std::invalid_argument>([] { Sampler(SamplerOptions{INFINITY, 0, 1.0f, 1}); }),
                 "temperature must be a finite number"));
  CHECK_THROWS_AS(Sampler(SamplerOptions{-INFINITY, 0, 1.0f, 1}), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(SamplerOptions{1.0f, 0, INFINITY, 1}), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(SamplerOptions{1.0f, 0, NAN, 1}), std::invalid_argument);
}

TEST_CASE("a draw in the rounding slack of the sum never picks a token of probability 0", "[ch08][cpu][sampler]") {
  // Top-k 3 over two finite logits and two -inf ones: the pool is the two finite tokens
  // and one of probability 0. For some pairs the normalized probabilities sum to one ulp
  // below 1, and the largest draw there is, 1 - 2^-53, lands past them. It used to fall
  // back to the pool's last entry: the masked token.
  const double largest_draw = double((uint64_t(1) << 53) - 1) * 0x1.0p-53;
  Sampler sampler(SamplerOptions{1.0f, 3, 1.0f, 1});
  int in_slack = 0;
  for (int step = 1; step <= 400; ++step) {
    const std::vector<float> logits = {0.0f, 0.01f * float(step), -INFINITY, -INFINITY};
    double sum = 0;
    for (const auto& candidate : sampler.candidates(logits.data(), 4)) sum += candidate.second;
    if (!(sum <= largest_draw)) continue;  // the draw lands inside the sum: nothing to test here
    ++in_slack;
    const int32_t drawn = sampler.sample_with_uniform(logits.data(), 4, largest_draw);
    INFO("logits 0, " << logits[1] << ": drew " << drawn);
    CHECK((drawn == 0 || drawn == 1));
  }
  INFO("pairs whose probabilities sum below the largest draw");
  REQUIRE(in_slack > 0);
}
