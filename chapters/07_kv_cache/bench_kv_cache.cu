// Chapter 07 benchmark: decode attention over the KV cache at Bielik's heads (H=12,
// Hkv=2, D=128) and SmolLM2's (9/3/64), contexts 1k, 4k and 8k, against the copy
// bandwidth measured in the same run.
//
// Napkin math: one decode step reads every cached key and value of every kv head once:
// bytes = 2 (K and V) * Hkv * kv_len * D * 2 bytes. Bielik at 8192 tokens: 8.4 MB per
// layer, 268 MB for all 32 layers, ~63 us at 4.3 TB/s, next to 750 us for the weights.
// The copy bandwidth counts bytes read + written; decode attention only reads, so "% of
// copy BW" compares its read rate with the copy's read+write rate, the book's one
// ceiling for memory-bound kernels.
//
// Each version is timed two ways:
//   1 layer       one step of one layer between CUDA events, L2 flushed before it
//                 (includes the combine kernel and the gap between the two launches);
//   32 layers     the 32 layers' launches queued back to back, each on its own layer of
//                 a cache sized for 8192 tokens (268 MB, far over the 60 MiB L2), as in the
//                 model's decode step; reported per step = 32 layers;
// plus, for the graph form, the 32 layers captured in one CUDA graph.
//
// With chapter 05 in the build, the last table measures what the cache saves: attention
// for the whole prefix recomputed at T (chapter 05's causal prefill, what a generator
// without a cache does for every new token) against one decode step at T.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.cuh"
#include "decode_attention.cuh"
#include "device_buffer.cuh"
#include "kv_cache.cuh"
#include "test_support.hpp"
#ifdef BIELIK_BENCH_WITH_CH05
#include "attention.cuh"
#endif

using namespace bielik;

namespace {

constexpr int kMaxSplits = 1024;

__nv_bfloat16* as_bf16(uint16_t* bits) { return reinterpret_cast<__nv_bfloat16*>(bits); }

struct Model {
  const char* name;
  int H, Hkv, D, layers;
};

// A cache of `layers` layers at max_context, every position filled with random values.
KvCache filled_cache(const Model& model, int max_context) {
  KvCache cache(model.layers, model.Hkv, model.D, max_context);
  DeviceBuffer<uint16_t> random(random_bf16(cache.layer_elements(), 7));
  for (int layer = 0; layer < model.layers; ++layer) {
    CUDA_CHECK(cudaMemcpy(cache.k(layer), random.data(), random.bytes(), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(cache.v(layer), random.data(), random.bytes(), cudaMemcpyDeviceToDevice));
  }
  return cache;
}

double cache_bytes(const Model& model, int kv_len) { return 4.0 * model.Hkv * kv_len * model.D; }

// Time of one step over all layers when the layers' launches run inside one CUDA graph.
double graph_step_us(const std::function<void(int, cudaStream_t)>& launch_layer, int layers) {
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int layer = 0; layer < layers; ++layer) launch_layer(layer, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  BenchTiming timing = time_gpu_back_to_back([&](int) { CUDA_CHECK(cudaGraphLaunch(exec, 0)); }, 4);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return timing.median_ms * 1e3;
}

void bench_model(const Model& model, double copy_gbs, BenchTable& table) {
  const int max_context = 8192;
  KvCache cache = filled_cache(model, max_context);
  DeviceBuffer<uint16_t> q(random_bf16(size_t(model.H) * model.D, 8));
  DeviceBuffer<uint16_t> out(size_t(model.H) * model.D);
  DecodeAttentionWorkspace workspace(model.H, model.D, kMaxSplits);
  DeviceBuffer<int> d_length(1);

  for (int kv_len : {1024, 4096, 8192}) {
    const double bytes = cache_bytes(model, kv_len);
    auto add_row = [&](const std::string& version, const std::string& splits, double one_layer_us,
                       double step_us, const std::string& how) {
      const double step_gbs = gb_per_s(bytes * model.layers, step_us * 1e-3);
      table.add_row({model.name, version, std::to_string(kv_len), splits, fmt(one_layer_us, 1),
                     fmt(gb_per_s(bytes, one_layer_us * 1e-3), 0),
                     fmt(100 * gb_per_s(bytes, one_layer_us * 1e-3) / copy_gbs, 1),
                     fmt(step_us, 1) + " (" + how + ")", fmt(step_gbs, 0), fmt(100 * step_gbs / copy_gbs, 1)});
    };
    for (const DecodeAttentionVersion& version : kDecodeAttentionVersions) {
      auto launch = [&](int layer) {
        version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer), kv_len, max_context,
                       model.H, model.Hkv, model.D, &workspace, 0);
      };
      BenchTiming one = time_gpu([&] { launch(0); });
      BenchTiming per_layer = time_gpu_back_to_back(launch, model.layers);
      const std::string name = version.name;
      std::string splits;
      if (name.rfind("v2", 0) == 0) {
        splits = std::to_string(decode_attention_v2_default_splits(kv_len, model.H, model.Hkv, model.D, kMaxSplits));
      } else if (name.rfind("v3", 0) == 0) {
        splits = std::to_string(decode_attention_v3_default_splits(kv_len, model.H, model.Hkv, model.D, kMaxSplits));
      }
      add_row(name, splits, one.median_ms * 1e3, per_layer.median_ms * 1e3 * model.layers, "queued");
    }
    // The graph forms: length read from the device, grid fixed for 8192 tokens.
    CUDA_CHECK(cudaMemcpy(d_length.data(), &kv_len, sizeof(int), cudaMemcpyHostToDevice));
    for (const DecodeAttentionDeviceLengthVersion& version : kDecodeAttentionDeviceLengthVersions) {
      const int graph_splits = version.default_splits(max_context, model.H, model.Hkv, model.D, kMaxSplits);
      auto launch_device = [&](int layer, cudaStream_t stream) {
        version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer), d_length.data(), 0,
                       max_context, model.H, model.Hkv, model.D, graph_splits, &workspace, stream);
      };
      BenchTiming one = time_gpu([&] { launch_device(0, 0); });
      add_row(version.name, std::to_string(graph_splits), one.median_ms * 1e3,
              graph_step_us(launch_device, model.layers), "CUDA graph");
    }
  }
}

// v2 and v3 at 8192 tokens with the number of splits forced: too few leave SMs idle,
// too many spend the time on per-block overheads and partial states.
void bench_splits(double copy_gbs) {
  const Model bielik{"Bielik", 12, 2, 128, 32};
  const int kv_len = 8192;
  KvCache cache = filled_cache(bielik, kv_len);
  DeviceBuffer<uint16_t> q(random_bf16(size_t(bielik.H) * bielik.D, 8)), out(size_t(bielik.H) * bielik.D);
  DecodeAttentionWorkspace workspace(bielik.H, bielik.D, kMaxSplits);
  const double bytes = cache_bytes(bielik, kv_len);
  BenchTable table("kv_cache_splits", {"version", "splits", "keys per split", "blocks with keys", "1 layer (us)", "GB/s",
                                       "% of copy BW", "32 layers queued (us)", "GB/s", "% of copy BW"});
  using WithSplits = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                              int, int, int, int, int, int, DecodeAttentionWorkspace*, cudaStream_t);
  struct Swept {
    const char* name;
    WithSplits launch;
    int chosen, min_keys;
  };
  const Swept swept[] = {
      {"v2_split_k", decode_attention_v2_split_k_with_splits,
       decode_attention_v2_default_splits(kv_len, bielik.H, bielik.Hkv, bielik.D, kMaxSplits), kDecodeMinKeysPerSplit},
      {"v3_pipelined", decode_attention_v3_pipelined_with_splits,
       decode_attention_v3_default_splits(kv_len, bielik.H, bielik.Hkv, bielik.D, kMaxSplits),
       kDecodeV3MinKeysPerSplit},
  };
  for (const Swept& version : swept) {
    std::vector<int> counts = {8, 16, 33, 66, 128, 256, 512, version.chosen};
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    for (int splits : counts) {
      auto launch = [&](int layer) {
        version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer), kv_len, kv_len,
                       bielik.H, bielik.Hkv, bielik.D, splits, &workspace, 0);
      };
      BenchTiming one = time_gpu([&] { launch(0); });
      BenchTiming per_layer = time_gpu_back_to_back(launch, bielik.layers);
      double gbs = gb_per_s(bytes, one.median_ms), step_gbs = gb_per_s(bytes, per_layer.median_ms);
      int keys = std::max((kv_len + splits - 1) / splits, version.min_keys);
      int busy = std::min(splits, (kv_len + keys - 1) / keys);  // splits that get keys
      table.add_row({version.name, std::to_string(splits) + (splits == version.chosen ? " (default)" : ""),
                     std::to_string(keys), std::to_string(busy * bielik.Hkv), fmt(one.median_ms * 1e3, 1),
                     fmt(gbs, 0), fmt(100 * gbs / copy_gbs, 1), fmt(per_layer.median_ms * 1e3 * bielik.layers, 1),
                     fmt(step_gbs, 0), fmt(100 * step_gbs / copy_gbs, 1)});
    }
  }
  table.print();
}

// The append and the gather (cache -> token-major for chapter 05) at Bielik's shape.
void bench_append_gather() {
  const Model bielik{"Bielik", 12, 2, 128, 1};
  KvCache cache(1, bielik.Hkv, bielik.D, 8192);
  DeviceBuffer<uint16_t> k_new(random_bf16(size_t(8192) * bielik.Hkv * bielik.D, 9)), v_new(k_new.size());
  BenchTable table("kv_cache_append", {"op", "tokens", "time (us)", "bytes moved", "GB/s"});
  for (int tokens : {1, 512, 4096, 8192}) {
    double bytes = 2.0 * 2 * tokens * bielik.Hkv * bielik.D * 2;  // K and V, read + write
    BenchTiming append = time_gpu([&] {
      kv_cache_append(cache.k(0), cache.v(0), as_bf16(k_new.data()), as_bf16(v_new.data()), 0, tokens, bielik.Hkv,
                      bielik.D, 8192);
    });
    BenchTiming gather = time_gpu([&] {
      kv_cache_gather_token_major(as_bf16(k_new.data()), as_bf16(v_new.data()), cache.k(0), cache.v(0), tokens,
                                  bielik.Hkv, bielik.D, 8192);
    });
    table.add_row({"append", std::to_string(tokens), fmt(append.median_ms * 1e3, 1), fmt(bytes, 0),
                   fmt(gb_per_s(bytes, append.median_ms), 0)});
    table.add_row({"gather", std::to_string(tokens), fmt(gather.median_ms * 1e3, 1), fmt(bytes, 0),
                   fmt(gb_per_s(bytes, gather.median_ms), 0)});
  }
  table.print();
}

#ifdef BIELIK_BENCH_WITH_CH05
// Without a cache, every new token at position T recomputes attention for the whole
// prefix: a causal prefill of T tokens (chapter 05, one layer). With the cache it is one
// decode step over T keys. (The projections and MLP are recomputed too without a cache:
// see the README for that part of the bill.)
void bench_no_cache_vs_cache() {
  const Model bielik{"Bielik", 12, 2, 128, 32};
  BenchTable table("kv_cache_vs_recompute",
                   {"T", "recompute attention over prefix (ch05 prefill, us)", "decode step with cache (us)",
                    "ratio", "est. tokens 1..T without cache (ms)", "est. tokens 1..T with cache (ms)"});
  for (int T : {1024, 4096, 8192}) {
    DeviceBuffer<uint16_t> q(random_bf16(size_t(T) * bielik.H * bielik.D, 10));
    DeviceBuffer<uint16_t> k(random_bf16(size_t(T) * bielik.Hkv * bielik.D, 11));
    DeviceBuffer<uint16_t> v(random_bf16(size_t(T) * bielik.Hkv * bielik.D, 12));
    DeviceBuffer<uint16_t> out(size_t(T) * bielik.H * bielik.D);
    BenchTiming prefill = time_gpu([&] {
      attention_forward(as_bf16(out.data()), as_bf16(q.data()), as_bf16(k.data()), as_bf16(v.data()), T, T, bielik.H,
                        bielik.Hkv, bielik.D);
    });
    KvCache cache(1, bielik.Hkv, bielik.D, T);
    cache.append(0, as_bf16(k.data()), as_bf16(v.data()), T);
    DecodeAttentionWorkspace workspace(bielik.H, bielik.D, kMaxSplits);
    BenchTiming decode = time_gpu([&] {
      decode_attention_forward(as_bf16(out.data()), as_bf16(q.data()), cache.k(0), cache.v(0), T, T, bielik.H,
                               bielik.Hkv, bielik.D, &workspace);
    });
    // Generating tokens 1..T: without a cache the prefill at t costs ~ (t/T)^2 of the one at
    // T (quadratic attention work), so the sum is ~T/3 prefills; with it, ~T/2 decode steps
    // at the average length (linear in t). Both per layer.
    double without_ms = prefill.median_ms * T / 3.0, with_ms = decode.median_ms * T / 2.0;
    table.add_row({std::to_string(T), fmt(prefill.median_ms * 1e3, 1), fmt(decode.median_ms * 1e3, 1),
                   fmt(prefill.median_ms / decode.median_ms, 0), fmt(without_ms, 0), fmt(with_ms, 1)});
  }
  table.print();
}
#endif

}  // namespace

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_kv_cache: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("device: %s\n", describe_device().c_str());
  double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("copy bandwidth (1 GiB D2D, read+write): %.0f GB/s\n", copy_gbs);

  BenchTable table("kv_cache_decode",
                   {"model", "version", "kv_len", "splits", "1 layer (us)", "GB/s", "% of copy BW",
                    "all layers per step (us)", "GB/s", "% of copy BW"});
  bench_model(Model{"Bielik 12/2/128 x32", 12, 2, 128, 32}, copy_gbs, table);
  bench_model(Model{"SmolLM2 9/3/64 x30", 9, 3, 64, 30}, copy_gbs, table);
  table.print();
  bench_splits(copy_gbs);
  bench_append_gather();
#ifdef BIELIK_BENCH_WITH_CH05
  bench_no_cache_vs_cache();
#else
  std::printf("\n(chapter 05 not in this build: no prefill-vs-decode table; see README for the napkin math)\n");
#endif
  return 0;
}
