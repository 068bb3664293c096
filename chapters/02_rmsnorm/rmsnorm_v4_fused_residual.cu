// v4: the residual add fused into v3's RMSNorm.
//
// In the decoder every norm follows a residual add:
//     residual += x;  y = rmsnorm(residual) * w
// Done as two kernels, the add reads residual and x and writes residual (3 passes over
// T * C bf16), then the norm reads residual again and writes y (2 more): 5 passes and
// two launches. Fused, one kernel reads residual and x once and writes residual and y
// once: 4 passes, one launch, and the sum never leaves registers between the two steps.
//
// Technique: exactly v3's (one warp per row, 16-byte vectors, the row held in
// registers, warp-shuffle reduction, scalar two-pass fallback for C % 8 != 0, unaligned
// pointers or C > 4096).
//
// Rounding: the residual stream is bf16, so the fp32 sum is rounded to bf16 once, that
// rounded value is stored, and the *rounded* value is what gets normalized: the norm
// sees exactly the residual the next layer's add will read, as in HuggingFace.
#include "cuda_check.cuh"
#include "pdl.cuh"
#include "rmsnorm.cuh"
#include "rmsnorm_warp.cuh"

namespace bielik {

using namespace rmsnorm_warp;

template <int kVectorsPerLane>  // 0: scalar two-pass fallback
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize)
    rmsnorm_v4_fused_residual_kernel(__nv_bfloat16* y,             // (T, C)
                                     __nv_bfloat16* residual,      // (T, C) in/out
                                     const __nv_bfloat16* x,       // (T, C)
                                     const __nv_bfloat16* weight,  // (C)
                                     int T, int C, float eps) {
  // With PDL (chapter 07) this kernel may start while the previous one still runs:
  // everything it reads may be that kernel's output, so it waits first. A no-op otherwise.
  pdl_wait();
  int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  int lane = threadIdx.x % kWarpSize;
  if (t >= T) return;  // the whole warp leaves together, so the shuffles stay full-warp
  __nv_bfloat16* residual_row = residual + size_t(t) * C;
  const __nv_bfloat16* x_row = x + size_t(t) * C;
  __nv_bfloat16* y_row = y + size_t(t) * C;

  if constexpr (kVectorsPerLane == 0) {
    float sum_squares = 0.0f;
    for (int c = lane; c < C; c += kWarpSize) {
      __nv_bfloat16 sum = __float2bfloat16(__bfloat162float(residual_row[c]) + __bfloat162float(x_row[c]));
      residual_row[c] = sum;
      float value = __bfloat162float(sum);
      sum_squares += value * value;
    }
    float inverse_rms = rsqrtf(warp_sum(sum_squares) / float(C) + eps);
    // Each lane re-reads only the elements it wrote itself, so no synchronization is needed.
    for (int c = lane; c < C; c += kWarpSize) {
      y_row[c] = __float2bfloat16(__bfloat162float(residual_row[c]) * inverse_rms * __bfloat162float(weight[c]));
    }
  } else {
    int vectors = C / kBf16PerVector;
    int4* residual_vectors = reinterpret_cast<int4*>(residual_row);
    const int4* x_vectors = reinterpret_cast<const int4*>(x_row);
    const int4* w_vectors = reinterpret_cast<const int4*>(weight);
    int4 residual_held[kVectorsPerLane], x_held[kVectorsPerLane], w_held[kVectorsPerLane];
#pragma unroll
    for (int i = 0; i < kVectorsPerLane; ++i) {  // every load issued before any is used
      int v = lane + i * kWarpSize;
      bool inside = v < vectors;
      residual_held[i] = inside ? residual_vectors[v] : make_int4(0, 0, 0, 0);
      x_held[i] = inside ? __ldg(&x_vectors[v]) : make_int4(0, 0, 0, 0);
      w_held[i] = inside ? __ldg(&w_vectors[v]) : make_int4(0, 0, 0, 0);
    }

    float sum_squares = 0.0f;
#pragma unroll
    for (int i = 0; i < kVectorsPerLane; ++i) {
      float sums[kBf16PerVector], added[kBf16PerVector];
      unpack_bf16x8(residual_held[i], sums);
      unpack_bf16x8(x_held[i], added);
#pragma unroll
      for (int k = 0; k < kBf16PerVector; ++k) sums[k] += added[k];
      residual_held[i] = pack_bf16x8(sums);  // the bf16 residual stream
      unpack_bf16x8(residual_held[i], sums);  // ...and the rounded values the norm sees
#pragma unroll
      for (int k = 0; k < kBf16PerVector; ++k) sum_squares += sums[k] * sums[k];
      int v = lane + i * kWarpSize;
      if (v < vectors) residual_vectors[v] = residual_held[i];
    }
    float inverse_rms = rsqrtf(warp_sum(sum_squares) / float(C) + eps);

    int4* y_vectors = reinterpret_cast<int4*>(y_row);
#pragma unroll
    for (int i = 0; i < kVectorsPerLane; ++i) {
      int v = lane + i * kWarpSize;
      if (v >= vectors) break;
      float values[kBf16PerVector], scales[kBf16PerVector];
      unpack_bf16x8(residual_held[i], values);
      unpack_bf16x8(w_held[i], scales);
#pragma unroll
      for (int k = 0; k < kBf16PerVector; ++k) values[k] = values[k] * inverse_rms * scales[k];
      y_vectors[v] = pack_bf16x8(values);
    }
  }
}

void rmsnorm_v4_fused_residual_pdl(__nv_bfloat16* y, __nv_bfloat16* residual, const __nv_bfloat16* x,
                                   const __nv_bfloat16* weight, int T, int C, float eps, cudaStream_t stream,
                                   bool pdl) {
  rmsnorm_check_sizes("rmsnorm_v4_fused_residual", T, C);
  if (T == 0 || C == 0) return;
  const dim3 threads(kWarpsPerBlock * kWarpSize), blocks((T + kWarpsPerBlock - 1) / kWarpsPerBlock);
  bool launched = false;
  if (C % kBf16PerVector == 0 && aligned_16_bytes(y) && aligned_16_bytes(residual) && aligned_16_bytes(x) &&
      aligned_16_bytes(weight)) {
    launched = launch_with_vectors_per_lane(C / kBf16PerVector, [&](auto per_lane) {
      launch_kernel(pdl, rmsnorm_v4_fused_residual_kernel<decltype(per_lane)::value>, blocks, threads, 0, stream, y,
                    residual, x, weight, T, C, eps);
    });
  }
  if (!launched) {
    launch_kernel(pdl, rmsnorm_v4_fused_residual_kernel<0>, blocks, threads, 0, stream, y, residual, x, weight, T, C,
                  eps);
  }
}

void rmsnorm_v4_fused_residual(__nv_bfloat16* y, __nv_bfloat16* residual, const __nv_bfloat16* x,
                               const __nv_bfloat16* weight, int T, int C, float eps, cudaStream_t stream) {
  rmsnorm_v4_fused_residual_pdl(y, residual, x, weight, T, C, eps, stream, false);
}

}  // namespace bielik
