// v6: v3's tiles, with the keys of heavy query blocks split over several blocks, so the
// grid's work is balanced over the SMs.
//
// Why. In a causal prompt query block b (64 queries) needs b + 1 key tiles. At T = 512
// that is 1 to 8 tiles, 48 blocks for 132 SMs: most SMs idle while 12 of them work
// through 8 tiles each. v5 gave those blocks the whole SM (two warp groups), but an SM
// has one set of tensor cores: the two groups share them, so v5 gained 7% over v3, not
// 2x. What shortens the critical path is putting the heavy blocks' tiles on MORE SMs.
//
// What changed from v3:
//  * Work items. The host counts the key tiles of the whole grid and divides them by the
//    number of blocks the GPU holds at once: that is C, the tiles per work item (T = 512
//    on an H200: 432 tiles / 264 resident blocks -> C = 2). Query block b's tiles are cut
//    into ceil(tiles_b / C) items; every item is one block of 4 warps running v3's loop
//    over ITS tiles only. At T = 512 the heaviest item has 2 tiles instead of 8.
//  * Partial results. An item that is not alone stores its softmax state (O unscaled,
//    running max, sum share: per thread, in the order the thread holds them) in a
//    workspace slot in global memory, then counts itself in an arrival counter of its
//    query block (one atomicAdd after a __threadfence). The LAST item to arrive merges
//    every item's state, in item order (so the result does not depend on who arrived
//    last), writes the normalized rows and sets the counter back to 0: the counters are
//    zero between launches, and the workspace needs zeroing only once, when allocated.
//    (Nobody waits for anybody: a block that is not last just exits, so no residency
//    assumption is needed, unlike a grid barrier.)
//  * Order. Items are launched heaviest query block first, as in v3, so the long items
//    start in the first wave and the light ones fill the gaps.
// Numerics: v3's, plus one exact softmax merge per item (the same merge as v5's groups).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "attention.cuh"
#include "attention_ptx.cuh"
#include "attention_tile_load.cuh"
#include "attention_tile_step.cuh"
#include "cuda_check.cuh"
#include "pdl.cuh"

namespace bielik {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = 16 * kWarps;     // queries per block: one 16-row mma tile per warp
constexpr int kBlockN = kFlashTileKeys;  // keys per tile (64)

template <int D>
constexpr size_t shared_bytes() {  // Q tile + 2 stages of K and V tiles, as v3
  return size_t(kBlockM + 4 * kBlockN) * kTileStride<D> * sizeof(__nv_bfloat16);
}

/// Floats of one item's partial state: o (D/2 values a thread), 2 maxima, 2 sum shares,
/// for each of the block's 128 threads. Slots are sized for D = 128, the largest D.
template <int D>
constexpr int slot_floats() {
  return (D / 2 + 4) * kThreads;
}
constexpr int kSlotFloats = slot_floats<128>();

/// Key tiles query block `block` needs: up to the last visible key of its last query.
__host__ __device__ inline int tiles_of_query_block(int block, int Tq, int Tkv) {
  const int key_end = min(Tkv, Tkv - Tq + (block + 1) * kBlockM);
  return (key_end + kBlockN - 1) / kBlockN;
}

/// How the grid is cut into work items (computed on the host, read by every block).
struct AttentionSplitPlan {
  int query_blocks = 0;           ///< ceil(Tq / 64)
  int tiles_per_item = 1;         ///< C: key tiles per work item
  int max_splits = 1;             ///< items of the heaviest (last) query block; grid.y = query_blocks * max_splits
  int first_split_block = 0;      ///< the first query block cut into more than one item
  int slots_per_head = 0;         ///< partial-state slots per head (items of the cut blocks)
  int counter_floats = 0;         ///< the counters' region at the workspace's start, in floats
};

__host__ __device__ inline int splits_of(int tiles, int tiles_per_item) { return (tiles + tiles_per_item - 1) / tiles_per_item; }

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    attention_v6_balanced_splits_kernel(__nv_bfloat16* out,        // (Tq, H, D)
                                        const __nv_bfloat16* q,    // (Tq, H, D)
                                        const __nv_bfloat16* k,    // (Tkv, Hkv, D)
                                        const __nv_bfloat16* v,    // (Tkv, Hkv, D)
                                        int Tq, int Tkv, int H, int Hkv, float scale_log2,
                                        AttentionSplitPlan plan,
                                        float* workspace) {  // counters, then (H, slots_per_head, kSlotFloats)
  constexpr int S = kTileStride<D>;
  extern __shared__ __align__(16) unsigned char shared[];
  __shared__ int arrival;  // this item's place among its query block's items
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(shared);  // (kBlockM, S)
  __nv_bfloat16* k_tiles = q_tile + kBlockM * S;                      // (2, kBlockN, S)
  __nv_bfloat16* v_tiles = k_tiles + 2 * kBlockN * S;                 // (2, kBlockN, S)

  // Which item: heaviest query block first, its items next to each other.
  const int h = blockIdx.x, kv_head = h / (H / Hkv);
  const int query_block = plan.query_blocks - 1 - int(blockIdx.y) / plan.max_splits;
  const int split = int(blockIdx.y) % plan.max_splits;
  const int num_tiles = tiles_of_query_block(query_block, Tq, Tkv);
  const int splits = splits_of(num_tiles, plan.tiles_per_item);
  if (split >= splits) return;  // a lighter block has fewer items (the whole block leaves)
  const int tile_begin = split * plan.tiles_per_item;
  const int tile_end = min(num_tiles, tile_begin + plan.tiles_per_item);

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

  load_tile_async<D, kBlockM, kThreads>(q_tile, q_head, q_stride, m0, Tq, threadIdx.x);
  load_tile_async<D, kBlockN, kThreads>(k_tiles, k_head, kv_stride, tile_begin * kBlockN, Tkv, threadIdx.x);
  load_tile_async<D, kBlockN, kThreads>(v_tiles, v_head, kv_stride, tile_begin * kBlockN, Tkv, threadIdx.x);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncthreads();

  uint32_t q_frag[D / 16][4];
  load_query_fragments<D>(q_frag, q_tile + warp * 16 * S, lane);
  float o[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  // v3's loop, over this item's tiles only.
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = (tile - tile_begin) & 1;
    if (tile + 1 < tile_end) {
      const int next_key = (tile + 1) * kBlockN;
      load_tile_async<D, kBlockN, kThreads>(k_tiles + (stage ^ 1) * kBlockN * S, k_head, kv_stride, next_key, Tkv,
                                            threadIdx.x);
      load_tile_async<D, kBlockN, kThreads>(v_tiles + (stage ^ 1) * kBlockN * S, v_head, kv_stride, next_key, Tkv,
                                            threadIdx.x);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    flash_tile_step<D>(q_frag, k_tiles + stage * kBlockN * S, v_tiles + stage * kBlockN * S, tile,
                       tile >= unmasked_tiles, offset, Tkv, row_top, row_bottom, scale_log2, lane, o, row_max, row_sum);
    __syncthreads();
  }

  __nv_bfloat16* out_head = out + size_t(h) * D;
  if (splits == 1) {  // the block had all its query block's tiles: v3's ending
    store_normalized_rows<D>(out_head, q_stride, o, row_sum, row_top, row_bottom, Tq, lane);
    return;
  }

  // Park this item's state in its slot, [value][thread] (consecutive threads, consecutive
  // words). Slots of query block b: after those of the cut blocks before it.
  int slot_base = 0;
  for (int b = plan.first_split_block; b < query_block; ++b) {
    slot_base += splits_of(tiles_of_query_block(b, Tq, Tkv), plan.tiles_per_item);
  }
  constexpr int kValues = D / 2;  // o[D/8][4]
  float* block_slots = workspace + plan.counter_floats + (size_t(h) * plan.slots_per_head + slot_base) * kSlotFloats;
  float* own = block_slots + size_t(split) * kSlotFloats;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) own[(j * 4 + e) * kThreads + threadIdx.x] = o[j][e];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    own[(kValues + r) * kThreads + threadIdx.x] = row_max[r];
    own[(kValues + 2 + r) * kThreads + threadIdx.x] = row_sum[r];
  }
  // Release: every thread's stores are visible GPU-wide before the block is counted.
  __threadfence();
  __syncthreads();
  int* counter = reinterpret_cast<int*>(workspace) + h * (plan.query_blocks - plan.first_split_block) +
                 (query_block - plan.first_split_block);
  if (threadIdx.x == 0) arrival = atomicAdd(counter, 1);
  __syncthreads();
  if (arrival != splits - 1) return;  // another item of this query block arrives later and merges
  __threadfence();                    // acquire: the other items' states are visible from here
  if (threadIdx.x == 0) *counter = 0;  // every item has arrived: ready for the next launch

  // The last item merges the states in item order 0, 1, 2, ... (its own included, read
  // back), so the sum does not depend on the arrival order. __ldcg reads L2, where the
  // other blocks' stores are, never a stale L1 line.
  auto load_state = [&](int item, float (&state_max)[2], float (&state_sum)[2]) {
    const float* slot = block_slots + size_t(item) * kSlotFloats;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      state_max[r] = __ldcg(slot + (kValues + r) * kThreads + threadIdx.x);
      state_sum[r] = __ldcg(slot + (kValues + 2 + r) * kThreads + threadIdx.x);
    }
    return slot;
  };
  const float* first = load_state(0, row_max, row_sum);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = __ldcg(first + (j * 4 + e) * kThreads + threadIdx.x);
  }
  for (int item = 1; item < splits; ++item) {
    float other_max[2], other_sum[2];
    const float* slot = load_state(item, other_max, other_sum);
    merge_softmax_state<D>(
        o, row_max, row_sum, other_max, other_sum,
        [&](int j, int e) { return __ldcg(slot + (j * 4 + e) * kThreads + threadIdx.x); }, scale_log2);
  }
  store_normalized_rows<D>(out_head, q_stride, o, row_sum, row_top, row_bottom, Tq, lane);
}

/// Blocks of v6 the GPU holds at once (SMs x blocks per SM), once per D.
template <int D>
int resident_blocks() {
  static const int blocks = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_v6_balanced_splits_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes<D>())));
    int device = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_v6_balanced_splits_kernel<D>,
                                                             kThreads, shared_bytes<D>()));
    return std::max(1, sms * per_sm);
  }();
  return blocks;
}

int resident_blocks_for(int D) { return D == 128 ? resident_blocks<128>() : resident_blocks<64>(); }

}  // namespace

namespace {

/// The plan: C = ceil(all tiles / resident blocks), raised until the partial slots fit
/// the workspace bound (2 x resident blocks); `forced_tiles_per_item` > 0 overrides C
/// (the tests use it to cut small shapes into many items).
AttentionSplitPlan plan_splits(int Tq, int Tkv, int H, int resident, int forced_tiles_per_item) {
  AttentionSplitPlan plan;
  plan.query_blocks = (Tq + kBlockM - 1) / kBlockM;
  long long total_tiles = 0;
  for (int b = 0; b < plan.query_blocks; ++b) total_tiles += tiles_of_query_block(b, Tq, Tkv);
  total_tiles *= H;
  int tiles_per_item = forced_tiles_per_item > 0 ? forced_tiles_per_item
                                                 : int(std::max<long long>(1, (total_tiles + resident - 1) / resident));
  for (;; ++tiles_per_item) {
    plan.tiles_per_item = tiles_per_item;
    plan.max_splits = splits_of(tiles_of_query_block(plan.query_blocks - 1, Tq, Tkv), tiles_per_item);
    plan.first_split_block = plan.query_blocks;
    plan.slots_per_head = 0;
    for (int b = plan.query_blocks - 1; b >= 0; --b) {  // tiles grow with b: the cut blocks are a suffix
      const int splits = splits_of(tiles_of_query_block(b, Tq, Tkv), tiles_per_item);
      if (splits == 1) break;
      plan.first_split_block = b;
      plan.slots_per_head += splits;
    }
    if (forced_tiles_per_item > 0 || size_t(H) * plan.slots_per_head <= size_t(2 * resident)) break;
  }
  const int counters = H * (plan.query_blocks - plan.first_split_block);
  plan.counter_floats = (counters + 63) / 64 * 64;  // keeps the slots 256-byte aligned
  return plan;
}

size_t workspace_floats_of(const AttentionSplitPlan& plan, int H) {
  return size_t(plan.counter_floats) + size_t(H) * plan.slots_per_head * kSlotFloats;
}

template <int D>
void launch(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int Tq,
            int Tkv, int H, int Hkv, float* workspace, cudaStream_t stream, bool pdl, int forced_tiles_per_item) {
  static_assert(slot_floats<D>() <= kSlotFloats, "slots are sized for the largest D");
  const AttentionSplitPlan plan = plan_splits(Tq, Tkv, H, resident_blocks<D>(), forced_tiles_per_item);
  if (plan.slots_per_head > 0 && workspace == nullptr) {
    throw std::invalid_argument("attention_v6_balanced_splits: this shape needs a workspace of " +
                                std::to_string(workspace_floats_of(plan, H)) +
                                " floats (attention_v6_workspace_floats), zero-filled once");
  }
  const dim3 grid(H, plan.query_blocks * plan.max_splits);
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(D));  // log2(e) / sqrt(D)
  launch_kernel(pdl, attention_v6_balanced_splits_kernel<D>, grid, dim3(kThreads), shared_bytes<D>(), stream, out, q,
                k, v, Tq, Tkv, H, Hkv, scale_log2, plan, workspace);
}

}  // namespace

size_t attention_v6_workspace_floats_with(int Tq, int Tkv, int H, int tiles_per_item) {
  // The slots are sized for D = 128; D = 64 may hold more blocks at once and cut the
  // grid differently, so the larger of the two plans.
  const AttentionSplitPlan at_128 = plan_splits(Tq, Tkv, H, resident_blocks_for(128), tiles_per_item);
  const AttentionSplitPlan at_64 = plan_splits(Tq, Tkv, H, resident_blocks_for(64), tiles_per_item);
  return std::max(workspace_floats_of(at_128, H), workspace_floats_of(at_64, H));
}

size_t attention_v6_workspace_floats(int Tq, int Tkv, int H) {
  return attention_v6_workspace_floats_with(Tq, Tkv, H, 0);
}

size_t attention_v6_max_workspace_floats() {
  // plan_splits keeps H x slots_per_head <= 2 x resident blocks (unless the caller forces
  // the tiles per item), and a cut query block has at least two slots, so there are at
  // most resident-blocks counters.
  const int resident = std::max(resident_blocks_for(128), resident_blocks_for(64));
  return size_t((resident + 63) / 64 * 64) + size_t(2 * resident) * kSlotFloats;
}

void attention_v6_balanced_splits_with(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                       const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                       float* workspace, cudaStream_t stream, bool pdl, int tiles_per_item) {
  attention_check_shapes("attention_v6_balanced_splits", Tq, Tkv, H, Hkv, D);
  if (Tq == 0) return;
  for (const void* pointer : {static_cast<const void*>(out), static_cast<const void*>(q),
                              static_cast<const void*>(k), static_cast<const void*>(v)}) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
      throw std::invalid_argument("attention_v6_balanced_splits: q, k, v and out must be 16-byte aligned");
    }
  }
  if (tiles_per_item < 0) throw std::invalid_argument("attention_v6_balanced_splits: tiles_per_item < 0");
  if (D == 128) {
    launch<128>(out, q, k, v, Tq, Tkv, H, Hkv, workspace, stream, pdl, tiles_per_item);
  } else {
    launch<64>(out, q, k, v, Tq, Tkv, H, Hkv, workspace, stream, pdl, tiles_per_item);
  }
}

void attention_v6_balanced_splits(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                  const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* workspace,
                                  cudaStream_t stream) {
  attention_v6_balanced_splits_with(out, q, k, v, Tq, Tkv, H, Hkv, D, workspace, stream, false, 0);
}

}  // namespace bielik
