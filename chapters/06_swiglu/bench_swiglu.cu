// Chapter 06 benchmark: every gate/up version at Bielik's MLP shape (C = 1536,
// F = 8960) from decode to prefill, against "cuBLASLt gate + cuBLASLt up + elementwise"
// measured in the same run; every tile shape; the decode GEMV against the copy
// bandwidth; the whole MLP against cuBLASLt x 3 + elementwise.
//
// Napkin math. The gate/up half does 2 * T * C * 2F FLOPs (4 T C F: 110 GFLOP at
// T = 2048) and must read at least both weights, 2 * F * C * 2 bytes = 55 MB, plus x
// and h. Intensity is ~T FLOPs per byte: below T ~ 200 it is memory-bound (>= 13 us at
// ~4.2 TB/s), above it compute-bound (~140 us at 800 TFLOP/s for T = 2048). The
// unfused form also moves g and u through memory: 4 * T * F * 2 bytes (147 MB at
// T = 2048, ~35 us), which is what fusion saves.
//
// Every timed output is first compared with the baseline's on the same inputs
// (relative norm error <= 1e-2; "CHECK FAILED" otherwise): a fast wrong kernel is not fast.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench.cuh"
#include "compare.hpp"
#include "device_buffer.cuh"
#include "swiglu.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

constexpr int kC = 1536, kF = 8960, kMaxT = 2048;
constexpr int kTokens[] = {1, 16, 64, 128, 256, 512, 1024, 2048};  // the brief asks 1, 16, 128, 512, 2048; the rest locate crossovers

__nv_bfloat16* bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// Enough repeats for a stable median, few for slow kernels.
BenchTiming time_adaptive(const std::function<void()>& launch) {
  BenchTiming probe = time_gpu(launch, BenchOptions{1, 1, true});
  int repeats = probe.median_ms > 20 ? 3 : probe.median_ms > 2 ? 10 : 30;
  return time_gpu(launch, BenchOptions{2, repeats, true});
}

// Bielik's MLP weights and activations at the largest T, random, on the device.
struct Mlp {
  DeviceBuffer<uint16_t> x, Wg, bg, Wu, bu, Wd, bd;
  DeviceBuffer<uint16_t> h, h_reference, g_scratch, u_scratch, y, y_reference;
  Mlp()
      : x(random_bf16(size_t(kMaxT) * kC, 1)),
        Wg(random_bf16(size_t(kF) * kC, 2, 1.0f / std::sqrt(float(kC)))),
        bg(random_bf16(kF, 3, 0.5f)),
        Wu(random_bf16(size_t(kF) * kC, 4, 1.0f / std::sqrt(float(kC)))),
        bu(random_bf16(kF, 5, 0.5f)),
        Wd(random_bf16(size_t(kC) * kF, 6, 1.0f / std::sqrt(float(kF)))),
        bd(random_bf16(kC, 7, 0.5f)),
        h(size_t(kMaxT) * kF),
        h_reference(size_t(kMaxT) * kF),
        g_scratch(size_t(kMaxT) * kF),
        u_scratch(size_t(kMaxT) * kF),
        y(size_t(kMaxT) * kC),
        y_reference(size_t(kMaxT) * kC) {}

  void gate_up(SwigluLauncher launch, __nv_bfloat16* out, int T) {
    launch(out, bf16(x.data()), bf16(Wg.data()), bf16(bg.data()), bf16(Wu.data()), bf16(bu.data()), T, kC, kF, 0);
  }
  // The baseline: what a framework would launch, with the best library GEMM.
  void baseline_gate_up(__nv_bfloat16* out, int T) {
    matmul_cublaslt(bf16(g_scratch.data()), bf16(x.data()), bf16(Wg.data()), bf16(bg.data()), T, kC, kF, 0);
    matmul_cublaslt(bf16(u_scratch.data()), bf16(x.data()), bf16(Wu.data()), bf16(bu.data()), T, kC, kF, 0);
    swiglu_activation(out, bf16(g_scratch.data()), bf16(u_scratch.data()), size_t(T) * kF, 0);
  }
  void baseline_mlp(__nv_bfloat16* out, int T) {
    baseline_gate_up(bf16(h.data()), T);
    matmul_cublaslt(out, bf16(h.data()), bf16(Wd.data()), bf16(bd.data()), T, kF, kC, 0);
  }
  void mlp(__nv_bfloat16* out, int T) {
    mlp_forward(out, bf16(h.data()), bf16(x.data()), bf16(Wg.data()), bf16(bg.data()), bf16(Wu.data()),
                bf16(bu.data()), bf16(Wd.data()), bf16(bd.data()), T, kC, kF, 0);
  }
};

// Relative norm error of the first `count` elements of `got` against `want`.
bool matches(const DeviceBuffer<uint16_t>& got, const DeviceBuffer<uint16_t>& want, size_t count) {
  std::vector<uint16_t> g = got.to_host(), w = want.to_host();
  g.resize(count);
  w.resize(count);
  return compare_bf16("bench", g, bf16_to_float(w), tolerance::kBf16Output).passed;
}

// Minimum bytes of the gate/up half: both weights, both biases, x and h.
double gate_up_bytes(int T) { return 2.0 * (2.0 * kF * kC + 2.0 * kF + double(T) * (kC + kF)); }

}  // namespace

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_swiglu: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("device: %s\n", describe_device().c_str());
  double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("copy bandwidth (1 GiB D2D, read+write): %.0f GB/s\n", copy_gbs);
  int l2_bytes = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  std::printf("Bielik MLP: C = %d, F = %d, with biases\n", kC, kF);

  Mlp mlp;
  BenchTable gate_up("swiglu gate+up, h = silu(x Wg^T + bg) * (x Wu^T + bu), vs cuBLASLt gate + up + elementwise",
                     {"T", "version", "time (us)", "TFLOP/s", "GB/s (min bytes)", "% of copy BW", "% of baseline",
                      "check"});
  BenchTable tiles("swiglu tile shapes (the one each version picks marked *)",
                   {"T", "version", "tile", "time (us)", "TFLOP/s"});
  for (int T : kTokens) {
    double flops = 4.0 * T * kC * kF, bytes = gate_up_bytes(T);
    size_t count = size_t(T) * kF;
    mlp.baseline_gate_up(bf16(mlp.h_reference.data()), T);
    double base_ms = time_adaptive([&] { mlp.baseline_gate_up(bf16(mlp.h.data()), T); }).median_ms;
    auto row = [&](const std::string& name, double ms, bool ok) {
      gate_up.add_row({std::to_string(T), name, fmt(ms * 1e3, 1), fmt(tflop_per_s(flops, ms), 1),
                       fmt(gb_per_s(bytes, ms), 0), fmt(100 * gb_per_s(bytes, ms) / copy_gbs, 1),
                       fmt(100 * base_ms / ms, 1), ok ? "ok" : "CHECK FAILED"});
    };
    row("cuBLASLt gate + up + elementwise", base_ms, true);
    std::vector<SwigluVersion> entries(std::begin(kSwigluVersions), std::end(kSwigluVersions));
    entries.push_back({"swiglu_gate_up_forward", swiglu_gate_up_forward, INT_MAX});
    for (const SwigluVersion& v : entries) {
      if (T > v.max_tokens) continue;
      mlp.h.fill_bytes(0xFF);
      mlp.gate_up(v.launch, bf16(mlp.h.data()), T);
      CUDA_CHECK(cudaDeviceSynchronize());
      bool ok = matches(mlp.h, mlp.h_reference, count);
      row(v.name, time_adaptive([&] { mlp.gate_up(v.launch, bf16(mlp.h.data()), T); }).median_ms, ok);
    }

    if (T >= 16) {  // which tile shape wins, and does the pick agree?
      for (int i = 0; i < swiglu_v3_tile_count(); ++i) {
        double ms = time_adaptive([&] {
                      swiglu_v3_dual_gemm_tile(i, bf16(mlp.h.data()), bf16(mlp.x.data()), bf16(mlp.Wg.data()),
                                               bf16(mlp.bg.data()), bf16(mlp.Wu.data()), bf16(mlp.bu.data()), T, kC,
                                               kF, 0);
                    }).median_ms;
        bool picked = i == swiglu_v3_pick_tile(T, kF);
        tiles.add_row({std::to_string(T), "v3", std::string(swiglu_v3_tile_name(i)) + (picked ? " *" : ""),
                       fmt(ms * 1e3, 1), fmt(tflop_per_s(flops, ms), 1)});
      }
      for (int i = 0; i < swiglu_v2_tile_count(); ++i) {
        double ms = time_adaptive([&] {
                      swiglu_v2_epilogue_fused_tile(i, bf16(mlp.h.data()), bf16(mlp.x.data()), bf16(mlp.Wg.data()),
                                                    bf16(mlp.bg.data()), bf16(mlp.Wu.data()), bf16(mlp.bu.data()), T,
                                                    kC, kF, 0);
                    }).median_ms;
        bool picked = i == swiglu_v2_pick_tile(T, kF);
        tiles.add_row({std::to_string(T), "v2 (gate GEMM + up GEMM)",
                       std::string(swiglu_v2_tile_name(i)) + (picked ? " *" : ""), fmt(ms * 1e3, 1),
                       fmt(tflop_per_s(flops, ms), 1)});
      }
    }
  }

  // Decode: the GEMV form against the bandwidth ceiling. "isolated": one launch, L2
  // flushed. "back-to-back": launches queued as in a forward pass, rotating over copies
  // of Wg and Wu that together exceed the L2 2.5 times over (every launch reads its
  // weights from HBM).
  BenchTable gemv("swiglu decode, T up to 8, bandwidth vs the D2D copy ceiling (bytes = Wg + Wu + biases + x + h)",
                  {"T", "version", "isolated (us)", "GB/s", "% of copy BW", "back-to-back (us)", "GB/s",
                   "% of copy BW"});
  {
    size_t w_elements = size_t(kF) * kC;
    int copies = int(std::clamp<double>(std::ceil(2.5 * l2_bytes / (4.0 * w_elements)), 2, 64));
    std::vector<DeviceBuffer<uint16_t>> wg, wu;
    for (int i = 0; i < copies; ++i) {
      wg.emplace_back(w_elements);
      wu.emplace_back(w_elements);
      CUDA_CHECK(cudaMemcpy(wg[i].data(), mlp.Wg.data(), mlp.Wg.bytes(), cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaMemcpy(wu[i].data(), mlp.Wu.data(), mlp.Wu.bytes(), cudaMemcpyDeviceToDevice));
    }
    struct Decode {
      const char* name;
      std::function<void(int, int)> run;  // (copy, T)
    };
    std::vector<Decode> forms = {
        {"v4_gemv",
         [&](int i, int T) {
           swiglu_v4_gemv(bf16(mlp.h.data()), bf16(mlp.x.data()), bf16(wg[i].data()), bf16(mlp.bg.data()),
                          bf16(wu[i].data()), bf16(mlp.bu.data()), T, kC, kF, 0);
         }},
        {"v1_unfused (matmul_forward x 2 + elementwise)",
         [&](int i, int T) {
           swiglu_v1_unfused(bf16(mlp.h.data()), bf16(mlp.x.data()), bf16(wg[i].data()), bf16(mlp.bg.data()),
                             bf16(wu[i].data()), bf16(mlp.bu.data()), T, kC, kF, 0);
         }},
        {"cuBLASLt gate + up + elementwise",
         [&](int i, int T) {
           matmul_cublaslt(bf16(mlp.g_scratch.data()), bf16(mlp.x.data()), bf16(wg[i].data()), bf16(mlp.bg.data()),
                           T, kC, kF, 0);
           matmul_cublaslt(bf16(mlp.u_scratch.data()), bf16(mlp.x.data()), bf16(wu[i].data()), bf16(mlp.bu.data()),
                           T, kC, kF, 0);
           swiglu_activation(bf16(mlp.h.data()), bf16(mlp.g_scratch.data()), bf16(mlp.u_scratch.data()),
                             size_t(T) * kF, 0);
         }},
    };
    const int launches = 8 * copies;  // enough queued launches to hide the first one's latency
    for (int T = 1; T <= kSwigluGemvMaxTokens; ++T) {
      double bytes = gate_up_bytes(T);
      for (const Decode& form : forms) {
        BenchTiming isolated = time_gpu([&] { form.run(0, T); });
        BenchTiming batched = time_gpu_back_to_back([&](int i) { form.run(i % copies, T); }, launches);
        double gbs = gb_per_s(bytes, isolated.median_ms), batched_gbs = gb_per_s(bytes, batched.median_ms);
        gemv.add_row({std::to_string(T), form.name, fmt(isolated.median_ms * 1e3, 1), fmt(gbs, 0),
                      fmt(100 * gbs / copy_gbs, 1), fmt(batched.median_ms * 1e3, 1), fmt(batched_gbs, 0),
                      fmt(100 * batched_gbs / copy_gbs, 1)});
      }
    }
  }

  // The whole MLP, as the model calls it, against cuBLASLt x 3 + elementwise.
  BenchTable whole("swiglu whole MLP, mlp_forward vs cuBLASLt x 3 + elementwise",
                   {"T", "cuBLASLt x 3 + elementwise (us)", "mlp_forward (us)", "TFLOP/s", "% of baseline", "check"});
  for (int T : kTokens) {
    double flops = 6.0 * T * kC * kF;
    mlp.baseline_mlp(bf16(mlp.y_reference.data()), T);
    double base_ms = time_adaptive([&] { mlp.baseline_mlp(bf16(mlp.y.data()), T); }).median_ms;
    mlp.y.fill_bytes(0xFF);
    mlp.mlp(bf16(mlp.y.data()), T);
    CUDA_CHECK(cudaDeviceSynchronize());
    bool ok = matches(mlp.y, mlp.y_reference, size_t(T) * kC);
    double ms = time_adaptive([&] { mlp.mlp(bf16(mlp.y.data()), T); }).median_ms;
    whole.add_row({std::to_string(T), fmt(base_ms * 1e3, 1), fmt(ms * 1e3, 1), fmt(tflop_per_s(flops, ms), 1),
                   fmt(100 * base_ms / ms, 1), ok ? "ok" : "CHECK FAILED"});
  }

  gate_up.print();
  tiles.print();
  gemv.print();
  whole.print();
  return 0;
}
