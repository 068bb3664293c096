// v5: v3's splits and its combine in ONE kernel, through a thread block cluster (Hopper).
//
// v3 is two kernels: the splits write partial states to global memory, a combine kernel
// reads them back. In the model's decode step every kernel boundary costs ~1-2 us (the
// grid drains, the next one's griddepcontrol.wait returns, its first loads travel to L2
// and back) against well under a microsecond of attention work at chat lengths. v4 tried
// to drop the combine with a global counter and lost (the fence, the ticket and a merge
// done by one block after all the others). Chapter 08 tried merging the partials in the
// O projection and lost too: each of its ~200 blocks re-read every partial.
//
// Hopper has a third way. A grid can be launched in CLUSTERS of up to 16 blocks that are
// scheduled together on one GPC; the blocks of a cluster can read each other's shared
// memory (distributed shared memory, DSMEM) and meet at a hardware barrier. v5 makes the
// splits of one kv head one cluster:
//  * block r of kv head g's cluster streams split r of g's keys exactly as v3 does
//    (same pipelined body, same early loads of committed keys before the PDL wait) and
//    leaves its partial state (m, l and acc of the G query heads) in ITS OWN shared memory;
//  * the cluster meets at its barrier (release / acquire: every block's partial is then
//    visible to every other block);
//  * each block merges a slice of the G x D outputs, reading the partials straight out
//    of the other blocks' shared memory, and writes the bf16 output;
//  * the cluster meets once more before exiting: a block's shared memory must outlive
//    the other blocks' reads of it.
// No partial goes through global memory, no second launch, no workspace.
//
// The split count is the cluster size: 16 blocks per kv head where the GPU allows that
// non-portable size (the H200 does), else the portable 8, each of 8 warps (32 keys a round
// for D = 128). Before sm_90 there are no clusters: the v5 entry points run v3 instead.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_cluster.cuh"
#include "decode_attention_device.cuh"
#include "pdl.cuh"

#include <cooperative_groups.h>

namespace bielik {

namespace {

namespace cg = cooperative_groups;

constexpr int kV5Warps = decode::kClusterWarps;
constexpr int kV5MaxCluster = decode::kClusterMaxSize;

template <int D, int G>
__global__ void __launch_bounds__(kV5Warps * 32)
    decode_attention_v5_kernel(__nv_bfloat16* out,            // (H, D)
                               const __nv_bfloat16* q,        // (H, D)
                               const __nv_bfloat16* k_cache,  // (Hkv, max_context, D)
                               const __nv_bfloat16* v_cache,  // (Hkv, max_context, D)
                               const int* d_length,  // (1) or nullptr: kv_len = *d_length + kv_len_arg
                               int kv_len_arg, int max_context,
                               unsigned long long* timeline) {  // (2 * kAttentionTimelineEvents) or nullptr
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  timeline_fold(timeline, decode::kAttentionStart);
  __shared__ decode::ClusterPartial<D, G> partial;  // this block's split, read by the whole cluster
  cg::cluster_group cluster = cg::this_cluster();
  const int kv_head = blockIdx.y;
  // As v3's split kernel: the next kernel only preloads weights, so it may be scheduled
  // now (the length and the committed keys are read before the wait, inside).
  pdl_allow_dependents();
  __nv_bfloat16* group_out = out + size_t(kv_head) * G * D;
  decode::cluster_attention<D, G>(cluster, partial, q, k_cache, v_cache, kv_head, d_length, kv_len_arg, max_context,
                                  [&](int output, float value) { group_out[output] = __float2bfloat16(value); },
                                  timeline);
  cluster.sync();  // no block leaves while another may still read its shared memory
  timeline_fold(timeline, decode::kAttentionEnd);
#else
  __trap();  // never launched before sm_90 (the launcher runs v3 there)
#endif
}

using V5Kernel = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                          const int*, int, int, unsigned long long*);

V5Kernel v5_kernel(int D, int G) {
  return decode::kernel_for_group(G, "decode attention v5", [D](auto group) -> V5Kernel {
    constexpr int kG = decltype(group)::value;
    return D == 128 ? decode_attention_v5_kernel<128, kG> : decode_attention_v5_kernel<64, kG>;
  });
}

void launch_v5(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
               const __nv_bfloat16* v_cache, const int* d_length, int kv_len_arg, int max_context, int H, int Hkv,
               int D, int num_splits, cudaStream_t stream, unsigned long long* timeline = nullptr) {
  V5Kernel kernel = v5_kernel(D, H / Hkv);
  const int cluster = std::clamp(num_splits, 1, decode::largest_cluster_size(kernel, Hkv));
  // With PDL: the kernel reads the length and the committed keys before its wait.
  const ClusterLaunch launch(dim3(cluster, Hkv), kV5Warps * 32, cluster, 0, stream, true);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, out, q, k_cache, v_cache, d_length, kv_len_arg, max_context,
                                timeline));
}

}  // namespace

int decode_attention_v5_default_splits(int kv_len, int H, int Hkv, int D, int max_splits) {
  decode_attention_check_shape(nullptr, nullptr, nullptr, std::max(kv_len, 1), H, Hkv, D);
  if (!device_is_sm90_or_newer()) return decode_attention_v3_default_splits(kv_len, H, Hkv, D, max_splits);
  return decode::largest_cluster_size(v5_kernel(D, H / Hkv), Hkv);
}

void decode_attention_v5_cluster(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                 const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv, int D,
                                 DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  if (!device_is_sm90_or_newer()) {
    decode_attention_v3_pipelined(out, q, k_cache, v_cache, kv_len, max_context, H, Hkv, D, workspace, stream);
    return;
  }
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  decode_attention_check_length(kv_len, max_context);
  launch_v5(out, q, k_cache, v_cache, nullptr, kv_len, max_context, H, Hkv, D, kV5MaxCluster, stream);
}

void decode_attention_v5_cluster_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                               const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                               const int* d_length, int new_tokens, int max_context, int H, int Hkv,
                                               int D, int num_splits, DecodeAttentionWorkspace* workspace,
                                               cudaStream_t stream) {
  decode_attention_v5_cluster_device_length_timed(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv,
                                                  D, num_splits, workspace, stream, nullptr);
}

void decode_attention_v5_cluster_device_length_timed(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                     const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                     const int* d_length, int new_tokens, int max_context, int H,
                                                     int Hkv, int D, int num_splits,
                                                     DecodeAttentionWorkspace* workspace, cudaStream_t stream,
                                                     unsigned long long* timeline) {
  if (!device_is_sm90_or_newer()) {
    decode_attention_v3_pipelined_device_length(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv,
                                                D, num_splits, workspace, stream);
    return;
  }
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  if (!d_length) throw std::invalid_argument("decode attention v5: d_length is null");
  if (num_splits < 1) throw std::invalid_argument("decode attention v5: num_splits must be >= 1");
  launch_v5(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv, D, num_splits, stream, timeline);
}

}  // namespace bielik
