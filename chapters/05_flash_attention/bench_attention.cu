// Chapter 05 benchmark: every attention version at Bielik's heads (H=12, Hkv=2, D=128)
// for prompts of 512, 2048 and 8192 tokens, plus SmolLM2's heads and one decode step.
// PyTorch's SDPA is timed by bench_sdpa.py (same shapes, same FLOP count, same method:
// median of CUDA-event timings with the L2 scrubbed) in the same GPU session.
//
// Napkin math (FLOPs): two matrix products, Q K^T and P V, each 2 * Tq * Tkv * D per
// head; a causal square prompt needs about half of them:
//     flops = 4 * Tq * Tkv * D * H / 2      (the convention of the FlashAttention papers)
// Bielik at T = 2048: 12.9 GFLOP; at ~400 TFLOP/s of mma.sync bf16 that is ~32 us.
// Queries over a longer context (Tq < Tkv) count the visible (query, key) pairs exactly,
// Tq * (Tkv - Tq) + Tq * (Tq + 1) / 2. The decode row (Tq = 1) is memory-bound: the K/V
// read of 2 * Tkv * Hkv * D * 2 bytes is what counts there, not FLOPs.
#include <cstdio>
#include <algorithm>
#include <functional>
#include <map>
#include <string>

#include "attention.cuh"
#include "bench.cuh"
#include "device_buffer.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

// Where a v6 launch spends its time, block by block (%globaltimer stamps, see
// attention_v6_cluster_split_keys_with): the kernel's span, when blocks start, how long
// they take to load their first tiles, to run their tiles and to finish, and how the
// blocks spread over the SMs. Bielik's 512-token prompt, after two identical launches.
void print_v6_timelines() {
  const int Tq = 512, Tkv = 512, H = 12, Hkv = 2, D = 128;
  DeviceBuffer<uint16_t> q(random_bf16(size_t(Tq) * H * D, 1)), k(random_bf16(size_t(Tkv) * Hkv * D, 2)),
      v(random_bf16(size_t(Tkv) * Hkv * D, 3)), out(size_t(Tq) * H * D);
  for (int splits : {1, 2, 4}) {
    const int rows = attention_v6_grid_rows(Tq, Tkv, H, D, splits);
    const int blocks = rows * H;
    DeviceBuffer<unsigned long long> times(size_t(blocks) * 5);
    times.fill_bytes(0);
    for (int run = 0; run < 3; ++run) {
      attention_v6_cluster_split_keys_with(reinterpret_cast<__nv_bfloat16*>(out.data()),
                                           reinterpret_cast<const __nv_bfloat16*>(q.data()),
                                           reinterpret_cast<const __nv_bfloat16*>(k.data()),
                                           reinterpret_cast<const __nv_bfloat16*>(v.data()), Tq, Tkv, H, Hkv, D, 0,
                                           false, splits, run == 2 ? times.data() : nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<unsigned long long> t = times.to_host();
    unsigned long long first = ~0ull, last = 0;
    for (int b = 0; b < blocks; ++b) first = std::min(first, t[5 * b + 1]), last = std::max(last, t[5 * b + 4]);
    std::map<unsigned long long, int> per_sm;
    std::vector<double> load, compute, finish, start;
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long* r = &t[5 * b];
      if (r[2] == 0) continue;  // a block with no tile
      per_sm[r[0]]++;
      start.push_back((r[1] - first) * 1e-3);
      load.push_back((r[2] - r[1]) * 1e-3);
      compute.push_back((r[3] - r[2]) * 1e-3);
      finish.push_back((r[4] - r[3]) * 1e-3);
    }
    auto stats = [](std::vector<double> x) {
      std::sort(x.begin(), x.end());
      return fmt(x[x.size() / 2], 2) + " / " + fmt(x.back(), 2);
    };
    int most = 0;
    for (auto& [sm, n] : per_sm) most = std::max(most, n);
    std::printf("\nv6 timeline, T = 512, clusters of %d: span %.2f us, %zu blocks with tiles on %zu SMs (at most %d on one)\n",
                splits, (last - first) * 1e-3, start.size(),
                per_sm.size(), most);
    std::printf("  median / max, us: start %s, load %s, tiles %s, finish %s\n", stats(start).c_str(),
                stats(load).c_str(), stats(compute).c_str(), stats(finish).c_str());
    // The five items that end last.
    std::vector<int> order;
    for (int b = 0; b < blocks; ++b) {
      if (t[5 * b + 2] != 0) order.push_back(b);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return t[5 * a + 4] > t[5 * b + 4]; });
    for (int i = 0; i < 5 && i < int(order.size()); ++i) {
      const unsigned long long* r = &t[5 * order[i]];
      std::printf("  block (head %d, row %d) on SM %llu: start %.2f, loaded %.2f, tiles done %.2f, end %.2f us\n",
                  order[i] % H, order[i] / H, r[0], (r[1] - first) * 1e-3, (r[2] - first) * 1e-3,
                  (r[3] - first) * 1e-3, (r[4] - first) * 1e-3);
    }
  }
}

}  // namespace

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_attention: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("device: %s\n", describe_device().c_str());

  struct Case {
    const char* model;
    int Tq, Tkv, H, Hkv, D;
  };
  const Case cases[] = {
      {"Bielik", 512, 512, 12, 2, 128},   {"Bielik", 2048, 2048, 12, 2, 128}, {"Bielik", 8192, 8192, 12, 2, 128},
      {"SmolLM2", 2048, 2048, 9, 3, 64},  {"Bielik new turn", 512, 4096, 12, 2, 128},
      {"Bielik decode", 1, 4096, 12, 2, 128},
  };

  BenchTable results("attention", {"version", "model", "Tq", "Tkv", "time (us)", "TFLOP/s", "speedup vs v1"});
  for (const Case& c : cases) {
    DeviceBuffer<uint16_t> q(random_bf16(size_t(c.Tq) * c.H * c.D, 1));
    DeviceBuffer<uint16_t> k(random_bf16(size_t(c.Tkv) * c.Hkv * c.D, 2));
    DeviceBuffer<uint16_t> v(random_bf16(size_t(c.Tkv) * c.Hkv * c.D, 3));
    DeviceBuffer<uint16_t> out(size_t(c.Tq) * c.H * c.D);
    const double pairs = c.Tq == c.Tkv ? 0.5 * c.Tq * c.Tkv : double(c.Tq) * (c.Tkv - c.Tq) + 0.5 * c.Tq * (c.Tq + 1.0);
    const double flops = 4.0 * pairs * c.D * c.H;
    double v1_ms = 0;
    for (const AttentionVersion& version : kAttentionVersions) {
      const bool is_v1 = std::string(version.name) == "v1_naive";
      // v1's score matrix at T = 8192 would be 3.2 GB and take seconds: skipped.
      if (is_v1 && c.Tq >= 8192) continue;
      if (version.supported && !version.supported(c.D)) continue;  // e.g. v5 on a 99 KB-shared-memory GPU
      DeviceBuffer<float> workspace(version.workspace_floats ? version.workspace_floats(c.Tq, c.Tkv, c.H) : 0);
      const bool slow = is_v1 || std::string(version.name) == "v2_online_softmax";
      BenchOptions options;
      if (slow) options = BenchOptions{1, 5, true};  // milliseconds per call: fewer repeats
      BenchTiming timing = time_gpu(
          [&] {
            version.launch(reinterpret_cast<__nv_bfloat16*>(out.data()),
                           reinterpret_cast<const __nv_bfloat16*>(q.data()),
                           reinterpret_cast<const __nv_bfloat16*>(k.data()),
                           reinterpret_cast<const __nv_bfloat16*>(v.data()), c.Tq, c.Tkv, c.H, c.Hkv, c.D,
                           workspace.data(), 0);
          },
          options);
      if (is_v1) v1_ms = timing.median_ms;
      results.add_row({version.name, c.model, std::to_string(c.Tq), std::to_string(c.Tkv),
                       fmt(timing.median_ms * 1e3, 1), fmt(tflop_per_s(flops, timing.median_ms), 1),
                       v1_ms > 0 ? fmt(v1_ms / timing.median_ms, 1) + "x" : "-"});
    }
  }
  results.print();

  // The model runs the attention once a layer, between other kernels, with q, k and v
  // just written (in L2). The same here: 32 launches captured in a CUDA graph, no
  // scrub, time per launch. v6 also at each cluster size (1: v3's work split).
  BenchTable graph_results("attention_graph", {"version", "model", "Tq", "Tkv", "time per launch (us)", "TFLOP/s"});
  // Two tiny prompts show the cost of a launch that has almost nothing to do.
  const Case graph_cases[] = {{"tiny", 16, 16, 12, 2, 128}, {"tiny", 64, 64, 12, 2, 128}, cases[0], cases[1], cases[4]};
  for (const Case& c : graph_cases) {
    DeviceBuffer<uint16_t> q(random_bf16(size_t(c.Tq) * c.H * c.D, 1));
    DeviceBuffer<uint16_t> k(random_bf16(size_t(c.Tkv) * c.Hkv * c.D, 2));
    DeviceBuffer<uint16_t> v(random_bf16(size_t(c.Tkv) * c.Hkv * c.D, 3));
    DeviceBuffer<uint16_t> out(size_t(c.Tq) * c.H * c.D);
    const double pairs = c.Tq == c.Tkv ? 0.5 * c.Tq * c.Tkv : double(c.Tq) * (c.Tkv - c.Tq) + 0.5 * c.Tq * (c.Tq + 1.0);
    const double flops = 4.0 * pairs * c.D * c.H;
    auto* o = reinterpret_cast<__nv_bfloat16*>(out.data());
    auto* dq = reinterpret_cast<const __nv_bfloat16*>(q.data());
    auto* dk = reinterpret_cast<const __nv_bfloat16*>(k.data());
    auto* dv = reinterpret_cast<const __nv_bfloat16*>(v.data());
    auto row = [&](const std::string& name, const std::function<void(cudaStream_t)>& launch) {
      const BenchTiming t = time_gpu_graph([&](int, cudaStream_t stream) { launch(stream); }, 32);
      graph_results.add_row({name, c.model, std::to_string(c.Tq), std::to_string(c.Tkv), fmt(t.median_ms * 1e3, 2),
                             fmt(tflop_per_s(flops, t.median_ms), 1)});
    };
    row("v3_flash_mma", [&](cudaStream_t s) { attention_v3_flash_mma(o, dq, dk, dv, c.Tq, c.Tkv, c.H, c.Hkv, c.D, nullptr, s); });
    if (attention_v5_supported(c.D)) {
      row("v5_flash_split_keys",
          [&](cudaStream_t s) { attention_v5_flash_split_keys(o, dq, dk, dv, c.Tq, c.Tkv, c.H, c.Hkv, c.D, nullptr, s); });
    }
    for (int splits : {0, 1, 2, 4, 8}) {
      row(splits == 0 ? "v6_cluster_split_keys (auto: " + std::to_string(attention_v6_default_splits(c.Tq, c.Tkv, c.H, c.D)) + ")"
                      : "v6, clusters of " + std::to_string(splits),
          [&](cudaStream_t s) {
            attention_v6_cluster_split_keys_with(o, dq, dk, dv, c.Tq, c.Tkv, c.H, c.Hkv, c.D, s, false, splits);
          });
    }
  }
  graph_results.print();
  print_v6_timelines();
  return 0;
}
