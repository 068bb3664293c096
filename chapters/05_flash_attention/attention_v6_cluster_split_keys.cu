// v6: v3's blocks, with the key tiles of every query block split over a thread block
// cluster of S blocks on S different SMs, merged through distributed shared memory.
//
// Why. In a causal prompt, query block b (64 queries) needs b + 1 key tiles: at T = 512
// the heaviest blocks run 8 tiles one after the other while most SMs sit idle. v5 split
// those tiles between two warp groups of ONE block, but the SM's tensor cores were
// already busy with one group: a tile costs a 4-warp block ~1.35 us alone on an SM and
// ~1.9-2.6 us when two share it (bench_attention's timeline), so v5 gained 7%, not 2x. The
// tiles must go to other SMs. A first v6 cut them into work items on any SM and merged
// the partial results through global memory (the last item to arrive merged): it
// balanced the SMs, but the merge (partials to L2, a fence, an atomic, then dependent
// reads) took up to 7 us and ate the gain (README). The merge must be cheap.
//
// What changed from v3:
//  * Clusters. The S blocks of query block b form a thread block cluster (sm_90). Rank r
//    runs v3's loop over the r-th contiguous chunk of b's tiles (maybe none, for light
//    query blocks: it then holds the empty state, max -inf).
//  * The merge in distributed shared memory. Every block parks its softmax state (O
//    unscaled, running max, sum share: per thread, in the order the thread holds them)
//    in its own shared memory over the K/V tiles; one cluster barrier; then rank r merges
//    the rows of warps r, r + S, ... by reading that thread's state from every rank
//    (`map_shared_rank`: a load from another SM's shared memory), in rank order, so the
//    result does not depend on timing; a second barrier keeps every block's shared
//    memory alive until all reads are done. No global memory, no atomics, no workspace.
//  * S is chosen per launch: the largest of 1, 2, 4, 8 for which the grid's blocks still
//    fit the GPU at once (T = 512 on an H200: 96 query blocks x 2 = 192 of 264) and no
//    chunk is empty for the heaviest block. S = 1 is v3 exactly, with no cluster.
// Numerics: v3's, plus the exact softmax merge of v5.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "attention.cuh"
#include "attention_ptx.cuh"
#include "attention_tile_load.cuh"
#include "attention_tile_step.cuh"
#include "cluster_launch.cuh"
#include "cuda_check.cuh"
#include "globaltimer.cuh"
#include "pdl.cuh"

namespace bielik {

namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = 16 * kWarps;     // queries per block: one 16-row mma tile per warp
constexpr int kBlockN = kFlashTileKeys;  // keys per tile (64)
constexpr int kMaxClusterSize = 8;       // the portable cluster size limit

template <int D>
constexpr size_t shared_bytes() {  // Q tile + 2 stages of K and V tiles, as v3
  return size_t(kBlockM + 4 * kBlockN) * kTileStride<D> * sizeof(__nv_bfloat16);
}

/// A block's parked softmax state, [value][thread] (consecutive threads, consecutive
/// words): D/2 values of o, then 2 maxima, then 2 sum shares.
template <int D>
constexpr int kParkedFloats = (D / 2 + 4) * kThreads;

__host__ __device__ inline int tiles_of_query_block(int block, int Tq, int Tkv) {
  const int key_end = min(Tkv, Tkv - Tq + (block + 1) * kBlockM);  // last visible key of its last query, + 1
  return (key_end + kBlockN - 1) / kBlockN;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    attention_v6_cluster_split_keys_kernel(__nv_bfloat16* out,        // (Tq, H, D)
                                           const __nv_bfloat16* q,    // (Tq, H, D)
                                           const __nv_bfloat16* k,    // (Tkv, Hkv, D)
                                           const __nv_bfloat16* v,    // (Tkv, Hkv, D)
                                           int Tq, int Tkv, int H, int Hkv, float scale_log2,
                                           int splits,                         // S, the cluster size (grid.y / query blocks)
                                           unsigned long long* block_times) {  // nullptr, or (grid, 5): see attention.cuh
  static_assert(kParkedFloats<D> * sizeof(float) <= 4 * kBlockN * kTileStride<D> * sizeof(__nv_bfloat16),
                "the parked state must fit over the K/V tiles");
  constexpr int kStride = kTileStride<D>;
  extern __shared__ __align__(16) unsigned char shared[];
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(shared);  // (kBlockM, S)
  __nv_bfloat16* k_tiles = q_tile + kBlockM * kStride;                      // (2, kBlockN, S)
  __nv_bfloat16* v_tiles = k_tiles + 2 * kBlockN * kStride;                 // (2, kBlockN, S)

  // The optional timeline (bench_attention): the SM, then %globaltimer (ns) at the start,
  // once the first tiles are in shared memory, after the last tile, and at the end.
  unsigned long long* times =
      block_times ? block_times + 5 * (size_t(blockIdx.y) * gridDim.x + blockIdx.x) : nullptr;
  auto stamp = [&](int which) {
    if (times != nullptr && threadIdx.x == 0) times[which] = globaltimer_ns();
  };
  if (times != nullptr && threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    times[0] = smid;
  }
  stamp(1);

  // Which block: query blocks heaviest first; the S blocks of one are a cluster (along y).
  const int h = blockIdx.x, kv_head = h / (H / Hkv);
  const int query_block = int(gridDim.y) / splits - 1 - int(blockIdx.y) / splits;
  const int rank = int(blockIdx.y) % splits;  // == the cluster rank: clusters are (1, S, 1)
  const int num_tiles = tiles_of_query_block(query_block, Tq, Tkv);
  const int chunk = (num_tiles + splits - 1) / splits;
  const int tile_begin = min(num_tiles, rank * chunk), tile_end = min(num_tiles, tile_begin + chunk);

  pdl_wait();  // launched with PDL (chapter 08's prefill): q, k, v may still be being written
  const int m0 = query_block * kBlockM;
  const int offset = Tkv - Tq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_top = m0 + warp * 16 + lane / 4, row_bottom = row_top + 8;
  const size_t q_stride = size_t(H) * D, kv_stride = size_t(Hkv) * D;
  const __nv_bfloat16* q_head = q + size_t(h) * D;
  const __nv_bfloat16* k_head = k + size_t(kv_head) * D;
  const __nv_bfloat16* v_head = v + size_t(kv_head) * D;
  const int unmasked_tiles = (offset + m0 + 1) / kBlockN;

  float o[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  if (tile_begin < tile_end) {  // uniform over the block
    load_tile_async<D, kBlockM, kThreads>(q_tile, q_head, q_stride, m0, Tq, threadIdx.x);
    load_tile_async<D, kBlockN, kThreads>(k_tiles, k_head, kv_stride, tile_begin * kBlockN, Tkv, threadIdx.x);
    load_tile_async<D, kBlockN, kThreads>(v_tiles, v_head, kv_stride, tile_begin * kBlockN, Tkv, threadIdx.x);
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    __syncthreads();
    stamp(2);
    uint32_t q_frag[D / 16][4];
    load_query_fragments<D>(q_frag, q_tile + warp * 16 * kStride, lane);

    // v3's loop, over this block's chunk of the tiles only.
    for (int tile = tile_begin; tile < tile_end; ++tile) {
      const int stage = (tile - tile_begin) & 1;
      if (tile + 1 < tile_end) {
        const int next_key = (tile + 1) * kBlockN;
        load_tile_async<D, kBlockN, kThreads>(k_tiles + (stage ^ 1) * kBlockN * kStride, k_head, kv_stride, next_key, Tkv,
                                              threadIdx.x);
        load_tile_async<D, kBlockN, kThreads>(v_tiles + (stage ^ 1) * kBlockN * kStride, v_head, kv_stride, next_key, Tkv,
                                              threadIdx.x);
        ptx::cp_async_commit();
        ptx::cp_async_wait<1>();
      } else {
        ptx::cp_async_wait<0>();
      }
      __syncthreads();
      flash_tile_step<D>(q_frag, k_tiles + stage * kBlockN * kStride, v_tiles + stage * kBlockN * kStride, tile,
                         tile >= unmasked_tiles, offset, Tkv, row_top, row_bottom, scale_log2, lane, o, row_max,
                         row_sum);
      __syncthreads();  // every warp is done with this stage before it is refilled (or parked over)
    }
    stamp(3);
  }  // (a block with no tile leaves stamps 2 and 3 at 0)

  __nv_bfloat16* out_head = out + size_t(h) * D;
  if (splits == 1) {  // the block had all its query block's tiles: v3's ending, no cluster
    store_normalized_rows<D>(out_head, q_stride, o, row_sum, row_top, row_bottom, Tq, lane);
    stamp(4);
    return;
  }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Park the state over the K/V tiles (the loop's last barrier freed them).
  constexpr int kValues = D / 2;  // o[D/8][4]
  float* parked = reinterpret_cast<float*>(k_tiles);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) parked[(j * 4 + e) * kThreads + threadIdx.x] = o[j][e];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    parked[(kValues + r) * kThreads + threadIdx.x] = row_max[r];
    parked[(kValues + 2 + r) * kThreads + threadIdx.x] = row_sum[r];
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every rank's state is parked and visible cluster-wide

  // Rank r finishes the rows of warps r, r + S, ...: this thread's state from every rank,
  // in rank order (rank 0's chunk holds tile 0, where every row sees key 0).
  if (warp % splits == rank) {
    auto remote_state = [&](int from, float (&state_max)[2], float (&state_sum)[2]) {
      const float* state = cluster.map_shared_rank(parked, from);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        state_max[r] = state[(kValues + r) * kThreads + threadIdx.x];
        state_sum[r] = state[(kValues + 2 + r) * kThreads + threadIdx.x];
      }
      return state;
    };
    const float* first = remote_state(0, row_max, row_sum);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = first[(j * 4 + e) * kThreads + threadIdx.x];
    }
    for (int from = 1; from < splits; ++from) {
      float other_max[2], other_sum[2];
      const float* state = remote_state(from, other_max, other_sum);
      merge_softmax_state<D>(
          o, row_max, row_sum, other_max, other_sum,
          [&](int j, int e) { return state[(j * 4 + e) * kThreads + threadIdx.x]; }, scale_log2);
    }
    store_normalized_rows<D>(out_head, q_stride, o, row_sum, row_top, row_bottom, Tq, lane);
  }
  cluster.sync();  // no block leaves (freeing its shared memory) while another still reads it
  stamp(4);
#else
  __trap();  // splits > 1 is never launched before sm_90 (no clusters there; the launcher checks)
#endif
}

template <int D>
void configure_once() {
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_v6_cluster_split_keys_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes<D>())));
    return true;
  }();
  (void)configured;
}

/// Blocks of v6 the GPU holds at once (SMs x blocks per SM), once per D.
template <int D>
int resident_blocks() {
  static const int blocks = [] {
    configure_once<D>();
    int device = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_v6_cluster_split_keys_kernel<D>,
                                                             kThreads, shared_bytes<D>()));
    return std::max(1, sms * per_sm);
  }();
  return blocks;
}

int resident_blocks_for(int D) { return D == 128 ? resident_blocks<128>() : resident_blocks<64>(); }

int check_splits(int splits) {
  if (splits < 0 || splits > kMaxClusterSize) {
    throw std::invalid_argument("attention_v6_cluster_split_keys: splits must be 0 (automatic) or 1.." +
                                std::to_string(kMaxClusterSize) + ", got " + std::to_string(splits));
  }
  if (splits > 1 && !device_is_sm90_or_newer()) {
    throw std::invalid_argument("attention_v6_cluster_split_keys: splits > 1 needs thread block clusters (sm_90+)");
  }
  return splits;
}

template <int D>
void launch(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int Tq,
            int Tkv, int H, int Hkv, cudaStream_t stream, bool pdl, int splits, unsigned long long* block_times) {
  configure_once<D>();
  const dim3 grid(H, (Tq + kBlockM - 1) / kBlockM * splits);
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(D));  // log2(e) / sqrt(D)
  // The splits of a query block are neighbours along y: one cluster (none when splits = 1).
  const ClusterLaunch launch(grid, dim3(kThreads), dim3(1, unsigned(splits), 1), shared_bytes<D>(), stream, pdl);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, attention_v6_cluster_split_keys_kernel<D>, out, q, k, v, Tq, Tkv, H, Hkv,
                                scale_log2, splits, block_times));
}

}  // namespace

int attention_v6_default_splits(int Tq, int Tkv, int H, int D) {
  if (Tq <= 0 || !device_is_sm90_or_newer()) return 1;
  const int query_blocks = (Tq + kBlockM - 1) / kBlockM;
  const int heaviest_tiles = tiles_of_query_block(query_blocks - 1, Tq, Tkv);
  const long long resident = resident_blocks_for(D);
  int splits = 1;
  for (int s = 2; s <= kMaxClusterSize; s *= 2) {
    if (s > heaviest_tiles || (long long)H * query_blocks * s > resident) break;
    splits = s;
  }
  return splits;
}

int attention_v6_grid_rows(int Tq, int Tkv, int H, int D, int splits) {
  if (check_splits(splits) == 0) splits = attention_v6_default_splits(Tq, Tkv, H, D);
  return (Tq + kBlockM - 1) / kBlockM * splits;
}

void attention_v6_cluster_split_keys_with(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                          const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                          cudaStream_t stream, bool pdl, int splits,
                                          unsigned long long* block_times) {
  attention_check_shapes("attention_v6_cluster_split_keys", Tq, Tkv, H, Hkv, D);
  check_splits(splits);
  if (Tq == 0) return;
  for (const void* pointer : {static_cast<const void*>(out), static_cast<const void*>(q),
                              static_cast<const void*>(k), static_cast<const void*>(v)}) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
      throw std::invalid_argument("attention_v6_cluster_split_keys: q, k, v and out must be 16-byte aligned");
    }
  }
  if (splits == 0) splits = attention_v6_default_splits(Tq, Tkv, H, D);
  if (D == 128) {
    launch<128>(out, q, k, v, Tq, Tkv, H, Hkv, stream, pdl, splits, block_times);
  } else {
    launch<64>(out, q, k, v, Tq, Tkv, H, Hkv, stream, pdl, splits, block_times);
  }
}

void attention_v6_cluster_split_keys(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                     const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                     float* /*workspace*/, cudaStream_t stream) {
  attention_v6_cluster_split_keys_with(out, q, k, v, Tq, Tkv, H, Hkv, D, stream, false, 0, nullptr);
}

}  // namespace bielik
