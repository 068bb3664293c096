// Chapter 08, CPU: what the CUDA backend refuses before it touches the GPU. A model its
// kernels cannot run (a head_dim the attention kernels lack, a row longer than the decode
// GEMV stages) and every out-of-range option are refused while the constructor reads
// config.json, before the KV cache is allocated or a weight copied: so these checks run
// on any machine, CI's included, and a bad flag never costs a 3 GB load. The numerics of
// the backend are test_model_cuda.cu's (GPU).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "catch_compat.hpp"
#include "decode_kernels.cuh"  // kDecodeGemvMaxK
#include "matmul.cuh"          // chapter 03: kMatmulV6MaxTokens
#include "model_config.hpp"
#include "model_cuda.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

// A folder with a config.json and nothing else (C = 200, H = 4, Hkv = 2, D = 64: a shape
// the backend runs, but for the intermediate size given), removed at the end of scope.
struct ConfigOnlyFolder {
  std::string path;
  ConfigOnlyFolder(const std::string& name, int intermediate_size) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("bielik_ch08_refusals_" + std::to_string(getpid()) + "_" + name);
    fs::create_directories(dir);
    nlohmann::json config = {{"hidden_size", 200},
                             {"intermediate_size", intermediate_size},
                             {"num_hidden_layers", 2},
                             {"num_attention_heads", 4},
                             {"num_key_value_heads", 2},
                             {"head_dim", 64},
                             {"vocab_size", 1003},
                             {"max_position_embeddings", 320}};
    std::ofstream(dir / "config.json") << config.dump(2);
    path = dir.string();
  }
  ~ConfigOnlyFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

TEST_CASE("CUDA model: a head_dim the attention kernels lack is refused at load", "[ch08][cpu][model]") {
  // The golden tiny models (golden/gen_08_tiny_model.py) have D = 16.
  const std::string golden = golden_path("08_bielik", "tiny_bielik");
  bool refused = false;
  try {
    CudaModel model(golden);
  } catch (const std::invalid_argument& e) {
    refused = std::string(e.what()).find("head_dim") != std::string::npos;
    INFO(e.what());
  }
  REQUIRE(refused);
}

TEST_CASE("CUDA model: a shape past the decode GEMV's rows is refused before any weight is read",
          "[ch08][cpu][model]") {
  // Bielik's shape runs; then C and F each at the decode GEMV's limit and 8 values (one
  // 16-byte piece) past it, and H D at it and one head past it.
  ModelConfig bielik;
  bielik.hidden_size = 1536;
  bielik.intermediate_size = 8960;
  bielik.num_hidden_layers = 32;
  bielik.num_attention_heads = 12;
  bielik.num_key_value_heads = 2;
  bielik.head_dim = 128;
  bielik.vocab_size = 32000;
  REQUIRE(cuda_backend_unsupported_reason(bielik).empty());
  for (int which = 0; which < 3; ++which) {
    for (int past : {0, 8}) {
      ModelConfig c = bielik;
      const int K = kDecodeGemvMaxK + past;
      if (which == 0) c.hidden_size = K;
      if (which == 1) c.intermediate_size = K;
      if (which == 2) c.num_attention_heads = c.num_key_value_heads = K / c.head_dim + (past > 0 ? 1 : 0);
      const std::string why = cuda_backend_unsupported_reason(c);
      INFO("C " << c.hidden_size << ", F " << c.intermediate_size << ", H D " << c.num_attention_heads * c.head_dim
                << ": '" << why << "'");
      REQUIRE(why.empty() == (past == 0));
      if (past > 0) REQUIRE(contains(why, std::to_string(kDecodeGemvMaxK)));
    }
  }
  // At load: a config.json alone, with F past the limit. The refusal comes before the
  // checkpoint is opened (there is none: opening it would throw std::runtime_error).
  const ConfigOnlyFolder wide_mlp("wide_mlp", kDecodeGemvMaxK + 8);
  const std::string message = error_of<std::invalid_argument>([&] { CudaModel model(wide_mlp.path); });
  INFO(message);
  REQUIRE(contains(message, "intermediate_size"));
  REQUIRE(contains(message, std::to_string(kDecodeGemvMaxK)));
}

TEST_CASE("CUDA model: out-of-range decode options are refused at load, naming the option", "[ch08][cpu][model]") {
  // A config.json alone: the options are checked before the KV cache is allocated and
  // the checkpoint opened, so an option that is not refused fails the test with the
  // missing checkpoint's std::runtime_error (or, without a GPU, the CUDA error of the
  // first allocation), not std::invalid_argument.
  const ConfigOnlyFolder folder("options", 344);
  const std::string dir = folder.path;
  // Whether loading with `options` throws std::invalid_argument with `name` in its message.
  auto refused_naming = [&](const CudaModelOptions& options, const std::string& name) {
    try {
      CudaModel model(dir, options);
    } catch (const std::invalid_argument& e) {
      INFO(e.what());
      return std::string(e.what()).find(name) != std::string::npos;
    }
    return false;
  };
  for (int which = 0; which < 17; ++which) {
    CudaModelOptions options;
    int* option[] = {&options.attention_splits,
                     &options.experiments.attention_min_keys_per_split,
                     &options.attention_o_replicas,
                     &options.experiments.decode_shared_carveout,
                     &options.experiments.decode_shared_carveout,
                     &options.experiments.gate_up_hold_blocks,
                     &options.down_start_delay_ns,
                     &options.experiments.qkv_start_delay_ns,
                     &options.experiments.o_start_delay_ns,
                     &options.experiments.lm_head_start_delay_ns,
                     &options.experiments.gate_up_loads_before_wait,
                     &options.experiments.down_loads_before_wait,
                     &options.experiments.lm_head_loads_before_wait,
                     &options.gate_up_loads_before_wait_past_short_graph,
                     &options.experiments.o_loads_before_wait,
                     &options.gate_up_split_blocks,
                     &options.gate_up_split_blocks_in_long_graph};
    // replicas: at least one; carveout: -1 or a percent
    const int bad_value[] = {-1, -1, 0, -2, 101, -1, -5, -1, -300, -1, -1, -2, -1, -3, -1, -2, -1};
    *option[which] = bad_value[which];
    // The messages name an experiment's field as experiments.X (CudaModelOptions::experiments).
    const char* names[] = {"attention_splits",
                           "experiments.attention_min_keys_per_split",
                           "attention_o_replicas",
                           "experiments.decode_shared_carveout",
                           "experiments.decode_shared_carveout",
                           "experiments.gate_up_hold_blocks",
                           "down_start_delay_ns",
                           "experiments.qkv_start_delay_ns",
                           "experiments.o_start_delay_ns",
                           "experiments.lm_head_start_delay_ns",
                           "experiments.gate_up_loads_before_wait",
                           "experiments.down_loads_before_wait",
                           "experiments.lm_head_loads_before_wait",
                           "gate_up_loads_before_wait_past_short_graph",
                           "experiments.o_loads_before_wait",
                           "gate_up_split_blocks",
                           "gate_up_split_blocks_in_long_graph"};
    INFO(names[which]);
    REQUIRE(refused_naming(options, names[which]));
  }
  // A moment for the rest of a split batch, with no batch split.
  {
    CudaModelOptions options;
    options.experiments.split_batch_rest = SplitBatchRest::kWhenFirstArrived;
    REQUIRE(refused_naming(options, "experiments.split_batch_rest"));
  }
  // O's split with O's input read in place (no batch of its own to split).
  {
    CudaModelOptions options;
    options.experiments.o_loads_before_wait = 3;
    options.experiments.o_input_from_global = true;
    REQUIRE(refused_naming(options, "experiments.o_loads_before_wait"));
  }
  // No decode steps in a graph, or too many.
  for (int steps : {0, 65}) {
    CudaModelOptions options;
    options.decode_graph_steps = steps;
    REQUIRE(refused_naming(options, "decode_graph_steps"));
  }
  // gemv_v2 for more rows than it takes.
  {
    CudaModelOptions options;
    options.experiments.prefill_gemv_max_tokens = 17;
    REQUIRE(refused_naming(options, "experiments.prefill_gemv_max_tokens"));
  }
  // v6 for more rows than it takes.
  {
    CudaModelOptions options;
    options.prefill_v6_max_tokens = kMatmulV6MaxTokens + 1;
    REQUIRE(refused_naming(options, "prefill_v6_max_tokens"));
  }
  // No room for a single prefill graph.
  {
    CudaModelOptions options;
    options.prefill_graph_cache = 0;
    REQUIRE(refused_naming(options, "prefill_graph_cache"));
  }
  // A negative L2 set-aside.
  {
    CudaModelOptions options;
    options.experiments.l2_persist_mb = -1.0;
    REQUIRE(refused_naming(options, "experiments.l2_persist_mb"));
  }
  // The side branch's options: sizes, blocks, fork point, stride.
  for (int which = 0; which < 5; ++which) {
    CudaModelOptions options;
    options.experiments.side_prefetch_gate_up_mb = which == 0 ? -1.0 : 1.0;
    options.experiments.side_prefetch_down_mb = which == 1 ? -0.5 : 0.0;
    options.experiments.side_prefetch_blocks = which == 2 ? 0 : 8;
    options.experiments.side_prefetch_fork = which == 3 ? 2 : 0;
    options.experiments.side_prefetch_stride_bytes = which == 4 ? 48 : 128;
    INFO("side_prefetch option " << which);
    REQUIRE(refused_naming(options, "experiments.side_prefetch"));
  }
}
