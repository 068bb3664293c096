// Chapter 01 benchmark: every embedding version at Bielik's shape, in GB/s against the
// device-to-device copy bandwidth measured in the same run.
//
// Napkin math: a lookup reads T*C*2 bytes of table rows and writes T*C*2 bytes, so
// bytes = 4*T*C. Bielik at T=4096, C=1536: 25.2 MB, about 6 us at 4.3 TB/s. That is
// short enough that launch overhead shows, so we also time a cudaMemcpy of exactly the
// same bytes (the best any copy of this size can do) and report against both.
#include <cstdio>

#include "bench.cuh"
#include "device_buffer.cuh"
#include "embedding.cuh"
#include "test_support.hpp"

using namespace bielik;

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_embedding: no CUDA device\n");
    return 0;
  }
  std::printf("device: %s\n", describe_device().c_str());
  double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("copy bandwidth (1 GiB D2D, read+write): %.0f GB/s\n", copy_gbs);

  const int C = 1536, V = 32000;
  DeviceBuffer<uint16_t> table(random_bf16(size_t(V) * C, 1));
  BenchTable results("embedding", {"version", "T", "C", "time (us)", "GB/s", "% of copy BW",
                                   "% of same-size memcpy"});
  for (int T : {1, 512, 4096, 32768}) {
    DeviceBuffer<int32_t> ids(random_ints(T, 2, 0, V - 1));
    DeviceBuffer<uint16_t> out(size_t(T) * C), copy_source(size_t(T) * C);
    double bytes = 4.0 * T * C;
    BenchTiming memcpy_time = time_gpu([&] {
      CUDA_CHECK(cudaMemcpyAsync(out.data(), copy_source.data(), out.bytes(), cudaMemcpyDeviceToDevice));
    });
    for (const EmbeddingVersion& version : kEmbeddingVersions) {
      BenchTiming timing = time_gpu([&] {
        version.launch(reinterpret_cast<__nv_bfloat16*>(out.data()), reinterpret_cast<const __nv_bfloat16*>(table.data()),
                       ids.data(), T, C, V, nullptr, 0);
      });
      double gbs = gb_per_s(bytes, timing.median_ms);
      results.add_row({version.name, std::to_string(T), std::to_string(C), fmt(timing.median_ms * 1e3, 1), fmt(gbs, 0),
                       fmt(100 * gbs / copy_gbs, 1), fmt(100 * memcpy_time.median_ms / timing.median_ms, 1)});
    }
    results.add_row({"cudaMemcpy (same bytes)", std::to_string(T), std::to_string(C),
                     fmt(memcpy_time.median_ms * 1e3, 1), fmt(gb_per_s(bytes, memcpy_time.median_ms), 0),
                     fmt(100 * gb_per_s(bytes, memcpy_time.median_ms) / copy_gbs, 1), "100.0"});
  }
  results.print();
  return 0;
}
