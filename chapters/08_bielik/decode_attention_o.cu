// The decode step's attention and O projection in one cluster kernel
// (decode_attention_o.cuh says why and how).
#include <algorithm>
#include <cooperative_groups.h>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "cuda_check.cuh"
#include "decode_attention_cluster.cuh"  // chapter 07: v5's attention as a device function
#include "decode_attention_o.cuh"
#include "decode_device.cuh"   // dot_8, warp_sum
#include "pdl.cuh"
#include "weight_stream.cuh"   // chapter 03: copy_async_bulk and the mbarrier

namespace bielik {

namespace {

namespace cg = cooperative_groups;
using namespace decode_device;

constexpr int kThreadsPerBlock = decode::kClusterWarps * 32;

// Grid (S, Hkv, R), clusters of (S, 1, 1): cluster (g, z) computes kv head g (each of
// the R replicas the same attention); its block r owns O rows
// [(z S + r) rows_per_block, ...) of g's column band.
template <int D, int G>
__global__ void __launch_bounds__(kThreadsPerBlock) attention_o_kernel(AttentionOParams p, int rows_per_block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kBand = G * D;         // the group's attention outputs = the width of its W_o band
  constexpr int kChunks = kBand / 8;   // 16-byte chunks of one band row
  extern __shared__ __align__(128) uint4 dynamic_shared[];
  uint4* band_rows = dynamic_shared;                                  // (rows_per_block, kChunks) W_o
  uint4* attention = dynamic_shared + size_t(rows_per_block) * kChunks;  // (kChunks) the group's output, bf16
  __shared__ decode::ClusterPartial<D, G> partial;  // this block's split, read by the whole cluster
  __shared__ uint64_t rows_arrived;                 // counts the band rows' bytes in
  cg::cluster_group cluster = cg::this_cluster();
  const int group = int(blockIdx.y), splits = int(cluster.num_blocks());
  const int row_begin = (int(blockIdx.z) * splits + int(cluster.block_rank())) * rows_per_block;
  const int rows = max(0, min(p.C, row_begin + rows_per_block) - row_begin);

  // The next kernel (gate/up) reads only constants before its wait: let it be scheduled
  // now, so that its weights stream while this kernel runs.
  pdl_allow_dependents();

  // 1. This block's W_o rows, requested before anything else: no kernel writes them, so
  //    they travel while the QKV projection still runs. One bulk copy per row (its band
  //    is contiguous; rows are H D apart).
  if (threadIdx.x == 0) {
    stream_ptx::barrier_init(&rows_arrived, 1);
    stream_ptx::barrier_init_fence();
    stream_ptx::barrier_expect_bytes(&rows_arrived, uint32_t(rows) * kBand * 2);
  }
  __syncthreads();
  for (int r = int(threadIdx.x); r < rows; r += kThreadsPerBlock) {
    copy_async_bulk(band_rows + size_t(r) * kChunks, p.w_o + size_t(row_begin + r) * p.H * D + size_t(group) * kBand,
                    kBand * 2, &rows_arrived);
  }

  // 2. v5's attention; every merged value goes, rounded to bf16 as chapter 07 stores it,
  //    into the `attention` vector of every block of the cluster.
  __nv_bfloat16* attention_values = reinterpret_cast<__nv_bfloat16*>(attention);
  decode::cluster_attention<D, G>(cluster, partial, p.q, p.k_cache, p.v_cache, group, p.d_length, p.new_tokens,
                                  p.max_context, [&](int output, float value) {
                                    const __nv_bfloat16 rounded = __float2bfloat16(value);
                                    for (int r = 0; r < splits; ++r) {
                                      cluster.map_shared_rank(attention_values, r)[output] = rounded;
                                    }
                                  });
  // Every block's pushes are visible, and every read of another block's partial is done:
  // from here on no block touches another's memory, so none has to wait before exiting.
  cluster.sync();

  // 3. Group `group`'s share of O rows [row_begin, row_begin + rows): a warp per row, the
  //    band row and the attention vector both in shared memory.
  stream_ptx::barrier_wait(&rows_arrived, 0);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int r = warp; r < rows; r += decode::kClusterWarps) {
    float acc = 0.0f;
    for (int c = lane; c < kChunks; c += 32) acc = dot_8(band_rows[size_t(r) * kChunks + c], attention[c], acc);
    acc = warp_sum(acc);
    if (lane == 0) {
      const int n = row_begin + r;
      if (group == 0 && p.b_o) acc += __bfloat162float(p.b_o[n]);  // the bias once, in group 0's share
      p.partials[size_t(group) * p.C + n] = acc;
    }
  }
#else
  __trap();  // never launched before sm_90 (decode_attention_o_cluster_size says 0 there)
#endif
}

using Kernel = void (*)(AttentionOParams, int);

Kernel kernel_for(int D, int G) {
  if (D != 64 && D != 128) throw std::invalid_argument("decode_attention_o: D must be 64 or 128, got " + std::to_string(D));
  return decode::kernel_for_group(G, "decode_attention_o", [D](auto group) -> Kernel {
    constexpr int kG = decltype(group)::value;
    return D == 128 ? attention_o_kernel<128, kG> : attention_o_kernel<64, kG>;
  });
}

int rows_per_block(int C, int blocks) { return (C + blocks - 1) / blocks; }

size_t dynamic_bytes(int C, int G, int D, int blocks) {
  return (size_t(rows_per_block(C, blocks)) + 1) * G * D * sizeof(__nv_bfloat16);  // the rows + the vector
}

// Whether a cluster of `cluster` blocks of this shape fits (shared memory) and can be
// scheduled on this GPU; asked once per shape.
bool can_run(int C, int H, int Hkv, int D, int cluster, int replicas) {
  if (!device_is_sm90_or_newer() || cluster < 1 || cluster > decode::kClusterMaxSize || replicas < 1) return false;
  static std::map<std::tuple<Kernel, size_t, int, int>, bool> known;
  const Kernel kernel = kernel_for(D, H / Hkv);
  const size_t bytes = dynamic_bytes(C, H / Hkv, D, cluster * replicas);
  const auto key = std::make_tuple(kernel, bytes, cluster, Hkv);
  auto found = known.find(key);
  if (found != known.end()) return found->second;
  bool ok = bytes <= allow_all_shared_memory(kernel);
  if (ok && cluster > 1) {  // (a cluster of 1 is an ordinary launch: the shared memory was the test)
    ok = cluster_fits(kernel, ClusterLaunch(dim3(cluster, Hkv, 1), kThreadsPerBlock, cluster, bytes, 0, false));
  }
  known.emplace(key, ok);
  return ok;
}

void check_shape(int C, int H, int Hkv, int D) {
  if (C <= 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0) {
    throw std::invalid_argument("decode_attention_o: needs C > 0 and H a multiple of Hkv > 0; got C=" +
                                std::to_string(C) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv));
  }
  kernel_for(D, H / Hkv);  // throws for a D or a G the kernel lacks
}

}  // namespace

int decode_attention_o_cluster_size(int C, int H, int Hkv, int D, int requested, int replicas) {
  check_shape(C, H, Hkv, D);
  const int start = requested > 0 ? std::min(requested, decode::kClusterMaxSize) : decode::kClusterMaxSize;
  for (int cluster = start; cluster >= 1; --cluster) {
    if (can_run(C, H, Hkv, D, cluster, replicas)) return cluster;
  }
  return 0;
}

void decode_attention_o(const AttentionOParams& p, int cluster, bool pdl, cudaStream_t stream, int replicas) {
  check_shape(p.C, p.H, p.Hkv, p.D);
  if (!p.partials || !p.complete()) {
    throw std::invalid_argument(
        "decode_attention_o: needs the partials, q, cache, length and 16-byte aligned W_o pointers, max_context >= 1 "
        "and new_tokens >= 0");
  }
  if (!can_run(p.C, p.H, p.Hkv, p.D, cluster, replicas)) {
    throw std::invalid_argument("decode_attention_o: " + std::to_string(replicas) + " replica(s) of a cluster of " +
                                std::to_string(cluster) + " blocks cannot run this shape on this GPU (C=" +
                                std::to_string(p.C) + "); ask decode_attention_o_cluster_size");
  }
  const Kernel kernel = kernel_for(p.D, p.H / p.Hkv);
  const int blocks = cluster * replicas;  // per kv group, sharing its O rows
  const ClusterLaunch launch(dim3(cluster, p.Hkv, replicas), kThreadsPerBlock, cluster,
                                     dynamic_bytes(p.C, p.H / p.Hkv, p.D, blocks), stream, pdl);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, p, rows_per_block(p.C, blocks)));
}

}  // namespace bielik
