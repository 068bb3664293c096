// Chapter 08's sampler on the GPU (sample_kernels.cuh: gpu_sample) draw for draw against
// the CPU Sampler from the same logits and the same uniform u, and what it refuses or
// reports as the CPU sampler does. Part of test_ch08_model_cuda (decode_sample in the
// model: test_model_cuda.cu).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_kernels.cuh"
#include "device_buffer.cuh"
#include "sample_kernels.cuh"
#include "sampler.hpp"
#include "test_support.hpp"

using namespace bielik;

TEST_CASE("gpu_sample draws what the CPU sampler draws from the same logits and the same u", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  struct LogitSet {
    const char* name;
    std::vector<float> logits;
  };
  std::vector<LogitSet> sets;
  {
    std::vector<float> bielik(32000), ties(1003), smollm(49152), tiny(5), dense(32000);
    for (float& l : bielik) l = normal(engine);
    // Logits on a 0.5 grid (many exact ties, the lower id first), some -inf, a -0 and a +0.
    for (size_t i = 0; i < ties.size(); ++i) ties[i] = i % 97 == 5 ? -INFINITY : std::round(normal(engine) * 2) * 0.5f;
    ties[11] = -0.0f;
    ties[12] = 0.0f;
    for (float& l : smollm) l = normal(engine) * 0.3f;  // a flat distribution: long nuclei
    tiny = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
    // 1e-4 apart: ~5000 tokens within the shortlist's first distance (0.5) of the largest,
    // too many to rank, so the shortlist must narrow down (or, for k > 256, radix select).
    for (size_t i = 0; i < dense.size(); ++i) dense[i] = 2.0f - 1e-4f * float((i * 7919) % dense.size());
    // One leader and a plateau of 2000 tokens at half its weight or less: top-p's nucleus
    // lies past the ranked 1024, though the mass of all is small enough (under 1024 /
    // top_p) that only the ranked tokens' running sum can tell (the kernel's late way to
    // the host, where flat distributions take the early one).
    std::vector<float> plateau(4001, -40.0f);
    plateau[7] = 0.0f;
    for (size_t i = 100; i < 2100; ++i) plateau[i] = -0.6931f;
    sets = {{"Bielik-sized", bielik},
            {"ties on a grid", ties},
            {"SmolLM2-sized, flat", smollm},
            {"V = 5", tiny},
            {"dense: the shortlist narrows down", dense},
            {"plateau past the ranked 1024", plateau}};
  }
  const SamplerOptions option_sets[] = {
      {0.7f, 40, 0.9f, 0},    // the chat's defaults
      {1.3f, 1000, 0.5f, 0},  {0.8f, 1024, 0.95f, 0}, {1.0f, 2, 1.0f, 0}, {0.9f, 7, 1.0f, 0},
      {0.8f, 200, 0.95f, 0},  // N(0, 3^2): ~90 tokens within 4 of the largest, ~2400 within 8
      {0.5f, 0, 1.0f, 0},     // nothing to cut: the unranked walk
      {1.0f, 4, 0.3f, 0},     {0.0f, 0, 1.0f, 0},  // greedy by temperature
      {1.0f, 1, 1.0f, 0},     // greedy by top-k
      {0.7f, 0, 0.9f, 0},     // top-p over every token: ranked on the GPU, or left to the host
      {1.3f, 0, 0.6f, 0},     {0.8f, 1 << 20, 0.95f, 0},  // (k >= V: top-p over every token too)
  };
  DeviceBuffer<double> d_u(1);
  DeviceBuffer<SampleResult> d_result(1);
  int checked = 0, near_border = 0, shortlisted = 0, radix_selected = 0;  // top-k draws by the way taken
  int nucleus_ranked = 0, nucleus_beyond = 0;  // top-p over every token: drawn on the GPU, left to the host
  for (const LogitSet& set : sets) {
    const int V = int(set.logits.size());
    DeviceBuffer<float> d_logits(set.logits);
    for (const SamplerOptions& options : option_sets) {
      INFO(set.name << ": temperature " << options.temperature << ", top_k " << options.top_k << ", top_p "
                    << options.top_p);
      const bool every_token = options.top_k <= 0 || options.top_k >= V;
      // (V = 5 with a larger k and no top-p: the unranked case, covered by k = 0)
      if (options.top_k >= V && options.top_p >= 1.0f) continue;
      REQUIRE(gpu_sampler_supports(options, V));
      const Sampler cpu(options);
      // Top-p over every token: the CPU's nucleus decides whether the GPU may draw.
      const bool top_p_all = options.temperature > 0.0f && every_token && options.top_p < 1.0f;
      const size_t cpu_nucleus = top_p_all ? cpu.candidates(set.logits.data(), V).size() : 0;
      const bool beyond = cpu_nucleus > size_t(kGpuSamplerMaxTopK);
      std::vector<double> draws = {0.0, 1.0 - 0x1.0p-53};  // the ends of [0, 1)
      for (int d = 0; d < 24; ++d) draws.push_back(double(engine() >> 11) * 0x1.0p-53);
      for (double u : draws) {
        INFO("u " << u);
        CUDA_CHECK(cudaMemcpy(d_u.data(), &u, sizeof(double), cudaMemcpyHostToDevice));
        d_result.fill_bytes(0xFF);  // token -1: the kernel must write its answer
        gpu_sample(d_result.data(), d_logits.data(), V, options, d_u.data(), 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const SampleResult result = d_result.to_host()[0];
        INFO("the CPU's nucleus: " << cpu_nucleus << " tokens");
        REQUIRE(sample_needs_host(result) == beyond);
        if (beyond) {
          REQUIRE(result.token == -1);  // nothing drawn
          REQUIRE_THROWS_AS(checked_token(result), std::logic_error);
          ++nucleus_beyond;
          continue;
        }
        nucleus_ranked += top_p_all;
        const int32_t gpu = checked_token(result);
        const int32_t expected = cpu.sample_with_uniform(set.logits.data(), V, u);
        ++checked;
        if (options.temperature > 0.0f && options.top_k > 1) {
          REQUIRE((result.shortlisted == 0 || (result.shortlisted >= options.top_k &&
                                                result.shortlisted <= kGpuSamplerMaxTopK)));
          ++(result.shortlisted > 0 ? shortlisted : radix_selected);
          if (set.name[0] == 'd' && options.top_k <= 256) REQUIRE(result.shortlisted > 0);  // (narrowed down)
        } else {
          REQUIRE(result.shortlisted == 0);
        }
        if (gpu != expected) {
          // Only where u lies on a border between two tokens, within the sums' rounding:
          // a draw a hair away must then give the GPU's token.
          const int32_t below = cpu.sample_with_uniform(set.logits.data(), V, std::max(0.0, u - 1e-12));
          // At the top end (u = 1 - 2^-53) a hair above is u = 1: the walk's end, the last
          // token with a weight (H200, 2026-12-03: the GPU drew the last of 32000 tokens,
          // whose weight lies below the double sum's last bit, where the CPU drew the one
          // before it).
          const int32_t above = cpu.sample_with_uniform(set.logits.data(), V, std::min(1.0, u + 1e-12));
          INFO("GPU " << gpu << ", CPU " << expected << " (u - 1e-12: " << below << ", u + 1e-12: " << above << ")");
          REQUIRE((gpu == below || gpu == above));
          ++near_border;
        }
      }
    }
  }
  std::printf("gpu_sample: %d draws against the CPU sampler, %d on a border within 1e-12; top-k: %d from a shortlist, "
              "%d by radix select\n",
              checked, near_border, shortlisted, radix_selected);
  std::printf("gpu_sample: top-p over every token: %d draws on the GPU, %d left to the host (nucleus > %d)\n",
              nucleus_ranked, nucleus_beyond, kGpuSamplerMaxTopK);
  REQUIRE(near_border <= 1);
  // Both ways to the top k ran (the flat and the 1000-wide cases need the radix select).
  REQUIRE(shortlisted > 0);
  REQUIRE(radix_selected > 0);
  // Top-p over every token both drew on the GPU (N(0, 3^2) at 0.7: a nucleus of tens) and
  // left flat distributions to the host.
  REQUIRE(nucleus_ranked > 0);
  REQUIRE(nucleus_beyond > 0);

  // Both ways to the host for top-p over every token, told apart by the timeline: the
  // dense set leaves at once (the mass of all, ~6900 at temperature 0.7, exceeds
  // 1024 / top_p: nothing ranked), the plateau after ranking 1024 (its mass is ~745).
  {
    DeviceBuffer<unsigned long long> d_stamps(kSampleTimelineEvents);
    for (const size_t set_index : {size_t(4), size_t(5)}) {
      const LogitSet& set = sets[set_index];
      INFO(set.name);
      DeviceBuffer<float> d_logits(set.logits);
      d_stamps.fill_bytes(0);
      d_result.fill_bytes(0xFF);
      gpu_sample(d_result.data(), d_logits.data(), int(set.logits.size()), {0.7f, 0, 0.9f, 0}, d_u.data(), 0,
                 d_stamps.data());
      REQUIRE(sample_needs_host(d_result.to_host()[0]));
      const std::vector<unsigned long long> t = d_stamps.to_host();
      const bool ranked_first = t[size_t(SampleTimelineEvent::kRanked)] != 0;
      REQUIRE(ranked_first == (set_index == 5));
      REQUIRE(t[size_t(SampleTimelineEvent::kDrawn)] != 0);
    }
  }

  // The timeline (bench_model's, measurement only) changes no token and stamps the points
  // each path passes, in order; the ones it skips stay untouched.
  DeviceBuffer<float> d_bielik(sets[0].logits);
  DeviceBuffer<unsigned long long> d_timeline(kSampleTimelineEvents);
  const double u = 0.37;
  CUDA_CHECK(cudaMemcpy(d_u.data(), &u, sizeof(double), cudaMemcpyHostToDevice));
  for (const SamplerOptions& options : {option_sets[0], option_sets[5], option_sets[7]}) {
    const bool top_k = options.top_k > 1;
    INFO("top_k " << options.top_k << ", temperature " << options.temperature);
    d_result.fill_bytes(0xFF);
    gpu_sample(d_result.data(), d_bielik.data(), 32000, options, d_u.data(), 0);
    const int32_t without = checked_token(d_result.to_host()[0]);
    d_result.fill_bytes(0xFF);
    d_timeline.fill_bytes(0);
    gpu_sample(d_result.data(), d_bielik.data(), 32000, options, d_u.data(), 0, d_timeline.data());
    REQUIRE(checked_token(d_result.to_host()[0]) == without);
    const std::vector<unsigned long long> t = d_timeline.to_host();
    unsigned long long previous = 0;
    for (int e = 0; e < kSampleTimelineEvents; ++e) {
      const auto event = SampleTimelineEvent(e);
      const bool passed = top_k || event == SampleTimelineEvent::kStart ||
                          event == SampleTimelineEvent::kLargestFound || event == SampleTimelineEvent::kDrawn;
      INFO("event " << e);
      if (!passed) {
        REQUIRE(t[size_t(e)] == 0u);
        continue;
      }
      REQUIRE(t[size_t(e)] > 0u);
      REQUIRE(t[size_t(e)] >= previous);
      previous = t[size_t(e)];
    }
  }
}

TEST_CASE("gpu_sample refuses what it does not rank, and reports bad logits as the CPU sampler does",
          "[ch08][gpu][kernels]") {
  REQUIRE(gpu_sampler_supports({0.7f, 0, 0.9f, 0}, 32000));  // top-p over every token: ranked on the GPU
  REQUIRE_FALSE(gpu_sampler_supports({0.7f, 1025, 0.9f, 0}, 32000));  // above kGpuSamplerMaxTopK, with top-p
  REQUIRE_FALSE(gpu_sampler_supports({0.7f, 1025, 1.0f, 0}, 32000));  // above kGpuSamplerMaxTopK
  REQUIRE(gpu_sampler_supports({0.7f, 32000, 1.0f, 0}, 32000));       // k >= V, p = 1: nothing to cut
  REQUIRE_FALSE(gpu_sampler_supports({0.7f, 40, 0.9f, 0}, 0));
  DeviceBuffer<double> d_u(std::vector<double>{0.5});
  DeviceBuffer<SampleResult> d_result(1);
  std::vector<float> logits(3001, 0.25f);
  DeviceBuffer<float> d_logits(logits);
  REQUIRE_THROWS_AS(gpu_sample(d_result.data(), d_logits.data(), 3001, {0.7f, 1025, 0.9f, 0}, d_u.data(), 0),
                    std::invalid_argument);
  // 3001 equal logits: the nucleus of top-p 0.9 is 2701 tokens, past the ranked 1024.
  d_result.fill_bytes(0);
  gpu_sample(d_result.data(), d_logits.data(), 3001, {0.7f, 0, 0.9f, 0}, d_u.data(), 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  REQUIRE(sample_needs_host(d_result.to_host()[0]));
  REQUIRE_THROWS_AS(checked_token(d_result.to_host()[0]), std::logic_error);
  auto message = [&](const std::vector<float>& values, const SamplerOptions& options) {
    DeviceBuffer<float> d(values);
    gpu_sample(d_result.data(), d.data(), int(values.size()), options, d_u.data(), 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::string gpu_error, cpu_error;
    try {
      checked_token(d_result.to_host()[0]);
    } catch (const std::invalid_argument& e) {
      gpu_error = e.what();
    }
    try {
      Sampler(options).sample_with_uniform(values.data(), int(values.size()), 0.5);
    } catch (const std::invalid_argument& e) {
      cpu_error = e.what();
    }
    INFO("GPU: " << gpu_error << " / CPU: " << cpu_error);
    REQUIRE_FALSE(gpu_error.empty());
    REQUIRE(gpu_error == cpu_error);
  };
  for (const SamplerOptions& options : {SamplerOptions{0.7f, 40, 0.9f, 0}, SamplerOptions{1.0f, 0, 1.0f, 0},
                                        SamplerOptions{0.0f, 0, 1.0f, 0}}) {
    std::vector<float> bad = logits;
    bad[2500] = NAN;
    bad[17] = NAN;  // the first one is named
    message(bad, options);
    bad = logits;
    bad[40] = INFINITY;
    message(bad, options);
    message(std::vector<float>(777, -INFINITY), options);
  }
}
