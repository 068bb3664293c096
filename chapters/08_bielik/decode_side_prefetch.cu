/// @file decode_side_prefetch.cu
/// @brief The side stream's L2 prefetch kernel (decode_side_prefetch.cuh says why).
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_device.cuh"  // load_streaming, xor_of_grid_share
#include "decode_side_prefetch.cuh"

namespace bielik {
namespace {

constexpr int kPrefetchThreads = 256;

__device__ __forceinline__ void prefetch_line(const char* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p) : "memory");
}

// One request for `bytes` contiguous bytes, carried out by the bulk-copy engine; no
// register or shared memory receives them (sm_90; a no-op where it does not exist).
__device__ __forceinline__ void prefetch_bulk(const char* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

__global__ void __launch_bounds__(kPrefetchThreads) l2_prefetch_kernel(L2PrefetchPlan plan) {
  const size_t thread = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = size_t(gridDim.x) * blockDim.x;
  for (int r = 0; r < plan.count; ++r) {
    const char* begin = static_cast<const char*>(plan.range[r].begin);
    const size_t bytes = plan.range[r].bytes;
    if (plan.form == L2PrefetchForm::kLoads) {
      // The values go into a checksum stored when a pointer known only at run time is
      // set: without that use ptxas would drop the loads (the first form of this kernel
      // lost all of them so, DECODE_LOG.md, twenty-first session).
      const unsigned mix = decode_device::xor_of_grid_share(reinterpret_cast<const uint4*>(begin),
                                                            bytes / sizeof(uint4), thread, threads);
      if (plan.checksum != nullptr) atomicXor(plan.checksum, mix);
    } else if (plan.form == L2PrefetchForm::kBulk) {
      const size_t chunks = (bytes + kL2BulkPrefetchChunk - 1) / kL2BulkPrefetchChunk;
      for (size_t c = thread; c < chunks; c += threads) {
        const size_t offset = c * kL2BulkPrefetchChunk;
        const size_t left = bytes - offset;
        prefetch_bulk(begin + offset, unsigned(left < kL2BulkPrefetchChunk ? left : kL2BulkPrefetchChunk));
      }
    } else {
      // Strides from the one holding `begin` to the one holding the last byte.
      const size_t stride = size_t(plan.stride_bytes);
      const size_t first = reinterpret_cast<size_t>(begin) / stride;
      const size_t last = (reinterpret_cast<size_t>(begin) + bytes - 1) / stride;
      for (size_t at = first + thread; at <= last && bytes > 0; at += threads) {
        prefetch_line(reinterpret_cast<const char*>(at * stride));
      }
    }
  }
}

}  // namespace

void l2_prefetch(const L2PrefetchPlan& plan, int blocks, cudaStream_t stream) {
  if (plan.stride_bytes != 32 && plan.stride_bytes != 64 && plan.stride_bytes != 128) {
    throw std::invalid_argument("l2_prefetch: stride_bytes must be 32, 64 or 128; got " +
                                std::to_string(plan.stride_bytes));
  }
  if (plan.count < 0 || plan.count > kMaxL2PrefetchRanges || blocks < 1) {
    throw std::invalid_argument("l2_prefetch: 0.." + std::to_string(kMaxL2PrefetchRanges) +
                                " ranges and at least one block; got " + std::to_string(plan.count) + " ranges, " +
                                std::to_string(blocks) + " blocks");
  }
  for (int r = 0; r < plan.count; ++r) {
    const L2PrefetchRange& range = plan.range[r];
    const bool aligned = reinterpret_cast<size_t>(range.begin) % 16 == 0 && range.bytes % 16 == 0;
    if (range.begin == nullptr || (plan.form != L2PrefetchForm::kLines && !aligned)) {
      throw std::invalid_argument("l2_prefetch: range " + std::to_string(r) +
                                  " is null or, for the bulk and load forms, not 16-byte aligned in start and size");
    }
  }
  if (plan.count == 0) return;
  l2_prefetch_kernel<<<blocks, kPrefetchThreads, 0, stream>>>(plan);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace bielik
