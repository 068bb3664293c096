// v5: v3's tiles, with the keys of each query block split between two warp groups.
//
// What changed from v3: a block is now 8 warps, two groups of 4. Both groups own the
// same 64 queries (16 rows per warp, exactly as in v3), but group 0 takes key tiles
// 0, 2, 4, ... and group 1 takes tiles 1, 3, 5, ...; each runs v3's loop (its own
// double-buffered K/V tiles, its own online softmax) and at the end group 1 hands its
// partial result (O, running max, running sum per row) to group 0 through shared
// memory, which merges the two softmaxes exactly:
//     m = max(m0, m1),  l = l0 e^(m0-m) + l1 e^(m1-m),  O = O0 e^(m0-m) + O1 e^(m1-m).
//
// Why: in a causal prompt the last query block sees every key and the first sees one
// tile, so the grid's running time is set by its heaviest blocks. In v3 two 4-warp
// blocks share an SM and the heaviest one crawls through its tiles at half the SM's
// speed; here one 8-warp block has the whole SM and finishes its tiles twice as fast.
// The SM holds 8 warps either way (about 200 registers each), only the critical path
// halves. Measured on an H200 (README): it pays where the grid is small or
// the blocks are long: a 512-token turn over a 4096-token context +23%, decode +22%,
// SmolLM2's heads +20%, T = 512 +7%; it ties v3 at T = 2048 and loses 2% at T = 8192,
// where plenty of blocks already balance the SMs and the merge is pure overhead.
// Each group synchronizes its 4 warps with a named barrier (bar.sync id, 128), so the
// groups never wait for each other until the merge.
// Shared memory: Q + 2 groups x 2 stages x (K + V) tiles = 153 KB at D = 128, which only
// data-center GPUs give one block (H100/H200 227 KB, A100 163 KB); attention_forward
// falls back to v3 on the others (RTX 40xx: 99 KB).
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

constexpr int kGroups = 2;               // warp groups splitting the key tiles
constexpr int kGroupThreads = 4 * 32;    // 4 warps per group
constexpr int kThreads = kGroups * kGroupThreads;
constexpr int kBlockM = 64;              // queries per block: 16 rows per warp of a group
constexpr int kBlockN = kFlashTileKeys;   // keys per tile (64)

template <int D>
constexpr size_t shared_bytes() {  // Q tile + per group 2 stages of K and V tiles
  return size_t(kBlockM + kGroups * 4 * kBlockN) * kTileStride<D> * sizeof(__nv_bfloat16);
}

}  // namespace

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    attention_v5_flash_split_keys_kernel(__nv_bfloat16* out,        // (Tq, H, D)
                                         const __nv_bfloat16* q,    // (Tq, H, D)
                                         const __nv_bfloat16* k,    // (Tkv, Hkv, D)
                                         const __nv_bfloat16* v,    // (Tkv, Hkv, D)
                                         int Tq, int Tkv, int H, int Hkv, float scale_log2) {
  constexpr int S = kTileStride<D>;
  extern __shared__ __align__(16) unsigned char shared[];
  const int group_id = threadIdx.x / kGroupThreads;
  const int group_thread = threadIdx.x % kGroupThreads;
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(shared);                  // (kBlockM, S)
  __nv_bfloat16* k_tiles = q_tile + kBlockM * S + group_id * 4 * kBlockN * S;         // (2, kBlockN, S) per group
  __nv_bfloat16* v_tiles = k_tiles + 2 * kBlockN * S;                                 // (2, kBlockN, S) per group

  pdl_wait();  // launched with PDL (chapter 08's prefill): q, k, v may still be being written
  const int h = blockIdx.x, kv_head = h / (H / Hkv);
  const int m0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;  // heaviest query blocks first
  const int offset = Tkv - Tq;
  const int warp_in_group = group_thread / 32, lane = threadIdx.x % 32;
  const int row_top = m0 + warp_in_group * 16 + lane / 4, row_bottom = row_top + 8;

  const size_t q_stride = size_t(H) * D, kv_stride = size_t(Hkv) * D;
  const __nv_bfloat16* q_head = q + size_t(h) * D;
  const __nv_bfloat16* k_head = k + size_t(kv_head) * D;
  const __nv_bfloat16* v_head = v + size_t(kv_head) * D;

  const int key_end = min(Tkv, offset + m0 + kBlockM);
  const int num_tiles = (key_end + kBlockN - 1) / kBlockN;
  const int unmasked_tiles = (offset + m0 + 1) / kBlockN;

  // The whole block loads Q; each group loads its first tile (tile group_id).
  load_tile_async<D, kBlockM, kThreads>(q_tile, q_head, q_stride, m0, Tq, threadIdx.x);
  if (group_id < num_tiles) {
    load_tile_async<D, kBlockN, kGroupThreads>(k_tiles, k_head, kv_stride, group_id * kBlockN, Tkv, group_thread);
    load_tile_async<D, kBlockN, kGroupThreads>(v_tiles, v_head, kv_stride, group_id * kBlockN, Tkv, group_thread);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncthreads();

  uint32_t q_frag[D / 16][4];
  load_query_fragments<D>(q_frag, q_tile + warp_in_group * 16 * S, lane);

  float o[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  // v3's loop over this group's tiles: tile = group_id, group_id + 2, ...
  for (int n = 0, tile = group_id; tile < num_tiles; ++n, tile += kGroups) {
    const int stage = n & 1;
    if (tile + kGroups < num_tiles) {
      const int next_key = (tile + kGroups) * kBlockN;
      load_tile_async<D, kBlockN, kGroupThreads>(k_tiles + (stage ^ 1) * kBlockN * S, k_head, kv_stride, next_key,
                                                 Tkv, group_thread);
      load_tile_async<D, kBlockN, kGroupThreads>(v_tiles + (stage ^ 1) * kBlockN * S, v_head, kv_stride, next_key,
                                                 Tkv, group_thread);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    ptx::named_barrier_sync(1 + group_id, kGroupThreads);
    flash_tile_step<D>(q_frag, k_tiles + stage * kBlockN * S, v_tiles + stage * kBlockN * S, tile,
                       tile >= unmasked_tiles, offset, Tkv, row_top, row_bottom, scale_log2, lane, o, row_max, row_sum);
    ptx::named_barrier_sync(1 + group_id, kGroupThreads);  // the group is done with this stage
  }

  // Merge: group 1 parks its state in shared memory (over the K/V tiles, no longer
  // needed), group 0 combines. Thread (warp w, lane l) of group 1 holds exactly the rows
  // and columns of thread (w, l) of group 0, so the exchange is thread to thread; the
  // layout [value][thread] makes the 128 threads hit consecutive words (no conflicts).
  __syncthreads();
  float* parked = reinterpret_cast<float*>(q_tile + kBlockM * S);  // (D/2 + 4, 128)
  constexpr int kValues = D / 2;                                   // o[D/8][4]
  if (group_id == 1) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) parked[(j * 4 + e) * kGroupThreads + group_thread] = o[j][e];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      parked[(kValues + r) * kGroupThreads + group_thread] = row_max[r];
      parked[(kValues + 2 + r) * kGroupThreads + group_thread] = row_sum[r];
    }
  }
  __syncthreads();
  if (group_id == 1) return;

  // Group 0 always has tile 0, where key 0 is visible to every row: its max is finite.
  float other_max[2], other_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    other_max[r] = parked[(kValues + r) * kGroupThreads + group_thread];  // -inf if group 1 saw nothing
    other_sum[r] = parked[(kValues + 2 + r) * kGroupThreads + group_thread];
  }
  merge_softmax_state<D>(
      o, row_max, row_sum, other_max, other_sum,
      [&](int j, int e) { return parked[(j * 4 + e) * kGroupThreads + group_thread]; }, scale_log2);
  store_normalized_rows<D>(out + size_t(h) * D, q_stride, o, row_sum, row_top, row_bottom, Tq, lane);
}

bool attention_v5_supported(int D) {
  int device = 0, optin_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return size_t(optin_bytes) >= (D == 128 ? shared_bytes<128>() : shared_bytes<64>());
}

namespace {
template <int D>
void launch(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int Tq,
            int Tkv, int H, int Hkv, cudaStream_t stream, bool pdl) {
  static_assert((D / 2 + 4) * kGroupThreads * sizeof(float) <= 2 * 4 * kBlockN * kTileStride<D> * 2,
                "the merge area must fit over the K/V tiles");
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_v5_flash_split_keys_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes<D>())));
    return true;
  }();
  (void)configured;
  const dim3 grid(H, (Tq + kBlockM - 1) / kBlockM);
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(D));  // log2(e) / sqrt(D)
  launch_kernel(pdl, attention_v5_flash_split_keys_kernel<D>, grid, dim3(kThreads), shared_bytes<D>(), stream, out,
                q, k, v, Tq, Tkv, H, Hkv, scale_log2);
}
}  // namespace

void attention_v5_flash_split_keys(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                   float* /*workspace*/, cudaStream_t stream) {
  attention_v5_flash_split_keys_pdl(out, q, k, v, Tq, Tkv, H, Hkv, D, stream, false);
}

void attention_v5_flash_split_keys_pdl(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                       const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                       cudaStream_t stream, bool pdl) {
  attention_check_shapes("attention_v5_flash_split_keys", Tq, Tkv, H, Hkv, D);
  if (Tq == 0) return;
  for (const void* pointer : {static_cast<const void*>(out), static_cast<const void*>(q),
                              static_cast<const void*>(k), static_cast<const void*>(v)}) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
      throw std::invalid_argument("attention_v5_flash_split_keys: q, k, v and out must be 16-byte aligned");
    }
  }
  if (!attention_v5_supported(D)) {
    throw std::runtime_error("attention_v5_flash_split_keys: this GPU has too little shared memory per block for D = " +
                             std::to_string(D) + " (use attention_forward, which falls back to v3)");
  }
  if (D == 128) {
    launch<128>(out, q, k, v, Tq, Tkv, H, Hkv, stream, pdl);
  } else {
    launch<64>(out, q, k, v, Tq, Tkv, H, Hkv, stream, pdl);
  }
}

}  // namespace bielik
