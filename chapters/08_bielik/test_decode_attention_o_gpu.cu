// Chapter 08's kernels that meet the decode attention and the O projection, against
// float64 references: decode_gemv's kAttentionMerge (O over the merged attention splits),
// decode_attention_o (a kv group's share of O), decode_attention_o_per_head (attention, O
// and the residual add per query head, in clusters) and decode_attention_o_blocks; at
// Bielik's and odd sizes, and what each refuses. Part of test_ch08_model_cuda.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bf16.hpp"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_attention_device.cuh"  // chapter 07: decode::splits_with_keys
#include "decode_attention_o.cuh"
#include "decode_kernels.cuh"
#include "device_buffer.cuh"
#include "matmul_common.cuh"  // chapter 03: multiprocessor_count
#include "test_support.hpp"
#include "weight_stream.cuh"

using namespace bielik;

TEST_CASE("decode_gemv kAttentionMerge: the O projection of the merged attention splits", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Case {
    int H, D, N, splits, min_keys, committed;  // kv_len = committed + 1 (this token's key)
    bool bias;
  };
  const Case cases[] = {
      {12, 128, 1536, 32, 16, 39, true},    // Bielik's O at 40 keys: 3 of 32 splits hold keys
      {12, 128, 1536, 32, 16, 271, false},  // 272 keys: 17 splits
      {12, 128, 1536, 8, 16, 999, true},    // every split holds keys
      {4, 64, 200, 5, 1, 6, true},          // odd N; 4 of 5 splits of 2 keys
  };
  uint64_t case_seed = seed;
  for (const Case& c : cases) {
    const int K = c.H * c.D, kv_len = c.committed + 1;
    const int used = decode::splits_with_keys(kv_len, c.splits, c.min_keys);
    INFO("H=" << c.H << " D=" << c.D << " N=" << c.N << " splits=" << c.splits << " min_keys=" << c.min_keys
              << " kv_len=" << kv_len << " splits with keys " << used);
    REQUIRE(used >= 1);
    // Partial states as the split kernel leaves them: (m, l, acc) for the splits with
    // keys; m = -inf, l = 0 and an acc never written (NaN here) for the others.
    std::mt19937_64 engine(++case_seed);
    std::uniform_real_distribution<float> max_dist(-4.0f, 4.0f), sum_dist(1.0f, 30.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> ml(size_t(c.splits) * c.H * 2), acc(size_t(c.splits) * c.H * c.D, NAN);
    for (int s = 0; s < c.splits; ++s) {
      for (int h = 0; h < c.H; ++h) {
        const size_t state = size_t(s) * c.H + h;
        if (s >= used) {
          ml[2 * state] = -INFINITY;
          ml[2 * state + 1] = 0.0f;
          continue;
        }
        ml[2 * state] = max_dist(engine);
        ml[2 * state + 1] = sum_dist(engine);
        for (int d = 0; d < c.D; ++d) acc[state * c.D + d] = normal(engine) * ml[2 * state + 1];
      }
    }
    std::vector<float> merged(K);
    for (int h = 0; h < c.H; ++h) {
      double m_max = -INFINITY;
      for (int s = 0; s < used; ++s) m_max = std::max(m_max, double(ml[2 * (size_t(s) * c.H + h)]));
      for (int d = 0; d < c.D; ++d) {
        double l_sum = 0, a_sum = 0;
        for (int s = 0; s < used; ++s) {
          const size_t state = size_t(s) * c.H + h;
          const double weight = std::exp2(double(ml[2 * state]) - m_max);
          l_sum += ml[2 * state + 1] * weight;
          a_sum += acc[state * c.D + d] * weight;
        }
        merged[size_t(h) * c.D + d] = round_to_bf16(float(a_sum / l_sum));  // the combine stores bf16
      }
    }
    const std::vector<uint16_t> W = random_bf16(size_t(c.N) * K, ++case_seed, 1.0f / std::sqrt(float(K)));
    const std::vector<uint16_t> bias = random_bf16(c.N, ++case_seed, 0.5f);
    const std::vector<uint16_t> residual = random_bf16(c.N, ++case_seed, 1.0f);
    std::vector<float> expected(c.N);
    for (int n = 0; n < c.N; ++n) {
      double dot = c.bias ? bf16_bits_to_float(bias[n]) : 0.0;
      for (int k = 0; k < K; ++k) dot += double(bf16_bits_to_float(W[size_t(n) * K + k])) * merged[k];
      expected[n] = bf16_bits_to_float(residual[n]) + round_to_bf16(float(dot));
    }

    DeviceBuffer<float> d_ml(ml), d_acc(acc);
    DeviceBuffer<int> d_length(std::vector<int>{c.committed});
    DeviceBuffer<uint16_t> d_W(W), d_bias(bias), d_y(size_t(c.N));
    for (DecodeGemvKernel kernel : {DecodeGemvKernel::kRegisterLoads, DecodeGemvKernel::kRegisterPipelined}) {
      for (bool pdl : {false, true}) {
        INFO("kernel " << (kernel == DecodeGemvKernel::kRegisterLoads ? "register loads" : "register pipelined")
                       << " pdl " << pdl);
        d_y.copy_from_host(residual);
        DecodeGemvParams p{};
        p.y = d_y.data();
        p.x = nullptr;  // the input comes from the partials
        p.W = reinterpret_cast<const __nv_bfloat16*>(d_W.data());
        p.bias = c.bias ? reinterpret_cast<const __nv_bfloat16*>(d_bias.data()) : nullptr;
        p.N = c.N;
        p.K = K;
        p.merge = AttentionMergeSource{d_acc.data(), d_ml.data(), d_length.data(), 1, kv_len + 5, c.splits,
                                       c.min_keys, c.H, c.D};
        decode_gemv(GemvInput::kAttentionMerge, GemvOutput::kResidualAdd, p, pdl, 0, kernel);
        CUDA_CHECK(cudaDeviceSynchronize());
        CompareResult r = compare_bf16("kAttentionMerge", d_y.to_host(), expected, tolerance::kBf16Output);
        INFO(r.report);
        REQUIRE(r.passed);
      }
    }
  }
}

TEST_CASE("decode_gemv kAttentionMerge refuses what it cannot run", "[ch08][gpu][kernels]") {
  DeviceBuffer<uint16_t> W(64 * 128), y(64);
  DeviceBuffer<float> acc(4 * 2 * 64), ml(4 * 2 * 2);
  DeviceBuffer<int> length(1);
  auto valid = [&] {
    DecodeGemvParams p{};
    p.y = y.data();
    p.W = reinterpret_cast<const __nv_bfloat16*>(W.data());
    p.N = 64;
    p.K = 128;
    p.merge = AttentionMergeSource{acc.data(), ml.data(), length.data(), 1, 64, 4, 16, 2, 64};
    return p;
  };
  auto refused = [&](const DecodeGemvParams& p, GemvOutput output, DecodeGemvKernel kernel) {
    REQUIRE_THROWS_AS(decode_gemv(GemvInput::kAttentionMerge, output, p, false, 0, kernel), std::invalid_argument);
  };
  refused(valid(), GemvOutput::kBf16, DecodeGemvKernel::kAuto);  // only the residual-add form exists
  if (weight_stream_supported()) refused(valid(), GemvOutput::kResidualAdd, DecodeGemvKernel::kBulkStream);
  DecodeGemvParams p = valid();
  p.merge.H = 3;  // K != H * D
  refused(p, GemvOutput::kResidualAdd, DecodeGemvKernel::kAuto);
  p = valid();
  p.merge.d_length = nullptr;
  refused(p, GemvOutput::kResidualAdd, DecodeGemvKernel::kAuto);
  p = valid();
  p.merge.num_splits = 0;
  refused(p, GemvOutput::kResidualAdd, DecodeGemvKernel::kAuto);
  p = valid();
  p.merge.min_keys_per_split = 0;
  refused(p, GemvOutput::kResidualAdd, DecodeGemvKernel::kAuto);
  p = valid();
  p.merge.partial_acc = nullptr;
  refused(p, GemvOutput::kResidualAdd, DecodeGemvKernel::kAuto);
}

// The attention of one token (query heads (H, D), keys / values (Hkv, max_context, D),
// the first kv_len of them) in float64, each output rounded to bf16 as chapter 07 stores it.
std::vector<float> attention_reference(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                                       const std::vector<uint16_t>& v, int H, int Hkv, int D, int max_context,
                                       int kv_len) {
  std::vector<float> out(size_t(H) * D);
  const int G = H / Hkv;
  for (int h = 0; h < H; ++h) {
    const size_t head = size_t(h / G) * max_context * D;
    std::vector<double> scores(kv_len);
    double top = -INFINITY;
    for (int j = 0; j < kv_len; ++j) {
      double dot = 0;
      for (int d = 0; d < D; ++d) {
        dot += double(bf16_bits_to_float(q[size_t(h) * D + d])) * bf16_bits_to_float(k[head + size_t(j) * D + d]);
      }
      scores[j] = dot / std::sqrt(double(D));
      top = std::max(top, scores[j]);
    }
    double sum = 0;
    for (double& x : scores) sum += (x = std::exp(x - top));
    for (int d = 0; d < D; ++d) {
      double acc = 0;
      for (int j = 0; j < kv_len; ++j) acc += scores[j] * bf16_bits_to_float(v[head + size_t(j) * D + d]);
      out[size_t(h) * D + d] = round_to_bf16(float(acc / sum));
    }
  }
  return out;
}

// What both fused attention + O kernels read, over test buffers (bf16 data held as
// uint16_t), for one new token; `bias` may be null.
AttentionOInputs attention_o_inputs(DeviceBuffer<uint16_t>& q, DeviceBuffer<uint16_t>& k, DeviceBuffer<uint16_t>& v,
                                    DeviceBuffer<int>& length, int max_context, DeviceBuffer<uint16_t>& W,
                                    DeviceBuffer<uint16_t>* bias, int C, int H, int Hkv, int D) {
  auto bf16 = [](DeviceBuffer<uint16_t>& buffer) { return reinterpret_cast<const __nv_bfloat16*>(buffer.data()); };
  AttentionOInputs in;
  in.q = bf16(q);
  in.k_cache = bf16(k);
  in.v_cache = bf16(v);
  in.d_length = length.data();
  in.new_tokens = 1;
  in.max_context = max_context;
  in.w_o = bf16(W);
  in.b_o = bias ? bf16(*bias) : nullptr;
  in.C = C;
  in.H = H;
  in.Hkv = Hkv;
  in.D = D;
  return in;
}

// decode_attention_o's arguments over the same buffers.
AttentionOParams attention_o_params(DeviceBuffer<float>& partials, DeviceBuffer<uint16_t>& q,
                                    DeviceBuffer<uint16_t>& k, DeviceBuffer<uint16_t>& v, DeviceBuffer<int>& length,
                                    int max_context, DeviceBuffer<uint16_t>& W, DeviceBuffer<uint16_t>* bias, int C,
                                    int H, int Hkv, int D) {
  AttentionOParams p;
  static_cast<AttentionOInputs&>(p) = attention_o_inputs(q, k, v, length, max_context, W, bias, C, H, Hkv, D);
  p.partials = partials.data();
  return p;
}

TEST_CASE("decode_attention_o: every kv group's share of the O projection matches a CPU reference",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Case {
    int C, H, Hkv, D, committed, cluster;  // kv_len = committed + 1; cluster 0: the largest that runs
    int replicas;
    bool bias;
  };
  const Case cases[] = {
      {1536, 12, 2, 128, 39, 0, 1, true},    // Bielik at 40 keys: 16 splits, most of them empty
      {1536, 12, 2, 128, 271, 0, 4, false},  // 272 keys, 4 clusters per kv head: 24 rows a block
      {1536, 12, 2, 128, 2047, 0, 2, true},  // 2048 keys: every split holds 128
      {576, 9, 3, 64, 100, 0, 3, false},     // SmolLM2-135M's attention (G = 3, D = 64)
      {576, 9, 3, 64, 100, 5, 1, true},      // a cluster of 5: 116 rows a block, the last one 112
      {200, 4, 2, 64, 6, 3, 1, true},        // odd C (67 rows a block, the last one 66), 7 keys
      {200, 4, 2, 64, 6, 3, 5, false},       // 15 blocks of 14 rows, the last one 4
      {200, 4, 2, 64, 0, 1, 1, false},       // one key, a cluster of one block
      {192, 6, 1, 128, 33, 16, 1, true},     // C = 192 over 16 blocks: 12 rows each
      {192, 6, 1, 128, 33, 16, 16, true},    // 256 blocks for 192 rows: some blocks have none
  };
  uint64_t case_seed = seed;
  for (const Case& c : cases) {
    const int G = c.H / c.Hkv, band = G * c.D, kv_len = c.committed + 1, max_context = kv_len + 9;
    const int cluster = decode_attention_o_cluster_size(c.C, c.H, c.Hkv, c.D, c.cluster, c.replicas);
    INFO("C=" << c.C << " H=" << c.H << " Hkv=" << c.Hkv << " D=" << c.D << " kv_len=" << kv_len << " cluster "
              << cluster << " (asked " << c.cluster << ") x " << c.replicas << " replicas, bias " << c.bias);
    if (!device_is_sm90_or_newer()) {
      REQUIRE(cluster == 0);  // before sm_90 the model runs the unfused path
      continue;
    }
    REQUIRE(cluster == (c.cluster > 0 ? c.cluster : 16));  // the H200 runs every size asked here
    const std::vector<uint16_t> q = random_bf16(size_t(c.H) * c.D, ++case_seed, 1.0f);
    const std::vector<uint16_t> k = random_bf16(size_t(c.Hkv) * max_context * c.D, ++case_seed, 1.0f);
    const std::vector<uint16_t> v = random_bf16(size_t(c.Hkv) * max_context * c.D, ++case_seed, 1.0f);
    const std::vector<uint16_t> W = random_bf16(size_t(c.C) * c.H * c.D, ++case_seed, 1.0f / std::sqrt(float(band)));
    const std::vector<uint16_t> bias = random_bf16(c.C, ++case_seed, 0.5f);
    const std::vector<float> attention = attention_reference(q, k, v, c.H, c.Hkv, c.D, max_context, kv_len);
    // Group g's share: W_o's columns [g band, (g + 1) band) times g's heads' outputs, and
    // the bias in group 0's.
    std::vector<double> expected(size_t(c.Hkv) * c.C);
    for (int g = 0; g < c.Hkv; ++g) {
      for (int n = 0; n < c.C; ++n) {
        double acc = g == 0 && c.bias ? bf16_bits_to_float(bias[n]) : 0.0;
        for (int i = 0; i < band; ++i) {
          const size_t column = size_t(g) * band + i;
          acc += double(bf16_bits_to_float(W[size_t(n) * c.H * c.D + column])) * attention[column];
        }
        expected[size_t(g) * c.C + n] = acc;
      }
    }
    DeviceBuffer<uint16_t> d_q(q), d_k(k), d_v(v), d_W(W), d_bias(bias);
    DeviceBuffer<int> d_length(std::vector<int>{c.committed});
    DeviceBuffer<float> d_partials(size_t(c.Hkv) * c.C);
    for (bool pdl : {false, true}) {
      INFO("pdl " << pdl);
      d_partials.fill_bytes(0xFF);  // NaN: every output must be written
      const AttentionOParams p = attention_o_params(d_partials, d_q, d_k, d_v, d_length, max_context, d_W,
                                                    c.bias ? &d_bias : nullptr, c.C, c.H, c.Hkv, c.D);
      decode_attention_o(p, cluster, pdl, 0, c.replicas);
      CUDA_CHECK(cudaDeviceSynchronize());
      const CompareResult r = compare("attention + O partials", d_partials.to_host(), expected, tolerance::kBf16Output);
      INFO(r.report);
      REQUIRE(r.passed);
    }
  }
}

TEST_CASE("decode_attention_o refuses what it cannot run", "[ch08][gpu][kernels]") {
  DeviceBuffer<uint16_t> q(12 * 128), k(2 * 64 * 128), v(2 * 64 * 128), W(1536 * 1536);
  DeviceBuffer<int> length(1);
  DeviceBuffer<float> partials(2 * 1536);
  auto valid = [&] { return attention_o_params(partials, q, k, v, length, 64, W, nullptr, 1536, 12, 2, 128); };
  AttentionOParams p = valid();
  p.D = 16;  // no kernel for head_dim 16
  REQUIRE_THROWS_AS(decode_attention_o(p, 16, false), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_o_cluster_size(1536, 12, 2, 16), std::invalid_argument);
  p = valid();
  p.H = 13;  // not a multiple of Hkv
  REQUIRE_THROWS_AS(decode_attention_o(p, 16, false), std::invalid_argument);
  p = valid();
  p.d_length = nullptr;
  REQUIRE_THROWS_AS(decode_attention_o(p, 16, false), std::invalid_argument);
  p = valid();
  p.w_o = reinterpret_cast<const __nv_bfloat16*>(W.data()) + 1;  // not 16-byte aligned
  REQUIRE_THROWS_AS(decode_attention_o(p, 16, false), std::invalid_argument);
  // Bielik's W_o rows over 8 blocks need 295 KB of shared memory a block: more than any
  // GPU offers, so no cluster of 8 or fewer runs it, and asking for 8 finds none; 17
  // blocks is over the largest cluster.
  REQUIRE(decode_attention_o_cluster_size(1536, 12, 2, 128, 8) == 0);
  REQUIRE_THROWS_AS(decode_attention_o(valid(), 8, false), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_o(valid(), 17, false), std::invalid_argument);
}

TEST_CASE("decode_attention_o_per_head: attention, O projection and residual add match a CPU reference",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Case {
    int C, H, Hkv, D, committed, cluster;  // kv_len = committed + 1
    bool bias;
  };
  const Case cases[] = {
      {1536, 12, 2, 128, 39, 4, true},    // Bielik at 40 keys, the short graph's clusters: 384 rows a block
      {1536, 12, 2, 128, 271, 8, false},  // 272 keys, the middle graph's
      {1536, 12, 2, 128, 2047, 16, true}, // 2048 keys, the long graph's: 96 rows a block
      {576, 9, 3, 64, 100, 4, true},      // SmolLM2-135M's attention (G = 3, D = 64): 144 rows a block
      {200, 4, 2, 64, 6, 3, true},        // odd C: 67 rows a block, the last one 66; 7 keys
      {20, 4, 2, 64, 33, 16, false},      // 2 rows a block: blocks 10-15 have none
      {200, 4, 2, 128, 0, 1, true},       // one key, a cluster of one block
      {192, 6, 1, 128, 33, 5, true},      // G = 6 on one kv head, 39 rows a block, the last one 36
  };
  uint64_t case_seed = seed;
  for (const Case& c : cases) {
    const int kv_len = c.committed + 1, max_context = kv_len + 9, width = c.H * c.D;
    INFO("C=" << c.C << " H=" << c.H << " Hkv=" << c.Hkv << " D=" << c.D << " kv_len=" << kv_len << " cluster "
              << c.cluster << ", bias " << c.bias);
    if (!device_is_sm90_or_newer()) {
      REQUIRE_FALSE(decode_attention_o_per_head_runs(c.C, c.H, c.Hkv, c.D, c.cluster));
      continue;
    }
    REQUIRE(decode_attention_o_per_head_runs(c.C, c.H, c.Hkv, c.D, c.cluster));
    const std::vector<uint16_t> q = random_bf16(size_t(c.H) * c.D, ++case_seed, 1.0f);
    const std::vector<uint16_t> k = random_bf16(size_t(c.Hkv) * max_context * c.D, ++case_seed, 1.0f);
    const std::vector<uint16_t> v = random_bf16(size_t(c.Hkv) * max_context * c.D, ++case_seed, 1.0f);
    // W_o scaled so that the projection is ~1 and the residual ~0.25: a projection
    // missing, or added twice, is far outside the tolerance.
    const std::vector<uint16_t> W = random_bf16(size_t(c.C) * width, ++case_seed, 4.0f / std::sqrt(float(width)));
    const std::vector<uint16_t> bias = random_bf16(c.C, ++case_seed, 0.5f);
    const std::vector<uint16_t> x0 = random_bf16(c.C, ++case_seed, 0.25f);
    const std::vector<float> attention = attention_reference(q, k, v, c.H, c.Hkv, c.D, max_context, kv_len);
    std::vector<double> projection(c.C);  // attention W_o^T + b, in float64
    for (int n = 0; n < c.C; ++n) {
      double acc = c.bias ? bf16_bits_to_float(bias[n]) : 0.0;
      for (int i = 0; i < width; ++i) acc += double(bf16_bits_to_float(W[size_t(n) * width + i])) * attention[i];
      projection[n] = acc;
    }
    DeviceBuffer<uint16_t> d_q(q), d_k(k), d_v(v), d_W(W), d_bias(bias), d_x(x0);
    DeviceBuffer<int> d_length(std::vector<int>{c.committed});
    DeviceBuffer<float> d_partials(size_t(c.H) * c.C);
    DeviceBuffer<unsigned> d_arrivals(kAttentionOMaxClusterSize);
    d_arrivals.fill_bytes(0);
    AttentionOPerHeadParams p;
    static_cast<AttentionOInputs&>(p) =
        attention_o_inputs(d_q, d_k, d_v, d_length, max_context, d_W, c.bias ? &d_bias : nullptr, c.C, c.H, c.Hkv, c.D);
    p.x = reinterpret_cast<__nv_bfloat16*>(d_x.data());
    p.partials = d_partials.data();
    p.arrivals = d_arrivals.data();
    // Eight launches on the same residual, each adding the projection once more: the
    // arrival counts must be back at 0 after each. With and without PDL, the residual
    // read before or after the wait, W_o's rows requested before the wait or after the
    // attention.
    std::vector<uint16_t> before = x0;
    int launch = 0;
    for (int form = 0; form < 8; ++form) {
      const bool pdl = form & 1, settled = form & 2, late_weights = form & 4;
      {
        INFO("launch " << launch++ << ", pdl " << pdl << ", residual settled " << settled << ", W_o after the attention "
                       << late_weights);
        p.residual_settled = settled;
        p.w_o_after_attention = late_weights;
        d_partials.fill_bytes(0xFF);  // NaN: every head's share of every row must be written
        decode_attention_o_per_head(p, c.cluster, pdl);
        CUDA_CHECK(cudaDeviceSynchronize());
        // x = bf16(x + bf16(o + b)), as the O GEMV's epilogue rounds, from the x it read.
        std::vector<double> expected(c.C);
        for (int n = 0; n < c.C; ++n) {
          expected[n] = round_to_bf16(bf16_bits_to_float(before[n]) + round_to_bf16(float(projection[n])));
        }
        const std::vector<uint16_t> after = d_x.to_host();
        const CompareResult r = compare_bf16("attention + O + residual", after, expected, tolerance::kBf16Output);
        INFO(r.report);
        REQUIRE(r.passed);
        std::vector<unsigned> arrivals = d_arrivals.to_host();
        REQUIRE(std::all_of(arrivals.begin(), arrivals.end(), [](unsigned a) { return a == 0; }));
        before = after;
      }
    }
  }
}

TEST_CASE("decode_attention_o_per_head refuses what it cannot run", "[ch08][gpu][kernels]") {
  DeviceBuffer<uint16_t> q(12 * 128), k(2 * 64 * 128), v(2 * 64 * 128), W(1536 * 1536), x(1536);
  DeviceBuffer<int> length(1);
  DeviceBuffer<float> partials(12 * 1536);
  DeviceBuffer<unsigned> arrivals(kAttentionOMaxClusterSize);
  auto valid = [&] {
    AttentionOPerHeadParams p;
    static_cast<AttentionOInputs&>(p) = attention_o_inputs(q, k, v, length, 64, W, nullptr, 1536, 12, 2, 128);
    p.x = reinterpret_cast<__nv_bfloat16*>(x.data());
    p.partials = partials.data();
    p.arrivals = arrivals.data();
    return p;
  };
  AttentionOPerHeadParams p = valid();
  p.D = 16;  // no kernel for head_dim 16
  REQUIRE_THROWS_AS(decode_attention_o_per_head(p, 4, false), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_o_per_head_runs(1536, 12, 2, 16, 4), std::invalid_argument);
  p = valid();
  p.H = 13;  // not a multiple of Hkv
  REQUIRE_THROWS_AS(decode_attention_o_per_head(p, 4, false), std::invalid_argument);
  p = valid();
  p.arrivals = nullptr;
  REQUIRE_THROWS_AS(decode_attention_o_per_head(p, 4, false), std::invalid_argument);
  p = valid();
  p.x = nullptr;
  REQUIRE_THROWS_AS(decode_attention_o_per_head(p, 4, false), std::invalid_argument);
  p = valid();
  p.w_o = reinterpret_cast<const __nv_bfloat16*>(W.data()) + 1;  // not 16-byte aligned
  REQUIRE_THROWS_AS(decode_attention_o_per_head(p, 4, false), std::invalid_argument);
  // Bielik's 1536 W_o rows in one block would need 393 KB of shared memory, more than
  // any GPU offers; 17 blocks is over the largest cluster.
  REQUIRE_FALSE(decode_attention_o_per_head_runs(1536, 12, 2, 128, 1));
  REQUIRE_THROWS_AS(decode_attention_o_per_head(valid(), 1, false), std::invalid_argument);
  REQUIRE_FALSE(decode_attention_o_per_head_runs(1536, 12, 2, 128, 17));
  REQUIRE_THROWS_AS(decode_attention_o_per_head(valid(), 17, false), std::invalid_argument);
}

TEST_CASE("decode_attention_o_blocks: the O blocks add every head's projection into the accumulator",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Case {
    int C, H, Hkv, D, committed, splits, o_blocks;  // kv_len = committed + 1
    bool bias;
  };
  const Case cases[] = {
      {1536, 12, 2, 128, 39, 4, 12, true},    // Bielik's short graph: 128 rows an O block (8 loads a thread)
      {1536, 12, 2, 128, 271, 8, 8, false},   // the middle graph's: 192 rows (16 loads), 272 keys
      {576, 9, 3, 64, 100, 4, 12, true},      // SmolLM2-135M's attention (G = 3, D = 64): 48 rows
      {200, 4, 2, 64, 6, 3, 5, true},         // odd C, 40 rows a block (float4 atomics); 7 keys
      {202, 4, 2, 64, 20, 2, 7, true},        // 29 rows a block, the last 28: one atomic a row
      {20, 4, 2, 64, 33, 3, 13, false},       // 2 rows a block: O blocks 10-12 have none
      {200, 4, 2, 128, 0, 1, 1, true},        // one key, one split, one O block of 200 rows
      {192, 6, 1, 128, 33, 5, 11, true},      // G = 6 on one kv head, 18 rows a block, the last 12
  };
  uint64_t case_seed = seed;
  for (const Case& c : cases) {
    const int kv_len = c.committed + 1, max_context = kv_len + 9, width = c.H * c.D;
    INFO("C=" << c.C << " H=" << c.H << " Hkv=" << c.Hkv << " D=" << c.D << " kv_len=" << kv_len << ", " << c.splits
              << " splits + " << c.o_blocks << " O blocks, bias " << c.bias);
    if (!device_is_sm90_or_newer()) {
      REQUIRE_FALSE(decode_attention_o_blocks_runs(c.C, c.H, c.Hkv, c.D, c.splits, c.o_blocks));
      continue;
    }
    REQUIRE(decode_attention_o_blocks_runs(c.C, c.H, c.Hkv, c.D, c.splits, c.o_blocks));
    const std::vector<uint16_t> q = random_bf16(size_t(c.H) * c.D, ++case_seed, 1.0f);
    const std::vector<uint16_t> k = random_bf16(size_t(c.Hkv) * max_context * c.D, ++case_seed, 1.0f);
    const std::vector<uint16_t> v = random_bf16(size_t(c.Hkv) * max_context * c.D, ++case_seed, 1.0f);
    // W_o scaled so that the projection is ~1: a head's share missing, or added twice,
    // is far outside the tolerance.
    const std::vector<uint16_t> W = random_bf16(size_t(c.C) * width, ++case_seed, 4.0f / std::sqrt(float(width)));
    const std::vector<uint16_t> bias = random_bf16(c.C, ++case_seed, 0.5f);
    const std::vector<uint16_t> reset_value = random_bf16(c.C, ++case_seed, 0.5f);
    const std::vector<float> attention = attention_reference(q, k, v, c.H, c.Hkv, c.D, max_context, kv_len);
    std::vector<double> projection(c.C);  // attention W_o^T, in float64
    std::vector<float> start(c.C);        // the accumulator before the first launch: the bias (or 0)
    for (int n = 0; n < c.C; ++n) {
      double acc = 0;
      for (int i = 0; i < width; ++i) acc += double(bf16_bits_to_float(W[size_t(n) * width + i])) * attention[i];
      projection[n] = acc;
      start[n] = c.bias ? bf16_bits_to_float(bias[n]) : 0.0f;
    }
    DeviceBuffer<uint16_t> d_q(q), d_k(k), d_v(v), d_W(W), d_bias(bias), d_reset_value(reset_value);
    DeviceBuffer<int> d_length(std::vector<int>{c.committed});
    DeviceBuffer<float> d_accumulator(start), d_reset(c.C);
    AttentionOBlocksParams p;
    static_cast<AttentionOInputs&>(p) =
        attention_o_inputs(d_q, d_k, d_v, d_length, max_context, d_W, c.bias ? &d_bias : nullptr, c.C, c.H, c.Hkv, c.D);
    p.accumulator = d_accumulator.data();
    p.reset = d_reset.data();
    // Four launches into the same accumulator, each adding the projection once more; the
    // reset target poisoned before each, and reset to its value (or to zeros) by each.
    for (int launch = 0; launch < 4; ++launch) {
      const bool pdl = launch & 1, with_value = launch & 2;
      INFO("launch " << launch << ", pdl " << pdl << ", reset to a value " << with_value);
      p.reset_value = with_value ? reinterpret_cast<const __nv_bfloat16*>(d_reset_value.data()) : nullptr;
      p.allow_dependents_after_inputs = launch == 3;
      d_reset.fill_bytes(0xFF);  // NaN: every value must be reset
      decode_attention_o_blocks(p, c.splits, c.o_blocks, pdl);
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<double> expected(c.C);
      for (int n = 0; n < c.C; ++n) expected[n] = start[n] + (launch + 1) * projection[n];
      const CompareResult r = compare("O blocks' accumulator", d_accumulator.to_host(), expected,
                                      tolerance::kBf16Output);
      INFO(r.report);
      REQUIRE(r.passed);
      const std::vector<float> reset = d_reset.to_host();
      for (int n = 0; n < c.C; ++n) {
        INFO("reset value " << n);
        REQUIRE(reset[n] == (with_value ? bf16_bits_to_float(reset_value[n]) : 0.0f));
      }
    }
  }
}

TEST_CASE("decode_attention_o_blocks refuses what it cannot run", "[ch08][gpu][kernels]") {
  DeviceBuffer<uint16_t> q(12 * 128), k(2 * 64 * 128), v(2 * 64 * 128), W(1536 * 1536);
  DeviceBuffer<int> length(1);
  DeviceBuffer<float> accumulator(1536), reset(1536);
  auto valid = [&] {
    AttentionOBlocksParams p;
    static_cast<AttentionOInputs&>(p) = attention_o_inputs(q, k, v, length, 64, W, nullptr, 1536, 12, 2, 128);
    p.accumulator = accumulator.data();
    p.reset = reset.data();
    return p;
  };
  AttentionOBlocksParams p = valid();
  p.D = 16;  // no kernel for head_dim 16
  REQUIRE_THROWS_AS(decode_attention_o_blocks(p, 4, 12, false), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_o_blocks_runs(1536, 12, 2, 16, 4, 12), std::invalid_argument);
  p = valid();
  p.H = 13;  // not a multiple of Hkv
  REQUIRE_THROWS_AS(decode_attention_o_blocks(p, 4, 12, false), std::invalid_argument);
  p = valid();
  p.accumulator = nullptr;
  REQUIRE_THROWS_AS(decode_attention_o_blocks(p, 4, 12, false), std::invalid_argument);
  p = valid();
  p.reset = p.accumulator;  // it would wipe what it adds to
  REQUIRE_THROWS_AS(decode_attention_o_blocks(p, 4, 12, false), std::invalid_argument);
  p = valid();
  p.w_o = reinterpret_cast<const __nv_bfloat16*>(W.data()) + 1;  // not 16-byte aligned
  REQUIRE_THROWS_AS(decode_attention_o_blocks(p, 4, 12, false), std::invalid_argument);
  // 1536 rows over 4 O blocks are 384 a block, more than 16 loads a thread hold; 17
  // blocks a cluster are over the largest cluster; no O block at all is not this kernel.
  REQUIRE_FALSE(decode_attention_o_blocks_runs(1536, 12, 2, 128, 4, 4));
  REQUIRE_THROWS_AS(decode_attention_o_blocks(valid(), 4, 4, false), std::invalid_argument);
  REQUIRE_FALSE(decode_attention_o_blocks_runs(1536, 12, 2, 128, 4, 13));
  REQUIRE_THROWS_AS(decode_attention_o_blocks(valid(), 4, 13, false), std::invalid_argument);
  REQUIRE_FALSE(decode_attention_o_blocks_runs(1536, 12, 2, 128, 4, 0));
}
