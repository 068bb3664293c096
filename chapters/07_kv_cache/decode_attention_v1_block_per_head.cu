// v1: one block per query head, one pass over all keys with an online softmax.
//
// The direct mapping: block h computes out[h]. Its 4 warps split the keys (lane groups
// of D/8 lanes take keys group, group + 8, ... for D=128), each lane group keeps its own
// running softmax state, and at the end the states merge (shuffles inside a warp, shared
// memory across warps). One pass, no score buffer, any kv_len, 16-byte loads.
//
// Why it is slow, and what v2 changes:
//  * only H blocks: Bielik's 12 heads keep 12 of the H200's 132 SMs busy, and one SM
//    cannot pull anywhere near its share of HBM bandwidth by itself;
//  * each kv head's keys are read G times, once by each of the G query heads that share
//    them (6x for Bielik; the L2 catches some of it when the blocks run in step);
//  * one key per lane group in flight: load, wait ~1 us for HBM, compute, repeat.
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_device.cuh"

namespace bielik {

namespace {

constexpr int kV1Warps = 4;

template <int D>
__global__ void __launch_bounds__(kV1Warps * 32)
    decode_attention_v1_kernel(__nv_bfloat16* out,            // (H, D)
                               const __nv_bfloat16* q,        // (H, D)
                               const __nv_bfloat16* k_cache,  // (Hkv, max_context, D)
                               const __nv_bfloat16* v_cache,  // (Hkv, max_context, D)
                               int kv_len, int max_context, int G) {
  using Layout = decode::LaneLayout<D>;
  constexpr int kGroups = kV1Warps * Layout::kKeysPerWarp;  // lane groups in the block
  const int h = blockIdx.x, kv_head = h / G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp * Layout::kKeysPerWarp + lane / Layout::kLanesPerKey;
  const int sub = lane % Layout::kLanesPerKey;  // this lane's 8 dims: [sub*8, sub*8+8)

  float q_slice[8];
  decode::bf16x8_to_float(*reinterpret_cast<const int4*>(q + size_t(h) * D + sub * 8), q_slice);
  const float q_scale = decode::kLog2e * rsqrtf(float(D));  // scores in log2 units
#pragma unroll
  for (int e = 0; e < 8; ++e) q_slice[e] *= q_scale;

  const __nv_bfloat16* keys = k_cache + size_t(kv_head) * max_context * D + sub * 8;
  const __nv_bfloat16* values = v_cache + size_t(kv_head) * max_context * D + sub * 8;
  float m = -INFINITY, l = 0, acc[8] = {};
  for (int base = 0; base < kv_len; base += kGroups) {  // same trip count for all lanes
    const int key = base + group;
    const bool valid = key < kv_len;
    int4 k_raw = make_int4(0, 0, 0, 0), v_raw = make_int4(0, 0, 0, 0);
    if (valid) {
      k_raw = __ldg(reinterpret_cast<const int4*>(keys + size_t(key) * D));
      v_raw = __ldg(reinterpret_cast<const int4*>(values + size_t(key) * D));
    }
    float k[8], v[8];
    decode::bf16x8_to_float(k_raw, k);
    decode::bf16x8_to_float(v_raw, v);
    float dot = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) dot += q_slice[e] * k[e];
    float s = decode::group_sum<Layout::kLanesPerKey>(dot);
    if (!valid) s = -INFINITY;
    // Online softmax: rescale what we have to the new max, then add this key.
    float m_new = fmaxf(m, s);
    if (m_new != -INFINITY) {
      float alpha = exp2f(m - m_new), p = exp2f(s - m_new);
      l = l * alpha + p;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = acc[e] * alpha + p * v[e];
      m = m_new;
    }
  }

  decode::warp_merge_groups<Layout::kLanesPerKey>(m, l, acc);
  __shared__ float s_m[kV1Warps], s_l[kV1Warps];
  __shared__ float s_acc[kV1Warps][D];
  if (lane < Layout::kLanesPerKey) {  // group 0 of each warp now holds the warp's state
#pragma unroll
    for (int e = 0; e < 8; ++e) s_acc[warp][sub * 8 + e] = acc[e];
    if (sub == 0) {
      s_m[warp] = m;
      s_l[warp] = l;
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float m_max = -INFINITY;
    for (int w = 0; w < kV1Warps; ++w) m_max = fmaxf(m_max, s_m[w]);
    float l_sum = 0, a_sum = 0;
    for (int w = 0; w < kV1Warps; ++w) {
      float weight = exp2f(s_m[w] - m_max);  // 0 for a warp that saw no key
      l_sum += s_l[w] * weight;
      a_sum += s_acc[w][d] * weight;
    }
    out[size_t(h) * D + d] = __float2bfloat16(a_sum / l_sum);
  }
}

}  // namespace

void decode_attention_v1_block_per_head(__nv_bfloat16* out, const __nv_bfloat16* q,
                                        const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, int kv_len,
                                        int max_context, int H, int Hkv, int D, DecodeAttentionWorkspace*,
                                        cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  decode_attention_check_length(kv_len, max_context);
  const int G = H / Hkv;
  if (D == 128) {
    decode_attention_v1_kernel<128><<<H, kV1Warps * 32, 0, stream>>>(out, q, k_cache, v_cache, kv_len,
                                                                     max_context, G);
  } else {
    decode_attention_v1_kernel<64><<<H, kV1Warps * 32, 0, stream>>>(out, q, k_cache, v_cache, kv_len,
                                                                    max_context, G);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
