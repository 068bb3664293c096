// Chapter 01, CPU: the reference against the golden files, and its error path.
#include <stdexcept>

#include "catch_compat.hpp"
#include "embedding.cuh"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

TEST_CASE("embedding_cpu matches golden rows exactly", "[ch01][cpu]") {
  for (const char* name : {"odd", "vec", "bielik"}) {
    NpyArray table = load_npy(golden_path("01_embedding", std::string(name) + "_table.npy"));
    NpyArray ids = load_npy(golden_path("01_embedding", std::string(name) + "_ids.npy"));
    NpyArray expected = load_npy(golden_path("01_embedding", std::string(name) + "_expected.npy"));
    int V = int(table.shape[0]), C = int(table.shape[1]), T = int(ids.shape[0]);
    expected.require_shape({size_t(T), size_t(C)});

    std::vector<float> out(size_t(T) * C, -12345.0f);
    std::vector<int32_t> token_ids = ids.to_int32();
    embedding_cpu(out.data(), table.to_float().data(), token_ids.data(), T, C, V);
    INFO("case " << name << " T=" << T << " C=" << C << " V=" << V);
    REQUIRE(out == expected.to_float());  // a copy: bit-exact
  }
}

TEST_CASE("embedding_cpu rejects ids outside the vocabulary", "[ch01][cpu]") {
  std::vector<float> table(4 * 3, 1.0f), out(2 * 3);
  for (int32_t bad : {-1, 4, 1 << 30}) {
    std::vector<int32_t> ids = {0, bad};
    REQUIRE_THROWS_AS(embedding_cpu(out.data(), table.data(), ids.data(), 2, 3, 4), std::out_of_range);
  }
}
