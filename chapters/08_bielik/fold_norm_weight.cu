// fold_norm_weight_into_columns: see fold_norm_weight.cuh for why.
#include "fold_norm_weight.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"

namespace bielik {

namespace {

// One thread an element, a grid-stride loop: it runs once per layer at load time, so
// simple is enough (Bielik's QKV: 3.1 M weights a layer).
__global__ void fold_norm_weight_kernel(__nv_bfloat16* W, const __nv_bfloat16* g, size_t elements, int cols) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < elements; i += size_t(gridDim.x) * blockDim.x) {
    W[i] = __float2bfloat16(__bfloat162float(W[i]) * __bfloat162float(g[i % size_t(cols)]));
  }
}

}  // namespace

void fold_norm_weight_into_columns(__nv_bfloat16* W, const __nv_bfloat16* g, int rows, int cols,
                                   cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || !W || !g) {
    throw std::invalid_argument("fold_norm_weight_into_columns: needs rows, cols > 0 and both pointers; got " +
                                std::to_string(rows) + " x " + std::to_string(cols));
  }
  const size_t elements = size_t(rows) * size_t(cols);
  constexpr int kThreads = 256;
  const int blocks = int(std::min<size_t>((elements + kThreads - 1) / kThreads, 4096));
  fold_norm_weight_kernel<<<blocks, kThreads, 0, stream>>>(W, g, elements, cols);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace bielik
