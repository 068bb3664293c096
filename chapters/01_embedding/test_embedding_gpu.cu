// Chapter 01, GPU: every version against the golden rows (bit-exact), against the CPU
// reference on fresh random inputs, and with invalid ids on each copy path (16-byte
// vectors, C % 8 != 0, pointers off the 16-byte grid). Outputs are poisoned with 0xFF
// bytes (bf16 NaN) first, so an element a kernel forgot to write fails.
#include <string>

#include "catch_compat.hpp"
#include "device_buffer.cuh"
#include "embedding.cuh"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

// Runs one version and returns the output rows as bf16 bits. The table and the output
// start `offset` elements into their allocations: offset 1 puts them 2 bytes off the
// 16-byte grid, so the versions must take their element-by-element path.
std::vector<uint16_t> run_version(const EmbeddingVersion& version, const std::vector<uint16_t>& table_bits,
                                  const std::vector<int32_t>& ids, int T, int C, int V, int* invalid_count_out,
                                  size_t offset = 0) {
  std::vector<uint16_t> shifted(offset, 0);
  shifted.insert(shifted.end(), table_bits.begin(), table_bits.end());
  DeviceBuffer<uint16_t> table(shifted);
  DeviceBuffer<int32_t> token_ids(ids);
  DeviceBuffer<uint16_t> out(size_t(T) * C + offset);
  DeviceBuffer<int> invalid(1);
  out.fill_bytes(0xFF);
  invalid.fill_bytes(0);
  version.launch(reinterpret_cast<__nv_bfloat16*>(out.data()) + offset,
                 reinterpret_cast<const __nv_bfloat16*>(table.data()) + offset, token_ids.data(), T, C, V,
                 invalid.data(), 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  *invalid_count_out = invalid.to_host()[0];
  std::vector<uint16_t> all = out.to_host();
  for (size_t i = 0; i < offset; ++i) REQUIRE(all[i] == 0xFFFF);  // nothing written before the output
  return std::vector<uint16_t>(all.begin() + long(offset), all.end());
}

}  // namespace

TEST_CASE("every embedding version matches the golden rows bit for bit", "[ch01][gpu]") {
  for (const char* name : {"odd", "vec", "bielik"}) {
    NpyArray table = load_npy(golden_path("01_embedding", std::string(name) + "_table.npy"));
    NpyArray ids = load_npy(golden_path("01_embedding", std::string(name) + "_ids.npy"));
    NpyArray expected = load_npy(golden_path("01_embedding", std::string(name) + "_expected.npy"));
    int V = int(table.shape[0]), C = int(table.shape[1]), T = int(ids.shape[0]);
    for (const EmbeddingVersion& version : kEmbeddingVersions) {
      INFO("case " << name << " version " << version.name << " T=" << T << " C=" << C);
      int invalid = -1;
      std::vector<uint16_t> out = run_version(version, table.bf16_bits(), ids.to_int32(), T, C, V, &invalid);
      REQUIRE(invalid == 0);
      REQUIRE(out == expected.bf16_bits());
    }
  }
}

TEST_CASE("every embedding version matches the CPU reference on fresh random inputs", "[ch01][gpu]") {
  uint64_t seed = fresh_seed();
  for (auto [T, C, V] : {std::tuple{1, 8, 3}, std::tuple{33, 1536, 1000}, std::tuple{5, 577, 91}}) {
    INFO("seed " << seed << " T=" << T << " C=" << C << " V=" << V);
    std::vector<uint16_t> table = random_bf16(size_t(V) * C, seed);
    std::vector<int32_t> ids = random_ints(T, seed + 1, 0, V - 1);
    std::vector<float> expected(size_t(T) * C);
    embedding_cpu(expected.data(), bf16_to_float(table).data(), ids.data(), T, C, V);
    for (const EmbeddingVersion& version : kEmbeddingVersions) {
      INFO("version " << version.name);
      int invalid = -1;
      std::vector<uint16_t> out = run_version(version, table, ids, T, C, V, &invalid);
      REQUIRE(invalid == 0);
      REQUIRE(bf16_to_float(out) == expected);
    }
  }
}

TEST_CASE("invalid ids are counted and give zero rows, never out-of-bounds reads", "[ch01][gpu]") {
  // Each copy path checks ids on its own: C = 16 with aligned pointers (16-byte vectors),
  // C = 13 (rows off the 16-byte grid: element copies), and C = 16 with the table and
  // the output one element (2 bytes) into their allocations (the misaligned fallback).
  const int T = 4, V = 10;
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  struct Path {
    const char* name;
    int C;
    size_t offset;
  };
  for (const Path& path : {Path{"16-byte vectors", 16, 0}, Path{"C % 8 != 0", 13, 0}, Path{"misaligned", 16, 1}}) {
    const int C = path.C;
    std::vector<uint16_t> table = random_bf16(size_t(V) * C, seed + C);
    std::vector<int32_t> ids = {3, -7, 10, 9};  // positions 1 and 2 are invalid
    for (const EmbeddingVersion& version : kEmbeddingVersions) {
      INFO("path " << path.name << " version " << version.name);
      int invalid = -1;
      std::vector<uint16_t> out = run_version(version, table, ids, T, C, V, &invalid, path.offset);
      REQUIRE(invalid == 2);
      for (int c = 0; c < C; ++c) {
        REQUIRE(out[0 * C + c] == table[3 * C + c]);
        REQUIRE(bf16_bits_to_float(out[1 * C + c]) == 0.0f);
        REQUIRE(bf16_bits_to_float(out[2 * C + c]) == 0.0f);
        REQUIRE(out[3 * C + c] == table[9 * C + c]);
      }
    }
  }
}
