// The prefill helpers of prefill_kernels.cuh.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_device.cuh"  // unpack_8, pack_8, silu, aligned_16
#include "pdl.cuh"
#include "prefill_kernels.cuh"

namespace bielik {

using namespace decode_device;

namespace {

// One block per token. Work item i < (H + Hkv) * D/16: 8 rotation pairs (dims
// j..j+7 and j + D/2..j + D/2 + 7) of one q or k head; the rest: 8 values of a v head.
// Every item reads 16 + 16 bytes and writes them once or twice (k and v also go to the
// cache): the kernel is one read and ~1.3 writes of the projection, nothing more.
__global__ void __launch_bounds__(128) qkv_rope_append_kernel(
    QkvRopeAppendOut out,
    const uint4* qkv,           // (T, (H + 2 Hkv) D / 8)
    const float* cos_table,     // (max_positions, D/2)
    const float* sin_table,     // (max_positions, D/2)
    int P, int H, int Hkv, int D, int max_positions) {
  pdl_wait();  // with PDL, the QKV GEMM may still be running: everything below reads it
  const int t = blockIdx.x, pos = P + t;
  const int half = D / 2, chunks_per_head = half / 8;  // rotation items per head
  const int rotate_items = (H + Hkv) * chunks_per_head, copy_items = Hkv * D / 8;
  const bool in_table = pos >= 0 && pos < max_positions;
  const bool in_cache = pos >= 0 && pos < out.max_context;
  const uint4* row = qkv + size_t(t) * (H + 2 * Hkv) * D / 8;
  for (int item = threadIdx.x; item < rotate_items + copy_items; item += blockDim.x) {
    if (item < rotate_items) {
      const int head = item / chunks_per_head, chunk = item % chunks_per_head;
      float c[8], s[8];
      if (in_table) {
        const float4* cos_row = reinterpret_cast<const float4*>(cos_table + size_t(pos) * half + chunk * 8);
        const float4* sin_row = reinterpret_cast<const float4*>(sin_table + size_t(pos) * half + chunk * 8);
        const float4 c0 = __ldg(cos_row), c1 = __ldg(cos_row + 1), s0 = __ldg(sin_row), s1 = __ldg(sin_row + 1);
        c[0] = c0.x, c[1] = c0.y, c[2] = c0.z, c[3] = c0.w, c[4] = c1.x, c[5] = c1.y, c[6] = c1.z, c[7] = c1.w;
        s[0] = s0.x, s[1] = s0.y, s[2] = s0.z, s[3] = s0.w, s[4] = s1.x, s[5] = s1.y, s[6] = s1.z, s[7] = s1.w;
      } else {  // upstream bug: NaN rows, as chapter 04 does
        for (int j = 0; j < 8; ++j) c[j] = s[j] = NAN;
      }
      uint4 a = row[(size_t(head) * D) / 8 + chunk], b = row[(size_t(head) * D + half) / 8 + chunk];
      __nv_bfloat162* a2 = reinterpret_cast<__nv_bfloat162*>(&a);
      __nv_bfloat162* b2 = reinterpret_cast<__nv_bfloat162*>(&b);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // chapter 04's rotation, so the same roundings
        const float2 x1 = __bfloat1622float2(a2[j]), x2 = __bfloat1622float2(b2[j]);
        const float cx = c[2 * j], cy = c[2 * j + 1], sx = s[2 * j], sy = s[2 * j + 1];
        a2[j] = __floats2bfloat162_rn(rope_rotate_first(x1.x, x2.x, cx, sx), rope_rotate_first(x1.y, x2.y, cy, sy));
        b2[j] = __floats2bfloat162_rn(rope_rotate_second(x1.x, x2.x, cx, sx), rope_rotate_second(x1.y, x2.y, cy, sy));
      }
      if (head < H) {
        uint4* q = reinterpret_cast<uint4*>(out.q + (size_t(t) * H + head) * D);
        q[chunk] = a;
        q[chunks_per_head + chunk] = b;
      } else {
        const int kv_head = head - H;
        uint4* k = reinterpret_cast<uint4*>(out.k + (size_t(t) * Hkv + kv_head) * D);
        k[chunk] = a;
        k[chunks_per_head + chunk] = b;
        if (in_cache) {
          uint4* cached = reinterpret_cast<uint4*>(out.k_cache + (size_t(kv_head) * out.max_context + pos) * D);
          cached[chunk] = a;
          cached[chunks_per_head + chunk] = b;
        }
      }
    } else {
      const int index = item - rotate_items;  // 8-value vector of the v heads, (Hkv, D/8)
      const int kv_head = index / (D / 8), vector = index % (D / 8);
      const uint4 value = row[size_t(H + Hkv) * D / 8 + index];
      reinterpret_cast<uint4*>(out.v + (size_t(t) * Hkv + kv_head) * D)[vector] = value;
      if (in_cache) {
        reinterpret_cast<uint4*>(out.v_cache + (size_t(kv_head) * out.max_context + pos) * D)[vector] = value;
      }
    }
  }
}

// One thread per 8 values of a row of act, blockIdx.y the token: no division per element.
__global__ void swiglu_rows_kernel(uint4* act,            // (T, F/8)
                                   const uint4* gate_up,  // (T, 2F/8)
                                   int T, int vectors_per_row) {
  pdl_wait();  // with PDL, the gate/up GEMM may still be running
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= vectors_per_row) return;
  for (size_t t = blockIdx.y; t < size_t(T); t += gridDim.y) {  // gridDim.y <= 65535
    float g[8], u[8], result[8];
    unpack_8(g, gate_up[t * 2 * vectors_per_row + c]);
    unpack_8(u, gate_up[t * 2 * vectors_per_row + vectors_per_row + c]);
#pragma unroll
    for (int j = 0; j < 8; ++j) result[j] = silu(g[j]) * u[j];
    act[t * vectors_per_row + c] = pack_8(result);
  }
}

}  // namespace

void qkv_rope_append(const QkvRopeAppendOut& out, const __nv_bfloat16* qkv, int T, int P, int H, int Hkv,
                     const RopeTable& table, cudaStream_t stream, bool pdl) {
  const int D = table.D;
  if (D <= 0 || D % 16 != 0 || table.cos.size() == 0) {
    throw std::invalid_argument("qkv_rope_append: needs a built RoPE table with D % 16 == 0, got D = " +
                                std::to_string(D));
  }
  for (const void* p : {static_cast<const void*>(qkv), static_cast<const void*>(out.q),
                        static_cast<const void*>(out.k), static_cast<const void*>(out.v),
                        static_cast<const void*>(out.k_cache), static_cast<const void*>(out.v_cache)}) {
    if (!p || !aligned_16(p)) throw std::invalid_argument("qkv_rope_append: every pointer must be 16-byte aligned");
  }
  if (T <= 0) return;
  launch_kernel(pdl, qkv_rope_append_kernel, dim3(T), dim3(128), 0, stream, out, reinterpret_cast<const uint4*>(qkv),
                static_cast<const float*>(table.cos.data()), static_cast<const float*>(table.sin.data()), P, H, Hkv, D,
                table.max_positions);
}

void swiglu_rows(__nv_bfloat16* act, const __nv_bfloat16* gate_up, int T, int F, cudaStream_t stream, bool pdl) {
  if (F % 8 != 0 || !aligned_16(act) || !aligned_16(gate_up)) {
    throw std::invalid_argument("swiglu_rows: needs F % 8 == 0 and 16-byte aligned pointers, F=" + std::to_string(F));
  }
  if (T <= 0 || F == 0) return;
  const int vectors = F / 8, threads = 256;
  const dim3 grid((vectors + threads - 1) / threads, unsigned(std::min(T, 65535)));
  launch_kernel(pdl, swiglu_rows_kernel, grid, dim3(threads), 0, stream, reinterpret_cast<uint4*>(act),
                reinterpret_cast<const uint4*>(gate_up), T, vectors);
}

}  // namespace bielik
