// The decode step's MLP two ways, in a CUDA graph chain as the step runs it, against the
// copy bandwidth of the same run:
//  * the pair: gate/up + SwiGLU, then down + residual (decode_gemv, the model's forms:
//    evict-first, the 300 ns pause, gate/up's input widened, down's input staged);
//  * fused: decode_mlp_fused, one kernel (decode_mlp_fused.cuh), in blocks of 4 or 8
//    warps, with 0, 1 or 2 values' weights a warp asked for before its PDL wait, on every
//    SM or on fewer (FusedMlpParams::blocks).
//
//   bench_fused_mlp
//
// Each chain is 24 MLPs back to back with PDL, on 3 copies of the weights (249 MB, more
// than the 60 MB L2), captured once and replayed; the median replay over 10. GB/s counts
// the weight bytes of one MLP (82.6 MB at Bielik's size).
#include <cstdio>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "decode_kernels.cuh"
#include "decode_mlp_fused.cuh"
#include "device_buffer.cuh"
#include "model_cuda.hpp"  // CudaModelOptions: the model's defaults

using namespace bielik;

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_fused_mlp: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("%s; copy bandwidth %.0f GB/s\n\n", describe_device().c_str(), copy_gbs);
  constexpr int C = 1536, F = 8960, kCopies = 3, kLaunches = 24;
  const double bytes = 3.0 * F * C * 2;
  struct Weights {
    DeviceBuffer<__nv_bfloat16> gate_up{size_t(2) * F * C}, down{size_t(C) * F}, b_gate_up{size_t(2) * F},
        b_down{size_t(C)};
  };
  std::vector<Weights> copies(kCopies);
  for (Weights& w : copies) {
    w.gate_up.fill_bytes(0x3c);  // small finite bf16 values; the time does not depend on them
    w.down.fill_bytes(0x3c);
    w.b_gate_up.fill_bytes(0);
    w.b_down.fill_bytes(0);
  }
  DeviceBuffer<__nv_bfloat16> x(C), norm(C), act(F);
  x.fill_bytes(0x3c);
  norm.fill_bytes(0x3f);
  DeviceBuffer<float> accumulator(C), spare(C);
  accumulator.fill_bytes(0);
  const CudaModelOptions defaults;

  BenchTable table("fused_mlp", {"MLP (in a graph chain)", "us", "GB/s", "% copy BW", "x the pair"});
  auto time_chain = [&](const std::function<void(int, cudaStream_t)>& mlp) {
    return time_gpu_graph(mlp, kLaunches).median_ms * 1e3;  // one MLP
  };
  // The pair, in the model's forms. Every launch adds into the same x and act: only the
  // time is measured, never the values.
  const double pair_us = time_chain([&](int i, cudaStream_t s) {
    const Weights& w = copies[i % kCopies];
    DecodeGemvParams gate_up{act.data(), x.data(), norm.data(), w.gate_up.data(), w.b_gate_up.data(), F, C, 1e-6f};
    gate_up.stream_evict_first = defaults.gemv_evict_first;
    gate_up.widen_input = defaults.gemv_widen_input;
    gate_up.epilogue_inputs_settled = true;
    gate_up.start_delay_ns = defaults.gate_up_start_delay_ns;
    decode_gemv(GemvInput::kRmsNorm, GemvOutput::kSwiGLU, gate_up, true, s);
    DecodeGemvParams down{x.data(), act.data(), nullptr, w.down.data(), w.b_down.data(), C, F, 1e-6f};
    down.stream_evict_first = defaults.gemv_evict_first;
    down.epilogue_inputs_settled = true;
    down.start_delay_ns = defaults.down_start_delay_ns;
    decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, down, true, s);
  });
  auto add_row = [&](const std::string& label, double us) {
    const double gbs = gb_per_s(bytes, us * 1e-3);
    table.add_row({label, fmt(us, 2), fmt(gbs, 0), fmt(100 * gbs / copy_gbs, 1), fmt(pair_us / us, 3)});
  };
  add_row("gate/up + down (decode_gemv, the model's forms)", pair_us);
  auto fused_us = [&](int block_warps, int before_wait, int blocks) {
    const bool reset = before_wait == 2;  // the model's form resets the previous layer's accumulator
    return time_chain([&](int i, cudaStream_t s) {
      const Weights& w = copies[i % kCopies];
      FusedMlpParams p;
      p.x = x.data();
      p.norm_weight = norm.data();
      p.w_gate_up = w.gate_up.data();
      p.b_gate_up = w.b_gate_up.data();
      p.w_down_t = w.down.data();  // the same bytes as W_down^T would be: only the time counts
      p.accumulator = accumulator.data();
      p.reset = reset ? spare.data() : nullptr;
      p.reset_value = reset ? w.b_down.data() : nullptr;
      p.C = C;
      p.F = F;
      p.eps = 1e-6f;
      p.stream_evict_first = defaults.gemv_evict_first;
      p.units_before_wait = before_wait;
      p.block_warps = block_warps;
      p.blocks = blocks;
      p.start_delay_ns = defaults.experiments.fused_mlp_start_delay_ns;  // the option's default pause
      decode_mlp_fused(p, true, s);
    });
  };
  for (int block_warps : {4, 8}) {
    for (int before_wait : {2, 1, 0}) {
      add_row("fused (decode_mlp_fused), blocks of " + std::to_string(block_warps) + " warps, " +
                  std::to_string(before_wait) + " values a warp before the wait" +
                  (before_wait == 2 ? ", resetting another accumulator" : ""),
              fused_us(block_warps, before_wait, 0));
    }
  }
  // Fewer blocks than SMs (FusedMlpParams::blocks): how few SMs still stream the MLP at
  // full speed, the rest left to the next kernel. 112 blocks of 8 warps: 10 values each.
  for (int blocks : {128, 120, 112, 100, 88, 66}) {
    add_row("fused, " + std::to_string(blocks) + " blocks of 8 warps, 2 values a warp before the wait",
            fused_us(8, 2, blocks));
  }
  table.print();
  return 0;
}
