// Where the time of the fused attention + O projection goes (decode_attention_o.cuh),
// against the two kernels it replaces, at Bielik's shapes.
//
//   bench_attention_o
//
// Every row is a chain of 32 "layers" (each its own W_o and KV cache, 150 MB of W_o in
// all, more than the L2) captured in a CUDA graph with PDL and replayed; the time is per
// layer, median of 10 replays. The fused kernel is also run with fewer O rows (C = 768,
// 192, 16: the same attention, less of W_o to load and multiply), which separates the
// cost of its mechanics from the cost of its W_o bytes. The chains with a QKV-sized GEMV
// in front show what happens when the kernel before still runs.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_o.cuh"
#include "decode_kernels.cuh"
#include "device_buffer.cuh"

using namespace bielik;

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_attention_o: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("%s\n\n", describe_device().c_str());
  constexpr int kLayers = 32, C = 1536, H = 12, Hkv = 2, D = 128, kMaxContext = 2048;
  const size_t w_o_elements = size_t(C) * H * D, cache_elements = size_t(Hkv) * kMaxContext * D;
  std::vector<DeviceBuffer<__nv_bfloat16>> w_o, w_qkv, k_cache, v_cache;
  for (int l = 0; l < kLayers; ++l) {
    w_o.emplace_back(w_o_elements);
    w_qkv.emplace_back(size_t(2048) * C);
    k_cache.emplace_back(cache_elements);
    v_cache.emplace_back(cache_elements);
    for (auto* buffer : {&w_o.back(), &w_qkv.back(), &k_cache.back(), &v_cache.back()}) {
      buffer->fill_bytes(0x3c);  // small finite bf16 values: the time does not depend on them
    }
  }
  DeviceBuffer<__nv_bfloat16> x(C), norm(C), qkv(2048), attention(size_t(H) * D), residual(C);
  x.fill_bytes(0x3c);
  norm.fill_bytes(0x3f);
  qkv.fill_bytes(0x3c);
  residual.fill_bytes(0x3c);
  DeviceBuffer<float> partials(size_t(Hkv) * C);
  DeviceBuffer<int> length(1);
  DecodeAttentionWorkspace workspace(H, D, 64);
  const int largest_fused = decode_attention_o_cluster_size(C, H, Hkv, D);
  std::printf("fused kernel: largest cluster %d\n", largest_fused);

  // The kernels a chain is made of, each for layer l on stream s.
  auto qkv_gemv = [&](int l, cudaStream_t s) {
    DecodeGemvParams p{qkv.data(), x.data(), norm.data(), w_qkv[l].data(), nullptr, 2048, C, 1e-6f};
    p.stream_evict_first = true;
    decode_gemv(GemvInput::kRmsNorm, GemvOutput::kBf16, p, true, s);
  };
  auto v5 = [&](int l, int cluster, cudaStream_t s) {
    decode_attention_v5_cluster_device_length(attention.data(), qkv.data(), k_cache[l].data(), v_cache[l].data(),
                                              length.data(), 1, kMaxContext, H, Hkv, D, cluster, &workspace, s);
  };
  auto o_gemv = [&](int l, cudaStream_t s) {
    DecodeGemvParams p{residual.data(), attention.data(), nullptr, w_o[l].data(), nullptr, C, H * D, 1e-6f};
    p.stream_evict_first = true;
    p.epilogue_inputs_settled = true;
    p.allow_dependents_early = true;
    decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, p, true, s);
  };
  auto fused = [&](int l, int rows, cudaStream_t s, int replicas = 1, int cluster = 0) {
    AttentionOParams p;
    p.partials = partials.data();
    p.q = qkv.data();
    p.k_cache = k_cache[l].data();
    p.v_cache = v_cache[l].data();
    p.d_length = length.data();
    p.max_context = kMaxContext;
    p.w_o = w_o[l].data();
    p.C = rows;
    p.H = H;
    p.Hkv = Hkv;
    p.D = D;
    decode_attention_o(p, decode_attention_o_cluster_size(rows, H, Hkv, D, cluster, replicas), true, s, replicas);
  };

  struct Chain {
    std::string label;
    std::function<void(int, cudaStream_t)> layer;
  };
  std::vector<Chain> chains = {
      {"v5 attention, clusters of 8", [&](int l, cudaStream_t s) { v5(l, 8, s); }},
      {"v5 attention, clusters of 16", [&](int l, cudaStream_t s) { v5(l, 16, s); }},
      {"O GEMV alone", [&](int l, cudaStream_t s) { o_gemv(l, s); }},
      {"v5 (8) + O GEMV", [&](int l, cudaStream_t s) { v5(l, 8, s), o_gemv(l, s); }},
      {"QKV GEMV alone", [&](int l, cudaStream_t s) { qkv_gemv(l, s); }},
      {"QKV GEMV + v5 (8) + O GEMV", [&](int l, cudaStream_t s) { qkv_gemv(l, s), v5(l, 8, s), o_gemv(l, s); }},
  };
  if (largest_fused > 0) {
    for (int rows : {C, 768, 192, 16}) {
      chains.push_back({"fused attention + O, C = " + std::to_string(rows) + " rows, clusters of " +
                            std::to_string(decode_attention_o_cluster_size(rows, H, Hkv, D)),
                        [&, rows](int l, cudaStream_t s) { fused(l, rows, s); }});
    }
    for (int cluster : {16, 8}) {
      for (int replicas : {2, 4, 8}) {
        if (decode_attention_o_cluster_size(C, H, Hkv, D, cluster, replicas) != cluster) continue;
        chains.push_back({"fused attention + O, clusters of " + std::to_string(cluster) + " x " +
                              std::to_string(replicas) + " replicas",
                          [&, cluster, replicas](int l, cudaStream_t s) { fused(l, C, s, replicas, cluster); }});
      }
    }
    chains.push_back({"QKV GEMV + fused attention + O, clusters of 8 x 4 replicas",
                      [&](int l, cudaStream_t s) { qkv_gemv(l, s), fused(l, C, s, 4, 8); }});
    chains.push_back({"QKV GEMV + fused attention + O", [&](int l, cudaStream_t s) { qkv_gemv(l, s), fused(l, C, s); }});
    chains.push_back({"QKV GEMV + fused attention + O, 4 replicas",
                      [&](int l, cudaStream_t s) { qkv_gemv(l, s), fused(l, C, s, 4); }});
    chains.push_back({"QKV GEMV + fused attention + O, C = 16 rows",
                      [&](int l, cudaStream_t s) { qkv_gemv(l, s), fused(l, 16, s); }});
  }

  BenchTable table("attention_o", {"chain (per layer)", "keys", "us per layer"});
  for (int keys : {64, 1024}) {
    length.copy_from_host(std::vector<int>{keys - 1});
    for (const Chain& chain : chains) {
      const BenchTiming t = time_gpu_graph([&](int l, cudaStream_t s) { chain.layer(l, s); }, kLayers);
      table.add_row({chain.label, std::to_string(keys), fmt(t.median_ms * 1e3, 2)});
    }
  }
  table.print();
  return 0;
}
