// v6: a few tokens (T <= 64) on wgmma, the weights as the tile's rows (sm_90a).
//
// A short prefill (a chat turn of a few dozen tokens) is a GEMM in name only: at T = 16 a
// Bielik layer does 1.5 GFLOP on 93 MB of weights, so it is bound by reading the weights
// once, as the decode GEMV is. v5 cannot do that well: its tile puts the tokens on the
// wgmma's M side, 64 or 128 rows, so at T = 16 three quarters of every MMA multiply
// zeros, and its grid has one row of tiles, (C_out / BN) blocks, too few for the GPU.
// cuBLASLt reads the weights at about half the copy bandwidth there (README.md).
//
// What changed from v5:
//  * Swap the operands. y^T = W x^T: the wgmma's A (M = 64 rows) is 64 weight rows, its
//    B (N = 16, 32 or 64 columns) is the tokens. Both are K-major tiles in the same
//    128-byte-swizzled layout v5 uses (wgmma_tiles.cuh), so the copies and descriptors
//    are v5's; only the roles change, and the accumulator tile is y transposed.
//  * Split K over a thread-block cluster. A projection with few output rows (QKV: 2048,
//    O and down: 1536) has 24-32 tiles of 64 rows, which would leave most SMs idle; so S
//    blocks of a cluster (S <= 8) take one tile's K in S slices, and their fp32 partial
//    tiles meet in distributed shared memory: after a cluster barrier, each block sums
//    its share of the tile's elements over the S blocks, in rank order (deterministic),
//    adds the bias and stores. No atomics, no second kernel, no workspace.
//  * Stream deep: one warpgroup a block, its weights copied Stages - 2 stages ahead of
//    the MMAs as in v5, a stage being 1 or 2 k tiles of 64 values (at 16 tokens: 6 stages
//    of 1 tile, 32 KB ahead a block, 3 blocks an SM). Little's law wants ~4 MB in flight
//    over the GPU; 396 blocks hold 12 MB. The split count keeps the grid in one wave.
//
// Requirements as v5's: sm_90a, C_in % 8 == 0, 16-byte aligned x and W (the cp.async
// copies); matmul_v6_supported says whether a call qualifies. Rows past C_out and tokens
// past T are zero-filled by the copies and never stored.
#include <cooperative_groups.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cluster_launch.cuh"
#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"
#include "matmul_ptx.cuh"
#include "wgmma_ptx.cuh"
#include "wgmma_tiles.cuh"

namespace bielik {

namespace {

namespace cg = cooperative_groups;

constexpr int kV6K = 64;         // k per stage: one 128-byte swizzle row
constexpr int kV6Rows = 64;      // weight rows a block: the wgmma's M
constexpr int kV6Threads = 128;  // one warpgroup
constexpr int kV6MaxSplits = 8;  // the portable cluster size

// A stage holds KT consecutive 64-wide k tiles of the block's 64 weight rows (KT x 8 KB)
// and of the tokens: each weight row is then read KT x 128 contiguous bytes at a time.
template <int BN, int Stages, int KT>
constexpr int v6_smem_bytes() {
  return Stages * KT * (kV6Rows + BN) * 128 + 1024;  // + slack to align the first tile to 1024
}

template <int BN, int Stages, int KT, bool HasBias>
__global__ void __launch_bounds__(kV6Threads)
    matmul_v6_few_tokens_kernel(__nv_bfloat16* y,           // (T, N)
                                const __nv_bfloat16* x,     // (T, K)
                                const __nv_bfloat16* W,     // (N, K)
                                const __nv_bfloat16* bias,  // (N), unused when !HasBias
                                int T, int N, int K) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists only on sm_90a; the launcher never runs this elsewhere
#else
  static_assert(Stages >= 3, "copies run Stages - 2 stages ahead");
  constexpr int kTileABytes = kV6Rows * 128, kTileBBytes = BN * 128;
  constexpr int kStageBytes = KT * (kTileABytes + kTileBBytes);  // A tiles, then B tiles
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem_base = ptx::smem_address(smem_raw);
  const uint32_t smem = (smem_base + 1023) & ~1023u;
  float* aligned = reinterpret_cast<float*>(smem_raw + (smem - smem_base));
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * kV6Rows;
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());

  // This block's slice of K, in stages of KT 64-wide tiles: [first, last). A slice may be
  // empty; tiles past K are zero-filled by the copies.
  const int k_stages = (K + KT * kV6K - 1) / (KT * kV6K);
  const int per_split = (k_stages + splits - 1) / splits;
  const int first = min(k_stages, rank * per_split), last = min(k_stages, first + per_split);
  const int count = last - first;

  auto load_stage = [&](int i) {  // the i-th stage of the slice into buffer i % Stages
    const uint32_t stage = smem + (i % Stages) * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      const int k0 = ((first + i) * KT + kk) * kV6K;
      wgmma::load_swizzled_tile<kV6Rows, kV6Threads>(stage + kk * kTileABytes, W, n0, N, k0, K, tid);  // A: weights
      wgmma::load_swizzled_tile<BN, kV6Threads>(stage + KT * kTileABytes + kk * kTileBBytes, x, 0, T, k0, K,
                                                tid);  // B: the tokens
    }
  };
  for (int s = 0; s < Stages - 2; ++s) {  // one commit per stage, even empty: group i = stage i
    if (s < count) load_stage(s);
    ptx::cp_async_commit();
  }

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

  for (int i = 0; i < count; ++i) {
    ptx::cp_async_wait<Stages - 3>();  // this thread's copies of stage i have landed
    wgmma::fence_proxy_async();        // make them visible to the tensor cores' reads
    __syncthreads();                   // everyone's copies; and stage i-2's MMAs are done

    const uint32_t stage = smem + (i % Stages) * kStageBytes;
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      const uint64_t a = wgmma::smem_descriptor(stage + kk * kTileABytes);
      const uint64_t b = wgmma::smem_descriptor(stage + KT * kTileABytes + kk * kTileBBytes);
#pragma unroll
      for (int ks = 0; ks < kV6K / 16; ++ks) wgmma::mma_async<BN>(acc, a + 2 * ks, b + 2 * ks);
    }
    wgmma::commit_group();
    wgmma::wait_group<1>();  // stage i-1's MMAs are finished (stage i's may still run)
    wgmma::fence_operands(acc);

    if (i + Stages - 2 < count) load_stage(i + Stages - 2);  // the buffer stage i-2 used
    ptx::cp_async_commit();
  }
  wgmma::wait_group<0>();
  wgmma::fence_operands(acc);
  ptx::cp_async_wait<0>();  // the empty groups too: the stages are about to be reused
  __syncthreads();

  // The block's partial tile, token-major: partial[token][row], 64 x BN fp32 in the stages
  // (at least 3 x 10 KB >= 16 KB). Warp w holds rows 16w + g and 16w + g + 8; accumulator
  // 4j + {0,1} / {2,3} are tokens 8j + 2c + {0,1} of those rows (wgmma_ptx.cuh).
  {
    const int lane = tid & 31, warp = tid / 32, g = lane >> 2, c = lane & 3;
    const int row = warp * 16 + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int token = j * 8 + c * 2;
      aligned[token * kV6Rows + row] = acc[4 * j];
      aligned[(token + 1) * kV6Rows + row] = acc[4 * j + 1];
      aligned[token * kV6Rows + row + 8] = acc[4 * j + 2];
      aligned[(token + 1) * kV6Rows + row + 8] = acc[4 * j + 3];
    }
  }
  cluster.sync();  // every block's partial tile is written (and visible across the cluster)

  // Block `rank` finishes elements rank * 128 + tid, stepping by splits * 128: a token's
  // 64 rows are 64 consecutive outputs of y, so the stores are coalesced.
  const int tokens = min(T, BN);
  for (int e = rank * kV6Threads + tid; e < tokens * kV6Rows; e += splits * kV6Threads) {
    const int token = e / kV6Rows, n = n0 + e % kV6Rows;
    if (n >= N) continue;
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += cluster.map_shared_rank(aligned, s)[e];  // rank order
    if constexpr (HasBias) sum += __bfloat162float(bias[n]);
    y[size_t(token) * N + n] = __float2bfloat16(sum);
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
#endif
}

/// How many blocks split K: as many as keep the grid in ONE wave (a second, partial wave
/// would stream its weights alone at the end), at most 8 (the portable cluster size) and
/// at most one per stage of k. `slots`: the blocks the GPU holds at once.
int v6_splits_for(int C_in, int C_out, int k_per_stage, int slots) {
  const int tiles = (C_out + kV6Rows - 1) / kV6Rows;
  const int k_stages = (C_in + k_per_stage - 1) / k_per_stage;
  int splits = 1;
  while (splits * 2 <= kV6MaxSplits && splits * 2 <= k_stages && tiles * splits * 2 <= slots) splits *= 2;
  return splits;
}

/// Blocks of this instance the GPU holds at once (shared memory decides), once per instance.
template <int BN, int Stages, int KT>
int v6_slots() {
  static const int slots = [] {
    constexpr int kSmemBytes = v6_smem_bytes<BN, Stages, KT>();
    int per_sm = 0;
    for (auto kernel : {matmul_v6_few_tokens_kernel<BN, Stages, KT, false>,
                        matmul_v6_few_tokens_kernel<BN, Stages, KT, true>}) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kV6Threads, kSmemBytes));
    }
    return std::max(1, per_sm) * int(multiprocessor_count());
  }();
  return slots;
}

template <int BN, int Stages, int KT>
int v6_splits(int C_in, int C_out) {
  return v6_splits_for(C_in, C_out, KT * kV6K, v6_slots<BN, Stages, KT>());
}

template <int BN, int Stages, int KT>
void v6_launch(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, int T,
               int C_in, int C_out, int splits, cudaStream_t stream) {
  constexpr int kSmemBytes = v6_smem_bytes<BN, Stages, KT>();
  const int slots = v6_slots<BN, Stages, KT>();  // also sets the kernels' shared-memory attribute
  if (splits == 0) splits = v6_splits_for(C_in, C_out, KT * kV6K, slots);
  const dim3 grid((C_out + kV6Rows - 1) / kV6Rows, splits);
  with_bias_flag(bias, [&](auto has_bias) {
    auto kernel = matmul_v6_few_tokens_kernel<BN, Stages, KT, decltype(has_bias)::value>;
    const ClusterLaunch launch(grid, dim3(kV6Threads), dim3(1, splits, 1), kSmemBytes, stream, false);
    CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, y, x, W, bias, T, C_out, C_in));
  });
}

struct V6Config {
  const char* name;
  int max_tokens;  // BN
  void (*launch)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int,
                 int, cudaStream_t);
  int (*splits)(int, int);
};

// Every instance, so that tests run each and the benchmark compares them; the first one
// of each column tile is the default for T up to its width.
// H200, 2026-12-03 (bench_h200_v6.txt, in a graph, % of copy bandwidth at T = 1): 5 stages
// of 2 k tiles read the lm_head at 86.5% against 76.8% with 6 stages of 1 tile, down at
// 65.5% against 62.8%, gate/up the same (67.7%). Yet as the default it made the model's
// TTFT at 4-16 tokens 4-9% SLOWER than cuBLASLt's, where 6 stages of 1 tile make it 4-9%
// faster: at 2 blocks an SM the model's gate/up (2 x 8960 rows, 280 tiles) no longer fits
// one wave (264 slots), at 3 it does. 4 tiles a stage (one block an SM) and the 64-token
// tile with 2 tiles a stage lose everywhere.
constexpr V6Config kV6Configs[] = {
    {"16 tokens, 6 stages of 1 k tile (61 KB, 3 blocks an SM)", 16, v6_launch<16, 6, 1>, v6_splits<16, 6, 1>},
    {"32 tokens, 6 stages of 1 k tile (73 KB)", 32, v6_launch<32, 6, 1>, v6_splits<32, 6, 1>},
    {"64 tokens, 4 stages of 1 k tile (65 KB)", 64, v6_launch<64, 4, 1>, v6_splits<64, 4, 1>},
    {"16 tokens, 5 stages of 2 k tiles (101 KB)", 16, v6_launch<16, 5, 2>, v6_splits<16, 5, 2>},
    {"16 tokens, 4 stages of 2 k tiles (81 KB)", 16, v6_launch<16, 4, 2>, v6_splits<16, 4, 2>},
    {"16 tokens, 4 stages of 4 k tiles (161 KB)", 16, v6_launch<16, 4, 4>, v6_splits<16, 4, 4>},
    {"64 tokens, 4 stages of 2 k tiles (129 KB)", 64, v6_launch<64, 4, 2>, v6_splits<64, 4, 2>},
};
constexpr int kV6ConfigCount = int(sizeof(kV6Configs) / sizeof(kV6Configs[0]));

int v6_default_config(int T) {
  for (int i = 0; i < kV6ConfigCount; ++i) {
    if (T <= kV6Configs[i].max_tokens) return i;
  }
  return kV6ConfigCount - 1;
}

}  // namespace

bool matmul_v6_available() {
  static const bool available = sm90a_kernel_runs(matmul_v6_few_tokens_kernel<16, 6, 1, false>);
  return available;
}

bool matmul_v6_supported(const __nv_bfloat16* x, const __nv_bfloat16* W, int T, int C_in) {
  return T >= 1 && T <= kMatmulV6MaxTokens && C_in > 0 && C_in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W) % 16 == 0;
}

int matmul_v6_config_count() { return kV6ConfigCount; }
const char* matmul_v6_config_name(int config) { return kV6Configs[config].name; }
int matmul_v6_config_max_tokens(int config) { return kV6Configs[config].max_tokens; }

int matmul_v6_splits(int T, int C_in, int C_out) {
  return kV6Configs[v6_default_config(T)].splits(C_in, C_out);
}

void matmul_v6_few_tokens_config(int config, int splits, __nv_bfloat16* y, const __nv_bfloat16* x,
                                 const __nv_bfloat16* W, const __nv_bfloat16* bias, int T, int C_in, int C_out,
                                 cudaStream_t stream) {
  matmul_check_sizes("matmul_v6_few_tokens", T, C_in, C_out);
  if (T == 0 || C_out == 0) return;
  if (!matmul_v6_supported(x, W, T, C_in)) {
    throw std::invalid_argument("matmul_v6_few_tokens: needs 1 <= T <= " + std::to_string(kMatmulV6MaxTokens) +
                                ", C_in % 8 == 0 and 16-byte aligned x and W; got T=" + std::to_string(T) +
                                " C_in=" + std::to_string(C_in));
  }
  if (splits < 0 || splits > kV6MaxSplits) {
    throw std::invalid_argument("matmul_v6_few_tokens: splits must be 1..8 (0: chosen), got " + std::to_string(splits));
  }
  if (config < 0 || config >= kV6ConfigCount || T > kV6Configs[config].max_tokens) {
    throw std::invalid_argument("matmul_v6_few_tokens: configuration " + std::to_string(config) +
                                " does not exist or takes fewer than T=" + std::to_string(T) + " tokens");
  }
  kV6Configs[config].launch(y, x, W, bias, T, C_in, C_out, splits, stream);
}

void matmul_v6_few_tokens_splits(int splits, __nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                                 const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_v6_few_tokens_config(v6_default_config(T), splits, y, x, W, bias, T, C_in, C_out, stream);
}

void matmul_v6_few_tokens(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_v6_few_tokens_splits(0, y, x, W, bias, T, C_in, C_out, stream);
}

}  // namespace bielik
