// gemv_v1: decode (T = 1..8), one warp per output row, bandwidth-bound on W.
//
// At T = 1 a linear layer does 2 FLOPs per weight it reads (2 bytes): 1 FLOP per byte,
// while the H200 could do ~200 FLOPs per byte of HBM bandwidth. The tensor cores are
// useless here; what matters is streaming W at the full memory bandwidth, once.
//
//  * One warp reads one row W[n, :] (contiguous, C_in * 2 bytes): lane l takes 16-byte
//    chunks l, l + 32, l + 64, ... so each warp-wide load is 512 contiguous bytes.
//  * Several loads in flight: each lane issues 4 to 8 independent 16-byte loads
//    before it uses the first. Little's law: bandwidth = bytes in flight / latency;
//    at ~4.3 TB/s and ~1 us that is ~4 MB in flight across the GPU, far more than one
//    load per thread can keep.
//  * W is read with ld.global.nc.L1::no_allocate: it is used once, so it should not
//    evict x from L1. x (T rows) is tiny and read through L1 by every warp.
//  * Every W chunk, once in registers, is multiplied with all T rows of x: W is read
//    once for all tokens, so T = 8 costs barely more HBM traffic than T = 1.
//  * fp32 accumulation per lane, then a warp shuffle reduction, then the bias.
//  * Small C_out (k_proj / v_proj: 256 rows) would leave most SMs idle with one warp
//    per row, so up to 8 warps split a row's C_in and add their partial sums through
//    shared memory: enough warps to fill the GPU whatever C_out is.
//
// Odd sizes: with C_in % 8 != 0 or misaligned pointers the 16-byte path is impossible;
// the Vector = false instantiation loads the same chunks element by element, with the
// tail beyond C_in read as zero.
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"
#include "matmul_ptx.cuh"

namespace bielik {

namespace {

constexpr int kGemvWarps = 8;  // warps per block

// 16-byte W loads a lane issues before it uses the first. At T <= 2 registers are
// plentiful and 8 cover a whole 1536-wide row (6 chunks per lane) in one round trip;
// at larger T the x values and accumulators need the registers.
template <int T>
inline constexpr int kLoadsInFlight = T <= 2 ? 8 : 4;

// Widens 8 bf16 packed in 16 bytes to fp32: a bf16 is the top half of an fp32.
__device__ __forceinline__ void unpack_8(float (&v)[8], uint4 raw) {
  uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Streaming 16-byte load that does not allocate in L1 (W is read exactly once).
__device__ __forceinline__ uint4 load_streaming(const void* p) { return ptx::load_streaming_16(p); }

// Chunk `chunk` (8 bf16 starting at k = 8 * chunk) of a row of length K, zeros past K.
template <bool Vector, bool Streaming>
__device__ __forceinline__ uint4 load_chunk(const __nv_bfloat16* row, int chunk, int K) {
  if constexpr (Vector) {
    const void* p = row + chunk * 8;
    return Streaming ? load_streaming(p) : __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int k = chunk * 8 + 2 * i;
      uint32_t lo = k < K ? __bfloat16_as_ushort(row[k]) : 0u;
      uint32_t hi = k + 1 < K ? __bfloat16_as_ushort(row[k + 1]) : 0u;
      words[i] = lo | (hi << 16);
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
}

}  // namespace

template <int T, bool HasBias, bool Vector>
__global__ void __launch_bounds__(32 * kGemvWarps, 2)
    gemv_v1_warp_per_row_kernel(__nv_bfloat16* y,           // (T, N)
                                const __nv_bfloat16* x,     // (T, K)
                                const __nv_bfloat16* W,     // (N, K)
                                const __nv_bfloat16* bias,  // (N), unused when !HasBias
                                int N, int K, int warps_per_row) {
  __shared__ float partial[kGemvWarps][T];
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int part = warp % warps_per_row;                      // which slice of the row
  int n = blockIdx.x * (kGemvWarps / warps_per_row) + warp / warps_per_row;

  float acc[T] = {};
  if (n < N) {  // no early return: the block meets at __syncthreads below
    const __nv_bfloat16* w_row = W + size_t(n) * K;
    int chunks = (K + 7) / 8, stride = 32 * warps_per_row;
    constexpr int kLoads = kLoadsInFlight<T>;
    for (int base = part * 32 + lane; base < chunks; base += kLoads * stride) {
      uint4 w_raw[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {  // all loads first...
        int chunk = base + u * stride;
        w_raw[u] = chunk < chunks ? load_chunk<Vector, true>(w_row, chunk, K) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {  // ...then the arithmetic
        int chunk = base + u * stride;
        if (chunk >= chunks) break;
        float w[8];
        unpack_8(w, w_raw[u]);
#pragma unroll
        for (int t = 0; t < T; ++t) {
          float xv[8];
          unpack_8(xv, load_chunk<Vector, false>(x + size_t(t) * K, chunk, K));
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[t] += w[j] * xv[j];
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], offset);
  }
  if (warps_per_row > 1) {  // add the slices of the row
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < T; ++t) partial[warp][t] = acc[t];
    }
    __syncthreads();
    if (part == 0) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
        acc[t] = 0.0f;
        for (int p = 0; p < warps_per_row; ++p) acc[t] += partial[warp + p][t];
      }
    }
  }
  if (part == 0 && n < N) {
    float b = 0.0f;
    if constexpr (HasBias) b = bf16_to_f32(bias[n]);
#pragma unroll
    for (int t = 0; t < T; ++t) {  // lane t stores token t (register index stays compile-time)
      if (lane == t) y[size_t(t) * N + n] = __float2bfloat16(acc[t] + b);
    }
  }
}

namespace {

template <int T>
void gemv_launch(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, int N,
                 int K, bool vector, cudaStream_t stream) {
  // Enough warps to give every SM ~32 of them: split rows while C_out alone is too few.
  size_t sms = multiprocessor_count();
  int warps_per_row = 1;
  while (warps_per_row < kGemvWarps && size_t(N) * warps_per_row < sms * 32) warps_per_row *= 2;
  int rows_per_block = kGemvWarps / warps_per_row;
  int blocks = (N + rows_per_block - 1) / rows_per_block;
  with_bias_flag(bias, [&](auto has_bias) {
    constexpr bool kHasBias = decltype(has_bias)::value;
    if (vector) {
      gemv_v1_warp_per_row_kernel<T, kHasBias, true>
          <<<blocks, 32 * kGemvWarps, 0, stream>>>(y, x, W, bias, N, K, warps_per_row);
    } else {
      gemv_v1_warp_per_row_kernel<T, kHasBias, false>
          <<<blocks, 32 * kGemvWarps, 0, stream>>>(y, x, W, bias, N, K, warps_per_row);
    }
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemv_v1_warp_per_row(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("gemv_v1_warp_per_row", T, C_in, C_out);
  if (T > kGemvMaxTokens) {
    throw std::invalid_argument("gemv_v1_warp_per_row: T=" + std::to_string(T) + " > " +
                                std::to_string(kGemvMaxTokens) + "; use a GEMM");
  }
  if (T == 0 || C_out == 0) return;
  // 16-byte loads of x and W rows; y and bias are written/read one value at a time.
  bool vector = C_in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0;
  switch (T) {  // T becomes a compile-time constant: acc[T] lives in registers
    case 1: gemv_launch<1>(y, x, W, bias, C_out, C_in, vector, stream); break;
    case 2: gemv_launch<2>(y, x, W, bias, C_out, C_in, vector, stream); break;
    case 3: gemv_launch<3>(y, x, W, bias, C_out, C_in, vector, stream); break;
    case 4: gemv_launch<4>(y, x, W, bias, C_out, C_in, vector, stream); break;
    case 5: gemv_launch<5>(y, x, W, bias, C_out, C_in, vector, stream); break;
    case 6: gemv_launch<6>(y, x, W, bias, C_out, C_in, vector, stream); break;
    case 7: gemv_launch<7>(y, x, W, bias, C_out, C_in, vector, stream); break;
    default: gemv_launch<8>(y, x, W, bias, C_out, C_in, vector, stream); break;
  }
}

}  // namespace bielik
