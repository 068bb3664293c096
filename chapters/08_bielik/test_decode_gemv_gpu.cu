// Chapter 08's decode GEMV (decode_kernels.cuh: decode_gemv) against CPU references: every
// fused form, on the register kernel and on the tensor cores, at Bielik's and odd sizes,
// with fresh random inputs and NaN-poisoned outputs, the first batch split around the PDL
// wait; the O partials added into gate/up's input and down's residual; the argmax folded
// into the lm_head against decode_argmax_cpu; and what it refuses. Its RoPE + cache append
// form is in test_decode_kernels_gpu.cu, its attention merge in
// test_decode_attention_o_gpu.cu. Part of test_ch08_model_cuda (the model's cases:
// test_model_cuda.cu).

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bf16.hpp"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_kernels.cuh"
#include "device_buffer.cuh"
#include "matmul_common.cuh"  // chapter 03: multiprocessor_count
#include "test_support.hpp"
#include "weight_stream.cuh"

using namespace bielik;

namespace {

// One decode_gemv case against a CPU reference (the same roundings as the kernel's
// contract, fp64 sums): fresh random x, W, bias, norm weight and residual from case_seed,
// outputs poisoned with NaN (or the residual, for kResidualAdd), then `launch` sets its
// options on the filled-in parameters and runs decode_gemv, and the output is compared.
struct GemvCase {
  GemvInput input;
  GemvOutput output;
  int N, K;
  bool bias;
};
// A decode_gemv launch over the tests' device buffers (bf16 bits): the output y, the
// sizes, and the bias where one is given.
DecodeGemvParams test_gemv_params(void* y, const DeviceBuffer<uint16_t>& x, const DeviceBuffer<uint16_t>& norm,
                                  const DeviceBuffer<uint16_t>& W, const DeviceBuffer<uint16_t>* bias, int N, int K) {
  auto bf16 = [](const DeviceBuffer<uint16_t>& b) { return reinterpret_cast<const __nv_bfloat16*>(b.data()); };
  DecodeGemvParams p{};
  p.y = y;
  p.x = bf16(x);
  p.norm_weight = bf16(norm);
  p.W = bf16(W);
  p.bias = bias ? bf16(*bias) : nullptr;
  p.N = N;
  p.K = K;
  p.eps = 1e-6f;
  return p;
}

// Fresh inputs and their reference, then `launches` launches of the GEMV on them, each
// into a freshly poisoned output (or the residual), each compared with the reference:
// launch(p, i) sets the options of launch i and runs it.
// norm_in_epilogue: DecodeGemvParams::norm_in_epilogue's reference: a norm weight of
// ones, and the normalized input not rounded to bf16 (the kernel scales its dot products
// instead of a rounded x; the f32 output's tolerance sees that rounding).
void check_gemv_case(const GemvCase& c, uint64_t& case_seed,
                     const std::function<void(DecodeGemvParams&, int)>& launch, int launches = 1,
                     bool norm_in_epilogue = false) {
  const int rows = c.output == GemvOutput::kSwiGLU ? 2 * c.N : c.N;
  const std::vector<uint16_t> x = random_bf16(c.K, ++case_seed, 2.0f);
  const std::vector<uint16_t> W = random_bf16(size_t(rows) * c.K, ++case_seed, 1.0f / std::sqrt(float(c.K)));
  const std::vector<uint16_t> bias = random_bf16(rows, ++case_seed, 0.5f);
  std::vector<uint16_t> norm = random_bf16(c.K, ++case_seed, 0.2f);
  for (auto& v : norm) v = float_to_bf16_bits(norm_in_epilogue ? 1.0f : 1.0f + bf16_bits_to_float(v));
  const std::vector<uint16_t> residual = random_bf16(c.N, ++case_seed, 1.0f);

  // Reference: the same roundings as the kernel's contract, fp64 sums.
  std::vector<double> input(c.K);
  double sum_squares = 0;
  for (int k = 0; k < c.K; ++k) sum_squares += double(bf16_bits_to_float(x[k])) * bf16_bits_to_float(x[k]);
  const double inverse_rms = 1.0 / std::sqrt(sum_squares / c.K + 1e-6);
  for (int k = 0; k < c.K; ++k) {
    const double normalized = bf16_bits_to_float(x[k]) * inverse_rms * bf16_bits_to_float(norm[k]);
    input[k] = c.input != GemvInput::kRmsNorm ? double(bf16_bits_to_float(x[k]))
               : norm_in_epilogue             ? normalized
                                              : double(round_to_bf16(float(normalized)));
  }
  auto dot = [&](int row) {
    double acc = 0;
    for (int k = 0; k < c.K; ++k) acc += double(bf16_bits_to_float(W[size_t(row) * c.K + k])) * input[k];
    return acc + (c.bias ? bf16_bits_to_float(bias[row]) : 0.0);
  };
  std::vector<float> expected(c.N);
  for (int n = 0; n < c.N; ++n) {
    if (c.output == GemvOutput::kSwiGLU) {
      const float g = round_to_bf16(float(dot(n))), u = round_to_bf16(float(dot(c.N + n)));
      expected[n] = g / (1.0f + std::exp(-g)) * u;
    } else if (c.output == GemvOutput::kResidualAdd) {
      expected[n] = bf16_bits_to_float(residual[n]) + round_to_bf16(float(dot(n)));
    } else {
      expected[n] = float(dot(n));
    }
  }

  DeviceBuffer<uint16_t> d_x(x), d_W(W), d_bias(bias), d_norm(norm);
  DeviceBuffer<uint16_t> d_y16(size_t(c.N));
  DeviceBuffer<float> d_y32(size_t(c.N));
  for (int i = 0; i < launches; ++i) {
    if (c.output == GemvOutput::kResidualAdd) {
      d_y16.copy_from_host(residual);
    } else {
      d_y16.fill_bytes(0xFF);
      d_y32.fill_bytes(0xFF);
    }
    void* y = c.output == GemvOutput::kF32 ? static_cast<void*>(d_y32.data()) : static_cast<void*>(d_y16.data());
    DecodeGemvParams p = test_gemv_params(y, d_x, d_norm, d_W, c.bias ? &d_bias : nullptr, c.N, c.K);
    launch(p, i);
    CUDA_CHECK(cudaDeviceSynchronize());
    CompareResult r = c.output == GemvOutput::kF32
                          ? compare("decode_gemv f32", d_y32.to_host(), expected, 1e-3)
                          : compare_bf16("decode_gemv bf16", d_y16.to_host(), expected, tolerance::kBf16Output);
    INFO("launch " << i << ": " << r.report);
    REQUIRE(r.passed);
  }
}

// A GEMV timeline (DecodeGemvParams::timeline) for the kernel tests. Giving one makes
// the launcher pick the kernels' kProbes instances; reset() puts the min slots at
// ULLONG_MAX and the max slots at 0, so that an event no block stamped is seen.
struct TestGemvTimeline {
  DeviceBuffer<unsigned long long> values{size_t(2 * kGemvTimelineEvents)};
  void reset() {
    std::vector<unsigned long long> fresh(values.size(), 0);
    for (size_t e = 0; e < fresh.size(); e += 2) fresh[e] = ULLONG_MAX;
    values.copy_from_host(fresh);
  }
  bool stamped(GemvTimelineEvent event) const {
    const std::vector<unsigned long long> t = values.to_host();
    return t[2 * event] != ULLONG_MAX && t[2 * event + 1] >= t[2 * event];
  }
};

}  // namespace

TEST_CASE("decode_gemv: every fused form matches a CPU reference", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const GemvCase cases[] = {
      {GemvInput::kRmsNorm, GemvOutput::kBf16, 2048, 1536, true},       // Bielik QKV
      {GemvInput::kPlain, GemvOutput::kResidualAdd, 1536, 1536, true},  // O
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 8960, 1536, true},     // gate/up
      {GemvInput::kPlain, GemvOutput::kResidualAdd, 1536, 8960, true},  // down
      {GemvInput::kRmsNorm, GemvOutput::kF32, 32000, 1536, false},      // lm_head
      {GemvInput::kPlain, GemvOutput::kF32, 1003, 200, false},          // odd sizes
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 43, 344, false},
      {GemvInput::kPlain, GemvOutput::kBf16, 7, 8, true},
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 129, 2056, true},  // two stages a row, the last shorter
      {GemvInput::kPlain, GemvOutput::kResidualAdd, 300, 8968, false},
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 4001, 1000, true},  // 2 row pairs a warp, the last block short
  };
  std::vector<DecodeGemvKernel> kernels = {DecodeGemvKernel::kRegisterLoads, DecodeGemvKernel::kRegisterPipelined};
  if (weight_stream_supported()) kernels.push_back(DecodeGemvKernel::kBulkStream);
  uint64_t case_seed = seed;
  for (const GemvCase& c : cases) {
    // Each kernel without and with PDL; then the register kernel with the second batch in
    // shared memory (down's and gate/up's forms take it, the others ignore it), and with
    // the input read in place (down's form takes it), each with PDL and the automatic
    // split, and without PDL and a split of 1 (down: more chunks per lane than two
    // batches hold).
    // Then the register kernel without and with PDL again, with the input widened
    // (QKV's, gate/up's, O's and the lm_head's forms take it, the others ignore it).
    // Then rows a warp forced (DecodeGemvParams::rows_per_warp): 1 and 5 on the register
    // kernel (with PDL, without), 2 on the pipelined one (with PDL): grids of several
    // waves at Bielik's big shapes, fewer blocks than one wave at the small ones. Then
    // the second batch copied into shared memory after the staging instead of before the
    // wait (with PDL, without). Last (sm_90+), the input staged by one bulk copy
    // (stage_input_bulk): with PDL and widened, without PDL and not. Then the input read
    // in place with the second batch in shared memory (down's form takes both): copied
    // before the wait (with PDL, without), and after it (with PDL, without).
    const int plain_variants = 2 * int(kernels.size());
    // The last variants, index - (plain_variants + 6): (rows a warp forced, PDL, kernel,
    // the second batch copied to shared memory after staging (or after the wait), the
    // input staged by a bulk copy, the input read in place with the second batch copied).
    struct LateVariant {
      int rows;
      bool pdl;
      DecodeGemvKernel kernel;
      bool shared_after_staging;
      bool bulk_staging;
      bool in_place_shared;
    };
    const LateVariant late_variants[] = {{1, true, DecodeGemvKernel::kRegisterLoads, false, false, false},
                                         {5, false, DecodeGemvKernel::kRegisterLoads, false, false, false},
                                         {2, true, DecodeGemvKernel::kRegisterPipelined, false, false, false},
                                         {0, true, DecodeGemvKernel::kRegisterLoads, true, false, false},
                                         {0, false, DecodeGemvKernel::kRegisterLoads, true, false, false},
                                         {0, true, DecodeGemvKernel::kRegisterLoads, false, true, false},
                                         {0, false, DecodeGemvKernel::kRegisterLoads, false, true, false},
                                         {0, true, DecodeGemvKernel::kRegisterLoads, false, false, true},
                                         {0, false, DecodeGemvKernel::kRegisterLoads, false, false, true},
                                         {0, true, DecodeGemvKernel::kRegisterLoads, true, false, true},
                                         {0, false, DecodeGemvKernel::kRegisterLoads, true, false, true}};
    const int late_count = int(sizeof(late_variants) / sizeof(late_variants[0]));
    // Every variant is launched twice on the same inputs: as it is (the lean instances,
    // unless the variant stages by a bulk copy, which takes the kProbes ones too), then
    // with a timeline (the kProbes ones).
    for (int index = 0; index < plain_variants + 6 + late_count; ++index) {
      const bool late = index >= plain_variants + 6;
      const LateVariant late_variant = late ? late_variants[index - plain_variants - 6] : LateVariant{};
      if (late_variant.bulk_staging && !weight_stream_supported()) continue;
      const int forced_rows = late_variant.rows;
      const bool shared_after_staging = late_variant.shared_after_staging;
      const bool bulk_staging = late_variant.bulk_staging;
      const bool widen_input = (!late && index >= plain_variants + 4) || (bulk_staging && late_variant.pdl);
      const int variant = widen_input ? index - plain_variants - 4 : index;  // widened: as variants 0 and 1
      const bool second_batch_in_shared = shared_after_staging || late_variant.in_place_shared ||
                                          (!late && (variant == plain_variants || variant == plain_variants + 1));
      const bool input_from_global = late_variant.in_place_shared || (!late && variant >= plain_variants + 2);
      const bool register_option = second_batch_in_shared || input_from_global;
      bool pdl = register_option ? (variant - plain_variants) % 2 == 0 : variant % 2 == 1;
      DecodeGemvKernel kernel = register_option ? DecodeGemvKernel::kRegisterLoads : DecodeGemvKernel::kAuto;
      if (late) {
        pdl = late_variant.pdl;
        kernel = late_variant.kernel;
      } else if (!register_option) {
        kernel = kernels[variant / 2];
      }
      INFO("N=" << c.N << " K=" << c.K << " output " << int(c.output) << " pdl " << pdl << " kernel "
                << (kernel == DecodeGemvKernel::kBulkStream       ? "bulk stream"
                    : kernel == DecodeGemvKernel::kRegisterLoads ? "register loads"
                                                                 : "register pipelined")
                << " second batch in shared " << second_batch_in_shared << " input read in place "
                << input_from_global << " input widened " << widen_input << " rows a warp forced to " << forced_rows
                << " second batch after staging " << shared_after_staging << " bulk staging " << bulk_staging);
      TestGemvTimeline timeline;
      timeline.reset();
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int launch) {
        // The evict-first hint (a cache hint: it must not change a value) on half the
        // variants; the bulk-stream kernel ignores it. On the same half, the residual is
        // loaded before the PDL wait (the copy that wrote it is long done).
        p.stream_evict_first = pdl;
        p.epilogue_inputs_settled = pdl;
        p.norm_weight_first = !pdl;  // the norm weight asked for before or after the weights
        // With PDL the register kernels split each row over a forced number of warps (the
        // automatic choice, 1 or 2 for these shapes, runs without PDL): 8 where K is not a
        // multiple of 64 (lanes past the row's end), else 4.
        if (kernel != DecodeGemvKernel::kBulkStream && pdl && !late) p.split_warps = c.K % 64 != 0 ? 8 : 4;
        p.widen_input = widen_input;
        p.rows_per_warp = forced_rows;
        p.stage_input_bulk = bulk_staging;
        if (register_option) {
          p.second_batch_in_shared = second_batch_in_shared;
          p.second_batch_after_staging = shared_after_staging;
          p.input_from_global = input_from_global;
          p.split_warps = pdl ? 0 : 1;
        }
        if (launch == 1) p.timeline = timeline.values.data();
        decode_gemv(c.input, c.output, p, pdl, 0, kernel);
      }, 2);
      // The timed launch stamped: every kernel its wait, the register kernels (whose
      // hooks are compiled out unless asked for) their start and end too.
      REQUIRE(timeline.stamped(kTimelineWaitReturned));
      if (kernel == DecodeGemvKernel::kRegisterLoads) {
        REQUIRE(timeline.stamped(kTimelineStart));
        REQUIRE(timeline.stamped(kTimelineEnd));
      }
    }
  }
  // norm_in_epilogue on the register kernel (the model's fold_gate_up_norm): x staged as
  // it is, each warp's own inverse RMS applied to its dots, against the reference with a
  // norm weight of ones and x not rounded to bf16 after the norm (check_gemv_case).
  // Gate/up's and QKV's rows, odd ones, rows split over warps (each warp then sums all of
  // x in a pass of its own; the others inside their first row's dots); without and with
  // PDL, x widened or not, gate/up's second batch in shared memory, a timeline (the
  // kProbes instances), and (sm_90+) the bulk copy staging x.
  const GemvCase epilogue_norm_cases[] = {
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 8960, 1536, true},  // Bielik's gate/up
      {GemvInput::kRmsNorm, GemvOutput::kBf16, 2048, 1536, true},    // QKV's rows
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 43, 344, false},
      {GemvInput::kRmsNorm, GemvOutput::kF32, 1003, 200, false},     // K not a multiple of 256
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 129, 2056, true},   // rows split over warps
  };
  for (const GemvCase& c : epilogue_norm_cases) {
    for (int variant = 0; variant < 6; ++variant) {
      const bool pdl = variant % 2 == 1, widen = variant == 2 || variant == 5, shared_batch = variant == 3;
      const bool bulk = variant == 4 || variant == 5;
      if (bulk && !weight_stream_supported()) continue;
      INFO("norm in the epilogue: N=" << c.N << " K=" << c.K << " pdl " << pdl << " widened " << widen
                                      << " second batch in shared " << shared_batch << " bulk staging " << bulk);
      TestGemvTimeline timeline;
      timeline.reset();
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int launch) {
        p.norm_in_epilogue = true;
        p.norm_weight_first = pdl;  // ignored: no norm weight is read
        p.widen_input = widen;
        p.second_batch_in_shared = shared_batch;
        p.stage_input_bulk = bulk;
        if (pdl && c.K > 2048) p.split_warps = 4;
        if (launch == 1) p.timeline = timeline.values.data();
        decode_gemv(c.input, c.output, p, pdl, 0, DecodeGemvKernel::kRegisterLoads);
      }, 2, true);
      REQUIRE(timeline.stamped(kTimelineEnd));
    }
  }
  // The first batch split around the wait (loads_before_wait: the split instances, lean
  // then probed): 1, 3 and 5 loads a row before it, with and without PDL, the input
  // widened on one, the rest after the staging, right after the wait or once the first
  // loads are in (split_rest); every shape above, and gate/up's production form (its
  // norm in the epilogue, x widened) at Bielik's size and an odd one.
  const SplitBatchRest rests[] = {SplitBatchRest::kAfterStaging, SplitBatchRest::kAfterWait,
                                  SplitBatchRest::kWhenFirstArrived};
  for (const GemvCase& c : cases) {
    for (int variant = 0; variant < 9; ++variant) {
      const int before = (variant % 3) * 2 + 1;  // 1, 3, 5
      const bool pdl = before != 3, widen = before == 5;
      const SplitBatchRest rest = rests[variant / 3];
      INFO("loads before the wait " << before << ": N=" << c.N << " K=" << c.K << " output " << int(c.output)
                                    << " pdl " << pdl << " widened " << widen << " rest " << int(rest));
      TestGemvTimeline timeline;
      timeline.reset();
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int launch) {
        p.loads_before_wait = before;
        p.split_rest = rest;
        p.widen_input = widen;
        p.stream_evict_first = pdl;
        if (launch == 1) p.timeline = timeline.values.data();
        decode_gemv(c.input, c.output, p, pdl, 0, DecodeGemvKernel::kRegisterLoads);
      }, 2);
      REQUIRE(timeline.stamped(kTimelineEnd));
    }
  }
  for (const GemvCase& c : {epilogue_norm_cases[0], epilogue_norm_cases[2]}) {
    for (SplitBatchRest rest : rests) {
      INFO("loads before the wait 3, norm in the epilogue: N=" << c.N << " K=" << c.K << " rest " << int(rest));
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int) {
        p.loads_before_wait = 3;
        p.split_rest = rest;
        p.norm_in_epilogue = true;
        p.widen_input = true;
        decode_gemv(c.input, c.output, p, true, 0, DecodeGemvKernel::kRegisterLoads);
      }, 2, true);
    }
  }
  // Only the first blocks split (split_blocks), gate/up's production form at Bielik's
  // size: 1 block, 5 (every later block unsplit) and more blocks than the grid has, at
  // each moment, lean then probed.
  for (const int split_blocks : {1, 5, 100000}) {
    for (SplitBatchRest rest : rests) {
      const GemvCase& c = epilogue_norm_cases[0];
      INFO("loads before the wait 3 in blocks below " << split_blocks << ": N=" << c.N << " K=" << c.K << " rest "
                                                       << int(rest));
      TestGemvTimeline timeline;
      timeline.reset();
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int launch) {
        p.loads_before_wait = 3;
        p.split_rest = rest;
        p.split_blocks = split_blocks;
        p.norm_in_epilogue = true;
        p.widen_input = true;
        if (launch == 1) p.timeline = timeline.values.data();
        decode_gemv(c.input, c.output, p, true, 0, DecodeGemvKernel::kRegisterLoads);
      }, 2, true);
      REQUIRE(timeline.stamped(kTimelineEnd));
    }
  }
}

TEST_CASE("decode_gemv on the tensor cores: every form it takes matches a CPU reference", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const GemvCase cases[] = {
      {GemvInput::kRmsNorm, GemvOutput::kBf16, 2048, 1536, true},       // Bielik QKV's rows
      {GemvInput::kPlain, GemvOutput::kResidualAdd, 1536, 1536, true},  // O
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 8960, 1536, true},     // gate/up
      {GemvInput::kRmsNorm, GemvOutput::kF32, 32000, 1536, false},      // lm_head
      {GemvInput::kPlain, GemvOutput::kF32, 1003, 200, false},   // a last tile of 11 rows; K not a multiple of 32
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 43, 344, false},
      {GemvInput::kPlain, GemvOutput::kBf16, 7, 8, true},        // one tile, one step of one warp, mostly padding
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 129, 2048, true},      // the largest K: 8 steps a warp
      {GemvInput::kPlain, GemvOutput::kResidualAdd, 300, 2040, false},  // the last warp's last step short
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 4001, 1000, true},
      // Streamed (K > 2048: batches of 9 steps, two in flight)
      {GemvInput::kPlain, GemvOutput::kResidualAdd, 1536, 8960, true},  // Bielik's down
      {GemvInput::kPlain, GemvOutput::kBf16, 37, 2056, false},          // one step past the whole-row form
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 203, 9216, true},      // the largest K: every batch full
      {GemvInput::kPlain, GemvOutput::kF32, 50, 5000, true},            // later batches partly or wholly past K
  };
  uint64_t case_seed = seed;
  for (const GemvCase& c : cases) {
    // PDL or not; x staged by the threads or (sm_90+) one bulk copy; (K <= 1536) the
    // instance for three blocks an SM or the whole-row one. The threads' staging is
    // launched twice on the same inputs: as it is (the lean instances), then with a
    // timeline (the kProbes ones, which bulk staging takes too).
    for (int variant = 0; variant < 6; ++variant) {
      const bool pdl = variant % 2 == 1, bulk = variant == 2 || variant == 3, three_per_sm = variant >= 4;
      if (bulk && !weight_stream_supported()) continue;
      if (three_per_sm && c.K > 1536) continue;  // ignored there: the same launch as variants 0 and 1
      INFO("N=" << c.N << " K=" << c.K << " output " << int(c.output) << " pdl " << pdl << " bulk staging " << bulk
                << " three blocks an SM " << three_per_sm);
      TestGemvTimeline timeline;
      timeline.reset();
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int launch) {
        p.stream_evict_first = pdl;  // a cache hint, and the residual loaded before the wait
        p.epilogue_inputs_settled = pdl;
        p.norm_weight_first = !pdl;  // the norm weight asked for before or after the weights
        p.stage_input_bulk = bulk;
        p.mma_three_blocks_per_sm = three_per_sm;

        if (launch == 1) p.timeline = timeline.values.data();
        decode_gemv(c.input, c.output, p, pdl, 0, DecodeGemvKernel::kTensorCores);
      }, bulk ? 1 : 2);
      if (!bulk) {
        REQUIRE(timeline.stamped(kTimelineStart));
        REQUIRE(timeline.stamped(kTimelineWaitReturned));
        REQUIRE(timeline.stamped(kTimelineEnd));
      }
    }
  }
  // norm_in_epilogue (the model's fold_qkv_norm): x as it is, the inverse RMS applied to
  // the dots, no norm weight; with a norm weight of ones that is the normalized GEMV up to
  // x's rounding to bf16 after the norm, which the reference keeps (inside the bf16
  // tolerance). QKV's rows and odd ones, both instances, x staged by the threads or
  // (sm_90+) the bulk copy, with and without PDL.
  const GemvCase epilogue_norm_cases[] = {
      {GemvInput::kRmsNorm, GemvOutput::kBf16, 2048, 1536, true},
      {GemvInput::kRmsNorm, GemvOutput::kBf16, 43, 344, false},
      {GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 203, 9216, true},
  };
  for (const GemvCase& c : epilogue_norm_cases) {
    for (int variant = 0; variant < 6; ++variant) {
      const bool pdl = variant % 2 == 1, three_per_sm = variant == 2 || variant == 3, bulk = variant >= 4;
      if (three_per_sm && c.K > 1536) continue;
      if (bulk && !weight_stream_supported()) continue;
      INFO("norm in the epilogue: N=" << c.N << " K=" << c.K << " pdl " << pdl << " three blocks an SM "
                                      << three_per_sm << " bulk staging " << bulk);
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int) {
        p.norm_in_epilogue = true;
        p.norm_weight_first = pdl;  // ignored: no norm weight is read
        p.mma_three_blocks_per_sm = three_per_sm;
        p.stage_input_bulk = bulk;
        decode_gemv(c.input, c.output, p, pdl, 0, DecodeGemvKernel::kTensorCores);
      }, 1, true);
    }
  }
  // The first batch split around the wait (loads_before_wait: the split instances, lean
  // then probed; the model's o_loads_before_wait): 1, 3 and 5 steps a warp before it,
  // the rest after the staging, right after the wait or once the first steps are in;
  // with and without PDL; both whole-row instances; O's shape, QKV's rows with the norm
  // in the epilogue, and odd ones. K = 344 gives a warp at most 2 steps (11 dealt round
  // 8 warps), so only 1 splits there, 3 and 5 take the default instance; K = 2040: 8
  // steps a warp, the last warp's last one short.
  struct SplitCase {
    GemvCase c;
    bool norm_in_epilogue;
  };
  const SplitCase split_cases[] = {
      {{GemvInput::kPlain, GemvOutput::kResidualAdd, 1536, 1536, true}, false},  // O
      {{GemvInput::kRmsNorm, GemvOutput::kBf16, 2048, 1536, true}, true},        // QKV's rows, its folded norm
      {{GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 43, 344, false}, false},
      {{GemvInput::kPlain, GemvOutput::kResidualAdd, 300, 2040, false}, false},
  };
  const SplitBatchRest rests[] = {SplitBatchRest::kAfterStaging, SplitBatchRest::kAfterWait,
                                  SplitBatchRest::kWhenFirstArrived};
  for (const SplitCase& split_case : split_cases) {
    const GemvCase& c = split_case.c;
    for (int variant = 0; variant < 9; ++variant) {
      const int before = (variant % 3) * 2 + 1;  // 1, 3, 5
      const bool pdl = before != 3, three_per_sm = variant % 2 == 1 && c.K <= 1536;
      const SplitBatchRest rest = rests[variant / 3];
      INFO("steps before the wait " << before << ": N=" << c.N << " K=" << c.K << " output " << int(c.output)
                                    << " pdl " << pdl << " three blocks an SM " << three_per_sm << " rest "
                                    << int(rest) << " norm in the epilogue " << split_case.norm_in_epilogue);
      TestGemvTimeline timeline;
      timeline.reset();
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int launch) {
        p.loads_before_wait = before;
        p.split_rest = rest;
        p.stream_evict_first = pdl;
        p.epilogue_inputs_settled = pdl;
        p.mma_three_blocks_per_sm = three_per_sm;
        p.norm_in_epilogue = split_case.norm_in_epilogue;
        if (launch == 1) p.timeline = timeline.values.data();
        decode_gemv(c.input, c.output, p, pdl, 0, DecodeGemvKernel::kTensorCores);
      }, 2, split_case.norm_in_epilogue);
      REQUIRE(timeline.stamped(kTimelineEnd));
    }
  }
  // Only the first blocks split (split_blocks): 1 and 40 of O's 96, once the first steps
  // are in and after the staging.
  for (const int split_blocks : {1, 40}) {
    for (SplitBatchRest rest : {SplitBatchRest::kWhenFirstArrived, SplitBatchRest::kAfterStaging}) {
      const GemvCase& c = split_cases[0].c;
      INFO("steps before the wait 3 in blocks below " << split_blocks << ": N=" << c.N << " K=" << c.K << " rest "
                                                       << int(rest));
      check_gemv_case(c, case_seed, [&](DecodeGemvParams& p, int) {
        p.loads_before_wait = 3;
        p.split_rest = rest;
        p.split_blocks = split_blocks;
        decode_gemv(c.input, c.output, p, true, 0, DecodeGemvKernel::kTensorCores);
      }, 2);
    }
  }
  // What it does not take: K past its batches, an input it does not stage, a split of a
  // streamed row (K > 2048).
  DeviceBuffer<uint16_t> x(4096), W(64 * 4096), y(64);
  DecodeGemvParams p{};
  p.y = y.data();
  p.x = reinterpret_cast<const __nv_bfloat16*>(x.data());
  p.W = reinterpret_cast<const __nv_bfloat16*>(W.data());
  p.N = 64;
  p.K = decode_gemv_mma_max_k() + 8;
  REQUIRE_THROWS_AS(decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false, 0, DecodeGemvKernel::kTensorCores),
                    std::invalid_argument);
  p.K = 4096;
  p.loads_before_wait = 3;
  REQUIRE(contains(error_of<std::invalid_argument>([&] {
                     decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false, 0, DecodeGemvKernel::kTensorCores);
                   }),
                   "loads_before_wait"));
  p.loads_before_wait = 0;
  // Residual partials (the fused MLP's accumulator) only where it reads them: O's
  // residual add and QKV's input (the model's fused-MLP test runs both); not an input
  // that adds them into an output it has no such form for (gate/up's SwiGLU).
  p.K = 64;
  p.norm_weight = reinterpret_cast<const __nv_bfloat16*>(x.data());
  p.residual_partials = ResidualPartials{reinterpret_cast<const float*>(W.data()), 1};
  REQUIRE_THROWS_AS(
      decode_gemv(GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU, p, false, 0, DecodeGemvKernel::kTensorCores),
      std::invalid_argument);
  REQUIRE_THROWS_AS(decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false, 0, DecodeGemvKernel::kTensorCores),
                    std::invalid_argument);
}

TEST_CASE("decode_gemv refuses a split or a row count it cannot run", "[ch08][gpu][kernels]") {
  DeviceBuffer<uint16_t> x(64), W(64 * 64), y(64);
  DecodeGemvParams p{};
  p.y = y.data();
  p.x = reinterpret_cast<const __nv_bfloat16*>(x.data());
  p.W = reinterpret_cast<const __nv_bfloat16*>(W.data());
  p.N = 64;
  p.K = 64;
  for (int split : {-1, 3, 16}) {
    p.split_warps = split;
    REQUIRE_THROWS_AS(decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false), std::invalid_argument);
  }
  p.split_warps = 0;
  p.rows_per_warp = -1;
  REQUIRE_THROWS_AS(decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false), std::invalid_argument);
  p.rows_per_warp = 0;
  p.loads_before_wait = -1;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false); }),
                   "loads_before_wait"));
  p.loads_before_wait = 2;
  p.input_from_global = true;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false); }),
                   "loads_before_wait"));
  p.input_from_global = false;
  p.split_blocks = -1;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false); }),
                   "split_blocks"));
  p.split_blocks = 0;
  p.loads_before_wait = 0;
  p.split_rest = SplitBatchRest::kAfterWait;  // when the rest of no split goes out
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_gemv(GemvInput::kPlain, GemvOutput::kBf16, p, false); }),
                   "split_rest"));
}

TEST_CASE("decode_gemv with the O partials: gate/up adds them into its input, down into its residual",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Case {
    int N, K, count;
    bool bias;
  };
  const Case cases[] = {
      {8960, 1536, 2, true},  // Bielik's gate/up, 2 kv groups
      {1536, 576, 3, false},  // SmolLM2's, 3 kv groups
      {43, 344, 3, true},     // odd sizes
      {129, 2056, 1, false},  // K > 2048: two batches a row, the last shorter
  };
  uint64_t case_seed = seed;
  for (const Case& c : cases) {
    INFO("N=" << c.N << " K=" << c.K << " partials " << c.count << " bias " << c.bias);
    const std::vector<uint16_t> x = random_bf16(c.K, ++case_seed, 2.0f);
    std::vector<float> partials(size_t(c.count) * c.K);
    {
      std::mt19937_64 engine(++case_seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& value : partials) value = normal(engine);
    }
    // Gate/up reads 2N rows of W and the bias; the down form below reads K of them.
    const int rows = std::max(2 * c.N, c.K);
    const std::vector<uint16_t> W = random_bf16(size_t(rows) * c.K, ++case_seed, 1.0f / std::sqrt(float(c.K)));
    const std::vector<uint16_t> bias = random_bf16(rows, ++case_seed, 0.5f);
    std::vector<uint16_t> norm = random_bf16(c.K, ++case_seed, 0.2f);
    for (auto& value : norm) value = float_to_bf16_bits(1.0f + bf16_bits_to_float(value));

    // h = bf16(x + bf16(partial 0 + partial 1 + ...)), summed in fp32 in that order: the
    // residual the unfused O GEMV's kResidualAdd stores.
    std::vector<float> h(c.K);
    for (int i = 0; i < c.K; ++i) {
      float o = 0.0f;
      for (int g = 0; g < c.count; ++g) o += partials[size_t(g) * c.K + i];
      h[i] = round_to_bf16(bf16_bits_to_float(x[i]) + round_to_bf16(o));
    }
    double sum_squares = 0;
    for (float value : h) sum_squares += double(value) * value;
    const double inverse_rms = 1.0 / std::sqrt(sum_squares / c.K + 1e-6);
    std::vector<float> input(c.K);
    for (int i = 0; i < c.K; ++i) input[i] = round_to_bf16(float(h[i] * inverse_rms * bf16_bits_to_float(norm[i])));
    auto dot = [&](int row) {
      double acc = c.bias ? bf16_bits_to_float(bias[row]) : 0.0;
      for (int i = 0; i < c.K; ++i) acc += double(bf16_bits_to_float(W[size_t(row) * c.K + i])) * input[i];
      return acc;
    };
    std::vector<float> expected(c.N);
    for (int n = 0; n < c.N; ++n) {
      const float gate = round_to_bf16(float(dot(n))), up = round_to_bf16(float(dot(c.N + n)));
      expected[n] = gate / (1.0f + std::exp(-gate)) * up;
    }
    // The down form: the K rows of W (as a (K, K) projection of the normalized input,
    // which is only test data here) added into the residual h that x + partials make:
    // y[n] = bf16(h[n] + bf16(W[n] . input + b[n])), with y holding x on entry.
    std::vector<float> expected_down(c.K);
    for (int n = 0; n < c.K; ++n) {
      double acc = c.bias ? bf16_bits_to_float(bias[n]) : 0.0;
      for (int i = 0; i < c.K; ++i) acc += double(bf16_bits_to_float(W[size_t(n) * c.K + i])) * input[i];
      expected_down[n] = h[n] + round_to_bf16(float(acc));
    }
    std::vector<uint16_t> input_bits(c.K);
    for (int i = 0; i < c.K; ++i) input_bits[i] = float_to_bf16_bits(input[i]);
    // norm_in_epilogue (the model's fold_gate_up_norm, the register kernel): the norm
    // weight ones, and h * inverse_rms not rounded to bf16 (the kernel scales its dots).
    std::vector<float> expected_epilogue(c.N);
    {
      auto dot_unrounded = [&](int row) {
        double acc = 0.0;
        for (int i = 0; i < c.K; ++i) acc += double(bf16_bits_to_float(W[size_t(row) * c.K + i])) * h[i];
        return acc * inverse_rms + (c.bias ? bf16_bits_to_float(bias[row]) : 0.0);
      };
      for (int n = 0; n < c.N; ++n) {
        const float gate = round_to_bf16(float(dot_unrounded(n))), up = round_to_bf16(float(dot_unrounded(c.N + n)));
        expected_epilogue[n] = gate / (1.0f + std::exp(-gate)) * up;
      }
    }
    const std::vector<uint16_t> ones(c.K, float_to_bf16_bits(1.0f));

    DeviceBuffer<uint16_t> d_x(x), d_W(W), d_bias(bias), d_norm(norm), d_y(size_t(c.N)), d_input(input_bits);
    DeviceBuffer<uint16_t> d_ones(ones);
    DeviceBuffer<uint16_t> d_residual(size_t(c.K));
    DeviceBuffer<float> d_partials(partials);
    for (DecodeGemvKernel kernel : {DecodeGemvKernel::kRegisterLoads, DecodeGemvKernel::kRegisterPipelined}) {
      for (bool pdl : {false, true}) {
        INFO("kernel " << (kernel == DecodeGemvKernel::kRegisterLoads ? "register loads" : "register pipelined")
                       << " pdl " << pdl);
        d_y.fill_bytes(0xFF);
        DecodeGemvParams p = test_gemv_params(d_y.data(), d_x, d_norm, d_W, c.bias ? &d_bias : nullptr, c.N, c.K);
        p.residual_partials = ResidualPartials{d_partials.data(), c.count};
        decode_gemv(GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU, p, pdl, 0, kernel);
        CUDA_CHECK(cudaDeviceSynchronize());
        const CompareResult r = compare_bf16("kRmsNormAddPartials", d_y.to_host(), expected, tolerance::kBf16Output);
        INFO(r.report);
        REQUIRE(r.passed);
        if (kernel == DecodeGemvKernel::kRegisterLoads) {  // the norm in the epilogue, x widened or not
          for (bool widen : {false, true}) {
            INFO("norm in the epilogue, x widened " << widen);
            d_y.fill_bytes(0xFF);
            DecodeGemvParams folded =
                test_gemv_params(d_y.data(), d_x, d_ones, d_W, c.bias ? &d_bias : nullptr, c.N, c.K);
            folded.residual_partials = p.residual_partials;
            folded.norm_in_epilogue = true;
            folded.widen_input = widen;
            decode_gemv(GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU, folded, pdl, 0, kernel);
            CUDA_CHECK(cudaDeviceSynchronize());
            const CompareResult re = compare_bf16("kRmsNormAddPartials, norm in the epilogue", d_y.to_host(),
                                                  expected_epilogue, tolerance::kBf16Output);
            INFO(re.report);
            REQUIRE(re.passed);
          }
        }

        // Down's form, on the normalized input the CPU made: the residual starts as x.
        d_residual.copy_from_host(x);
        DecodeGemvParams down{};
        down.y = d_residual.data();
        down.x = reinterpret_cast<const __nv_bfloat16*>(d_input.data());
        down.W = p.W;
        down.bias = p.bias;
        down.N = c.K;
        down.K = c.K;
        down.epilogue_inputs_settled = pdl;  // the partials and x were copied long before
        down.residual_partials = ResidualPartials{d_partials.data(), c.count};
        decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, down, pdl, 0, kernel);
        CUDA_CHECK(cudaDeviceSynchronize());
        const CompareResult rd =
            compare_bf16("kResidualAdd + partials", d_residual.to_host(), expected_down, tolerance::kBf16Output);
        INFO(rd.report);
        REQUIRE(rd.passed);
      }
    }
  }
  // Only the gate/up form exists, on the register kernels, with its partials.
  DeviceBuffer<uint16_t> x(64), W(2 * 64 * 64), y(64), norm(64);
  DeviceBuffer<float> partials(2 * 64);
  DecodeGemvParams p{};
  p.y = y.data();
  p.x = reinterpret_cast<const __nv_bfloat16*>(x.data());
  p.norm_weight = reinterpret_cast<const __nv_bfloat16*>(norm.data());
  p.W = reinterpret_cast<const __nv_bfloat16*>(W.data());
  p.N = 64;
  p.K = 64;
  p.residual_partials = ResidualPartials{partials.data(), 2};
  REQUIRE_THROWS_AS(decode_gemv(GemvInput::kRmsNormAddPartials, GemvOutput::kBf16, p, false), std::invalid_argument);
  if (weight_stream_supported()) {
    REQUIRE_THROWS_AS(decode_gemv(GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU, p, false, 0,
                                  DecodeGemvKernel::kBulkStream),
                      std::invalid_argument);
  }
  for (int count : {0, kMaxResidualPartials + 1}) {
    p.residual_partials.count = count;
    REQUIRE_THROWS_AS(decode_gemv(GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU, p, false),
                      std::invalid_argument);
  }
  p.residual_partials.count = 2;
  REQUIRE_THROWS_AS(decode_gemv(GemvInput::kRmsNorm, GemvOutput::kBf16, p, false), std::invalid_argument);
  p.residual_partials.partials = nullptr;
  REQUIRE_THROWS_AS(decode_gemv(GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU, p, false), std::invalid_argument);
}

TEST_CASE("decode_gemv: the argmax folded into the lm_head chooses and commits as decode_argmax",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  struct FoldCase {
    GemvInput input;
    int N, K, table_C;
  };
  // Bielik's lm_head; odd sizes (a last block with fewer rows); a single row; rows of
  // K > 2048 split over several warps (the warps of a row meet before the epilogue).
  const FoldCase cases[] = {{GemvInput::kRmsNorm, 32000, 1536, 64},
                            {GemvInput::kPlain, 1003, 200, 37},
                            {GemvInput::kPlain, 1, 8, 8},
                            {GemvInput::kRmsNorm, 50, 5000, 64}};
  uint64_t case_seed = seed;
  for (const FoldCase& c : cases) {
    std::vector<uint16_t> x = random_bf16(c.K, ++case_seed, 2.0f);
    std::vector<uint16_t> W = random_bf16(size_t(c.N) * c.K, ++case_seed, 1.0f / std::sqrt(float(c.K)));
    std::vector<uint16_t> bias = random_bf16(c.N, ++case_seed, 0.5f);
    std::vector<uint16_t> norm = random_bf16(c.K, ++case_seed, 0.2f);
    for (auto& v : norm) v = float_to_bf16_bits(1.0f + bf16_bits_to_float(v));  // positive: x's signs stay
    // A tie for the maximum across blocks: rows a < b both follow x's signs (the largest
    // dot product by far) and take a zero bias, so they compute the same logit bit for bit.
    std::uniform_int_distribution<int> pick_a(0, std::max(0, c.N / 2 - 1));
    const int a = pick_a(engine);
    const int b = c.N > 1 ? std::uniform_int_distribution<int>(a + 1, c.N - 1)(engine) : a;
    for (int row : {a, b}) {
      for (int k = 0; k < c.K; ++k) {
        W[size_t(row) * c.K + k] = float_to_bf16_bits(bf16_bits_to_float(x[k]) < 0 ? -0.25f : 0.25f);
      }
    }
    bias[a] = bias[b] = 0;
    const std::vector<uint16_t> table = random_bf16(size_t(c.N) * c.table_C, ++case_seed, 1.0f);
    DeviceBuffer<uint16_t> d_x(x), d_W(W), d_bias(bias), d_norm(norm), d_table(table), next_x(size_t(c.table_C) + 8);
    DeviceBuffer<float> plain_logits(size_t(c.N)), folded_logits(size_t(c.N));
    DeviceBuffer<int32_t> token(1), history(std::vector<int32_t>(64, -7));
    DeviceBuffer<int> length(1);
    DeviceBuffer<int2> block_best(size_t(c.N));
    DeviceBuffer<unsigned> blocks_done(1);
    blocks_done.fill_bytes(0);
    auto params = [&](DeviceBuffer<float>& y) {
      return test_gemv_params(y.data(), d_x, d_norm, d_W, &d_bias, c.N, c.K);
    };
    auto fold = [&](DecodeGemvParams& p) {
      p.argmax.token = token.data();
      p.argmax.d_length = length.data();
      p.argmax.history = history.data();
      p.argmax.history_size = 64;
      p.argmax.next = NextInputRow{reinterpret_cast<const __nv_bfloat16*>(d_table.data()),
                                   reinterpret_cast<__nv_bfloat16*>(next_x.data()), c.table_C};
      p.argmax.block_best = block_best.data();
      p.argmax.blocks_done = blocks_done.data();
      p.argmax.capacity = c.N;
    };
    // Each launch form: PDL or not, one wave or a row a warp (more blocks), the first
    // batch split, the probed instance (a timeline); twice each, on the same counter: a
    // counter left above zero would make no block the last one, and nothing would commit.
    TestGemvTimeline timeline;
    for (int form = 0; form < 5; ++form) {
      INFO(c.N << " x " << c.K << " form " << form << " (0: PDL, 1: no PDL, 2: a row a warp, 3: first batch "
                                                     "split, 4: probed)");
      const bool pdl = form != 1;
      auto set_form = [&](DecodeGemvParams& p) {
        if (form == 2) p.rows_per_warp = 1;
        if (form == 3) p.loads_before_wait = 3;
        if (form == 4) {
          timeline.reset();
          p.timeline = timeline.values.data();
        }
      };
      plain_logits.fill_bytes(0xFF);
      DecodeGemvParams plain = params(plain_logits);
      set_form(plain);
      decode_gemv(c.input, GemvOutput::kF32, plain, pdl);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> logits = plain_logits.to_host();
      REQUIRE(std::none_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); }));
      const int32_t expected = decode_argmax_cpu(logits.data(), c.N);
      REQUIRE(expected == a);  // the planted maximum, the lower index of the tie
      for (int repeat = 0; repeat < 2; ++repeat) {
        INFO("launch " << repeat);
        folded_logits.fill_bytes(0xFF);
        next_x.fill_bytes(0xFF);
        token.copy_from_host(std::vector<int32_t>{-9});
        const int start = 10 + repeat;
        length.copy_from_host(std::vector<int>{start});
        DecodeGemvParams folded = params(folded_logits);
        set_form(folded);
        fold(folded);
        decode_gemv(c.input, GemvOutput::kF32, folded, pdl);
        CUDA_CHECK(cudaDeviceSynchronize());
        REQUIRE(folded_logits.to_host() == logits);  // the logits are written as before, bit for bit
        REQUIRE(token.to_host()[0] == expected);
        REQUIRE(length.to_host()[0] == start + 1);
        REQUIRE(history.to_host()[start] == expected);
        REQUIRE(blocks_done.to_host()[0] == 0u);
        const std::vector<uint16_t> row = next_x.to_host();
        REQUIRE(std::equal(row.begin(), row.begin() + c.table_C, table.begin() + size_t(expected) * c.table_C));
        REQUIRE(std::all_of(row.begin() + c.table_C, row.end(), [](uint16_t v) { return v == 0xFFFF; }));
      }
      if (form == 4) REQUIRE(timeline.stamped(kTimelineEnd));
    }
    std::vector<int32_t> expected_history(64, -7);
    expected_history[10] = expected_history[11] = a;
    REQUIRE(history.to_host() == expected_history);  // nothing else touched

    // A NaN in one row's weights makes that logit NaN: the token is -1 and the next input
    // row zeros, as decode_argmax gives.
    {
      std::vector<uint16_t> with_nan = W;
      const int row = std::uniform_int_distribution<int>(0, c.N - 1)(engine);
      with_nan[size_t(row) * c.K + std::uniform_int_distribution<int>(0, c.K - 1)(engine)] = 0x7FC0;
      d_W.copy_from_host(with_nan);
      next_x.fill_bytes(0xFF);
      length.copy_from_host(std::vector<int>{3});
      DecodeGemvParams folded = params(folded_logits);
      fold(folded);
      decode_gemv(c.input, GemvOutput::kF32, folded, true);
      CUDA_CHECK(cudaDeviceSynchronize());
      INFO("NaN in row " << row);
      REQUIRE(std::isnan(folded_logits.to_host()[row]));
      REQUIRE(token.to_host()[0] == -1);
      REQUIRE(length.to_host()[0] == 4);
      REQUIRE(blocks_done.to_host()[0] == 0u);
      const std::vector<uint16_t> zeros = next_x.to_host();
      REQUIRE(std::all_of(zeros.begin(), zeros.begin() + c.table_C, [](uint16_t v) { return v == 0; }));
      d_W.copy_from_host(W);
    }

    // Refusals: another output, another kernel, a block_best too short for the grid, a
    // history without a length, a next row without a destination.
    auto refused = [&](const std::function<void(DecodeGemvParams&)>& edit, GemvOutput output, DecodeGemvKernel kernel) {
      DecodeGemvParams p = params(folded_logits);
      fold(p);
      edit(p);
      REQUIRE_THROWS_AS(decode_gemv(c.input, output, p, true, 0, kernel), std::invalid_argument);
    };
    auto nothing = [](DecodeGemvParams&) {};
    refused(nothing, GemvOutput::kBf16, DecodeGemvKernel::kAuto);
    refused(nothing, GemvOutput::kF32, DecodeGemvKernel::kRegisterPipelined);
    refused(nothing, GemvOutput::kF32, DecodeGemvKernel::kTensorCores);
    refused([](DecodeGemvParams& p) { p.argmax.blocks_done = nullptr; }, GemvOutput::kF32, DecodeGemvKernel::kAuto);
    refused([](DecodeGemvParams& p) { p.argmax.d_length = nullptr; }, GemvOutput::kF32, DecodeGemvKernel::kAuto);
    refused([](DecodeGemvParams& p) { p.argmax.next.x = nullptr; }, GemvOutput::kF32, DecodeGemvKernel::kAuto);
    if (c.N >= 8) {
      refused([](DecodeGemvParams& p) { p.argmax.capacity = 1; p.rows_per_warp = 1; }, GemvOutput::kF32,
              DecodeGemvKernel::kAuto);
    }
    REQUIRE(length.to_host()[0] == 4);  // no refused launch ran
  }
}
