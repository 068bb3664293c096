// bench_weight_stream: how fast can the bulk-copy ring of weight_stream.cuh stream
// bytes from HBM at all, with no math? The ceiling of every kernel built on it
// (chapter 08's bulk-stream GEMV and its streamed persistent decode step).
//
// Each block streams its own contiguous 1/grid of a 1 GiB buffer through a ring of
// `depth` slots of `stage` bytes: wait for the slot, touch one float per thread,
// __syncthreads, refill (the ring protocol of weight_stream.cuh, minus the GEMV).
// Swept: blocks per SM, stage bytes, ring depth, and the wait (mbarrier.try_wait, which
// may suspend the thread, or test_wait polling). Compared with the device-to-device copy
// bandwidth measured in the same run (bytes read + written) and with a plain kernel of
// 16-byte register loads over the same buffer.
//
// A second table asks how much of HBM's bandwidth one SM can draw: the register loads
// from 8 to all SMs, one block an SM, with 32 KB to 256 KB of loads in flight an SM. A
// kernel that streams from fewer SMs than the GPU has (a block per 16 rows of a small
// grid, a persistent kernel that leaves SMs to others) is capped by that rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "matmul_common.cuh"
#include "weight_stream.cuh"

using namespace bielik;

namespace {

constexpr int kThreads = 256;
constexpr int kBarrierBytes = 256;

// kDot: the consumer of a GEMV instead of a touch: every thread dots its 16-byte vectors
// of the stage with an input vector in shared memory, then a warp sum and a partial per
// warp (decode_step_streamed.cu's work per stage, without the epilogue).
__device__ __forceinline__ float dot_8_bf16(uint4 w, uint4 x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(ws[i] << 16), __uint_as_float(xs[i] << 16), acc);
    acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), __uint_as_float(xs[i] & 0xffff0000u), acc);
  }
  return acc;
}

template <bool kPolling, bool kDot>
__global__ void __launch_bounds__(kThreads) stream_only_kernel(const unsigned char* source, size_t bytes_per_block,
                                                               int stage_bytes, int depth, float* sink) {
  extern __shared__ __align__(128) unsigned char shared[];
  __shared__ uint4 x_shared[192];  // a K = 1536 input vector
  __shared__ float partial[kThreads / 32];
  if (threadIdx.x < 192) x_shared[threadIdx.x] = make_uint4(threadIdx.x, 0, 0, 0);
  const unsigned char* base = source + blockIdx.x * bytes_per_block;
  WeightStream ring;
  ring.init(shared + kBarrierBytes, reinterpret_cast<uint64_t*>(shared), depth, stage_bytes,
            int(bytes_per_block / stage_bytes));
  auto fetch = [&](int s, unsigned char* slot, uint64_t* barrier) {
    expect_bytes(barrier, uint32_t(stage_bytes));
    copy_async_bulk(slot, base + size_t(s) * stage_bytes, uint32_t(stage_bytes), barrier);
  };
  ring.prefill(fetch);
  __syncthreads();
  float acc = 0.0f;
  for (int s = 0; s < ring.total; ++s) {
    if (kPolling) {
      ring.wait_polling(s);
    } else {
      ring.wait(s);
    }
    if (kDot) {
      const uint4* slot = reinterpret_cast<const uint4*>(ring.stage(s));
      float dot = 0.0f;
      for (int v = threadIdx.x; v < stage_bytes / 16; v += kThreads) dot = dot_8_bf16(slot[v], x_shared[v % 192], dot);
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = dot;
    } else {
      acc += reinterpret_cast<const float*>(ring.stage(s))[threadIdx.x];
    }
    __syncthreads();
    if (kDot && threadIdx.x == 0) acc += partial[0];
    ring.refill(s, fetch);
  }
  if (acc == 1234.5f) *sink = acc;  // never true for the zero buffer: keeps the reads alive
}

// The register-load reference: grid-stride 16-byte loads, kLoads in flight per thread.
template <int kLoads>
__global__ void __launch_bounds__(1024) register_loads_kernel(const uint4* source, size_t vectors, float* sink) {
  float acc = 0.0f;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += kLoads * stride) {
    uint4 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      v[u] = i + u * stride < vectors ? __ldg(source + i + u * stride) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) acc += __uint_as_float(v[u].x);
  }
  if (acc == 1234.5f) *sink = acc;
}

// The register loads from `blocks` blocks of `threads` threads, kLoads loads each, every
// block asking for `shared` bytes of shared memory that it does not use (120 KB: one
// block an SM, and an L1 of what the SM's 256 KB leave).
template <int kLoads>
double register_stream_gbs(const DeviceBuffer<unsigned char>& source, size_t bytes, int blocks, int threads,
                           int shared, float* sink) {
  static const bool allowed = [] {
    CUDA_CHECK(cudaFuncSetAttribute(register_loads_kernel<kLoads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    160 * 1024));
    return true;
  }();
  (void)allowed;
  const BenchTiming t = time_gpu([&] {
    register_loads_kernel<kLoads><<<blocks, threads, shared>>>(reinterpret_cast<const uint4*>(source.data()),
                                                               bytes / 16, sink);
  });
  CUDA_CHECK(cudaGetLastError());
  return gb_per_s(double(bytes), t.median_ms);
}

}  // namespace

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_weight_stream: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  if (!weight_stream_supported()) {
    std::printf("bench_weight_stream: needs sm_90 (bulk copies)\n");
    return 0;
  }
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer<unsigned char> source(bytes);
  source.fill_bytes(0);
  DeviceBuffer<float> sink(1);
  const int sms = multiprocessor_count();
  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("bench_weight_stream: %s, copy bandwidth %.0f GB/s, streaming %zu MiB\n", describe_device().c_str(),
              copy_gbs, bytes >> 20);

  BenchTable table("weight_stream_ceiling",
                   {"blocks/SM", "stage KB", "ring slots", "KB in flight/SM", "wait", "GB/s", "% of copy BW"});
  {
    const BenchTiming t = time_gpu([&] {
      register_loads_kernel<8><<<sms * 4, kThreads>>>(reinterpret_cast<const uint4*>(source.data()), bytes / 16,
                                                   sink.data());
    });
    const double gbs = gb_per_s(double(bytes), t.median_ms);
    table.add_row({"4", "-", "-", "128", "register loads (8 x 16 B per thread)", fmt(gbs, 0),
                   fmt(100.0 * gbs / copy_gbs, 1)});
  }
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  for (int blocks_per_sm : {1, 2, 3}) {
    for (int stage_kb : {4, 16, 32}) {
      for (int depth : {2, 4, 6}) {
        const size_t shared = kBarrierBytes + size_t(depth) * stage_kb * 1024;
        if (shared * blocks_per_sm > 220 * 1024 || shared > size_t(optin)) continue;
        const int blocks = sms * blocks_per_sm;
        const int stage = stage_kb * 1024;
        const size_t per_block = bytes / blocks / stage * stage;
        for (int mode : {0, 1, 2}) {  // try_wait, polling, try_wait + the GEMV's dot products
          if (mode == 2 && (blocks_per_sm != 1 || stage_kb < 16)) continue;
          auto kernel = mode == 0 ? stream_only_kernel<false, false>
                                  : mode == 1 ? stream_only_kernel<true, false> : stream_only_kernel<false, true>;
          CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
          const BenchTiming t = time_gpu([&] {
            kernel<<<blocks, kThreads, shared>>>(source.data(), per_block, stage, depth, sink.data());
          });
          CUDA_CHECK(cudaGetLastError());
          const double gbs = gb_per_s(double(per_block) * blocks, t.median_ms);
          table.add_row({std::to_string(blocks_per_sm), std::to_string(stage_kb), std::to_string(depth),
                         std::to_string(blocks_per_sm * depth * stage_kb), mode == 0 ? "try_wait" : mode == 1 ? "test_wait poll" : "try_wait, dot products",
                         fmt(gbs, 0), fmt(100.0 * gbs / copy_gbs, 1)});
        }
      }
    }
  }
  table.print();

  // The register loads from fewer SMs: GB/s an SM, against the loads in flight an SM.
  BenchTable per_sm("sm_stream_rate", {"SMs", "threads/SM", "16 B loads in flight/thread", "KB in flight/SM",
                                       "GB/s", "GB/s per SM", "% of copy BW"});
  const size_t sm_bytes = size_t(256) << 20;  // 256 MiB: 4x the L2, and short enough from 8 SMs
  for (int used : {8, 33, 66, 99, sms}) {
    for (int threads : {256, 1024}) {
      for (int loads : {2, 8, 16}) {
        if (threads == 256 && loads == 2) continue;
        constexpr int kOneBlockPerSm = 120 * 1024;
        float* out = sink.data();
        const double gbs = loads == 2   ? register_stream_gbs<2>(source, sm_bytes, used, threads, kOneBlockPerSm, out)
                           : loads == 8 ? register_stream_gbs<8>(source, sm_bytes, used, threads, kOneBlockPerSm, out)
                                        : register_stream_gbs<16>(source, sm_bytes, used, threads, kOneBlockPerSm, out);
        per_sm.add_row({std::to_string(used), std::to_string(threads), std::to_string(loads),
                        std::to_string(threads * loads * 16 / 1024), fmt(gbs, 0), fmt(gbs / used, 1),
                        fmt(100.0 * gbs / copy_gbs, 1)});
      }
    }
  }
  per_sm.print();

  // The same 128 KB in flight an SM, in one block or four, with and without shared
  // memory taken from the L1: does the split of the SM's 256 KB matter to a stream?
  BenchTable carveout("stream_rate_by_block_shape", {"blocks/SM", "threads/block", "shared KB/block (unused)",
                                                     "GB/s", "% of copy BW"});
  for (const auto& [per_sm_blocks, threads, shared_kb] :
       {std::tuple{1, 1024, 0}, std::tuple{1, 1024, 120}, std::tuple{2, 512, 0}, std::tuple{2, 512, 80},
        std::tuple{4, 256, 0}, std::tuple{4, 256, 40}}) {
    const double gbs = register_stream_gbs<8>(source, sm_bytes, sms * per_sm_blocks, threads, shared_kb * 1024,
                                              sink.data());
    carveout.add_row({std::to_string(per_sm_blocks), std::to_string(threads), std::to_string(shared_kb), fmt(gbs, 0),
                      fmt(100.0 * gbs / copy_gbs, 1)});
  }
  carveout.print();
  return 0;
}
