// Chapter 05, GPU: every version against the float64 golden outputs (the ratio rule),
// against the CPU reference on fresh random inputs, and two structural tests that do not
// depend on tolerances: the future must not leak (bit-identical rows when future keys
// change) and each query head must read its own kv group. Outputs are poisoned with
// 0xFF bytes (bf16 NaN) first, so an element a kernel forgot to write fails.
//
// The ratio rule: v1 computes everything in fp32 and rounds once, so its error is what
// bf16 inputs and a bf16 output cost. It must pass the book-wide bf16 tolerance; every
// other version may have at most twice v1's error plus 1e-3 (v3 rounds P to bf16).
#include <cmath>
#include <cstdio>
#include <string>

#include "attention.cuh"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "device_buffer.cuh"
#include "npy.hpp"
#include "pdl.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

struct Shape {
  int Tq, Tkv, H, Hkv, D;
};

std::vector<uint16_t> run_version(const AttentionVersion& version, const std::vector<uint16_t>& q_bits,
                                  const std::vector<uint16_t>& k_bits, const std::vector<uint16_t>& v_bits,
                                  const Shape& s) {
  DeviceBuffer<uint16_t> q(q_bits), k(k_bits), v(v_bits), out(size_t(s.Tq) * s.H * s.D);
  DeviceBuffer<float> workspace(version.workspace_floats ? version.workspace_floats(s.Tq, s.Tkv, s.H) : 0);
  out.fill_bytes(0xFF);
  version.launch(reinterpret_cast<__nv_bfloat16*>(out.data()), reinterpret_cast<const __nv_bfloat16*>(q.data()),
                 reinterpret_cast<const __nv_bfloat16*>(k.data()), reinterpret_cast<const __nv_bfloat16*>(v.data()),
                 s.Tq, s.Tkv, s.H, s.Hkv, s.D, workspace.data(), 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  return out.to_host();
}

// False (with a note in the log) for a version this GPU cannot run at head dim D.
bool runs_here(const AttentionVersion& version, int D) {
  if (version.supported == nullptr || version.supported(D)) return true;
  std::printf("note: %s skipped at D=%d: not supported on this GPU\n", version.name, D);
  return false;
}

// Runs every version and applies the ratio rule against `expected`.
void check_all_versions(const std::string& label, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                        const std::vector<uint16_t>& v, const Shape& s, const std::vector<double>& expected) {
  double v1_error = -1;
  for (const AttentionVersion& version : kAttentionVersions) {
    if (!runs_here(version, s.D)) continue;
    std::vector<uint16_t> out = run_version(version, q, k, v, s);
    double allowed = v1_error < 0 ? tolerance::kBf16Output : 2 * v1_error + 1e-3;
    CompareResult result = compare_bf16(label + " " + version.name, out, expected, allowed);
    INFO(result.report << "\n  (Tq=" << s.Tq << " Tkv=" << s.Tkv << " H=" << s.H << " Hkv=" << s.Hkv
                       << " D=" << s.D << ")");
    REQUIRE(result.passed);
    if (v1_error < 0) v1_error = result.rel_norm_error;  // kAttentionVersions[0] is v1
  }
}

NpyArray load(const std::string& name, const std::string& tensor) {
  return load_npy(golden_path("05_flash_attention", name + "_" + tensor + ".npy"));
}

}  // namespace

TEST_CASE("every attention version matches the float64 golden outputs (ratio rule)", "[ch05][gpu]") {
  REQUIRE(std::string(kAttentionVersions[0].name) == "v1_naive");
  for (const char* name : {"t1", "t7", "t100", "t513", "t2048", "smollm2_t37", "smollm2_t301", "q5_kv37",
                           "q1_kv300", "q70_kv333_d64", "mqa_t65", "mha_t33", "sharp_t129"}) {
    NpyArray q = load(name, "q"), k = load(name, "k"), v = load(name, "v");
    Shape s{int(q.shape[0]), int(k.shape[0]), int(q.shape[1]), int(k.shape[1]), int(q.shape[2])};
    check_all_versions(name, q.bf16_bits(), k.bf16_bits(), v.bf16_bits(), s, load(name, "expected").to_double());
  }
}

TEST_CASE("every attention version matches the CPU reference on fresh random inputs", "[ch05][gpu]") {
  uint64_t seed = fresh_seed();
  // Tile edges (64, 65), queries over a longer context, each head grouping, both D; and
  // q scaled by 40 (scores up to ~170, far past 88.7 where exp() overflows fp32): only
  // a kernel that subtracts the running max passes that one.
  for (auto [s, q_scale] : {std::pair{Shape{1, 1, 12, 2, 128}, 1.0f}, std::pair{Shape{17, 17, 9, 3, 64}, 1.0f},
                            std::pair{Shape{3, 130, 12, 2, 128}, 1.0f}, std::pair{Shape{64, 64, 4, 2, 64}, 1.0f},
                            std::pair{Shape{65, 200, 6, 3, 128}, 1.0f}, std::pair{Shape{129, 129, 2, 1, 64}, 1.0f},
                            std::pair{Shape{100, 100, 12, 2, 128}, 40.0f}}) {
    INFO("seed " << seed << " q scale " << q_scale);
    std::vector<uint16_t> q = random_bf16(size_t(s.Tq) * s.H * s.D, seed, q_scale);
    std::vector<uint16_t> k = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 1);
    std::vector<uint16_t> v = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 2);
    std::vector<float> expected(size_t(s.Tq) * s.H * s.D);
    attention_cpu(expected.data(), bf16_to_float(q).data(), bf16_to_float(k).data(), bf16_to_float(v).data(), s.Tq,
                  s.Tkv, s.H, s.Hkv, s.D);
    check_all_versions("fresh", q, k, v, s, std::vector<double>(expected.begin(), expected.end()));
  }
}

TEST_CASE("the future never leaks: changing future keys leaves earlier rows bit-identical", "[ch05][gpu]") {
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  // (shape, first changed key). Query i sees keys <= Tkv - Tq + i, so rows with
  // Tkv - Tq + i < cut must not move at all, and the others must.
  for (auto [s, cut] : {std::pair{Shape{150, 150, 12, 2, 128}, 77}, std::pair{Shape{40, 150, 9, 3, 64}, 130},
                        std::pair{Shape{130, 130, 2, 1, 128}, 64}}) {
    std::vector<uint16_t> q = random_bf16(size_t(s.Tq) * s.H * s.D, seed);
    std::vector<uint16_t> k = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 1);
    std::vector<uint16_t> v = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 2);
    std::vector<uint16_t> k_changed = k, v_changed = v;
    for (size_t e = size_t(cut) * s.Hkv * s.D; e < k.size(); ++e) {
      k_changed[e] = float_to_bf16_bits(3.0f);    // large scores if they were ever seen
      v_changed[e] = float_to_bf16_bits(1000.0f);  // and a huge contribution
    }
    const size_t row_elements = size_t(s.H) * s.D;
    const int unaffected_rows = cut - (s.Tkv - s.Tq);  // rows 0 .. unaffected_rows-1
    for (const AttentionVersion& version : kAttentionVersions) {
      if (!runs_here(version, s.D)) continue;
      INFO("version " << version.name << " Tq=" << s.Tq << " Tkv=" << s.Tkv << " cut=" << cut);
      std::vector<uint16_t> before = run_version(version, q, k, v, s);
      std::vector<uint16_t> after = run_version(version, q, k_changed, v_changed, s);
      size_t boundary = size_t(unaffected_rows) * row_elements;
      REQUIRE(std::equal(before.begin(), before.begin() + boundary, after.begin()));
      REQUIRE_FALSE(std::equal(before.begin() + boundary, before.end(), after.begin() + boundary));
    }
  }
}

TEST_CASE("query head h reads kv head h / (H / Hkv)", "[ch05][gpu]") {
  // Every value row of kv head g is the constant g + 1, so whatever the softmax weights,
  // query head h must output h / (H / Hkv) + 1 everywhere. h % Hkv would not.
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  for (Shape s : {Shape{70, 70, 12, 2, 128}, Shape{33, 90, 9, 3, 64}, Shape{5, 5, 6, 6, 64}}) {
    std::vector<uint16_t> q = random_bf16(size_t(s.Tq) * s.H * s.D, seed);
    std::vector<uint16_t> k = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 1);
    std::vector<uint16_t> v(size_t(s.Tkv) * s.Hkv * s.D);
    for (size_t e = 0; e < v.size(); ++e) v[e] = float_to_bf16_bits(float((e / s.D) % s.Hkv + 1));
    for (const AttentionVersion& version : kAttentionVersions) {
      if (!runs_here(version, s.D)) continue;
      INFO("version " << version.name << " H=" << s.H << " Hkv=" << s.Hkv);
      std::vector<float> out = bf16_to_float(run_version(version, q, k, v, s));
      int wrong = 0;
      for (size_t e = 0; e < out.size(); ++e) {
        float want = float((e / s.D) % s.H / (s.H / s.Hkv) + 1);
        if (!(std::fabs(out[e] - want) <= 0.02f * want)) ++wrong;
      }
      REQUIRE(wrong == 0);
    }
  }
}

TEST_CASE("attention launchers reject shapes they do not support", "[ch05][gpu]") {
  DeviceBuffer<uint16_t> buffer(4096);
  DeviceBuffer<float> workspace(4096);
  auto* data = reinterpret_cast<__nv_bfloat16*>(buffer.data());
  for (const AttentionVersion& version : kAttentionVersions) {
    INFO("version " << version.name);
    REQUIRE_THROWS_AS(version.launch(data, data, data, data, 3, 2, 1, 1, 64, workspace.data(), 0),
                      std::invalid_argument);  // Tq > Tkv
    REQUIRE_THROWS_AS(version.launch(data, data, data, data, 1, 1, 3, 2, 64, workspace.data(), 0),
                      std::invalid_argument);  // H % Hkv
    REQUIRE_THROWS_AS(version.launch(data, data, data, data, 1, 1, 1, 1, 96, workspace.data(), 0),
                      std::invalid_argument);  // D
    // v2 reads v and writes out as bf16 pairs (4 bytes), v3-v6 copy 16-byte chunks: a
    // pointer 2 bytes off must be refused, not fault on the GPU. v1 reads single bf16.
    if (std::string(version.name) == "v1_naive") continue;
    REQUIRE_THROWS_AS(version.launch(data, data, data, data + 1, 1, 1, 1, 1, 64, workspace.data(), 0),
                      std::invalid_argument);  // v misaligned
    REQUIRE_THROWS_AS(version.launch(data + 1, data, data, data, 1, 1, 1, 1, 64, workspace.data(), 0),
                      std::invalid_argument);  // out misaligned
  }
}

TEST_CASE("v6 at every cluster size: matches the CPU reference, the same bits with PDL and run to run",
          "[ch05][gpu]") {
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  // Odd sizes and a longer context. S = 3 leaves the last rank a short chunk; at S = 8
  // light query blocks have ranks with no tile at all (the empty state) and ranks that
  // finish no rows (4 warps, 8 ranks); 0 is the automatic choice.
  for (Shape s : {Shape{130, 130, 12, 2, 128}, Shape{65, 200, 6, 3, 128}, Shape{200, 333, 9, 3, 64},
                  Shape{513, 513, 12, 2, 128}, Shape{1, 300, 12, 2, 128}}) {
    std::vector<uint16_t> q = random_bf16(size_t(s.Tq) * s.H * s.D, seed);
    std::vector<uint16_t> k = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 1);
    std::vector<uint16_t> v = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 2);
    std::vector<float> expected(size_t(s.Tq) * s.H * s.D);
    attention_cpu(expected.data(), bf16_to_float(q).data(), bf16_to_float(k).data(), bf16_to_float(v).data(), s.Tq,
                  s.Tkv, s.H, s.Hkv, s.D);
    const std::vector<double> expected_d(expected.begin(), expected.end());
    const double v1_error =
        compare_bf16("v1", run_version(kAttentionVersions[0], q, k, v, s), expected_d, tolerance::kBf16Output)
            .rel_norm_error;
    DeviceBuffer<uint16_t> dq(q), dk(k), dv(v), out(size_t(s.Tq) * s.H * s.D);
    for (int splits : {1, 2, 3, 8, 0}) {
      if (splits > 1 && !device_is_sm90_or_newer()) continue;  // clusters need sm_90 (the launcher refuses)
      INFO("Tq=" << s.Tq << " Tkv=" << s.Tkv << " H=" << s.H << " D=" << s.D << " splits " << splits);
      std::vector<uint16_t> first;
      for (int run = 0; run < 3; ++run) {
        const bool pdl = run == 2;
        out.fill_bytes(0xFF);
        attention_v6_cluster_split_keys_with(reinterpret_cast<__nv_bfloat16*>(out.data()),
                                             reinterpret_cast<const __nv_bfloat16*>(dq.data()),
                                             reinterpret_cast<const __nv_bfloat16*>(dk.data()),
                                             reinterpret_cast<const __nv_bfloat16*>(dv.data()), s.Tq, s.Tkv, s.H,
                                             s.Hkv, s.D, 0, pdl, splits);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> result = out.to_host();
        if (run == 0) {
          CompareResult r = compare_bf16("v6", result, expected_d, 2 * v1_error + 1e-3);
          INFO(r.report);
          REQUIRE(r.passed);
          first = result;
        } else {
          INFO("run " << run << (pdl ? " (PDL)" : ""));
          REQUIRE(result == first);  // the merge order is the rank order, whatever the timing
        }
      }
    }
  }
}

TEST_CASE("v6 chooses its cluster size from the grid and rejects sizes it cannot launch", "[ch05][gpu]") {
  // The documented rule, re-derived here: S is the largest of 1, 2, 4, 8 with S <= the
  // heaviest query block's key tiles and (query blocks x H x S) blocks resident at once;
  // 1 before sm_90. At D = 128 a v6 block takes 87040 bytes of shared memory (a 64-row Q
  // tile and two stages of 64-row K and V tiles, rows of 128 + 8 bf16), so an SM holds
  // as many as its shared memory fits: 2 on sm_90 (228 KB), 264 on an H100/H200.
  int device = 0, sms = 0, smem_per_sm = 0, smem_reserved = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  const int resident = sms * (smem_per_sm / (87040 + smem_reserved));
  auto expected_splits = [&](int blocks, int heaviest_tiles) {
    int splits = 1;
    while (device_is_sm90_or_newer() && splits < 8 && 2 * splits <= heaviest_tiles && blocks * 2 * splits <= resident) {
      splits *= 2;
    }
    return splits;
  };
  INFO(sms << " SMs, " << resident << " v6 blocks resident");
  // T = 512 at Bielik's heads: 8 query blocks x 12 heads = 96 blocks, the heaviest with
  // 8 tiles: S = 2 on an H100/H200 (192 of 264 blocks; 4 would need 384).
  const int at_512 = attention_v6_default_splits(512, 512, 12, 128);
  REQUIRE(at_512 == expected_splits(96, 8));
  if (device_is_sm90_or_newer() && sms == 132) REQUIRE(at_512 == 2);
  REQUIRE(attention_v6_grid_rows(512, 512, 12, 128, 0) == 8 * at_512);
  // One query block of 1 tile: nothing to split.
  REQUIRE(attention_v6_default_splits(64, 64, 12, 128) == 1);
  // Decode over 4096 keys: 12 blocks of 64 tiles each: S = 8 (96 blocks) on sm_90.
  REQUIRE(attention_v6_default_splits(1, 4096, 12, 128) == expected_splits(12, 64));
  if (device_is_sm90_or_newer() && sms == 132) REQUIRE(attention_v6_default_splits(1, 4096, 12, 128) == 8);
  DeviceBuffer<uint16_t> buffer(size_t(130) * 12 * 128);
  auto* data = reinterpret_cast<__nv_bfloat16*>(buffer.data());
  REQUIRE_THROWS_AS(attention_v6_cluster_split_keys_with(data, data, data, data, 130, 130, 12, 2, 128, 0, false, 9),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(attention_v6_cluster_split_keys_with(data, data, data, data, 130, 130, 12, 2, 128, 0, false, -1),
                    std::invalid_argument);
}

TEST_CASE("attention_forward is the fastest version this GPU supports, bit for bit", "[ch05][gpu]") {
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  for (Shape s : {Shape{100, 100, 12, 2, 128}, Shape{37, 37, 9, 3, 64}}) {
    std::vector<uint16_t> q = random_bf16(size_t(s.Tq) * s.H * s.D, seed);
    std::vector<uint16_t> k = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 1);
    std::vector<uint16_t> v = random_bf16(size_t(s.Tkv) * s.Hkv * s.D, seed + 2);
    DeviceBuffer<uint16_t> dq(q), dk(k), dv(v), out(size_t(s.Tq) * s.H * s.D);
    REQUIRE(std::string(kAttentionVersions[2].name) == "v3_flash_mma");
    REQUIRE(std::string(kAttentionVersions[4].name) == "v5_flash_split_keys");
    const AttentionVersion& chosen = attention_v5_supported(s.D) ? kAttentionVersions[4] : kAttentionVersions[2];
    INFO("expected dispatch to " << chosen.name << " at D=" << s.D);
    const std::vector<uint16_t> expected = run_version(chosen, q, k, v, s);
    for (bool pdl : {false, true}) {  // chapter 08's prefill launches it with PDL
      INFO("pdl " << pdl);
      out.fill_bytes(0xFF);
      attention_forward(reinterpret_cast<__nv_bfloat16*>(out.data()),
                        reinterpret_cast<const __nv_bfloat16*>(dq.data()),
                        reinterpret_cast<const __nv_bfloat16*>(dk.data()),
                        reinterpret_cast<const __nv_bfloat16*>(dv.data()), s.Tq, s.Tkv, s.H, s.Hkv, s.D, 0, pdl);
      CUDA_CHECK(cudaDeviceSynchronize());
      REQUIRE(out.to_host() == expected);
    }
  }
}
