// v3: one warp per token row, four 16-byte loads in flight per thread.
//
// What changed from v2: in v2 each thread issues one 16-byte load, waits for it (a
// round trip to HBM, ~1 us), then stores it. At Bielik's T=4096 that leaves too few
// bytes in flight to cover the memory latency. Here a warp owns a row and each lane
// issues up to four independent 16-byte loads before its first store (Little's law:
// bandwidth = bytes in flight / latency, so 4x the bytes in flight per thread). Rows
// of a block are independent, so a block of 8 warps copies 8 rows. Needs C % 8 == 0;
// other C fall back to v2's scalar path.
#include "cuda_check.cuh"
#include "embedding.cuh"
#include "embedding_row.cuh"

namespace bielik {

constexpr int kV3WarpsPerBlock = 8;
constexpr int kV3LoadsInFlight = 4;

__global__ void embedding_v3_warp_per_row_kernel(__nv_bfloat16* out,          // (T, C)
                                                 const __nv_bfloat16* table,  // (V, C)
                                                 const int32_t* token_ids,    // (T)
                                                 int T, int C, int V, int* invalid_id_count) {
  int lane = threadIdx.x % 32;
  int t = blockIdx.x * kV3WarpsPerBlock + threadIdx.x / 32;
  if (t >= T) return;
  int32_t id = token_ids[t];
  bool valid = id >= 0 && id < V;
  if (!valid && lane == 0 && invalid_id_count) atomicAdd(invalid_id_count, 1);

  const int4* source = reinterpret_cast<const int4*>(table + size_t(valid ? id : 0) * C);
  int4* destination = reinterpret_cast<int4*>(out + size_t(t) * C);
  int vectors = C / 8;
  for (int base = lane; base < vectors; base += 32 * kV3LoadsInFlight) {
    int4 chunk[kV3LoadsInFlight];
#pragma unroll
    for (int k = 0; k < kV3LoadsInFlight; ++k) {  // all loads first...
      int v = base + 32 * k;
      chunk[k] = (valid && v < vectors) ? __ldg(&source[v]) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kV3LoadsInFlight; ++k) {  // ...then all stores
      int v = base + 32 * k;
      if (v < vectors) destination[v] = chunk[k];
    }
  }
}

void embedding_v3_warp_per_row(__nv_bfloat16* out, const __nv_bfloat16* table, const int32_t* token_ids, int T,
                               int C, int V, int* invalid_id_count, cudaStream_t stream) {
  if (T == 0 || C == 0) return;
  bool aligned = embedding_rows_vectorizable(out, table, C);
  if (!aligned) {  // the scalar path is v2's; v3 only changes the vector path
    embedding_v2_row_vectorized(out, table, token_ids, T, C, V, invalid_id_count, stream);
    return;
  }
  int blocks = (T + kV3WarpsPerBlock - 1) / kV3WarpsPerBlock;
  embedding_v3_warp_per_row_kernel<<<blocks, 32 * kV3WarpsPerBlock, 0, stream>>>(out, table, token_ids, T, C, V,
                                                                                 invalid_id_count);
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
