// Device building blocks shared by the decode attention versions (not a public API).
//
// The lane layout both versions use: one key row of D bf16 is D/8 16-byte vectors, so
// an aligned group of kLanesPerKey = D/8 lanes reads one key with one load each
// (D=128: 16 lanes, two keys per warp; D=64: 8 lanes, four keys per warp). Each lane
// owns 8 of the D dimensions: its slice of q, of every key and value, and of the output
// accumulator. A dot product is 8 FMAs per lane plus log2(D/8) shuffles.
//
// Softmax state. For a set of keys S and one query head the state is
//     m = max_{j in S} s_j,   l = sum_j 2^(s_j - m),   acc = sum_j 2^(s_j - m) v_j
// with s_j the score in log2 units (q is pre-multiplied by log2(e)/sqrt(D), so 2^s is
// e^(q.k/sqrt(D)) and the kernel uses the cheap exp2). Two states over disjoint key
// sets merge exactly (rescale both to the larger max and add), which is what lets
// lanes, warps, blocks and splits each work on their own keys: out = acc / l at the end.
// An empty set has m = -inf, l = 0, acc = 0 and weighs nothing in a merge.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "decode_attention.cuh"  // AttentionTimelineEvent
#include "globaltimer.cuh"
#include "pdl.cuh"

namespace bielik::decode {

constexpr float kLog2e = 1.4426950408889634f;

/// Lanes that share one key row, and keys side by side in one warp.
template <int D>
struct LaneLayout {
  static_assert(D == 64 || D == 128, "decode attention is compiled for D = 64 and 128");
  static constexpr int kLanesPerKey = D / 8;
  static constexpr int kKeysPerWarp = 32 / kLanesPerKey;
};

/// How the split kernels cut kv_len keys: num_splits chunks of at least min_keys keys,
/// split s taking [s * chunk, min(kv_len, (s + 1) * chunk)); the splits past the last
/// key are empty. Whoever merges the partials (a combine kernel, or chapter 08's O
/// projection) uses the same arithmetic to know how many splits hold keys.
__host__ __device__ inline int split_chunk_keys(int kv_len, int num_splits, int min_keys) {
  const int even = (kv_len + num_splits - 1) / num_splits;
  return even > min_keys ? even : min_keys;
}
__host__ __device__ inline int splits_with_keys(int kv_len, int num_splits, int min_keys) {
  if (kv_len <= 0) return 0;
  const int chunk = split_chunk_keys(kv_len, num_splits, min_keys);
  const int used = (kv_len + chunk - 1) / chunk;
  return used < num_splits ? used : num_splits;
}

/// One 16-byte load (8 bf16) widened to fp32.
__device__ __forceinline__ void bf16x8_to_float(const int4& raw, float (&out)[8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

/// Sum over the kLanes lanes of an aligned lane group; every lane of the group gets it.
/// All 32 lanes must call it (full-warp shuffles).
template <int kLanes>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// (m, l, acc) <- merge of itself and (m_other, l_other, acc_other).
__device__ __forceinline__ void merge_state(float& m, float& l, float (&acc)[8], float m_other, float l_other,
                                            const float (&acc_other)[8]) {
  float m_new = fmaxf(m, m_other);
  if (m_new == -INFINITY) return;  // both empty
  float a = exp2f(m - m_new), b = exp2f(m_other - m_new);  // exp2(-inf) = 0
  l = l * a + l_other * b;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = acc[e] * a + acc_other[e] * b;
  m = m_new;
}

/// Merges the states of all lane groups of a warp into every group (butterfly over the
/// group index). All 32 lanes must call it.
template <int kLanesPerKey>
__device__ __forceinline__ void warp_merge_groups(float& m, float& l, float (&acc)[8]) {
#pragma unroll
  for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
    float m_other = __shfl_xor_sync(0xffffffffu, m, offset);
    float l_other = __shfl_xor_sync(0xffffffffu, l, offset);
    float acc_other[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc_other[e] = __shfl_xor_sync(0xffffffffu, acc[e], offset);
    merge_state(m, l, acc, m_other, l_other, acc_other);
  }
}

/// The G query heads of kv head `kv_head`, this lane's 8 dims of each, pre-scaled by
/// log2(e)/sqrt(D) so that scores come out in log2 units.
/// kCoherent (all loads here): read through L2 only, for data written earlier in the SAME
/// kernel by other blocks (chapter 08's persistent decode step); L1 and the read-only
/// path could hold a stale copy. The separate-kernel versions read with the cached paths.
template <int D, int G, bool kCoherent = false>
__device__ __forceinline__ void load_q_slices(float (&q_slice)[G][8], const __nv_bfloat16* q /* (H, D) */,
                                              int kv_head, int sub) {
  const float q_scale = kLog2e * rsqrtf(float(D));
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const int4* source = reinterpret_cast<const int4*>(q + (size_t(kv_head) * G + i) * D + sub * 8);
    bf16x8_to_float(kCoherent ? __ldcg(source) : *source, q_slice[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) q_slice[i][e] *= q_scale;
  }
}

/// Issues the loads of U keys and values for one lane group: key u is
/// base + u * groups + group (so a warp's groups read neighbouring rows), none past `end`
/// (those stay zero and are marked invalid). `keys`/`values` already point at this
/// lane's 8 dims of position 0 of the kv head.
template <int D, int U, bool kCoherent = false>
__device__ __forceinline__ void load_keys(int4 (&k_raw)[U], int4 (&v_raw)[U], const __nv_bfloat16* keys,
                                          const __nv_bfloat16* values, int base, int group, int groups, int end) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int key = base + u * groups + group;
    k_raw[u] = v_raw[u] = make_int4(0, 0, 0, 0);
    if (key < end) {
      const int4* k_source = reinterpret_cast<const int4*>(keys + size_t(key) * D);
      const int4* v_source = reinterpret_cast<const int4*>(values + size_t(key) * D);
      k_raw[u] = kCoherent ? __ldcg(k_source) : __ldg(k_source);
      v_raw[u] = kCoherent ? __ldcg(v_source) : __ldg(v_source);
    }
  }
}

/// Fills the slots of load_keys(base, ...) whose key lies in [from, end): the keys a
/// kernel may only read after waiting on the kernel before it (see
/// pipelined_split_partial's ready_end). The other slots are left as they are.
template <int D, int U, bool kCoherent = false>
__device__ __forceinline__ void load_keys_from(int4 (&k_raw)[U], int4 (&v_raw)[U], const __nv_bfloat16* keys,
                                               const __nv_bfloat16* values, int base, int group, int groups,
                                               int from, int end) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int key = base + u * groups + group;
    if (key >= from && key < end) {
      const int4* k_source = reinterpret_cast<const int4*>(keys + size_t(key) * D);
      const int4* v_source = reinterpret_cast<const int4*>(values + size_t(key) * D);
      k_raw[u] = kCoherent ? __ldcg(k_source) : __ldg(k_source);
      v_raw[u] = kCoherent ? __ldcg(v_source) : __ldg(v_source);
    }
  }
}

/// The U keys loaded by load_keys(base, ...) enter the G heads' softmax states: scores
/// (8 FMAs per lane and head, summed over the lane group), then ONE online-softmax
/// update per head for the U keys together (one rescale instead of U). All lanes call.
template <int D, int G, int U>
__device__ __forceinline__ void update_states(float (&m)[G], float (&l)[G], float (&acc)[G][8],
                                              const float (&q_slice)[G][8], const int4 (&k_raw)[U],
                                              const int4 (&v_raw)[U], int base, int group, int groups, int end) {
  float s[U][G];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool valid = base + u * groups + group < end;
    float k[8];
    bf16x8_to_float(k_raw[u], k);
#pragma unroll
    for (int i = 0; i < G; ++i) {
      float dot = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot += q_slice[i][e] * k[e];
      s[u][i] = group_sum<LaneLayout<D>::kLanesPerKey>(dot);
      if (!valid) s[u][i] = -INFINITY;
    }
  }
#pragma unroll
  for (int i = 0; i < G; ++i) {
    float m_new = m[i];
#pragma unroll
    for (int u = 0; u < U; ++u) m_new = fmaxf(m_new, s[u][i]);
    if (m_new == -INFINITY) continue;  // this group has seen no key yet
    const float alpha = exp2f(m[i] - m_new);
    l[i] *= alpha;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] *= alpha;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float p = exp2f(s[u][i] - m_new);  // 0 for an invalid key
      float v[8];
      bf16x8_to_float(v_raw[u], v);  // zeros for an invalid key; unpacked where used (registers)
      l[i] += p;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][e] += p * v[e];
    }
    m[i] = m_new;
  }
}

/// Nothing to do between the first loads and the rest (pipelined_split_partial's default),
/// and no stamps: mark(event, value) is where a timed kernel records that `value` (a
/// register the event's work produced) has arrived (WaitForPreviousKernel).
struct NoWait {
  __device__ void operator()() const {}
  __device__ void mark(int, float) const {}
};

/// Merges the block's lane-group states (shuffles within each warp, shared memory across
/// the kWarps warps) and writes the block's partial state for its G heads:
/// acc_out (G, D) and ml_out (G, 2). Called by all threads of a block whose key range
/// was not empty. `hooks.mark` (see NoWait) stamps the moment the warps' states are in
/// shared memory.
template <int D, int G, int kWarps, typename Hooks = NoWait>
__device__ __forceinline__ void write_block_partial(float* acc_out, float* ml_out, float (&m)[G], float (&l)[G],
                                                    float (&acc)[G][8], const Hooks& hooks = {}) {
  constexpr int kLanesPerKey = LaneLayout<D>::kLanesPerKey;
  __shared__ float s_m[kWarps][G], s_l[kWarps][G];
  __shared__ __align__(16) float s_acc[kWarps][G][D];  // read and written as float4
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % kLanesPerKey;
#pragma unroll
  for (int i = 0; i < G; ++i) {
    warp_merge_groups<kLanesPerKey>(m[i], l[i], acc[i]);
    if (lane < kLanesPerKey) {  // group 0 of each warp now holds the warp's state
      float4* row = reinterpret_cast<float4*>(&s_acc[warp][i][sub * 8]);
      row[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      row[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
      if (sub == 0) {
        s_m[warp][i] = m[i];
        s_l[warp][i] = l[i];
      }
    }
  }
  __syncthreads();
  hooks.mark(kAttentionWarpsMerged, 0.0f);
  for (int index = threadIdx.x; index < G * D; index += blockDim.x) {
    const int i = index / D, d = index % D;
    float m_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, s_m[w][i]);  // finite: the range is not empty
    float l_sum = 0, a_sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(s_m[w][i] - m_max);  // 0 for a warp that saw no key
      l_sum += s_l[w][i] * weight;
      a_sum += s_acc[w][i][d] * weight;
    }
    acc_out[size_t(i) * D + d] = a_sum;
    if (d == 0) {
      ml_out[2 * i] = m_max;
      ml_out[2 * i + 1] = l_sum;
    }
  }
}

/// A block whose key range is empty leaves "no keys" (m = -inf, l = 0) for its G heads;
/// its acc is not written, and a combine skips it without reading it.
template <int G>
__device__ __forceinline__ void write_empty_partial(float* ml_out /* (G, 2) */) {
  if (threadIdx.x < G) {
    ml_out[2 * threadIdx.x] = -INFINITY;
    ml_out[2 * threadIdx.x + 1] = 0;
  }
}

/// A grid's progress signal (two words: a count, a tag; WaitForPreviousKernel's
/// inputs_signal): thread 0 of each block adds 1 to the count once it holds `value`; the
/// grid's last block resets the count and writes the tag, committed + 1. signal null: no-op.
__device__ __forceinline__ void count_block_in(unsigned* signal, int committed, float value = 0.0f) {
  if (signal == nullptr || threadIdx.x != 0) return;
  unsigned zero;  // 0, but only once value is in the register: the add waits for the loads
  asm volatile("and.b32 %0, %1, 0;" : "=r"(zero) : "r"(__float_as_uint(value)));
  const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(signal, 1u + zero) == blocks - 1) {  // every block of the grid has counted
    atomicExch(signal, 0u);                          // for the next step's launch
    atomicExch(signal + 1, unsigned(committed) + 1u);
  }
}

/// What a split kernel launched with PDL does there: wait for the kernel before it (the
/// one that wrote q and the newest keys). v3's and v5's split kernels pass it; v5 with an
/// optional timeline (null: none).
/// With allow_dependents_after_inputs (v6's option) the kernel lets the next one be
/// scheduled only once q and its first keys have arrived (every thread, each once its own
/// loads are in), instead of at its start: the next kernel's weight loads then no longer
/// queue in front of these L2 reads.
///
/// With inputs_signal (v6's pushed hand-overs, chapter 08's decode step) the grid also
/// tells the kernels after it when all its blocks have their inputs: two words, a count
/// and a tag. Thread 0 of each block adds 1 to the count once its own inputs are in (a
/// block without keys: once its wait returned); the grid's last block resets the count
/// and writes the tag, committed + 1, the step's own value. A kernel that holds its weight
/// loads until then (chapter 08's DecodeGemvParams::hold) compares the tag with the
/// length it reads itself. A hint for the memory system's queues only: nothing reads data
/// on the strength of it.
struct WaitForPreviousKernel {
  unsigned long long* timeline = nullptr;
  bool allow_dependents_after_inputs = false;
  unsigned* inputs_signal = nullptr;  ///< (2): the count, the tag; or nullptr
  int committed = 0;                  ///< the step's committed length (the tag is committed + 1)
  __device__ void operator()() const {
    pdl_wait();
    timeline_fold(timeline, kAttentionWaitReturned);
  }
  __device__ void mark(int event, float value) const {
    if (event == kAttentionInputsArrived) {
      if (allow_dependents_after_inputs && value_has_arrived(value)) pdl_allow_dependents();  // not before the loads are in
      signal_inputs_arrived(value);
    }
    timeline_fold_when_ready(timeline, event, value);
  }
  /// Counts this block in once thread 0 holds `value` (see inputs_signal).
  __device__ void signal_inputs_arrived(float value) const { count_block_in(inputs_signal, committed, value); }
};

/// v3's split body (also v4's): one block's keys [begin, end) of kv head `kv_head`
/// streamed in rounds of kUnroll keys per lane group, the next round's loads in flight
/// while the current one is computed; the block's partial state is written at the end.
/// The first round's keys below `ready_end` are loaded, then `after_first_loads()` runs
/// (v3's split kernel waits there on the kernel before it, which wrote q and the keys from
/// ready_end on), then the rest of the first round and q: keys committed by earlier steps
/// are already on their way while the previous kernel finishes. `after_first_loads.mark`
/// stamps the inputs' arrival, the states' update and the warps' merge (NoWait: nothing).
template <int D, int G, int kWarps, int kUnroll, bool kCoherent = false, typename AfterFirstLoads = NoWait>
__device__ __forceinline__ void pipelined_split_partial(float* acc_out, float* ml_out, const __nv_bfloat16* q,
                                                        const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                        int kv_head, int max_context, int begin, int end,
                                                        int ready_end = 0x7fffffff,
                                                        AfterFirstLoads after_first_loads = {}) {
  using Layout = LaneLayout<D>;
  constexpr int kGroups = kWarps * Layout::kKeysPerWarp;  // lane groups in the block
  constexpr int kKeysPerRound = kGroups * kUnroll;
  const int lane = threadIdx.x % 32;
  const int group = threadIdx.x / 32 * Layout::kKeysPerWarp + lane / Layout::kLanesPerKey;
  const int sub = lane % Layout::kLanesPerKey;
  // The first round's loads go out before anything else.
  const __nv_bfloat16* keys = k_cache + size_t(kv_head) * max_context * D + sub * 8;
  const __nv_bfloat16* values = v_cache + size_t(kv_head) * max_context * D + sub * 8;
  int4 k_raw[kUnroll], v_raw[kUnroll];
  load_keys<D, kUnroll, kCoherent>(k_raw, v_raw, keys, values, begin, group, kGroups, min(end, ready_end));
  after_first_loads();
  if (ready_end < end) {
    load_keys_from<D, kUnroll, kCoherent>(k_raw, v_raw, keys, values, begin, group, kGroups, ready_end, end);
  }

  float q_slice[G][8];
  load_q_slices<D, G, kCoherent>(q_slice, q, kv_head, sub);
  after_first_loads.mark(kAttentionInputsArrived, q_slice[G - 1][7] + __int_as_float(k_raw[0].x ^ v_raw[kUnroll - 1].w));
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int i = 0; i < G; ++i) {
    m[i] = -INFINITY;
    l[i] = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0;
  }
  for (int base = begin; base < end; base += kKeysPerRound) {  // uniform trip count
    // Next round's loads in flight (none past `end`) while this round is computed.
    int4 k_next[kUnroll], v_next[kUnroll];
    load_keys<D, kUnroll, kCoherent>(k_next, v_next, keys, values, base + kKeysPerRound, group, kGroups, end);
    update_states<D, G, kUnroll>(m, l, acc, q_slice, k_raw, v_raw, base, group, kGroups, end);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      k_raw[u] = k_next[u];
      v_raw[u] = v_next[u];
    }
  }
  after_first_loads.mark(kAttentionStatesUpdated, l[G - 1]);
  write_block_partial<D, G, kWarps>(acc_out, ml_out, m, l, acc, after_first_loads);
}

/// The attention output of query head h, dims d0 .. d0 + 7, merged from the partial
/// states of splits 0 .. splits - 1 (the ones that hold keys, splits_with_keys):
/// out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, the merge the combine kernels
/// do, for a consumer that merges while it stages its input (chapter 08's O projection).
/// Reads through L2 (the partials were written by the kernel before). Splits are loaded
/// kBatch at a time, all loads of a batch independent, so they are in flight together.
/// An empty split (m = -inf, acc never written) weighs nothing whatever its acc holds;
/// no keys at all give zeros.
__device__ __forceinline__ void merge_split_partials_8(float (&out)[8], const float* partial_acc /* (S, H, D) */,
                                                       const float* partial_ml /* (S, H, 2) */, int splits, int H,
                                                       int D, int h, int d0) {
  constexpr int kBatch = 2;  // 4 spilled in chapter 08's O projection (80 registers a thread)
  float m = -INFINITY, l = 0;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int first = 0; first < splits; first += kBatch) {
    float2 ml[kBatch];
    float4 low[kBatch], high[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int s = first + b;
      ml[b] = make_float2(-INFINITY, 0.0f);
      if (s < splits) {
        ml[b] = __ldcg(reinterpret_cast<const float2*>(partial_ml + (size_t(s) * H + h) * 2));
        const float4* source = reinterpret_cast<const float4*>(partial_acc + (size_t(s) * H + h) * D + d0);
        low[b] = __ldcg(source);
        high[b] = __ldcg(source + 1);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (ml[b].x == -INFINITY) continue;  // empty, or past `splits`
      const float part[8] = {low[b].x, low[b].y, low[b].z, low[b].w, high[b].x, high[b].y, high[b].z, high[b].w};
      merge_state(m, l, acc, ml[b].x, ml[b].y, part);
    }
  }
  const float inverse = l > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = acc[e] * inverse;
}

// --- host side ----------------------------------------------------------------------

/// The kernel instantiation for G = H / Hkv query heads per kv head (a template
/// parameter: the kernels keep G heads' state in registers):
/// make(std::integral_constant<int, G>{}) returns it. Throws std::invalid_argument,
/// naming `who`, outside 1..8. Every decode attention version uses it, and so do
/// chapter 08's persistent steps.
template <typename Make>
auto kernel_for_group(int G, const char* who, Make make) -> decltype(make(std::integral_constant<int, 1>{})) {
  switch (G) {
    case 1: return make(std::integral_constant<int, 1>{});
    case 2: return make(std::integral_constant<int, 2>{});
    case 3: return make(std::integral_constant<int, 3>{});
    case 4: return make(std::integral_constant<int, 4>{});
    case 5: return make(std::integral_constant<int, 5>{});
    case 6: return make(std::integral_constant<int, 6>{});
    case 7: return make(std::integral_constant<int, 7>{});
    case 8: return make(std::integral_constant<int, 8>{});
  }
  throw std::invalid_argument(std::string(who) + ": H / Hkv = " + std::to_string(G) + " outside 1..8");
}

}  // namespace bielik::decode
