// v4: flash attention with 32 query rows per warp (two 16-row mma tiles), 128 per block.
//
// What changed from v3: each warp now owns two 16-row tiles of queries instead of one,
// so every K and V fragment it loads from shared memory feeds four mma instructions
// instead of two, and a block of 4 warps covers 128 queries, so each K/V tile fetched
// from global memory serves twice the queries. This is the tile shape FlashAttention-2
// uses for D = 128 on A100/H100 (128 queries x 64 keys, 4 warps).
//
// The price is registers: the O accumulators double (128 fp32 per thread at D = 128),
// so the Q fragments no longer fit next to them and are re-read from shared memory for
// every key tile; at D = 128 even the 64-key S tile does not fit (ptxas spills at 255
// registers), so the key tile shrinks to 32. Per 128 mma a warp then reads 48
// ldmatrix.x4 (16 Q, 16 K, 16 V) where v3 reads 64: 25% less shared-memory traffic.
// And blocks are twice as big, so a prompt makes half as many of them: at T = 512,
// 4 x 12 = 48 blocks for 132 SMs, and at T = 2048 the heaviest causal blocks (the last
// queries, which see every key) become the critical path of the whole grid.
// Measured, v4 only wins at T = 8192 (README); it stays in the book as that lesson.
// Everything else (masking, online softmax, cp.async double buffering) is v3's code with
// one more loop over the two row tiles.
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
constexpr int kRowTiles = 2;                       // 16-row mma tiles per warp
constexpr int kBlockM = 16 * kRowTiles * kWarps;  // 128 queries per block

template <int D, int kBlockN>
constexpr size_t shared_bytes() {  // Q tile + 2 stages of K and V tiles
  return size_t(kBlockM + 4 * kBlockN) * kTileStride<D> * sizeof(__nv_bfloat16);
}

}  // namespace

template <int D, int kBlockN>  // kBlockN: keys per tile
__global__ void __launch_bounds__(kThreads, 2)
    attention_v4_flash_two_row_tiles_kernel(__nv_bfloat16* out,        // (Tq, H, D)
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
  // This thread's rows: row_of(mt, half) = first row of tile mt, + 8 for the bottom half.
  const int warp_row0 = m0 + warp * 16 * kRowTiles + group;
  auto row_of = [&](int mt, int half) { return warp_row0 + mt * 16 + half * 8; };

  const size_t q_stride = size_t(H) * D, kv_stride = size_t(Hkv) * D;
  const __nv_bfloat16* q_head = q + size_t(h) * D;
  const __nv_bfloat16* k_head = k + size_t(kv_head) * D;
  const __nv_bfloat16* v_head = v + size_t(kv_head) * D;

  const int key_end = min(Tkv, offset + m0 + kBlockM);
  const int num_tiles = (key_end + kBlockN - 1) / kBlockN;
  const int unmasked_tiles = (offset + m0 + 1) / kBlockN;

  load_tile_async<D, kBlockM, kThreads>(q_tile, q_head, q_stride, m0, Tq, threadIdx.x);
  load_tile_async<D, kBlockN, kThreads>(k_tiles, k_head, kv_stride, 0, Tkv, threadIdx.x);
  load_tile_async<D, kBlockN, kThreads>(v_tiles, v_head, kv_stride, 0, Tkv, threadIdx.x);
  ptx::cp_async_commit();

  float o[kRowTiles][D / 8][4] = {};
  float row_max[kRowTiles][2], row_sum[kRowTiles][2];
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < num_tiles) {
      const int next_key = (tile + 1) * kBlockN;
      load_tile_async<D, kBlockN, kThreads>(k_tiles + (stage ^ 1) * kBlockN * S, k_head, kv_stride, next_key, Tkv, threadIdx.x);
      load_tile_async<D, kBlockN, kThreads>(v_tiles + (stage ^ 1) * kBlockN * S, v_head, kv_stride, next_key, Tkv, threadIdx.x);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* k_tile = k_tiles + stage * kBlockN * S;
    const __nv_bfloat16* v_tile = v_tiles + stage * kBlockN * S;

    // S = Q K^T: each K fragment is used by both row tiles.
    float s[kRowTiles][kBlockN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[kRowTiles][4];
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        const int tile_row = warp * 16 * kRowTiles + mt * 16;
        ptx::ldmatrix_x4(a[mt], q_tile + (tile_row + lane % 8 + (lane / 8) % 2 * 8) * S + kk * 16 + lane / 16 * 8);
      }
#pragma unroll
      for (int jp = 0; jp < kBlockN / 16; ++jp) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, k_tile + (jp * 16 + lane % 8 + lane / 16 * 8) * S + kk * 16 + (lane / 8) % 2 * 8);
#pragma unroll
        for (int mt = 0; mt < kRowTiles; ++mt) {
          ptx::mma_bf16_16x8x16(s[mt][2 * jp], a[mt], b[0], b[1]);
          ptx::mma_bf16_16x8x16(s[mt][2 * jp + 1], a[mt], b[2], b[3]);
        }
      }
    }

    if (tile >= unmasked_tiles) {
      const int key0 = tile * kBlockN + 2 * thread_in_group;
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + 8 * j + (e & 1);
            if (key > offset + row_of(mt, e / 2) || key >= Tkv) s[mt][j][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax, per row tile exactly as in v3.
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt) {
      float scaled_max[2], correction[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) tile_max = fmaxf(tile_max, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[mt][r], tile_max);
        scaled_max[r] = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
        correction[r] = exp2f(row_max[mt][r] * scale_log2 - scaled_max[r]);
        row_max[mt][r] = new_max;
      }
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mt][j][e] = exp2f(fmaf(s[mt][j][e], scale_log2, -scaled_max[e / 2]));
          tile_sum[e / 2] += s[mt][j][e];
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) row_sum[mt][r] = row_sum[mt][r] * correction[r] + tile_sum[r];
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[mt][j][0] *= correction[0], o[mt][j][1] *= correction[0];
        o[mt][j][2] *= correction[1], o[mt][j][3] *= correction[1];
      }
    }

    // O += P V: each V fragment is used by both row tiles.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t p[kRowTiles][4];
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        p[mt][0] = ptx::pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        p[mt][1] = ptx::pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        p[mt][2] = ptx::pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        p[mt][3] = ptx::pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, v_tile + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * S + dp * 16 + lane / 16 * 8);
#pragma unroll
        for (int mt = 0; mt < kRowTiles; ++mt) {
          ptx::mma_bf16_16x8x16(o[mt][2 * dp], p[mt], b[0], b[1]);
          ptx::mma_bf16_16x8x16(o[mt][2 * dp + 1], p[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }

  const int col = 2 * thread_in_group;
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inverse = 1.0f / sum;
      const int row = row_of(mt, r);
      if (row >= Tq) continue;
      __nv_bfloat16* out_row = out + size_t(row) * q_stride + size_t(h) * D + col;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
            ptx::pack_bf16x2(o[mt][j][2 * r] * inverse, o[mt][j][2 * r + 1] * inverse);
      }
    }
  }
}

namespace {
template <int D, int kBlockN>
void launch(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int Tq,
            int Tkv, int H, int Hkv, cudaStream_t stream) {
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_v4_flash_two_row_tiles_kernel<D, kBlockN>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes<D, kBlockN>())));
    return true;
  }();
  (void)configured;
  const dim3 grid(H, (Tq + kBlockM - 1) / kBlockM);
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(D));  // log2(e) / sqrt(D)
  attention_v4_flash_two_row_tiles_kernel<D, kBlockN><<<grid, kThreads, shared_bytes<D, kBlockN>(), stream>>>(out, q, k, v, Tq, Tkv, H,
                                                                                             Hkv, scale_log2);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void attention_v4_flash_two_row_tiles(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                      const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                      float* /*workspace*/, cudaStream_t stream) {
  attention_check_shapes("attention_v4_flash_two_row_tiles", Tq, Tkv, H, Hkv, D);
  if (Tq == 0) return;
  for (const void* pointer : {static_cast<const void*>(out), static_cast<const void*>(q),
                              static_cast<const void*>(k), static_cast<const void*>(v)}) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
      throw std::invalid_argument("attention_v4_flash_two_row_tiles: q, k, v and out must be 16-byte aligned");
    }
  }
  // D = 128 with 64-key tiles needs more than 255 registers (ptxas spills); with 32-key
  // tiles it fits in 242 and measured 8% faster at T = 8192 (README).
  if (D == 128) {
    launch<128, 32>(out, q, k, v, Tq, Tkv, H, Hkv, stream);
  } else {
    launch<64, 64>(out, q, k, v, Tq, Tkv, H, Hkv, stream);
  }
}

}  // namespace bielik
