/// @file matmul_ptx.cuh
/// @brief The few PTX instructions the tensor-core versions use, each wrapped once.
///
/// Why inline PTX and not WMMA: WMMA hides the fragment layout, so the epilogue could
/// not add the bias to the accumulators in registers, and it offers no cp.async or
/// ldmatrix. These wrappers are the whole vocabulary of v4 (and the loads of v5).
#pragma once

#include <cstdint>

namespace bielik::ptx {

/// Copies 16 bytes global -> shared without passing through registers (sm_80+). With
/// `valid` false it reads nothing and writes 16 zero bytes: that is how the edge tiles
/// get their zero padding (src-size 0 means "fill the destination with zeros").
/// `.cg` caches in L2 only: a tile is used once per block, L1 would only be polluted.
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* global_src, bool valid) {
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(global_src), "r"(src_bytes));
}

/// Closes the group of cp.async issued so far by this thread.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

/// Loads four 8x8 bf16 matrices from shared memory, one 16-byte row address per lane
/// (lanes 0-7 give matrix 0's rows, 8-15 matrix 1's, ...). Lane l receives, in r[i],
/// elements (row l/4, columns 2*(l%4) and 2*(l%4)+1) of matrix i: exactly the register
/// layout the mma instruction wants, so no shuffling is needed.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row_address));
}

/// d += a * b for one 16x8x16 tile on the tensor cores: a is 16x16 bf16 (row-major,
/// 4 registers of 2 values), b is 16x8 bf16 ("col": each column contiguous in k,
/// 2 registers), d is 16x8 fp32 (4 registers: rows l/4 and l/4+8, columns 2*(l%4)+{0,1}).
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// 16 bytes of a stream read once (GEMV weights): from global memory through the
/// non-coherent path, not allocated in L1, so they do not evict what is reused (x).
__device__ __forceinline__ uint4 load_streaming_16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

/// Shared-memory address (what cp.async, ldmatrix and wgmma descriptors take) of a
/// generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace bielik::ptx
