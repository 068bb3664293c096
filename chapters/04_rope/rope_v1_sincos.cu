// v1: one thread per rotation pair, angles computed in the kernel.
//
// The direct translation of the formula: thread (t, h, i) reads x[i] and x[i + D/2] of
// one head, computes inv_freq = theta^(-2i/D) and the angle pos * inv_freq, calls
// sincosf and writes the rotated pair back. q and k are two launches of the same kernel.
//
// Precision: this is HF's recipe, float32 inv_freq and a float32 product. An angle near
// 8191 rad has a float spacing of 2^-10, so the fastest pair (i = 0) is off by up to
// ~5e-4 rad at the end of Bielik's context; sincosf itself is accurate (we do not
// build with --use_fast_math, whose __sinf loses all accuracy at large arguments).
//
// Cost: a powf and a sincosf per pair, recomputed for every head of the same token
// (H + Hkv = 14 times for Bielik). RoPE is memory-bound, but not by much: this is
// enough arithmetic to show up in the benchmark. v2 moves it into a table.
#include <cmath>
#include <stdexcept>

#include "cuda_check.cuh"
#include "rope.cuh"
#include "rope_rotate.cuh"

namespace bielik {

__global__ void rope_v1_sincos_kernel(__nv_bfloat16* x,         // (T, heads, D)
                                      const int32_t* positions,  // (T)
                                      int T, int heads, int D, float theta, int max_positions) {
  int half = D / 2;
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (index >= size_t(T) * heads * half) return;
  int i = int(index % half);
  size_t row = index / half;  // t * heads + h
  int t = int(row / heads);
  __nv_bfloat16* head = x + row * D;
  int pos = positions[t];
  if (pos < 0 || pos >= max_positions) {  // upstream bug: make it loud, never silent
    head[i] = head[i + half] = __float2bfloat16(NAN);
    return;
  }
  float inv_freq = 1.0f / powf(theta, float(2 * i) / float(D));
  float s, c;
  sincosf(float(pos) * inv_freq, &s, &c);
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
  rope_v1_sincos_kernel<<<blocks, threads, 0, stream>>>(x, positions, T, heads, table.D, table.theta,
                                                         table.max_positions);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void rope_v1_sincos(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* positions, int T, int H, int Hkv,
                    const RopeTable& table, cudaStream_t stream) {
  rope_check_sizes("rope_v1_sincos", T, H, Hkv);
  if (table.D <= 0 || table.D % 2 != 0) throw std::invalid_argument("rope_v1_sincos: table not built");
  launch_one(q, positions, T, H, table, stream);
  launch_one(k, positions, T, Hkv, table, stream);
}

}  // namespace bielik
