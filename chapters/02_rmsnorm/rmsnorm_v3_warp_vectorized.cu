// v3: one warp per row, warp-shuffle reduction, 16-byte loads, the row kept in registers.
//
// What changed from v2, and why each change helps a memory-bound kernel:
// - A row belongs to one warp (4 rows per 128-thread block). The sum of squares is
//   reduced with 5 __shfl_xor_sync rounds inside the warp: no shared memory, no
//   __syncthreads(), and no idle threads waiting at a barrier.
// - Each lane loads 8 bf16 at a time as one int4 (16 bytes), so a warp-wide load moves
//   512 contiguous bytes and the same row needs 8x fewer load instructions than v2.
// - The row stays in registers: for C = 1536 a lane holds 6 vectors (C / 8 / 32), all
//   issued before the first one is used, so 6 loads per lane are in flight at once (the
//   memory-level parallelism a bandwidth-bound kernel lives on). x is read from memory
//   exactly once; the second pass reads registers, not L1.
// - The weight vectors are loaded up front too, so their latency overlaps x's.
// Lanes past the end of a short row (C = 104 is 13 vectors) hold zeros, which add
// nothing to the sum, and store nothing.
//
// Vector access needs C % 8 == 0 (every row then starts on a 16-byte boundary) and
// 16-byte aligned pointers. Otherwise, or for C > 4096 (too many registers), the
// kernel's kVectorsPerLane = 0 form runs: the same warp per row with scalar loads and
// a second pass that re-reads x (from L1/L2). The odd-size tests exercise it.
#include "cuda_check.cuh"
#include "rmsnorm.cuh"
#include "rmsnorm_warp.cuh"

namespace bielik {

using namespace rmsnorm_warp;

template <int kVectorsPerLane>  // 0: scalar two-pass fallback
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize)
    rmsnorm_v3_warp_vectorized_kernel(__nv_bfloat16* y,             // (T, C)
                                      const __nv_bfloat16* x,       // (T, C)
                                      const __nv_bfloat16* weight,  // (C)
                                      int T, int C, float eps) {
  int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  int lane = threadIdx.x % kWarpSize;
  if (t >= T) return;  // the whole warp leaves together, so the shuffles stay full-warp
  const __nv_bfloat16* x_row = x + size_t(t) * C;
  __nv_bfloat16* y_row = y + size_t(t) * C;

  if constexpr (kVectorsPerLane == 0) {
    float sum_squares = 0.0f;
    for (int c = lane; c < C; c += kWarpSize) {
      float value = __bfloat162float(x_row[c]);
      sum_squares += value * value;
    }
    float inverse_rms = rsqrtf(warp_sum(sum_squares) / float(C) + eps);
    for (int c = lane; c < C; c += kWarpSize) {
      y_row[c] = __float2bfloat16(__bfloat162float(x_row[c]) * inverse_rms * __bfloat162float(weight[c]));
    }
  } else {
    int vectors = C / kBf16PerVector;
    const int4* x_vectors = reinterpret_cast<const int4*>(x_row);
    const int4* w_vectors = reinterpret_cast<const int4*>(weight);
    int4 x_held[kVectorsPerLane], w_held[kVectorsPerLane];
#pragma unroll
    for (int i = 0; i < kVectorsPerLane; ++i) {  // every load issued before any is used
      int v = lane + i * kWarpSize;
      bool inside = v < vectors;
      x_held[i] = inside ? __ldg(&x_vectors[v]) : make_int4(0, 0, 0, 0);
      w_held[i] = inside ? __ldg(&w_vectors[v]) : make_int4(0, 0, 0, 0);
    }

    float sum_squares = 0.0f;
#pragma unroll
    for (int i = 0; i < kVectorsPerLane; ++i) {
      float values[kBf16PerVector];
      unpack_bf16x8(x_held[i], values);
#pragma unroll
      for (int k = 0; k < kBf16PerVector; ++k) sum_squares += values[k] * values[k];
    }
    float inverse_rms = rsqrtf(warp_sum(sum_squares) / float(C) + eps);

    int4* y_vectors = reinterpret_cast<int4*>(y_row);
#pragma unroll
    for (int i = 0; i < kVectorsPerLane; ++i) {
      int v = lane + i * kWarpSize;
      if (v >= vectors) break;
      float values[kBf16PerVector], scales[kBf16PerVector];
      unpack_bf16x8(x_held[i], values);
      unpack_bf16x8(w_held[i], scales);
#pragma unroll
      for (int k = 0; k < kBf16PerVector; ++k) values[k] = values[k] * inverse_rms * scales[k];
      y_vectors[v] = pack_bf16x8(values);
    }
  }
}

void rmsnorm_v3_warp_vectorized(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int T, int C,
                                float eps, cudaStream_t stream) {
  rmsnorm_check_sizes("rmsnorm_v3_warp_vectorized", T, C);
  if (T == 0 || C == 0) return;
  int threads = kWarpsPerBlock * kWarpSize;
  int blocks = (T + kWarpsPerBlock - 1) / kWarpsPerBlock;
  bool launched = false;
  if (C % kBf16PerVector == 0 && aligned_16_bytes(y) && aligned_16_bytes(x) && aligned_16_bytes(weight)) {
    launched = launch_with_vectors_per_lane(C / kBf16PerVector, [&](auto per_lane) {
      rmsnorm_v3_warp_vectorized_kernel<decltype(per_lane)::value>
          <<<blocks, threads, 0, stream>>>(y, x, weight, T, C, eps);
    });
  }
  if (!launched) rmsnorm_v3_warp_vectorized_kernel<0><<<blocks, threads, 0, stream>>>(y, x, weight, T, C, eps);
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
