// Chapter 07, CPU: the references against the float64 golden rows of causal attention,
// the append in chunks, and the capacity check (no GPU needed for any of it).
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_attention.cuh"
#include "kv_cache.cuh"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

// fp32 reference vs float64 (measured: ~1e-7 for the Bielik case, exact at kv_len = 1,
// where the softmax weight is exactly 1 and the output is V's row).
constexpr double kCpuTolerance = tolerance::kFp32;

NpyArray load(const std::string& name) { return load_npy(golden_path("07_kv_cache", name + ".npy")); }

// A CPU cache of one layer: (Hkv, max_context, D) for K and V, filled with NaN so that
// reading a position that was never appended poisons the result.
struct CpuCache {
  int Hkv, D, max_context, length = 0;
  std::vector<float> k, v;
  CpuCache(int Hkv, int D, int max_context)
      : Hkv(Hkv), D(D), max_context(max_context), k(size_t(Hkv) * max_context * D, NAN),
        v(size_t(Hkv) * max_context * D, NAN) {}
  // Appends tokens [first, first + count) of a (T, Hkv, D) sequence.
  void append(const std::vector<float>& k_all, const std::vector<float>& v_all, int first, int count) {
    size_t offset = size_t(first) * Hkv * D;
    kv_cache_append_cpu(k.data(), v.data(), k_all.data() + offset, v_all.data() + offset, length, count, Hkv, D,
                        max_context);
    length += count;
  }
};

}  // namespace

TEST_CASE("the capacity check names the overflow", "[ch07][cpu]") {
  REQUIRE_NOTHROW(kv_cache_check_room(0, 10, 10));  // exactly full is fine
  REQUIRE_NOTHROW(kv_cache_check_room(10, 0, 10));
  try {
    kv_cache_check_room(8, 3, 10);
    FAIL("no exception for 8 + 3 > 10");
  } catch (const std::length_error& error) {
    REQUIRE(std::string(error.what()) == "KV cache full: 8 + 3 tokens exceed max_context 10");
  }
  REQUIRE_THROWS_AS(kv_cache_check_room(0, 8193, 8192), std::length_error);
  REQUIRE_THROWS_AS(kv_cache_check_room(2000000000, 2000000000, 8192), std::length_error);  // no int overflow
  REQUIRE_THROWS_AS(kv_cache_check_room(0, -1, 10), std::invalid_argument);
}

TEST_CASE("kv_cache_append_cpu refuses an overflow and writes nothing", "[ch07][cpu]") {
  const int Hkv = 2, D = 8, max_context = 5;
  std::vector<float> k(size_t(Hkv) * max_context * D, 7.0f), v = k;
  std::vector<float> k_new(size_t(3) * Hkv * D, 1.0f), v_new = k_new;
  REQUIRE_THROWS_AS(kv_cache_append_cpu(k.data(), v.data(), k_new.data(), v_new.data(), 3, 3, Hkv, D, max_context),
                    std::length_error);
  for (float x : k) REQUIRE(x == 7.0f);
  for (float x : v) REQUIRE(x == 7.0f);
}

TEST_CASE("kv_cache_append_cpu places token-major rows head-major", "[ch07][cpu]") {
  const int Hkv = 2, D = 3, max_context = 4;
  // k_new[t][g][d] = 100 t + 10 g + d, appended at position 1.
  std::vector<float> k_new, v_new;
  for (int t = 0; t < 2; ++t)
    for (int g = 0; g < Hkv; ++g)
      for (int d = 0; d < D; ++d) {
        k_new.push_back(100.0f * t + 10.0f * g + d);
        v_new.push_back(-(100.0f * t + 10.0f * g + d));
      }
  std::vector<float> k(size_t(Hkv) * max_context * D, -1.0f), v = k;
  kv_cache_append_cpu(k.data(), v.data(), k_new.data(), v_new.data(), 1, 2, Hkv, D, max_context);
  for (int g = 0; g < Hkv; ++g)
    for (int position = 0; position < max_context; ++position)
      for (int d = 0; d < D; ++d) {
        size_t index = (size_t(g) * max_context + position) * D + d;
        bool written = position == 1 || position == 2;
        float expected = written ? 100.0f * (position - 1) + 10.0f * g + d : -1.0f;
        INFO("g=" << g << " position=" << position << " d=" << d);
        REQUIRE(k[index] == expected);
        REQUIRE(v[index] == (written ? -expected : -1.0f));
      }
}

TEST_CASE("appending in two chunks equals appending in one (CPU)", "[ch07][cpu]") {
  NpyArray k_file = load("bielik_decode_k"), v_file = load("bielik_decode_v");
  int T = int(k_file.shape[0]), Hkv = int(k_file.shape[1]), D = int(k_file.shape[2]);
  std::vector<float> k_all = k_file.to_float(), v_all = v_file.to_float();
  CpuCache one(Hkv, D, T + 3), two(Hkv, D, T + 3);
  one.append(k_all, v_all, 0, T);
  two.append(k_all, v_all, 0, 1000);
  two.append(k_all, v_all, 1000, T - 1000);
  // Compare bit patterns: the unwritten tail is NaN in both, and NaN != NaN as floats.
  auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  REQUIRE(bits_equal(one.k, two.k));
  REQUIRE(bits_equal(one.v, two.v));
}

TEST_CASE("decode_attention_cpu equals the last row of causal attention", "[ch07][cpu]") {
  for (std::string name : {"bielik_decode", "smollm2_decode"}) {
    NpyArray q_rows = load(name + "_q_rows"), k_file = load(name + "_k"), v_file = load(name + "_v");
    std::vector<int32_t> positions = load(name + "_positions").to_int32();
    std::vector<double> expected = load(name + "_expected").to_double();
    int H = int(q_rows.shape[1]), D = int(q_rows.shape[2]);
    int T = int(k_file.shape[0]), Hkv = int(k_file.shape[1]);
    std::vector<float> q_all = q_rows.to_float(), k_all = k_file.to_float(), v_all = v_file.to_float();
    for (size_t r = 0; r < positions.size(); ++r) {
      int kv_len = positions[r] + 1;
      CpuCache cache(Hkv, D, T + 5);  // room to spare, NaN beyond kv_len
      cache.append(k_all, v_all, 0, kv_len);
      std::vector<float> out(size_t(H) * D);
      decode_attention_cpu(out.data(), q_all.data() + r * H * D, cache.k.data(), cache.v.data(), kv_len,
                           cache.max_context, H, Hkv, D);
      std::vector<double> want(expected.begin() + long(r * H * D), expected.begin() + long((r + 1) * H * D));
      CompareResult result = compare(name + " kv_len=" + std::to_string(kv_len), out, want, kCpuTolerance);
      INFO(result.report);
      REQUIRE(result.passed);
    }
  }
}

TEST_CASE("prefill in chunks, then token-by-token decode, reproduces every row (CPU)", "[ch07][cpu]") {
  for (std::string name : {"odd_steps", "mha_steps"}) {
    NpyArray q_file = load(name + "_q"), k_file = load(name + "_k"), v_file = load(name + "_v");
    std::vector<double> expected = load(name + "_expected").to_double();
    int T = int(q_file.shape[0]), H = int(q_file.shape[1]), D = int(q_file.shape[2]), Hkv = int(k_file.shape[1]);
    std::vector<float> q_all = q_file.to_float(), k_all = k_file.to_float(), v_all = v_file.to_float();
    const int prompt = T * 2 / 3, first_chunk = prompt / 2;
    CpuCache cache(Hkv, D, T);  // exactly full at the end
    cache.append(k_all, v_all, 0, first_chunk);
    cache.append(k_all, v_all, first_chunk, prompt - first_chunk);
    for (int p = prompt; p < T; ++p) {
      cache.append(k_all, v_all, p, 1);
      std::vector<float> out(size_t(H) * D);
      decode_attention_cpu(out.data(), q_all.data() + size_t(p) * H * D, cache.k.data(), cache.v.data(),
                           cache.length, T, H, Hkv, D);
      std::vector<double> want(expected.begin() + long(size_t(p) * H * D),
                               expected.begin() + long(size_t(p + 1) * H * D));
      CompareResult result = compare(name + " step p=" + std::to_string(p), out, want, kCpuTolerance);
      INFO(result.report);
      REQUIRE(result.passed);
    }
    REQUIRE_THROWS_AS(cache.append(k_all, v_all, 0, 1), std::length_error);  // full now
  }
}

TEST_CASE("decode_attention_cpu rejects impossible lengths and head counts", "[ch07][cpu]") {
  std::vector<float> q(4 * 8), k(2 * 10 * 8), v(2 * 10 * 8), out(4 * 8);
  REQUIRE_THROWS_AS(decode_attention_cpu(out.data(), q.data(), k.data(), v.data(), 0, 10, 4, 2, 8),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_cpu(out.data(), q.data(), k.data(), v.data(), 11, 10, 4, 2, 8),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_cpu(out.data(), q.data(), k.data(), v.data(), 5, 10, 3, 2, 8),
                    std::invalid_argument);
}

TEST_CASE("the GPU launchers' shape checks run on the host", "[ch07][cpu]") {
  alignas(16) static char buffer[64];
  REQUIRE_NOTHROW(decode_attention_check_shape(buffer, buffer, buffer, 100, 12, 2, 128));
  REQUIRE_NOTHROW(decode_attention_check_shape(buffer, buffer, buffer, 100, 9, 3, 64));
  REQUIRE_THROWS_AS(decode_attention_check_shape(buffer, buffer, buffer, 100, 12, 2, 96), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_check_shape(buffer, buffer, buffer, 100, 18, 2, 128), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_check_shape(buffer, buffer, buffer, 100, 12, 5, 128), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_check_shape(buffer + 2, buffer, buffer, 100, 12, 2, 128),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_check_length(0, 100), std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_check_length(101, 100), std::invalid_argument);
}
