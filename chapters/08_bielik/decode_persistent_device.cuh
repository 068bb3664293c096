/// @file decode_persistent_device.cuh
/// @brief Device pieces shared by chapter 08's two persistent decode kernels
/// (decode_step_persistent.cu, decode_step_streamed.cu): the grid-wide barrier, the
/// two attention phases, and the host side both launches share (the kernel for a GQA
/// group size, the cooperative launch). Not a public API.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "decode_attention.cuh"
#include "decode_attention_device.cuh"
#include "decode_device.cuh"
#include "decode_persistent.cuh"

#include <stdexcept>
#include <string>
#include <type_traits>

namespace bielik::persistent_device {

using namespace decode_device;

constexpr int kMaxSplits = 256;  // the merge keeps a weight per split in shared memory
constexpr int kAttentionUnroll = 2;

// --- the grid barrier -----------------------------------------------------------------
// state[0] counts arrivals, state[1] is the generation. The last block to arrive resets
// the count and bumps the generation; the others spin on the generation. Everything a
// block wrote before the barrier is visible to every block after it (the fences).
__device__ __forceinline__ void grid_barrier(unsigned* state) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* generation = state + 1;
    const unsigned seen = *generation;
    __threadfence();
    if (atomicAdd(state, 1u) == gridDim.x - 1) {
      atomicExch(state, 0u);
      __threadfence();
      atomicAdd(state + 1, 1u);
    } else {
      // A block that never arrives would be a bug (the launch is cooperative, so every
      // block is resident): trap after ~seconds instead of hanging the GPU.
      long long spins = 0;
      while (*generation == seen) {
        if (++spins > (1LL << 26)) __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}

/// Block 0 writes the time into phase_clock[mark] (when it is not null); mark advances.
__device__ __forceinline__ void mark_phase(const PersistentStep& p, int& mark) {
  if (p.phase_clock && blockIdx.x == 0 && threadIdx.x == 0) p.phase_clock[mark] = globaltimer_ns();
  ++mark;
}

/// The grid barrier that ends a phase, then the phase's mark.
__device__ __forceinline__ void end_phase(const PersistentStep& p, int& mark) {
  grid_barrier(p.barrier);
  mark_phase(p, mark);
}

// --- attention phases ---------------------------------------------------------------------
template <int D, int G>
__device__ __forceinline__ void attention_splits(const PersistentStep& p, const PersistentLayer& layer) {
  const int kv_len = min(*p.d_length + 1, p.max_context);
  const int chunk = max((kv_len + p.splits - 1) / p.splits, kDecodeV3MinKeysPerSplit);
  for (int item = blockIdx.x; item < p.splits * p.Hkv; item += gridDim.x) {
    const int split = item % p.splits, kv_head = item / p.splits;
    const int begin = split * chunk, end = min(kv_len, begin + chunk);
    float* ml_out = p.partial_ml + (size_t(split) * p.H + kv_head * G) * 2;
    float* acc_out = p.partial_acc + (size_t(split) * p.H + kv_head * G) * D;
    if (begin >= end) {
      decode::write_empty_partial<G>(ml_out);
    } else {
      decode::pipelined_split_partial<D, G, kWarps, kAttentionUnroll, true>(acc_out, ml_out, p.q, layer.k_cache,
                                                                            layer.v_cache, kv_head, p.max_context,
                                                                            begin, end);
    }
    __syncthreads();  // the partial's shared memory is reused by the next item
  }
}

// One block per query head: weights 2^(m_s - M) first, then every column's weighted sum
// with independent loads (kRows splits side by side).
template <int D>
__device__ __forceinline__ void merge_splits(const PersistentStep& p) {
  constexpr int kRows = kThreads / D;
  __shared__ float s_weight[kMaxSplits], s_sum[kMaxSplits];
  __shared__ float s_inverse;
  __shared__ float s_part[kRows][D];
  const int r = threadIdx.x / D, d = threadIdx.x % D;
  for (int h = blockIdx.x; h < p.H; h += gridDim.x) {
    for (int s = threadIdx.x; s < p.splits; s += kThreads) {
      const float2 ml = __ldcg(reinterpret_cast<const float2*>(p.partial_ml + (size_t(s) * p.H + h) * 2));
      s_weight[s] = ml.x;
      s_sum[s] = ml.y;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float m_max = -INFINITY;
      for (int s = 0; s < p.splits; ++s) m_max = fmaxf(m_max, s_weight[s]);
      float l_total = 0.0f;
      for (int s = 0; s < p.splits; ++s) {
        const float weight = s_weight[s] == -INFINITY ? 0.0f : exp2f(s_weight[s] - m_max);
        s_weight[s] = weight;
        l_total += weight * s_sum[s];
      }
      s_inverse = l_total > 0 ? 1.0f / l_total : 0.0f;
    }
    __syncthreads();
    float a = 0.0f;
#pragma unroll 4
    for (int s = r; s < p.splits; s += kRows) {
      const float weight = s_weight[s];
      const float part = weight != 0.0f ? __ldcg(p.partial_acc + (size_t(s) * p.H + h) * D + d) : 0.0f;
      a += weight * part;
    }
    s_part[r][d] = a;
    __syncthreads();
    if (r == 0) {
      for (int other = 1; other < kRows; ++other) a += s_part[other][d];
      p.attn[size_t(h) * D + d] = __float2bfloat16(a * s_inverse);
    }
    __syncthreads();
  }
}

// --- host side ----------------------------------------------------------------------

/// A cooperative launch of `blocks` blocks of kThreads: every block is resident at once
/// or the launch fails, which is what grid_barrier needs (a block spinning on the
/// barrier must not wait for a block that was never scheduled).
template <typename... Params, typename... Args>
void launch_cooperative(void (*kernel)(Params...), int blocks, size_t shared_bytes, cudaStream_t stream,
                        Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace bielik::persistent_device
