// v2: the same thread-per-pair mapping as v1, with cos/sin read from the table.
//
// What changed from v1: no powf and no sincosf in the kernel. The angles depend only
// on (position, i), not on the head, so computing them in the kernel redid the same
// work H + Hkv times per token; the table (rope_table.cu) computes each one once, in
// float64, at load time. The table read is 8 bytes per pair and hits L1/L2 after the
// first head of a token, so the kernel is left with what RoPE fundamentally is: read
// 4 bytes, write 4 bytes per pair. It is also more accurate than v1 at large positions.
//
// What did not change: 2-byte accesses, and q and k are still two launches. v3 fixes both.
#include <cmath>
#include <stdexcept>

#include "cuda_check.cuh"
#include "rope.cuh"
#include "rope_rotate.cuh"

namespace bielik {

__global__ void rope_v2_table_kernel(__nv_bfloat16* x,          // (T, heads, D)
                                     const int32_t* positions,  // (T)
                                     const float* cos_table,    // (max_positions, D/2)
                                     const float* sin_table,    // (max_positions, D/2)
                                     int T, int heads, int D, int max_positions) {
  int half = D / 2;
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (index >= size_t(T) * heads * half) return;
  int i = int(index % half);
  size_t row = index / half;  // t * heads + h
  int t = int(row / heads);
  __nv_bfloat16* head = x + row * D;
  int pos = positions[t];
  if (pos < 0 || pos >= max_positions) {  // upstream bug: make it loud, never read past the table
    head[i] = head[i + half] = __float2bfloat16(NAN);
    return;
  }
  float c = cos_table[size_t(pos) * half + i], s = sin_table[size_t(pos) * half + i];
  float x1 = __bfloat162float(head[i]), x2 = __bfloat162float(head[i + half]);
  head[i] = __float2bfloat16(rope_rotate_first(x1, x2, c, s));  // no FMA: rope_rotate.cuh
  head[i + half] = __float2bfloat16(rope_rotate_second(x1, x2, c, s));
}

namespace {
void launch_one(__nv_bfloat16* x, const int32_t* positions, int T, int heads, const RopeTable& table,
                cudaStream_t stream) {
  size_t pairs = size_t(T) * heads * (table.D / 2);
  if (pairs == 0) return;
  int threads = 256;
  unsigned blocks = unsigned((pairs + threads - 1) / threads);
  rope_v2_table_kernel<<<blocks, threads, 0, stream>>>(x, positions, table.cos.data(), table.sin.data(), T, heads,
                                                        table.D, table.max_positions);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void rope_v2_table(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* positions, int T, int H, int Hkv,
                   const RopeTable& table, cudaStream_t stream) {
  rope_check_sizes("rope_v2_table", T, H, Hkv);
  if (table.D <= 0 || table.cos.size() == 0) throw std::invalid_argument("rope_v2_table: table not built");
  launch_one(q, positions, T, H, table, stream);
  launch_one(k, positions, T, Hkv, table, stream);
}

}  // namespace bielik
