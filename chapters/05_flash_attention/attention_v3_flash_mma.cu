// v3: flash attention on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulation).
//
// What changed from v2:
//  * Tiling. A block of 4 warps owns 64 queries of one head (16 per warp) and walks the
//    keys in tiles of 64. Each K/V tile is loaded into shared memory ONCE and used by
//    all 64 queries, where v2 re-read every key for every query: K/V traffic drops 64x.
//  * Tensor cores. Both products, S = Q K^T (16x64 per warp per tile) and O += P V
//    (16xD), are mma.sync.m16n8k16 instructions on bf16 fragments with fp32 accumulators.
//    The fragments come from shared memory through ldmatrix (K as is, V transposed by
//    ldmatrix.trans, so V never needs a transposed copy in memory).
//  * The softmax never leaves registers. The S accumulator layout of one mma (rows g and
//    g+8, columns 2t, 2t+1) is exactly the A-operand layout the P V mma wants, so P goes
//    from the S registers to the P V instruction by a float -> bf16 pack, no shuffles, no
//    shared memory (the trick of FlashAttention-2). The four lanes that share a row
//    reduce its max and sum with two shuffles.
//  * Copies overlap math. K/V tiles are double-buffered in shared memory and fetched with
//    cp.async: while the warps compute tile n, tile n+1 is already on its way.
// Details that matter for speed: shared-memory rows are padded by 16 bytes so the 8 rows
// an ldmatrix reads fall in 8 different bank groups (no conflicts); the causal mask is
// applied only to the tiles that cross the diagonal; blocks are launched heaviest first
// (the last queries see the most keys) so the tail of the grid is short.
// Numerics: like v1 except that P is rounded to bf16 before P V (the tests bound the
// extra error by the ratio rule: at most 2x v1's error + 1e-3).
#include <cmath>
#include <stdexcept>

#include "attention.cuh"
#include "attention_ptx.cuh"
#include "attention_tile_load.cuh"
#include "attention_tile_step.cuh"
#include "cuda_check.cuh"

namespace bielik {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = 16 * kWarps;  // queries per block: one 16-row mma tile per warp
constexpr int kBlockN = kFlashTileKeys;  // keys per tile (64)

template <int D>
constexpr size_t shared_bytes() {  // Q tile + 2 stages of K and V tiles
  return size_t(kBlockM + 4 * kBlockN) * kTileStride<D> * sizeof(__nv_bfloat16);
}

}  // namespace

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    attention_v3_flash_mma_kernel(__nv_bfloat16* out,        // (Tq, H, D)
                                  const __nv_bfloat16* q,    // (Tq, H, D)
                                  const __nv_bfloat16* k,    // (Tkv, Hkv, D)
                                  const __nv_bfloat16* v,    // (Tkv, Hkv, D)
                                  int Tq, int Tkv, int H, int Hkv, float scale_log2) {
  constexpr int S = kTileStride<D>;
  extern __shared__ __align__(16) unsigned char shared[];
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(shared);  // (kBlockM, S)
  __nv_bfloat16* k_tiles = q_tile + kBlockM * S;                      // (2, kBlockN, S)
  __nv_bfloat16* v_tiles = k_tiles + 2 * kBlockN * S;                 // (2, kBlockN, S)

  const int h = blockIdx.x, kv_head = h / (H / Hkv);
  const int m0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;  // heaviest query blocks first
  const int offset = Tkv - Tq;                            // query i sits at position offset + i
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_top = m0 + warp * 16 + lane / 4, row_bottom = row_top + 8;  // this thread's two query rows

  const size_t q_stride = size_t(H) * D, kv_stride = size_t(Hkv) * D;
  const __nv_bfloat16* q_head = q + size_t(h) * D;
  const __nv_bfloat16* k_head = k + size_t(kv_head) * D;
  const __nv_bfloat16* v_head = v + size_t(kv_head) * D;

  // Keys this block needs: up to the last visible key of its last query.
  const int key_end = min(Tkv, offset + m0 + kBlockM);
  const int num_tiles = (key_end + kBlockN - 1) / kBlockN;
  // Tiles entirely visible to the block's FIRST query need no mask (and lie below Tkv).
  const int unmasked_tiles = (offset + m0 + 1) / kBlockN;

  load_tile_async<D, kBlockM, kThreads>(q_tile, q_head, q_stride, m0, Tq, threadIdx.x);
  load_tile_async<D, kBlockN, kThreads>(k_tiles, k_head, kv_stride, 0, Tkv, threadIdx.x);
  load_tile_async<D, kBlockN, kThreads>(v_tiles, v_head, kv_stride, 0, Tkv, threadIdx.x);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncthreads();

  // The warp's 16 query rows as A fragments, kept in registers for the whole loop.
  uint32_t q_frag[D / 16][4];
  load_query_fragments<D>(q_frag, q_tile + warp * 16 * S, lane);

  float o[D / 8][4] = {};  // O accumulator: 16 x D per warp, fragment layout of C
  float row_max[2] = {-INFINITY, -INFINITY};  // rows row_top, row_bottom; unscaled scores
  float row_sum[2] = {0.0f, 0.0f};            // this thread's share of the softmax denominator

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < num_tiles) {  // prefetch the next tile into the other stage
      const int next_key = (tile + 1) * kBlockN;
      load_tile_async<D, kBlockN, kThreads>(k_tiles + (stage ^ 1) * kBlockN * S, k_head, kv_stride, next_key, Tkv, threadIdx.x);
      load_tile_async<D, kBlockN, kThreads>(v_tiles + (stage ^ 1) * kBlockN * S, v_head, kv_stride, next_key, Tkv, threadIdx.x);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();  // everything but the prefetch has landed
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    // S = Q K^T, the mask where the diagonal (or the end of the keys) crosses the tile,
    // the online softmax, O += P V: attention_tile_step.cuh.
    flash_tile_step<D>(q_frag, k_tiles + stage * kBlockN * S, v_tiles + stage * kBlockN * S, tile,
                       tile >= unmasked_tiles, offset, Tkv, row_top, row_bottom, scale_log2, lane, o, row_max, row_sum);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Finish the softmax (the row's full denominator is the sum over its 4 lanes) and store.
  store_normalized_rows<D>(out + size_t(h) * D, q_stride, o, row_sum, row_top, row_bottom, Tq, lane);
}

namespace {
template <int D>
void launch(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int Tq,
            int Tkv, int H, int Hkv, cudaStream_t stream) {
  // More than 48 KB of dynamic shared memory needs an explicit opt-in, once per kernel.
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_v3_flash_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(shared_bytes<D>())));
    return true;
  }();
  (void)configured;
  const dim3 grid(H, (Tq + kBlockM - 1) / kBlockM);
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(D));  // log2(e) / sqrt(D)
  attention_v3_flash_mma_kernel<D><<<grid, kThreads, shared_bytes<D>(), stream>>>(out, q, k, v, Tq, Tkv, H, Hkv,
                                                                                   scale_log2);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void attention_v3_flash_mma(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* /*workspace*/,
                            cudaStream_t stream) {
  attention_check_shapes("attention_v3_flash_mma", Tq, Tkv, H, Hkv, D);
  if (Tq == 0) return;
  for (const void* pointer : {static_cast<const void*>(out), static_cast<const void*>(q),
                              static_cast<const void*>(k), static_cast<const void*>(v)}) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
      throw std::invalid_argument("attention_v3_flash_mma: q, k, v and out must be 16-byte aligned");
    }
  }
  if (D == 128) {
    launch<128>(out, q, k, v, Tq, Tkv, H, Hkv, stream);
  } else {
    launch<64>(out, q, k, v, Tq, Tkv, H, Hkv, stream);
  }
}

}  // namespace bielik
