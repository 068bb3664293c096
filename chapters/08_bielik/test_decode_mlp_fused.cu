// decode_mlp_fused (the decode step's MLP in one kernel) and transpose_bf16 against CPU
// references, with fresh random inputs each run: Bielik's size, and sizes that are no
// multiple of a warp's 256 values a chunk round (C = 200, 584) or of the grid's warps.
#include <cmath>
#include <cstring>
#include <vector>

#include "bf16.hpp"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "cuda_check.cuh"
#include "decode_mlp_fused.cuh"
#include "device_buffer.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

struct MlpCase {
  int C, F;
  bool bias;
};

// The reference MLP of one token, with the kernel's contract: the normalized input
// rounded to bf16, g and u rounded to bf16 after their bias, h = bf16(silu(g) u), the
// down projection summed in float64 onto its bias. Returns acc (C), the fp32 sum the
// kernel leaves in its accumulator.
std::vector<double> reference_mlp(const MlpCase& c, const std::vector<uint16_t>& x, const std::vector<uint16_t>& norm,
                                  const std::vector<uint16_t>& w_gate_up, const std::vector<uint16_t>& b_gate_up,
                                  const std::vector<uint16_t>& w_down, const std::vector<uint16_t>& b_down) {
  double sum_squares = 0;
  for (int k = 0; k < c.C; ++k) sum_squares += double(bf16_bits_to_float(x[k])) * bf16_bits_to_float(x[k]);
  const double inverse_rms = 1.0 / std::sqrt(sum_squares / c.C + 1e-6);
  std::vector<float> input(c.C);
  for (int k = 0; k < c.C; ++k) {
    input[k] = round_to_bf16(float(bf16_bits_to_float(x[k]) * inverse_rms * bf16_bits_to_float(norm[k])));
  }
  std::vector<float> h(c.F);
  for (int i = 0; i < c.F; ++i) {
    double g = 0, u = 0;
    for (int k = 0; k < c.C; ++k) {
      g += double(bf16_bits_to_float(w_gate_up[size_t(i) * c.C + k])) * input[k];
      u += double(bf16_bits_to_float(w_gate_up[size_t(c.F + i) * c.C + k])) * input[k];
    }
    if (c.bias) {
      g += bf16_bits_to_float(b_gate_up[i]);
      u += bf16_bits_to_float(b_gate_up[c.F + i]);
    }
    const float gate = round_to_bf16(float(g)), up = round_to_bf16(float(u));
    h[i] = round_to_bf16(gate / (1.0f + std::exp(-gate)) * up);
  }
  std::vector<double> acc(c.C);
  for (int n = 0; n < c.C; ++n) {
    double sum = c.bias ? bf16_bits_to_float(b_down[n]) : 0.0;
    for (int i = 0; i < c.F; ++i) sum += double(bf16_bits_to_float(w_down[size_t(n) * c.F + i])) * h[i];
    acc[n] = sum;
  }
  return acc;
}

__nv_bfloat16* bf16(DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.data()); }

}  // namespace

TEST_CASE("transpose_bf16 transposes exactly, at tile and odd sizes", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const int shapes[][2] = {{1536, 8960}, {37, 5}, {1, 33}, {64, 32}};
  for (const auto& shape : shapes) {
    const int rows = shape[0], cols = shape[1];
    INFO(rows << " x " << cols);
    const std::vector<uint16_t> in = random_bf16(size_t(rows) * cols, seed + rows, 1.0f);
    DeviceBuffer<uint16_t> d_in(in), d_out(size_t(rows) * cols);
    d_out.fill_bytes(0xFF);  // NaN: a value the kernel leaves unwritten fails
    transpose_bf16(bf16(d_out), bf16(d_in), rows, cols);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out = d_out.to_host();
    size_t wrong = 0;
    for (int r = 0; r < rows; ++r) {
      for (int k = 0; k < cols; ++k) wrong += out[size_t(k) * rows + r] != in[size_t(r) * cols + k];
    }
    REQUIRE(wrong == 0);
  }
  REQUIRE_THROWS_AS(transpose_bf16(nullptr, nullptr, 0, 4), std::invalid_argument);
}

TEST_CASE("decode_mlp_fused: norm, gate/up, SwiGLU and down match a CPU reference", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const MlpCase cases[] = {
      {1536, 8960, true},  // Bielik
      {200, 37, true},     // C: 25 chunks, lanes 25-31 idle; F: fewer values than the grid's warps
      {584, 1001, false},  // 73 chunks: a lane's third chunk only for lanes 0-8; F: no multiple of the warps
      {8, 1, true},        // one chunk, one value
  };
  uint64_t case_seed = seed;
  for (const MlpCase& c : cases) {
    INFO("C=" << c.C << " F=" << c.F << " bias " << c.bias);
    const std::vector<uint16_t> x = random_bf16(c.C, ++case_seed, 2.0f);
    std::vector<uint16_t> norm = random_bf16(c.C, ++case_seed, 0.2f);
    for (auto& v : norm) v = float_to_bf16_bits(1.0f + bf16_bits_to_float(v));
    const std::vector<uint16_t> w_gate_up =
        random_bf16(size_t(2) * c.F * c.C, ++case_seed, 1.0f / std::sqrt(float(c.C)));
    const std::vector<uint16_t> b_gate_up = random_bf16(size_t(2) * c.F, ++case_seed, 0.5f);
    const std::vector<uint16_t> w_down = random_bf16(size_t(c.C) * c.F, ++case_seed, 1.0f / std::sqrt(float(c.F)));
    const std::vector<uint16_t> b_down = random_bf16(c.C, ++case_seed, 0.5f);
    const std::vector<uint16_t> residual = random_bf16(c.C, ++case_seed, 1.0f);
    const std::vector<double> expected_acc = reference_mlp(c, x, norm, w_gate_up, b_gate_up, w_down, b_down);
    // What the next kernel makes of it: the residual plus the projection rounded to bf16.
    std::vector<double> expected_h(c.C);
    for (int n = 0; n < c.C; ++n) {
      expected_h[n] = bf16_bits_to_float(residual[n]) + round_to_bf16(float(expected_acc[n]));
    }

    DeviceBuffer<uint16_t> d_x(x), d_norm(norm), d_w_gate_up(w_gate_up), d_b_gate_up(b_gate_up), d_w_down(w_down),
        d_b_down(b_down), d_w_down_t(size_t(c.C) * c.F);
    transpose_bf16(bf16(d_w_down_t), bf16(d_w_down), c.C, c.F);
    std::vector<float> start(c.C, 0.0f);  // the accumulator on entry: the down bias
    for (int n = 0; n < c.C && c.bias; ++n) start[n] = bf16_bits_to_float(b_down[n]);
    DeviceBuffer<float> d_acc(c.C), d_reset(c.C);

    // Every variant twice on the same inputs: the sum may differ in its last bits (the
    // blocks' atomics come in any order), never by more than the tolerance. Variants 6
    // and 7 shrink the grid (FusedMlpParams::blocks): 3 blocks of 4 warps, so that every
    // warp takes many values (Bielik: 747 or 746), and 121 blocks of 8, an odd count
    // under the SM count; 112 is Bielik's even split, 10 values a warp.
    for (int variant = 0; variant < 9; ++variant) {
      const bool pdl = variant % 2 == 0;
      const int before_wait = variant % 6 / 2;
      const bool reset_to_bias = variant % 3 == 0;
      const int block_warps = variant < 3 || variant == 6 ? 4 : 8;
      const int blocks = variant == 6 ? 3 : variant == 7 ? 121 : variant == 8 ? 112 : 0;
      INFO("pdl " << pdl << " values before the wait " << before_wait << " reset to the bias " << reset_to_bias
                  << " warps a block " << block_warps << " blocks " << blocks << " (0: every SM)");
      for (int launch = 0; launch < 2; ++launch) {
        d_acc.copy_from_host(start);
        d_reset.fill_bytes(0xFF);  // NaN: the reset must overwrite every value
        FusedMlpParams p;
        p.x = bf16(d_x);
        p.norm_weight = bf16(d_norm);
        p.w_gate_up = bf16(d_w_gate_up);
        p.b_gate_up = c.bias ? bf16(d_b_gate_up) : nullptr;
        p.w_down_t = bf16(d_w_down_t);
        p.accumulator = d_acc.data();
        p.reset = d_reset.data();
        p.reset_value = reset_to_bias ? bf16(d_b_down) : nullptr;
        p.C = c.C;
        p.F = c.F;
        p.eps = 1e-6f;
        p.stream_evict_first = pdl;
        p.units_before_wait = before_wait;
        p.block_warps = block_warps;
        p.blocks = blocks;
        decode_mlp_fused(p, pdl);
        CUDA_CHECK(cudaDeviceSynchronize());

        const std::vector<float> acc = d_acc.to_host();
        const CompareResult sum = compare("decode_mlp_fused accumulator", acc, expected_acc, 1e-3);
        INFO("launch " << launch << ": " << sum.report);
        REQUIRE(sum.passed);
        std::vector<uint16_t> h_bits(c.C);
        for (int n = 0; n < c.C; ++n) {
          h_bits[n] = float_to_bf16_bits(bf16_bits_to_float(residual[n]) + round_to_bf16(acc[n]));
        }
        const CompareResult h = compare_bf16("residual + bf16(acc)", h_bits, expected_h, tolerance::kBf16Output);
        INFO(h.report);
        REQUIRE(h.passed);

        const std::vector<float> reset = d_reset.to_host();
        size_t wrong = 0;
        for (int n = 0; n < c.C; ++n) {
          const float want = reset_to_bias ? bf16_bits_to_float(b_down[n]) : 0.0f;
          wrong += std::memcmp(&reset[n], &want, sizeof(float)) != 0;
        }
        REQUIRE(wrong == 0);
      }
    }
  }
}

TEST_CASE("decode_mlp_fused refuses sizes and pointers it cannot run", "[ch08][gpu][kernels]") {
  DeviceBuffer<uint16_t> vectors(2048), weights(size_t(3) * 16 * 2048);
  DeviceBuffer<float> acc(2048);
  auto params = [&](int C, int F) {
    FusedMlpParams p;
    p.x = bf16(vectors);
    p.norm_weight = bf16(vectors);
    p.w_gate_up = bf16(weights);
    p.w_down_t = bf16(weights);
    p.accumulator = acc.data();
    p.C = C;
    p.F = F;
    return p;
  };
  REQUIRE_NOTHROW(decode_mlp_fused(params(1536, 16), false));
  CUDA_CHECK(cudaDeviceSynchronize());
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_mlp_fused(params(1544, 16), false); }), "C <= 1536"));
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_mlp_fused(params(12, 16), false); }), "C % 8"));
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_mlp_fused(params(64, 0), false); }), "F >= 1"));
  FusedMlpParams misaligned = params(64, 4);
  misaligned.accumulator = acc.data() + 1;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_mlp_fused(misaligned, false); }), "aligned"));
  FusedMlpParams too_early = params(64, 4);
  too_early.units_before_wait = 3;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_mlp_fused(too_early, false); }), "units_before_wait"));
  FusedMlpParams odd_block = params(64, 4);
  odd_block.block_warps = 6;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_mlp_fused(odd_block, false); }), "block_warps"));
  FusedMlpParams negative_grid = params(64, 4);
  negative_grid.blocks = -1;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { decode_mlp_fused(negative_grid, false); }), "blocks >= 0"));
}
