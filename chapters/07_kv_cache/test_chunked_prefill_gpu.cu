// Chapter 07 with chapters 04 and 05, GPU: a prompt prefilled in two chunks through the
// KV cache gives the same rows as a one-chunk prefill, and the next token decoded over
// the cache gives the next row. This is the whole attention path of the model:
//   RoPE (ch04) at positions start..start+T-1 -> append K, V to the cache (ch07) ->
//   attention of the chunk's queries over every cached key (ch05, q_len < kv_len) ->
//   then one token: RoPE at its position -> append -> decode attention (ch07).
// The golden rows are causal attention after float64 RoPE, so a wrong position offset
// (the classic bug of a second chunk) or a key appended at the wrong slot fails here.
#include <string>
#include <vector>

#include "attention.cuh"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_attention.cuh"
#include "device_buffer.cuh"
#include "kv_cache.cuh"
#include "npy.hpp"
#include "rope.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

NpyArray load(const std::string& name) { return load_npy(golden_path("07_kv_cache", name + ".npy")); }

__nv_bfloat16* as_bf16(uint16_t* bits) { return reinterpret_cast<__nv_bfloat16*>(bits); }

// Tokens [first, first + count) of a token-major (T, heads, D) bf16 tensor, on the device.
DeviceBuffer<uint16_t> slice(const std::vector<uint16_t>& all, int first, int count, int heads, int D) {
  size_t row = size_t(heads) * D;
  return DeviceBuffer<uint16_t>(
      std::vector<uint16_t>(all.begin() + long(first * row), all.begin() + long((first + count) * row)));
}

std::vector<double> rows(const std::vector<double>& all, int first, int count, size_t row) {
  return std::vector<double>(all.begin() + long(first * row), all.begin() + long((first + count) * row));
}

void require_close(const std::string& label, const std::vector<uint16_t>& actual, const std::vector<double>& expected) {
  CompareResult result = compare_bf16(label, actual, expected, tolerance::kBf16Output);
  INFO(result.report);
  REQUIRE(result.passed);
}

}  // namespace

TEST_CASE("two-chunk prefill over the cache equals one-chunk prefill, and decode continues it", "[ch07][gpu]") {
  NpyArray q_file = load("prefill_rope_q"), k_file = load("prefill_rope_k"), v_file = load("prefill_rope_v");
  std::vector<double> expected = load("prefill_rope_expected").to_double();
  const float theta = float(load("prefill_rope_theta").to_double()[0]);
  const int T = int(q_file.shape[0]), H = int(q_file.shape[1]), D = int(q_file.shape[2]);
  const int Hkv = int(k_file.shape[1]);
  const size_t q_row = size_t(H) * D;
  std::vector<uint16_t> q_all = q_file.bf16_bits(), k_all = k_file.bf16_bits(), v_all = v_file.bf16_bits();
  RopeTable rope = rope_table_build(D, theta, T);

  // One chunk: RoPE over all T tokens, attention of T queries over T keys.
  DeviceBuffer<uint16_t> out_one(size_t(T) * q_row);
  {
    DeviceBuffer<uint16_t> q = slice(q_all, 0, T, H, D), k = slice(k_all, 0, T, Hkv, D);
    DeviceBuffer<uint16_t> v = slice(v_all, 0, T, Hkv, D);
    DeviceBuffer<int32_t> positions(T);
    rope_positions_from_offset(positions.data(), T, 0);
    rope_forward(as_bf16(q.data()), as_bf16(k.data()), positions.data(), T, H, Hkv, rope);
    out_one.fill_bytes(0xFF);
    attention_forward(as_bf16(out_one.data()), as_bf16(q.data()), as_bf16(k.data()), as_bf16(v.data()), T, T, H,
                      Hkv, D);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<uint16_t> one = out_one.to_host();
  require_close("one-chunk prefill", one, expected);

  // Two chunks through the cache (the second one's queries see the first one's keys),
  // then the last token decoded over the cache.
  const int first_chunk = 500, prompt = T - 1;
  KvCache cache(2, Hkv, D, T);
  // Every cache position never appended, and every gathered row never written, is NaN
  // (0xFF bytes): a gather or an attention that reads past kv_len fails.
  for (int l = 0; l < cache.layers(); ++l) {
    CUDA_CHECK(cudaMemset(cache.k(l), 0xFF, cache.layer_elements() * 2));
    CUDA_CHECK(cudaMemset(cache.v(l), 0xFF, cache.layer_elements() * 2));
  }
  DecodeAttentionWorkspace workspace(H, D, 256);
  DeviceBuffer<uint16_t> k_gathered(size_t(T) * Hkv * D), v_gathered(size_t(T) * Hkv * D);
  k_gathered.fill_bytes(0xFF);
  v_gathered.fill_bytes(0xFF);
  DeviceBuffer<uint16_t> out_two(size_t(T) * q_row);
  out_two.fill_bytes(0xFF);
  const int layer = 1;
  for (auto [start, count] : {std::pair{0, first_chunk}, std::pair{first_chunk, prompt - first_chunk}, 
                              std::pair{prompt, 1}}) {
    INFO("chunk at " << start << " of " << count << " tokens");
    REQUIRE(cache.length() == start);
    DeviceBuffer<uint16_t> q = slice(q_all, start, count, H, D), k = slice(k_all, start, count, Hkv, D);
    DeviceBuffer<uint16_t> v = slice(v_all, start, count, Hkv, D);
    DeviceBuffer<int32_t> positions(count);
    rope_positions_from_offset(positions.data(), count, cache.length());
    rope_forward(as_bf16(q.data()), as_bf16(k.data()), positions.data(), count, H, Hkv, rope);
    cache.append(layer, as_bf16(k.data()), as_bf16(v.data()), count);
    const int kv_len = cache.length() + count;
    __nv_bfloat16* out = as_bf16(out_two.data() + size_t(start) * q_row);
    if (count == 1) {  // decode: straight from the cache
      decode_attention_forward(out, as_bf16(q.data()), cache.k(layer), cache.v(layer), kv_len, cache.max_context(),
                               H, Hkv, D, &workspace);
    } else {  // prefill chunk: chapter 05 reads token-major K and V
      kv_cache_gather_token_major(as_bf16(k_gathered.data()), as_bf16(v_gathered.data()), cache.k(layer),
                                  cache.v(layer), kv_len, Hkv, D, cache.max_context());
      attention_forward(out, as_bf16(q.data()), as_bf16(k_gathered.data()), as_bf16(v_gathered.data()), count,
                        kv_len, H, Hkv, D);
    }
    cache.commit(count);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<uint16_t> two = out_two.to_host();
  require_close("two-chunk prefill + decode vs golden", two, expected);
  // And against the one-chunk run, row block by row block (both are bf16 outputs).
  std::vector<double> one_as_double(one.size());
  for (size_t i = 0; i < one.size(); ++i) one_as_double[i] = bf16_bits_to_float(one[i]);
  for (auto [start, count] : {std::pair{0, first_chunk}, std::pair{first_chunk, prompt - first_chunk},
                              std::pair{prompt, 1}}) {
    std::vector<uint16_t> part(two.begin() + long(start * q_row), two.begin() + long((start + count) * q_row));
    require_close("rows " + std::to_string(start) + ".." + std::to_string(start + count - 1) + " vs one chunk",
                  part, rows(one_as_double, start, count, q_row));
  }
}
