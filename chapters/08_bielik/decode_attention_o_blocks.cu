// The decode step's attention and O projection in one kernel of thread block clusters,
// one cluster per query head: `splits` blocks run chapter 07's v6 split body over the
// head's keys, and `o_blocks` more blocks of the same cluster only project the head's
// output (decode_attention_o.cuh, AttentionOBlocksParams, says why).
//
// The order of events in head h's cluster:
//   split blocks (ranks 0 .. splits - 1): v6's split body (decode::pipelined_split_partial)
//     over keys [rank chunk, (rank + 1) chunk), then the split's partial state (D sums,
//     m, l) pushed with st.async into EVERY O block's inbox, counted on that block's
//     mbarrier. Then the split leaves. No block merges for the others: in v6 block 0
//     merges and stores the head's output for the O GEMV; here only the O blocks read it,
//     so each merges it itself, and the hop through block 0 is gone.
//   O blocks (ranks splits ..): before anything waits, their rows' D columns of head h
//     (W_o[n, h D : (h + 1) D], 256 bytes a row for D = 128) are loaded into registers,
//     as every decode GEMV loads its weights; then the PDL wait, the reset of the
//     previous layer's accumulator (its share of it), the wait for the splits' partials,
//     their merge (v6's arithmetic, in rank order, rounded to bf16 as v6 stores it), one
//     dot product a row, and the row sums added into this layer's accumulator with
//     atomics (one float4 atomic per 4 rows where the rows allow it).
#include <algorithm>
#include <cooperative_groups.h>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "cluster_launch.cuh"
#include "cuda_check.cuh"
#include "decode_attention_cluster.cuh"  // chapter 07: v6's attention as a device function
#include "decode_attention_o.cuh"
#include "decode_device.cuh"  // load_streaming, l2_policy, dot_8
#include "pdl.cuh"

namespace bielik {

namespace {

namespace cg = cooperative_groups;
using namespace decode_device;

constexpr int kWarps = decode::kClusterWarps;  // v6's block: 8 warps
constexpr int kThreadsPerBlock = kWarps * 32;
// Loads of 16 bytes a thread holding an O block's rows: 8 (D = 128: 128 rows, Bielik's
// 1536 rows over 12 O blocks) or 16 (256 rows, 8 O blocks). The instance is picked by
// the rows a block owns.
constexpr int kFewLoads = 8, kManyLoads = 16;

int rows_per_o_block(int C, int o_blocks) { return (C + o_blocks - 1) / o_blocks; }
int rows_per_load(int D) { return kThreadsPerBlock / (D / 8); }

// Grid (splits + o_blocks, H), clusters of (splits + o_blocks, 1, 1).
template <int D, int kLoads>
__global__ void __launch_bounds__(kThreadsPerBlock)
    attention_o_blocks_kernel(AttentionOBlocksParams p, int splits, int rows_per_block, bool vector_atomics) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kChunks = D / 8;                            // 16-byte chunks of a row's D columns
  constexpr int kRowsPerLoad = kThreadsPerBlock / kChunks;  // rows that one load of every thread covers
  __shared__ __align__(16) __nv_bfloat16 head_out[D];      // an O block's: the head's attention output
  __shared__ decode::ClusterPartial<D, 1> inbox[decode::kClusterMaxSize];  // an O block's: the splits' partials
  __shared__ uint64_t inbox_full;  // an O block's: counts the pushed partials' bytes
  __shared__ __align__(16) float row_sums[kLoads * kRowsPerLoad];
  cg::cluster_group cluster = cg::this_cluster();
  const int head = int(blockIdx.y), group = p.H / p.Hkv, kv_head = head / group;
  const int rank = int(cluster.block_rank()), o_blocks = int(cluster.num_blocks()) - splits;

  const int committed = p.d_length ? *p.d_length : 0;  // an earlier step committed it: read before the wait
  const int kv_len = min(committed + p.new_tokens, p.max_context);
  const int used = decode::splits_with_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);  // the splits that push

  if (rank < splits) {
    // A split: v6's split body over its keys, then its partial pushed into EVERY O
    // block's inbox (st.async, counted on the O block's mbarrier). Nobody merges here:
    // the head's output is only ever read by the O blocks, so each merges it itself.
    __shared__ decode::ClusterPartial<D, 1> mine;
    // gate/up reads only constants before its wait: it may be scheduled now (or, with
    // allow_dependents_after_inputs, once this block's q and first keys are in).
    if (!p.allow_dependents_after_inputs) pdl_allow_dependents();
    __cluster_barrier_arrive_relaxed();  // phase 0: this block is running
    const int chunk_keys = decode::split_chunk_keys(kv_len, splits, kDecodeV3MinKeysPerSplit);
    const int begin = rank * chunk_keys, end = min(kv_len, begin + chunk_keys);
    const decode::WaitForPreviousKernel wait{nullptr, p.allow_dependents_after_inputs, nullptr, committed};
    if (begin >= end) {  // an empty split: pushes nothing (the splits with keys come first)
      if (p.allow_dependents_after_inputs) pdl_allow_dependents();
      return;
    }
    const __nv_bfloat16* q_of_head = p.q + size_t(head - kv_head) * D;  // as v6: q shifted by head - kv_head rows
    decode::pipelined_split_partial<D, 1, kWarps, decode::kClusterUnroll>(
        mine.acc, mine.ml, q_of_head, p.k_cache, p.v_cache, kv_head, p.max_context, begin, end, committed, wait);
    __syncthreads();           // the partial, written by every thread of the block, is complete
    __cluster_barrier_wait();  // phase 0: every O block has set up its inbox's mbarrier
    constexpr int kVectors = D / 4;  // float4s of acc; one more store carries (m, l)
    for (int i = int(threadIdx.x); i < o_blocks * (kVectors + 1); i += kThreadsPerBlock) {
      const int o_rank = i / (kVectors + 1), v = i % (kVectors + 1);
      if (o_rank * rows_per_block >= p.C) continue;  // an O block without rows waits for nothing, and may be gone
      const uint32_t slot = decode::cluster_ptx::remote_address(&inbox[rank], splits + o_rank);
      const uint32_t barrier = decode::cluster_ptx::remote_address(&inbox_full, splits + o_rank);
      using Partial = decode::ClusterPartial<D, 1>;
      if (v < kVectors) {
        decode::cluster_ptx::store_async_counted(slot + uint32_t(v * sizeof(float4)),
                                                 reinterpret_cast<const float4*>(mine.acc)[v], barrier);
      } else {
        decode::cluster_ptx::store_async_counted(slot + uint32_t(offsetof(Partial, ml)),
                                                 make_float2(mine.ml[0], mine.ml[1]), barrier);
      }
    }
    return;
  }

  // An O block: rows [row_begin, row_begin + rows) of head h's column band of W_o.
  pdl_allow_dependents();  // nothing of it is read by gate/up: its loads may start
  const int o_rank = rank - splits;
  const int row_begin = o_rank * rows_per_block;
  const int rows = max(0, min(p.C, row_begin + rows_per_block) - row_begin);
  const int chunk = int(threadIdx.x) % kChunks, first_row = int(threadIdx.x) / kChunks;
  // The weights first: no kernel writes them, so they travel while QKV still runs.
  const uint64_t policy = l2_policy(p.stream_evict_first);
  uint4 w[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = first_row + i * kRowsPerLoad;
    w[i] = r < rows ? load_streaming(p.w_o + size_t(row_begin + r) * p.H * D + size_t(head) * D + chunk * 8, policy)
                    : uint4{0, 0, 0, 0};
  }
  if (threadIdx.x == 0) {
    decode::cluster_ptx::init_inbox_barrier(&inbox_full);  // visible cluster-wide before the arrival below
    if (rows > 0) {
      decode::cluster_ptx::arrive_expect_bytes(&inbox_full, uint32_t(used) * decode::kPushedPartialBytes<D>);
    }
  }
  __syncthreads();
  __cluster_barrier_arrive_relaxed();  // phase 0: the splits may push once every block has arrived

  // The previous layer's accumulator back to its start value: its readers (that layer's
  // gate/up and down) ended before the kernel this one waits for (QKV) passed its wait.
  pdl_wait();
  if (p.reset) {
    const int blocks = p.H * o_blocks, per_block = (p.C + blocks - 1) / blocks;
    const int begin = (head * o_blocks + o_rank) * per_block;
    for (int n = begin + int(threadIdx.x); n < min(p.C, begin + per_block); n += kThreadsPerBlock) {
      p.reset[n] = p.reset_value ? __bfloat162float(p.reset_value[n]) : 0.0f;
    }
  }
  if (rows == 0) return;
  decode::cluster_ptx::wait_phase_0_cluster(&inbox_full);  // acquire: every split's partial is in `inbox`
  // The head's output, merged here from the splits' partials in rank order and rounded to
  // bf16 as v6 stores it (decode::merge_loaded_partials: the same arithmetic as v6's block 0).
  for (int d = int(threadIdx.x); d < D; d += kThreadsPerBlock) {
    float m_r[decode::kClusterMaxSize], l_r[decode::kClusterMaxSize], acc_r[decode::kClusterMaxSize];
#pragma unroll
    for (int r = 0; r < decode::kClusterMaxSize; ++r) {
      if (r < used) {
        m_r[r] = inbox[r].ml[0];
        l_r[r] = inbox[r].ml[1];
        acc_r[r] = inbox[r].acc[d];
      }
    }
    head_out[d] = __float2bfloat16(decode::merge_loaded_partials(m_r, l_r, acc_r, used));
  }
  __syncthreads();

  // Head h's share of each row: kChunks lanes a row, a shuffle sum over them.
  const uint4 x_chunk = reinterpret_cast<const uint4*>(head_out)[chunk];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = first_row + i * kRowsPerLoad;
    float sum = dot_8(w[i], x_chunk, 0.0f);
#pragma unroll
    for (int offset = kChunks / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (chunk == 0 && r < rows) row_sums[r] = sum;
  }
  __syncthreads();
  float* accumulator = p.accumulator + row_begin;
  if (vector_atomics) {  // rows_per_block and C multiples of 4: row_begin and rows are too
    for (int i = int(threadIdx.x); i < rows / 4; i += kThreadsPerBlock) {
      atomicAdd(reinterpret_cast<float4*>(accumulator) + i, reinterpret_cast<const float4*>(row_sums)[i]);
    }
  } else {
    for (int r = int(threadIdx.x); r < rows; r += kThreadsPerBlock) atomicAdd(accumulator + r, row_sums[r]);
  }
#else
  __trap();  // never launched before sm_90 (decode_attention_o_blocks_runs says no there)
#endif
}

using Kernel = void (*)(AttentionOBlocksParams, int, int, bool);

template <int D>
Kernel kernel_for_loads(int loads) {
  return loads <= kFewLoads ? attention_o_blocks_kernel<D, kFewLoads> : attention_o_blocks_kernel<D, kManyLoads>;
}

// The instance for head_dim D whose loads hold rows_per_block rows, or null when none does.
Kernel kernel_for(int D, int rows_per_block) {
  if (D != 64 && D != 128) {
    throw std::invalid_argument("decode_attention_o_blocks: D must be 64 or 128, got " + std::to_string(D));
  }
  const int loads = (rows_per_block + rows_per_load(D) - 1) / rows_per_load(D);
  if (loads > kManyLoads) return nullptr;
  return D == 128 ? kernel_for_loads<128>(loads) : kernel_for_loads<64>(loads);
}

void check_shape(int C, int H, int Hkv, int D) {
  if (C <= 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0) {
    throw std::invalid_argument("decode_attention_o_blocks: needs C > 0 and H a multiple of Hkv > 0; got C=" +
                                std::to_string(C) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv));
  }
  kernel_for(D, 1);  // throws for a D the kernel lacks
}

}  // namespace

bool decode_attention_o_blocks_runs(int C, int H, int Hkv, int D, int splits, int o_blocks) {
  check_shape(C, H, Hkv, D);
  if (!device_is_sm90_or_newer() || splits < 1 || o_blocks < 1 || splits + o_blocks > kAttentionOMaxClusterSize) {
    return false;
  }
  const Kernel kernel = kernel_for(D, rows_per_o_block(C, o_blocks));
  if (!kernel) return false;  // more rows a block than its registers hold
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(C, H, D, splits, o_blocks);
  auto found = known.find(key);
  if (found != known.end()) return found->second;
  allow_all_shared_memory(kernel);  // also opts in to the non-portable cluster size 16
  const int cluster = splits + o_blocks;
  const bool ok = cluster_fits(kernel, ClusterLaunch(dim3(cluster, H), kThreadsPerBlock, cluster, 0, 0, false));
  known.emplace(key, ok);
  return ok;
}

void decode_attention_o_blocks(const AttentionOBlocksParams& p, int splits, int o_blocks, bool pdl,
                               cudaStream_t stream) {
  check_shape(p.C, p.H, p.Hkv, p.D);
  if (!p.accumulator || !p.complete() || (p.reset && p.reset == p.accumulator)) {
    throw std::invalid_argument(
        "decode_attention_o_blocks: needs the accumulator (and a reset target other than it), q, the cache, the "
        "length and a 16-byte aligned W_o, max_context >= 1 and new_tokens >= 0");
  }
  if (!decode_attention_o_blocks_runs(p.C, p.H, p.Hkv, p.D, splits, o_blocks)) {
    throw std::invalid_argument("decode_attention_o_blocks: " + std::to_string(splits) + " splits and " +
                                std::to_string(o_blocks) + " O blocks a cluster cannot run C=" + std::to_string(p.C) +
                                " on this GPU");
  }
  const int rows_per_block = rows_per_o_block(p.C, o_blocks);
  const bool vector_atomics =
      rows_per_block % 4 == 0 && p.C % 4 == 0 && reinterpret_cast<uintptr_t>(p.accumulator) % 16 == 0;
  const int cluster = splits + o_blocks;
  const ClusterLaunch launch(dim3(cluster, p.H), kThreadsPerBlock, cluster, 0, stream, pdl);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel_for(p.D, rows_per_block), p, splits, rows_per_block,
                                vector_atomics));
}

}  // namespace bielik
