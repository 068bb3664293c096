// Chapter 01 benchmark: every embedding version at Bielik's shape, in GB/s against the
// device-to-device copy bandwidth measured in the same run.
//
// Napkin math: a lookup reads T*C*2 bytes of table rows and writes T*C*2 bytes, so
// bytes = 4*T*C. Bielik at T=4096, C=1536: 25.2 MB, about 6 us at 4.2 TB/s. That is
// short enough that launch latency shows, so each version is timed two ways:
//   isolated      one launch between CUDA events, L2 flushed before it;
//   back-to-back  8 launches queued together (as inside the model's forward pass), each
//                 on its own output and ids so the 8 x 12.6 MB written exceed the L2;
// and a cudaMemcpy of exactly the same bytes is the best any copy of that size can do.
#include <cstdio>

#include "bench.cuh"
#include "device_buffer.cuh"
#include "embedding.cuh"
#include "test_support.hpp"

using namespace bielik;

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_embedding: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("device: %s\n", describe_device().c_str());
  double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("copy bandwidth (1 GiB D2D, read+write): %.0f GB/s\n", copy_gbs);

  const int C = 1536, V = 32000, kRotations = 8;
  DeviceBuffer<uint16_t> table(random_bf16(size_t(V) * C, 1));
  BenchTable results("embedding", {"version", "T", "isolated (us)", "GB/s", "% of copy BW", "% of same-size memcpy",
                                   "back-to-back (us)", "GB/s", "% of copy BW"});
  // The sizes between 1 and 4096 say where v3 starts to beat v2 (embedding_forward
  // switches from v2 to v3 above 512 rows).
  for (int T : {1, 64, 256, 512, 1024, 2048, 4096, 32768}) {
    std::vector<DeviceBuffer<int32_t>> ids;
    std::vector<DeviceBuffer<uint16_t>> outs;
    for (int r = 0; r < kRotations; ++r) {
      ids.emplace_back(random_ints(T, 2 + r, 0, V - 1));
      outs.emplace_back(size_t(T) * C);
    }
    DeviceBuffer<uint16_t> copy_source(size_t(T) * C);
    double bytes = 4.0 * T * C;
    BenchTiming memcpy_time = time_gpu([&] {
      CUDA_CHECK(cudaMemcpyAsync(outs[0].data(), copy_source.data(), outs[0].bytes(), cudaMemcpyDeviceToDevice));
    });
    auto bf16 = [](uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); };
    for (const EmbeddingVersion& version : kEmbeddingVersions) {
      auto launch = [&](int r) {
        version.launch(bf16(outs[r].data()), reinterpret_cast<const __nv_bfloat16*>(table.data()), ids[r].data(), T, C,
                       V, nullptr, 0);
      };
      BenchTiming isolated = time_gpu([&] { launch(0); });
      BenchTiming batched = time_gpu_back_to_back(launch, kRotations);
      double gbs = gb_per_s(bytes, isolated.median_ms), batched_gbs = gb_per_s(bytes, batched.median_ms);
      results.add_row({version.name, std::to_string(T), fmt(isolated.median_ms * 1e3, 1), fmt(gbs, 0),
                       fmt(100 * gbs / copy_gbs, 1), fmt(100 * memcpy_time.median_ms / isolated.median_ms, 1),
                       fmt(batched.median_ms * 1e3, 1), fmt(batched_gbs, 0), fmt(100 * batched_gbs / copy_gbs, 1)});
    }
    double memcpy_gbs = gb_per_s(bytes, memcpy_time.median_ms);
    results.add_row({"cudaMemcpy (same bytes)", std::to_string(T), fmt(memcpy_time.median_ms * 1e3, 1),
                     fmt(memcpy_gbs, 0), fmt(100 * memcpy_gbs / copy_gbs, 1), "100.0", "", "", ""});
  }
  results.print();
  return 0;
}
