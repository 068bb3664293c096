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

#include <cstddef>
#include <cstdint>
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
    if (cluster_fits(kernel, ClusterLaunch(dim3(kClusterMaxSize, cluster_rows), warps * 32, kClusterMaxSize, 0, 0,
                                           false))) {
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

/// How a pushing split tells block 0 that its partial has landed (cluster_attention_push).
enum class PushSignal {
  /// Plain remote stores, then the cluster barrier's phase 1: every thread of every block
  /// arrives (release) and block 0 waits (acquire) for all of them.
  kClusterBarrier,
  /// `st.async` stores that count their own bytes on an mbarrier in block 0's shared
  /// memory (mbarrier::complete_tx): one trip carries the data and the signal, no thread
  /// arrives anywhere, and block 0 waits on that mbarrier alone.
  kMbarrierBytes,
};

/// The few PTX instructions PushSignal::kMbarrierBytes needs (sm_90).
namespace cluster_ptx {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// The shared::cluster address of `local` (this block's variable) in block `rank`.
__device__ __forceinline__ uint32_t remote_address(const void* local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(local)), "r"(rank));
  return remote;
}

/// An mbarrier expecting one arrival, made visible to the other blocks of the cluster
/// (they will count bytes on it) before this thread's cluster-barrier arrival.
__device__ __forceinline__ void init_inbox_barrier(uint64_t* barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(barrier)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// The one arrival, which also adds `bytes` to the bytes the phase waits for.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

/// Spins until phase 0 of the barrier has completed, with acquire semantics at cluster
/// scope: the bytes other blocks stored with st.async are visible after it.
__device__ __forceinline__ void wait_phase_0_cluster(uint64_t* barrier) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "INBOX_WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra INBOX_WAIT;\n"
      "}\n" ::"r"(shared_address(barrier))
      : "memory");
}

/// 16 bytes into another block's shared memory, counted on that block's mbarrier.
__device__ __forceinline__ void store_async_counted(uint32_t remote, float4 value, uint32_t remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote),
               "r"(__float_as_uint(value.x)), "r"(__float_as_uint(value.y)), "r"(__float_as_uint(value.z)),
               "r"(__float_as_uint(value.w)), "r"(remote_barrier)
               : "memory");
}

/// 8 bytes, the same way.
__device__ __forceinline__ void store_async_counted(uint32_t remote, float2 value, uint32_t remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(remote),
               "r"(__float_as_uint(value.x)), "r"(__float_as_uint(value.y)), "r"(remote_barrier)
               : "memory");
}

}  // namespace cluster_ptx

/// The bytes one pushing split hands to block 0 with PushSignal::kMbarrierBytes.
template <int D>
constexpr uint32_t kPushedPartialBytes = D * sizeof(float) + 2 * sizeof(float);

/// v6's form for ONE query head (G = 1): the same splits, merged by PUSHING instead of
/// pulling. cluster_attention above leaves each split's partial in its own block and has
/// every block read every other block's partial after a cluster barrier: a round trip
/// over the GPC's network, then a second barrier so no block leaves while others may
/// still read its shared memory. Chapter 08's timeline (v6, 2026-12-01, ~85 keys) put
/// 1.1-1.5 us between the last partial and the first store, and 0.4 us more to the end.
/// Here each block with keys STORES its partial into block 0's `inbox` (remote stores do
/// not wait for an answer) and exits; block 0 merges the partials from its own shared
/// memory, and hands the D outputs to `store`. Nobody reads a pushing block's shared
/// memory, so it may leave at once, and its SM is free for the next kernel's blocks.
///
/// The cluster barrier's phase 0 (arrive at the start, wait before the first remote
/// store) is needed either way: a block may write another block's shared memory only
/// once that block is running (and, for kMbarrierBytes, once block 0 has initialized the
/// mbarrier the stores count on). How block 0 learns that the partials are in depends on
/// kSignal:
/// * kClusterBarrier: phase 1 of the cluster barrier. Each pushing block arrives after
///   its stores with release semantics, block 0 waits (acquire). An exited thread counts
///   as arrived, so the pushing blocks need not wait for phase 1.
/// * kMbarrierBytes: the stores are `st.async`, each counting its bytes on `inbox_full`
///   (an mbarrier in block 0's shared memory). Block 0 arrives once, saying how many
///   bytes to expect ((splits with keys - 1) x kPushedPartialBytes), and waits on it.
///   No release fence in the pushing blocks, no barrier of every thread.
/// The merge is the same either way, so are the outputs, bit for bit. Every thread must
/// call this. Stamps as cluster_attention; a pushing block stamps kAttentionStored (its
/// share handed on) and returns. With allow_dependents_after_inputs the caller has not
/// let the next kernel start: each block does so once its q and first keys are in. With
/// inputs_signal the grid says when all its blocks have their inputs
/// (WaitForPreviousKernel).
template <int D, int kWarps, PushSignal kSignal, typename Store>
__device__ __forceinline__ void cluster_attention_push(cooperative_groups::cluster_group& cluster,
                                                       ClusterPartial<D, 1> (&inbox)[kClusterMaxSize],
                                                       uint64_t* inbox_full, const __nv_bfloat16* q,
                                                       const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                       int kv_head, const int* d_length, int kv_len_arg,
                                                       int max_context, Store store,
                                                       unsigned long long* timeline = nullptr,
                                                       bool allow_dependents_after_inputs = false,
                                                       unsigned* inputs_signal = nullptr) {
  constexpr bool kCounted = kSignal == PushSignal::kMbarrierBytes;
  const int split = int(cluster.block_rank()), splits = int(cluster.num_blocks());
  if (kCounted && split == 0 && threadIdx.x == 0) cluster_ptx::init_inbox_barrier(inbox_full);
  __cluster_barrier_arrive_relaxed();  // phase 0: this block is running (block 0: its mbarrier is set up)
  const int committed = d_length ? *d_length : 0;
  const int kv_len = min(committed + kv_len_arg, max_context);
  const int chunk = split_chunk_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);
  const int begin = split * chunk, end = min(kv_len, begin + chunk);
  ClusterPartial<D, 1>& mine = inbox[split];  // block 0 writes its slot in place; the others copy theirs over
  const WaitForPreviousKernel wait{timeline, allow_dependents_after_inputs, inputs_signal, committed};
  if (begin >= end) {
    if (allow_dependents_after_inputs) pdl_allow_dependents();  // no inputs to wait for
    wait();
    wait.signal_inputs_arrived(0.0f);  // nothing to load: counted at once
  } else {
    pipelined_split_partial<D, 1, kWarps, kClusterUnroll>(mine.acc, mine.ml, q, k_cache, v_cache, kv_head,
                                                          max_context, begin, end, committed, wait);
  }
  timeline_fold(timeline, kAttentionPartialDone);
  const int used = splits_with_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);
  if (split != 0) {
    if (begin < end) {
      __syncthreads();  // the partial, written by every thread of the block, is complete
      __cluster_barrier_wait();  // phase 0: block 0 is running (long since, in practice)
      const float4* from = reinterpret_cast<const float4*>(mine.acc);
      if constexpr (kCounted) {
        const uint32_t slot = cluster_ptx::remote_address(&mine, 0);
        const uint32_t barrier = cluster_ptx::remote_address(inbox_full, 0);
        for (int i = int(threadIdx.x); i < D / 4; i += int(blockDim.x)) {
          cluster_ptx::store_async_counted(slot + uint32_t(i * sizeof(float4)), from[i], barrier);
        }
        if (threadIdx.x == blockDim.x - 1) {  // a thread with no acc to store
          using Partial = ClusterPartial<D, 1>;
          cluster_ptx::store_async_counted(slot + uint32_t(offsetof(Partial, ml)),
                                           make_float2(mine.ml[0], mine.ml[1]), barrier);
        }
      } else {
        ClusterPartial<D, 1>* slot = cluster.map_shared_rank(&mine, 0);
        float4* to = reinterpret_cast<float4*>(slot->acc);
        for (int i = int(threadIdx.x); i < D / 4; i += int(blockDim.x)) to[i] = from[i];
        if (threadIdx.x < 2) slot->ml[threadIdx.x] = mine.ml[threadIdx.x];
      }
    } else if constexpr (!kCounted) {
      __cluster_barrier_wait();  // phase 0 (an empty split: nothing to hand over)
    }
    if constexpr (!kCounted) __cluster_barrier_arrive();  // phase 1, release: the stores above reach block 0's wait
    timeline_fold(timeline, kAttentionStored);
    return;
  }
  if constexpr (kCounted) {
    if (threadIdx.x == 0) {  // splits 1 .. used - 1 push (the splits that hold keys come first)
      cluster_ptx::arrive_expect_bytes(inbox_full, uint32_t(max(used - 1, 0)) * kPushedPartialBytes<D>);
    }
    __syncthreads();  // this block's own partial (inbox[0], every thread's writes) is complete
    cluster_ptx::wait_phase_0_cluster(inbox_full);  // acquire: every other split's partial is in `inbox`
  } else {
    __cluster_barrier_wait();     // phase 0
    __cluster_barrier_arrive();   // phase 1 (release: this block's own partial too)
    __cluster_barrier_wait();     // phase 1, acquire: every split's partial is in `inbox`
  }
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
