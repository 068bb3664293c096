// The decode step's MLP in one kernel (decode_mlp_fused.cuh says why and what it costs).
//
// The layout. Warp w of the grid (W warps in all, 8 an SM, FusedMlpParams::block_warps a
// block) takes the intermediate values i = w, w + W, w + 2W, ... For each it needs three
// rows of C bf16: gate row i, up row i (both of W_gate_up) and row i of W_down^T (column i
// of W_down). Lane l holds the 16-byte chunks c = l, l + 32, ... of each: kChunks chunks a
// row, so C <= 256 kChunks (kChunks = 2 or 6), and one value is 3 kChunks loads a lane.
//
// The pipeline. Two values are in flight a warp: while the warp uses value i (its two
// dot products, a warp sum each, the SwiGLU, then h_i times its down row added into the
// lane's 8 kChunks accumulators), the loads of value i + W are already out, and those of
// i + 2W go out as soon as value i's registers are free. Per SM that is 8 warps x 2 x
// 3 C bf16 = 144 KB in flight at C = 1536, which chapter 03's bench_weight_stream found
// enough for a block an SM to stream at ~97% of the copy bandwidth.
//
// The same numerics as the unfused pair (gate/up's kSwiGLU epilogue, then down): the
// input is staged and normalized as decode_device's stage_input does (bf16(rmsnorm(x) * w)),
// g and u are rounded to bf16 after their bias, h_i = bf16(silu(g) u), and the products
// h_i W_down[:, i] are summed in fp32. Only the order of that sum differs.
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_device.cuh"
#include "decode_mlp_fused.cuh"
#include "matmul_common.cuh"  // chapter 03: multiprocessor_count

namespace bielik {

using namespace decode_device;

namespace {

// C <= 1536. Bielik's C = 1536 takes 255 registers a thread with no spill; 8 chunks a
// lane (C = 2048) spill ~400 bytes (ptxas -v), and no model here needs them.
constexpr int kMaxChunksPerLane = 6;

/// The three weight rows of one intermediate value, lane l's chunks of each, and the
/// value's two biases.
template <int kChunks>
struct ValueWeights {
  uint4 gate[kChunks], up[kChunks], down[kChunks];
  float bias_gate, bias_up;
};

/// Loads value `unit`'s rows (lane `lane`'s chunks); past F, or past the row, zeros
/// without a load.
template <int kChunks>
__device__ __forceinline__ void load_value(ValueWeights<kChunks>& w, const FusedMlpParams& p, int unit, int lane,
                                           uint64_t policy) {
  const int chunks = p.C / 8;
  const bool valid = unit < p.F;
  const size_t row = valid ? size_t(unit) : 0;
  const __nv_bfloat16* gate = p.w_gate_up + row * p.C;
  const __nv_bfloat16* up = p.w_gate_up + (size_t(p.F) + row) * p.C;
  const __nv_bfloat16* down = p.w_down_t + row * p.C;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;
    const bool in_row = valid && c < chunks;
    w.gate[j] = in_row ? load_streaming(gate + 8 * c, policy) : zero;
    w.up[j] = in_row ? load_streaming(up + 8 * c, policy) : zero;
    w.down[j] = in_row ? load_streaming(down + 8 * c, policy) : zero;
  }
  const bool biased = valid && p.b_gate_up != nullptr;
  w.bias_gate = biased ? __bfloat162float(p.b_gate_up[row]) : 0.0f;
  w.bias_up = biased ? __bfloat162float(p.b_gate_up[size_t(p.F) + row]) : 0.0f;
}

/// Uses one value: its gate and up dot products against the staged input (widened to
/// fp32, stage_input's two planes), the SwiGLU, then acc += h * its down row.
template <int kChunks>
__device__ __forceinline__ void use_value(float (&acc)[kChunks][8], const ValueWeights<kChunks>& w,
                                          const float4* x_widened, int chunks, int lane) {
  float g = 0.0f, u = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) {
      const float4 first = x_widened[c], last = x_widened[chunks + c];
      const float xs[8] = {first.x, first.y, first.z, first.w, last.x, last.y, last.z, last.w};
      const uint32_t gs[4] = {w.gate[j].x, w.gate[j].y, w.gate[j].z, w.gate[j].w};
      const uint32_t us[4] = {w.up[j].x, w.up[j].y, w.up[j].z, w.up[j].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // dot_8's order
        g = fmaf(low_bf16(gs[i]), xs[2 * i], g);
        g = fmaf(high_bf16(gs[i]), xs[2 * i + 1], g);
        u = fmaf(low_bf16(us[i]), xs[2 * i], u);
        u = fmaf(high_bf16(us[i]), xs[2 * i + 1], u);
      }
    }
  }
  g = warp_sum(g);  // a butterfly: every lane has the sums
  u = warp_sum(u);
  const float gate = round_bf16(g + w.bias_gate), up = round_bf16(u + w.bias_up);  // what gate/up would store
  const float h = round_bf16(silu(gate) * up);                                     // the SwiGLU output, bf16
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {  // zeros past the row: adds 0
    float d[8];
    unpack_8(d, w.down[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = fmaf(h, d[e], acc[j][e]);
  }
}

// C <= 1536: 192 chunks, at most 2 a thread for blocks of 128 threads.
constexpr int kStageChunksPerThread = 2;

/// Waits for the previous kernel, then stages bf16(rmsnorm(x) * norm_weight) widened to
/// fp32 in x_widened's two planes (the first and last four values of each chunk, as
/// decode_device's stage_input writes them), every thread its chunks t, t + threads.
/// The same numerics as stage_input (sum of squares in fp32, rsqrtf, the normalized
/// values rounded to bf16 once); only the order of the sum of squares differs. Ends on a
/// barrier. decode_device's stage_input is written for blocks of 256 threads; this
/// kernel's blocks may have 128.
template <int kBlockWarps>
__device__ __forceinline__ void stage_normalized_input(const FusedMlpParams& p, float4* x_widened, float* scratch,
                                                       const uint4 (&norm_held)[kStageChunksPerThread]) {
  constexpr int kBlockThreads = kBlockWarps * 32;
  const int chunks = p.C / 8, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_wait();
  const uint4* x_vectors = reinterpret_cast<const uint4*>(p.x);
  uint4 raw[kStageChunksPerThread];
  float sum_squares = 0.0f;
#pragma unroll
  for (int u = 0; u < kStageChunksPerThread; ++u) {
    const int c = threadIdx.x + u * kBlockThreads;
    raw[u] = c < chunks ? x_vectors[c] : make_uint4(0, 0, 0, 0);
    float f[8];
    unpack_8(f, raw[u]);  // zeros past the end
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_squares += f[e] * f[e];
  }
  sum_squares = warp_sum(sum_squares);
  if (lane == 0) scratch[warp] = sum_squares;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kBlockWarps; ++w) total += scratch[w];
  const float inverse_rms = rsqrtf(total / float(p.C) + p.eps);
#pragma unroll
  for (int u = 0; u < kStageChunksPerThread; ++u) {
    const int c = threadIdx.x + u * kBlockThreads;
    if (c < chunks) {
      float f[8], g[8];
      unpack_8(f, raw[u]);
      unpack_8(g, norm_held[u]);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = f[e] * inverse_rms * g[e];
      unpack_8(f, pack_8(f));  // rounded to bf16 once, as chapter 02's norm stores it
      x_widened[c] = make_float4(f[0], f[1], f[2], f[3]);
      x_widened[chunks + c] = make_float4(f[4], f[5], f[6], f[7]);
    }
  }
  __syncthreads();
}

// kBlockWarps warps a block, 8 / kBlockWarps blocks an SM: the same 8 warps an SM either
// way. Blocks of 4 (~32k registers) fit beside another kernel's block of ~32k, so that
// the kernel's blocks can start, and send for their first weights, while the attention
// and O still hold part of each SM; blocks of 8 take a whole SM's registers.
template <int kChunks, int kBlockWarps>
__global__ void __launch_bounds__(kBlockWarps * 32, 8 / kBlockWarps) decode_mlp_fused_kernel(FusedMlpParams p) {
  constexpr int kBlockThreads = kBlockWarps * 32;
  extern __shared__ __align__(16) unsigned char shared[];
  const int chunks = p.C / 8;
  float4* x_widened = reinterpret_cast<float4*>(shared);                 // (2, C/8) the normalized input, fp32
  float4* warp_sums = x_widened + 2 * chunks;                              // (kBlockWarps, C/4) each warp's partial
  __shared__ float scratch[kBlockWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = int(gridDim.x) * kBlockWarps;
  const int first = int(blockIdx.x) * kBlockWarps + warp;

  // 1. The first values' weights before the wait (no kernel writes them), and the norm's,
  //    after the pause the decode GEMVs of the MLP take too (start_delay_ns).
  delay_start(p.start_delay_ns);
  const uint64_t policy = l2_policy(p.stream_evict_first);
  ValueWeights<kChunks> a, b;
  if (p.units_before_wait >= 1) load_value(a, p, first, lane, policy);
  if (p.units_before_wait >= 2) load_value(b, p, first + warps, lane, policy);
  uint4 norm_held[kStageChunksPerThread];
#pragma unroll
  for (int u = 0; u < kStageChunksPerThread; ++u) {
    const int c = threadIdx.x + u * kBlockThreads;
    norm_held[u] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(p.norm_weight) + c) : make_uint4(0, 0, 0, 0);
  }

  // 2. The wait, the input staged and normalized by the block; then the reset of the
  //    accumulator that an earlier kernel's readers are done with.
  stage_normalized_input<kBlockWarps>(p, x_widened, scratch, norm_held);
  pdl_allow_dependents();
  if (p.reset) {
    for (int c = int(blockIdx.x) * kBlockThreads + int(threadIdx.x); c < p.C; c += int(gridDim.x) * kBlockThreads) {
      p.reset[c] = p.reset_value ? __bfloat162float(p.reset_value[c]) : 0.0f;
    }
  }
  if (p.units_before_wait < 1) load_value(a, p, first, lane, policy);
  if (p.units_before_wait < 2) load_value(b, p, first + warps, lane, policy);

  // 3. Two values in flight: use one, send for the one after next into its registers.
  float acc[kChunks][8];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.0f;
  }
  for (int unit = first; unit < p.F; unit += 2 * warps) {
    use_value(acc, a, x_widened, chunks, lane);
    load_value(a, p, unit + 2 * warps, lane, policy);
    if (unit + warps < p.F) {  // the same for the whole warp
      use_value(acc, b, x_widened, chunks, lane);
      load_value(b, p, unit + 3 * warps, lane, policy);
    }
  }

  // 4. The block's sum of its warps' partials, in warp order, added into the accumulator.
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) {
      warp_sums[warp * (2 * chunks) + 2 * c] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
      warp_sums[warp * (2 * chunks) + 2 * c + 1] = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
    }
  }
  __syncthreads();
  for (int q = threadIdx.x; q < 2 * chunks; q += kBlockThreads) {
    float4 sum = warp_sums[q];
#pragma unroll
    for (int v = 1; v < kBlockWarps; ++v) {
      const float4 s = warp_sums[v * (2 * chunks) + q];
      sum.x += s.x, sum.y += s.y, sum.z += s.z, sum.w += s.w;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(p.accumulator) + q, sum);  // one vector atomic (sm_90+)
#else
    float* out = p.accumulator + 4 * q;
    atomicAdd(out, sum.x), atomicAdd(out + 1, sum.y), atomicAdd(out + 2, sum.z), atomicAdd(out + 3, sum.w);
#endif
  }
}

template <int kChunks, int kBlockWarps>
void launch_fused(const FusedMlpParams& p, bool pdl, cudaStream_t stream) {
  const size_t shared_bytes = size_t(p.C) * sizeof(float) * (1 + kBlockWarps);  // x widened, the warps' sums
  auto kernel = decode_mlp_fused_kernel<kChunks, kBlockWarps>;
  static const bool allowed = [&] {  // beyond the 48 KB default where C needs it (once)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(size_t(256 * kMaxChunksPerLane) * sizeof(float) * (1 + kBlockWarps))));
    return true;
  }();
  (void)allowed;
  const int blocks = p.blocks > 0 ? p.blocks : multiprocessor_count() * (8 / kBlockWarps);
  launch_kernel(pdl, kernel, dim3(blocks), dim3(kBlockWarps * 32), shared_bytes, stream, p);
}

template <int kChunks>
void launch_fused_blocks(const FusedMlpParams& p, bool pdl, cudaStream_t stream) {
  if (p.block_warps == 8) {
    launch_fused<kChunks, 8>(p, pdl, stream);
  } else {
    launch_fused<kChunks, 4>(p, pdl, stream);
  }
}

// out (cols, rows) = in (rows, cols)^T through a 32 x 32 tile in shared memory: both
// the reads and the writes are coalesced rows of a tile. The +1 column keeps the
// column-wise reads of the tile off a single bank.
constexpr int kTile = 32;
__global__ void __launch_bounds__(kTile * 8) transpose_bf16_kernel(__nv_bfloat16* out, const __nv_bfloat16* in,
                                                                   int rows, int cols) {
  __shared__ __nv_bfloat16 tile[kTile][kTile + 1];
  const int col0 = blockIdx.x * kTile, row0 = blockIdx.y * kTile;
  for (int r = threadIdx.y; r < kTile; r += blockDim.y) {
    const int row = row0 + r, col = col0 + threadIdx.x;
    if (row < rows && col < cols) tile[r][threadIdx.x] = in[size_t(row) * cols + col];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < kTile; r += blockDim.y) {
    const int out_row = col0 + r, out_col = row0 + threadIdx.x;  // out[col][row] = in[row][col]
    if (out_row < cols && out_col < rows) out[size_t(out_row) * rows + out_col] = tile[threadIdx.x][r];
  }
}

}  // namespace

int decode_mlp_fused_max_c() { return 256 * kMaxChunksPerLane; }

void decode_mlp_fused(const FusedMlpParams& p, bool pdl, cudaStream_t stream) {
  auto aligned = [](const void* q) { return q == nullptr || aligned_16(q); };
  if (p.C <= 0 || p.C % 8 != 0 || p.C > 256 * kMaxChunksPerLane || p.F < 1 || !p.x || !p.norm_weight ||
      !p.w_gate_up || !p.w_down_t || !p.accumulator || !aligned(p.x) || !aligned(p.norm_weight) ||
      !aligned(p.w_gate_up) || !aligned(p.w_down_t) || !aligned(p.accumulator) || !aligned(p.reset) ||
      p.units_before_wait < 0 || p.units_before_wait > 2 || (p.block_warps != 4 && p.block_warps != 8) ||
      p.blocks < 0) {
    throw std::invalid_argument("decode_mlp_fused: needs 0 < C <= " + std::to_string(256 * kMaxChunksPerLane) +
                                ", C % 8 == 0, F >= 1, units_before_wait 0..2 and 16-byte aligned x, norm weight, "
                                "weights and accumulators, block_warps 4 or 8, blocks >= 0; got C=" +
                                std::to_string(p.C) + " F=" + std::to_string(p.F) + " units_before_wait=" +
                                std::to_string(p.units_before_wait) + " block_warps=" + std::to_string(p.block_warps) +
                                " blocks=" + std::to_string(p.blocks));
  }
  const int chunks_per_lane = (p.C / 8 + 31) / 32;
  if (chunks_per_lane <= 2) {
    launch_fused_blocks<2>(p, pdl, stream);
  } else {
    launch_fused_blocks<6>(p, pdl, stream);  // Bielik: C = 1536
  }
}

void transpose_bf16(__nv_bfloat16* out, const __nv_bfloat16* in, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || !out || !in) {
    throw std::invalid_argument("transpose_bf16: needs rows, cols > 0 and both pointers; got " + std::to_string(rows) +
                                " x " + std::to_string(cols));
  }
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, 8);
  transpose_bf16_kernel<<<grid, block, 0, stream>>>(out, in, rows, cols);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace bielik
