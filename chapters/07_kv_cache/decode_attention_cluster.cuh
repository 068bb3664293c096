// v5's attention of one kv head by a thread block cluster (sm_90), as a device function:
// chapter 07's v5 kernel is this plus a global store, and chapter 08's fused attention +
// O projection is this plus the projection. Not a public API.
//
// Block r of the cluster (its rank) streams split r of the kv head's keys with v3's
// pipelined body, leaves its partial state in its OWN shared memory (ClusterPartial),
// meets the cluster at a barrier, then merges outputs [r * per_block, ...) of the G x D
// from every block's partial, read through distributed shared memory, and hands each
// merged value to the caller's `store`. The caller must meet the cluster once more
// before its blocks exit: a block's shared memory must outlive the other blocks' reads.
#pragma once

#include <cooperative_groups.h>

#include <map>
#include <utility>

#include "cluster_launch.cuh"  // ClusterLaunch, for the callers
#include "decode_attention.cuh"  // kDecodeV3MinKeysPerSplit
#include "decode_attention_device.cuh"
#include "pdl.cuh"

namespace bielik::decode {

constexpr int kClusterWarps = 8;     // warps per block: 32 keys a round for D = 128
constexpr int kClusterMaxSize = 16;  // the largest (non-portable) cluster size
constexpr int kClusterUnroll = 2;    // key rounds in flight per lane group

/// One block's split, in its shared memory, read by the other blocks of the cluster.
template <int D, int G>
struct ClusterPartial {
  alignas(16) float acc[G * D];  ///< sum_j p_j v_j of this split's keys, (G, D)
  float ml[G * 2];               ///< (m, l) per query head
};

/// The largest cluster a decode-attention kernel of `warps`-warp blocks can run with, in
/// a grid of `cluster_rows` clusters (grid.y): kClusterMaxSize (16, a non-portable size)
/// if the GPU schedules one such cluster, else the portable 8. Asked once per (kernel,
/// cluster_rows). Host code: v5 and v6 launch with it.
template <typename... Params>
int largest_cluster_size(void (*kernel)(Params...), int cluster_rows, int warps = kClusterWarps) {
  static std::map<std::pair<const void*, int>, int> known;
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), cluster_rows};
  auto found = known.find(key);
  if (found != known.end()) return found->second;
  int size = 8;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    const ClusterLaunch launch(dim3(kClusterMaxSize, cluster_rows), warps * 32, kClusterMaxSize, 0, 0, false);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess && clusters >= 1) {
      size = kClusterMaxSize;
    }
  }
  (void)cudaGetLastError();  // a refused attribute or query leaves no sticky error behind
  known.emplace(key, size);
  return size;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

/// The end of both cluster merges (cluster_attention's pull, cluster_attention_push):
/// one output's partial states of splits 0 .. used - 1, already loaded (every load
/// issued before this runs), merged in rank order and normalized; l > 0 whenever the
/// splits hold a key, so no keys at all give 0.
__device__ __forceinline__ float merge_loaded_partials(const float (&m_r)[kClusterMaxSize],
                                                       const float (&l_r)[kClusterMaxSize],
                                                       const float (&acc_r)[kClusterMaxSize], int used) {
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
#pragma unroll
  for (int r = 0; r < kClusterMaxSize; ++r) {
    if (r >= used) break;
    const float m_new = fmaxf(m, m_r[r]);
    const float old_weight = exp2f(m - m_new), new_weight = exp2f(m_r[r] - m_new);
    l = l * old_weight + l_r[r] * new_weight;
    acc = acc * old_weight + acc_r[r] * new_weight;
    m = m_new;
  }
  return l > 0.0f ? acc / l : 0.0f;
}

/// The attention of kv head `kv_head` for its G query heads, by the calling cluster (one
/// block per split). kv_len = *d_length + kv_len_arg (d_length may be null: 0 committed),
/// capped at max_context. The length and the committed keys are read before the PDL wait
/// (an earlier step committed them); q and the newest keys after it. Calls
/// store(output, value) for this block's share of the G x D outputs, output = h * D + d
/// within the kv head's group (no keys at all: zeros). Every thread must call it.
/// `timeline` (null: none) receives the AttentionTimelineEvent stamps from the wait to the
/// stores. The block has kWarps warps (v5: kClusterWarps; v6, one head a block, fewer).
template <int D, int G, int kWarps = kClusterWarps, typename Store>
__device__ __forceinline__ void cluster_attention(cooperative_groups::cluster_group& cluster,
                                                  ClusterPartial<D, G>& mine, const __nv_bfloat16* q,
                                                  const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                  int kv_head, const int* d_length, int kv_len_arg, int max_context,
                                                  Store store, unsigned long long* timeline = nullptr) {
  const int split = int(cluster.block_rank()), splits = int(cluster.num_blocks());
  const int committed = d_length ? *d_length : 0;
  const int kv_len = min(committed + kv_len_arg, max_context);
  const int chunk = split_chunk_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);
  const int begin = split * chunk, end = min(kv_len, begin + chunk);
  if (begin >= end) {
    WaitForPreviousKernel{timeline}();
    write_empty_partial<G>(mine.ml);
  } else {
    pipelined_split_partial<D, G, kWarps, kClusterUnroll>(mine.acc, mine.ml, q, k_cache, v_cache, kv_head,
                                                          max_context, begin, end, committed,
                                                          WaitForPreviousKernel{timeline});
  }
  timeline_fold(timeline, kAttentionPartialDone);
  cluster.sync();  // every split's partial is written and visible cluster-wide

  // Only the splits that hold keys are read (the ones after them are empty), and every
  // one of their loads is issued before any is used. A load from another block's shared
  // memory crosses the GPC's network; when each split's loads waited for the previous
  // split's merge (a loop that could `break` before the next load), the merge paid that
  // trip once per split: ~2 us from the last partial to the stores with 8 splits
  // (chapter 08's timeline, 2026-12-01). The merge itself runs in rank order, as before.
  const int used = splits_with_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);
  constexpr int kOutputs = G * D;
  const int per_block = (kOutputs + splits - 1) / splits;
  for (int i = int(threadIdx.x); i < per_block && split * per_block + i < kOutputs; i += int(blockDim.x)) {
    const int output = split * per_block + i;
    const int h = output / D;
    float m_r[kClusterMaxSize], l_r[kClusterMaxSize], acc_r[kClusterMaxSize];
#pragma unroll
    for (int r = 0; r < kClusterMaxSize; ++r) {  // the loads: predicated, none waits for another
      if (r < used) {
        const ClusterPartial<D, G>* remote = cluster.map_shared_rank(&mine, r);
        m_r[r] = remote->ml[2 * h];
        l_r[r] = remote->ml[2 * h + 1];
        acc_r[r] = remote->acc[output];
      }
    }
    store(output, merge_loaded_partials(m_r, l_r, acc_r, used));
  }
  timeline_fold(timeline, kAttentionStored);
}

/// v6's form for ONE query head (G = 1): the same splits, merged by PUSHING instead of
/// pulling. cluster_attention above leaves each split's partial in its own block and has
/// every block read every other block's partial after a cluster barrier: a round trip
/// over the GPC's network, then a second barrier so no block leaves while others may
/// still read its shared memory. Chapter 08's timeline (v6, 2026-12-01, ~85 keys) put
/// 1.1-1.5 us between the last partial and the first store, and 0.4 us more to the end.
/// Here each block with keys STORES its partial into block 0's `inbox` (remote stores do
/// not wait for an answer), arrives at the cluster barrier with release semantics and
/// exits; block 0 waits at the barrier (acquire), merges the partials from its own shared
/// memory, and hands the D outputs to `store`. Nobody reads a pushing block's shared
/// memory, so it may leave at once, and its SM is free for the next kernel's blocks.
///
/// The barrier is used twice: phase 0 (arrive at the start, wait before the first
/// remote store) because a block may write another block's shared memory only once that
/// block is running; phase 1 (arrive after the stores, block 0 waits) to hand the
/// partials over. An exited thread counts as arrived, so the pushing blocks need not
/// wait for phase 1. Every thread must call this. Stamps as cluster_attention; a pushing
/// block stamps kAttentionStored (its share handed on) and returns right after its
/// phase-1 arrival.
template <int D, int kWarps, typename Store>
__device__ __forceinline__ void cluster_attention_push(cooperative_groups::cluster_group& cluster,
                                                       ClusterPartial<D, 1> (&inbox)[kClusterMaxSize],
                                                       const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                                       const __nv_bfloat16* v_cache, int kv_head, const int* d_length,
                                                       int kv_len_arg, int max_context, Store store,
                                                       unsigned long long* timeline = nullptr) {
  __cluster_barrier_arrive_relaxed();  // phase 0: this block is running
  const int split = int(cluster.block_rank()), splits = int(cluster.num_blocks());
  const int committed = d_length ? *d_length : 0;
  const int kv_len = min(committed + kv_len_arg, max_context);
  const int chunk = split_chunk_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);
  const int begin = split * chunk, end = min(kv_len, begin + chunk);
  ClusterPartial<D, 1>& mine = inbox[split];  // block 0 writes its slot in place; the others copy theirs over
  if (begin >= end) {
    WaitForPreviousKernel{timeline}();
  } else {
    pipelined_split_partial<D, 1, kWarps, kClusterUnroll>(mine.acc, mine.ml, q, k_cache, v_cache, kv_head,
                                                          max_context, begin, end, committed,
                                                          WaitForPreviousKernel{timeline});
  }
  timeline_fold(timeline, kAttentionPartialDone);
  if (split != 0) {
    if (begin < end) {
      __syncthreads();  // the partial, written by every thread of the block, is complete
      __cluster_barrier_wait();  // phase 0: block 0 is running (long since, in practice)
      ClusterPartial<D, 1>* slot = cluster.map_shared_rank(&mine, 0);
      const float4* from = reinterpret_cast<const float4*>(mine.acc);
      float4* to = reinterpret_cast<float4*>(slot->acc);
      for (int i = int(threadIdx.x); i < D / 4; i += int(blockDim.x)) to[i] = from[i];
      if (threadIdx.x < 2) slot->ml[threadIdx.x] = mine.ml[threadIdx.x];
    } else {
      __cluster_barrier_wait();  // phase 0 (an empty split: nothing to hand over)
    }
    __cluster_barrier_arrive();  // phase 1, release: the stores above are visible to block 0's wait
    timeline_fold(timeline, kAttentionStored);
    return;
  }
  __cluster_barrier_wait();     // phase 0
  __cluster_barrier_arrive();   // phase 1 (release: this block's own partial too)
  __cluster_barrier_wait();     // phase 1, acquire: every split's partial is in `inbox`
  const int used = splits_with_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);
  for (int d = int(threadIdx.x); d < D; d += int(blockDim.x)) {
    // As cluster_attention's merge: every load first (local shared memory now, but a
    // chain of dependent loads still costs a trip each), then the merge in rank order.
    float m_r[kClusterMaxSize], l_r[kClusterMaxSize], acc_r[kClusterMaxSize];
#pragma unroll
    for (int r = 0; r < kClusterMaxSize; ++r) {
      if (r < used) {
        m_r[r] = inbox[r].ml[0];
        l_r[r] = inbox[r].ml[1];
        acc_r[r] = inbox[r].acc[d];
      }
    }
    store(d, merge_loaded_partials(m_r, l_r, acc_r, used));
  }
  timeline_fold(timeline, kAttentionStored);
}

#endif  // sm_90

}  // namespace bielik::decode
