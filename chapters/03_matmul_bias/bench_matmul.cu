// Chapter 03 benchmark: every matmul version at Bielik's five projection shapes, against
// cuBLASLt in the same run; the GEMV against the copy bandwidth; which tile shape wins;
// what the bias costs.
//
// Napkin math. A linear layer does 2 * T * C_in * C_out FLOPs and must move at least its
// weight, 2 * C_in * C_out bytes: intensity = T FLOPs per byte. The H200 does ~990 dense
// bf16 TFLOP/s (~790 measured on random data) on ~4.3 TB/s, so below T ~ 200 a layer is
// memory-bound (time = weight bytes / bandwidth) and above it compute-bound. Decode
// (T = 1) is pure bandwidth: the 27.5 MB gate_proj weight takes >= 6.4 us at 4.3 TB/s.
// Prefill T = 2048 through gate_proj is 56 GFLOP: ~70 us at 800 TFLOP/s.
//
// Every timed output is first compared with cuBLASLt's on the same inputs (relative
// norm error <= 1e-2; "CHECK FAILED" otherwise): a fast wrong kernel is not fast. Each
// table has a check column: the GEMM tables, the GEMV table (every version at every T,
// v6's instances too), the tile table, the back-to-back table (v5's check at that T) and
// the bias table (each version with and without its bias). cuBLASLt's rows are the
// reference ("reference"); cudaMemcpy's check nothing ("-").
//
// BIELIK_BENCH_VERSIONS=regex times only the matching versions (cuBLASLt, the
// reference, always runs), e.g. BIELIK_BENCH_VERSIONS='v4|v5'.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <regex>
#include <string>

#include "bench.cuh"
#include "compare.hpp"
#include "device_buffer.cuh"
#include "matmul.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

using Launch = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int,
                        int, cudaStream_t);

struct Shape {
  const char* name;
  int C_in, C_out;
  bool bias;  // Bielik: every projection has one, lm_head has none
};
constexpr Shape kShapes[] = {
    {"q/o_proj 1536->1536", 1536, 1536, true},
    {"k/v_proj 1536->256", 1536, 256, true},
    {"gate/up_proj 1536->8960", 1536, 8960, true},
    {"down_proj 8960->1536", 8960, 1536, true},
    {"lm_head 1536->32000", 1536, 32000, false},
};
constexpr int kMaxT = 2048;

__nv_bfloat16* bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// Relative norm error of the first `count` outputs of y against the reference's.
bool outputs_match(const DeviceBuffer<uint16_t>& y, const DeviceBuffer<uint16_t>& reference, size_t count) {
  std::vector<uint16_t> got = y.to_host(), want = reference.to_host();
  got.resize(count);
  want.resize(count);
  return compare_bf16("bench", got, bf16_to_float(want), tolerance::kBf16Output).passed;
}

// Runs `launch` once into y, poisoned first (0xFF: bf16 NaN, so an unwritten output
// fails), and compares its first T rows with `reference`: the check column's word.
const char* check_run(DeviceBuffer<uint16_t>& y, const DeviceBuffer<uint16_t>& reference, int T, int C_out,
                      const std::function<void()>& launch) {
  y.fill_bytes(0xFF);
  launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  return outputs_match(y, reference, size_t(T) * C_out) ? "ok" : "CHECK FAILED";
}

// Enough repeats for a stable median, few for slow kernels.
BenchTiming time_adaptive(const std::function<void()>& launch) {
  BenchTiming probe = time_gpu(launch, BenchOptions{1, 1, true});
  int repeats = probe.median_ms > 20 ? 3 : probe.median_ms > 2 ? 10 : 30;
  return time_gpu(launch, BenchOptions{2, repeats, true});
}

// One shape's tensors at the largest T, random, on the device.
struct Problem {
  const Shape& shape;
  DeviceBuffer<uint16_t> x, W, b, y, y_reference;
  explicit Problem(const Shape& s)
      : shape(s),
        x(random_bf16(size_t(kMaxT) * s.C_in, 1)),
        W(random_bf16(size_t(s.C_out) * s.C_in, 2, 1.0f / std::sqrt(float(s.C_in)))),
        b(random_bf16(s.C_out, 3, 0.5f)),
        y(size_t(kMaxT) * s.C_out),
        y_reference(size_t(kMaxT) * s.C_out) {}
  const __nv_bfloat16* bias() { return shape.bias ? bf16(b.data()) : nullptr; }
  void run(Launch launch, __nv_bfloat16* out, int T) {
    launch(out, bf16(x.data()), bf16(W.data()), bias(), T, shape.C_in, shape.C_out, 0);
  }
  // Relative norm error of y (first T rows) against the cuBLASLt reference.
  bool matches_reference(int T) { return outputs_match(y, y_reference, size_t(T) * shape.C_out); }
};

struct Entry {
  const char* name;
  Launch launch;
  bool own_tensor_core;  // counts for "best own kernel vs cuBLASLt"
};

}  // namespace

int main(int argc, char** argv) {
  // --gemv-only: the GEMV table alone (T <= 64: the GEMVs, v6 and cuBLASLt), then stop.
  const bool gemv_only = argc > 1 && std::string(argv[1]) == "--gemv-only";
  if (!cuda_device_available()) {
    std::printf("bench_matmul: no CUDA device\n");
    return 1;  // measured nothing: not a success
  }
  std::printf("device: %s\n", describe_device().c_str());
  double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("copy bandwidth (1 GiB D2D, read+write): %.0f GB/s\n", copy_gbs);
  int l2_bytes = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  std::printf("v5 (wgmma, sm_90a) available: %s\n", matmul_v5_available() ? "yes" : "no");

  std::regex selected(std::getenv("BIELIK_BENCH_VERSIONS") ? std::getenv("BIELIK_BENCH_VERSIONS") : ".");
  std::vector<Entry> entries;
  for (const MatmulVersion& v : kMatmulVersions) {
    if (!v.available() || (v.launch != matmul_cublaslt && !std::regex_search(v.name, selected))) continue;
    bool own_tc = v.launch == matmul_v4_tensor_cores || v.launch == matmul_v5_wgmma;
    entries.push_back({v.name, v.launch, own_tc});
  }
  entries.push_back({"gemv_v1 (T<=8)", gemv_v1_warp_per_row, false});
  if (matmul_v6_available()) entries.push_back({"v6 (T<=64)", matmul_v6_few_tokens, false});
  entries.push_back({"matmul_forward", matmul_forward, false});
  bool time_v5_tiles = matmul_v5_available() && std::regex_search("v5_wgmma", selected);

  // Decode: the GEMV against the bandwidth ceiling. Bytes = W + x + y (+ b): the weight
  // dominates. "isolated": one launch, L2 flushed. "back-to-back": launches queued as in
  // a forward pass, each on its own copy of W so the copies together exceed the L2
  // 2.5 times over (every launch still reads its weight from HBM). "in a graph": the same
  // back-to-back launches captured in one CUDA graph and replayed, as a decode step runs
  // them: the host's launch rate is out of the measurement.
  BenchTable gemv("GEMV (decode): bandwidth vs the D2D copy ceiling",
                  {"shape", "T", "version", "isolated (us)", "GB/s", "% of copy BW", "back-to-back (us)", "GB/s",
                   "% of copy BW", "in a graph (us)", "GB/s", "% of copy BW", "check"});
  for (const Shape& shape : kShapes) {
    size_t w_elements = size_t(shape.C_out) * shape.C_in;
    int copies = int(std::clamp<double>(std::ceil(2.5 * l2_bytes / (2.0 * w_elements)), 2, 256));
    std::vector<DeviceBuffer<uint16_t>> weights;
    weights.emplace_back(random_bf16(w_elements, 4, 1.0f / std::sqrt(float(shape.C_in))));
    for (int i = 1; i < copies; ++i) {
      weights.emplace_back(w_elements);
      CUDA_CHECK(cudaMemcpy(weights[i].data(), weights[0].data(), weights[0].bytes(), cudaMemcpyDeviceToDevice));
    }
    constexpr int kMaxTokens = std::max(kGemvV2MaxTokens, kMatmulV6MaxTokens);
    DeviceBuffer<uint16_t> x(random_bf16(size_t(kMaxTokens) * shape.C_in, 5)), b(random_bf16(shape.C_out, 6));
    DeviceBuffer<uint16_t> y(size_t(kMaxTokens) * shape.C_out), y_reference(size_t(kMaxTokens) * shape.C_out);
    const __nv_bfloat16* bias = shape.bias ? bf16(b.data()) : nullptr;
    // cudaMemcpy moving the same bytes (copying half of W's bytes reads and writes W's
    // size): what any kernel of this size pays for launch, ramp-up and tail.
    {
      double bytes = 2.0 * w_elements;
      size_t copied = size_t(bytes / 2);
      DeviceBuffer<char> scratch(copied);
      auto copy_on = [&](int i, cudaStream_t stream) {
        CUDA_CHECK(cudaMemcpyAsync(scratch.data(), weights[i].data(), copied, cudaMemcpyDeviceToDevice, stream));
      };
      auto copy = [&](int i) { copy_on(i, 0); };
      BenchTiming isolated = time_gpu([&] { copy(0); });
      BenchTiming batched = time_gpu_back_to_back(copy, copies);
      BenchTiming graphed = time_gpu_graph(copy_on, copies);
      double gbs = gb_per_s(bytes, isolated.median_ms), batched_gbs = gb_per_s(bytes, batched.median_ms);
      double graph_gbs = gb_per_s(bytes, graphed.median_ms);
      gemv.add_row({shape.name, "-", "cudaMemcpy, same bytes", fmt(isolated.median_ms * 1e3, 1), fmt(gbs, 0),
                    fmt(100 * gbs / copy_gbs, 1), fmt(batched.median_ms * 1e3, 1), fmt(batched_gbs, 0),
                    fmt(100 * batched_gbs / copy_gbs, 1), fmt(graphed.median_ms * 1e3, 1), fmt(graph_gbs, 0),
                    fmt(100 * graph_gbs / copy_gbs, 1), "-"});
    }
    for (int T : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64}) {  // past v1's 8: v2 to 16, v6 to 64
      double bytes = 2.0 * (w_elements + size_t(T) * (shape.C_in + shape.C_out) + (shape.bias ? shape.C_out : 0));
      // The reference for this T: cuBLASLt on the first weight copy (all copies are equal).
      matmul_cublaslt(bf16(y_reference.data()), bf16(x.data()), bf16(weights[0].data()), bias, T, shape.C_in,
                      shape.C_out);
      CUDA_CHECK(cudaDeviceSynchronize());
      for (Launch launch : {Launch(gemv_v1_warp_per_row), Launch(gemv_v2_tensor_cores), Launch(matmul_v6_few_tokens),
                            Launch(matmul_cublaslt)}) {
        if (launch == gemv_v1_warp_per_row && T > kGemvMaxTokens) continue;
        if (launch == gemv_v2_tensor_cores && T > kGemvV2MaxTokens) continue;
        if (launch == matmul_v6_few_tokens && !matmul_v6_available()) continue;
        const char* name = launch == matmul_cublaslt        ? "cublaslt"
                           : launch == gemv_v2_tensor_cores ? "gemv_v2 (tensor cores)"
                           : launch == matmul_v6_few_tokens ? "v6 (wgmma, few tokens)"
                                                            : "gemv_v1";
        auto run_on = [&](int i, cudaStream_t stream) {
          launch(bf16(y.data()), bf16(x.data()), bf16(weights[i].data()), bias, T, shape.C_in, shape.C_out, stream);
        };
        auto run = [&](int i) { run_on(i, 0); };
        const char* check = launch == matmul_cublaslt ? "reference"
                                                      : check_run(y, y_reference, T, shape.C_out, [&] { run(0); });
        BenchTiming isolated = time_gpu([&] { run(0); });
        BenchTiming batched = time_gpu_back_to_back(run, copies);
        double gbs = gb_per_s(bytes, isolated.median_ms), batched_gbs = gb_per_s(bytes, batched.median_ms);
        std::vector<std::string> row = {shape.name, std::to_string(T), name, fmt(isolated.median_ms * 1e3, 1),
                                        fmt(gbs, 0), fmt(100 * gbs / copy_gbs, 1), fmt(batched.median_ms * 1e3, 1),
                                        fmt(batched_gbs, 0), fmt(100 * batched_gbs / copy_gbs, 1)};
        if (launch != matmul_cublaslt) {  // cuBLASLt's plan cache is not made for capture: not graphed
          BenchTiming graphed = time_gpu_graph(run_on, copies);
          double graph_gbs = gb_per_s(bytes, graphed.median_ms);
          row.insert(row.end(), {fmt(graphed.median_ms * 1e3, 1), fmt(graph_gbs, 0), fmt(100 * graph_gbs / copy_gbs, 1)});
        } else {
          row.insert(row.end(), {"", "", ""});
        }
        row.push_back(check);
        gemv.add_row(row);
      }
      // Each of v6's instances (the default one is in the rows above), in a graph only.
      for (int config = 0; (T == 1 || T == 16 || T == 64) && matmul_v6_available() && config < matmul_v6_config_count();
           ++config) {
        if (T > matmul_v6_config_max_tokens(config)) continue;
        auto run_on = [&](int i, cudaStream_t stream) {
          matmul_v6_few_tokens_config(config, 0, bf16(y.data()), bf16(x.data()), bf16(weights[i].data()), bias, T,
                                      shape.C_in, shape.C_out, stream);
        };
        // The check is also the first launch outside the capture: it sets the kernel's attributes.
        const char* check = check_run(y, y_reference, T, shape.C_out, [&] { run_on(0, 0); });
        BenchTiming graphed = time_gpu_graph(run_on, copies);
        double graph_gbs = gb_per_s(bytes, graphed.median_ms);
        gemv.add_row({shape.name, std::to_string(T), std::string("v6: ") + matmul_v6_config_name(config), "", "", "",
                      "", "", "", fmt(graphed.median_ms * 1e3, 1), fmt(graph_gbs, 0),
                      fmt(100 * graph_gbs / copy_gbs, 1), check});
      }
    }
  }
  gemv.print();  // printed now: the tables below take longer
  if (gemv_only) return 0;

  BenchTable best("best own tensor-core kernel vs cuBLASLt",
                  {"shape", "T", "cuBLASLt (us)", "best own", "own (us)", "% of cuBLASLt"});
  BenchTable tiles("tile shapes at large T (the picked one marked *)",
                   {"shape", "T", "kernel", "tile", "time (us)", "TFLOP/s", "check"});
  BenchTable steady("back to back: 20 launches, no L2 flush between (how prefill runs them)",
                    {"shape", "T", "cuBLASLt (us)", "v5, picked tile (us)", "% of cuBLASLt", "cuBLASLt isolated (us)",
                     "v5 isolated (us)", "v5 check"});
  BenchTable bias_cost("what the bias costs: HasBias=true vs false instantiations",
                       {"shape", "T", "version", "no bias (us)", "bias (us)", "difference", "check (no bias / bias)"});

  for (const Shape& shape : kShapes) {
    Problem problem(shape);
    BenchTable gemm(std::string("matmul ") + shape.name + ": time, TFLOP/s, % of cuBLASLt (same inputs, same run)",
                    {"shape", "T", "version", "time (us)", "TFLOP/s", "% of cuBLASLt", "check"});
    for (int T : {1, 16, 128, 512, 2048}) {
      double flops = 2.0 * T * shape.C_in * shape.C_out;
      problem.run(matmul_cublaslt, bf16(problem.y_reference.data()), T);
      double cublas_ms = time_adaptive([&] { problem.run(matmul_cublaslt, bf16(problem.y.data()), T); }).median_ms;
      double best_ms = 1e30;
      const char* best_name = "";
      const char* v5_check = "not run";  // v5's check at this T, for the back-to-back table
      for (const Entry& entry : entries) {
        bool is_gemv = entry.launch == gemv_v1_warp_per_row;
        if (is_gemv && T > kGemvMaxTokens) continue;
        if (entry.launch == matmul_v6_few_tokens && T > kMatmulV6MaxTokens) continue;
        bool slow = (entry.launch == matmul_v1_naive || entry.launch == matmul_v2_smem_tiling) && flops > 2e10;
        if (slow) {
          gemm.add_row({shape.name, std::to_string(T), entry.name, "skipped: > 20 GFLOP, too slow", "", "", ""});
          continue;
        }
        problem.y.fill_bytes(0xFF);
        problem.run(entry.launch, bf16(problem.y.data()), T);
        CUDA_CHECK(cudaDeviceSynchronize());
        bool ok = problem.matches_reference(T);
        BenchTiming timing = time_adaptive([&] { problem.run(entry.launch, bf16(problem.y.data()), T); });
        double ms = timing.median_ms;
        if (entry.launch == matmul_v5_wgmma) v5_check = ok ? "ok" : "CHECK FAILED";
        if (entry.own_tensor_core && ok && ms < best_ms) {
          best_ms = ms;
          best_name = entry.name;
        }
        gemm.add_row({shape.name, std::to_string(T), entry.name, fmt(ms * 1e3, 1),
                      fmt(tflop_per_s(flops, ms), 1), fmt(100 * cublas_ms / ms, 1),
                      ok ? "ok" : "CHECK FAILED"});
      }
      best.add_row({shape.name, std::to_string(T), fmt(cublas_ms * 1e3, 1), best_name, fmt(best_ms * 1e3, 1),
                    fmt(100 * cublas_ms / best_ms, 1)});

      // The isolated times above start from a flushed L2 and an idle GPU; back to back,
      // a launch's fixed costs overlap the previous one's tail, as in the model's prefill.
      if ((T == 1 || T == 2048) && time_v5_tiles) {
        auto run_v5 = [&] { problem.run(matmul_v5_wgmma, bf16(problem.y.data()), T); };
        auto run_lt = [&] { problem.run(matmul_cublaslt, bf16(problem.y.data()), T); };
        const double v5_b2b = time_gpu_back_to_back([&](int) { run_v5(); }, 20).median_ms;
        const double lt_b2b = time_gpu_back_to_back([&](int) { run_lt(); }, 20).median_ms;
        const double v5_isolated = time_adaptive(run_v5).median_ms;
        steady.add_row({shape.name, std::to_string(T), fmt(lt_b2b * 1e3, 1), fmt(v5_b2b * 1e3, 1),
                        fmt(100 * lt_b2b / v5_b2b, 1), fmt(cublas_ms * 1e3, 1), fmt(v5_isolated * 1e3, 1), v5_check});
      }

      if (T >= 512) {  // which tile shape wins, and does the pick agree?
        for (int i = 0; i < matmul_v4_tile_count(); ++i) {
          auto run_tile = [&] {
            matmul_v4_tensor_cores_tile(i, bf16(problem.y.data()), bf16(problem.x.data()), bf16(problem.W.data()),
                                        problem.bias(), T, shape.C_in, shape.C_out, 0);
          };
          const char* check = check_run(problem.y, problem.y_reference, T, shape.C_out, run_tile);
          BenchTiming t = time_adaptive(run_tile);
          bool picked = i == matmul_v4_pick_tile(T, shape.C_out);
          tiles.add_row({shape.name, std::to_string(T), "v4", std::string(matmul_v4_tile_name(i)) + (picked ? " *" : ""),
                         fmt(t.median_ms * 1e3, 1), fmt(tflop_per_s(flops, t.median_ms), 1), check});
        }
        for (int i = 0; time_v5_tiles && i < matmul_v5_tile_count(); ++i) {
          auto run_tile = [&] {
            matmul_v5_wgmma_tile(i, bf16(problem.y.data()), bf16(problem.x.data()), bf16(problem.W.data()),
                                 problem.bias(), T, shape.C_in, shape.C_out, 0);
          };
          const char* check = check_run(problem.y, problem.y_reference, T, shape.C_out, run_tile);
          BenchTiming t = time_adaptive(run_tile);
          bool picked = i == matmul_v5_pick_tile(T, shape.C_out);
          tiles.add_row({shape.name, std::to_string(T), "v5", std::string(matmul_v5_tile_name(i)) + (picked ? " *" : ""),
                         fmt(t.median_ms * 1e3, 1), fmt(tflop_per_s(flops, t.median_ms), 1), check});
        }
      }

      if (shape.bias && (T == 1 || T == 2048) && shape.C_out >= 1536) {
        std::vector<Entry> compared;
        for (const Entry& entry : entries) {
          bool is_gemv = entry.launch == gemv_v1_warp_per_row;
          if (entry.launch == matmul_cublaslt || (T == 1 ? is_gemv : entry.own_tensor_core)) compared.push_back(entry);
        }
        // References with and without the bias (y_reference holds the former: the shape
        // has one), so that both instantiations are checked before they are timed.
        DeviceBuffer<uint16_t> reference_no_bias(size_t(T) * shape.C_out);
        matmul_cublaslt(bf16(reference_no_bias.data()), bf16(problem.x.data()), bf16(problem.W.data()), nullptr, T,
                        shape.C_in, shape.C_out);
        for (const Entry& entry : compared) {
          auto launch_with = [&](const __nv_bfloat16* b) {
            entry.launch(bf16(problem.y.data()), bf16(problem.x.data()), bf16(problem.W.data()), b, T, shape.C_in,
                         shape.C_out, 0);
          };
          std::string check = "reference";
          if (entry.launch != matmul_cublaslt) {
            check = std::string(check_run(problem.y, reference_no_bias, T, shape.C_out, [&] { launch_with(nullptr); })) +
                    " / " +
                    check_run(problem.y, problem.y_reference, T, shape.C_out,
                              [&] { launch_with(bf16(problem.b.data())); });
          }
          BenchTiming without = time_gpu([&] { launch_with(nullptr); });
          BenchTiming with = time_gpu([&] { launch_with(bf16(problem.b.data())); });
          bias_cost.add_row({shape.name, std::to_string(T), entry.name, fmt(without.median_ms * 1e3, 2),
                             fmt(with.median_ms * 1e3, 2),
                             fmt(100 * (with.median_ms - without.median_ms) / without.median_ms, 1) + " %", check});
        }
      }
    }
    gemm.print();  // one table per shape, printed as soon as it is done
  }

  best.print();
  tiles.print();
  steady.print();
  bias_cost.print();
  return 0;
}
