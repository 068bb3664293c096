// Chapter 08, the CUDA backend end to end, against the CPU backend (CpuModel, itself
// checked against the float64 numpy forward in test_model_cpu.cpp).
//
// The golden tiny models have head_dim 16, which chapters 05 and 07's attention kernels
// are not compiled for (D = 64 or 128): the backend refuses them at load (a CPU test,
// test_model_cuda_refusals.cu). For the numerics, this test writes its own tiny
// Bielik-like checkpoints with D = 64 and D = 128 (biases everywhere + GQA + untied head;
// no biases + tied head + 6 query heads per kv head, like Bielik's grouping), with odd
// vocabularies and hidden sizes that are not tile multiples.
//
// Tolerance: the CUDA path stores every activation in bf16 (as HuggingFace does in
// bf16), the CPU path keeps fp32; after 2-3 layers the logits differ by ~0.3-1% in
// relative norm. 2e-2 per row is the bound; the worst value seen is printed.
//
// The same test program, test_ch08_model_cuda, also runs the kernels' own cases against
// CPU references: test_decode_gemv_gpu.cu, test_decode_attention_o_gpu.cu,
// test_decode_kernels_gpu.cu and test_gpu_sample.cu (tagged [kernels]; this file's cases
// are [model]).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bf16.hpp"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "decode_kernels.cuh"
#include "decode_persistent.cuh"
#include "device_buffer.cuh"
#include "fold_norm_weight.cuh"
#include "model_config.hpp"
#include "model_cpu.hpp"
#include "model_cuda.hpp"
#include "matmul.cuh"         // chapter 03: v6 for short prefills
#include "matmul_common.cuh"  // chapter 03: multiprocessor_count
#include "sampler.hpp"
#include "test_checkpoint_edit.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

constexpr double kModelTolerance = 2e-2;

struct TinySpec {
  const char* name;
  int C, H, Hkv, D, F, L, V;
  double theta, eps;
  bool bias, tied;
  int max_pos;
  uint64_t seed;
};

const TinySpec kSpecs[] = {
    // Bielik's features: biases on all seven projections, GQA (2 query heads per kv
    // head), untied head; C = 200 and F = 344 are not multiples of any tile.
    {"bielik_d64", 200, 4, 2, 64, 344, 2, 1003, 1e6, 1e-6, true, false, 320, 811},
    // SmolLM2's features with Bielik's head shape: no biases, tied head, D = 128 and
    // H / Hkv = 6 as in Bielik (12 / 2).
    {"smollm_d128", 192, 6, 1, 128, 256, 3, 515, 1e5, 1e-5, false, true, 160, 812},
};

EditableTensor bf16_tensor(std::vector<int64_t> shape, std::mt19937_64& engine, double scale, double offset = 0) {
  size_t count = 1;
  for (int64_t d : shape) count *= size_t(d);
  std::normal_distribution<double> normal(0.0, 1.0);
  EditableTensor t{"BF16", shape, std::vector<uint8_t>(count * 2)};
  for (size_t i = 0; i < count; ++i) {
    const uint16_t bits = float_to_bf16_bits(float(offset + scale * normal(engine)));
    t.bytes[2 * i] = uint8_t(bits & 0xff);
    t.bytes[2 * i + 1] = uint8_t(bits >> 8);
  }
  return t;
}

// Writes config.json + model.safetensors once per process; returns the folder. The
// folders are removed when the process exits (the static map's destructor).
std::string tiny_checkpoint(const TinySpec& s) {
  namespace fs = std::filesystem;
  static std::map<std::string, TempDir> written;
  if (auto found = written.find(s.name); found != written.end()) return found->second.path;
  TempDir scratch(std::string("ch08_cuda_") + s.name);
  const fs::path dir = scratch.path;
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", s.C},
                           {"intermediate_size", s.F},
                           {"num_hidden_layers", s.L},
                           {"num_attention_heads", s.H},
                           {"num_key_value_heads", s.Hkv},
                           {"head_dim", s.D},
                           {"vocab_size", s.V},
                           {"max_position_embeddings", s.max_pos},
                           {"rope_theta", s.theta},
                           {"rms_norm_eps", s.eps},
                           {"tie_word_embeddings", s.tied},
                           {"attention_bias", s.bias},
                           {"mlp_bias", s.bias},
                           {"hidden_act", "silu"},
                           {"torch_dtype", "bfloat16"},
                           {"bos_token_id", 1},
                           {"eos_token_id", 2}};
  std::ofstream(dir / "config.json") << config.dump(2);

  // Scales like golden/gen_08_tiny_model.py's (biases 0.3, norms 1 +- 0.2, a wider
  // lm_head so the logits spread), but projections at gain 1.0 instead of 1.5: with
  // D = 64/128 the 1.5 gain made attention so sharp that the bf16 rounding of one
  // activation moved the logits by ~2% (GPU-only path differences alone reached 1.8e-2,
  // measured on the H200), which tests the model's chaos, not the kernels.
  std::mt19937_64 engine(s.seed);
  TensorMap tensors;
  tensors["model.embed_tokens.weight"] = bf16_tensor({s.V, s.C}, engine, 1.0);
  const struct {
    const char* name;
    int out, in;
  } projections[] = {{"self_attn.q_proj", s.H * s.D, s.C}, {"self_attn.k_proj", s.Hkv * s.D, s.C},
                     {"self_attn.v_proj", s.Hkv * s.D, s.C}, {"self_attn.o_proj", s.C, s.H * s.D},
                     {"mlp.gate_proj", s.F, s.C},            {"mlp.up_proj", s.F, s.C},
                     {"mlp.down_proj", s.C, s.F}};
  for (int i = 0; i < s.L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    tensors[p + "input_layernorm.weight"] = bf16_tensor({s.C}, engine, 0.2, 1.0);
    tensors[p + "post_attention_layernorm.weight"] = bf16_tensor({s.C}, engine, 0.2, 1.0);
    for (const auto& proj : projections) {
      tensors[p + proj.name + ".weight"] = bf16_tensor({proj.out, proj.in}, engine, 1.0 / std::sqrt(double(proj.in)));
      if (s.bias) tensors[p + proj.name + ".bias"] = bf16_tensor({proj.out}, engine, 0.3);
    }
  }
  tensors["model.norm.weight"] = bf16_tensor({s.C}, engine, 0.2, 1.0);
  if (!s.tied) tensors["lm_head.weight"] = bf16_tensor({s.V, s.C}, engine, 3.0 / std::sqrt(double(s.C)));
  write_safetensors_file((dir / "model.safetensors").string(), tensors);
  return written.emplace(s.name, std::move(scratch)).first->second.path;
}

CudaModelOptions cuda_options(int max_context = 0, int prefill_chunk = 1024, bool graph = true, bool pdl = true) {
  CudaModelOptions o;
  o.max_context = max_context;
  o.prefill_chunk = prefill_chunk;
  o.use_graph = graph;
  o.use_pdl = pdl;
  return o;
}

std::vector<float> row_of(const std::vector<float>& rows, size_t V, size_t t) {
  return std::vector<float>(rows.begin() + long(t * V), rows.begin() + long((t + 1) * V));
}

// Compares every row; returns the worst relative norm error.
double require_rows_close(const std::string& label, const std::vector<float>& actual,
                          const std::vector<float>& expected, size_t V, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  double worst = 0;
  for (size_t t = 0; t < actual.size() / V; ++t) {
    CompareResult r = compare(label + " row " + std::to_string(t), row_of(actual, V, t), row_of(expected, V, t),
                              tolerance);
    INFO(r.report);
    REQUIRE(r.passed);
    worst = std::max(worst, r.rel_norm_error);
  }
  return worst;
}

std::vector<int32_t> random_prompt(size_t length, int V, uint64_t seed) {
  return random_ints(length, seed, 0, V - 1);
}

// Top-1 minus top-2 logit.
double margin_of(const std::vector<float>& logits) {
  std::vector<float> sorted(logits);
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  return double(sorted[0]) - double(sorted[1]);
}

}  // namespace

// What the CUDA backend refuses before it touches the GPU (a head_dim it lacks, a shape
// past the decode GEMV, out-of-range options): test_model_cuda_refusals.cu, a CPU test.

TEST_CASE("CUDA model: prefill logits match the CPU backend at every position", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    CudaModel cuda(dir, cuda_options());
    // 37 tokens: the chunk takes the GEMM (cuBLASLt) path, T > 8.
    const std::vector<int32_t> prompt = random_prompt(37, spec.V, seed);
    const std::vector<float> expected = cpu.prefill(prompt, Logits::kAll);
    const std::vector<float> all = cuda.prefill(prompt, Logits::kAll);
    REQUIRE(cuda.position() == int(prompt.size()));
    const double worst = require_rows_close(std::string(spec.name) + " prefill", all, expected, spec.V, kModelTolerance);
    std::printf("%s: prefill(37) vs CPU, worst row rel err %.2e\n", spec.name, worst);

    // Logits::kLast: the fp32 lm_head GEMV on the last row, same numbers within bf16. The
    // last layer then computes that row alone past the cache append; with
    // prefill_last_layer_rows_only off, every row, as before.
    cuda.reset();
    const std::vector<float> last = cuda.prefill(prompt, Logits::kLast);
    require_rows_close(std::string(spec.name) + " prefill last", last, row_of(expected, spec.V, prompt.size() - 1),
                       spec.V, kModelTolerance);
    {
      CudaModelOptions every_row = cuda_options();
      every_row.prefill_last_layer_rows_only = false;
      CudaModel untrimmed(dir, every_row);
      require_rows_close(std::string(spec.name) + " prefill last, every row of the last layer",
                         untrimmed.prefill(prompt, Logits::kLast), row_of(expected, spec.V, prompt.size() - 1),
                         spec.V, kModelTolerance);
    }

    // A short prompt (T <= 8: chapter 03's GEMV instead of the GEMM).
    cpu.reset();
    cuda.reset();
    const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + 5);
    require_rows_close(std::string(spec.name) + " prefill(5)", cuda.prefill(short_prompt, Logits::kAll),
                       cpu.prefill(short_prompt, Logits::kAll), spec.V, kModelTolerance);
  }
}

TEST_CASE("CUDA model: short prefills on gemv_v2 match the CPU backend and cuBLASLt's", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    CudaModelOptions on = cuda_options(), off = cuda_options();
    on.experiments.prefill_gemv_max_tokens = 16;  // gemv_v2 for every prompt below
    off.experiments.prefill_gemv_max_tokens = 0;
    on.prefill_v6_max_tokens = off.prefill_v6_max_tokens = 0;  // v6 would take those rows first
    CudaModel with_gemv(dir, on), with_gemm(dir, off);
    // 2 to 16 tokens: one column tile, two, and the limit; then a 5-token turn at P = 16.
    for (size_t length : {size_t(2), size_t(7), size_t(9), size_t(16)}) {
      INFO(spec.name << " prompt of " << length);
      const std::vector<int32_t> prompt = random_prompt(length, spec.V, seed + length);
      cpu.reset();
      with_gemv.reset();
      with_gemm.reset();
      const std::vector<float> expected = cpu.prefill(prompt, Logits::kAll);
      require_rows_close(std::string(spec.name) + " gemv_v2 prefill", with_gemv.prefill(prompt, Logits::kAll),
                         expected, spec.V, kModelTolerance);
      require_rows_close(std::string(spec.name) + " cuBLASLt prefill", with_gemm.prefill(prompt, Logits::kAll),
                         expected, spec.V, kModelTolerance);
      if (length == 16) {
        const std::vector<int32_t> turn = random_prompt(5, spec.V, seed + 99);
        const std::vector<float> cpu_turn = cpu.prefill(turn);
        const double worst = require_rows_close(std::string(spec.name) + " gemv_v2 turn", with_gemv.prefill(turn),
                                                cpu_turn, spec.V, kModelTolerance);
        std::printf("%s: prefill of 16 + a 5-token turn on gemv_v2 vs CPU, worst rel err %.2e\n", spec.name, worst);
      }
    }
  }
}

TEST_CASE("CUDA model: short prefills on chapter 03's v6 match the CPU backend", "[ch08][gpu][model]") {
  if (!matmul_v6_available()) {
    WARN("v6 needs compute capability 9.0 and an sm_90a build: not run");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    CudaModelOptions on = cuda_options();
    on.prefill_v6_max_tokens = kMatmulV6MaxTokens;  // v6 for every prompt below
    CudaModel with_v6(dir, on);
    // Each column tile (16, 32, 64 tokens) and its edges, every row's logits (launched
    // eagerly); then, below, the last row's, so that the prefill graphs capture and replay
    // v6, and a 5-token turn on top of the cache.
    for (size_t length : {size_t(2), size_t(16), size_t(17), size_t(33), size_t(64)}) {
      INFO(spec.name << " prompt of " << length);
      const std::vector<int32_t> prompt = random_prompt(length, spec.V, seed + length);
      cpu.reset();
      with_v6.reset();
      const std::vector<float> expected = cpu.prefill(prompt, Logits::kAll);
      require_rows_close(std::string(spec.name) + " v6 prefill", with_v6.prefill(prompt, Logits::kAll), expected,
                         spec.V, kModelTolerance);
    }
    for (int round = 0; round < 3; ++round) {  // Logits::kLast: eager, captured, replayed
      const std::vector<int32_t> prompt = random_prompt(40, spec.V, seed + 1000 + round);
      cpu.reset();
      with_v6.reset();
      const std::vector<float> expected = cpu.prefill(prompt);
      require_rows_close(std::string(spec.name) + " v6 prefill, last logits", with_v6.prefill(prompt), expected,
                         spec.V, kModelTolerance);
      const std::vector<int32_t> turn = random_prompt(5, spec.V, seed + 2000 + round);
      const double worst = require_rows_close(std::string(spec.name) + " v6 turn", with_v6.prefill(turn),
                                              cpu.prefill(turn), spec.V, kModelTolerance);
      if (round == 2) std::printf("%s: prefill of 40 + a 5-token turn on v6 vs CPU, worst rel err %.2e\n", spec.name, worst);
    }
  }
}

TEST_CASE("CUDA model: a prompt longer than the prefill chunk matches the CPU backend", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    CudaModel cuda(dir, cuda_options(0, 16));  // 53 tokens: chunks of 16, 16, 16, 5
    const std::vector<int32_t> prompt = random_prompt(53, spec.V, seed);
    const double worst = require_rows_close(std::string(spec.name) + " chunked prefill",
                                            cuda.prefill(prompt, Logits::kAll), cpu.prefill(prompt, Logits::kAll),
                                            spec.V, kModelTolerance);
    std::printf("%s: prefill(53) in chunks of 16 vs CPU, worst row rel err %.2e\n", spec.name, worst);
    // Logits::kLast: the chunks before the last stop their last layer at the cache
    // append, the last chunk's last layer computes one row. Its logits, and a decode step
    // that reads every chunk's keys and values from the cache, still match the CPU's.
    cpu.reset();
    cuda.reset();
    const std::vector<float> expected_last = cpu.prefill(prompt, Logits::kLast);
    require_rows_close(std::string(spec.name) + " chunked prefill, last row", cuda.prefill(prompt, Logits::kLast),
                       expected_last, spec.V, kModelTolerance);
    const int32_t next = prompt[7];
    require_rows_close(std::string(spec.name) + " decode after a chunked prefill", cuda.decode(next), cpu.decode(next),
                       spec.V, kModelTolerance);
  }
}

TEST_CASE("CUDA model: token-by-token decode matches the CPU backend", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    CudaModel cuda(dir, cuda_options());
    const std::vector<int32_t> prompt = random_prompt(21, spec.V, seed);
    const std::vector<float> expected = cpu.prefill(prompt, Logits::kAll);
    double worst = 0;
    for (size_t t = 0; t < prompt.size(); ++t) {
      const std::vector<float> step = cuda.decode(prompt[t]);
      REQUIRE(cuda.position() == int(t + 1));
      worst = std::max(worst, require_rows_close(std::string(spec.name) + " decode step " + std::to_string(t), step,
                                                 row_of(expected, spec.V, t), spec.V, kModelTolerance));
    }
    std::printf("%s: 21 decode steps (graph) vs CPU, worst rel err %.2e\n", spec.name, worst);
    // Every attention path, with split counts other than the default and splits of at
    // least 1 or 8 keys: the merge order changes, the logits stay within the same
    // tolerance of the CPU backend.
    struct AttentionVariant {
      DecodeAttentionPath path;
      int splits, min_keys;
      const char* name;
      int replicas = 1;
      int short_max_keys = CudaModelOptions{}.short_attention_max_keys;  ///< v6's second graph
      V6Handover handover = kV6DefaultHandover;
      int long_min_keys = CudaModelOptions{}.long_attention_min_keys;  ///< v6's third graph
      bool o_after_inputs = false;  ///< attention_allows_o_after_inputs
      bool fuses_o = false;         ///< v6_fuses_o: O and the residual add inside v6's clusters
      int o_blocks = 0;             ///< attention_o_blocks: O blocks beside v6's splits
    };
    const AttentionVariant variants[] = {
        {DecodeAttentionPath::kClusterWithO, 1, 0, "attention + O fused"},
        {DecodeAttentionPath::kClusterWithO, 3, 0, "attention + O fused, 5 replicas", 5},
        {DecodeAttentionPath::kClusterWithO, 16, 0, "attention + O fused"},
        {DecodeAttentionPath::kCluster, 0, 0, "v5 cluster"},
        {DecodeAttentionPath::kCluster, 1, 0, "v5 cluster"},
        {DecodeAttentionPath::kCluster, 3, 0, "v5 cluster"},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6 cluster per query head (clusters of 4: short)"},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6, one graph (clusters of 8)", 1, 0},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6, clusters of 4 up to 10 keys, then 8", 1, 10},
        {DecodeAttentionPath::kClusterPerHead, 3, 0, "v6 cluster per query head"},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6, pushed, cluster barrier", 1, 10, V6Handover::kPushBarrier},
        {DecodeAttentionPath::kClusterPerHead, 5, 0, "v6, pushed, mbarrier", 1, 0, V6Handover::kPushMbarrier},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6, pulled", 1, 10, V6Handover::kPull},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6, clusters of 4 up to 5 keys, 8 up to 8, then 16", 1, 5,
         kV6DefaultHandover, 9},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6, O scheduled after the attention's inputs", 1, 10,
         kV6DefaultHandover, CudaModelOptions{}.long_attention_min_keys, true},
        {DecodeAttentionPath::kClusterPerHead, 3, 0, "v6, barrier push, O after the inputs", 1, 0,
         V6Handover::kPushBarrier, 0, true},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6 with O inside, clusters of 4 up to 5 keys, 8 up to 8, then 16",
         1, 5, kV6DefaultHandover, 9, false, true},
        {DecodeAttentionPath::kClusterPerHead, 3, 0, "v6 with O inside, clusters of 3", 1, 0, kV6DefaultHandover, 0,
         false, true},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6 with O inside, gate/up after the attention's inputs", 1, 10,
         kV6DefaultHandover, CudaModelOptions{}.long_attention_min_keys, true, true},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6 + 12 O blocks (short graph), 8 + 8, then the O GEMV", 1, 10,
         kV6DefaultHandover, 20, false, false, 12},
        {DecodeAttentionPath::kClusterPerHead, 3, 0, "v6 in clusters of 3 + 2 O blocks", 1, 0, kV6DefaultHandover, 0,
         false, false, 2},
        {DecodeAttentionPath::kClusterPerHead, 0, 0, "v6 + 12 O blocks, gate/up after the attention's inputs", 1,
         10, kV6DefaultHandover, CudaModelOptions{}.long_attention_min_keys, true, false, 12},
        {DecodeAttentionPath::kSplitCombine, 0, 0, "v3 split + combine"},
        {DecodeAttentionPath::kSplitCombine, 1, 0, "v3 split + combine"},
        {DecodeAttentionPath::kSplitCombine, 3, 0, "v3 split + combine"},
        {DecodeAttentionPath::kMergeInO, 0, 0, "merge in O"},
        {DecodeAttentionPath::kMergeInO, 3, 1, "merge in O"},
        {DecodeAttentionPath::kMergeInO, 7, 8, "merge in O"},
    };
    for (const AttentionVariant& a : variants) {
      CudaModelOptions options = cuda_options();
      options.attention_splits = a.splits;
      options.experiments.attention_min_keys_per_split = a.min_keys;
      options.decode_attention = a.path;
      options.attention_o_replicas = a.replicas;
      options.short_attention_max_keys = a.short_max_keys;
      options.v6_handover = a.handover;
      options.long_attention_min_keys = a.long_min_keys;
      options.experiments.attention_allows_o_after_inputs = a.o_after_inputs;
      options.experiments.v6_fuses_o = a.fuses_o;
      options.experiments.attention_o_blocks = a.o_blocks;
      CudaModel split_model(dir, options);
      const std::string label = std::string(spec.name) + " " + a.name + ", " + std::to_string(a.splits) +
                                " splits (0: default) of >= " + std::to_string(a.min_keys) + " keys";
      INFO(label);
      // The fused O runs wherever v6 does (sm_90: these W_o rows fit any cluster), so
      // the variant really tests it, not the fallback.
      REQUIRE(split_model.v6_fuses_o() == (a.fuses_o && device_is_sm90_or_newer()));
      // The O blocks too, in the step of one key (the short graph's where there is one).
      if (a.o_blocks > 0 && device_is_sm90_or_newer()) REQUIRE(split_model.attention_o_blocks_at(1) == a.o_blocks);
      for (size_t t = 0; t < prompt.size(); ++t) {
        require_rows_close(label + ", decode step " + std::to_string(t), split_model.decode(prompt[t]),
                           row_of(expected, spec.V, t), spec.V, kModelTolerance);
      }
    }
    // The GEMVs on the tensor-core kernel (tensor_core_gemvs): none (every GEMV on the
    // register kernel), or all five, down streamed (the default is QKV and O).
    // Their sums come in another order: the same tolerance.
    for (unsigned gemvs : {0u, unsigned(kTensorCoreEvery)}) {
      CudaModelOptions options = cuda_options();
      options.tensor_core_gemvs = gemvs;
      CudaModel model(dir, options);
      for (size_t t = 0; t < prompt.size(); ++t) {
        require_rows_close(std::string(spec.name) + " tensor-core GEMVs " + std::to_string(gemvs) + ", decode step " +
                               std::to_string(t),
                           model.decode(prompt[t]), row_of(expected, spec.V, t), spec.V, kModelTolerance);
      }
    }
    // The three graphs (here up to 5 keys, 6-8, from 9) with the forty-fourth session's
    // settings: QKV and O on the register kernel in the long graph, gate/up's first batch
    // whole before the wait past the short graph. (The defaults' forms run in the
    // attention variants above.)
    {
      CudaModelOptions options = cuda_options();
      options.short_attention_max_keys = 5;
      options.long_attention_min_keys = 9;
      options.tensor_core_gemvs_in_long_graph = 0;
      options.gate_up_loads_before_wait_past_short_graph = 0;
      CudaModel model(dir, options);
      REQUIRE(model.gate_up_split_at(9).loads_before_wait == 0);
      for (size_t t = 0; t < prompt.size(); ++t) {
        require_rows_close(std::string(spec.name) + " three graphs, register QKV and O in the long one, no split, decode step " +
                               std::to_string(t),
                           model.decode(prompt[t]), row_of(expected, spec.V, t), spec.V, kModelTolerance);
      }
    }
  }
}

TEST_CASE("CUDA model: past the short graph gate/up's first batch is split by its own options",
          "[ch08][gpu][model]") {
  const std::string dir = tiny_checkpoint(kSpecs[0]);
  using Split = CudaModel::FirstBatchSplit;
  auto same = [](Split a, Split b) {
    return a.loads_before_wait == b.loads_before_wait && a.rest == b.rest && a.blocks == b.blocks;
  };
  // Three graphs: clusters of 4 up to 13 keys, 8 for 14 and 15, 16 from 16 keys on (v6's
  // clusters, sm_90 and newer; elsewhere one graph).
  auto three_graphs = [] {
    CudaModelOptions options = cuda_options();
    options.short_attention_max_keys = 13;
    options.long_attention_min_keys = 16;
    return options;
  };
  const bool short_graph = device_is_sm90_or_newer(), long_graph = short_graph;
  const Split none{0, SplitBatchRest::kAfterStaging, 0};
  // The defaults: 3 loads a row, the rest once they are in; in the first 264 blocks in
  // the main graph, in every block in the long one.
  const Split main_split{3, SplitBatchRest::kWhenFirstArrived, 264};
  const Split long_split{3, SplitBatchRest::kWhenFirstArrived, 0};
  CudaModelOptions options = three_graphs();
  {
    CudaModel model(dir, options);
    REQUIRE(same(model.gate_up_split_at(1), short_graph ? none : main_split));
    REQUIRE(same(model.gate_up_split_at(13), short_graph ? none : main_split));
    for (int kv_len : {14, 15}) REQUIRE(same(model.gate_up_split_at(kv_len), main_split));
    for (int kv_len : {16, 40}) REQUIRE(same(model.gate_up_split_at(kv_len), long_graph ? long_split : main_split));
  }
  // Their own numbers past the short graph, the other options' in it.
  options.gate_up_loads_before_wait_past_short_graph = 5;
  options.gate_up_split_rest_past_short_graph = SplitBatchRest::kAfterWait;
  options.experiments.gate_up_loads_before_wait = 2;
  for (int kv_len : {1, 14, 16}) {
    INFO(kv_len << " keys");
    const int blocks = kv_len >= 16 && long_graph ? 0 : 264;
    REQUIRE(same(CudaModel(dir, options).gate_up_split_at(kv_len),
                 kv_len > 13 || !short_graph ? Split{5, SplitBatchRest::kAfterWait, blocks}
                                             : Split{2, SplitBatchRest::kAfterStaging, 264}));
  }
  // 0: the steps past the short graph split as the short graph's do.
  options.gate_up_loads_before_wait_past_short_graph = 0;
  REQUIRE(same(CudaModel(dir, options).gate_up_split_at(14), Split{2, SplitBatchRest::kAfterStaging, 264}));
  REQUIRE(same(CudaModel(dir, options).gate_up_split_at(16),
               Split{2, SplitBatchRest::kAfterStaging, long_graph ? 0 : 264}));
  // Beside gate/up's second batch in shared memory (which a split does not combine with)
  // no step splits.
  options = three_graphs();
  options.experiments.gate_up_second_batch_in_shared = true;
  REQUIRE(same(CudaModel(dir, options).gate_up_split_at(14), none));
  REQUIRE(same(CudaModel(dir, options).gate_up_split_at(16), none));
  // With no short graph every step is past it.
  options = three_graphs();
  options.short_attention_max_keys = 0;
  REQUIRE(same(CudaModel(dir, options).gate_up_split_at(1), main_split));
  // gate_up_split_blocks and its long-graph form go with whichever split a step takes,
  // and with none stay 0.
  options = three_graphs();
  options.gate_up_split_blocks = 7;
  options.gate_up_split_blocks_in_long_graph = 5;
  {
    CudaModel model(dir, options);
    REQUIRE(same(model.gate_up_split_at(14), Split{3, SplitBatchRest::kWhenFirstArrived, 7}));
    REQUIRE(same(model.gate_up_split_at(16), Split{3, SplitBatchRest::kWhenFirstArrived, long_graph ? 5 : 7}));
    REQUIRE(same(model.gate_up_split_at(1), short_graph ? none : Split{3, SplitBatchRest::kWhenFirstArrived, 7}));
  }
  options.experiments.gate_up_loads_before_wait = 2;
  REQUIRE(same(CudaModel(dir, options).gate_up_split_at(1), short_graph
                                                                ? Split{2, SplitBatchRest::kAfterStaging, 7}
                                                                : Split{3, SplitBatchRest::kWhenFirstArrived, 7}));
}

TEST_CASE("CUDA model: the fused MLP matches the CPU backend in prefill and decode", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    const std::vector<int32_t> prompt = random_prompt(21, spec.V, seed);
    const std::vector<float> expected = cpu.prefill(prompt, Logits::kAll);
    // The graph with PDL and every value before the wait; eager launches without PDL and
    // none before it; one value, with v6's third graph from 9 keys on (whose QKV runs on
    // the register kernel) and every GEMV on the register kernel; the tensor cores
    // wherever they run (the lm_head then stays on the register kernel: it adds the
    // accumulator in, which only QKV's tensor-core form does).
    struct Variant {
      bool graph, pdl;
      int before_wait;
      int long_min_keys;
      unsigned tensor_core_gemvs;
      int block_warps;
      int blocks;  // fused_mlp_blocks (0: every SM)
    };
    const CudaModelOptions defaults;
    const Variant variants[] = {{true, true, 2, defaults.long_attention_min_keys, defaults.tensor_core_gemvs, 4, 0},
                                {false, false, 0, defaults.long_attention_min_keys, defaults.tensor_core_gemvs, 8, 0},
                                {true, true, 1, 9, 0u, 8, 0},
                                {true, true, 2, defaults.long_attention_min_keys, unsigned(kTensorCoreEvery), 4, 0},
                                {true, true, 2, defaults.long_attention_min_keys, defaults.tensor_core_gemvs, 8, 7}};
    for (const Variant& v : variants) {
      CudaModelOptions options = cuda_options(0, 1024, v.graph, v.pdl);
      options.experiments.fused_mlp = true;
      options.experiments.fused_mlp_values_before_wait = v.before_wait;
      options.long_attention_min_keys = v.long_min_keys;
      options.tensor_core_gemvs = options.tensor_core_gemvs_in_long_graph = v.tensor_core_gemvs;
      options.experiments.fused_mlp_block_warps = v.block_warps;
      options.experiments.fused_mlp_blocks = v.blocks;
      CudaModel cuda(dir, options);
      REQUIRE(cuda.fused_mlp());  // C <= 1536 and two layers or more: the model runs it
      const std::string label = std::string(spec.name) + " fused MLP, graph " + std::to_string(v.graph) + " pdl " +
                                std::to_string(v.pdl) + " values before the wait " + std::to_string(v.before_wait) +
                                " long graph from " + std::to_string(v.long_min_keys) + " tensor cores " +
                                std::to_string(v.tensor_core_gemvs) + " warps a block " + std::to_string(v.block_warps) +
                                " blocks " + std::to_string(v.blocks);
      INFO(label);
      // Token by token: every step's MLP adds into its accumulator, and the next step
      // finds them reset.
      double worst = 0;
      for (size_t t = 0; t < prompt.size(); ++t) {
        worst = std::max(worst, require_rows_close(label + ", decode step " + std::to_string(t), cuda.decode(prompt[t]),
                                                   row_of(expected, spec.V, t), spec.V, kModelTolerance));
      }
      std::printf("%s: 21 decode steps vs CPU, worst rel err %.2e\n", label.c_str(), worst);
      // The prefill's down GEMM reads the transposed weights (cuBLASLt, no transpose
      // flag on them); then decode goes on from the prefilled cache.
      cuda.reset();
      const size_t half = prompt.size() / 2;
      const std::vector<int32_t> first_half(prompt.begin(), prompt.begin() + long(half));
      require_rows_close(label + ", prefill", cuda.prefill(first_half, Logits::kAll),
                         std::vector<float>(expected.begin(), expected.begin() + long(half * spec.V)), spec.V,
                         kModelTolerance);
      for (size_t t = half; t < prompt.size(); ++t) {
        require_rows_close(label + ", decode after prefill, step " + std::to_string(t), cuda.decode(prompt[t]),
                           row_of(expected, spec.V, t), spec.V, kModelTolerance);
      }
    }
  }
  // Options it cannot run with are refused, naming the option.
  const std::string dir = tiny_checkpoint(kSpecs[0]);
  CudaModelOptions with_o = cuda_options();
  with_o.experiments.fused_mlp = true;
  with_o.decode_attention = DecodeAttentionPath::kClusterWithO;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { CudaModel model(dir, with_o); }), "fused_mlp"));
  CudaModelOptions too_early = cuda_options();
  too_early.experiments.fused_mlp = true;
  too_early.experiments.fused_mlp_values_before_wait = 3;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { CudaModel model(dir, too_early); }),
                   "fused_mlp_values_before_wait"));
  CudaModelOptions negative_grid = cuda_options();
  negative_grid.experiments.fused_mlp = true;
  negative_grid.experiments.fused_mlp_blocks = -1;
  REQUIRE(contains(error_of<std::invalid_argument>([&] { CudaModel model(dir, negative_grid); }), "fused_mlp_blocks"));
}

TEST_CASE("CUDA model: prefill then decode equals prefill of the whole sequence", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CudaModel cuda(dir, cuda_options());
    const std::vector<int32_t> sequence = random_prompt(30, spec.V, seed);
    const std::vector<float> whole = cuda.prefill(sequence, Logits::kAll);
    cuda.reset();
    const size_t head = 12;
    const std::vector<float> first = cuda.prefill(std::vector<int32_t>(sequence.begin(), sequence.begin() + head));
    require_rows_close(std::string(spec.name) + " prefill head", first, row_of(whole, spec.V, head - 1), spec.V,
                       kModelTolerance);
    double worst = 0;
    for (size_t t = head; t < sequence.size(); ++t) {
      worst = std::max(worst, require_rows_close(std::string(spec.name) + " decode after prefill",
                                                 cuda.decode(sequence[t]), row_of(whole, spec.V, t), spec.V,
                                                 kModelTolerance));
    }
    std::printf("%s: prefill(12) + 18 decodes vs prefill(30), worst rel err %.2e\n", spec.name, worst);
  }
}

TEST_CASE("CUDA model: norm weights folded into W_qkv and W_gate_up or not, prefill and decode match the CPU backend",
          "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    const std::vector<int32_t> prompt = random_prompt(17, spec.V, seed);
    const std::vector<float> expected = cpu.prefill(prompt, Logits::kAll);
    // (QKV's fold, gate/up's fold): both (the defaults), neither, each alone.
    const std::pair<bool, bool> folds[] = {{true, true}, {false, false}, {true, false}, {false, true}};
    for (const auto& [fold_qkv, fold_gate_up] : folds) {
      CudaModelOptions options = cuda_options();
      options.fold_qkv_norm = fold_qkv;
      options.fold_gate_up_norm = fold_gate_up;
      const std::string fold = std::string(fold_qkv ? "qkv " : "") + (fold_gate_up ? "gate_up" : "");
      CudaModel cuda(dir, options);
      const size_t head = 9;  // prefilled; the rest decoded (a folded GEMV: no pass)
      const std::vector<float> first =
          cuda.prefill(std::vector<int32_t>(prompt.begin(), prompt.begin() + long(head)), Logits::kAll);
      double worst = 0;
      for (size_t t = 0; t < head; ++t) {
        worst = std::max(worst, require_rows_close(std::string(spec.name) + " prefill, folded: " + fold,
                                                   row_of(first, spec.V, t), row_of(expected, spec.V, t), spec.V,
                                                   kModelTolerance));
      }
      for (size_t t = head; t < prompt.size(); ++t) {
        worst = std::max(worst, require_rows_close(std::string(spec.name) + " decode, folded: " + fold,
                                                   cuda.decode(prompt[t]), row_of(expected, spec.V, t), spec.V,
                                                   kModelTolerance));
      }
      std::printf("%s: norm weights folded into [%s], prefill(9) + 8 decodes vs CPU, worst rel err %.2e\n",
                  spec.name, fold.c_str(), worst);
    }
  }
}

TEST_CASE("fold_norm_weight_into_columns: each weight times its column's norm weight, rounded once",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  uint64_t case_seed = seed;
  struct Shape {
    int rows, cols;
  };
  for (const Shape& shape : {Shape{2048, 1536}, Shape{37, 344}, Shape{1, 8}, Shape{5, 1003}}) {
    INFO(shape.rows << " x " << shape.cols);
    const std::vector<uint16_t> W = random_bf16(size_t(shape.rows) * shape.cols, ++case_seed, 0.05f);
    std::vector<uint16_t> g = random_bf16(size_t(shape.cols), ++case_seed, 0.5f);
    for (auto& v : g) v = float_to_bf16_bits(1.0f + bf16_bits_to_float(v));
    DeviceBuffer<uint16_t> d_W(W), d_g(g);
    fold_norm_weight_into_columns(reinterpret_cast<__nv_bfloat16*>(d_W.data()),
                                  reinterpret_cast<const __nv_bfloat16*>(d_g.data()), shape.rows, shape.cols);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> folded = d_W.to_host();
    size_t mismatches = 0, changed = 0;
    for (size_t i = 0; i < W.size(); ++i) {
      const float expected = bf16_bits_to_float(W[i]) * bf16_bits_to_float(g[i % size_t(shape.cols)]);
      if (folded[i] != float_to_bf16_bits(expected)) ++mismatches;  // a NaN never matches
      if (folded[i] != W[i]) ++changed;
    }
    REQUIRE(mismatches == 0);
    REQUIRE(changed > W.size() / 2);  // the fold did run: most weights move
  }
  DeviceBuffer<uint16_t> buffer(16);
  auto* W = reinterpret_cast<__nv_bfloat16*>(buffer.data());
  REQUIRE_THROWS_AS(fold_norm_weight_into_columns(W, W, 0, 8), std::invalid_argument);
  REQUIRE_THROWS_AS(fold_norm_weight_into_columns(W, W, 2, -1), std::invalid_argument);
  REQUIRE_THROWS_AS(fold_norm_weight_into_columns(nullptr, W, 2, 8), std::invalid_argument);
}

TEST_CASE("CUDA model: prefill graphs equal eager launches, with new ids at every replay", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    // Chunks of 16: a 37-token prompt is three chunks (16 at 0 and 16 at 16 with no logits,
    // 5 at 32 with the last logits), a 9-token turn a fourth shape (9 at 37): every path of
    // the chunk, the trimmed last layer with and without its row, and P > 0.
    CudaModelOptions graphs = cuda_options(0, 16);
    CudaModelOptions eager = graphs;
    eager.prefill_graphs = false;
    CudaModel with(dir, graphs), without(dir, eager);
    CudaModelOptions small = graphs;  // room for 2 of the 4 shapes: captures evict
    small.prefill_graph_cache = 2;
    CudaModel evicting(dir, small);
    std::vector<float> previous;
    for (int round = 0; round < 4; ++round) {
      INFO(spec.name << " round " << round << " (0: eager, 1: captured, 2-3: replayed)");
      // Fresh ids every round, the same shapes: a graph that kept the first round's ids
      // (or its cache contents) would differ from the eager model.
      const std::vector<int32_t> prompt = random_prompt(37, spec.V, seed + 2 * uint64_t(round));
      const std::vector<int32_t> turn = random_prompt(9, spec.V, seed + 2 * uint64_t(round) + 1);
      std::vector<std::vector<float>> outputs[3];
      CudaModel* models[3] = {&with, &without, &evicting};
      for (int m = 0; m < 3; ++m) {
        models[m]->reset();
        outputs[m].push_back(models[m]->prefill(prompt));
        outputs[m].push_back(models[m]->prefill(turn));
        // Decode reads the cache and the device length the chunks left.
        outputs[m].push_back(models[m]->decode(turn.back()));
        REQUIRE(models[m]->position() == 37 + 9 + 1);
      }
      // The same kernels in the same order: bit for bit.
      REQUIRE(outputs[0] == outputs[1]);
      REQUIRE(outputs[2] == outputs[1]);
      for (const std::vector<float>& logits : outputs[0]) {
        REQUIRE(logits.size() == size_t(spec.V));
        REQUIRE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
      }
      REQUIRE(outputs[0][0] != previous);  // new ids, new logits: the replay read them
      previous = outputs[0][0];
      // Nothing is captured on a shape's first run; all four from the second on.
      REQUIRE(with.prefill_graphs_cached() == (round == 0 ? 0u : 4u));
      REQUIRE(without.prefill_graphs_cached() == 0u);
      REQUIRE(evicting.prefill_graphs_cached() <= 2u);
    }
    // Once more against the CPU backend, every shape replayed, so that "equal to eager"
    // is not "equal and wrong".
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    const std::vector<int32_t> prompt = random_prompt(37, spec.V, seed + 99);
    const std::vector<int32_t> turn = random_prompt(9, spec.V, seed + 98);
    with.reset();
    const std::vector<float> replayed_prompt = with.prefill(prompt);
    const std::vector<float> replayed_turn = with.prefill(turn);
    REQUIRE(with.prefill_graphs_cached() == 4u);
    const std::vector<float> cpu_prompt = cpu.prefill(prompt);
    const double worst = std::max(
        require_rows_close(std::string(spec.name) + " replayed prompt", replayed_prompt, cpu_prompt, spec.V,
                           kModelTolerance),
        require_rows_close(std::string(spec.name) + " replayed turn", replayed_turn, cpu.prefill(turn), spec.V,
                           kModelTolerance));
    std::printf("%s: prefill graphs replayed vs CPU, worst rel err %.2e\n", spec.name, worst);
  }
}

TEST_CASE("CUDA model: two-chunk prefill equals one-chunk prefill", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CudaModel cuda(dir, cuda_options());
    const std::vector<int32_t> prompt = random_prompt(40, spec.V, seed);
    const std::vector<float> whole = cuda.prefill(prompt, Logits::kAll);
    // Splits where the second chunk is one token, a GEMV-sized chunk, a GEMM-sized one.
    for (size_t split : {size_t(1), size_t(7), size_t(13), prompt.size() - 1}) {
      INFO(spec.name << " split at " << split);
      cuda.reset();
      std::vector<float> logits = cuda.prefill(std::vector<int32_t>(prompt.begin(), prompt.begin() + long(split)),
                                               Logits::kAll);
      REQUIRE(cuda.position() == int(split));
      const std::vector<float> rest =
          cuda.prefill(std::vector<int32_t>(prompt.begin() + long(split), prompt.end()), Logits::kAll);
      logits.insert(logits.end(), rest.begin(), rest.end());
      const double worst = require_rows_close(std::string(spec.name) + " two chunks", logits, whole, spec.V,
                                              kModelTolerance);
      std::printf("%s: split at %zu vs one chunk, worst rel err %.2e\n", spec.name, split, worst);
    }
  }
}

TEST_CASE("CUDA model: the decode graph equals eager launches, with and without PDL, cache hints, early starts",
          "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    const std::vector<int32_t> prompt = random_prompt(11, spec.V, seed);
    const std::vector<int32_t> steps = random_prompt(9, spec.V, seed + 1);
    auto run = [&](const CudaModelOptions& options) {
      CudaModel cuda(dir, options);
      std::vector<float> all = cuda.prefill(prompt);
      for (int32_t token : steps) {
        const std::vector<float> step = cuda.decode(token);
        all.insert(all.end(), step.begin(), step.end());
      }
      return all;
    };
    std::vector<std::vector<float>> runs;
    for (bool graph : {true, false}) {
      for (bool pdl : {true, false}) runs.push_back(run(cuda_options(0, 1024, graph, pdl)));
    }
    // A cache hint changes no value: the weights read without the evict-first hint. Nor
    // does when the attention may start.
    {
      CudaModelOptions options = cuda_options();
      options.gemv_evict_first = false;
      runs.push_back(run(options));
      options = cuda_options();
      options.experiments.qkv_allows_attention_early = true;
      runs.push_back(run(options));
      // Nor does the input widened to fp32 in shared memory, or not: the same products
      // in the same order.
      options = cuda_options();
      options.gemv_widen_input = !options.gemv_widen_input;
      runs.push_back(run(options));
      // Nor does which of QKV and O run the tensor-core instance for three blocks an SM
      // (the defaults' choice swapped: O on it, QKV on the whole-row one; the same steps
      // in the same order).
      options = cuda_options();
      options.mma_three_blocks_per_sm ^= kTensorCoreQkv | kTensorCoreO;
      runs.push_back(run(options));
      // Nor does whether the norm weight is asked for before the weights or after them
      // (QKV on the tensor cores, gate/up and the lm_head on the register kernel): the
      // defaults' choice turned around.
      options = cuda_options();
      options.norm_weight_first ^= kTensorCoreQkv | kTensorCoreGateUp | kTensorCoreLmHead;
      runs.push_back(run(options));
      options = cuda_options();
      options.experiments.attention_allows_o_after_inputs = true;
      runs.push_back(run(options));
      // Nor does the shared-memory split the launches ask for, in a graph or eagerly.
      for (int percent : {0, 100}) {
        options = cuda_options(0, 1024, percent == 0, true);
        options.experiments.decode_shared_carveout = percent;
        runs.push_back(run(options));
      }
      // Nor do O's and gate/up's weight loads held until the attention's inputs are in
      // (O's and every gate/up block; only gate/up's blocks 1 and 2), nor the pause at
      // gate/up's and down's start (none; 500 ns instead of the default, with QKV, O and
      // the lm_head pausing 500 ns too), in a graph.
      options = cuda_options();
      options.experiments.o_holds_for_attention_inputs = true;
      options.experiments.gate_up_hold_blocks = 1 << 20;
      runs.push_back(run(options));
      options.experiments.o_holds_for_attention_inputs = false;
      options.experiments.gate_up_hold_blocks = 3;
      options.experiments.gate_up_hold_first_block = 1;
      runs.push_back(run(options));
      options.experiments.gate_up_hold_blocks = 0;
      options.gate_up_start_delay_ns = options.down_start_delay_ns = 0;
      runs.push_back(run(options));
      options.gate_up_start_delay_ns = options.down_start_delay_ns = 500;
      options.experiments.qkv_start_delay_ns = options.experiments.o_start_delay_ns =
          options.experiments.lm_head_start_delay_ns = 500;
      runs.push_back(run(options));
      // Nor does a first batch split around the wait (the same loads, later).
      options = cuda_options();
      options.experiments.gate_up_loads_before_wait = 3;
      options.experiments.down_loads_before_wait = 5;
      options.experiments.lm_head_loads_before_wait = 1;
      runs.push_back(run(options));
      options.experiments.split_batch_rest = SplitBatchRest::kAfterWait;  // the rest right after the wait
      runs.push_back(run(options));
      options.experiments.split_batch_rest = SplitBatchRest::kWhenFirstArrived;  // once the first loads are in
      runs.push_back(run(options));
      options = cuda_options();
      options.experiments.down_loads_before_wait = 3;  // on down alone
      options.experiments.split_batch_rest = SplitBatchRest::kAfterWait;
      runs.push_back(run(options));
      // O's (o_loads_before_wait, on the tensor cores): 3 steps a warp once the first are
      // in (the option's moment), after the wait; 1 after the staging.
      options = cuda_options();
      options.experiments.o_loads_before_wait = 3;
      runs.push_back(run(options));
      options.experiments.o_split_rest = SplitBatchRest::kAfterWait;
      runs.push_back(run(options));
      options.experiments.o_loads_before_wait = 1;
      options.experiments.o_split_rest = SplitBatchRest::kAfterStaging;
      runs.push_back(run(options));
      // Gate/up's split in its first 2 blocks only (gate_up_split_blocks), every step.
      options = cuda_options();
      options.experiments.gate_up_loads_before_wait = 3;
      options.experiments.split_batch_rest = SplitBatchRest::kWhenFirstArrived;
      options.gate_up_split_blocks = 2;
      runs.push_back(run(options));
      options = cuda_options();
      options.experiments.gate_up_hold_blocks = 1 << 20;  // until the attention's blocks have ended, pulled
      options.experiments.hold_until_attention_end = true;
      options.v6_handover = V6Handover::kPull;
      runs.push_back(run(options));
      // Nor do gate/up's and down's second batches copied into shared memory, before the
      // wait or after the staging.
      options = cuda_options();
      options.experiments.gate_up_second_batch_in_shared = options.experiments.down_second_batch_in_shared = true;
      runs.push_back(run(options));
      options.experiments.second_batch_after_staging = true;
      runs.push_back(run(options));
    }
    // The same kernels in the same order: bit for bit the same logits.
    for (size_t i = 1; i < runs.size(); ++i) {
      INFO(spec.name << " run " << i
                     << " (graph/pdl: tt, tf, ft, ff; then no evict-first hint; then the attention started early; then the input widened or not; then O after the attention's inputs; then carveouts 0 (graph) and 100 (eager); then O and gate/up held, gate/up blocks 1-2 held, no hold and no pause, 500 ns pauses, then the first batches split, the rest after the staging, after the wait, once the first loads are in, down's alone after the wait; O's split once its first steps are in, after the wait, 1 after the staging; gate/up's in its first 2 blocks; then gate/up held to the pulled attention's end; then the second batches in shared memory, copied before the wait, then after the staging)");
      REQUIRE(runs[i] == runs[0]);
    }
    // The side branch that asks L2 for gate/up's and down's last rows changes no value:
    // a few rows or every row (the sizes clamp), line by line, in bulk or by loads, forked before or
    // after QKV, in a graph (one prefetch kernel more a layer) and eagerly.
    {
      const size_t plain_nodes = CudaModel(dir, cuda_options()).decode_graph_nodes();
      REQUIRE(plain_nodes > 0);
      int variant = 0;
      for (double mb : {0.001, 1e6}) {
        for (L2PrefetchForm form : {L2PrefetchForm::kLines, L2PrefetchForm::kBulk, L2PrefetchForm::kLoads}) {
          for (int fork : {0, 1}) {
            CudaModelOptions options = cuda_options(0, 1024, variant != 3, true);
            options.experiments.side_prefetch_gate_up_mb = mb;
            options.experiments.side_prefetch_down_mb = mb / 2;
            options.experiments.side_prefetch_form = form;
            options.experiments.side_prefetch_fork = fork;
            options.experiments.side_prefetch_blocks = 1 + variant;
            options.experiments.side_prefetch_stride_bytes = 32 << (variant % 3);
            INFO(spec.name << " side prefetch of " << mb << " MB, form " << int(form) << ", fork " << fork << ", graph "
                           << (variant != 3));
            if (options.use_graph) {
              REQUIRE(CudaModel(dir, options).decode_graph_nodes() == plain_nodes + size_t(spec.L));
            }
            REQUIRE(run(options) == runs[0]);
            ++variant;
          }
        }
      }
    }
    // Weights kept in L2 across steps (an access-policy window on the GEMVs of one kind,
    // loading without the evict-first hint) change no value either: every target, a
    // small set-aside and the largest the GPU grants, in a graph and eagerly. The model
    // holds the set-aside while it lives and gives the previous one back when destroyed.
    {
      size_t before = 0;
      CUDA_CHECK(cudaDeviceGetLimit(&before, cudaLimitPersistingL2CacheSize));
      int variant = 0;
      for (L2PersistTarget target : {L2PersistTarget::kLmHead, L2PersistTarget::kQkv, L2PersistTarget::kO,
                                     L2PersistTarget::kGateUp, L2PersistTarget::kDown, L2PersistTarget::kNone}) {
        CudaModelOptions options = cuda_options(0, 1024, variant != 2, true);
        options.experiments.l2_persist_mb = variant % 2 == 0 ? 2.0 : 1e6;
        options.experiments.l2_persist_target = target;
        INFO(spec.name << " L2 persistence: target " << int(target) << ", " << options.experiments.l2_persist_mb
                       << " MB, graph " << options.use_graph);
        {
          CudaModel model(dir, options);
          size_t during = 0;
          CUDA_CHECK(cudaDeviceGetLimit(&during, cudaLimitPersistingL2CacheSize));
          REQUIRE(model.l2_persist_bytes() > 0);
          int device = 0, max_persisting = 0;
          CUDA_CHECK(cudaGetDevice(&device));
          CUDA_CHECK(cudaDeviceGetAttribute(&max_persisting, cudaDevAttrMaxPersistingL2CacheSize, device));
          REQUIRE(model.l2_persist_bytes() <= size_t(max_persisting));
          REQUIRE(during == model.l2_persist_bytes());
        }
        size_t after = 0;
        CUDA_CHECK(cudaDeviceGetLimit(&after, cudaLimitPersistingL2CacheSize));
        REQUIRE(after == before);
        REQUIRE(run(options) == runs[0]);
        ++variant;
      }
    }
    // Other GEMVs on the tensor cores (their own sums), none or all that can: a graph and
    // eager launches agree bit for bit.
    for (unsigned gemvs : {0u, unsigned(kTensorCoreEvery)}) {
      CudaModelOptions graph_options = cuda_options(), eager_options = cuda_options(0, 1024, false, true);
      for (CudaModelOptions* options : {&graph_options, &eager_options}) options->tensor_core_gemvs = gemvs;
      INFO(spec.name << " tensor-core GEMVs " << gemvs << ": graph, then eager launches");
      REQUIRE(run(graph_options) == run(eager_options));
    }
    // O's split (o_loads_before_wait) on the register kernel, every GEMV there: the same
    // logits as unsplit.
    {
      CudaModelOptions registers = cuda_options();
      registers.tensor_core_gemvs = registers.tensor_core_gemvs_in_long_graph = 0;
      const std::vector<float> unsplit = run(registers);
      registers.experiments.o_loads_before_wait = 3;
      INFO(spec.name << " register GEMVs: O's first batch split, then not");
      REQUIRE(run(registers) == unsplit);
    }
    // Every staged input copied in by the bulk-copy engine (sm_90+): the same logits as
    // the threads' staging, bit for bit, in a graph and eagerly.
    if (device_is_sm90_or_newer()) {
      CudaModelOptions graph_options = cuda_options(), eager_options = cuda_options(0, 1024, false, true);
      for (CudaModelOptions* options : {&graph_options, &eager_options})
        options->experiments.gemv_stage_input_bulk = true;
      INFO(spec.name << " bulk staging: graph, then eager launches, against the defaults");
      const auto bulk_logits = run(graph_options);
      REQUIRE(bulk_logits == run(eager_options));
      REQUIRE(bulk_logits == run(cuda_options()));
    }
    // The unfused path (attention, then the O GEMV): graph or eager, and whether the O
    // GEMV lets gate/up start early, change no value either.
    CudaModelOptions unfused = cuda_options();
    unfused.decode_attention = DecodeAttentionPath::kCluster;
    const std::vector<float> unfused_graph = run(unfused);
    CudaModelOptions unfused_late = unfused;
    unfused_late.o_allows_gate_up_early = false;
    CudaModelOptions unfused_eager = cuda_options(0, 1024, false, true);
    unfused_eager.decode_attention = DecodeAttentionPath::kCluster;
    INFO(spec.name << " unfused path: gate/up after O's wait, then eager launches");
    REQUIRE(run(unfused_late) == unfused_graph);
    REQUIRE(run(unfused_eager) == unfused_graph);
    // v6's two graphs, switching over at 14 keys (the steps read 12..20): eager launches
    // choose the same clusters step by step, so they agree bit for bit.
    CudaModelOptions switching = cuda_options();
    switching.short_attention_max_keys = 14;
    CudaModelOptions switching_eager = cuda_options(0, 1024, false, true);
    switching_eager.short_attention_max_keys = 14;
    INFO(spec.name << " v6 with a second graph up to 14 keys: graph, then eager launches");
    REQUIRE(run(switching) == run(switching_eager));
    // All three graphs: clusters of 4 up to 13 keys, 8 for 14 and 15, 16 from 16 keys on.
    for (CudaModelOptions* options : {&switching, &switching_eager}) {
      options->short_attention_max_keys = 13;
      options->long_attention_min_keys = 16;
    }
    INFO(spec.name << " v6 with three graphs (up to 13 keys, 14-15, from 16): graph, then eager launches");
    const std::vector<float> three_graphs = run(switching);
    REQUIRE(run(switching_eager) == three_graphs);
    // Gate/up's split past the short graph (3 loads a row before the wait, the rest once
    // they are in, by default) moves loads, not sums: unsplit, or with the rest after the
    // staging, or 1 load before the wait right after it, the same logits in a graph and
    // eagerly.
    struct SplitPastShort {
      int loads;
      SplitBatchRest rest;
    };
    for (const SplitPastShort split : {SplitPastShort{0, SplitBatchRest::kWhenFirstArrived},
                                       SplitPastShort{3, SplitBatchRest::kAfterStaging},
                                       SplitPastShort{1, SplitBatchRest::kAfterWait}}) {
      for (CudaModelOptions* options : {&switching, &switching_eager}) {
        options->gate_up_loads_before_wait_past_short_graph = split.loads;
        options->gate_up_split_rest_past_short_graph = split.rest;
      }
      INFO(spec.name << " gate/up's split past the short graph: " << split.loads << " loads before the wait, rest at moment "
                     << int(split.rest) << ": graph, then eager launches");
      REQUIRE(run(switching) == three_graphs);
      REQUIRE(run(switching_eager) == three_graphs);
    }
    for (CudaModelOptions* options : {&switching, &switching_eager}) {
      options->gate_up_loads_before_wait_past_short_graph = CudaModelOptions{}.gate_up_loads_before_wait_past_short_graph;
      options->gate_up_split_rest_past_short_graph = CudaModelOptions{}.gate_up_split_rest_past_short_graph;
    }
    // O scheduled after the attention's inputs in the long graph only: the same values.
    for (CudaModelOptions* options : {&switching, &switching_eager}) {
      options->attention_allows_o_after_inputs_in_long_graph = true;
    }
    INFO(spec.name << " the same, O after the attention's inputs from 16 keys on: graph, then eager launches");
    REQUIRE(run(switching) == three_graphs);
    REQUIRE(run(switching_eager) == three_graphs);
    // QKV and O on the register kernel in the long graph (their own sums there; the
    // default until the forty-fifth session): graph and eager launches still agree.
    for (CudaModelOptions* options : {&switching, &switching_eager}) options->tensor_core_gemvs_in_long_graph = 0;
    INFO(spec.name << " the same, QKV and O on the register kernel in the long graph: graph, then eager launches");
    const std::vector<float> register_gemvs_long = run(switching);
    REQUIRE(run(switching_eager) == register_gemvs_long);
    for (CudaModelOptions* options : {&switching, &switching_eager}) {
      options->tensor_core_gemvs_in_long_graph = CudaModelOptions{}.tensor_core_gemvs_in_long_graph;
    }
    // The O projection inside v6's clusters: its heads' shares summed in a fixed order by
    // whichever block arrives last, so graph and eager launches agree bit for bit, at
    // each of the three cluster sizes.
    for (CudaModelOptions* options : {&switching, &switching_eager}) options->experiments.v6_fuses_o = true;
    INFO(spec.name << " v6 with O inside, three graphs: graph, then eager launches");
    const std::vector<float> fused_three_graphs = run(switching);
    REQUIRE(run(switching_eager) == fused_three_graphs);
  }
}

TEST_CASE("CUDA model: the decode timeline changes no value and stamps every GEMV in order", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  const TinySpec& spec = kSpecs[0];
  const std::string dir = tiny_checkpoint(spec);
  const std::vector<int32_t> prompt = random_prompt(7, spec.V, seed);
  // The default attention (v6, a cluster per query head) and v5 (a cluster per kv head)
  // record the same events.
  for (const DecodeAttentionPath path : {DecodeAttentionPath::kClusterPerHead, DecodeAttentionPath::kCluster}) {
    INFO("attention path " << (path == DecodeAttentionPath::kCluster ? "v5" : "v6"));
    CudaModelOptions plain_options = cuda_options();
    plain_options.decode_attention = path;
    CudaModel plain(dir, plain_options);
    CudaModelOptions options = plain_options;
    options.experiments.decode_timeline = true;
    CudaModel timed(dir, options);
    REQUIRE(plain.decode_timeline(1).empty());  // off: nothing recorded
    REQUIRE(timed.prefill(prompt) == plain.prefill(prompt));
    const int32_t token = prompt.back();
    const std::vector<unsigned long long> t = timed.decode_timeline(token);  // a greedy step
    plain.decode_greedy(token);
    for (int32_t next : random_prompt(3, spec.V, seed + 1)) REQUIRE(timed.decode(next) == plain.decode(next));
    const int L = timed.config().num_hidden_layers;
    constexpr int kValues = 2 * kGemvTimelineEvents;  // min / max pairs, GemvTimelineEvent order
    constexpr int kLastEnd = 2 * kTimelineEnd + 1;
    constexpr int kAttentionValues = 2 * decode::kAttentionTimelineEvents;
    REQUIRE(t.size() == size_t(kValues) * (4 * L + 1) + size_t(kAttentionValues) * L);
    for (int launch = 0; launch < 4 * L + 1; ++launch) {
      const unsigned long long* v = &t[kValues * launch];
      INFO("launch " << launch << " (4 l + k; 4 L: lm_head)");
      for (int e = 0; e < kValues; ++e) REQUIRE((v[e] != 0 && v[e] != ~0ull));  // every pair was written
      for (int e = 0; e < kValues; e += 2) REQUIRE(v[e] <= v[e + 1]);  // first <= last
      // In each block the events come in order, so the first of each is after the first
      // of the one before, and the last after the last.
      for (int e = 2; e < kValues; ++e) REQUIRE(v[e - 2] <= v[e]);
      // Each GEMV's input is the previous GEMV's (or, for O, the attention's, which waits
      // for QKV): no wait returns before the previous GEMV's last block has ended.
      if (launch > 0) REQUIRE(v[2] >= t[kValues * (launch - 1) + kLastEnd]);
    }
    // Each layer's attention (chapter 07's v6 or v5 on sm_90; before it v3 runs and records
    // nothing): every pair written, its events in order, its wait after QKV's last block
    // ended, and O's wait after the attention's last block ended.
    if (device_is_sm90_or_newer()) {
      for (int l = 0; l < L; ++l) {
        const unsigned long long* a = &t[kValues * (4 * L + 1) + kAttentionValues * l];
        INFO("attention of layer " << l);
        for (int e = 0; e < kAttentionValues; ++e) REQUIRE((a[e] != 0 && a[e] != ~0ull));
        for (int e = 0; e < kAttentionValues; e += 2) REQUIRE(a[e] <= a[e + 1]);
        // Each block's events come in order. The events inside a split (inputs arrived,
        // states updated, warps merged) come only from blocks with keys, so across blocks:
        // the first "partial done" (an empty split's, right after its wait) follows the
        // first wait, not the first merge, and the last input arrival need not follow an
        // empty split's wait.
        using namespace decode;
        for (int e = 1; e < kAttentionTimelineEvents; ++e) {
          const int before = e == kAttentionPartialDone ? int(kAttentionWaitReturned) : e - 1;
          REQUIRE(a[2 * before] <= a[2 * e]);                                             // first
          if (e != kAttentionInputsArrived) REQUIRE(a[2 * (e - 1) + 1] <= a[2 * e + 1]);  // last
        }
        REQUIRE(a[2 * kAttentionWaitReturned + 1] <= a[2 * kAttentionPartialDone + 1]);
        REQUIRE(a[2] >= t[kValues * (4 * l) + kLastEnd]);             // after QKV's last block
        REQUIRE(t[kValues * (4 * l + 1) + 2] >= a[kAttentionValues - 1]);  // before O's wait returns
      }
    }
  }
  // The GEMVs timed alone (decode_timeline_attention false: the attention runs its lean
  // instance): every GEMV pair written, every attention pair as it was reset, the same
  // logits.
  CudaModelOptions options = cuda_options();
  options.experiments.decode_timeline = true;
  options.experiments.decode_timeline_attention = false;
  CudaModel gemvs_timed(dir, options);
  CudaModel plain(dir, cuda_options());
  REQUIRE(gemvs_timed.prefill(prompt) == plain.prefill(prompt));
  const std::vector<unsigned long long> t = gemvs_timed.decode_timeline(prompt.back());
  plain.decode_greedy(prompt.back());
  for (int32_t next : random_prompt(3, spec.V, seed + 2)) REQUIRE(gemvs_timed.decode(next) == plain.decode(next));
  const int L = gemvs_timed.config().num_hidden_layers;
  constexpr int kValues = 2 * kGemvTimelineEvents;
  for (int e = 0; e < kValues * (4 * L + 1); ++e) REQUIRE((t[e] != 0 && t[e] != ~0ull));
  for (size_t e = size_t(kValues) * (4 * L + 1); e < t.size(); ++e) REQUIRE(t[e] == (e % 2 == 0 ? ~0ull : 0ull));
}

TEST_CASE("CUDA model: greedy tokens equal the CPU backend's", "[ch08][gpu][model]") {
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    CudaModel cuda(dir, cuda_options());
    const std::vector<int32_t> prompt = random_prompt(19, spec.V, spec.seed + 7);
    constexpr int kSteps = 16;

    // CPU: greedy continuation and the margin of each choice.
    std::vector<int32_t> cpu_tokens;
    std::vector<double> margins;
    std::vector<float> logits = cpu.prefill(prompt);
    for (int i = 0; i < kSteps; ++i) {
      cpu_tokens.push_back(argmax(logits.data(), spec.V));
      margins.push_back(margin_of(logits));
      if (i + 1 < kSteps) logits = cpu.decode(cpu_tokens.back());
    }

    // CUDA: prefill (host argmax of its logits), then the GPU-side greedy loop.
    const std::vector<float> first_logits = cuda.prefill(prompt);
    const double max_error = [&] {
      cpu.reset();
      const std::vector<float> reference = cpu.prefill(prompt);
      double worst = 0;
      for (int v = 0; v < spec.V; ++v) worst = std::max(worst, std::fabs(double(first_logits[v]) - reference[v]));
      return worst;
    }();
    std::vector<int32_t> cuda_tokens = {argmax(first_logits.data(), spec.V)};
    const std::vector<int32_t> rest = cuda.generate_greedy(cuda_tokens[0], kSteps - 1);
    cuda_tokens.insert(cuda_tokens.end(), rest.begin(), rest.end());
    REQUIRE(cuda.position() == int(prompt.size()) + kSteps - 1);

    // Exact match is required wherever the CPU's choice is clear by more than a few
    // times the bf16 error of the logits; at a near tie a different choice is rounding,
    // not a bug (said, not hidden), and the sequences cannot be compared after it.
    // Since `clear` comes from the CUDA logits themselves, a floor too: every step on the
    // D = 128 model (its CPU margins are 61 and more); on the D = 64 model the first, as
    // its second step is a near tie (CPU margin 0.011: where the second session's run,
    // 2026-11-29, parted; the forty-eighth's matched all 16).
    const int least_equal = spec.D == 128 ? kSteps : 1;
    const double clear = 4.0 * max_error;
    int compared = 0;
    for (int i = 0; i < kSteps; ++i) {
      if (cuda_tokens[i] != cpu_tokens[i]) {
        INFO(spec.name << " step " << i << ": cuda " << cuda_tokens[i] << " cpu " << cpu_tokens[i] << " margin "
                       << margins[i] << " (clear above " << clear << ")");
        REQUIRE(margins[i] <= clear);
        WARN(spec.name << ": greedy differs from the CPU at step " << i << " at a near tie (margin " << margins[i]
                       << ", logit error " << max_error << ")");
        break;
      }
      ++compared;
    }
    std::printf("%s: greedy tokens equal to the CPU's for %d of %d steps (min margin %.3f, logit max err %.4f)\n",
                spec.name, compared, kSteps, *std::min_element(margins.begin(), margins.end()), max_error);
    INFO(spec.name << ": equal for " << compared << " steps, at least " << least_equal << " required");
    REQUIRE(compared >= least_equal);

    // The three decode entry points run the same graph: the same tokens.
    cuda.reset();
    cuda.prefill(prompt);
    std::vector<int32_t> one_by_one = {cuda_tokens[0]};
    for (int i = 1; i < kSteps; ++i) one_by_one.push_back(cuda.decode_greedy(one_by_one.back()));
    REQUIRE(one_by_one == cuda_tokens);
    cuda.reset();
    cuda.prefill(prompt);
    std::vector<int32_t> via_logits = {cuda_tokens[0]};
    for (int i = 1; i < kSteps; ++i) {
      const std::vector<float> step = cuda.decode(via_logits.back());
      via_logits.push_back(argmax(step.data(), spec.V));
    }
    REQUIRE(via_logits == cuda_tokens);
  }
}

TEST_CASE("CUDA model: generate_greedy gives the same tokens with several steps a graph, with a copy a step, "
          "with the input embedded by each step, and with the argmax folded into the lm_head",
          "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    // From position 20 to 140 a generation runs in all three kinds of decode graph: the
    // short one up to 40 keys, the default one, the long one from 90 (thresholds moved
    // down from the defaults, 256 and 1280, to fit the generation inside the tiny models'
    // 320 and 160 positions). With 3 and 8 steps a graph, some runs of steps straddle a
    // switch and take single steps there.
    const std::vector<int32_t> prompt = random_prompt(20, spec.V, seed);
    constexpr int kSteps = 120;
    // Variants 0-4 take the next input from the argmax (argmax_writes_next_input, the
    // default); 5 and the reference 6 embed the token in every step, as before it; 7 and
    // 8 fold the argmax into the lm_head (argmax_in_lm_head) or do not, whichever the
    // default does not, queued (7) and one step at a time (8).
    constexpr int kVariants = 9, kReference = 6;
    const bool folded_by_default = CudaModelOptions{}.argmax_in_lm_head;
    std::vector<std::vector<int32_t>> runs;
    for (int variant = 0; variant < kVariants; ++variant) {
      CudaModelOptions options = cuda_options();
      options.short_attention_max_keys = 40;
      options.long_attention_min_keys = 90;
      const bool default_steps = variant == 0 || variant == 5 || variant == 7;
      options.decode_graph_steps =
          default_steps ? CudaModelOptions{}.decode_graph_steps : variant == 1 ? 3 : variant == 2 ? 8 : 1;
      options.experiments.generate_copy_each_token = variant == 3;
      options.argmax_writes_next_input = variant < 5 || variant >= 7;
      if (variant >= 7) options.argmax_in_lm_head = !folded_by_default;
      CudaModel cuda(dir, options);
      const std::vector<float> logits = cuda.prefill(prompt);
      const int32_t first = argmax(logits.data(), spec.V);
      std::vector<int32_t> tokens;
      if (variant == 4 || variant == kReference || variant == 8) {  // one step at a time
        tokens.push_back(cuda.decode_greedy(first));
        for (int i = 1; i < kSteps; ++i) tokens.push_back(cuda.decode_greedy(tokens.back()));
      } else {
        // In two calls: the second starts where the first left the cache and the history.
        tokens = cuda.generate_greedy(first, 51);
        const std::vector<int32_t> rest = cuda.generate_greedy(tokens.back(), kSteps - 51);
        tokens.insert(tokens.end(), rest.begin(), rest.end());
      }
      REQUIRE(cuda.position() == int(prompt.size()) + kSteps);
      REQUIRE(tokens.size() == size_t(kSteps));
      REQUIRE(std::all_of(tokens.begin(), tokens.end(), [&](int32_t t) { return t >= 0 && t < spec.V; }));
      runs.push_back(tokens);
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      if (int(i) == kReference) continue;
      INFO(spec.name << " variant " << i
                     << " (0: the default steps a graph, 1: 3 steps, 2: 8 steps, 3: a step a graph and a copy a step, "
                        "4: decode_greedy, 5: the default steps with the token embedded by each step, 7: the default "
                        "steps with the argmax folded into the lm_head or not, the other way from the default, 8: "
                        "decode_greedy so) against decode_greedy with the token embedded by each step");
      REQUIRE(runs[i] == runs[kReference]);
    }
    // A sequence of few distinct tokens proves less about the order (the argmax kernel's
    // test checks where the history puts each token).
    const size_t distinct = std::set<int32_t>(runs[0].begin(), runs[0].end()).size();
    if (distinct <= 3) WARN(spec.name << ": only " << distinct << " distinct tokens in the generation");
    std::printf("%s: %d greedy steps, %zu distinct tokens, the same in all %d forms\n", spec.name, kSteps, distinct,
                kVariants);

    // decode() and decode_sample() write the token from the host, then embed it
    // (embed_host_token): the logits equal, bit for bit, those of steps that embed it
    // themselves, and so does a sampled token.
    // The argmax folded into the lm_head (or not: the other way from the default) writes
    // the same logits too.
    CudaModelOptions by_argmax = cuda_options(), by_step = cuda_options(), other_fold = cuda_options();
    by_step.argmax_writes_next_input = false;
    other_fold.argmax_in_lm_head = !folded_by_default;
    CudaModel a(dir, by_argmax), b(dir, by_step), c(dir, other_fold);
    const std::vector<float> prompt_logits = b.prefill(prompt);
    REQUIRE(a.prefill(prompt) == prompt_logits);
    REQUIRE(c.prefill(prompt) == prompt_logits);
    int32_t token = runs[kReference][0];
    for (int i = 0; i < 6; ++i) {
      const std::vector<float> from_argmax = a.decode(token), from_step = b.decode(token);
      REQUIRE(from_argmax == from_step);
      REQUIRE(c.decode(token) == from_step);
      token = argmax(from_argmax.data(), spec.V);
    }
    REQUIRE(c.position() == a.position());
    SamplerOptions sampled;
    sampled.temperature = 0.8f;
    sampled.top_k = 20;
    sampled.seed = seed;
    Sampler sampler_a(sampled), sampler_b(sampled);
    for (int i = 0; i < 6; ++i) {
      const int32_t next_a = a.decode_sample(token, sampler_a), next_b = b.decode_sample(token, sampler_b);
      REQUIRE(next_a == next_b);
      token = next_a;
    }
    REQUIRE(a.generate_greedy(token, 9) == b.generate_greedy(token, 9));
  }
}

TEST_CASE("CUDA model: context overflow throws before touching the cache", "[ch08][gpu][model]") {
  const TinySpec& spec = kSpecs[0];
  const std::string dir = tiny_checkpoint(spec);
  CudaModel cuda(dir, cuda_options(24));
  REQUIRE(cuda.context_size() == 24);
  const std::vector<int32_t> prompt = random_prompt(20, spec.V, 5);
  REQUIRE_THROWS_AS(cuda.prefill(random_prompt(25, spec.V, 6)), std::length_error);
  REQUIRE(cuda.position() == 0);
  const std::vector<float> expected = cuda.prefill(prompt);
  REQUIRE_THROWS_AS(cuda.generate_greedy(3, 5), std::length_error);  // 20 + 5 > 24: nothing runs
  REQUIRE(cuda.position() == 20);
  REQUIRE(cuda.generate_greedy(3, 4).size() == 4);
  REQUIRE(cuda.position() == 24);
  REQUIRE_THROWS_AS(cuda.decode(3), std::length_error);
  REQUIRE_THROWS_AS(cuda.decode_greedy(3), std::length_error);
  REQUIRE_THROWS_AS(cuda.prefill({1}), std::length_error);
  REQUIRE(cuda.position() == 24);
  // Bad input is refused the same way, and the model stays usable.
  cuda.reset();
  REQUIRE_THROWS_AS(cuda.decode(spec.V), std::out_of_range);
  REQUIRE_THROWS_AS(cuda.decode(-1), std::out_of_range);
  REQUIRE_THROWS_AS(cuda.prefill({1, spec.V}), std::out_of_range);
  REQUIRE_THROWS_AS(cuda.prefill({}), std::invalid_argument);
  REQUIRE(cuda.position() == 0);
  REQUIRE(cuda.prefill(prompt) == expected);  // reset() really forgets, deterministically
  // A context larger than the model's positions is refused, and so are negative options.
  REQUIRE_THROWS_AS(CudaModel(dir, cuda_options(spec.max_pos + 1)), std::invalid_argument);
  CudaModelOptions negative = cuda_options();
  negative.short_attention_max_keys = -1;
  REQUIRE_THROWS_AS(CudaModel(dir, negative), std::invalid_argument);
  negative = cuda_options();
  negative.long_attention_splits = -1;
  REQUIRE_THROWS_AS(CudaModel(dir, negative), std::invalid_argument);
}

TEST_CASE("CUDA model: decode_sample draws the tokens the host draws from decode's logits", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    const std::vector<int32_t> prompt = random_prompt(9, spec.V, seed);
    // The chat's defaults; the unranked walk; top-p alone (ranked on the GPU: V <= 1024); greedy.
    for (const SamplerOptions& options : {SamplerOptions{0.8f, 40, 0.9f, seed}, SamplerOptions{1.0f, 0, 1.0f, seed},
                                          SamplerOptions{0.7f, 0, 0.9f, seed}, SamplerOptions{0.0f, 0, 1.0f, seed}}) {
      INFO(spec.name << ": temperature " << options.temperature << ", top_k " << options.top_k << ", top_p "
                     << options.top_p);
      CudaModel on_gpu(dir, cuda_options()), on_host(dir, cuda_options());
      Sampler gpu_sampler(options), host_sampler(options);
      int32_t gpu_token = gpu_sampler.sample(on_gpu.prefill(prompt));
      int32_t host_token = host_sampler.sample(on_host.prefill(prompt));
      REQUIRE(gpu_token == host_token);
      for (int step = 0; step < 16; ++step) {
        INFO("step " << step);
        gpu_token = on_gpu.decode_sample(gpu_token, gpu_sampler);
        host_token = host_sampler.sample(on_host.decode(host_token));
        REQUIRE(gpu_token == host_token);
        REQUIRE(on_gpu.position() == on_host.position());
      }
    }
  }
}

TEST_CASE("CUDA model: decode_sample leaves a nucleus past the ranked tokens to the host, same draws",
          "[ch08][gpu][model]") {
  // A vocabulary past kGpuSamplerMaxTopK and a high temperature (a flat distribution):
  // top-p 0.95's nucleus holds more than the 1024 tokens the kernel ranks, so the kernel
  // draws nothing and decode_sample copies the logits back and draws on the host.
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const TinySpec wide = {"wide_vocab", 128, 2, 1, 64, 192, 1, 2051, 1e4, 1e-6, true, false, 64, 813};
  const std::string dir = tiny_checkpoint(wide);
  const std::vector<int32_t> prompt = random_prompt(5, wide.V, seed);
  const SamplerOptions options{8.0f, 0, 0.95f, seed};
  CudaModel on_gpu(dir, cuda_options()), on_host(dir, cuda_options());
  Sampler gpu_sampler(options), host_sampler(options);
  int32_t gpu_token = gpu_sampler.sample(on_gpu.prefill(prompt));
  int32_t host_token = host_sampler.sample(on_host.prefill(prompt));
  REQUIRE(gpu_token == host_token);
  int past_ranked = 0;
  for (int step = 0; step < 8; ++step) {
    INFO("step " << step);
    gpu_token = on_gpu.decode_sample(gpu_token, gpu_sampler);
    const std::vector<float> logits = on_host.decode(host_token);
    past_ranked += host_sampler.candidates(logits.data(), wide.V).size() > size_t(kGpuSamplerMaxTopK);
    host_token = host_sampler.sample(logits);
    REQUIRE(gpu_token == host_token);
  }
  INFO("steps whose nucleus held more than " << kGpuSamplerMaxTopK << " tokens: " << past_ranked);
  REQUIRE(past_ranked > 0);  // the host's draw was taken: the case this test is for
}


// Last (this file is the program's last source, so its cases register last): an
// experimental kernel; a device fault in it would poison the context for any test case
// after it.
TEST_CASE("CUDA model: the persistent decode step matches the CPU backend", "[ch08][gpu][model]") {
  const uint64_t seed = fresh_seed();
  INFO("prompt seed " << seed);
  for (const TinySpec& spec : kSpecs) {
    const std::string dir = tiny_checkpoint(spec);
    const ModelConfig config = load_model_config(dir + "/config.json");
    if (!decode_step_persistent_supported(config.head_dim, config.num_attention_heads,
                                          config.num_key_value_heads)) {
      WARN("no cooperative launch on this device: persistent decode not tested");
      return;
    }
    CpuModel cpu(dir, CpuModelOptions{2, 0});
    const std::vector<int32_t> prompt = random_prompt(21, spec.V, seed);
    const std::vector<float> expected = cpu.prefill(prompt, Logits::kAll);
    // The register-load kernel on 1 and 2 blocks per SM; the streamed kernel with its
    // default 6 KB slots (several tiny units per stage), with 2 and 1 slots a warp (every
    // slot reused many times a step: the barrier parities wrap), and with 256-byte slots
    // (every unit larger than a slot, so every row streams in chunks that end at odd
    // columns, as Bielik's down projection does with its 17.5 KB rows). On these models
    // most warps have no unit, or one, in a phase.
    struct Variant {
      const char* name;
      int blocks_per_sm;
      bool stream;
      int ring_stages;
      int slot_bytes;
    };
    for (const Variant& v : {Variant{"1 block/SM", 1, false, 0, 0}, Variant{"2 blocks/SM", 2, false, 0, 0},
                             Variant{"streamed, largest rings", 1, true, 0, 0},
                             Variant{"streamed, 2 slots a warp", 1, true, 2, 0},
                             Variant{"streamed, 1 slot a warp", 1, true, 1, 0},
                             Variant{"streamed, 256-byte slots", 1, true, 3, 256}}) {
      if (v.stream && !decode_step_streamed_supported(config.head_dim, config.num_attention_heads,
                                                      config.num_key_value_heads)) {
        WARN("no bulk-copy engine (sm_90) on this device: streamed decode not tested");
        continue;
      }
      CudaModelOptions options = cuda_options();
      options.experiments.persistent_decode = true;
      options.experiments.persistent_blocks_per_sm = v.blocks_per_sm;
      options.experiments.persistent_weight_stream = v.stream;
      options.experiments.persistent_ring_stages = v.ring_stages;
      options.experiments.persistent_slot_bytes = v.slot_bytes;
      options.experiments.persistent_phase_clock = true;
      CudaModel cuda(dir, options);
      // A prefill of 5 tokens (the ordinary kernels), then the persistent step on top
      // of that cache, one token at a time, 3 times over: the kernel resets its grid
      // barrier, so it can run again and again.
      double worst = 0;
      for (int round = 0; round < 3; ++round) {
        cuda.reset();
        const std::vector<float> first =
            cuda.prefill(std::vector<int32_t>(prompt.begin(), prompt.begin() + 5), Logits::kAll);
        for (size_t t = 5; t < prompt.size(); ++t) {
          const std::vector<float> step = cuda.decode(prompt[t]);
          REQUIRE(cuda.position() == int(t + 1));
          worst = std::max(worst, require_rows_close(std::string(spec.name) + " persistent step " + std::to_string(t) +
                                                         " " + v.name,
                                                     step, row_of(expected, spec.V, t), spec.V, kModelTolerance));
        }
      }
      // The greedy path (argmax on the GPU, steps back to back) runs the same kernel.
      cuda.reset();
      cuda.prefill(std::vector<int32_t>(prompt.begin(), prompt.begin() + 5));
      const std::vector<int32_t> tokens = cuda.generate_greedy(prompt[5], 8);
      REQUIRE(tokens.size() == 8);
      for (int32_t token : tokens) REQUIRE((token >= 0 && token < spec.V));
      REQUIRE(cuda.position() == 5 + 8);
      // The phase clock of the last step: a time at the start and after each of the
      // 6 L + 2 grid barriers, never going back.
      const std::vector<unsigned long long> clock = cuda.persistent_phase_clock();
      const size_t times = size_t(6 * config.num_hidden_layers + 3);
      const size_t sms = size_t(multiprocessor_count());
      REQUIRE(clock.size() == times + 15 + 5 * sms);
      for (size_t i = 1; i < times; ++i) REQUIRE(clock[i] >= clock[i - 1]);
      REQUIRE(clock[times - 1] > clock[0]);
      for (int kind = 0; kind < 5; ++kind) {  // the streamed step counts: waited + requesting <= the phase
        const unsigned long long waited = clock[times + 3 * kind], requesting = clock[times + 3 * kind + 1],
                                 phase = clock[times + 3 * kind + 2];
        if (v.stream) {
          REQUIRE(phase > 0);
          REQUIRE(waited + requesting <= phase);
        } else {  // the register kernel has no slots
          REQUIRE(waited == 0);
          REQUIRE(requesting == 0);
          REQUIRE(phase == 0);
        }
        for (size_t b = 0; b < sms; ++b) {  // every block's time in its share: the streamed step only
          const unsigned long long block_ns = clock[times + 15 + kind * sms + b];
          if (v.stream) {
            REQUIRE(block_ns > 0);
          } else {
            REQUIRE(block_ns == 0);
          }
        }
      }
      std::printf("%s: persistent decode (%s) vs CPU, 3 x 16 steps, worst rel err %.2e\n", spec.name, v.name,
                  worst);
    }
    if (decode_step_streamed_supported(config.head_dim, config.num_attention_heads, config.num_key_value_heads)) {
      CudaModelOptions negative = cuda_options();  // a negative slot count is refused at load
      negative.experiments.persistent_decode = true;
      negative.experiments.persistent_weight_stream = true;
      negative.experiments.persistent_ring_stages = -1;
      REQUIRE_THROWS_AS(CudaModel(dir, negative), std::invalid_argument);
    }
  }
}
