// The side kernel of gate/up: its last units' rows held in shared memory before O has
// finished (decode_gate_up_side.cuh has the protocol and why).
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_device.cuh"
#include "decode_gate_up_side.cuh"
#include "globaltimer.cuh"
#include "matmul_common.cuh"  // with_bias_flag
#include "weight_stream.cuh"

namespace bielik {

using namespace decode_device;

namespace {

// Bulk copies of at most this many bytes: a block's 2 x 100 KB go out as several
// requests, so the copy engine can work on the next while the first is in flight.
constexpr uint32_t kCopyPiece = 32768;
// The tag should come within microseconds; a side kernel still waiting after this long
// has lost its GEMV (a bug), and stops the context instead of hanging it.
constexpr unsigned long long kSideTimeoutNs = 2000000000ull;

// Two warps a block. A side block waits beside the chain's kernels for ~10 us, and what
// it holds is taken from them: with 8 warps (56 registers each) a block on every SM left
// gate/up room for 2 of its 3 blocks an SM, and the step lost 11% (DECODE_LOG.md,
// twenty-seventh session). 2 warps x 40 registers fit beside gate/up's 3 x 8 x 80.
constexpr int kSideWarps = 2;
constexpr int kSideThreads = kSideWarps * 32;

// Chunks of x a side thread loads at once: 4 played threads (below) x 2 chunks each
// covers K <= 4096, the GEMV's own limit for a normalized input.
constexpr int kPlayed = kThreads / kSideThreads;  // 4
constexpr int kChunksPlayed = 2;

// The normalized input in shared memory, bit for bit what stage_input<kRmsNorm> gives
// decode_gemv's 256 threads: each of this block's threads plays 4 of those threads (t =
// threadIdx.x + 64 v), summing the same squares in the same order, and the butterfly
// over the lanes of each of the 8 warps and the sum over the warps are theirs too.
// Every load of x goes out before the first is used: this runs after the tag, on the
// path to down, while gate/up's 55 MB fill the memory system, where each round trip to
// L2 takes microseconds. The norm weight is already in norm_shared (loaded before the tag).
__device__ __forceinline__ void stage_normalized_input(const DecodeGemvParams& p, uint4* x_shared,
                                                       const uint4* norm_shared, float (&scratch)[kWarps]) {
  const int chunks = p.K / 8;
  const uint4* x_vectors = reinterpret_cast<const uint4*>(p.x);
  uint4 raw[kPlayed][kChunksPlayed];
#pragma unroll
  for (int v = 0; v < kPlayed; ++v) {
#pragma unroll
    for (int u = 0; u < kChunksPlayed; ++u) {  // stage_input's order: t, t + 256
      const int c = int(threadIdx.x) + kSideThreads * v + kThreads * u;
      raw[v][u] = c < chunks ? __ldcg(x_vectors + c) : make_uint4(0, 0, 0, 0);  // through L2: O wrote it
    }
  }
  float sum_squares[kPlayed];
#pragma unroll
  for (int v = 0; v < kPlayed; ++v) {
    sum_squares[v] = 0.0f;
#pragma unroll
    for (int u = 0; u < kChunksPlayed; ++u) {
      const int c = int(threadIdx.x) + kSideThreads * v + kThreads * u;
      if (c < chunks) x_shared[c] = raw[v][u];
      float f[8];
      unpack_8(f, raw[v][u]);  // zeros past the end, as in stage_input
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_squares[v] += f[j] * f[j];
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int v = 0; v < kPlayed; ++v) {
    const float warp_total = warp_sum(sum_squares[v]);  // played warp warp + 2 v
    if (lane == 0) scratch[warp + kSideWarps * v] = warp_total;
  }
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) total += scratch[i];
  const float inverse_rms = rsqrtf(total / float(p.K) + p.eps);
  for (int c = threadIdx.x; c < chunks; c += kSideThreads) {
    float f[8], g[8];
    unpack_8(f, x_shared[c]);
    unpack_8(g, norm_shared[c]);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] * inverse_rms * g[e];
    x_shared[c] = pack_8(f);  // rounded to bf16 once, as normalize_staged does
  }
  __syncthreads();
}

// Shared memory: (units_per_block, K/8) gate rows, then the same of up rows, then the
// (K/8) staged input, the (K/8) norm weight, and (2, units_per_block) floats: the biases.
template <bool HasBias>
__global__ void __launch_bounds__(kSideThreads) gate_up_side_kernel(GateUpSideParams s) {
  extern __shared__ uint4 side_shared[];
  __shared__ uint64_t weights_arrived;
  __shared__ float scratch[kWarps];
  const DecodeGemvParams& p = s.gemv;
  const int chunks = p.K / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = s.first_unit + int(blockIdx.x) * s.units_per_block;
  const int units = min(s.units_per_block, p.N - first);  // >= 1: the host sizes the grid
  uint4* gate_rows = side_shared;
  uint4* up_rows = side_shared + size_t(s.units_per_block) * chunks;
  uint4* x_shared = side_shared + 2 * size_t(s.units_per_block) * chunks;
  uint4* norm_shared = x_shared + chunks;
  float* bias_shared = reinterpret_cast<float*>(norm_shared + chunks);  // gate's, then up's

  // 1. The weights: two contiguous ranges (gate rows first .. first + units - 1, and the
  //    same rows of up, N further), copied by thread 0 onto one mbarrier.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    stream_ptx::barrier_init(&weights_arrived, 1);
    stream_ptx::barrier_init_fence();
    const uint32_t half_bytes = uint32_t(units) * uint32_t(p.K) * sizeof(__nv_bfloat16);
    stream_ptx::barrier_expect_bytes(&weights_arrived, 2 * half_bytes);
    const char* sources[2] = {reinterpret_cast<const char*>(p.W + size_t(first) * p.K),
                              reinterpret_cast<const char*>(p.W + size_t(p.N + first) * p.K)};
    char* destinations[2] = {reinterpret_cast<char*>(gate_rows), reinterpret_cast<char*>(up_rows)};
    for (int half = 0; half < 2; ++half) {
      for (uint32_t offset = 0; offset < half_bytes; offset += kCopyPiece) {
        copy_async_bulk(destinations[half] + offset, sources[half] + offset, min(kCopyPiece, half_bytes - offset),
                        &weights_arrived);
      }
    }
  }
#else
  (void)weights_arrived;
  (void)kCopyPiece;
  __trap();  // the host refuses the side kernel before sm_90
#endif
  // Everything else that does not change within the step, before the tag too: the norm
  // weight and the biases (the GEMV loads them before its wait for the same reason).
  for (int c = threadIdx.x; c < chunks; c += kSideThreads) {
    norm_shared[c] = __ldg(reinterpret_cast<const uint4*>(p.norm_weight) + c);
  }
  for (int i = threadIdx.x; i < 2 * s.units_per_block; i += kSideThreads) {
    const int unit = first + i % s.units_per_block, half = i / s.units_per_block;
    bias_shared[i] = HasBias && i % s.units_per_block < units ? __bfloat162float(p.bias[unit + half * p.N]) : 0.0f;
  }

  // 2. The tag: the gate/up GEMV has passed its wait, so O's output is complete and
  //    visible. Its release store and this acquire load order every read below after it.
  if (threadIdx.x == 0) {
    const unsigned expected = unsigned(*s.sync.d_length) + 1u;
    const unsigned long long give_up = globaltimer_ns() + kSideTimeoutNs;
    for (;;) {
      unsigned seen;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(s.sync.ready) : "memory");
      if (seen == expected) break;
      if (globaltimer_ns() >= give_up) {
        printf("decode_gate_up_side: block %d gave up after 2 s waiting for tag %u (last seen %u)\n",
               int(blockIdx.x), expected, seen);
        __trap();
      }
      __nanosleep(64);
    }
  }
  __syncthreads();

  // 3. The input as the GEMV stages it, then the rows from shared memory.
  stage_normalized_input(p, x_shared, norm_shared, scratch);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  stream_ptx::barrier_wait(&weights_arrived, 0);
#endif
  for (int i = warp; i < units; i += kSideWarps) {
    float acc[2] = {0.0f, 0.0f};
    const uint4* gate = gate_rows + size_t(i) * chunks;
    const uint4* up = up_rows + size_t(i) * chunks;
    for (int c = lane; c < chunks; c += 32) {
      const uint4 xv = x_shared[c];
      acc[0] = dot_8(gate[c], xv, acc[0]);
      acc[1] = dot_8(up[c], xv, acc[1]);
    }
    acc[0] = warp_sum(acc[0]);
    acc[1] = warp_sum(acc[1]);
    if (lane == 0) {
      EpilogueInputs epilogue;
      epilogue.bias[0] = bias_shared[i];
      epilogue.bias[1] = bias_shared[s.units_per_block + i];
      store_output_loaded<GemvOutput::kSwiGLU>(p, first + i, acc, epilogue);
    }
  }
}

}  // namespace

size_t decode_gate_up_side_shared_bytes(int units_per_block, int K) {
  return (2 * size_t(units_per_block) + 2) * size_t(K) * sizeof(__nv_bfloat16) +
         2 * size_t(units_per_block) * sizeof(float);
}

void decode_gate_up_side(const GateUpSideParams& s, cudaStream_t stream, int priority) {
  const DecodeGemvParams& p = s.gemv;
  const size_t shared_bytes = decode_gate_up_side_shared_bytes(s.units_per_block, p.K);
  int device = 0, shared_limit = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // Room for the static words (the mbarrier, the scratch) besides the dynamic part.
  const size_t static_bytes = 64;
  if (!device_is_sm90_or_newer()) throw std::invalid_argument("decode_gate_up_side: needs sm_90 (bulk copies)");
  if (p.K <= 0 || p.K % 8 != 0 || p.K > kNormHeld * kThreads * 8 || p.N <= 0 || s.units_per_block < 1 ||
      s.first_unit < 0 || s.first_unit >= p.N || shared_bytes + static_bytes > size_t(shared_limit) ||
      2 * size_t(s.units_per_block) * p.K * sizeof(__nv_bfloat16) >= (size_t(1) << 20) || !s.sync.ready ||
      !s.sync.d_length || !p.y || !aligned_16(p.x) || !aligned_16(p.W) || !aligned_16(p.norm_weight)) {
    throw std::invalid_argument(
        "decode_gate_up_side: needs K % 8 == 0 and K <= " + std::to_string(kNormHeld * kThreads * 8) +
        ", 0 <= first_unit < N, units_per_block >= 1 whose rows fit one block's shared memory (" +
        std::to_string(shared_limit) + " bytes) and one mbarrier's count (1 MB), the tag and length pointers and 16-byte "
        "aligned x, W and norm_weight; got N=" + std::to_string(p.N) + " K=" + std::to_string(p.K) +
        " first_unit=" + std::to_string(s.first_unit) + " units_per_block=" + std::to_string(s.units_per_block));
  }
  const int blocks = decode_gate_up_side_blocks(p.N - s.first_unit, s.units_per_block);
  with_bias_flag(p.bias, [&](auto has_bias) {
    constexpr bool kBias = decltype(has_bias)::value;
    auto kernel = gate_up_side_kernel<kBias>;
    // The largest request so far, asked for once per size (not a stream operation: fine
    // while a graph is being captured).
    static size_t granted[2] = {0, 0};
    if (shared_bytes > granted[kBias ? 1 : 0]) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
      granted[kBias ? 1 : 0] = shared_bytes;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(kSideThreads);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    cudaLaunchAttribute priority_attribute = {};
    priority_attribute.id = cudaLaunchAttributePriority;
    priority_attribute.val.priority = priority;
    config.attrs = &priority_attribute;
    config.numAttrs = priority != 0 ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, s));
  });
}

}  // namespace bielik
