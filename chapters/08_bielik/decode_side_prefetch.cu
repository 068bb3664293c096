/// @file decode_side_prefetch.cu
/// @brief The side stream's L2 prefetch kernel (decode_side_prefetch.cuh says why).
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
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

__device__ __forceinline__ uint4 load_dropped(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__global__ void __launch_bounds__(kPrefetchThreads) l2_prefetch_kernel(L2PrefetchPlan plan) {
  const size_t thread = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = size_t(gridDim.x) * blockDim.x;
  for (int r = 0; r < plan.count; ++r) {
    const char* begin = static_cast<const char*>(plan.range[r].begin);
    const size_t bytes = plan.range[r].bytes;
    if (plan.form == L2PrefetchForm::kLoads) {
      // Eight 16-byte loads in flight a thread. `volatile` on an asm binds the C++
      // compiler only: ptxas removes a load whose value nothing uses (the first form of
      // this kernel lost all its loads that way, DECODE_LOG.md, twenty-first session).
      // So the values are mixed into a checksum that is stored when a pointer known
      // only at run time is set, which ptxas cannot rule out.
      const uint4* vectors = reinterpret_cast<const uint4*>(begin);
      const size_t count = bytes / sizeof(uint4);
      constexpr int kInFlight = 8;
      unsigned mix = 0;
      size_t i = thread;
      for (; i + (kInFlight - 1) * threads < count; i += kInFlight * threads) {
        uint4 v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) v[u] = load_dropped(vectors + i + u * threads);
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) mix ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
      }
      for (; i < count; i += threads) {
        const uint4 v = load_dropped(vectors + i);
        mix ^= v.x ^ v.y ^ v.z ^ v.w;
      }
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
