// Chapter 04 benchmark: every RoPE version at Bielik's shape, in GB/s against the
// device-to-device copy bandwidth measured in the same run.
//
// Napkin math: RoPE reads and writes every element of q and k once, in place:
// bytes = 2 * T * (H + Hkv) * D * 2. Bielik at T=4096 (H=12, Hkv=2, D=128): 29.4 MB,
// about 7 us at 4.3 TB/s. The positions (4 bytes per token) and, for v2/v3, the cos/sin
// rows (4 * D bytes per token, shared by all heads of the token) are not counted: they
// are 2% of the traffic. At T = 1 (decode) the op moves 3.5 KB and the only number that
// matters is the time, which is launch latency: one launch (v3) against two (v1, v2).
#include <cstdio>
#include <string>

#include "bench.cuh"
#include "device_buffer.cuh"
#include "rope.cuh"
#include "test_support.hpp"

using namespace bielik;

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_rope: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("device: %s\n", describe_device().c_str());
  double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("copy bandwidth (1 GiB D2D, read+write): %.0f GB/s\n", copy_gbs);

  struct Shape {
    const char* model;
    int H, Hkv, D;
    float theta;
  };
  const Shape shapes[] = {{"Bielik", 12, 2, 128, 1e6f}, {"SmolLM2", 9, 3, 64, 1e5f}};
  const int kMaxPositions = 8192;

  BenchTable results("rope", {"version", "model", "T", "time (us)", "GB/s", "% of copy BW", "% of same-size memcpy"});
  for (const Shape& shape : shapes) {
    RopeTable table = rope_table_build(shape.D, shape.theta, kMaxPositions);
    for (int T : {4096, 1}) {
      if (T == 1 && shape.D != 128) continue;  // decode latency: one shape is enough
      size_t q_count = size_t(T) * shape.H * shape.D, k_count = size_t(T) * shape.Hkv * shape.D;
      DeviceBuffer<uint16_t> q(random_bf16(q_count, 1)), k(random_bf16(k_count, 2));
      DeviceBuffer<uint16_t> copy_source(q_count + k_count), copy_destination(q_count + k_count);
      // Prefill: positions 0..T-1. Decode: one token deep in the context.
      DeviceBuffer<int32_t> positions(T);
      rope_positions_from_offset(positions.data(), T, T == 1 ? 4095 : 0);
      double bytes = 2.0 * double(q_count + k_count) * 2;
      BenchTiming memcpy_time = time_gpu([&] {
        CUDA_CHECK(cudaMemcpyAsync(copy_destination.data(), copy_source.data(), copy_source.bytes(),
                                   cudaMemcpyDeviceToDevice));
      });
      for (const RopeVersion& version : kRopeVersions) {
        BenchTiming timing = time_gpu([&] {
          version.launch(reinterpret_cast<__nv_bfloat16*>(q.data()), reinterpret_cast<__nv_bfloat16*>(k.data()),
                         positions.data(), T, shape.H, shape.Hkv, table, 0);
        });
        double gbs = gb_per_s(bytes, timing.median_ms);
        results.add_row({version.name, shape.model, std::to_string(T), fmt(timing.median_ms * 1e3, 2), fmt(gbs, 0),
                         fmt(100 * gbs / copy_gbs, 1), fmt(100 * memcpy_time.median_ms / timing.median_ms, 1)});
      }
      double memcpy_gbs = gb_per_s(bytes, memcpy_time.median_ms);
      results.add_row({"cudaMemcpy (same bytes)", shape.model, std::to_string(T), fmt(memcpy_time.median_ms * 1e3, 2),
                       fmt(memcpy_gbs, 0), fmt(100 * memcpy_gbs / copy_gbs, 1), "100.0"});
    }
  }
  results.print();
  return 0;
}
