// Chapter 07, GPU: the cache and every decode attention version against the float64
// golden rows of full-sequence causal attention, token-by-token decoding, a captured
// CUDA graph replayed step after step, the capacity check, and fresh random inputs vs
// the CPU reference.
//
// Poisoning: outputs and every cache position that is not appended are filled with
// 0xFF bytes (bf16 NaN) first, so a kernel that skips an output or reads a key past
// kv_len produces NaN, which never passes.
//
// Tolerance: inputs are exact bf16, the math is fp32, the output is rounded once to
// bf16 (relative error <= 2^-9 per element, ~1.2e-3 in norm). Besides the book-wide
// tolerance::kBf16Output we require kDecodeTolerance, which a kernel that accumulates
// in bf16 or drops the running-max rescale would not meet.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_attention.cuh"
#include "decode_attention_device.cuh"
#include "device_buffer.cuh"
#include "kv_cache.cuh"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

// v6's default hand-over, the splits' partials pushed into block 0 by st.async stores
// counted on an mbarrier there, never finished under racecheck: on an H100 with CUDA
// 13.0 (2026-12-06) the random case's first launch of it made no progress in 229 s at 76
// keys, where the nine launches before it took 0.8 s together, and both cut runs of the
// graph case were inside it. It passes in `make test` and under memcheck, so in our
// reading the tool does not carry the stores' byte counts to the mbarrier, and block 0
// waits forever. Under racecheck the tests leave that one form out; v6's other two
// hand-overs (v6_push_barrier, v6_pull: the same kernel's splits and inbox) still run.
bool racecheck_cannot_run(const DecodeAttentionDeviceLengthVersion& version) {
  if (version.launch != decode_attention_v6_per_head_device_length) return false;
  return leave_out_under_racecheck(version.name, "its st.async hand-over never finished under racecheck "
                                                 "(test_kv_cache_gpu.cu, racecheck_cannot_run)");
}

constexpr double kDecodeTolerance = 3e-3;
constexpr int kMaxSplits = 512;

NpyArray load(const std::string& name) { return load_npy(golden_path("07_kv_cache", name + ".npy")); }

__nv_bfloat16* as_bf16(uint16_t* bits) { return reinterpret_cast<__nv_bfloat16*>(bits); }
const __nv_bfloat16* as_bf16(const uint16_t* bits) { return reinterpret_cast<const __nv_bfloat16*>(bits); }

void require_close(const std::string& label, const std::vector<uint16_t>& actual, const std::vector<double>& expected) {
  CompareResult result = compare_bf16(label, actual, expected, kDecodeTolerance);
  INFO(result.report);
  REQUIRE(result.rel_norm_error <= tolerance::kBf16Output);
  REQUIRE(result.passed);
}
void require_close(const std::string& label, const std::vector<uint16_t>& actual, const std::vector<float>& expected) {
  CompareResult result = compare_bf16(label, actual, expected, kDecodeTolerance);
  INFO(result.report);
  REQUIRE(result.passed);
}

std::vector<double> rows(const std::vector<double>& all, size_t first_row, size_t row_size) {
  return std::vector<double>(all.begin() + long(first_row * row_size), all.begin() + long((first_row + 1) * row_size));
}

// Fills every layer of the cache with 0xFF (NaN): positions never appended stay NaN.
void poison(KvCache& cache) {
  for (int layer = 0; layer < cache.layers(); ++layer) {
    CUDA_CHECK(cudaMemset(cache.k(layer), 0xFF, cache.layer_elements() * 2));
    CUDA_CHECK(cudaMemset(cache.v(layer), 0xFF, cache.layer_elements() * 2));
  }
}

std::vector<uint16_t> layer_bits(const KvCache& cache, int layer, bool keys) {
  std::vector<uint16_t> bits(cache.layer_elements());
  CUDA_CHECK(cudaMemcpy(bits.data(), keys ? cache.k(layer) : cache.v(layer), bits.size() * 2,
                        cudaMemcpyDeviceToHost));
  return bits;
}

// A (T, Hkv, D) sequence on the device; rows(first) points at token `first`.
struct Sequence {
  DeviceBuffer<uint16_t> k, v;
  int Hkv, D;
  Sequence(const std::vector<uint16_t>& k_bits, const std::vector<uint16_t>& v_bits, int Hkv, int D)
      : k(k_bits), v(v_bits), Hkv(Hkv), D(D) {}
  const __nv_bfloat16* k_at(int token) const { return as_bf16(k.data() + size_t(token) * Hkv * D); }
  const __nv_bfloat16* v_at(int token) const { return as_bf16(v.data() + size_t(token) * Hkv * D); }
};

// Runs a host-length version into a poisoned output and returns it.
std::vector<uint16_t> run_version(const DecodeAttentionVersion& version, const DeviceBuffer<uint16_t>& q,
                                  const KvCache& cache, int layer, int kv_len, int H,
                                  DecodeAttentionWorkspace& workspace) {
  DeviceBuffer<uint16_t> out(size_t(H) * cache.head_dim());
  out.fill_bytes(0xFF);
  version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer), kv_len,
                 cache.max_context(), H, cache.kv_heads(), cache.head_dim(), &workspace, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  return out.to_host();
}

}  // namespace

// [racecheck-slow]: every version, split count and graph form at every golden position
// (hundreds of launches) ran over 320 s under racecheck without finishing (H100,
// 2026-12-05); "every decode version matches the CPU reference on fresh random inputs"
// runs every version (at one split count each) on six shapes, and scripts/gpu_sanitize.sh
// leaves this one to memcheck.
TEST_CASE("decode over the cache equals the last row of causal attention (golden)", "[ch07][gpu][racecheck-slow]") {
  for (std::string name : {"bielik_decode", "smollm2_decode"}) {
    NpyArray q_rows = load(name + "_q_rows"), k_file = load(name + "_k"), v_file = load(name + "_v");
    std::vector<int32_t> positions = load(name + "_positions").to_int32();
    std::vector<double> expected = load(name + "_expected").to_double();
    const int H = int(q_rows.shape[1]), D = int(q_rows.shape[2]);
    const int T = int(k_file.shape[0]), Hkv = int(k_file.shape[1]);
    Sequence sequence(k_file.bf16_bits(), v_file.bf16_bits(), Hkv, D);
    std::vector<uint16_t> q_all = q_rows.bf16_bits();
    DecodeAttentionWorkspace workspace(H, D, kMaxSplits);
    const int layer = 1;  // not layer 0: the layer offset is part of what is tested

    for (size_t r = 0; r < positions.size(); ++r) {
      const int kv_len = positions[r] + 1;
      KvCache cache(2, Hkv, D, T + 2);
      poison(cache);
      cache.append(layer, sequence.k_at(0), sequence.v_at(0), kv_len);
      cache.commit(kv_len);
      DeviceBuffer<uint16_t> q(std::vector<uint16_t>(q_all.begin() + long(r * H * D),
                                                     q_all.begin() + long((r + 1) * H * D)));
      std::vector<double> want = rows(expected, r, size_t(H) * D);
      for (const DecodeAttentionVersion& version : kDecodeAttentionVersions) {
        std::string label = name + " " + version.name + " kv_len=" + std::to_string(kv_len);
        require_close(label, run_version(version, q, cache, layer, kv_len, H, workspace), want);
      }
      // Split counts that leave blocks empty, one split, and more splits than keys.
      for (auto [label, with_splits] : {std::pair{"v2", decode_attention_v2_split_k_with_splits},
                                        std::pair{"v3", decode_attention_v3_pipelined_with_splits}}) {
        for (int splits : {1, 3, 7, 64, kMaxSplits}) {
          DeviceBuffer<uint16_t> out(size_t(H) * D);
          out.fill_bytes(0xFF);
          with_splits(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer), kv_len,
                      cache.max_context(), H, Hkv, D, splits, &workspace, 0);
          CUDA_CHECK(cudaDeviceSynchronize());
          require_close(name + " " + label + " splits=" + std::to_string(splits) + " kv_len=" +
                            std::to_string(kv_len),
                        out.to_host(), want);
        }
      }
      // The graph forms, length read from the device (the committed length, 0 new tokens).
      for (const DecodeAttentionDeviceLengthVersion& version : kDecodeAttentionDeviceLengthVersions) {
        if (racecheck_cannot_run(version)) continue;
        DeviceBuffer<uint16_t> out(size_t(H) * D);
        out.fill_bytes(0xFF);
        version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer),
                       cache.device_length(), 0, cache.max_context(), H, Hkv, D, 132, &workspace, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        require_close(name + " " + version.name + " kv_len=" + std::to_string(kv_len), out.to_host(), want);
      }
      // Every graph form at split counts 1, 3, 4, 8 and 16 (v5's and v6's cluster sizes:
      // a single block per head, an odd cluster, and chapter 08's clusters of 4, 8, 16;
      // v5 once failed at a cluster of one).
      for (const DecodeAttentionDeviceLengthVersion& version : kDecodeAttentionDeviceLengthVersions) {
        if (racecheck_cannot_run(version)) continue;
        for (int splits : {1, 3, 4, 8, 16}) {
          DeviceBuffer<uint16_t> out(size_t(H) * D);
          out.fill_bytes(0xFF);
          version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer),
                         cache.device_length(), 0, cache.max_context(), H, Hkv, D, splits, &workspace, 0);
          CUDA_CHECK(cudaDeviceSynchronize());
          require_close(name + " " + version.name + " splits=" + std::to_string(splits) + " kv_len=" +
                            std::to_string(kv_len),
                        out.to_host(), want);
        }
      }
      // The split kernel alone (chapter 08 merges its partials in the O projection): some
      // keys committed, the newest `fresh` ones counted as appended by the kernel before
      // (read after the wait), every split count and least chunk, partials merged here.
      const int fresh = std::min(3, kv_len);
      DeviceBuffer<int> committed(std::vector<int>{kv_len - fresh});
      for (int splits : {1, 7, 32}) {
        for (int min_keys : {1, 16, 64}) {
          INFO(name << " splits-only kv_len=" << kv_len << " splits=" << splits << " min_keys=" << min_keys);
          workspace.partial_acc.fill_bytes(0xFF);  // NaN: an empty split's acc must never be read
          workspace.partial_ml.fill_bytes(0xFF);
          decode_attention_v3_splits_device_length(&workspace, as_bf16(q.data()), cache.k(layer), cache.v(layer),
                                                   committed.data(), fresh, cache.max_context(), H, Hkv, D, splits,
                                                   min_keys, 0);
          CUDA_CHECK(cudaDeviceSynchronize());
          const std::vector<float> acc = workspace.partial_acc.to_host(), ml = workspace.partial_ml.to_host();
          const int used = decode::splits_with_keys(kv_len, splits, min_keys);
          REQUIRE(used >= 1);
          REQUIRE(used <= splits);
          // Splits past the last key are marked empty; the used ones hold a finite state.
          for (int s = 0; s < splits; ++s) {
            for (int h = 0; h < H; ++h) {
              const float m = ml[(size_t(s) * H + h) * 2], l = ml[(size_t(s) * H + h) * 2 + 1];
              if (s < used) {
                REQUIRE(std::isfinite(m));
                REQUIRE(l >= 1.0f);  // the split's own maximum contributes 2^0
              } else {
                REQUIRE(m == -INFINITY);
                REQUIRE(l == 0.0f);
              }
            }
          }
          std::vector<float> merged(size_t(H) * D);
          for (int h = 0; h < H; ++h) {
            double m_max = -INFINITY;
            for (int s = 0; s < used; ++s) m_max = std::max(m_max, double(ml[(size_t(s) * H + h) * 2]));
            for (int d = 0; d < D; ++d) {
              double l_sum = 0, a_sum = 0;
              for (int s = 0; s < used; ++s) {
                const double weight = std::exp2(double(ml[(size_t(s) * H + h) * 2]) - m_max);
                l_sum += double(ml[(size_t(s) * H + h) * 2 + 1]) * weight;
                a_sum += double(acc[(size_t(s) * H + h) * D + d]) * weight;
              }
              merged[size_t(h) * D + d] = float(a_sum / l_sum);
            }
          }
          CompareResult result = compare("splits-only, merged on the CPU", merged, want, kDecodeTolerance);
          INFO(result.report);
          REQUIRE(result.passed);
        }
      }
    }
  }
}

// [racecheck-slow]: a decode at every token of two golden sequences, each through every
// version, did not finish in 175 s under racecheck (H100, 2026-12-05); left to memcheck
// there, like the golden case above.
TEST_CASE("chunked prefill, then token-by-token decode, reproduces every row", "[ch07][gpu][racecheck-slow]") {
  for (std::string name : {"odd_steps", "mha_steps"}) {
    NpyArray q_file = load(name + "_q"), k_file = load(name + "_k"), v_file = load(name + "_v");
    std::vector<double> expected = load(name + "_expected").to_double();
    const int T = int(q_file.shape[0]), H = int(q_file.shape[1]), D = int(q_file.shape[2]);
    const int Hkv = int(k_file.shape[1]);
    Sequence sequence(k_file.bf16_bits(), v_file.bf16_bits(), Hkv, D);
    std::vector<uint16_t> q_all = q_file.bf16_bits();
    DecodeAttentionWorkspace workspace(H, D, kMaxSplits);
    const int layers = 3, prompt = T * 2 / 3, first_chunk = prompt / 2;

    KvCache cache(layers, Hkv, D, T);  // exactly full at the end
    poison(cache);
    for (int chunk_start : {0, first_chunk}) {
      int count = chunk_start == 0 ? first_chunk : prompt - first_chunk;
      for (int layer = 0; layer < layers; ++layer) {
        cache.append(layer, sequence.k_at(chunk_start), sequence.v_at(chunk_start), count);
      }
      cache.commit(count);
    }
    REQUIRE(cache.length() == prompt);

    for (int p = prompt; p < T; ++p) {
      DeviceBuffer<uint16_t> q(std::vector<uint16_t>(q_all.begin() + long(size_t(p) * H * D),
                                                     q_all.begin() + long(size_t(p + 1) * H * D)));
      std::vector<double> want = rows(expected, size_t(p), size_t(H) * D);
      for (int layer = 0; layer < layers; ++layer) {
        cache.append(layer, sequence.k_at(p), sequence.v_at(p), 1);
        const int kv_len = cache.length() + 1;  // this token's key is in, not yet committed
        const DecodeAttentionVersion& version = kDecodeAttentionVersions[layer % std::size(kDecodeAttentionVersions)];
        require_close(name + " " + version.name + " p=" + std::to_string(p) + " layer " + std::to_string(layer),
                      run_version(version, q, cache, layer, kv_len, H, workspace), want);
        for (const DecodeAttentionDeviceLengthVersion& device_version : kDecodeAttentionDeviceLengthVersions) {
          if (racecheck_cannot_run(device_version)) continue;
          DeviceBuffer<uint16_t> out(size_t(H) * D);
          out.fill_bytes(0xFF);
          device_version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(layer), cache.v(layer),
                                cache.device_length(), 1, cache.max_context(), H, Hkv, D, 7, &workspace, 0);
          CUDA_CHECK(cudaDeviceSynchronize());
          require_close(name + " " + device_version.name + " p=" + std::to_string(p), out.to_host(), want);
        }
      }
      cache.commit(1);
    }
    int device_length = -1;
    CUDA_CHECK(cudaMemcpy(&device_length, cache.device_length(), sizeof(int), cudaMemcpyDeviceToHost));
    REQUIRE(cache.length() == T);
    REQUIRE(device_length == T);
    REQUIRE_THROWS_AS(cache.append(0, sequence.k_at(0), sequence.v_at(0), 1), std::length_error);

    // A new conversation reuses the memory: reset, then the same rows again.
    cache.reset();
    CUDA_CHECK(cudaMemcpy(&device_length, cache.device_length(), sizeof(int), cudaMemcpyDeviceToHost));
    REQUIRE(cache.length() == 0);
    REQUIRE(device_length == 0);
    const int p = T / 3;
    cache.append(2, sequence.k_at(0), sequence.v_at(0), p + 1);
    DeviceBuffer<uint16_t> q(std::vector<uint16_t>(q_all.begin() + long(size_t(p) * H * D),
                                                   q_all.begin() + long(size_t(p + 1) * H * D)));
    require_close(name + " after reset p=" + std::to_string(p),
                  run_version(kDecodeAttentionVersions[1], q, cache, 2, p + 1, H, workspace),
                  rows(expected, size_t(p), size_t(H) * D));
  }
}

namespace {

// Captures one decode step of `version` in a CUDA graph: append at *d_length, attention
// over *d_length + 1 keys, *d_length += 1. Nothing about the position is baked in; only
// the inputs' contents change per replay. Replays it token after token.
void check_graph_replay(const DecodeAttentionDeviceLengthVersion& version) {
  INFO(version.name);
  sweep_progress(std::string("graph replay of ") + version.name + ": the prompt, the capture");
  NpyArray q_file = load("odd_steps_q"), k_file = load("odd_steps_k"), v_file = load("odd_steps_v");
  std::vector<double> expected = load("odd_steps_expected").to_double();
  const int T = int(q_file.shape[0]), H = int(q_file.shape[1]), D = int(q_file.shape[2]);
  const int Hkv = int(k_file.shape[1]);
  std::vector<uint16_t> q_all = q_file.bf16_bits(), k_all = k_file.bf16_bits(), v_all = v_file.bf16_bits();
  Sequence sequence(k_all, v_all, Hkv, D);
  DecodeAttentionWorkspace workspace(H, D, kMaxSplits);
  KvCache cache(1, Hkv, D, T);
  poison(cache);
  DeviceBuffer<uint16_t> q(size_t(H) * D), k_step(size_t(Hkv) * D), v_step(size_t(Hkv) * D), out(size_t(H) * D);
  const int splits = version.default_splits(T, H, Hkv, D, kMaxSplits);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The prompt goes in on the same stream: a non-blocking stream is not ordered after the
  // legacy default stream, so an append/commit there could still be running when the
  // first replay reads the device length (seen on the H200 with tests running side by side).
  // The same holds the other way: the cache's length was zeroed, and the cache poisoned,
  // by cudaMemset on the legacy stream, which may return before the memset is done. A
  // zeroing that lands after this stream's commit would read as a prompt of 0 keys. (The
  // H200 run of 2026-12-01 19:34 UTC failed once at the first replay with a finite, wrong
  // output, which that would explain.) So wait for all of it first.
  CUDA_CHECK(cudaDeviceSynchronize());
  // Under racecheck (short sweeps) fewer replays: each one is checked access by access.
  // 40 replays took about 70 s a version there (H100, 2026-12-06), seven versions: 10.
  const int prompt = sweep_size(40, T - 10, "graph replays start after a prompt of");
  cache.append(0, sequence.k_at(0), sequence.v_at(0), prompt, stream);
  cache.commit(prompt, stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  kv_cache_append_at_device_length(cache.k(0), cache.v(0), as_bf16(k_step.data()), as_bf16(v_step.data()),
                                   cache.device_length(), 1, Hkv, D, T, stream);
  version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(0), cache.v(0), cache.device_length(), 1, T, H,
                 Hkv, D, splits, &workspace, stream);
  kv_cache_advance_device_length(cache.device_length(), 1, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  const size_t q_row = size_t(H) * D, kv_row = size_t(Hkv) * D;
  sweep_progress(std::string("graph replay of ") + version.name + ": the replays");
  for (int p = prompt; p < T; ++p) {
    cache.check_room(1);
    CUDA_CHECK(cudaMemcpyAsync(q.data(), q_all.data() + p * q_row, q_row * 2, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(k_step.data(), k_all.data() + p * kv_row, kv_row * 2, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(v_step.data(), v_all.data() + p * kv_row, kv_row * 2, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(out.data(), 0xFF, out.bytes(), stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    cache.commit_host(1);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    require_close("graph step p=" + std::to_string(p), out.to_host(), rows(expected, size_t(p), q_row));
  }
  int device_length = -1;
  CUDA_CHECK(cudaMemcpy(&device_length, cache.device_length(), sizeof(int), cudaMemcpyDeviceToHost));
  REQUIRE(device_length == T);
  REQUIRE(cache.length() == T);
  REQUIRE_THROWS_AS(cache.check_room(1), std::length_error);

  // One replay too many: the host check was skipped on purpose; the device guard must
  // write nothing (the cache is exactly full, so any write would land out of bounds).
  std::vector<uint16_t> k_before = layer_bits(cache, 0, true), v_before = layer_bits(cache, 0, false);
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  REQUIRE(layer_bits(cache, 0, true) == k_before);
  REQUIRE(layer_bits(cache, 0, false) == v_before);

  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("a captured decode-step graph replays correctly as the cache grows", "[ch07][gpu]") {
  for (const DecodeAttentionDeviceLengthVersion& version : kDecodeAttentionDeviceLengthVersions) {
    if (racecheck_cannot_run(version)) continue;
    check_graph_replay(version);
  }
}

TEST_CASE("appending in two chunks equals appending in one, and matches the CPU append", "[ch07][gpu]") {
  NpyArray k_file = load("bielik_decode_k"), v_file = load("bielik_decode_v");
  const int T = int(k_file.shape[0]), Hkv = int(k_file.shape[1]), D = int(k_file.shape[2]);
  Sequence sequence(k_file.bf16_bits(), v_file.bf16_bits(), Hkv, D);
  const int max_context = T + 5;
  KvCache one(1, Hkv, D, max_context), two(1, Hkv, D, max_context), device_form(1, Hkv, D, max_context);
  poison(one);
  poison(two);
  poison(device_form);
  one.append(0, sequence.k_at(0), sequence.v_at(0), T);
  two.append(0, sequence.k_at(0), sequence.v_at(0), 1000);
  two.commit(1000);
  two.append(0, sequence.k_at(1000), sequence.v_at(1000), T - 1000);
  // The graph form in three pieces, the position read from the device each time.
  for (auto [first, count] : {std::pair{0, 1}, std::pair{1, 2048}, std::pair{2049, T - 2049}}) {
    kv_cache_append_at_device_length(device_form.k(0), device_form.v(0), sequence.k_at(first),
                                     sequence.v_at(first), device_form.device_length(), count, Hkv, D, max_context);
    device_form.commit(count);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  // Expected: the CPU append of the same bits into a NaN-poisoned (0xFFFF) cache.
  std::vector<float> k_cpu(one.layer_elements()), v_cpu(one.layer_elements());
  std::vector<float> nan_fill = bf16_to_float(std::vector<uint16_t>(1, 0xFFFF));
  std::fill(k_cpu.begin(), k_cpu.end(), nan_fill[0]);
  std::fill(v_cpu.begin(), v_cpu.end(), nan_fill[0]);
  kv_cache_append_cpu(k_cpu.data(), v_cpu.data(), k_file.to_float().data(), v_file.to_float().data(), 0, T, Hkv,
                      D, max_context);
  std::vector<uint16_t> k_expected = float_to_bf16(k_cpu), v_expected = float_to_bf16(v_cpu);
  for (KvCache* cache : {&one, &two, &device_form}) {
    std::vector<uint16_t> k_bits = layer_bits(*cache, 0, true), v_bits = layer_bits(*cache, 0, false);
    // float_to_bf16 turns the NaN back into a quiet NaN pattern; compare the written
    // positions exactly and check the tail is still the 0xFFFF poison.
    for (int g = 0; g < Hkv; ++g) {
      size_t head = size_t(g) * max_context * D;
      REQUIRE(std::memcmp(k_bits.data() + head, k_expected.data() + head, size_t(T) * D * 2) == 0);
      REQUIRE(std::memcmp(v_bits.data() + head, v_expected.data() + head, size_t(T) * D * 2) == 0);
      for (size_t i = head + size_t(T) * D; i < head + size_t(max_context) * D; ++i) {
        REQUIRE(k_bits[i] == 0xFFFF);
        REQUIRE(v_bits[i] == 0xFFFF);
      }
    }
  }
}

TEST_CASE("a full cache refuses the append on the host and writes nothing", "[ch07][gpu]") {
  const int Hkv = 2, D = 128, max_context = 10;
  KvCache cache(2, Hkv, D, max_context);
  poison(cache);
  std::vector<uint16_t> k_host = random_bf16(size_t(8) * Hkv * D, fresh_seed());
  Sequence sequence(k_host, k_host, Hkv, D);
  cache.append(1, sequence.k_at(0), sequence.v_at(0), 8);
  cache.commit(8);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> k0 = layer_bits(cache, 0, true), k1 = layer_bits(cache, 1, true);
  std::vector<uint16_t> v0 = layer_bits(cache, 0, false), v1 = layer_bits(cache, 1, false);
  try {
    cache.append(1, sequence.k_at(0), sequence.v_at(0), 3);
    FAIL("no exception for 8 + 3 > 10");
  } catch (const std::length_error& error) {
    REQUIRE(std::string(error.what()) == "KV cache full: 8 + 3 tokens exceed max_context 10");
  }
  REQUIRE_THROWS_AS(cache.commit(3), std::length_error);
  REQUIRE(cache.length() == 8);
  // The device guard on its own: the graph form asked for 3 more tokens at length 8.
  kv_cache_append_at_device_length(cache.k(1), cache.v(1), sequence.k_at(0), sequence.v_at(0),
                                   cache.device_length(), 3, Hkv, D, max_context);
  CUDA_CHECK(cudaDeviceSynchronize());
  REQUIRE(layer_bits(cache, 0, true) == k0);
  REQUIRE(layer_bits(cache, 1, true) == k1);
  REQUIRE(layer_bits(cache, 0, false) == v0);
  REQUIRE(layer_bits(cache, 1, false) == v1);
  // The free function with a host position checks the same way, before any launch,
  // and refuses negative sizes in both forms.
  try {
    kv_cache_append(cache.k(1), cache.v(1), sequence.k_at(0), sequence.v_at(0), 8, 3, Hkv, D, max_context);
    FAIL("kv_cache_append: no exception for 8 + 3 > 10");
  } catch (const std::length_error& error) {
    REQUIRE(std::string(error.what()) == "KV cache full: 8 + 3 tokens exceed max_context 10");
  }
  REQUIRE_THROWS_AS(
      kv_cache_append(cache.k(1), cache.v(1), sequence.k_at(0), sequence.v_at(0), -1, 1, Hkv, D, max_context),
      std::invalid_argument);  // position
  REQUIRE_THROWS_AS(
      kv_cache_append(cache.k(1), cache.v(1), sequence.k_at(0), sequence.v_at(0), 0, -1, Hkv, D, max_context),
      std::invalid_argument);  // T_new
  REQUIRE_THROWS_AS(
      kv_cache_append(cache.k(1), cache.v(1), sequence.k_at(0), sequence.v_at(0), 0, 1, 0, D, max_context),
      std::invalid_argument);  // Hkv
  REQUIRE_THROWS_AS(kv_cache_append_at_device_length(cache.k(1), cache.v(1), sequence.k_at(0), sequence.v_at(0),
                                                     cache.device_length(), -1, Hkv, D, max_context),
                    std::invalid_argument);  // T_new
  REQUIRE_THROWS_AS(kv_cache_append_at_device_length(cache.k(1), cache.v(1), sequence.k_at(0), sequence.v_at(0),
                                                     cache.device_length(), 1, 0, D, max_context),
                    std::invalid_argument);  // Hkv
  CUDA_CHECK(cudaDeviceSynchronize());
  REQUIRE(layer_bits(cache, 1, true) == k1);
  REQUIRE(layer_bits(cache, 1, false) == v1);
  // Two more fit exactly.
  REQUIRE_NOTHROW(cache.append(1, sequence.k_at(0), sequence.v_at(0), 2));
  REQUIRE_NOTHROW(cache.commit(2));
  REQUIRE(cache.length() == max_context);
}

TEST_CASE("every decode version matches the CPU reference on fresh random inputs", "[ch07][gpu]") {
  uint64_t seed = fresh_seed();
  // Under racecheck (short sweeps) shorter caches: at most 700 keys did not get past the
  // first shape (Bielik's, 300 keys) in 480 s there (H100, 2026-12-06). 160 keys still
  // give the split kernels up to 10 splits of 16 keys, so every merge of partials runs.
  std::vector<int32_t> lengths = random_ints(6, seed, 1, sweep_size(3000, 160, "random caches hold at most"));
  // (H, Hkv, D): Bielik, SmolLM2, and groups of 1, 5, 7, 8.
  const std::tuple<int, int, int> shapes[] = {{12, 2, 128}, {9, 3, 64}, {4, 4, 64}, {10, 2, 128},
                                              {7, 1, 64},   {16, 2, 128}};
  for (size_t c = 0; c < std::size(shapes); ++c) {
    auto [H, Hkv, D] = shapes[c];
    const int kv_len = lengths[c], max_context = kv_len + int(c) * 13;
    INFO("seed " << seed << " H=" << H << " Hkv=" << Hkv << " D=" << D << " kv_len=" << kv_len);
    std::vector<uint16_t> q_bits = random_bf16(size_t(H) * D, seed + 10 * c + 1, 2.0f);
    std::vector<uint16_t> k_bits = random_bf16(size_t(kv_len) * Hkv * D, seed + 10 * c + 2);
    std::vector<uint16_t> v_bits = random_bf16(size_t(kv_len) * Hkv * D, seed + 10 * c + 3);
    // CPU: append then decode.
    std::vector<float> k_cpu(size_t(Hkv) * max_context * D, NAN), v_cpu = k_cpu, expected(size_t(H) * D);
    kv_cache_append_cpu(k_cpu.data(), v_cpu.data(), bf16_to_float(k_bits).data(), bf16_to_float(v_bits).data(), 0,
                        kv_len, Hkv, D, max_context);
    decode_attention_cpu(expected.data(), bf16_to_float(q_bits).data(), k_cpu.data(), v_cpu.data(), kv_len,
                         max_context, H, Hkv, D);
    // GPU.
    KvCache cache(1, Hkv, D, max_context);
    poison(cache);
    Sequence sequence(k_bits, v_bits, Hkv, D);
    cache.append(0, sequence.k_at(0), sequence.v_at(0), kv_len);
    cache.commit(kv_len);
    DeviceBuffer<uint16_t> q(q_bits);
    DecodeAttentionWorkspace workspace(H, D, kMaxSplits);
    const std::string shape = " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
                              " kv_len=" + std::to_string(kv_len);
    for (const DecodeAttentionVersion& version : kDecodeAttentionVersions) {
      sweep_progress(version.name + shape);
      require_close(version.name, run_version(version, q, cache, 0, kv_len, H, workspace), expected);
    }
    for (const DecodeAttentionDeviceLengthVersion& version : kDecodeAttentionDeviceLengthVersions) {
      if (racecheck_cannot_run(version)) continue;
      sweep_progress(version.name + shape);
      DeviceBuffer<uint16_t> out(size_t(H) * D);
      out.fill_bytes(0xFF);
      version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(0), cache.v(0), cache.device_length(), 0,
                     max_context, H, Hkv, D, 100, &workspace, 0);
      CUDA_CHECK(cudaDeviceSynchronize());
      require_close(version.name, out.to_host(), expected);
    }
  }
}

TEST_CASE("decode launchers reject shapes they were not compiled for", "[ch07][gpu]") {
  KvCache cache(1, 2, 128, 16);
  DeviceBuffer<uint16_t> q(12 * 128), out(12 * 128);
  DecodeAttentionWorkspace workspace(12, 128, 4);
  for (const DecodeAttentionVersion& version : kDecodeAttentionVersions) {
    INFO(version.name);
    auto launch = [&](int kv_len, int H, int Hkv, int D) {
      version.launch(as_bf16(out.data()), as_bf16(q.data()), cache.k(0), cache.v(0), kv_len, 16, H, Hkv, D,
                     &workspace, 0);
    };
    REQUIRE_THROWS_AS(launch(0, 12, 2, 128), std::invalid_argument);
    REQUIRE_THROWS_AS(launch(17, 12, 2, 128), std::invalid_argument);
    REQUIRE_THROWS_AS(launch(5, 12, 2, 96), std::invalid_argument);
    REQUIRE_THROWS_AS(launch(5, 18, 2, 128), std::invalid_argument);  // G = 9
  }
  DecodeAttentionWorkspace small(6, 128, 4);
  REQUIRE_THROWS_AS(decode_attention_v2_split_k(as_bf16(out.data()), as_bf16(q.data()), cache.k(0), cache.v(0), 5,
                                                16, 12, 2, 128, &small),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_v2_split_k_with_splits(as_bf16(out.data()), as_bf16(q.data()), cache.k(0),
                                                            cache.v(0), 5, 16, 12, 2, 128, 5, &workspace),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(decode_attention_v3_pipelined_with_splits(as_bf16(out.data()), as_bf16(q.data()), cache.k(0),
                                                              cache.v(0), 5, 16, 12, 2, 128, 5, &workspace),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(KvCache(1, 2, 100, 16), std::invalid_argument);
  REQUIRE_THROWS_AS(cache.k(1), std::out_of_range);
}
