// The decode step's attention, O projection and residual add in one kernel of thread
// block clusters, one cluster per query head (decode_attention_o.cuh,
// AttentionOPerHeadParams, says why and how).
//
// The order of events in block r of head h's cluster:
//   1. before anything waits: its O rows' D columns of head h requested from W_o (one
//      bulk copy per row, counted on `rows_arrived`; or, with w_o_after_attention, after
//      step 2), and, if the residual is settled, its rows' residual and bias loaded into
//      registers (otherwise the last block to arrive loads them in step 4);
//   2. chapter 07's v6 attention (decode::cluster_attention_push): every split pushes its
//      partial into block 0, which merges the head's D outputs, rounds them to bf16 as
//      v6 stores them, and sends them with st.async into every block that owns rows,
//      counted on that block's `head_arrived` mbarrier;
//   3. its rows of W_o (in shared memory) times the head's output: head h's share of
//      each of its rows, written to partials[h][n];
//   4. the arrival count for rows r; the last of the H heads' blocks to arrive sums the
//      H shares in head order and adds them into the residual stream.
#include <algorithm>
#include <cooperative_groups.h>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "cuda_check.cuh"
#include "decode_attention_cluster.cuh"  // chapter 07: v6's attention as a device function
#include "decode_attention_o.cuh"
#include "decode_device.cuh"  // dot_8, round_bf16
#include "pdl.cuh"
#include "weight_stream.cuh"  // chapter 03: copy_async_bulk and the mbarrier

namespace bielik {

namespace {

namespace cg = cooperative_groups;
using namespace decode_device;

constexpr int kWarps = decode::kClusterWarps;  // v6's block: 8 warps
constexpr int kThreadsPerBlock = kWarps * 32;
static_assert(kAttentionOMaxClusterSize == decode::kClusterMaxSize, "the inbox holds one partial per split");

int rows_per_block(int C, int cluster) { return (C + cluster - 1) / cluster; }

// (rows, D) bf16 W_o rows, then (rows) float residuals and (rows) float biases.
size_t dynamic_bytes(int C, int D, int cluster) {
  const size_t rows = size_t(rows_per_block(C, cluster));
  return rows * D * sizeof(__nv_bfloat16) + 2 * rows * sizeof(float);
}

// Grid (S, H), clusters of (S, 1, 1).
template <int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    attention_o_per_head_kernel(AttentionOPerHeadParams p, int rows_per_block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kChunks = D / 8;  // 16-byte chunks of one row's D columns (and of the head's output)
  extern __shared__ __align__(128) uint4 dynamic_shared[];
  uint4* w_rows = dynamic_shared;  // (rows_per_block, kChunks) W_o[n, h D : (h + 1) D]
  float* residual = reinterpret_cast<float*>(w_rows + size_t(rows_per_block) * kChunks);  // (rows_per_block)
  float* bias = residual + rows_per_block;                                                // (rows_per_block)
  __shared__ __align__(16) __nv_bfloat16 head_out[D];  // the head's attention output (block 0 merges it)
  __shared__ decode::ClusterPartial<D, 1> inbox[decode::kClusterMaxSize];  // block 0's: the splits' partials
  __shared__ uint64_t inbox_full;    // block 0's: counts the pushed partials' bytes
  __shared__ uint64_t rows_arrived;  // counts this block's W_o bytes
  __shared__ uint64_t head_arrived;  // counts the bytes of head_out block 0 sends here
  __shared__ bool last_to_arrive;
  cg::cluster_group cluster = cg::this_cluster();
  const int head = int(blockIdx.y), group = p.H / p.Hkv, kv_head = head / group;
  const int rank = int(cluster.block_rank()), splits = int(cluster.num_blocks());
  const int row_begin = rank * rows_per_block;
  const int rows = max(0, min(p.C, row_begin + rows_per_block) - row_begin);
  timeline_fold(p.timeline, decode::kAttentionStart);
  // gate/up reads only constants before its wait: it may be scheduled now, and load its
  // first weights while this kernel runs (or, with allow_dependents_after_inputs, once
  // this block's q and first keys are in: cluster_attention_push does it then).
  if (!p.allow_dependents_after_inputs) pdl_allow_dependents();

  // 1. The W_o rows first: no kernel writes them, so they travel while QKV still runs.
  //    The mbarriers are initialized before cluster_attention_push's first cluster
  //    arrival, whose phase block 0 waits for before it sends head_out here.
  if (threadIdx.x == 0) {
    stream_ptx::barrier_init(&rows_arrived, 1);
    stream_ptx::barrier_init(&head_arrived, 1);
    stream_ptx::barrier_init_fence();
    stream_ptx::barrier_expect_bytes(&rows_arrived, uint32_t(rows) * D * sizeof(__nv_bfloat16));
    if (rank != 0) stream_ptx::barrier_expect_bytes(&head_arrived, D * sizeof(__nv_bfloat16));
  }
  __syncthreads();
  auto copy_w_o_rows = [&] {
    for (int r = int(threadIdx.x); r < rows; r += kThreadsPerBlock) {
      copy_async_bulk(w_rows + size_t(r) * kChunks, p.w_o + size_t(row_begin + r) * p.H * D + size_t(head) * D,
                      D * sizeof(__nv_bfloat16), &rows_arrived);
    }
  };
  if (!p.w_o_after_attention) copy_w_o_rows();
  // The residual and the bias of these rows: only the last block to arrive uses them,
  // but which one that is nobody knows yet, and 8 bytes a row are cheap. Loaded into
  // registers (kEarlyRows a thread), so no thread waits for them before it must.
  constexpr int kEarlyRows = 2;
  const bool early = p.residual_settled && rows <= kEarlyRows * kThreadsPerBlock;
  __nv_bfloat16 residual_early[kEarlyRows], bias_early[kEarlyRows];
  if (early) {
#pragma unroll
    for (int i = 0; i < kEarlyRows; ++i) {
      const int r = int(threadIdx.x) + i * kThreadsPerBlock;
      residual_early[i] = r < rows ? __ldcg(p.x + row_begin + r) : __float2bfloat16(0.0f);
      bias_early[i] = r < rows && p.b_o ? p.b_o[row_begin + r] : __float2bfloat16(0.0f);
    }
  }
  auto load_epilogue_inputs = [&] {
    for (int r = int(threadIdx.x); r < rows; r += kThreadsPerBlock) {
      residual[r] = __bfloat162float(__ldcg(p.x + row_begin + r));
      bias[r] = p.b_o ? __bfloat162float(p.b_o[row_begin + r]) : 0.0f;
    }
  };

  // 2. v6's attention of this head; block 0 merges and keeps the outputs in head_out.
  const __nv_bfloat16* q_of_head = p.q + size_t(head - kv_head) * D;  // as v6: q shifted by head - kv_head rows
  auto store = [&](int d, float value) { head_out[d] = __float2bfloat16(value); };
  decode::cluster_attention_push<D, kWarps, decode::PushSignal::kMbarrierBytes>(
      cluster, inbox, &inbox_full, q_of_head, p.k_cache, p.v_cache, kv_head, p.d_length, p.new_tokens,
      p.max_context, store, p.timeline, p.allow_dependents_after_inputs, nullptr);
  if (p.w_o_after_attention) copy_w_o_rows();
  if (rank == 0) {
    __syncthreads();  // head_out is complete
    // Phase 0 of the cluster barrier: every block has initialized head_arrived (block 0
    // never waited for it in the push; the pushing blocks did).
    __cluster_barrier_wait();
    const float4* from = reinterpret_cast<const float4*>(head_out);
    for (int i = int(threadIdx.x); i < (splits - 1) * kChunks; i += kThreadsPerBlock) {
      const int to = 1 + i / kChunks, chunk = i % kChunks;
      if (to * rows_per_block >= p.C) continue;  // a block without rows never waits for it, and may have exited
      const uint32_t remote = decode::cluster_ptx::remote_address(head_out, to);
      const uint32_t barrier = decode::cluster_ptx::remote_address(&head_arrived, to);
      decode::cluster_ptx::store_async_counted(remote + uint32_t(chunk * sizeof(float4)), from[chunk], barrier);
    }
  } else if (rows > 0) {
    decode::cluster_ptx::wait_phase_0_cluster(&head_arrived);  // acquire: head_out is here
  }
  // 3. Head h's share of rows [row_begin, row_begin + rows): kChunks lanes per row, each
  //    a 16-byte chunk of the row and of head_out, then a shuffle sum over the kChunks.
  //    A block with no rows (a cluster larger than C's rows) expected 0 bytes, so its
  //    wait returns at once, and it goes through steps 3 and 4 with nothing to do: it is
  //    still counted in, as every head's block for rows r must be.
  stream_ptx::barrier_wait(&rows_arrived, 0);
  constexpr int kRowsPerPass = kThreadsPerBlock / kChunks;
  const int chunk = int(threadIdx.x) % kChunks;
  // (no rows: head_out was never written here, and is not read)
  const uint4 x_chunk = rows > 0 ? reinterpret_cast<const uint4*>(head_out)[chunk] : uint4{};
  for (int pass = 0; pass < rows; pass += kRowsPerPass) {
    const int r = pass + int(threadIdx.x) / kChunks;
    float acc = r < rows ? dot_8(w_rows[size_t(r) * kChunks + chunk], x_chunk, 0.0f) : 0.0f;
#pragma unroll
    for (int offset = kChunks / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (chunk == 0 && r < rows) p.partials[size_t(head) * p.C + row_begin + r] = acc;
  }

  // 4. Count this block in for rows r. The writes above are made visible GPU-wide first
  //    (the fence), so the block that finds the count at H - 1 reads every head's share.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned before = atomicAdd(&p.arrivals[rank], 1u);
    last_to_arrive = before == unsigned(p.H - 1);
    // Reset for the next launch, which cannot start its step 4 before this kernel ends.
    if (last_to_arrive) p.arrivals[rank] = 0u;
  }
  __syncthreads();
  if (last_to_arrive) {
    if (early) {
#pragma unroll
      for (int i = 0; i < kEarlyRows; ++i) {
        const int r = int(threadIdx.x) + i * kThreadsPerBlock;
        if (r < rows) {
          residual[r] = __bfloat162float(residual_early[i]);
          bias[r] = __bfloat162float(bias_early[i]);
        }
      }
    } else {
      load_epilogue_inputs();
    }
    __syncthreads();
    __threadfence();
    for (int r = int(threadIdx.x); r < rows; r += kThreadsPerBlock) {
      const int n = row_begin + r;
      float o = 0.0f;
      for (int h = 0; h < p.H; ++h) o += __ldcg(p.partials + size_t(h) * p.C + n);  // head order: deterministic
      // The O GEMV's epilogue: the projection + bias rounded to bf16, then added.
      p.x[n] = __float2bfloat16(residual[r] + round_bf16(o + bias[r]));
    }
  }
  timeline_fold(p.timeline, decode::kAttentionEnd);
#else
  __trap();  // never launched before sm_90 (decode_attention_o_per_head_runs says no there)
#endif
}

using Kernel = void (*)(AttentionOPerHeadParams, int);

Kernel kernel_for(int D) {
  if (D == 128) return attention_o_per_head_kernel<128>;
  if (D == 64) return attention_o_per_head_kernel<64>;
  throw std::invalid_argument("decode_attention_o_per_head: D must be 64 or 128, got " + std::to_string(D));
}

void check_shape(int C, int H, int Hkv, int D) {
  if (C <= 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0) {
    throw std::invalid_argument("decode_attention_o_per_head: needs C > 0 and H a multiple of Hkv > 0; got C=" +
                                std::to_string(C) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv));
  }
  kernel_for(D);  // throws for a D the kernel lacks
}

}  // namespace

bool decode_attention_o_per_head_runs(int C, int H, int Hkv, int D, int cluster) {
  check_shape(C, H, Hkv, D);
  if (!device_is_sm90_or_newer() || cluster < 1 || cluster > kAttentionOMaxClusterSize) return false;
  static std::mutex mutex;
  // Not keyed by device: one GPU a process is assumed.
  static std::map<std::tuple<int, int, int, int>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(C, H, D, cluster);
  auto found = known.find(key);
  if (found != known.end()) return found->second;
  const Kernel kernel = kernel_for(D);
  const size_t bytes = dynamic_bytes(C, D, cluster);
  bool ok = bytes <= allow_all_shared_memory(kernel);
  if (ok && cluster > 1) {  // (a cluster of 1 is an ordinary launch: the shared memory was the test)
    ok = cluster_fits(kernel, ClusterLaunch(dim3(cluster, H), kThreadsPerBlock, cluster, bytes, 0, false));
  }
  known.emplace(key, ok);
  return ok;
}

void decode_attention_o_per_head(const AttentionOPerHeadParams& p, int cluster, bool pdl, cudaStream_t stream) {
  check_shape(p.C, p.H, p.Hkv, p.D);
  if (!p.x || !p.partials || !p.arrivals || !p.complete()) {
    throw std::invalid_argument(
        "decode_attention_o_per_head: needs x, the partials, the arrivals, q, the cache, the length and a 16-byte "
        "aligned W_o, max_context >= 1 and new_tokens >= 0");
  }
  if (!decode_attention_o_per_head_runs(p.C, p.H, p.Hkv, p.D, cluster)) {
    throw std::invalid_argument("decode_attention_o_per_head: clusters of " + std::to_string(cluster) +
                                " blocks cannot run C=" + std::to_string(p.C) + " on this GPU");
  }
  const ClusterLaunch launch(dim3(cluster, p.H), kThreadsPerBlock, cluster, dynamic_bytes(p.C, p.D, cluster), stream,
                             pdl);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel_for(p.D), p, rows_per_block(p.C, cluster)));
}

}  // namespace bielik
