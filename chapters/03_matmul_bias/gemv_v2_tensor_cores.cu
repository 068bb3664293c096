// gemv_v2: 1..16 tokens on the tensor cores, every weight read once for all of them.
//
// gemv_v1 multiplies each weight chunk with every token's x in FP32 FMAs: at T = 8 that is
// 64 FMAs and 8 widenings per 16-byte chunk, and from T = 3 on the instructions, not the
// bytes, set its pace (cuBLASLt beats it on the big layers, README.md). A prefill of a
// few tokens (a short chat turn, a short prompt) is still a GEMV in spirit: the weights
// are read once, the FLOPs are few. The tensor cores do those FLOPs without widening.
//
// The layout. One block owns 16 weight rows (the M of mma.sync.m16n8k16); the tokens are
// the N: one 8-column tile for T <= 8, two for T <= 16. The block's warps split K in steps
// of 32 values: step s belongs to warp s % kWarps. In a step, lane l (g = l / 4,
// t = l % 4) loads the 16 bytes at k = 32 s + 8 t of weight rows g and g + 8, and the
// same 16 bytes of token g's x (of tokens g and 8 + g with two tiles). The order of k
// inside an mma is free, since a dot product is a sum: the mma's logical k = 2t, 2t+1,
// 2t+8, 2t+9 are the lane's physical values 0..3 in the first mma and 4..7 in the second,
// for the A rows and the B column alike. So the registers go into the mma as loaded: no
// shared-memory staging, no shuffles, no widening. Lane (g, t) ends holding rows g and
// g + 8 for tokens 2t and 2t + 1 of each tile; the warps' partial tiles meet in shared
// memory, summed in warp order (the result does not depend on timing), and the bias is
// added in fp32 before the one rounding to bf16.
//
// Bytes in flight: each warp asks for 8 steps (4 with two column tiles; 2 x 16 B of
// weights a lane each) before its first mma, 64 KB (32 KB) a block of 8 warps. Long rows (the down projection,
// K = 8960: 96 blocks of 16 rows) use blocks of 16 warps, so that the few blocks still keep
// enough bytes in flight (Little's law; chapter 03's README).
//
// Rows past N and tokens past T read a valid row or token (the last one) and are never
// written: the loop has no bounds test but K's. Needs K % 8 == 0 and 16-byte aligned x and
// W (each row then starts aligned); gemv_v2_supported says whether a call qualifies.
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"
#include "matmul_ptx.cuh"

namespace bielik {

namespace {

constexpr int kRowsPerBlock = 16;  // the mma's M

template <int kWarps, int kColumnTiles, bool HasBias>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_v2_kernel(__nv_bfloat16* y,           // (T, N)
                   const __nv_bfloat16* x,     // (T, K)
                   const __nv_bfloat16* W,     // (N, K)
                   const __nv_bfloat16* bias,  // (N), unused when !HasBias
                   int T, int N, int K) {
  constexpr int kColumns = 8 * kColumnTiles;
  // 32-value steps a warp loads before it multiplies: 8 (256 bytes of weights a lane), 4
  // with two column tiles, whose x chunks take as many registers again.
  constexpr int kStepsInFlight = kColumnTiles == 1 ? 8 : 4;
  __shared__ float partial[kWarps][kRowsPerBlock][kColumns];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kRowsPerBlock;
  const __nv_bfloat16* w_lo = W + size_t(min(row0 + g, N - 1)) * K;      // tile row g
  const __nv_bfloat16* w_hi = W + size_t(min(row0 + g + 8, N - 1)) * K;  // tile row g + 8
  const __nv_bfloat16* x_column[kColumnTiles];                           // token 8 j + g
#pragma unroll
  for (int j = 0; j < kColumnTiles; ++j) x_column[j] = x + size_t(min(8 * j + g, T - 1)) * K;

  float acc[kColumnTiles][4] = {};
  const int steps = (K + 31) / 32;
  for (int first = warp; first < steps; first += kWarps * kStepsInFlight) {
    uint4 a_lo[kStepsInFlight], a_hi[kStepsInFlight], b[kStepsInFlight][kColumnTiles];
#pragma unroll
    for (int u = 0; u < kStepsInFlight; ++u) {  // every load first...
      const int k = 32 * (first + u * kWarps) + 8 * t;
      const bool inside = k < K;  // K % 8 == 0: a chunk is all in or all out
      a_lo[u] = inside ? ptx::load_streaming_16(w_lo + k) : make_uint4(0, 0, 0, 0);
      a_hi[u] = inside ? ptx::load_streaming_16(w_hi + k) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < kColumnTiles; ++j) {
        b[u][j] = inside ? __ldg(reinterpret_cast<const uint4*>(x_column[j] + k)) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kStepsInFlight; ++u) {  // ...then the mma: values 0-3, then 4-7
      const uint32_t first_half[4] = {a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y};
      const uint32_t second_half[4] = {a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w};
#pragma unroll
      for (int j = 0; j < kColumnTiles; ++j) {
        ptx::mma_bf16_16x8x16(acc[j], first_half, b[u][j].x, b[u][j].y);
        ptx::mma_bf16_16x8x16(acc[j], second_half, b[u][j].z, b[u][j].w);
      }
    }
  }

#pragma unroll
  for (int j = 0; j < kColumnTiles; ++j) {
    partial[warp][g][8 * j + 2 * t] = acc[j][0];
    partial[warp][g][8 * j + 2 * t + 1] = acc[j][1];
    partial[warp][g + 8][8 * j + 2 * t] = acc[j][2];
    partial[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kRowsPerBlock * T; i += kWarps * 32) {
    const int r = i % kRowsPerBlock, token = i / kRowsPerBlock, n = row0 + r;
    if (n >= N) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][r][token];  // warp order: deterministic
    if constexpr (HasBias) sum += __bfloat162float(bias[n]);
    y[size_t(token) * N + n] = __float2bfloat16(sum);
  }
}

template <int kWarps, int kColumnTiles>
void launch_v2(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, int T,
               int C_in, int C_out, cudaStream_t stream) {
  const dim3 grid((C_out + kRowsPerBlock - 1) / kRowsPerBlock);
  with_bias_flag(bias, [&](auto has_bias) {
    constexpr bool kHasBias = decltype(has_bias)::value;
    gemv_v2_kernel<kWarps, kColumnTiles, kHasBias><<<grid, kWarps * 32, 0, stream>>>(y, x, W, bias, T, C_out, C_in);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool gemv_v2_supported(const __nv_bfloat16* x, const __nv_bfloat16* W, int T, int C_in) {
  return T >= 1 && T <= kGemvV2MaxTokens && C_in > 0 && C_in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W) % 16 == 0;
}

void gemv_v2_tensor_cores(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("gemv_v2_tensor_cores", T, C_in, C_out);
  if (T == 0 || C_out == 0) return;
  if (!gemv_v2_supported(x, W, T, C_in)) {
    throw std::invalid_argument("gemv_v2_tensor_cores: needs 1 <= T <= " + std::to_string(kGemvV2MaxTokens) +
                                ", C_in % 8 == 0 and 16-byte aligned x and W; got T=" + std::to_string(T) +
                                " C_in=" + std::to_string(C_in));
  }
  // Long rows: few blocks of 16 rows, so more warps each keep the bytes in flight.
  const bool long_rows = C_in >= 4096;
  if (T <= 8) {
    long_rows ? launch_v2<16, 1>(y, x, W, bias, T, C_in, C_out, stream)
              : launch_v2<8, 1>(y, x, W, bias, T, C_in, C_out, stream);
  } else {
    long_rows ? launch_v2<16, 2>(y, x, W, bias, T, C_in, C_out, stream)
              : launch_v2<8, 2>(y, x, W, bias, T, C_in, C_out, stream);
  }
}

}  // namespace bielik
