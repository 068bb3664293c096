// The decode GEMVs of one Bielik layer, kernel by kernel and implementation by
// implementation (DecodeGemvKernel), against the copy bandwidth of the same run.
//
//   bench_decode_gemv
//   bench_decode_gemv --down-rounds N   (only down's forms, N alternating rounds)
//
// Each shape is timed three ways, median of several samples:
//  * alone: one launch with the L2 scrubbed first (what Nsight Compute would show);
//  * in a stream: 48 launches back to back with PDL, rotating over copies of the weights
//    that hold three times the L2 or more, launched one by one from the host;
//  * in a graph: the same 48 launches captured once in a CUDA graph and replayed, which
//    is how the decode step runs them (the host's launch rate drops out).
// GB/s counts the weight bytes (the input and output vectors are a few KB).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "decode_kernels.cuh"
#include "device_buffer.cuh"
#include "model_cuda.hpp"  // CudaModelOptions: the model's defaults
#include "weight_stream.cuh"

using namespace bielik;

namespace {

struct Shape {
  const char* name;
  GemvInput input;
  GemvOutput output;
  int N, K;
  bool bias;
};

const char* kernel_name(DecodeGemvKernel kernel) {
  switch (kernel) {
    case DecodeGemvKernel::kRegisterLoads: return "register loads";
    case DecodeGemvKernel::kRegisterPipelined: return "register pipelined";
    case DecodeGemvKernel::kBulkStream: return "bulk stream (TMA)";
    case DecodeGemvKernel::kTensorCores: return "tensor cores (mma.sync)";
    default: return "auto";
  }
}

// --down-rounds N: issue 3's down row, measured as a distribution instead of once. Down
// alone in the chain has sat at 82.5-85.2% of copy bandwidth over thirty-two single runs
// (median about 84%, chapter 03's GEMV_LOG.md), against a target of 85%, and its other
// forms were each measured in one or two runs. Here every form runs once a round, in the
// same order, for N rounds, each round with its own copy-bandwidth measurement, and with
// the chain rotating over 3 weight copies (82.5 MB, the main table's setting until the
// thirty-sixth session) and over 6 (165 MB, 2.6 times the H200's 60 MiB L2; the main table
// now takes 7 for down, three times the L2).
struct DownForm {
  const char* label;
  bool in_place;            // DecodeGemvParams::input_from_global
  int pause_ns;             // DecodeGemvParams::start_delay_ns
  bool second_batch_shared; // DecodeGemvParams::second_batch_in_shared
  bool second_after;        // DecodeGemvParams::second_batch_after_staging (in place: after the wait)
};

int run_down_rounds(int rounds, double first_copy_gbs) {
  const int N = 1536, K = 8960;
  const size_t weight_elements = size_t(N) * K;
  const double bytes = double(weight_elements) * 2;
  constexpr int kMaxCopies = 6, kLaunches = 48;
  std::vector<DeviceBuffer<__nv_bfloat16>> weights;
  for (int c = 0; c < kMaxCopies; ++c) {
    weights.emplace_back(weight_elements);
    weights.back().fill_bytes(0x3c);
  }
  DeviceBuffer<__nv_bfloat16> x(K), bias(N);
  x.fill_bytes(0x3c);
  bias.fill_bytes(0);
  DeviceBuffer<float> y{size_t(N)};
  const DownForm forms[] = {
      {"input in place, 1 ns pause (chapter 03's target row until the 36th session)", true, 1, false, false},
      {"input in place, 300 ns pause", true, 300, false, false},
      {"input in place, 1 ns pause, 2nd batch cp.async to shared after the wait", true, 1, true, true},
      {"staged, 300 ns pause (the model's form)", false, 300, false, false},
      {"staged, 0 ns pause, 2nd batch cp.async to shared after staging (the target row)", false, 0, true, true},
      {"staged, 300 ns pause, 2nd batch cp.async to shared after staging", false, 300, true, true},
      {"staged, 1000 ns pause, 2nd batch cp.async to shared after staging", false, 1000, true, true},
  };
  constexpr int kForms = sizeof(forms) / sizeof(forms[0]);
  const int copy_counts[] = {3, 6};
  // percent[form][copies index][round]
  std::vector<std::vector<std::vector<double>>> percent(kForms, std::vector<std::vector<double>>(2));
  std::vector<double> copy_bandwidths;
  for (int round = 0; round < rounds; ++round) {
    const double copy_gbs = round == 0 ? first_copy_gbs : measure_copy_bandwidth_gbs();
    copy_bandwidths.push_back(copy_gbs);
    for (int f = 0; f < kForms; ++f) {
      for (int ci = 0; ci < 2; ++ci) {
        const int copies = copy_counts[ci];
        auto params = [&](int copy) {
          DecodeGemvParams p{};
          p.y = y.data();
          p.x = x.data();
          p.W = weights[copy].data();
          p.bias = bias.data();
          p.N = N;
          p.K = K;
          p.eps = 1e-6f;
          p.stream_evict_first = true;
          p.epilogue_inputs_settled = true;  // as the main table: only the time is measured
          p.input_from_global = forms[f].in_place;
          p.start_delay_ns = forms[f].pause_ns;
          p.second_batch_in_shared = forms[f].second_batch_shared;
          p.second_batch_after_staging = forms[f].second_after;
          return p;
        };
        const BenchTiming graphed = time_gpu_graph(
            [&](int i, cudaStream_t s) {
              decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, params(i % copies), true, s,
                          DecodeGemvKernel::kRegisterLoads);
            },
            kLaunches);
        percent[f][ci].push_back(100 * gb_per_s(bytes, graphed.median_ms) / copy_gbs);
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  std::vector<std::string> columns{"down 8960->1536 +residual, in a graph chain", "weight copies"};
  for (int r = 0; r < rounds; ++r) columns.push_back("round " + std::to_string(r + 1) + " %");
  for (const char* c : {"median %", "min %", "max %", "rounds >= 85%"}) columns.push_back(c);
  BenchTable table("decode_gemv_down_rounds", columns);
  for (int f = 0; f < kForms; ++f) {
    for (int ci = 0; ci < 2; ++ci) {
      const std::vector<double>& v = percent[f][ci];
      std::vector<std::string> row{forms[f].label, std::to_string(copy_counts[ci])};
      for (double value : v) row.push_back(fmt(value, 1));
      row.push_back(fmt(median(v), 1));
      row.push_back(fmt(*std::min_element(v.begin(), v.end()), 1));
      row.push_back(fmt(*std::max_element(v.begin(), v.end()), 1));
      row.push_back(std::to_string(std::count_if(v.begin(), v.end(), [](double p) { return p >= 85.0; })) + " of " +
                    std::to_string(rounds));
      table.add_row(row);
    }
  }
  std::string bandwidths;
  for (double b : copy_bandwidths) bandwidths += (bandwidths.empty() ? "" : ", ") + fmt(b, 0);
  std::printf("copy bandwidth by round (GB/s): %s\n\n", bandwidths.c_str());
  table.print();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda_device_available()) {
    std::printf("bench_decode_gemv: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  int down_rounds = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--down-rounds") == 0 && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      down_rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_decode_gemv [--down-rounds N]   (N >= 1)\n");
      return 2;
    }
  }
  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("%s; copy bandwidth %.0f GB/s\n\n", describe_device().c_str(), copy_gbs);
  if (down_rounds > 0) return run_down_rounds(down_rounds, copy_gbs);
  const Shape shapes[] = {
      {"qkv 1536->2048 +norm", GemvInput::kRmsNorm, GemvOutput::kBf16, 2048, 1536, true},
      {"o 1536->1536 +residual", GemvInput::kPlain, GemvOutput::kResidualAdd, 1536, 1536, true},
      {"gate_up 1536->2x8960 +swiglu", GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 8960, 1536, true},
      {"down 8960->1536 +residual", GemvInput::kPlain, GemvOutput::kResidualAdd, 1536, 8960, true},
      {"lm_head 1536->32000 f32", GemvInput::kRmsNorm, GemvOutput::kF32, 32000, 1536, false},
  };
  std::vector<DecodeGemvKernel> kernels = {DecodeGemvKernel::kRegisterLoads, DecodeGemvKernel::kRegisterPipelined};
  if (weight_stream_supported()) kernels.push_back(DecodeGemvKernel::kBulkStream);

  BenchTable table("decode_gemv", {"shape", "kernel", "MB", "copies in the chain", "alone us", "alone % copy BW",
                                   "in stream us", "in stream % copy BW", "in a graph us", "in a graph GB/s",
                                   "in a graph % copy BW"});
  // The model's form of each GEMV in the graph chain, with its timeline (DecodeGemvParams::
  // timeline): where a launch's time goes when its code is hot, every launch before it
  // having been the same kernel. Chapter 08's DECODE_LOG.md compares it with the decode step,
  // where five kernels take turns on each SM.
  BenchTable phases("decode_gemv_phases",
                    {"shape (the model's form, down's input in place; in a graph chain)", "first wait returns -> input staged",
                     "-> its first weights in too", "-> its first row's dot summed", "-> its block ends",
                     "first wait returns -> last block ends", "launch (first start -> last end)"});
  constexpr int kLaunches = 48;
  int device = 0, l2_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  std::printf("L2 %.1f MB: the chains rotate over weight copies holding three times that\n\n", l2_bytes / 1e6);
  for (const Shape& shape : shapes) {
    const int rows = shape.output == GemvOutput::kSwiGLU ? 2 * shape.N : shape.N;
    const size_t weight_elements = size_t(rows) * shape.K;
    const double bytes = double(weight_elements) * 2;
    std::vector<DeviceBuffer<__nv_bfloat16>> weights;
    // The chain rotates over enough weight copies to hold three times the L2 (at least 3),
    // so that no copy can still be cached when its turn comes again: on the H200 (60 MiB
    // of L2) QKV's 6.3 MB take 30 of them. (Until the thirty-sixth session every shape had
    // 3; for QKV and O that was less than the L2.)
    const int weight_copies = std::max(3, int(std::ceil(3.0 * l2_bytes / bytes)));
    for (int c = 0; c < weight_copies; ++c) {
      weights.emplace_back(weight_elements);
      weights.back().fill_bytes(0x3c);  // small finite bf16 values; the time does not depend on them
    }
    DeviceBuffer<__nv_bfloat16> x(shape.K), norm(shape.K), bias(rows);
    x.fill_bytes(0x3c);
    norm.fill_bytes(0x3f);
    bias.fill_bytes(0);
    DeviceBuffer<float> y(size_t(shape.N));  // big enough for bf16 or f32 outputs
    // Down's form (its rows split over warps) is timed with its input read in place, its
    // fastest form in this chain (the model stages it, which is faster in the step); the
    // big GEMVs (gate/up, down) pause 300 ns at each block's start, as the model did when
    // these rows were written (since the forty-first session: gate/up 150 ns, down 500).
    const bool in_place = shape.output == GemvOutput::kResidualAdd && shape.K > 2048;
    const bool big = shape.output == GemvOutput::kSwiGLU || in_place;
    // x staged by one bulk copy (DecodeGemvParams::stage_input_bulk; set around the rows
    // that take it).
    bool bulk_staging = false;
    // The arguments of one launch on weight copy `copy`.
    auto gemv_params = [&](int copy, bool evict_first, int split, bool second_batch_in_shared,
                           bool input_from_global, int start_delay_ns, bool widen_input = false,
                           int max_blocks_per_sm = 0, int rows_per_warp = 0, bool shared_after_staging = false) {
      DecodeGemvParams p{};
      p.y = y.data();
      p.x = x.data();
      p.norm_weight = norm.data();
      p.W = weights[copy].data();
      p.bias = shape.bias ? bias.data() : nullptr;
      p.N = shape.N;
      p.K = shape.K;
      p.eps = 1e-6f;
      p.stream_evict_first = evict_first;
      // The model's form also loads the residual before the PDL wait. Here every launch
      // of the chain adds into the same y, so that read may see an older value: only
      // the time is measured, never the values.
      p.epilogue_inputs_settled = evict_first;
      p.split_warps = split;
      p.second_batch_in_shared = second_batch_in_shared;
      p.input_from_global = input_from_global;
      p.start_delay_ns = start_delay_ns;
      p.widen_input = widen_input;
      p.max_blocks_per_sm = max_blocks_per_sm;
      p.rows_per_warp = rows_per_warp;
      p.second_batch_after_staging = shared_after_staging;
      p.stage_input_bulk = bulk_staging;
      return p;
    };
    // One row: `label`, the chain timed from the host and as a graph, and alone when asked.
    auto add_row = [&](const std::string& label, DecodeGemvKernel kernel, bool evict_first, int split,
                       bool time_alone, bool second_batch_in_shared = false, bool input_from_global = false,
                       int start_delay_ns = 0, bool widen_input = false, int max_blocks_per_sm = 0,
                       int rows_per_warp = 0, bool shared_after_staging = false) {
      auto params = [&](int copy) {
        return gemv_params(copy, evict_first, split, second_batch_in_shared, input_from_global, start_delay_ns,
                           widen_input, max_blocks_per_sm, rows_per_warp, shared_after_staging);
      };
      std::string alone_us, alone_pct;
      if (time_alone) {
        const BenchTiming alone =
            time_gpu([&] { decode_gemv(shape.input, shape.output, params(0), false, 0, kernel); });
        alone_us = fmt(alone.median_ms * 1e3, 2);
        alone_pct = fmt(100 * gb_per_s(bytes, alone.median_ms) / copy_gbs, 1);
      }
      const BenchTiming streamed = time_gpu_back_to_back(
          [&](int i) { decode_gemv(shape.input, shape.output, params(i % weight_copies), true, 0, kernel); },
          kLaunches);
      const BenchTiming graphed = time_gpu_graph(
          [&](int i, cudaStream_t s) {
            decode_gemv(shape.input, shape.output, params(i % weight_copies), true, s, kernel);
          },
          kLaunches);
      const double stream_gbs = gb_per_s(bytes, streamed.median_ms), graph_gbs = gb_per_s(bytes, graphed.median_ms);
      table.add_row({shape.name, label, fmt(bytes / 1e6, 1), std::to_string(weight_copies), alone_us, alone_pct,
                     fmt(streamed.median_ms * 1e3, 2), fmt(100 * stream_gbs / copy_gbs, 1),
                     fmt(graphed.median_ms * 1e3, 2), fmt(graph_gbs, 0), fmt(100 * graph_gbs / copy_gbs, 1)});
    };
    // The tensor-core kernel where it runs (K <= decode_gemv_mma_max_k(): all but down),
    // plain and evict-first.
    if (shape.K <= decode_gemv_mma_max_k()) {
      add_row(kernel_name(DecodeGemvKernel::kTensorCores), DecodeGemvKernel::kTensorCores, false, 0, true);
      add_row("tensor cores (mma.sync), evict-first", DecodeGemvKernel::kTensorCores, true, 0, false);
      if (weight_stream_supported()) {
        bulk_staging = true;
        add_row("tensor cores (mma.sync), evict-first, x staged by a bulk copy", DecodeGemvKernel::kTensorCores, true,
                0, false);
        bulk_staging = false;
      }
    }
    for (DecodeGemvKernel kernel : kernels) {
      add_row(kernel_name(kernel), kernel, false, 0, true);
      if (kernel != DecodeGemvKernel::kRegisterLoads) continue;
      // The model's form: the weights read evict-first. Then the rows split over a forced
      // number of warps (decode_gemv picks 1 for K <= 2048, else 2 for Bielik's down).
      add_row("register loads, evict-first (the model's)", kernel, true, 0, false);
      if (weight_stream_supported()) {
        bulk_staging = true;
        add_row(std::string("register loads, evict-first") + (big ? ", 300 ns pause" : "") +
                    ", x staged by a bulk copy",
                kernel, true, 0, false, false, false, big ? 300 : 0);
        bulk_staging = false;
      }
      for (int split : {1, 2, 4, 8}) {
        add_row("register loads, evict-first, " + std::to_string(split) + " warps/row", kernel, true, split, false);
      }
      // Down's rows take two batches, gate/up's warps three row pairs: the second batch
      // copied into shared memory before the wait too (DecodeGemvParams::
      // second_batch_in_shared), alone and in the chain.
      if (big) {  // gate/up and down: the forms that take it
        add_row("register loads, evict-first, 2nd batch cp.async to shared", kernel, true, 0, true, true);
        // The same copy issued once the block has staged its input, past the wait
        // (DecodeGemvParams::second_batch_after_staging), with the model's 300 ns pause and
        // without a pause (down's fastest form in this chain: --down-rounds).
        for (int pause_ns : {300, 0}) {
          add_row("register loads, evict-first, " + std::to_string(pause_ns) +
                      " ns pause, 2nd batch cp.async to shared after staging",
                  kernel, true, 0, false, true, false, pause_ns, false, 0, 0, true);
        }
      }
      // O's and down's input read in place by each lane instead of staged by every block
      // (DecodeGemvParams::input_from_global).
      if (shape.output == GemvOutput::kResidualAdd) {
        add_row("register loads, evict-first, input read in place (not staged)", kernel, true, 0, true, false, true);
      }
      // Each block pausing before its first loads, as the model's gate/up and down do for
      // 300 ns (DecodeGemvParams::start_delay_ns; 4% faster in the model). 1 ns is the
      // barrier after the pause alone. Down with its input read in place (above).
      for (int pause_ns : {1, 300, 1000}) {
        if (pause_ns != 300 && !big) continue;
        add_row(std::string("register loads, evict-first") + (in_place ? ", input in place" : "") + ", " +
                    std::to_string(pause_ns) + " ns pause at each block's start",
                kernel, true, 0, pause_ns == 300, false, in_place, pause_ns);
      }
      // Down in that form (input in place, the 1 ns barrier) with its second batch copied
      // into shared memory too: before the PDL wait (the whole row in flight), or right
      // after it (before the first batch's x loads), so that it arrives while the first
      // batch is dotted instead of being asked for after that dot.
      if (in_place) {
        for (bool after_wait : {false, true}) {
          add_row(std::string("register loads, evict-first, input in place, 1 ns pause, 2nd batch cp.async to "
                              "shared ") +
                      (after_wait ? "after the wait" : "before the wait"),
                  kernel, true, 0, false, true, true, 1, false, 0, 0, after_wait);
        }
      }
      // The input staged widened to fp32 as well (DecodeGemvParams::widen_input; the
      // model's QKV, O, gate/up and lm_head; down's form ignores it).
      if (!in_place) {
        add_row(std::string("register loads, evict-first") + (big ? ", 300 ns pause" : "") + ", input widened",
                kernel, true, 0, true, false, false, big ? 300 : 0, true);
      }
      // The big GEMVs with fewer blocks resident an SM (DecodeGemvParams::
      // max_blocks_per_sm): each warp takes more rows, and the next launch's blocks find
      // room to start, and ask for their first weights, while this launch still runs.
      // Down in its fastest form in this chain (input in place, the 1 ns pause), its rows
      // still split over 2 warps (the automatic choice would fall to 1 with fewer warps).
      if (big) {
        for (int cap : {2, 1}) {
          add_row(std::string("register loads, evict-first") + (in_place ? ", input in place, 1 ns pause" : "") +
                      ", at most " + std::to_string(cap) + " blocks an SM" + (in_place ? ", 2 warps/row" : ""),
                  kernel, true, in_place ? 2 : 0, false, false, in_place, in_place ? 1 : 0, false, cap);
        }
      }
      // Gate/up and the lm_head in their model forms (input widened; gate/up pausing 300
      // ns, and not pausing) with fewer rows a warp than one wave needs
      // (DecodeGemvParams::rows_per_warp): a grid of several waves, whose later blocks
      // go to whichever SM slot frees first, including this launch's early finishers.
      const bool several_waves_form = shape.output == GemvOutput::kSwiGLU || shape.output == GemvOutput::kF32;
      if (several_waves_form) {
        const bool swiglu = shape.output == GemvOutput::kSwiGLU;
        const std::vector<int> row_counts = swiglu ? std::vector<int>{1, 2} : std::vector<int>{1, 2, 4, 6};
        for (int pause_ns : {300, 0}) {
          if (!swiglu && pause_ns != 0) continue;  // the lm_head does not pause
          for (int rows : row_counts) {
            add_row(std::string("register loads, evict-first, input widened") +
                        (swiglu ? ", " + std::to_string(pause_ns) + " ns pause" : "") + ", " + std::to_string(rows) +
                        (swiglu ? " row pairs" : " rows") + " a warp (several waves)",
                    kernel, true, 0, false, false, false, pause_ns, true, 0, rows);
          }
        }
      }
    }
    // The model's form (evict-first, the epilogue inputs before the wait, gate/up and
    // down pausing 300 ns, the input widened where the form takes it), but down's input
    // read in place as in the pause rows above. Then the tensor-core kernel, where it runs,
    // with the same settings (it ignores the widened input).
    for (DecodeGemvKernel phase_kernel : {DecodeGemvKernel::kRegisterLoads, DecodeGemvKernel::kTensorCores}) {
      if (phase_kernel == DecodeGemvKernel::kTensorCores && shape.K > decode_gemv_mma_max_k()) continue;
      constexpr int kValues = 2 * kGemvTimelineEvents;  // min / max pairs, GemvTimelineEvent order
      DeviceBuffer<unsigned long long> timeline(size_t(kValues) * kLaunches);
      cudaStream_t stream;
      CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kLaunches; ++i) {
        DecodeGemvParams p =
            gemv_params(i % weight_copies, true, 0, false, in_place, big ? 300 : 0,
                        CudaModelOptions{}.gemv_widen_input);
        p.timeline = timeline.data() + size_t(kValues) * i;
        decode_gemv(shape.input, shape.output, p, true, stream, phase_kernel);
      }
      CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec;
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      std::vector<unsigned long long> reset(timeline.size());
      for (size_t i = 0; i < reset.size(); ++i) reset[i] = i % 2 == 0 ? ~0ull : 0ull;
      std::vector<double> sums(6, 0.0);
      int samples = 0;
      for (int replay = 0; replay < 4; ++replay) {  // the first replay warms up
        CUDA_CHECK(cudaMemcpy(timeline.data(), reset.data(), timeline.bytes(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        if (replay == 0) continue;
        const std::vector<unsigned long long> t = timeline.to_host();
        for (int i = 8; i < kLaunches; ++i) {  // past the chain's start
          const unsigned long long* v = &t[size_t(kValues) * i];
          auto first = [&](int event) { return double(v[2 * event]); };
          auto last = [&](int event) { return double(v[2 * event + 1]); };
          sums[0] += first(kTimelineStaged) - first(kTimelineWaitReturned);
          sums[1] += first(kTimelineWeightsIn) - first(kTimelineStaged);
          sums[2] += first(kTimelineFirstDot) - first(kTimelineWeightsIn);
          sums[3] += first(kTimelineEnd) - first(kTimelineFirstDot);
          sums[4] += last(kTimelineEnd) - first(kTimelineWaitReturned);
          sums[5] += last(kTimelineEnd) - first(kTimelineStart);
          ++samples;
        }
      }
      std::vector<std::string> row{std::string(shape.name) +
                                   (phase_kernel == DecodeGemvKernel::kTensorCores ? ", tensor cores" : "")};
      for (double sum : sums) row.push_back(fmt(sum / samples * 1e-3, 2));
      phases.add_row(row);
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      CUDA_CHECK(cudaGraphDestroy(graph));
      CUDA_CHECK(cudaStreamDestroy(stream));
    }
  }
  table.print();
  phases.print();
  return 0;
}
