/// @file attention_ptx.cuh
/// @brief The four Ampere-and-later instructions v3 is built on, as inline PTX.
///
/// CUDA C++ has no spelling for them, so each one is a one-line asm wrapper. Register
/// layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"): in a warp, lane = 4*g + t
/// (g = lane / 4 "group", t = lane % 4 "thread in group"):
///   A 16x16 bf16, row-major, 4 x b32:  a0 = A[g][2t..2t+1]     a1 = A[g+8][2t..2t+1]
///                                       a2 = A[g][2t+8..2t+9]   a3 = A[g+8][2t+8..2t+9]
///   B 16x8 bf16, "col" (k fastest), 2 x b32:  b0 = B[2t..2t+1][g]   b1 = B[2t+8..2t+9][g]
///   C/D 16x8 fp32, 4 x f32:            c0,c1 = C[g][2t..2t+1]   c2,c3 = C[g+8][2t..2t+1]
/// In each b32 the lower-indexed element sits in the low 16 bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace bielik::ptx {

/// Asynchronous 16-byte copy global -> shared that bypasses registers (and L1: .cg).
/// With `valid` false it reads nothing and writes 16 zero bytes (src-size 0), which is
/// how tiles past the end of a tensor are zero-filled.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global), "r"(source_bytes));
}

/// Closes the group of cp.async issued since the previous commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most `Pending` committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

/// Loads four 8x8 bf16 matrices from shared memory, one per 8 lanes: lanes 8m..8m+7 give
/// the addresses of the 8 rows (16 bytes each) of matrix m, and register r[m] of lane
/// 4g + t receives row g, columns 2t and 2t+1 of matrix m (the A/B fragment layout).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* shared_row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// Same, transposed: r[m] of lane 4g + t receives rows 2t and 2t+1 of column g.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* shared_row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// d += A(16x16, bf16) * B(16x8, bf16), fp32 accumulation, on the tensor cores.
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// A barrier for part of a block: waits until `threads` threads (a multiple of 32) have
/// arrived at barrier `id` (1..15; 0 is the one __syncthreads uses). Lets one warp group
/// synchronize without waiting for the others.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// Packs two floats into one b32 of bf16 (x in the low half), round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float x, float y) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&pair);
}

}  // namespace bielik::ptx
