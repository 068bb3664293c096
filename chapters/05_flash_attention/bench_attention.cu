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
#include <string>

#include "attention.cuh"
#include "bench.cuh"
#include "device_buffer.cuh"
#include "test_support.hpp"

using namespace bielik;

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_attention: no CUDA device\n");
    return 0;
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
      workspace.fill_bytes(0);  // v6's arrival counters start at zero
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
  return 0;
}
