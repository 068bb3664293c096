// Chapter 02 benchmark: every RMSNorm version and the fused residual add + RMSNorm at
// Bielik's hidden size C = 1536, in GB/s against the device-to-device copy bandwidth
// measured in the same run and against a cudaMemcpy that moves the same bytes.
//
// Napkin math: RMSNorm reads x (T*C*2 bytes) and writes y (T*C*2 bytes); the weight
// (C*2 bytes) is noise. bytes = 4*T*C. At T = 4096 that is 25.2 MB, about 6 us at
// 4.2 TB/s: short enough that launch latency shows, so, as in chapter 01, each version
// is timed two ways:
//   isolated      one launch between CUDA events, L2 flushed before it;
//   back-to-back  8 launches queued together (as inside the model's forward pass), each
//                 on its own buffers so the 8 x 25 MB touched exceed the L2;
// and a cudaMemcpy of exactly the same bytes is the best any copy of that size can do.
//
// The fused op reads residual and x and writes residual and y: bytes = 8*T*C, against
// a cudaMemcpy of 2*T*C bf16 values (the same bytes read and written). The "add + v3"
// rows time what the fused kernel replaces: a separate residual-add kernel (defined
// here, used nowhere else) followed by v3; its GB/s counts the same 8*T*C useful bytes,
// so the columns compare directly. Repeating the fused op only grows the residual
// values, which does not change the memory traffic being timed.
// T = 1 is one decode step; T = 32768 shows the kernels once launch cost is amortized.
#include <cstdio>
#include <string>
#include <vector>

#include "bench.cuh"
#include "device_buffer.cuh"
#include "rmsnorm.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

__nv_bfloat16* as_bf16(uint16_t* bits) { return reinterpret_cast<__nv_bfloat16*>(bits); }

// The unfused baseline's first kernel: residual = bf16(residual + x), 8 values a thread.
// Needs count % 8 == 0 and 16-byte aligned pointers (true for C = 1536 and cudaMalloc).
__global__ void residual_add_kernel(__nv_bfloat16* residual, const __nv_bfloat16* x, size_t vectors) {
  size_t v = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (v >= vectors) return;
  int4 r = reinterpret_cast<int4*>(residual)[v], a = __ldg(&reinterpret_cast<const int4*>(x)[v]);
  __nv_bfloat162* r_pairs = reinterpret_cast<__nv_bfloat162*>(&r);
  const __nv_bfloat162* a_pairs = reinterpret_cast<const __nv_bfloat162*>(&a);
  for (int k = 0; k < 4; ++k) r_pairs[k] = __hadd2(r_pairs[k], a_pairs[k]);  // bf16 add, rounded once
  reinterpret_cast<int4*>(residual)[v] = r;
}

void residual_add_then_v3(__nv_bfloat16* y, __nv_bfloat16* residual, const __nv_bfloat16* x,
                          const __nv_bfloat16* weight, int T, int C, float eps) {
  size_t vectors = size_t(T) * C / 8;
  residual_add_kernel<<<unsigned((vectors + 255) / 256), 256>>>(residual, x, vectors);
  CUDA_CHECK_LAUNCH();
  rmsnorm_v3_warp_vectorized(y, residual, weight, T, C, eps);
}

}  // namespace

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_rmsnorm: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("device: %s\n", describe_device().c_str());
  double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("copy bandwidth (1 GiB D2D, read+write): %.0f GB/s\n", copy_gbs);

  const int C = 1536, kRotations = 8;
  const float eps = 1e-6f;
  DeviceBuffer<uint16_t> weight(random_bf16(C, 1));
  const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(weight.data());
  BenchTable results("rmsnorm", {"version", "T", "isolated (us)", "GB/s", "% of copy BW", "% of same-size memcpy",
                                 "back-to-back (us)", "GB/s", "% of copy BW"});

  for (int T : {1, 512, 4096, 32768}) {
    size_t count = size_t(T) * C;
    std::vector<uint16_t> x_host = random_bf16(count, 2), residual_host = random_bf16(count, 3);
    std::vector<DeviceBuffer<uint16_t>> xs, residuals, ys;  // one set per rotation
    for (int r = 0; r < kRotations; ++r) {
      xs.emplace_back(x_host);
      residuals.emplace_back(residual_host);
      ys.emplace_back(count);
    }
    DeviceBuffer<uint16_t> copy_source(2 * count), copy_destination(2 * count);

    // One row per timed op: isolated and back-to-back, against a memcpy of `bytes`.
    auto measure = [&](const std::string& name, double bytes, double memcpy_ms, const std::function<void(int)>& launch) {
      BenchTiming isolated = time_gpu([&] { launch(0); });
      BenchTiming batched = time_gpu_back_to_back(launch, kRotations);
      double gbs = gb_per_s(bytes, isolated.median_ms), batched_gbs = gb_per_s(bytes, batched.median_ms);
      results.add_row({name, std::to_string(T), fmt(isolated.median_ms * 1e3, 1), fmt(gbs, 0),
                       fmt(100 * gbs / copy_gbs, 1), fmt(100 * memcpy_ms / isolated.median_ms, 1),
                       fmt(batched.median_ms * 1e3, 1), fmt(batched_gbs, 0), fmt(100 * batched_gbs / copy_gbs, 1)});
    };
    auto memcpy_row = [&](const std::string& name, double bytes, double memcpy_ms) {
      double gbs = gb_per_s(bytes, memcpy_ms);
      results.add_row({name, std::to_string(T), fmt(memcpy_ms * 1e3, 1), fmt(gbs, 0), fmt(100 * gbs / copy_gbs, 1),
                       "100.0", "", "", ""});
    };

    double bytes = 4.0 * double(count);
    double memcpy_ms = time_gpu([&] {
      CUDA_CHECK(cudaMemcpyAsync(copy_destination.data(), copy_source.data(), count * 2, cudaMemcpyDeviceToDevice));
    }).median_ms;
    for (const RmsnormVersion& version : kRmsnormVersions) {
      measure(version.name, bytes, memcpy_ms,
              [&](int r) { version.launch(as_bf16(ys[r].data()), as_bf16(xs[r].data()), w, T, C, eps, 0); });
    }
    memcpy_row("cudaMemcpy (same bytes)", bytes, memcpy_ms);

    double fused_bytes = 8.0 * double(count);
    double fused_memcpy_ms = time_gpu([&] {
      CUDA_CHECK(cudaMemcpyAsync(copy_destination.data(), copy_source.data(), copy_source.bytes(),
                                 cudaMemcpyDeviceToDevice));
    }).median_ms;
    for (const FusedResidualRmsnormVersion& version : kFusedResidualRmsnormVersions) {
      measure(std::string(version.name) + " (fused)", fused_bytes, fused_memcpy_ms, [&](int r) {
        version.launch(as_bf16(ys[r].data()), as_bf16(residuals[r].data()), as_bf16(xs[r].data()), w, T, C, eps, 0);
      });
    }
    measure("add + v3 (unfused, 2 kernels)", fused_bytes, fused_memcpy_ms, [&](int r) {
      residual_add_then_v3(as_bf16(ys[r].data()), as_bf16(residuals[r].data()), as_bf16(xs[r].data()), w, T, C, eps);
    });
    memcpy_row("cudaMemcpy (fused bytes)", fused_bytes, fused_memcpy_ms);
  }
  results.print();
  return 0;
}
