/// @file decode_device.cuh
/// @brief Device pieces shared by the decode GEMV kernels (decode_gemv_register_kernels.cuh,
/// decode_gemv_mma.cu and decode_gemv_stream.cu): PDL controls, bf16 packing, the dot product of 8 pairs, the
/// input staging with its fused RMSNorm, and the epilogues. Not a public API.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda_check.cuh"
#include "decode_attention_device.cuh"  // chapter 07: the split ranges and the partials' merge
#include "decode_kernels.cuh"
#include "globaltimer.cuh"
#include "pdl.cuh"
#include "rope_rotate.cuh"  // chapter 04: the rotation with every rounding spelled out
#include "weight_stream.cuh"  // chapter 03: the mbarrier helpers (stage_input_bulk)

namespace bielik::decode_device {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kNormHeld = 2;  // norm-weight chunks a thread loads before the wait (K <= 4096)

// Weights are read once per step: a streaming load that does not allocate in L1.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The same with an L2 cache policy (l2_policy) that says how soon L2 may drop the line
// after it (sm_80+; the plain load before).
__device__ __forceinline__ uint4 load_streaming(const void* p, uint64_t l2_policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(l2_policy));
  return v;
#else
  (void)l2_policy;
  return load_streaming(p);
#endif
}

/// The XOR of every 32-bit word of the 16-byte vectors i = thread, thread + threads, ...
/// below `count`: one thread's share of a grid-stride read of a range, with eight
/// streaming loads in flight. For reads whose values only need to have arrived (the side
/// branch's load form, bench_l2_prefetch): the caller must USE the result (store it under
/// a condition ptxas cannot decide), or ptxas drops the loads as dead, `volatile` or not.
__device__ __forceinline__ unsigned xor_of_grid_share(const uint4* vectors, size_t count, size_t thread,
                                                      size_t threads) {
  constexpr int kInFlight = 8;
  unsigned mix = 0;
  size_t i = thread;
  for (; i + (kInFlight - 1) * threads < count; i += kInFlight * threads) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = load_streaming(vectors + i + u * threads);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) mix ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < count; i += threads) {
    const uint4 v = load_streaming(vectors + i);
    mix ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return mix;
}

/// load_streaming's shared-memory form: 16 bytes of weights copied global -> shared by
/// cp.async, with the same L2 policy, without a register to hold them until they arrive.
/// The copies a thread issued are its own to read after cp_async_wait_all (no barrier:
/// no other thread reads them). sm_80+; older GPUs load and store (the kernel is the same).
__device__ __forceinline__ void copy_streaming_to_shared(uint4* shared_dst, const void* p, uint64_t l2_policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(p), "l"(l2_policy)
               : "memory");
#else
  (void)l2_policy;
  *shared_dst = *static_cast<const uint4*>(p);
#endif
}

/// cp_async_commit_all closes this thread's cp.async copies into one group;
/// cp_async_wait_all waits until all its groups have landed in shared memory ("memory":
/// the compiler may not move a shared-memory read above it). Chapter 03's
/// ptx::cp_async_commit / cp_async_wait lack that clobber: their callers reach a
/// __syncthreads before they read, and this kernel's lanes read their copies with none.
__device__ __forceinline__ void cp_async_commit_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

/// An L2 cache policy for load_streaming: evict-first (the line is not wanted again, so
/// L2 drops it before others) or the normal one (what a load without a hint gets).
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (evict_first) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  }
#else
  (void)evict_first;
#endif
  return policy;
}

// A bf16 is the top half of an fp32: widening is a shift or a mask.
__device__ __forceinline__ float low_bf16(uint32_t word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float high_bf16(uint32_t word) { return __uint_as_float(word & 0xffff0000u); }

__device__ __forceinline__ void unpack_8(float (&v)[8], uint4 raw) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = low_bf16(words[i]);
    v[2 * i + 1] = high_bf16(words[i]);
  }
}

__device__ __forceinline__ uint4 pack_8(const float (&v)[8]) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    words[i] = *reinterpret_cast<uint32_t*>(&pair);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

__device__ __forceinline__ float dot_8(uint4 w, uint4 x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(low_bf16(ws[i]), low_bf16(xs[i]), acc);
    acc = fmaf(high_bf16(ws[i]), high_bf16(xs[i]), acc);
  }
  return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

/// Weight rows a unit reads: 1, or 2 for the pair outputs. SwiGLU: gate row n and up row
/// N + n. RoPE: dims j and j + D/2 of head n / (D/2), the pair that rotates together.
template <GemvOutput Out>
__host__ __device__ constexpr int rows_per_unit() {
  return Out == GemvOutput::kSwiGLU || Out == GemvOutput::kRopeAppend ? 2 : 1;
}

template <GemvOutput Out>
__device__ __forceinline__ int weight_row(const DecodeGemvParams& p, int unit, int r) {
  if constexpr (Out == GemvOutput::kRopeAppend) {
    const int half = p.rope.D / 2;
    return (unit / half) * p.rope.D + unit % half + r * half;
  } else {
    return unit + r * p.N;
  }
}

/// What an output's epilogue reads from global memory besides the accumulator: the
/// bias, the residual (kResidualAdd), the position and its cos / sin (kRopeAppend).
/// Loading them is split from using them so that a kernel can issue these loads early
/// (decode_step_streamed.cu does, before it waits for the stage's weights) instead of
/// stalling on their latency at the end of the row.
struct EpilogueInputs {
  float bias[2] = {0.0f, 0.0f};
  float residual = 0.0f;
  float cos = 0.0f, sin = 0.0f;
  int pos = 0;
  bool valid = true;  ///< kRopeAppend: pos is inside the cache and the table
};

template <GemvOutput Out, bool HasBias>
__device__ __forceinline__ EpilogueInputs load_epilogue_inputs(const DecodeGemvParams& p, int n) {
  EpilogueInputs in;
  if constexpr (HasBias) {
#pragma unroll
    for (int r = 0; r < rows_per_unit<Out>(); ++r) in.bias[r] = __bfloat162float(p.bias[weight_row<Out>(p, n, r)]);
  }
  if constexpr (Out == GemvOutput::kResidualAdd) {
    // Read through L2: in the persistent steps other blocks rewrote y since this SM last
    // read it, and L1 is not coherent.
    in.residual = __bfloat162float(__ldcg(static_cast<const __nv_bfloat16*>(p.y) + n));
    const ResidualPartials& rp = p.residual_partials;
    if (rp.partials) {  // the O projection not yet in the residual (decode_attention_o)
      float part[kMaxResidualPartials];
#pragma unroll
      for (int g = 0; g < kMaxResidualPartials; ++g) part[g] = g < rp.count ? __ldcg(rp.partials + size_t(g) * p.N + n) : 0.0f;
      float o = 0.0f;
#pragma unroll
      for (int g = 0; g < kMaxResidualPartials; ++g) o += part[g];  // + 0.0f past count: exact
      in.residual = round_bf16(in.residual + round_bf16(o));
    }
  } else if constexpr (Out == GemvOutput::kRopeAppend) {
    const RopeAppendTarget& t = p.rope;
    const int half = t.D / 2, j = n % half;
    in.pos = *t.d_length;
    in.valid = in.pos >= 0 && in.pos < t.max_context && in.pos < t.max_positions;
    in.cos = in.valid ? t.cos[size_t(in.pos) * half + j] : NAN;
    in.sin = in.valid ? t.sin[size_t(in.pos) * half + j] : NAN;
  }
  return in;
}

/// RoPE and the cache append of one rotation pair (a, c) = (dim j, dim j + D/2) of head
/// `head`, already rounded to bf16 as the unfused QKV GEMV would store them.
__device__ __forceinline__ void rope_append_pair(const DecodeGemvParams& p, int head, int j, float a, float c,
                                                 const EpilogueInputs& in) {
  const RopeAppendTarget& t = p.rope;
  const int half = t.D / 2;
  const int pos = in.pos;
  if (head < t.H + t.Hkv) {
    // HF rotate-half. rope_rotate (chapter 04): explicitly rounded, so that the compiler's
    // FMA contraction cannot differ from decode_rope_append's or chapter 04's (the tests
    // are bit for bit).
    const __nv_bfloat16 first = __float2bfloat16(rope_rotate_first(a, c, in.cos, in.sin));
    const __nv_bfloat16 second = __float2bfloat16(rope_rotate_second(a, c, in.cos, in.sin));
    if (head < t.H) {
      __nv_bfloat16* q = static_cast<__nv_bfloat16*>(p.y) + size_t(head) * t.D;
      q[j] = first;
      q[j + half] = second;
    } else if (in.valid) {
      __nv_bfloat16* k = t.k_cache + (size_t(head - t.H) * t.max_context + pos) * t.D;
      k[j] = first;
      k[j + half] = second;
    }
  } else if (in.valid) {
    __nv_bfloat16* v = t.v_cache + (size_t(head - t.H - t.Hkv) * t.max_context + pos) * t.D;
    v[j] = __float2bfloat16(a);
    v[j + half] = __float2bfloat16(c);
  }
}

/// The epilogue of output n with its global inputs already loaded. Returns the value
/// stored for kF32 (the logit, which a folded argmax compares), 0 for the others.
template <GemvOutput Out>
__device__ __forceinline__ float store_output_loaded(const DecodeGemvParams& p, int n, const float (&acc)[2],
                                                     const EpilogueInputs& in) {
  if constexpr (Out == GemvOutput::kBf16) {
    static_cast<__nv_bfloat16*>(p.y)[n] = __float2bfloat16(acc[0] + in.bias[0]);
  } else if constexpr (Out == GemvOutput::kF32) {
    const float logit = acc[0] + in.bias[0];
    static_cast<float*>(p.y)[n] = logit;
    return logit;
  } else if constexpr (Out == GemvOutput::kSwiGLU) {
    const float gate = round_bf16(acc[0] + in.bias[0]);  // the values an unfused GEMM would store
    const float up = round_bf16(acc[1] + in.bias[1]);
    static_cast<__nv_bfloat16*>(p.y)[n] = __float2bfloat16(silu(gate) * up);
  } else if constexpr (Out == GemvOutput::kRopeAppend) {
    const int half = p.rope.D / 2;
    rope_append_pair(p, n / half, n % half, round_bf16(acc[0] + in.bias[0]), round_bf16(acc[1] + in.bias[1]), in);
  } else {  // kResidualAdd: one lane owns y[n], so the read-modify-write needs no atomics
    static_cast<__nv_bfloat16*>(p.y)[n] = __float2bfloat16(in.residual + round_bf16(acc[0] + in.bias[0]));
  }
  return 0.0f;
}

/// The epilogue of output n: bias, then the output's own step (see GemvOutput). Returns
/// what store_output_loaded returns.
template <GemvOutput Out, bool HasBias>
__device__ __forceinline__ float store_output(const DecodeGemvParams& p, int n, const float (&acc)[2]) {
  return store_output_loaded<Out>(p, n, acc, load_epilogue_inputs<Out, HasBias>(p, n));
}

// One batch of a warp's weight loads: chunks base, base + stride, ... of unit `unit`'s
// weight rows (two rows for the pair outputs), with L2 policy `policy` (l2_policy).
// Chunks past the row and units < 0 read as zero. Only the batch's loads u_begin ..
// u_end - 1 of each row (all of them by default; DecodeGemvParams::loads_before_wait
// splits a first batch in two: some before the PDL wait, the rest after it).
template <GemvOutput Out, int kBatch>
__device__ __forceinline__ void load_batch(uint4 (&w)[rows_per_unit<Out>()][kBatch], const DecodeGemvParams& p,
                                           int unit, int base, int stride, uint64_t policy, int u_begin = 0,
                                           int u_end = kBatch) {
  const int chunks = p.K / 8;
#pragma unroll
  for (int r = 0; r < rows_per_unit<Out>(); ++r) {
    const __nv_bfloat16* row_start = p.W + (unit >= 0 ? size_t(weight_row<Out>(p, unit, r)) * p.K : 0);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (u < u_begin || u >= u_end) continue;
      const int chunk = base + stride * u;
      w[r][u] = unit >= 0 && chunk < chunks ? load_streaming(row_start + 8 * chunk, policy) : make_uint4(0, 0, 0, 0);
    }
  }
}

/// load_batch's shared-memory form, for a batch the warp reads later: the same chunks
/// copied by cp.async into `slots` ((kRows, kBatch, 32) uint4, this warp's; lane l's
/// chunks at index l), one group committed. Chunks past the row are not copied (the
/// dot product skips them); unit < 0 copies nothing.
template <GemvOutput Out, int kBatch>
__device__ __forceinline__ void copy_batch_to_shared(uint4* slots, const DecodeGemvParams& p, int unit, int base,
                                                     int stride, uint64_t policy) {
  const int chunks = p.K / 8, lane = threadIdx.x % 32;
  if (unit >= 0) {
#pragma unroll
    for (int r = 0; r < rows_per_unit<Out>(); ++r) {
      const __nv_bfloat16* row_start = p.W + size_t(weight_row<Out>(p, unit, r)) * p.K;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int chunk = base + stride * u;
        if (chunk < chunks) copy_streaming_to_shared(&slots[(r * kBatch + u) * 32 + lane], row_start + 8 * chunk, policy);
      }
    }
  }
  cp_async_commit_all();
}

/// Waits for this thread's copies (copy_batch_to_shared), then reads its chunks back.
template <int kRows, int kBatch>
__device__ __forceinline__ void read_batch_from_shared(uint4 (&w)[kRows][kBatch], const uint4* slots) {
  const int lane = threadIdx.x % 32;
  cp_async_wait_all();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) w[r][u] = slots[(r * kBatch + u) * 32 + lane];
  }
}

/// DecodeGemvParams::timeline: thread 0 of the block folds %globaltimer into the min /
/// max pair of `event` (a GemvTimelineEvent, decode_kernels.cuh).
__device__ __forceinline__ void timeline_mark(unsigned long long* timeline, int event) {
  timeline_fold(timeline, event);
}

/// acc[r] += the batch's chunks of weight row r . the staged input: chunks base,
/// base + stride, ..., those past the row skipped. kSumSquares: *squares += the squares
/// of those x values too (the register kernel's norm_in_epilogue, in its first row).
template <int kRows, int kBatch, bool kSumSquares = false>
__device__ __forceinline__ void accumulate_batch(float (&acc)[2], const uint4 (&w)[kRows][kBatch],
                                                 const uint4* x_shared, int base, int stride, int chunks,
                                                 float* squares = nullptr) {
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int chunk = base + stride * u;
    if (chunk < chunks) {
      const uint4 xv = x_shared[chunk];
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = dot_8(w[r][u], xv, acc[r]);
      if constexpr (kSumSquares) {
        float f[8];
        unpack_8(f, xv);
#pragma unroll
        for (int e = 0; e < 8; ++e) *squares = fmaf(f[e], f[e], *squares);
      }
    }
  }
}

/// accumulate_batch against the input widened to fp32 in shared memory (stage_input's
/// x_widened): the same products summed in the same order, so the same values bit for
/// bit, without the 8 shifts and masks per chunk that widen x's bf16s in every warp
/// (the block widens each value once, while staging it). Those instructions matter: with
/// 8-24 warps on an SM reaching their dot products together, O's first row took ~1000
/// cycles from its weights in to its dot summed with x's reads and widening left out, and
/// ~1650 with them (H200, 2026-12-02; DECODE_LOG.md, sixteenth session). Each chunk now
/// costs two 16-byte shared-memory reads instead of one; the two planes keep each read
/// contiguous across the warp (16 bytes a lane, no bank conflict). Not for down: its
/// staging of 8960 values, widened too, took 0.57 us longer than the dot saved.
/// kSumSquares: as accumulate_batch's.
template <int kRows, int kBatch, bool kSumSquares = false>
__device__ __forceinline__ void accumulate_batch_widened(float (&acc)[2], const uint4 (&w)[kRows][kBatch],
                                                         const float4* x_widened, int base, int stride,
                                                         int chunks, float* squares = nullptr) {
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int chunk = base + stride * u;
    if (chunk < chunks) {
      const float4 first = x_widened[chunk], last = x_widened[chunks + chunk];
      const float xs[8] = {first.x, first.y, first.z, first.w, last.x, last.y, last.z, last.w};
      if constexpr (kSumSquares) {
#pragma unroll
        for (int e = 0; e < 8; ++e) *squares = fmaf(xs[e], xs[e], *squares);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint32_t ws[4] = {w[r][u].x, w[r][u].y, w[r][u].z, w[r][u].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // dot_8's order
          acc[r] = fmaf(low_bf16(ws[i]), xs[2 * i], acc[r]);
          acc[r] = fmaf(high_bf16(ws[i]), xs[2 * i + 1], acc[r]);
        }
      }
    }
  }
}

/// accumulate_batch with the input read from global memory instead of shared memory
/// (DecodeGemvParams::input_from_global): the kBatch x chunks are loaded first, all in
/// flight together, then used. Cached in L1 (ld.global.ca): the block's other warps read
/// the same chunks. Only after the PDL wait: x is the previous kernel's output.
template <int kRows, int kBatch>
__device__ __forceinline__ void accumulate_batch_global_input(float (&acc)[2], const uint4 (&w)[kRows][kBatch],
                                                              const uint4* x_global, int base, int stride,
                                                              int chunks) {
  uint4 xv[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int chunk = base + stride * u;
    xv[u] = chunk < chunks ? __ldca(x_global + chunk) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = dot_8(w[r][u], xv[u], acc[r]);  // zero past the row: exact
  }
}

// (value, index) a beats b: larger value, or the same value at a lower index.
__device__ __forceinline__ bool beats(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

/// One thread's share of an argmax: the values it is given, in increasing index order,
/// keep the first maximum (a strict >), and a NaN is remembered.
struct ArgmaxState {
  float best = -INFINITY;
  int best_index = INT_MAX;
  bool nan = false;
  __device__ __forceinline__ void consider(float v, int i) {
    if (isnan(v)) {
      nan = true;
    } else if (v > best || best_index == INT_MAX) {
      best = v;
      best_index = i;
    }
  }
};

/// Ends a row (unit): the warp's sum; with split > 1 the `split` warps that shared the
/// row meet in `warp_partial` ((kWarps, rows) floats; two block barriers, so every warp
/// of the block must call it the same number of times); lane 0 of the first part runs
/// the epilogue. row < 0: nothing is stored. acc is zeroed for the next row.
/// `early`: the row's epilogue inputs, already loaded by the lane that stores (see
/// decode_gemv_kernel), or nullptr to load them here. `dot_scale`: what the row's sums
/// are multiplied by before the epilogue (norm_in_epilogue's inverse RMS; 1: as they are).
/// Returns, in the lane that stored, what store_output returns (kF32: the logit, which
/// the argmax folded into the lm_head compares); 0 elsewhere.
template <GemvOutput Out, bool HasBias>
__device__ __forceinline__ float finish_row(const DecodeGemvParams& p, int row, float (&acc)[2],
                                            float (*warp_partial)[rows_per_unit<Out>()], int split,
                                            const EpilogueInputs* early = nullptr, float dot_scale = 1.0f) {
  constexpr int kRows = rows_per_unit<Out>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % split;
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
  if (split > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) warp_partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (part == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        acc[r] = 0.0f;
        for (int q = 0; q < split; ++q) acc[r] += warp_partial[warp + q][r];
      }
    }
    __syncthreads();
  }
  float stored = 0.0f;
  if (row >= 0 && part == 0 && lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] *= dot_scale;  // (x 1 is exact)
    stored = early ? store_output_loaded<Out>(p, row, acc, *early) : store_output<Out, HasBias>(p, row, acc);
  }
  acc[0] = acc[1] = 0.0f;
  return stored;
}

/// The block's argmax from every thread's share: the first maximum over the block (ties
/// go to the lower index), a NaN anywhere remembered. The result is thread 0's; the other
/// threads' return values are their warps' or their own. Every thread of the block must
/// call it (one barrier). kBlockThreads: the block's size, a multiple of 32.
template <int kBlockThreads>
__device__ __forceinline__ ArgmaxState block_reduce_argmax(const ArgmaxState& mine) {
  constexpr int kBlockWarps = kBlockThreads / 32;
  __shared__ float s_value[kBlockWarps];
  __shared__ int s_index[kBlockWarps];
  __shared__ int s_nan[kBlockWarps];
  ArgmaxState r = mine;
  r.nan = __any_sync(0xffffffffu, mine.nan);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, r.best, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, r.best_index, offset);
    if (beats(other, other_index, r.best, r.best_index)) {
      r.best = other;
      r.best_index = other_index;
    }
  }
  if (threadIdx.x % 32 == 0) {
    s_value[threadIdx.x / 32] = r.best;
    s_index[threadIdx.x / 32] = r.best_index;
    s_nan[threadIdx.x / 32] = r.nan;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kBlockWarps; ++w) {
      if (beats(s_value[w], s_index[w], r.best, r.best_index)) {
        r.best = s_value[w];
        r.best_index = s_index[w];
      }
      r.nan = r.nan || s_nan[w];
    }
  }
  return r;
}

/// Chooses the block's token from every thread's share (block_reduce_argmax: the first
/// maximum, -1 after a NaN or with no value at all) and commits it: *token, then, when
/// d_length is not null, history[*d_length] (when in range) and *d_length += 1. Returns
/// the token to every thread. Every thread of the block must call it (two barriers).
template <int kBlockThreads>
__device__ __forceinline__ int32_t block_commit_argmax(const ArgmaxState& mine, int32_t* token, int* d_length,
                                                       int32_t* history, int history_size) {
  __shared__ int32_t s_chosen;
  const ArgmaxState block = block_reduce_argmax<kBlockThreads>(mine);
  if (threadIdx.x == 0) {
    const int32_t chosen = block.nan || block.best_index == INT_MAX ? -1 : block.best_index;
    s_chosen = chosen;
    *token = chosen;
    if (d_length) {
      // The token that follows position *d_length, kept where the host can fetch a whole
      // generation with one copy (CudaModel::generate_greedy).
      if (history && *d_length < history_size) history[*d_length] = chosen;
      *d_length += 1;
    }
  }
  __syncthreads();
  return s_chosen;
}

/// One block of kBlockThreads: *token = argmax(logits) (the first maximum; -1 if any
/// logit is NaN), then *d_length += 1 when d_length is not null. Returns the token to
/// every thread of the block. The logits are read through L2 (in the persistent step
/// other blocks wrote them in the same kernel).
///
/// The reads: each thread takes 16-byte chunks (4 logits) kBlockThreads apart and asks for
/// kBatch of them before it compares any, so the block's whole read (V = 32000: 7.8 chunks
/// a thread) is one trip to L2, not one per loop iteration. Within a thread the indices
/// still rise (chunk after chunk, x y z w in order), which the first-maximum rule needs.
template <int kBlockThreads>
__device__ __forceinline__ int32_t block_argmax_commit(int32_t* token, const float* logits, int V, int* d_length,
                                                       int32_t* history = nullptr, int history_size = 0) {
  constexpr int kBatch = 8;
  ArgmaxState state;
  // Whole chunks only when the logits are 16-byte aligned (cudaMalloc'd buffers are);
  // the rest, or everything otherwise, one value at a time.
  const bool aligned = reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  const int chunks = aligned ? V / 4 : 0;
  const float4* logits4 = reinterpret_cast<const float4*>(logits);
  for (int base = 0; base < chunks; base += kBatch * kBlockThreads) {
    float4 held[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int c = base + b * kBlockThreads + int(threadIdx.x);
      if (c < chunks) held[b] = __ldcg(logits4 + c);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int c = base + b * kBlockThreads + int(threadIdx.x);
      if (c < chunks) {
        state.consider(held[b].x, 4 * c);
        state.consider(held[b].y, 4 * c + 1);
        state.consider(held[b].z, 4 * c + 2);
        state.consider(held[b].w, 4 * c + 3);
      }
    }
  }
  for (int i = 4 * chunks + int(threadIdx.x); i < V; i += kBlockThreads) state.consider(__ldcg(logits + i), i);
  return block_commit_argmax<kBlockThreads>(state, token, d_length, history, history_size);
}

/// The measurement hooks of a decode GEMV (DecodeGemvParams::timeline,
/// DecodeGemvParams::hold and DecodeGemvParams::stage_input_bulk) are compiled only into
/// the kernels' kProbes instances, which the launchers pick when one of them is asked
/// for. Tested at run time instead, null in the defaults, they cost the default decode
/// step 0.5% (H200, 2026-12-03, DECODE_LOG.md, twenty-ninth session): a test and its code
/// in the hot path still change what the compiler can do with the registers around it.
template <bool kProbes>
__device__ __forceinline__ unsigned long long* probe_timeline(const DecodeGemvParams& p) {
  return kProbes ? p.timeline : nullptr;  // a compile-time null: every stamp folds away
}

/// Whether a launch needs the kProbes instance: one of the hooks is asked for.
inline bool probes_asked(const DecodeGemvParams& p) {
  return p.timeline != nullptr || p.hold.tag != nullptr || p.stage_input_bulk;
}

/// DecodeGemvParams::hold: thread 0 polls the tag (relaxed loads, a pause between them)
/// until it is the step's or the time is up; the block waits for thread 0.
__device__ __forceinline__ void hold_for_signal(const HoldForSignal& hold) {
  if (hold.tag == nullptr || int(blockIdx.x) >= hold.blocks || int(blockIdx.x) < hold.first_block) return;
  if (threadIdx.x == 0) {
    const unsigned expected = unsigned(*hold.d_length) + 1u;
    const unsigned long long give_up = globaltimer_ns() + kHoldTimeoutNs;
    for (;;) {
      unsigned seen;
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(hold.tag) : "memory");
      if (seen == expected || globaltimer_ns() >= give_up) break;
      __nanosleep(64);
    }
  }
  __syncthreads();
}

/// DecodeGemvParams::start_delay_ns: thread 0 waits that long, the block waits for it.
__device__ __forceinline__ void delay_start(int delay_ns) {
  if (delay_ns <= 0) return;
  if (threadIdx.x == 0) {
    const unsigned long long until = globaltimer_ns() + unsigned(delay_ns);
    while (globaltimer_ns() < until) __nanosleep(32);
  }
  __syncthreads();
}

/// The norm weight's first chunks, loaded before the PDL wait (no kernel writes them).
template <GemvInput In>
__device__ __forceinline__ void load_norm_weight(const DecodeGemvParams& p, uint4 (&norm_held)[kNormHeld]) {
  const int chunks = p.K / 8;
  if constexpr (In == GemvInput::kRmsNorm || In == GemvInput::kRmsNormAddPartials) {
#pragma unroll
    for (int j = 0; j < kNormHeld; ++j) {
      const int c = threadIdx.x + j * kThreads;
      norm_held[j] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(p.norm_weight) + c) : make_uint4(0, 0, 0, 0);
    }
  }
}

/// Waits for the previous kernel, then stages the input vector (K/8 uint4) in shared
/// memory, RMS-normalized for kRmsNorm (a block reduction in `scratch`, kWarps floats).
/// Ends with a __syncthreads: x_shared is complete for every thread. Every thread of the
/// block must call it (no early exit before: the next kernel's wait relies on ours).
/// kCoherent: read x through L2 only (x was written earlier in the same kernel by other
/// blocks: chapter 08's persistent decode step; L1 may hold an old copy).
///
/// x_widened (decode_gemv_kernel's): the same values also written as fp32 in two planes
/// of K/8 float4 each, the first four and the last four values of each chunk (see
/// accumulate_batch_widened), by the thread that stages the chunk; nullptr: none.
/// Chunk c of the staged input, widened into x_widened's two planes (nullptr: none).
__device__ __forceinline__ void store_widened_chunk(float4* x_widened, int chunks, int c, uint4 packed) {
  if (x_widened == nullptr) return;
  float f[8];
  unpack_8(f, packed);
  x_widened[c] = make_float4(f[0], f[1], f[2], f[3]);
  x_widened[chunks + c] = make_float4(f[4], f[5], f[6], f[7]);
}

/// The norm of a staged input: x_shared holds x, each thread has summed the squares of
/// the chunks c = threadIdx.x + j kThreads (the ones it staged); the block sums them and
/// each thread writes its chunks back as bf16(x * inverse_rms * norm_weight), widened too
/// where x_widened is given. Ends on a barrier.
__device__ __forceinline__ void normalize_staged(const DecodeGemvParams& p, uint4* x_shared, float* scratch,
                                                 const uint4 (&norm_held)[kNormHeld], float sum_squares,
                                                 float4* x_widened) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = p.K / 8;
  sum_squares = warp_sum(sum_squares);
  if (lane == 0) scratch[warp] = sum_squares;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) total += scratch[i];
  const float inverse_rms = rsqrtf(total / float(p.K) + p.eps);
  // Each thread normalizes the chunks it staged (no barrier needed between the two).
  auto normalize = [&](int c, uint4 weight) {
    float f[8], g[8];
    unpack_8(f, x_shared[c]);
    unpack_8(g, weight);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] * inverse_rms * g[e];
    const uint4 packed = pack_8(f);  // rounded to bf16 once, as chapter 02's norm stores it
    x_shared[c] = packed;
    store_widened_chunk(x_widened, chunks, c, packed);
  };
#pragma unroll
  for (int j = 0; j < kNormHeld; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) normalize(c, norm_held[j]);
  }
  for (int c = threadIdx.x + kNormHeld * kThreads; c < chunks; c += kThreads) {
    normalize(c, __ldg(reinterpret_cast<const uint4*>(p.norm_weight) + c));
  }
  __syncthreads();  // scratch may be reused by the caller
}

/// stage_input's leave_raw (kRmsNorm and kRmsNormAddPartials, whose h = x + the partials
/// is then staged as it is; the register kernel's
/// DecodeGemvParams::norm_in_epilogue): x staged as it is, widened too where x_widened is
/// given, and not normalized: no block sum, no pass, one barrier. The caller's warps each
/// find the inverse RMS themselves and apply it after their dots (decode_gemv_kernel).
/// (The staging loop still sums its chunks' squares, unused then: a runtime flag.)
template <GemvInput In, bool kCoherent = false, bool kProbes = true>
__device__ __forceinline__ void stage_input(const DecodeGemvParams& p, uint4* x_shared, float* scratch,
                                            const uint4 (&norm_held)[kNormHeld], float4* x_widened = nullptr,
                                            bool leave_raw = false) {
  const int chunks = p.K / 8;
  unsigned long long* const timeline = probe_timeline<kProbes>(p);
  auto store_widened = [&](int c, uint4 packed) { store_widened_chunk(x_widened, chunks, c, packed); };
  if constexpr (In == GemvInput::kAttentionMerge) {
    // The attention's combine, done here instead of in a kernel of its own: one launch
    // (and one drain) fewer per layer. The length first, before the wait: an earlier step
    // committed it (chapter 07's split kernel reads it there too).
    const AttentionMergeSource& a = p.merge;
    const int kv_len = min(*a.d_length + a.new_tokens, a.max_context);
    const int splits = decode::splits_with_keys(kv_len, a.num_splits, a.min_keys_per_split);
    const int vectors_per_head = a.D / 8;
    pdl_wait();  // the split kernel's partials are complete
    timeline_mark(timeline, kTimelineWaitReturned);
    for (int c = threadIdx.x; c < chunks; c += kThreads) {
      float merged[8];
      decode::merge_split_partials_8(merged, a.partial_acc, a.partial_ml, splits, a.H, a.D, c / vectors_per_head,
                                     (c % vectors_per_head) * 8);
      x_shared[c] = pack_8(merged);  // rounded to bf16, as the combine kernel stores it
      store_widened(c, x_shared[c]);
    }
    __syncthreads();
    return;
  }
  pdl_wait();
  timeline_mark(timeline, kTimelineWaitReturned);
  const uint4* x_vectors = reinterpret_cast<const uint4*>(p.x);
  float sum_squares = 0.0f;
  constexpr bool kNormalized = In == GemvInput::kRmsNorm || In == GemvInput::kRmsNormAddPartials;
  if constexpr (In == GemvInput::kRmsNormAddPartials) {
    // The O projection, added into the residual stream here instead of by an O kernel:
    // h = bf16(x + bf16(sum_g partials[g])), the value the unfused O GEMV's residual add
    // stores. Every block computes all of h (K = C values, a few KB from L2).
    const ResidualPartials& rp = p.residual_partials;
    for (int c = threadIdx.x; c < chunks; c += kThreads) {
      // The partials kPartialLoads at a time, their loads (and x's) in flight together,
      // summed in the order g = 0, 1, ... All kMaxResidualPartials at once hold 64 floats:
      // the gate/up kernel (80 registers a thread) spilled 76 bytes, in pairs 44 (ptxas -v).
      // (Its instances with the norm in the epilogue and x widened spill 72-100 bytes
      // in pairs; one at a time, or the groups summed in a loop, 84-148: forty-second
      // session.)
      constexpr int kPartialLoads = 2;
      const uint4 x_raw = kCoherent ? __ldcg(x_vectors + c) : x_vectors[c];
      float o[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int g0 = 0; g0 < kMaxResidualPartials; g0 += kPartialLoads) {
        if (g0 >= rp.count) break;
        float4 part[kPartialLoads][2];
#pragma unroll
        for (int j = 0; j < kPartialLoads; ++j) {
          const int g = g0 + j;
          const float4* source = reinterpret_cast<const float4*>(rp.partials + size_t(g) * p.K) + 2 * c;
          part[j][0] = g < rp.count ? __ldcg(source) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          part[j][1] = g < rp.count ? __ldcg(source + 1) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < kPartialLoads; ++j) {  // + 0.0f past count: exact
          o[0] += part[j][0].x, o[1] += part[j][0].y, o[2] += part[j][0].z, o[3] += part[j][0].w;
          o[4] += part[j][1].x, o[5] += part[j][1].y, o[6] += part[j][1].z, o[7] += part[j][1].w;
        }
      }
      float h[8];
      unpack_8(h, x_raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] += round_bf16(o[e]);
      const uint4 packed = pack_8(h);  // h rounded to bf16: what the unfused O GEMV stores
      x_shared[c] = packed;
      if (leave_raw) store_widened(c, packed);
      float f[8];
      unpack_8(f, packed);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_squares += f[e] * f[e];
    }
  } else {
    // kStageLoads vectors per thread in flight at once: the down projection's 8960 values
    // (1120 vectors) arrive in ONE trip to L2 instead of two. The normalized inputs are
    // hidden vectors (K <= 4096 in any model here, see kNormHeld): 2 cover them, and the
    // registers of 3 more would spill in the gate/up kernel.
    constexpr int kStageLoads = In == GemvInput::kRmsNorm ? 2 : 5;
    for (int c0 = threadIdx.x; c0 < chunks; c0 += kStageLoads * kThreads) {
      uint4 v[kStageLoads];
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int c = c0 + u * kThreads;
        v[u] = c < chunks ? (kCoherent ? __ldcg(x_vectors + c) : x_vectors[c]) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int c = c0 + u * kThreads;
        if (c < chunks) {
          x_shared[c] = v[u];
          if (!kNormalized || leave_raw) store_widened(c, v[u]);
        }
        if constexpr (In == GemvInput::kRmsNorm) {
          float f[8];
          unpack_8(f, v[u]);  // zeros past the end
#pragma unroll
          for (int j = 0; j < 8; ++j) sum_squares += f[j] * f[j];
        }
      }
    }
  }
  if constexpr (kNormalized) {
    if (!leave_raw) normalize_staged(p, x_shared, scratch, norm_held, sum_squares, x_widened);
  }
  __syncthreads();
}

/// The register kernel's DecodeGemvParams::norm_in_epilogue where a warp's first row
/// does not cover all of x (rows split over warps): the inverse RMS of the raw x in
/// x_shared (K/8 chunks), summed by one warp alone over all of x (lane l: chunks l,
/// l + 32, ...; every lane gets the total). Each warp of the block computes the same
/// number: no shared scratch and no barrier of the block, so a warp goes from the
/// staging's barrier to its own dot products without waiting for the others. (Where a
/// warp's first row covers x, the squares are summed inside its dots instead.)
__device__ __forceinline__ float warp_inverse_rms(const uint4* x_shared, int K, float eps) {
  const int lane = threadIdx.x % 32;
  float sum_squares = 0.0f;
  for (int c = lane; c < K / 8; c += 32) {
    float f[8];
    unpack_8(f, x_shared[c]);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_squares += f[e] * f[e];
  }
  return rsqrtf(warp_sum(sum_squares) / float(K) + eps);
}

/// DecodeGemvParams::stage_input_bulk: stage_input for kPlain and kRmsNorm inputs with x
/// copied into shared memory by the bulk-copy engine (one cp.async.bulk of K * 2 bytes,
/// issued by thread 0 after the wait) instead of by every thread's loads. `arrived` is
/// an mbarrier in shared memory that thread 0 initialized for one arrival before a
/// barrier of the block (init_input_arrival). Why it was tried: the threads' own loads
/// of x leave the SM behind the weight loads it issued before the wait, and
/// bench_decode_gemv's phase table has the input staged 0.3-1.4 us after the wait
/// returned; the copy engine has its own path to L2. Measured on the H200 (2026-12-02,
/// DECODE_LOG.md, twenty-sixth session): slower, 893 against 980 tokens/s, and in the
/// chain every GEMV but the register kernel's gate/up lost 2.6-16 points of copy
/// bandwidth. An option, off.
/// leave_raw: as stage_input's.
template <GemvInput In>
__device__ __forceinline__ void stage_input_bulk(const DecodeGemvParams& p, uint4* x_shared, float* scratch,
                                                 const uint4 (&norm_held)[kNormHeld], uint64_t* arrived,
                                                 float4* x_widened = nullptr, bool leave_raw = false) {
  static_assert(In == GemvInput::kPlain || In == GemvInput::kRmsNorm, "a plain or normalized input");
  pdl_wait();
  timeline_mark(p.timeline, kTimelineWaitReturned);
  const int chunks = p.K / 8;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    const uint32_t bytes = uint32_t(p.K) * sizeof(__nv_bfloat16);  // a multiple of 16: K % 8 == 0
    stream_ptx::barrier_expect_bytes(arrived, bytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     stream_ptx::shared_address(x_shared)),
                 "l"(p.x), "r"(bytes), "r"(stream_ptx::shared_address(arrived))
                 : "memory");
  }
  stream_ptx::barrier_wait(arrived, 0);
#else
  __trap();  // the host refuses stage_input_bulk before sm_90
#endif
  if (In == GemvInput::kRmsNorm && !leave_raw) {
    float sum_squares = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += kThreads) {
      float f[8];
      unpack_8(f, x_shared[c]);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_squares += f[e] * f[e];
    }
    normalize_staged(p, x_shared, scratch, norm_held, sum_squares, x_widened);
  } else {
    for (int c = threadIdx.x; c < chunks; c += kThreads) store_widened_chunk(x_widened, chunks, c, x_shared[c]);
  }
  __syncthreads();
}

/// stage_input_bulk's mbarrier, set up by thread 0 when p.stage_input_bulk asks for it;
/// the block then meets at a barrier (the same condition for every thread).
__device__ __forceinline__ void init_input_arrival(const DecodeGemvParams& p, uint64_t* arrived) {
  if (!p.stage_input_bulk) return;
  if (threadIdx.x == 0) {
    stream_ptx::barrier_init(arrived, 1);
    stream_ptx::barrier_init_fence();
  }
  __syncthreads();
}

// Every launch goes through cudaLaunchKernelEx so that PDL is one attribute away.
inline bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace bielik::decode_device
