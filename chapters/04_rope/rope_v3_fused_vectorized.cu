// v3: one block per token, q and k in one launch, 16-byte accesses.
//
// What changed from v2:
//  * 16-byte loads and stores. A thread owns 8 consecutive pairs: one int4 (8 x bf16)
//    from the first half of the head and its partner int4 from the second half, so a
//    pair costs a quarter of an instruction instead of two 2-byte loads.
//  * cos/sin are loaded once per thread and reused for every head of the token. The
//    threads of a block are laid out as (head slot, chunk): the D/16 threads of a slot
//    cover one head, and a thread keeps the same chunk (the same 8 angles) for all the
//    heads it visits. Bielik: D/16 = 8 threads per head, 14 heads, 112 threads.
//  * q and k in one launch: the block walks heads 0..H-1 of q, then 0..Hkv-1 of k. At
//    decode (T = 1) the whole op is one launch instead of two, which is what matters
//    when the data is 3.5 KB and the cost is launch latency.
// Requirements: D % 16 == 0 (8 pairs per thread and 16-byte aligned halves) and
// 16-byte aligned q and k. Llama-family head_dims (64, 128) satisfy it.
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "rope.cuh"
#include "rope_rotate.cuh"

namespace bielik {

__global__ void rope_v3_fused_vectorized_kernel(__nv_bfloat16* q,          // (T, H, D)
                                                __nv_bfloat16* k,          // (T, Hkv, D)
                                                const int32_t* positions,  // (T)
                                                const float* cos_table,    // (max_positions, D/2)
                                                const float* sin_table,    // (max_positions, D/2)
                                                int H, int Hkv, int D, int max_positions) {
  const int t = blockIdx.x;
  const int half = D / 2;
  const int chunks = half / 8;  // threads per head
  const int chunk = threadIdx.x % chunks;
  const int slots = blockDim.x / chunks;
  const int pos = positions[t];
  const bool valid = pos >= 0 && pos < max_positions;

  float c[8], s[8];
  if (valid) {
    const float4* cos_row = reinterpret_cast<const float4*>(cos_table + size_t(pos) * half + chunk * 8);
    const float4* sin_row = reinterpret_cast<const float4*>(sin_table + size_t(pos) * half + chunk * 8);
    float4 c0 = __ldg(cos_row), c1 = __ldg(cos_row + 1), s0 = __ldg(sin_row), s1 = __ldg(sin_row + 1);
    c[0] = c0.x, c[1] = c0.y, c[2] = c0.z, c[3] = c0.w, c[4] = c1.x, c[5] = c1.y, c[6] = c1.z, c[7] = c1.w;
    s[0] = s0.x, s[1] = s0.y, s[2] = s0.z, s[3] = s0.w, s[4] = s1.x, s[5] = s1.y, s[6] = s1.z, s[7] = s1.w;
  } else {  // upstream bug: NaN rows instead of reading past the table
    for (int j = 0; j < 8; ++j) c[j] = s[j] = NAN;
  }

  for (int head = threadIdx.x / chunks; head < H + Hkv; head += slots) {
    __nv_bfloat16* x = head < H ? q + (size_t(t) * H + head) * D : k + (size_t(t) * Hkv + (head - H)) * D;
    int4* first = reinterpret_cast<int4*>(x + chunk * 8);          // x[i],       i = 8*chunk .. +7
    int4* second = reinterpret_cast<int4*>(x + half + chunk * 8);  // x[i + D/2]
    int4 a = *first, b = *second;
    __nv_bfloat162* a2 = reinterpret_cast<__nv_bfloat162*>(&a);
    __nv_bfloat162* b2 = reinterpret_cast<__nv_bfloat162*>(&b);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 x1 = __bfloat1622float2(a2[j]), x2 = __bfloat1622float2(b2[j]);
      float cx = c[2 * j], cy = c[2 * j + 1], sx = s[2 * j], sy = s[2 * j + 1];
      // rope_rotate.cuh: no FMA, so every kernel that rotates this pair gets these bits
      a2[j] = __floats2bfloat162_rn(rope_rotate_first(x1.x, x2.x, cx, sx), rope_rotate_first(x1.y, x2.y, cy, sy));
      b2[j] = __floats2bfloat162_rn(rope_rotate_second(x1.x, x2.x, cx, sx), rope_rotate_second(x1.y, x2.y, cy, sy));
    }
    *first = a;
    *second = b;
  }
}

void rope_v3_fused_vectorized(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* positions, int T, int H,
                              int Hkv, const RopeTable& table, cudaStream_t stream) {
  rope_check_sizes("rope_v3_fused_vectorized", T, H, Hkv);
  if (table.D <= 0 || table.cos.size() == 0) throw std::invalid_argument("rope_v3_fused_vectorized: table not built");
  if (table.D % 16 != 0) {
    throw std::invalid_argument("rope_v3_fused_vectorized: needs D % 16 == 0, got D = " + std::to_string(table.D));
  }
  if (reinterpret_cast<uintptr_t>(q) % 16 != 0 || reinterpret_cast<uintptr_t>(k) % 16 != 0) {
    throw std::invalid_argument("rope_v3_fused_vectorized: q and k must be 16-byte aligned");
  }
  if (T == 0 || H + Hkv == 0) return;
  int chunks = table.D / 16;
  int slots = H + Hkv;
  if (slots * chunks > 1024) slots = 1024 / chunks;  // more heads than a block: threads loop
  rope_v3_fused_vectorized_kernel<<<T, slots * chunks, 0, stream>>>(q, k, positions, table.cos.data(),
                                                                     table.sin.data(), H, Hkv, table.D,
                                                                     table.max_positions);
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
