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
#include "cuda_check.cuh"

namespace bielik {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = 16 * kWarps;  // queries per block: one 16-row mma tile per warp
constexpr int kBlockN = 64;           // keys per tile

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
  const int group = lane / 4, thread_in_group = lane % 4;
  const int row_top = m0 + warp * 16 + group, row_bottom = row_top + 8;  // this thread's two query rows

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
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // lanes 0-7: rows 0-7 / cols 0-7, 8-15: rows 8-15 / cols 0-7, 16-23: rows 0-7 / cols 8-15, 24-31: rows 8-15 / cols 8-15
    ptx::ldmatrix_x4(q_frag[kk], q_tile + (warp * 16 + lane % 8 + (lane / 8) % 2 * 8) * S + kk * 16 + lane / 16 * 8);
  }

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
    const __nv_bfloat16* k_tile = k_tiles + stage * kBlockN * S;
    const __nv_bfloat16* v_tile = v_tiles + stage * kBlockN * S;

    // S = Q K^T for 16 rows x 64 keys: s[j] is the 16x8 block of keys 8j .. 8j+7.
    float s[kBlockN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int jp = 0; jp < kBlockN / 16; ++jp) {
        // K rows are B columns. lanes 0-7: keys 0-7 / d 0-7, 8-15: keys 0-7 / d 8-15,
        // 16-23: keys 8-15 / d 0-7, 24-31: keys 8-15 / d 8-15 (of this 16x16 block).
        uint32_t b[4];
        ptx::ldmatrix_x4(b, k_tile + (jp * 16 + lane % 8 + lane / 16 * 8) * S + kk * 16 + (lane / 8) % 2 * 8);
        ptx::mma_bf16_16x8x16(s[2 * jp], q_frag[kk], b[0], b[1]);
        ptx::mma_bf16_16x8x16(s[2 * jp + 1], q_frag[kk], b[2], b[3]);
      }
    }

    if (tile >= unmasked_tiles) {  // the diagonal (and the end of the keys) crosses this tile
      const int key0 = tile * kBlockN + 2 * thread_in_group;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * j + (e & 1);
          const int row = e < 2 ? row_top : row_bottom;
          if (key > offset + row || key >= Tkv) s[j][e] = -INFINITY;
        }
      }
    }

    // Online softmax: new running max per row (4 lanes share a row), rescale the past.
    float scaled_max[2], correction[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) tile_max = fmaxf(tile_max, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row with nothing visible yet keeps max -inf; use 0 so exp2 sees -inf, not NaN.
      scaled_max[r] = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
      correction[r] = exp2f(row_max[r] * scale_log2 - scaled_max[r]);  // 0 on the first tile
      row_max[r] = new_max;
    }
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(fmaf(s[j][e], scale_log2, -scaled_max[e / 2]));  // masked: exp2(-inf) = 0
        tile_sum[e / 2] += s[j][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * correction[r] + tile_sum[r];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= correction[0], o[j][1] *= correction[0];
      o[j][2] *= correction[1], o[j][3] *= correction[1];
    }

    // O += P V. P's A fragment for keys 16kk .. 16kk+15 is s[2kk] and s[2kk+1], packed.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t p[4] = {ptx::pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), ptx::pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                             ptx::pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             ptx::pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        // V rows are B rows (keys = k). Transposed loads: lanes 0-7: keys 0-7 / d 0-7,
        // 8-15: keys 8-15 / d 0-7, 16-23: keys 0-7 / d 8-15, 24-31: keys 8-15 / d 8-15.
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, v_tile + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * S + dp * 16 + lane / 16 * 8);
        ptx::mma_bf16_16x8x16(o[2 * dp], p, b[0], b[1]);
        ptx::mma_bf16_16x8x16(o[2 * dp + 1], p, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Finish the softmax: the row's full denominator is the sum over its 4 lanes.
  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inverse[r] = 1.0f / sum;
  }
  const int col = 2 * thread_in_group;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_top : row_bottom;
    if (row >= Tq) continue;  // padding rows of the last block
    __nv_bfloat16* out_row = out + size_t(row) * q_stride + size_t(h) * D + col;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
          ptx::pack_bf16x2(o[j][2 * r] * inverse[r], o[j][2 * r + 1] * inverse[r]);
    }
  }
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
