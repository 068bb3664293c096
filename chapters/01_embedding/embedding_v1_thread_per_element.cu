// v1: one thread per output element.
//
// The most direct mapping: thread i computes out[i / C][i % C]. Neighbouring threads
// read neighbouring bf16 values of the same row, so the accesses coalesce, but every
// thread moves only 2 bytes and recomputes the division and the id lookup. That is a
// lot of instructions per byte; v2 fixes it.
#include "cuda_check.cuh"
#include "embedding.cuh"

namespace bielik {

__global__ void embedding_v1_thread_per_element_kernel(__nv_bfloat16* out,              // (T, C)
                                                       const __nv_bfloat16* table,      // (V, C)
                                                       const int32_t* token_ids,        // (T)
                                                       int T, int C, int V, int* invalid_id_count) {
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (index >= size_t(T) * C) return;
  int t = int(index / C), c = int(index % C);
  int32_t id = token_ids[t];
  bool valid = id >= 0 && id < V;
  if (!valid && c == 0 && invalid_id_count) atomicAdd(invalid_id_count, 1);
  out[index] = valid ? table[size_t(id) * C + c] : __float2bfloat16(0.0f);
}

void embedding_v1_thread_per_element(__nv_bfloat16* out, const __nv_bfloat16* table, const int32_t* token_ids,
                                     int T, int C, int V, int* invalid_id_count, cudaStream_t stream) {
  size_t total = size_t(T) * C;
  if (total == 0) return;
  int threads = 256;
  unsigned blocks = unsigned((total + threads - 1) / threads);
  embedding_v1_thread_per_element_kernel<<<blocks, threads, 0, stream>>>(out, table, token_ids, T, C, V,
                                                                         invalid_id_count);
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
