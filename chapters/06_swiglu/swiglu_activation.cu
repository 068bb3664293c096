// The activation product h = silu(g) * u as its own elementwise kernel: v1's third
// launch, and the third step of the cuBLASLt baseline in bench_swiglu.
//
// Memory-bound: 6 bytes per element (read g and u, write h) for ~10 flops. Each thread
// handles 8 elements with one 16-byte load of g, one of u and one 16-byte store (a
// grid-stride loop, so any count works with a grid sized to the GPU); a count not
// divisible by 8 or a misaligned pointer takes the scalar loop.
#include <algorithm>
#include <cstdint>

#include "cuda_check.cuh"
#include "matmul_common.cuh"
#include "swiglu.cuh"
#include "swiglu_device.cuh"

namespace bielik {

template <bool Vector>
__global__ void swiglu_activation_kernel(__nv_bfloat16* h,        // (count)
                                         const __nv_bfloat16* g,  // (count)
                                         const __nv_bfloat16* u,  // (count)
                                         size_t count) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (Vector) {
    for (size_t i = first; i < count / 8; i += stride) {
      float gv[8], uv[8];
      unpack_bf16x8(gv, reinterpret_cast<const uint4*>(g)[i]);
      unpack_bf16x8(uv, reinterpret_cast<const uint4*>(u)[i]);
      uint32_t out[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        __nv_bfloat162 pair = __floats2bfloat162_rn(silu(gv[2 * k]) * uv[2 * k], silu(gv[2 * k + 1]) * uv[2 * k + 1]);
        out[k] = uint32_t(__bfloat16_as_ushort(pair.x)) | (uint32_t(__bfloat16_as_ushort(pair.y)) << 16);
      }
      reinterpret_cast<uint4*>(h)[i] = make_uint4(out[0], out[1], out[2], out[3]);
    }
  } else {
    for (size_t i = first; i < count; i += stride) {
      h[i] = __float2bfloat16(silu(__bfloat162float(g[i])) * __bfloat162float(u[i]));
    }
  }
}

void swiglu_activation(__nv_bfloat16* h, const __nv_bfloat16* g, const __nv_bfloat16* u, size_t count,
                       cudaStream_t stream) {
  if (count == 0) return;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool vector = count % 8 == 0 && aligned(h) && aligned(g) && aligned(u);
  size_t items = vector ? count / 8 : count;
  constexpr int kThreads = 256;
  // Enough blocks for ~2048 threads per SM; beyond that the grid-stride loop takes over.
  size_t max_blocks = size_t(multiprocessor_count()) * (2048 / kThreads);
  unsigned blocks = unsigned(std::min(max_blocks, (items + kThreads - 1) / kThreads));
  if (vector) {
    swiglu_activation_kernel<true><<<blocks, kThreads, 0, stream>>>(h, g, u, count);
  } else {
    swiglu_activation_kernel<false><<<blocks, kThreads, 0, stream>>>(h, g, u, count);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
