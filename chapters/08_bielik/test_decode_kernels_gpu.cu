// Chapter 08's small decode kernels against CPU references and chapters 04 and 07: the
// QKV GEMV's RoPE + cache append (decode_gemv kRopeAppend, and qkv_rope_append in
// prefill) bit for bit against the unfused kernels and within a bf16 rounding of
// chapter 04's rope_cpu; swiglu_rows; decode_argmax; l2_prefetch. Part of
// test_ch08_model_cuda.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bf16.hpp"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_kernels.cuh"
#include "decode_side_prefetch.cuh"
#include "device_buffer.cuh"
#include "prefill_kernels.cuh"
#include "kv_cache.cuh"
#include "rope.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

// kRopeAppend's q and k against chapter 04's CPU RoPE (rope_cpu: float64 angles, fp32
// rotation) of the projection, and its v against the projection itself: the bit-for-bit
// comparison below runs both kernels through the same device helpers (rope_rotate_first /
// _second, the epilogue's loads), which this does not share. `projected` is the QKV GEMV's
// bf16 output, (H + 2 Hkv, D); q (H, D) and the caches (Hkv, max_context, D) as the kernel
// wrote them, the caches poisoned with 0xFFFF first. Each value within one bf16 rounding
// (2^-8 relative, and 1e-4 for the fp32 sums' order near zero); every other cache row
// untouched. The first value that fails is reported.
void require_rope_append_matches_cpu(const std::vector<uint16_t>& projected, const std::vector<uint16_t>& q,
                                     const std::vector<uint16_t>& k_cache, const std::vector<uint16_t>& v_cache,
                                     int H, int Hkv, int D, int max_context, int pos, float theta) {
  std::vector<float> q_cpu(size_t(H) * D), k_cpu(size_t(Hkv) * D);
  for (size_t i = 0; i < q_cpu.size(); ++i) q_cpu[i] = bf16_bits_to_float(projected[i]);
  for (size_t i = 0; i < k_cpu.size(); ++i) k_cpu[i] = bf16_bits_to_float(projected[q_cpu.size() + i]);
  const int32_t position = pos;
  rope_cpu(q_cpu.data(), k_cpu.data(), &position, 1, H, Hkv, D, theta);
  auto near = [](uint16_t got, float want) {
    return std::fabs(double(bf16_bits_to_float(got)) - want) <= std::ldexp(std::fabs(double(want)), -8) + 1e-4;
  };
  for (size_t i = 0; i < q_cpu.size(); ++i) {
    if (near(q[i], q_cpu[i])) continue;
    INFO("q value " << i << ": " << bf16_bits_to_float(q[i]) << " against rope_cpu's " << q_cpu[i]);
    REQUIRE(near(q[i], q_cpu[i]));
  }
  for (int h = 0; h < Hkv; ++h) {
    for (int t = 0; t < max_context; ++t) {
      for (int d = 0; d < D; ++d) {
        const size_t at = (size_t(h) * max_context + t) * D + d;
        const float want_k = k_cpu[size_t(h) * D + d];
        const uint16_t want_v = projected[size_t(H + Hkv + h) * D + d];  // v as projected
        const bool right = t == pos ? near(k_cache[at], want_k) && v_cache[at] == want_v
                                    : k_cache[at] == 0xFFFF && v_cache[at] == 0xFFFF;  // only pos's row written
        if (right) continue;
        INFO("kv head " << h << " position " << t << " (the token's: " << pos << ") dim " << d << ": k "
                        << bf16_bits_to_float(k_cache[at]) << " against rope_cpu's " << want_k << ", v bits "
                        << v_cache[at] << " against " << want_v);
        REQUIRE(right);
      }
    }
  }
}

}  // namespace

TEST_CASE("decode_gemv kRopeAppend equals the QKV GEMV then decode_rope_append, bit for bit, and chapter 04's "
          "CPU RoPE", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Shape {
    int H, Hkv, D, K, max_context;
  };
  uint64_t case_seed = seed;
  for (const Shape& shape : {Shape{12, 2, 128, 1536, 40}, Shape{3, 1, 64, 200, 9}}) {
    const int rows = (shape.H + 2 * shape.Hkv) * shape.D;
    const RopeTable table = rope_table_build(shape.D, 1e6f, shape.max_context);
    const std::vector<uint16_t> x = random_bf16(shape.K, ++case_seed, 2.0f);
    const std::vector<uint16_t> W = random_bf16(size_t(rows) * shape.K, ++case_seed, 1.0f / std::sqrt(float(shape.K)));
    const std::vector<uint16_t> bias = random_bf16(rows, ++case_seed, 0.5f);
    const std::vector<uint16_t> norm = random_bf16(shape.K, ++case_seed, 1.0f);
    DeviceBuffer<uint16_t> d_x(x), d_W(W), d_bias(bias), d_norm(norm);
    const size_t cache_elements = size_t(shape.Hkv) * shape.max_context * shape.D;
    // The valid positions, and one past the cache: that one must leave the cache alone.
    for (int pos : {0, 5, shape.max_context - 1, shape.max_context}) {
      INFO("H=" << shape.H << " Hkv=" << shape.Hkv << " D=" << shape.D << " K=" << shape.K << " pos=" << pos);
      DeviceBuffer<int> d_length(std::vector<int>{pos});
      auto as_bf16 = [](DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.data()); };
      // Unfused: the QKV GEMV (bf16 out) on `kernel`, then RoPE + append; `projected`
      // keeps the GEMV's output for the CPU reference.
      DeviceBuffer<uint16_t> qkv{size_t(rows)}, k_ref{cache_elements}, v_ref{cache_elements};
      DecodeGemvParams p{as_bf16(qkv), as_bf16(d_x), as_bf16(d_norm), as_bf16(d_W), as_bf16(d_bias), rows, shape.K, 1e-6f};
      std::vector<uint16_t> projected;
      auto unfused = [&](DecodeGemvKernel kernel) {
        qkv.fill_bytes(0xFF);
        k_ref.fill_bytes(0xFF);
        v_ref.fill_bytes(0xFF);
        decode_gemv(GemvInput::kRmsNorm, GemvOutput::kBf16, p, false, 0, kernel);
        projected = qkv.to_host();
        decode_rope_append(as_bf16(qkv), as_bf16(k_ref), as_bf16(v_ref), d_length.data(), table, shape.H, shape.Hkv,
                           shape.max_context, false);
      };
      unfused(DecodeGemvKernel::kAuto);
      // Fused, both register kernels, then the tensor-core kernel (against its own unfused
      // form: its sums come in another order); the position read before the PDL wait or
      // after it.
      const DecodeGemvKernel fused_kernels[] = {DecodeGemvKernel::kRegisterLoads, DecodeGemvKernel::kRegisterPipelined,
                                                DecodeGemvKernel::kTensorCores};
      for (int variant = 0; variant < 6; ++variant) {
        const DecodeGemvKernel kernel = fused_kernels[variant / 2];
        if (variant == 4) unfused(DecodeGemvKernel::kTensorCores);
        INFO("kernel " << variant / 2 << " position before the wait " << variant % 2);
        DeviceBuffer<uint16_t> q(size_t(shape.H) * shape.D), k(cache_elements), v(cache_elements);
        q.fill_bytes(0xFF);
        k.fill_bytes(0xFF);
        v.fill_bytes(0xFF);
        DecodeGemvParams f = p;
        f.y = q.data();
        f.N = rows / 2;
        f.rope = RopeAppendTarget{as_bf16(k), as_bf16(v), d_length.data(), table.cos.data(), table.sin.data(),
                                  shape.H, shape.Hkv, shape.D, shape.max_context, table.max_positions};
        f.epilogue_inputs_settled = variant % 2 == 1;
        decode_gemv(GemvInput::kRmsNorm, GemvOutput::kRopeAppend, f, true, 0, kernel);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> q_fused = q.to_host(), q_ref = qkv.to_host();
        const std::vector<uint16_t> k_fused = k.to_host(), v_fused = v.to_host();
        if (pos < shape.max_context) {
          REQUIRE(std::equal(q_fused.begin(), q_fused.end(), q_ref.begin()));
          require_rope_append_matches_cpu(projected, q_fused, k_fused, v_fused, shape.H, shape.Hkv, shape.D,
                                          shape.max_context, pos, 1e6f);
        } else {  // outside the cache: q is NaN, as the unfused kernel makes it
          for (uint16_t bits : q_fused) REQUIRE(std::isnan(bf16_bits_to_float(bits)));
          for (uint16_t bits : k_fused) REQUIRE(bits == 0xFFFF);  // the caches untouched
          for (uint16_t bits : v_fused) REQUIRE(bits == 0xFFFF);
        }
        REQUIRE(k_fused == k_ref.to_host());  // also: untouched (0xFFFF) at pos = max_context
        REQUIRE(v_fused == v_ref.to_host());
      }
    }
  }
  // A wrong N is refused.
  DecodeGemvParams bad{};
  bad.N = 7;
  bad.K = 8;
  REQUIRE_THROWS_AS(decode_gemv(GemvInput::kPlain, GemvOutput::kRopeAppend, bad, false), std::invalid_argument);
}

TEST_CASE("qkv_rope_append equals split + chapter 04 RoPE + chapter 07 append, bit for bit", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Shape {
    int T, P, H, Hkv, D, max_context, max_positions;
  };
  const Shape shapes[] = {
      {37, 0, 12, 2, 128, 64, 64},     // Bielik heads, odd T
      {512, 0, 12, 2, 128, 600, 600},  // Bielik, a 512-token prompt
      {13, 21, 9, 3, 64, 40, 40},      // SmolLM2 heads, a chunk on top of 21 cached tokens
      {6, 3, 3, 1, 64, 7, 8},          // positions 3..8: 7 is past the cache, 8 past the table
  };
  uint64_t case_seed = seed;
  for (const Shape& c : shapes) {
    INFO("T=" << c.T << " P=" << c.P << " H=" << c.H << " Hkv=" << c.Hkv << " D=" << c.D);
    const int width = (c.H + 2 * c.Hkv) * c.D;
    const std::vector<uint16_t> qkv = random_bf16(size_t(c.T) * width, ++case_seed, 2.0f);
    const RopeTable table = rope_table_build(c.D, 1e6f, c.max_positions);
    const size_t cache_values = size_t(c.Hkv) * c.max_context * c.D;

    // Reference: split on the host, chapter 04's rope_forward, chapter 07's append.
    std::vector<uint16_t> q(size_t(c.T) * c.H * c.D), k(size_t(c.T) * c.Hkv * c.D), v(k.size());
    for (int t = 0; t < c.T; ++t) {
      const uint16_t* row = qkv.data() + size_t(t) * width;
      std::copy(row, row + c.H * c.D, q.begin() + long(t) * c.H * c.D);
      std::copy(row + c.H * c.D, row + (c.H + c.Hkv) * c.D, k.begin() + long(t) * c.Hkv * c.D);
      std::copy(row + (c.H + c.Hkv) * c.D, row + width, v.begin() + long(t) * c.Hkv * c.D);
    }
    DeviceBuffer<uint16_t> q_ref(q), k_ref(k), v_ref(v), k_cache_ref(cache_values), v_cache_ref(cache_values);
    k_cache_ref.fill_bytes(0xFF);
    v_cache_ref.fill_bytes(0xFF);
    std::vector<int32_t> positions(c.T);
    for (int t = 0; t < c.T; ++t) positions[t] = c.P + t;
    DeviceBuffer<int32_t> d_positions(positions);
    auto bf = [](DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.data()); };
    rope_forward(bf(q_ref), bf(k_ref), d_positions.data(), c.T, c.H, c.Hkv, table);
    const int fits = std::max(0, std::min(c.T, c.max_context - c.P));  // tokens the cache can take
    kv_cache_append(bf(k_cache_ref), bf(v_cache_ref), bf(k_ref), bf(v_ref), c.P, fits, c.Hkv, c.D, c.max_context);

    DeviceBuffer<uint16_t> d_qkv(qkv), q_out(q.size()), k_out(k.size()), v_out(v.size());
    DeviceBuffer<uint16_t> k_cache(cache_values), v_cache(cache_values);
    for (auto* b : {&q_out, &k_out, &v_out, &k_cache, &v_cache}) b->fill_bytes(0xFF);
    const QkvRopeAppendOut out{bf(q_out), bf(k_out), bf(v_out), bf(k_cache), bf(v_cache), c.max_context};
    qkv_rope_append(out, bf(d_qkv), c.T, c.P, c.H, c.Hkv, table);
    CUDA_CHECK(cudaDeviceSynchronize());
    REQUIRE(q_out.to_host() == q_ref.to_host());
    REQUIRE(k_out.to_host() == k_ref.to_host());
    REQUIRE(v_out.to_host() == v_ref.to_host());
    REQUIRE(k_cache.to_host() == k_cache_ref.to_host());  // untouched (0xFFFF) past max_context
    REQUIRE(v_cache.to_host() == v_cache_ref.to_host());
    if (c.P + c.T > c.max_positions) {  // the token past the table: NaN q, as chapter 04 writes
      const std::vector<uint16_t> got = q_out.to_host();
      REQUIRE(std::isnan(bf16_bits_to_float(got[size_t(c.max_positions - c.P) * c.H * c.D])));
    }
  }
  DeviceBuffer<uint16_t> small(64);
  auto* p = reinterpret_cast<__nv_bfloat16*>(small.data());
  const RopeTable odd = rope_table_build(8, 1e4f, 4);  // D % 16 != 0
  REQUIRE_THROWS_AS(qkv_rope_append(QkvRopeAppendOut{p, p, p, p, p, 4}, p, 1, 0, 1, 1, odd), std::invalid_argument);
  const RopeTable good = rope_table_build(16, 1e4f, 4);
  REQUIRE_THROWS_AS(qkv_rope_append(QkvRopeAppendOut{p + 1, p, p, p, p, 4}, p, 1, 0, 1, 1, good),
                    std::invalid_argument);  // q not 16-byte aligned
}

TEST_CASE("swiglu_rows matches a CPU reference", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  for (auto [T, F] : {std::pair{1, 8}, std::pair{37, 344}, std::pair{512, 8960}}) {
    INFO("T=" << T << " F=" << F);
    const std::vector<uint16_t> gate_up = random_bf16(size_t(T) * 2 * F, seed + T, 4.0f);
    std::vector<float> expected(size_t(T) * F);
    for (int t = 0; t < T; ++t) {
      for (int f = 0; f < F; ++f) {
        const float g = bf16_bits_to_float(gate_up[size_t(t) * 2 * F + f]);
        const float u = bf16_bits_to_float(gate_up[size_t(t) * 2 * F + F + f]);
        expected[size_t(t) * F + f] = g / (1.0f + std::exp(-g)) * u;
      }
    }
    DeviceBuffer<uint16_t> d_gate_up(gate_up), act(expected.size());
    act.fill_bytes(0xFF);  // poisoned: a value not written stays NaN
    swiglu_rows(reinterpret_cast<__nv_bfloat16*>(act.data()), reinterpret_cast<const __nv_bfloat16*>(d_gate_up.data()),
                T, F);
    CUDA_CHECK(cudaDeviceSynchronize());
    const CompareResult r = compare_bf16("swiglu_rows", act.to_host(), expected, tolerance::kBf16Output);
    INFO(r.report);
    REQUIRE(r.passed);
  }
}

TEST_CASE("decode_argmax: first maximum, NaN gives -1, commits the length", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::vector<float> logits(32000);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : logits) v = normal(engine);
  logits[31999] = logits[777] = 100.0f;  // a tie: the lower index wins
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> token(1);
  DeviceBuffer<int> length(std::vector<int>{41});
  decode_argmax(token.data(), d_logits.data(), int(logits.size()), length.data(), true);
  REQUIRE(token.to_host()[0] == 777);
  REQUIRE(decode_argmax_cpu(logits.data(), int(logits.size())) == 777);
  REQUIRE(length.to_host()[0] == 42);
  logits[12345] = NAN;
  d_logits.copy_from_host(logits);
  decode_argmax(token.data(), d_logits.data(), int(logits.size()), nullptr, false);
  REQUIRE(token.to_host()[0] == -1);
  REQUIRE(length.to_host()[0] == 42);
  // The history: the token lands at the length before the increment, nothing else is
  // touched, and a length past the end writes nothing (the length still advances).
  logits[12345] = 0.0f;
  d_logits.copy_from_host(logits);
  DeviceBuffer<int32_t> history(std::vector<int32_t>(50, -7));
  decode_argmax(token.data(), d_logits.data(), int(logits.size()), length.data(), true, 0, history.data(), 50);
  std::vector<int32_t> expected(50, -7);
  expected[42] = 777;
  REQUIRE(history.to_host() == expected);
  REQUIRE(length.to_host()[0] == 43);
  length.copy_from_host(std::vector<int>{50});
  decode_argmax(token.data(), d_logits.data(), int(logits.size()), length.data(), false, 0, history.data(), 50);
  REQUIRE(history.to_host() == expected);
  REQUIRE(length.to_host()[0] == 51);
  REQUIRE_THROWS_AS(decode_argmax(token.data(), d_logits.data(), 8, nullptr, false, 0, history.data(), 50),
                    std::invalid_argument);
}

TEST_CASE("decode_argmax: odd vocabularies and unaligned logits; the next input row", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  // The reads take 16-byte chunks, a batch of them per thread: vocabularies that are not
  // a multiple of 4 (a scalar tail), larger than one batch of the block (32768 values),
  // and logits that start off the 16-byte grid (the scalar path), with the maximum placed
  // in the tail, in the first chunk, at the last index and in a tie across threads.
  for (const int V : {1, 3, 5, 4097, 31999, 32000, 32001, 40003, 151936}) {
    for (int offset : {0, 1}) {
      std::vector<float> values(size_t(V) + offset);
      for (float& v : values) v = normal(engine);
      std::uniform_int_distribution<int> pick(0, V - 1);
      const int places[] = {V - 1, 0, pick(engine), pick(engine)};
      for (int where : places) {
        std::vector<float> logits = values;
        logits[size_t(offset) + where] = 50.0f;
        if (where > 0) logits[size_t(offset) + engine() % where] = 50.0f;  // a tie at a lower index
        const int32_t expected = decode_argmax_cpu(logits.data() + offset, V);
        DeviceBuffer<float> d_logits(logits);
        DeviceBuffer<int32_t> token(std::vector<int32_t>{-9});
        decode_argmax(token.data(), d_logits.data() + offset, V, nullptr, false);
        INFO("V " << V << " offset " << offset << " maximum at " << where);
        REQUIRE(token.to_host()[0] == expected);
      }
    }
  }

  // The next input row: the chosen token's embedding, 16-byte copies (C = 1536) or one
  // value at a time (C = 37, or a destination off the 16-byte grid), zeros after a NaN;
  // nothing around the row is touched.
  for (auto [C, offset] : {std::pair{1536, 0}, std::pair{37, 0}, std::pair{1536, 1}}) {
    constexpr int kV = 300;
    const std::vector<uint16_t> table = random_bf16(size_t(kV) * C, seed + C, 1.0f);
    DeviceBuffer<uint16_t> d_table(table), x(size_t(C) + 8);
    std::vector<float> logits(kV);
    for (float& v : logits) v = normal(engine);
    logits[211] = 40.0f;
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<int32_t> token(1);
    DeviceBuffer<int> length(std::vector<int>{3});
    x.fill_bytes(0xFF);  // poisoned
    const NextInputRow next{reinterpret_cast<const __nv_bfloat16*>(d_table.data()),
                            reinterpret_cast<__nv_bfloat16*>(x.data()) + offset, C};
    decode_argmax(token.data(), d_logits.data(), kV, length.data(), true, 0, nullptr, 0, next);
    REQUIRE(token.to_host()[0] == 211);
    REQUIRE(length.to_host()[0] == 4);
    std::vector<uint16_t> row = x.to_host();
    INFO("C " << C << " offset " << offset);
    auto poisoned = [](uint16_t v) { return v == 0xFFFF; };
    REQUIRE(std::equal(row.begin() + offset, row.begin() + offset + C, table.begin() + size_t(211) * C));
    REQUIRE(std::all_of(row.begin(), row.begin() + offset, poisoned));
    REQUIRE(std::all_of(row.begin() + offset + C, row.end(), poisoned));
    logits[17] = NAN;
    d_logits.copy_from_host(logits);
    x.fill_bytes(0xFF);
    decode_argmax(token.data(), d_logits.data(), kV, nullptr, false, 0, nullptr, 0, next);
    REQUIRE(token.to_host()[0] == -1);
    row = x.to_host();
    REQUIRE(std::all_of(row.begin() + offset, row.begin() + offset + C, [](uint16_t v) { return v == 0; }));
    REQUIRE(std::all_of(row.begin(), row.begin() + offset, poisoned));
    REQUIRE(std::all_of(row.begin() + offset + C, row.end(), poisoned));
    REQUIRE_THROWS_AS(decode_argmax(token.data(), d_logits.data(), kV, nullptr, false, 0, nullptr, 0,
                                    NextInputRow{next.table, nullptr, C}),
                      std::invalid_argument);
    REQUIRE_THROWS_AS(decode_argmax(token.data(), d_logits.data(), kV, nullptr, false, 0, nullptr, 0,
                                    NextInputRow{next.table, next.x, 0}),
                      std::invalid_argument);
  }
}

TEST_CASE("l2_prefetch: the load form reads every byte of its ranges; bad plans are refused", "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::vector<uint32_t> words(300000);
  for (uint32_t& w : words) w = uint32_t(engine());
  DeviceBuffer<uint32_t> data(words);
  // Three ranges: one 16-byte vector, and two of odd vector counts at 16-byte offsets
  // that are not multiples of a line, covering (first word, words) of the buffer.
  const size_t ranges[3][2] = {{4, 4}, {1028, 4100}, {6004, 250012}};
  L2PrefetchPlan plan;
  uint32_t expected = 0;
  for (const auto& range : ranges) {
    plan.range[plan.count++] = {data.data() + range[0], range[1] * sizeof(uint32_t)};
    for (size_t i = range[0]; i < range[0] + range[1]; ++i) expected ^= words[i];
  }
  DeviceBuffer<unsigned> checksum(1);
  plan.form = L2PrefetchForm::kLoads;
  plan.checksum = checksum.data();
  for (int blocks : {1, 3, 8, 132}) {
    checksum.fill_bytes(0);
    l2_prefetch(plan, blocks, nullptr);
    INFO(blocks << " blocks");
    REQUIRE(checksum.to_host()[0] == expected);
  }
  // The request forms have no output: they must finish without a fault and write nothing.
  for (L2PrefetchForm form : {L2PrefetchForm::kLines, L2PrefetchForm::kBulk}) {
    for (int stride : {32, 64, 128}) {
      L2PrefetchPlan requests = plan;
      requests.form = form;
      requests.stride_bytes = stride;
      requests.checksum = nullptr;
      l2_prefetch(requests, 5, nullptr);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    }
  }
  // The line form takes a range at any byte; the others refuse it.
  L2PrefetchPlan odd;
  odd.range[odd.count++] = {reinterpret_cast<const char*>(data.data()) + 3, 1001};
  l2_prefetch(odd, 2, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(data.to_host() == words);
  odd.form = L2PrefetchForm::kBulk;
  REQUIRE_THROWS_AS(l2_prefetch(odd, 2, nullptr), std::invalid_argument);
  odd.form = L2PrefetchForm::kLoads;
  REQUIRE_THROWS_AS(l2_prefetch(odd, 2, nullptr), std::invalid_argument);
  L2PrefetchPlan bad = plan;
  bad.stride_bytes = 48;
  REQUIRE_THROWS_AS(l2_prefetch(bad, 2, nullptr), std::invalid_argument);
  bad = plan;
  bad.range[1].begin = nullptr;
  REQUIRE_THROWS_AS(l2_prefetch(bad, 2, nullptr), std::invalid_argument);
  bad = plan;
  bad.count = kMaxL2PrefetchRanges + 1;
  REQUIRE_THROWS_AS(l2_prefetch(bad, 2, nullptr), std::invalid_argument);
  REQUIRE_THROWS_AS(l2_prefetch(plan, 0, nullptr), std::invalid_argument);
}
