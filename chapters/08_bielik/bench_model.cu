// The model benchmark (issue 7): the whole CUDA backend on a Bielik-shaped checkpoint.
//
//   bench_model [--model models/bielik-shaped-random] [--out build/bench/model.json]
//               [--decode-tokens 256] [--context N]
//
// Measures, batch 1, bf16, every number a median of several runs:
//  * the device-to-device copy bandwidth (read + write), the ceiling of the decode step;
//  * time to first token (prefill + the last token's logits back on the host) at prompts
//    of 16, 128, 512 and 2048 tokens, each run from an empty cache;
//  * decode tokens/s over 256 greedy tokens (EOS ignored) through the CUDA graph, all
//    steps queued back to back (generate_greedy); also with a host round trip per token,
//    without PDL, and without the graph, to show what each of those is worth, and with
//    other GEMV occupancies;
//  * weight bytes read per token / time, against the copy bandwidth;
//  * GPU memory used by the model (cudaMemGetInfo) against weights + KV cache;
//  * one decode step kernel by kernel: the step launched eagerly (no graph, no PDL) with
//    an event after each kernel class, summed over the layers. The sum is larger than the
//    graph's step: it pays every launch and drain that the graph and PDL hide;
//  * one 512-token prefill kernel by kernel, the same way.
// Writes JSON for scripts/make_bench_report.py and prints the tables.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "decode_kernels.cuh"  // GemvTimelineEvent
#include "device_buffer.cuh"
#include "matmul.cuh"         // chapter 03: kGemvV2MaxTokens
#include "matmul_common.cuh"  // chapter 03: multiprocessor_count
#include "model_cuda.hpp"
#include "sample_kernels.cuh"

using namespace bielik;

namespace {

struct Args {
  std::string model = "models/bielik-shaped-random";
  std::string out = "build/bench/model.json";
  int decode_tokens = 256;
  int prompt_tokens = 16;  ///< --decode-only: the prompt before the decoded tokens
  int context = 0;
  bool ttft_only = false;    ///< load, compare TTFT with v6 and v5 prefill attention, stop
  bool ttft_rows_ab = false;  ///< with ttft_only: A/B the last layer's rows only (on / off), not the attention
  bool prefill_all_rows = false;  ///< --prefill-all-rows: prefill_last_layer_rows_only off
  bool ttft_graph_ab = false;      ///< with ttft_only: A/B the prefill graphs (on / off)
  bool ttft_gemv_ab = false;       ///< with ttft_only: A/B gemv_v2 for short prefills (on / off)
  int prefill_gemv_max_tokens = DecodeExperiments{}.prefill_gemv_max_tokens;  ///< --prefill-gemv N
  bool ttft_v6_ab = false;  ///< with ttft_only: A/B chapter 03's v6 for prefills of up to 64 tokens (on / off)
  int prefill_v6_max_tokens = CudaModelOptions{}.prefill_v6_max_tokens;  ///< --prefill-v6 N
  bool no_prefill_graphs = false;  ///< --no-prefill-graphs: prefill_graphs off
  bool timeline = false;     ///< load, print the decode GEMVs' timeline (one step), stop
  bool timeline_attention = true;  ///< --timeline-gemvs-only: false (the attention's stamps left out)
  bool sampling_only = false;  ///< load, print the sampling table, stop
  bool gate_up_after_o = false;  ///< o_allows_gate_up_early = false
  bool fused_mlp = DecodeExperiments{}.fused_mlp;  ///< --fused-mlp / --no-fused-mlp
  int fused_mlp_before_wait = DecodeExperiments{}.fused_mlp_values_before_wait;  ///< --fused-mlp-before-wait N
  int fused_mlp_block_warps = DecodeExperiments{}.fused_mlp_block_warps;  ///< --fused-mlp-block-warps N
  int fused_mlp_blocks = DecodeExperiments{}.fused_mlp_blocks;            ///< --fused-mlp-blocks N
  int decode_graph_steps = CudaModelOptions{}.decode_graph_steps;        ///< --decode-graph-steps N
  bool generate_copy_each_token = false;                                  ///< --copy-each-token
  bool embed_each_step = false;  ///< --embed-each-step: argmax_writes_next_input off
  int argmax_in_lm_head = -1;    ///< --argmax-in-lm-head 0|1: CudaModelOptions::argmax_in_lm_head (-1: default)
  int fused_mlp_delay = DecodeExperiments{}.fused_mlp_start_delay_ns;    ///< --fused-mlp-start-delay NS
  bool prefill_attention_clusters = true;  ///< --prefill-attention v6 (default) or v5
  bool decode_only = false;  ///< load, decode, print tokens/s, stop (for a profiler's timeline)
  DecodeAttentionPath attention = CudaModelOptions{}.decode_attention;
  int replicas = CudaModelOptions{}.attention_o_replicas;
  int splits = CudaModelOptions{}.attention_splits;
  int short_max_keys = CudaModelOptions{}.short_attention_max_keys;  ///< --short-max-keys (0: one decode graph)
  int short_splits = CudaModelOptions{}.short_attention_splits;      ///< --short-splits: that graph's cluster size
  int long_min_keys = CudaModelOptions{}.long_attention_min_keys;    ///< --long-min-keys (0: no third graph)
  int long_splits = CudaModelOptions{}.long_attention_splits;        ///< --long-splits: that graph's cluster size
  V6Handover v6_handover = CudaModelOptions{}.v6_handover;           ///< --v6-handover pull|barrier|mbarrier
  bool v6_with_o = DecodeExperiments{}.v6_fuses_o;                    ///< --v6-with-o / --no-v6-with-o
  int attention_o_blocks = DecodeExperiments{}.attention_o_blocks;     ///< --attention-o-blocks N
  bool streamed = false;  ///< --streamed: the streamed persistent step instead of the graph
  int ring_slots = 0;     ///< --ring-slots N: its slots a warp (0: as many as fit)
  int slot_bytes = 0;     ///< --slot-bytes N: its slots' size (0: the default)
  bool v6_with_o_late = DecodeExperiments{}.v6_fused_o_late_weights;  ///< --v6-with-o-late-weights
  bool o_after_attention_inputs = DecodeExperiments{}.attention_allows_o_after_inputs;
  bool o_after_attention_inputs_long = CudaModelOptions{}.attention_allows_o_after_inputs_in_long_graph;
  int carveout = DecodeExperiments{}.decode_shared_carveout;  ///< --carveout PERCENT (-1: none)
  bool hold_o = DecodeExperiments{}.o_holds_for_attention_inputs;     ///< --hold-o
  int hold_gate_up = DecodeExperiments{}.gate_up_hold_blocks;         ///< --hold-gate-up N
  bool hold_until_end = DecodeExperiments{}.hold_until_attention_end;  ///< --hold-until-attention-end
  int hold_gate_up_from = DecodeExperiments{}.gate_up_hold_first_block;  ///< --hold-gate-up-from N
  int gate_up_delay = CudaModelOptions{}.gate_up_start_delay_ns;        ///< --gate-up-start-delay NS
  int gate_up_loads_before_wait = 0;  ///< --gate-up-loads-before-wait N
  int down_loads_before_wait = 0;     ///< --down-loads-before-wait N
  int lm_head_loads_before_wait = 0;  ///< --lm-head-loads-before-wait N
  SplitBatchRest split_rest = SplitBatchRest::kAfterStaging;  ///< --split-batch-rest WHEN
  int gate_up_loads_before_wait_past_short =
      CudaModelOptions{}.gate_up_loads_before_wait_past_short_graph;  ///< --gate-up-loads-before-wait-past-short N
  SplitBatchRest split_rest_past_short =
      CudaModelOptions{}.gate_up_split_rest_past_short_graph;  ///< --split-batch-rest-past-short WHEN
  int o_loads_before_wait = DecodeExperiments{}.o_loads_before_wait;  ///< --o-loads-before-wait N
  SplitBatchRest o_split_rest = DecodeExperiments{}.o_split_rest;     ///< --o-split-rest WHEN
  int gate_up_split_blocks = CudaModelOptions{}.gate_up_split_blocks;  ///< --gate-up-split-blocks N
  int gate_up_split_blocks_long =
      CudaModelOptions{}.gate_up_split_blocks_in_long_graph;  ///< --gate-up-split-blocks-long N
  int down_delay = CudaModelOptions{}.down_start_delay_ns;              ///< --down-start-delay NS
  int qkv_delay = DecodeExperiments{}.qkv_start_delay_ns;                ///< --qkv-start-delay NS
  int o_delay = DecodeExperiments{}.o_start_delay_ns;                    ///< --o-start-delay NS
  int lm_head_delay = DecodeExperiments{}.lm_head_start_delay_ns;        ///< --lm-head-start-delay NS
  bool qkv_early = DecodeExperiments{}.qkv_allows_attention_early;
  bool widen_input = CudaModelOptions{}.gemv_widen_input;  ///< --widen-input / --no-widen-input
  bool bulk_staging = DecodeExperiments{}.gemv_stage_input_bulk;  ///< --bulk-staging
  bool down_shared = DecodeExperiments{}.down_second_batch_in_shared;
  bool gate_up_shared = DecodeExperiments{}.gate_up_second_batch_in_shared;
  bool shared_after_staging = DecodeExperiments{}.second_batch_after_staging;
  bool down_global_input = DecodeExperiments{}.down_input_from_global;
  bool o_global_input = DecodeExperiments{}.o_input_from_global;
  bool rope_after_wait = DecodeExperiments{}.qkv_rope_inputs_after_wait;
  int small_blocks = CudaModelOptions{}.small_gemv_blocks_per_sm;
  int large_blocks = CudaModelOptions{}.large_gemv_blocks_per_sm;
  double side_prefetch_gate_up_mb = 0.0;  ///< --side-prefetch GATE_UP_MB[,DOWN_MB]
  double side_prefetch_down_mb = 0.0;
  L2PrefetchForm side_prefetch_form = L2PrefetchForm::kLines;  ///< --side-prefetch-form lines|bulk|loads
  int side_prefetch_blocks = DecodeExperiments{}.side_prefetch_blocks;  ///< --side-prefetch-blocks N
  int side_prefetch_fork = 0;  ///< --side-prefetch-after-qkv: 1
  int side_prefetch_stride = DecodeExperiments{}.side_prefetch_stride_bytes;  ///< --side-prefetch-stride BYTES
  unsigned tensor_cores = CudaModelOptions{}.tensor_core_gemvs;  ///< --tensor-cores qkv,o,gate_up,lm_head,down | none
  unsigned tensor_cores_long = CudaModelOptions{}.tensor_core_gemvs_in_long_graph;  ///< --tensor-cores-long (the same)
  unsigned mma_three_per_sm = CudaModelOptions{}.mma_three_blocks_per_sm;  ///< --mma-three-per-sm (the same)
  unsigned norm_weight_first = CudaModelOptions{}.norm_weight_first;      ///< --norm-weight-first (the same)
  bool fold_qkv_norm = CudaModelOptions{}.fold_qkv_norm;  ///< --fold-qkv-norm / --no-fold-qkv-norm
  bool fold_gate_up_norm = CudaModelOptions{}.fold_gate_up_norm;  ///< --fold-gate-up-norm / --no-fold-gate-up-norm
  double l2_persist_mb = 0.0;  ///< --l2-persist MB[,lm_head|qkv|o|gate_up|down|none]
  L2PersistTarget l2_persist_target = L2PersistTarget::kLmHead;
  unsigned decode_skip = 0;  ///< --decode-skip qkv,attention,o,gate_up,down,qkv_norm,o_accumulator_in_gate_up (DecodeSkip bits; the logits meaningless)
};

/// The bits a comma-separated list of names stands for (`--tensor-cores qkv,o`), each
/// name looked up in `names`; an unknown name throws, naming the flag and the choices.
unsigned parse_name_list(const std::string& flag, const std::string& value,
                         std::initializer_list<std::pair<const char*, unsigned>> names) {
  unsigned bits = 0;
  std::string list = value + ",";
  for (size_t comma; (comma = list.find(',')) != std::string::npos; list.erase(0, comma + 1)) {
    const std::string name = list.substr(0, comma);
    const auto* match = std::find_if(names.begin(), names.end(), [&](const auto& n) { return name == n.first; });
    if (match == names.end()) {
      std::string choices;
      for (const auto& n : names) choices += (choices.empty() ? "" : ", ") + std::string(n.first);
      throw std::invalid_argument(flag + " takes a list of " + choices + "; got " + name);
    }
    bits |= match->second;
  }
  return bits;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--model") {
      a.model = value();
    } else if (flag == "--out") {
      a.out = value();
    } else if (flag == "--decode-tokens") {
      a.decode_tokens = std::stoi(value());
    } else if (flag == "--context") {
      a.context = std::stoi(value());
    } else if (flag == "--decode-only") {
      a.decode_only = true;
    } else if (flag == "--prompt-tokens") {
      a.prompt_tokens = std::stoi(value());
      if (a.prompt_tokens < 1) throw std::invalid_argument("--prompt-tokens must be >= 1");
    } else if (flag == "--ttft-only") {
      a.ttft_only = true;
    } else if (flag == "--ttft-rows-ab") {
      a.ttft_only = true;
      a.ttft_rows_ab = true;
    } else if (flag == "--ttft-graph-ab") {
      a.ttft_only = true;
      a.ttft_graph_ab = true;
    } else if (flag == "--ttft-gemv-ab") {
      a.ttft_only = true;
      a.ttft_gemv_ab = true;
    } else if (flag == "--ttft-v6-ab") {
      a.ttft_only = true;
      a.ttft_v6_ab = true;
    } else if (flag == "--prefill-v6") {
      a.prefill_v6_max_tokens = std::stoi(value());
    } else if (flag == "--prefill-gemv") {
      a.prefill_gemv_max_tokens = std::stoi(value());
    } else if (flag == "--no-prefill-graphs") {
      a.no_prefill_graphs = true;
    } else if (flag == "--prefill-all-rows") {
      a.prefill_all_rows = true;
    } else if (flag == "--sampling-only") {
      a.sampling_only = true;
    } else if (flag == "--timeline") {
      a.timeline = true;
    } else if (flag == "--timeline-gemvs-only") {
      a.timeline = true;
      a.timeline_attention = false;
    } else if (flag == "--prefill-attention") {
      const std::string version = value();
      if (version != "v5" && version != "v6") {
        throw std::invalid_argument("--prefill-attention takes v5 or v6; got " + version);
      }
      a.prefill_attention_clusters = version == "v6";
    } else if (flag == "--replicas") {
      a.replicas = std::stoi(value());
    } else if (flag == "--qkv-early") {
      a.qkv_early = true;
    } else if (flag == "--gate-up-after-o") {
      a.gate_up_after_o = true;
    } else if (flag == "--decode-skip") {
      // The marginal table's measurement for one run (decode_ab.sh): kernels left out of
      // every layer. The logits are meaningless then; only the time is.
      a.decode_skip = parse_name_list(flag, value(), {{"qkv", kSkipQkv},
                                                      {"attention", kSkipAttention},
                                                      {"o", kSkipOProjection},
                                                      {"gate_up", kSkipGateUp},
                                                      {"down", kSkipDown},
                                                      {"qkv_norm", kSkipQkvNorm},
                                                      {"o_accumulator_in_gate_up", kSkipOAccumulatorInGateUp}});
    } else if (flag == "--no-fold-qkv-norm") {
      a.fold_qkv_norm = false;
    } else if (flag == "--fold-qkv-norm") {
      a.fold_qkv_norm = true;
    } else if (flag == "--no-fold-gate-up-norm") {
      a.fold_gate_up_norm = false;
    } else if (flag == "--fold-gate-up-norm") {
      a.fold_gate_up_norm = true;
    } else if (flag == "--fused-mlp") {
      a.fused_mlp = true;
    } else if (flag == "--no-fused-mlp") {
      a.fused_mlp = false;
    } else if (flag == "--fused-mlp-before-wait") {
      a.fused_mlp_before_wait = std::stoi(value());
    } else if (flag == "--fused-mlp-block-warps") {
      a.fused_mlp_block_warps = std::stoi(value());
    } else if (flag == "--fused-mlp-blocks") {
      a.fused_mlp_blocks = std::stoi(value());
    } else if (flag == "--decode-graph-steps") {
      a.decode_graph_steps = std::stoi(value());
    } else if (flag == "--copy-each-token") {
      a.generate_copy_each_token = true;
    } else if (flag == "--embed-each-step") {
      a.embed_each_step = true;
    } else if (flag == "--argmax-in-lm-head") {
      a.argmax_in_lm_head = std::stoi(value()) != 0;
    } else if (flag == "--fused-mlp-start-delay") {
      a.fused_mlp_delay = std::stoi(value());
    } else if (flag == "--down-shared") {
      a.down_shared = true;
    } else if (flag == "--down-shared-after-staging") {
      a.down_shared = a.shared_after_staging = true;
    } else if (flag == "--gate-up-shared-after-staging") {
      a.gate_up_shared = a.shared_after_staging = true;
    } else if (flag == "--down-global-input") {
      a.down_global_input = true;
    } else if (flag == "--down-staged-input") {
      a.down_global_input = false;
    } else if (flag == "--o-global-input") {
      a.o_global_input = true;
    } else if (flag == "--rope-after-wait") {
      a.rope_after_wait = true;
    } else if (flag == "--gate-up-shared") {
      a.gate_up_shared = true;
    } else if (flag == "--no-gate-up-shared") {
      a.gate_up_shared = false;
    } else if (flag == "--small-blocks") {
      a.small_blocks = std::stoi(value());
    } else if (flag == "--large-blocks") {
      a.large_blocks = std::stoi(value());
    } else if (flag == "--splits") {
      a.splits = std::stoi(value());
    } else if (flag == "--short-max-keys") {
      a.short_max_keys = std::stoi(value());
    } else if (flag == "--short-splits") {
      a.short_splits = std::stoi(value());
    } else if (flag == "--o-after-attention-inputs") {
      a.o_after_attention_inputs = true;
    } else if (flag == "--o-after-attention-inputs-long") {
      a.o_after_attention_inputs_long = true;
    } else if (flag == "--no-o-after-attention-inputs-long") {
      a.o_after_attention_inputs_long = false;
    } else if (flag == "--carveout") {
      a.carveout = std::stoi(value());
    } else if (flag == "--hold-o") {
      a.hold_o = true;
    } else if (flag == "--hold-gate-up") {
      a.hold_gate_up = std::stoi(value());
    } else if (flag == "--hold-until-attention-end") {
      a.hold_until_end = true;
    } else if (flag == "--hold-gate-up-from") {
      a.hold_gate_up_from = std::stoi(value());
    } else if (flag == "--gate-up-start-delay") {
      a.gate_up_delay = std::stoi(value());
    } else if (flag == "--gate-up-loads-before-wait") {
      a.gate_up_loads_before_wait = std::stoi(value());
    } else if (flag == "--down-loads-before-wait") {
      a.down_loads_before_wait = std::stoi(value());
    } else if (flag == "--lm-head-loads-before-wait") {
      a.lm_head_loads_before_wait = std::stoi(value());
    } else if (flag == "--gate-up-loads-before-wait-past-short") {
      a.gate_up_loads_before_wait_past_short = std::stoi(value());
    } else if (flag == "--o-loads-before-wait") {
      a.o_loads_before_wait = std::stoi(value());
    } else if (flag == "--gate-up-split-blocks") {
      a.gate_up_split_blocks = std::stoi(value());
    } else if (flag == "--gate-up-split-blocks-long") {
      a.gate_up_split_blocks_long = std::stoi(value());
    } else if (flag == "--split-batch-rest" || flag == "--split-batch-rest-past-short" || flag == "--o-split-rest") {
      const std::string when = value();
      SplitBatchRest& rest = flag == "--split-batch-rest"               ? a.split_rest
                             : flag == "--split-batch-rest-past-short" ? a.split_rest_past_short
                                                                       : a.o_split_rest;
      if (when == "after-staging") {
        rest = SplitBatchRest::kAfterStaging;
      } else if (when == "after-wait") {
        rest = SplitBatchRest::kAfterWait;
      } else if (when == "when-first-arrived") {
        rest = SplitBatchRest::kWhenFirstArrived;
      } else {
        throw std::invalid_argument(flag + " takes after-staging, after-wait or when-first-arrived, got " + when);
      }
    } else if (flag == "--down-start-delay") {
      a.down_delay = std::stoi(value());
    } else if (flag == "--qkv-start-delay") {
      a.qkv_delay = std::stoi(value());
    } else if (flag == "--o-start-delay") {
      a.o_delay = std::stoi(value());
    } else if (flag == "--lm-head-start-delay") {
      a.lm_head_delay = std::stoi(value());
    } else if (flag == "--widen-input") {
      a.widen_input = true;
    } else if (flag == "--no-widen-input") {
      a.widen_input = false;
    } else if (flag == "--bulk-staging") {
      a.bulk_staging = true;
    } else if (flag == "--long-min-keys") {
      a.long_min_keys = std::stoi(value());
    } else if (flag == "--long-splits") {
      a.long_splits = std::stoi(value());
    } else if (flag == "--v6-with-o-late-weights") {
      a.v6_with_o_late = true;
    } else if (flag == "--v6-with-o") {
      a.v6_with_o = true;
    } else if (flag == "--attention-o-blocks") {
      a.attention_o_blocks = std::stoi(value());
    } else if (flag == "--streamed") {
      a.streamed = true;
    } else if (flag == "--ring-slots") {
      a.ring_slots = std::stoi(value());
    } else if (flag == "--slot-bytes") {
      a.slot_bytes = std::stoi(value());
    } else if (flag == "--side-prefetch") {
      const std::string sizes = value();  // GATE_UP_MB or GATE_UP_MB,DOWN_MB
      const size_t comma = sizes.find(',');
      a.side_prefetch_gate_up_mb = std::stod(sizes.substr(0, comma));
      a.side_prefetch_down_mb = comma == std::string::npos ? 0.0 : std::stod(sizes.substr(comma + 1));
    } else if (flag == "--tensor-cores" || flag == "--tensor-cores-long" || flag == "--mma-three-per-sm" ||
               flag == "--norm-weight-first") {
      // The list replaces the default; "none": no GEMV on the tensor cores (or on their
      // instance for three blocks an SM, or asking for its norm weight first).
      const std::string list = value();
      (flag == "--tensor-cores"        ? a.tensor_cores
       : flag == "--tensor-cores-long" ? a.tensor_cores_long
       : flag == "--mma-three-per-sm"  ? a.mma_three_per_sm
                                       : a.norm_weight_first) =
          list == "none" ? 0u
                         : parse_name_list(flag + " (or none)", list,
                                           {{"qkv", kTensorCoreQkv},
                                            {"o", kTensorCoreO},
                                            {"gate_up", kTensorCoreGateUp},
                                            {"lm_head", kTensorCoreLmHead},
                                            {"down", kTensorCoreDown}});
    } else if (flag == "--l2-persist") {
      const std::string spec = value();  // MB or MB,TARGET
      const size_t comma = spec.find(',');
      a.l2_persist_mb = std::stod(spec.substr(0, comma));
      const std::string target = comma == std::string::npos ? "lm_head" : spec.substr(comma + 1);
      const std::pair<const char*, L2PersistTarget> targets[] = {{"lm_head", L2PersistTarget::kLmHead},
                                                                 {"qkv", L2PersistTarget::kQkv},
                                                                 {"o", L2PersistTarget::kO},
                                                                 {"gate_up", L2PersistTarget::kGateUp},
                                                                 {"down", L2PersistTarget::kDown},
                                                                 {"none", L2PersistTarget::kNone}};
      bool known = false;
      for (const auto& [name, value] : targets) {
        if (target == name) {
          a.l2_persist_target = value;
          known = true;
        }
      }
      if (!known) throw std::invalid_argument("--l2-persist takes MB[,lm_head|qkv|o|gate_up|down|none]; got " + spec);
    } else if (flag == "--side-prefetch-form") {
      const std::string form = value();
      if (form == "lines") {
        a.side_prefetch_form = L2PrefetchForm::kLines;
      } else if (form == "bulk") {
        a.side_prefetch_form = L2PrefetchForm::kBulk;
      } else if (form == "loads") {
        a.side_prefetch_form = L2PrefetchForm::kLoads;
      } else {
        throw std::invalid_argument("--side-prefetch-form takes lines, bulk or loads; got " + form);
      }
    } else if (flag == "--side-prefetch-blocks") {
      a.side_prefetch_blocks = std::stoi(value());
    } else if (flag == "--side-prefetch-stride") {
      a.side_prefetch_stride = std::stoi(value());
    } else if (flag == "--side-prefetch-after-qkv") {
      a.side_prefetch_fork = 1;
    } else if (flag == "--no-v6-with-o") {
      a.v6_with_o = false;
    } else if (flag == "--v6-handover") {
      const std::string form = value();
      if (form == "pull") {
        a.v6_handover = V6Handover::kPull;
      } else if (form == "barrier") {
        a.v6_handover = V6Handover::kPushBarrier;
      } else if (form == "mbarrier") {
        a.v6_handover = V6Handover::kPushMbarrier;
      } else {
        throw std::invalid_argument("--v6-handover takes pull, barrier or mbarrier; got " + form);
      }
    } else if (flag == "--attention") {
      const std::string path = value();
      if (path == "cluster_o") {
        a.attention = DecodeAttentionPath::kClusterWithO;
      } else if (path == "cluster") {
        a.attention = DecodeAttentionPath::kCluster;
      } else if (path == "cluster_per_head") {
        a.attention = DecodeAttentionPath::kClusterPerHead;
      } else if (path == "split_combine") {
        a.attention = DecodeAttentionPath::kSplitCombine;
      } else if (path == "merge_in_o") {
        a.attention = DecodeAttentionPath::kMergeInO;
      } else {
        throw std::invalid_argument(
            "--attention takes cluster_o, cluster, cluster_per_head, split_combine or merge_in_o; got " + path);
      }
    } else {
      throw std::invalid_argument("unknown argument " + flag +
                                  " (usage: bench_model [--model DIR] [--out FILE] [--decode-tokens N] [--context N]"
                                  " [--decode-only [--prompt-tokens N] [--decode-skip qkv,attention,o,gate_up,down,qkv_norm,o_accumulator_in_gate_up]] [--ttft-only] [--ttft-rows-ab|--ttft-graph-ab|--ttft-gemv-ab|--ttft-v6-ab] [--prefill-all-rows] [--no-prefill-graphs] [--prefill-gemv N] [--prefill-v6 N] [--timeline|--timeline-gemvs-only [--prompt-tokens N]] [--sampling-only] [--prefill-attention v5|v6]"
                                  " [--attention cluster_o|cluster|cluster_per_head|split_combine|merge_in_o]"
                                  " [--replicas N] [--splits N] [--short-max-keys N] [--short-splits N] [--long-min-keys N]"
                                  " [--long-splits N]"
                                  " [--v6-handover pull|barrier|mbarrier] [--[no-]v6-with-o] [--attention-o-blocks N] [--streamed [--ring-slots N] [--slot-bytes N]] [--v6-with-o-late-weights] [--o-after-attention-inputs] [--[no-]o-after-attention-inputs-long]"
                                  " [--carveout PERCENT] [--hold-o] [--hold-gate-up BLOCKS] [--hold-until-attention-end] [--hold-gate-up-from N]"
                                  " [--gate-up-start-delay NS] [--down-start-delay NS] [--qkv-start-delay NS] [--o-start-delay NS]"
                                  " [--gate-up-loads-before-wait N] [--down-loads-before-wait N] [--lm-head-loads-before-wait N] [--split-batch-rest after-staging|after-wait|when-first-arrived]"
                                  " [--gate-up-loads-before-wait-past-short N] [--split-batch-rest-past-short MOMENT]"
                                  " [--o-loads-before-wait N] [--o-split-rest MOMENT] [--gate-up-split-blocks N] [--gate-up-split-blocks-long N]"
                                  " [--lm-head-start-delay NS] [--[no-]widen-input] [--bulk-staging] [--qkv-early] [--gate-up-after-o]"
                                  " [--[no-]fused-mlp] [--fused-mlp-before-wait N] [--fused-mlp-block-warps 4|8] [--fused-mlp-blocks N] [--fused-mlp-start-delay NS]"
                                  " [--decode-graph-steps N] [--copy-each-token] [--embed-each-step] [--argmax-in-lm-head 0|1]"
                                  " [--down-shared] [--down-shared-after-staging] [--gate-up-shared-after-staging]"
                                  " [--down-global-input|--down-staged-input] [--o-global-input]"
                                  " [--rope-after-wait]"
                                  " [--gate-up-shared|--no-gate-up-shared] [--small-blocks N] [--large-blocks N]"
                                  " [--side-prefetch GATE_UP_MB[,DOWN_MB] [--side-prefetch-form lines|bulk|loads] [--side-prefetch-blocks N]"
                                  " [--side-prefetch-stride BYTES] [--side-prefetch-after-qkv]] [--l2-persist MB[,lm_head|qkv|o|gate_up|down|none]]"
                                  " [--tensor-cores qkv,o,gate_up,lm_head,down|none] [--tensor-cores-long LIST] [--mma-three-per-sm LIST] [--norm-weight-first LIST] [--no-fold-qkv-norm] [--no-fold-gate-up-norm])");
    }
  }
  // The full run labels its numbers as the graph's and measures the persistent steps itself.
  if (a.streamed && !a.decode_only) throw std::invalid_argument("--streamed goes with --decode-only");
  if (a.decode_skip != 0 && !a.decode_only) throw std::invalid_argument("--decode-skip goes with --decode-only");
  // A relative default resolves against the source tree when run from elsewhere.
  if (!std::filesystem::exists(a.model) && std::filesystem::exists(std::string(BIELIK_SOURCE_DIR) + "/" + a.model)) {
    a.model = std::string(BIELIK_SOURCE_DIR) + "/" + a.model;
  }
  return a;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

size_t used_device_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

std::vector<int32_t> random_prompt(int length, int V, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<int32_t> uniform(3, V - 1);
  std::vector<int32_t> ids(length);
  for (auto& id : ids) id = uniform(engine);
  return ids;
}

// Keeps the GPU busy while the host queues a probed step, so the events time kernels
// and not the host's launch speed.
__global__ void hold_gpu_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Milliseconds per kernel class, averaged over `runs` after one warm-up: `prepare()` runs
// first (it may wait for the GPU), then `enqueue(probe)` queues the work on `stream` and
// calls probe(name) after each kernel class; an event is recorded there. A hold kernel
// keeps the GPU busy while the host queues, so the events time the kernels and not the
// host's launch speed (enqueue must not wait for the GPU before its last probe).
// `order` receives the names as first seen.
using Probe = std::function<void(const char*)>;
std::map<std::string, double> time_kernel_classes(cudaStream_t stream, int runs, long long hold_cycles,
                                                  const std::function<void()>& prepare,
                                                  const std::function<void(int run, const Probe&)>& enqueue,
                                                  std::vector<std::string>& order) {
  std::map<std::string, double> class_ms;
  for (int run = 0; run < runs + 1; ++run) {  // run 0 warms up
    prepare();
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    cudaEvent_t start;
    CUDA_CHECK(cudaEventCreate(&start));
    hold_gpu_kernel<<<1, 1, 0, stream>>>(hold_cycles);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaEventRecord(start, stream));
    enqueue(run, [&](const char* name) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      CUDA_CHECK(cudaEventRecord(e, stream));
      marks.push_back({name, e});
    });
    cudaEvent_t previous = start;
    for (auto& [name, e] : marks) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, previous, e));
      if (run > 0) {
        if (!class_ms.count(name)) order.push_back(name);
        class_ms[name] += ms / runs;
      }
      previous = e;
    }
    for (auto& mark : marks) CUDA_CHECK(cudaEventDestroy(mark.second));
    CUDA_CHECK(cudaEventDestroy(start));
  }
  return class_ms;
}

// Time to first token of an n-token prompt from an empty cache: the median of 7 runs
// after two warm-ups (cuBLASLt plans, clocks).
double ttft_ms(CudaModel& model, int n) {
  const std::vector<int32_t> prompt = random_prompt(n, model.config().vocab_size, 100 + n);
  std::vector<double> times;
  for (int r = 0; r < 9; ++r) {
    model.reset();
    const double start = now_ms();
    model.prefill(prompt);
    const double ms = now_ms() - start;
    if (r >= 2) times.push_back(ms);
  }
  return median(times);
}

// Decode tokens/s: prefill 16 tokens, then `tokens` greedy steps queued back to back.
double decode_tokens_per_s(CudaModel& model, int tokens, int repeats, bool sync_per_token, int prompt_tokens = 16) {
  const std::vector<int32_t> prompt = random_prompt(prompt_tokens, model.config().vocab_size, 7);
  std::vector<double> rates;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms up
    model.reset();
    const std::vector<float> logits = model.prefill(prompt);
    int32_t token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const double start = now_ms();
    if (sync_per_token) {
      for (int i = 0; i < tokens; ++i) token = model.decode_greedy(token);
    } else {
      model.generate_greedy(token, tokens);
    }
    const double ms = now_ms() - start;
    if (r > 0) rates.push_back(tokens / (ms * 1e-3));
  }
  return median(rates);
}

// Decode tokens/s by how the next token is chosen: the greedy graph path (argmax on the
// GPU), the chat's path (CudaModel::decode_sample: the draw on the GPU, 20 bytes back),
// and the same draw made on the host from the copied logits (decode + Sampler), as the
// chat did before. Medians of 3 runs of `tokens` tokens after a 16-token prompt.
void print_sampling_table(CudaModel& model, int tokens) {
  const std::vector<int32_t> prompt = random_prompt(16, model.config().vocab_size, 7);
  auto rate = [&](const std::function<int32_t(int32_t)>& step) {
    std::vector<double> rates;
    for (int r = 0; r < 4; ++r) {  // the first run warms up
      model.reset();
      const std::vector<float> logits = model.prefill(prompt);
      int32_t token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      const double start = now_ms();
      for (int i = 0; i < tokens; ++i) token = step(token);
      if (r > 0) rates.push_back(tokens / ((now_ms() - start) * 1e-3));
    }
    return median(rates);
  };
  BenchTable table("model_decode_sampling", {"next token chosen by", "tokens/s", "ms/token"});
  auto row = [&](const std::string& label, double tok_s) {
    table.add_row({label, fmt(tok_s, 0), fmt(1000.0 / tok_s, 3)});
  };
  row("greedy: argmax on the GPU, steps queued back to back (generate_greedy, the benchmark's path)",
      decode_tokens_per_s(model, tokens, 3, false));
  row("greedy: argmax on the GPU, one step at a time (decode_greedy)", rate([&](int32_t t) {
        return model.decode_greedy(t);
      }));
  const SamplerOptions chat{0.7f, 40, 0.9f, 1}, unranked{1.0f, 0, 1.0f, 1}, nucleus_only{0.7f, 0, 0.9f, 1};
  for (const auto& [label, options] :
       {std::make_pair("temperature 0.7, top-k 40, top-p 0.9 (the chat's defaults)", chat),
        std::make_pair("temperature 1, no cut", unranked),
        std::make_pair("top-p 0.9 with no top-k (the GPU ranks the top 1024; a longer nucleus is drawn on the host)",
                       nucleus_only)}) {
    Sampler on_gpu(options), on_host(options);
    row(std::string("sampled on the GPU (decode_sample), ") + label, rate([&](int32_t t) {
          return model.decode_sample(t, on_gpu);
        }));
    row(std::string("sampled on the host from the copied logits (decode + Sampler), ") + label,
        rate([&](int32_t t) { return on_host.sample(model.decode(t)); }));
  }
  table.print();
  // Which top-p path the rows above took: this checkpoint's nucleus after the prompt.
  {
    model.reset();
    const std::vector<float> logits = model.prefill(prompt);
    const size_t nucleus = Sampler(nucleus_only).candidates(logits.data(), int(logits.size())).size();
    std::printf("top-p 0.9 (temperature 0.7) on this checkpoint's logits: a nucleus of %zu tokens (%s)\n", nucleus,
                nucleus > size_t(kGpuSamplerMaxTopK) ? "past the GPU's 1024: drawn on the host" : "drawn on the GPU");
  }
  std::fflush(stdout);
}

// The sampler kernel alone (sample_kernels.cu), on V logits drawn from N(0, 3^2) with a
// handful of clear leaders (as a language model's are), already in L2 as the lm_head
// leaves them: the time between CUDA events around one launch, and its timeline
// (SampleTimelineEvent), medians of 50 launches.
void print_sampler_kernel_table(int V) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values(static_cast<size_t>(V));
  for (float& l : values) l = normal(rng);
  for (int i = 0; i < 8 && i < V; ++i) values[size_t(rng() % unsigned(V))] = 12.0f + float(i);
  DeviceBuffer<float> logits(values);
  DeviceBuffer<SampleResult> result(1);
  DeviceBuffer<double> uniform(std::vector<double>{0.37});
  DeviceBuffer<unsigned long long> timeline(kSampleTimelineEvents);
  BenchTable table("model_sampler_kernel",
                   {"options", "launch, us (events)", "largest found", "k-th found (shortlist or radix select)",
                    "k gathered", "ranked", "drawn (kernel start -> token)"});
  const SamplerOptions greedy{0.0f, 0, 1.0f, 1}, unranked{1.0f, 0, 1.0f, 1}, chat{0.7f, 40, 0.9f, 1},
      wide{0.7f, 1024, 1.0f, 1};
  const std::vector<std::pair<std::string, SamplerOptions>> cases = {
      {"greedy (temperature 0)", greedy},
      {"temperature 1, no cut (the softmax walked)", unranked},
      {"temperature 0.7, top-k 40, top-p 0.9 (the chat's)", chat},
      {"temperature 0.7, top-k 1024", wide},
      {"temperature 0.7, top-p 0.9, no top-k (the top 1024 ranked)", SamplerOptions{0.7f, 0, 0.9f, 1}}};
  BenchOptions no_flush;  // the logits stay in L2, as the lm_head leaves them
  no_flush.flush_l2 = false;
  no_flush.repeats = 50;
  for (const auto& [label, options] : cases) {
    const SamplerOptions these = options;  // (a lambda below captures it)
    const BenchTiming launch = time_gpu(
        [&] { gpu_sample(result.data(), logits.data(), V, these, uniform.data(), nullptr); }, no_flush);
    std::vector<std::vector<double>> phases(kSampleTimelineEvents);
    for (int r = 0; r < 50; ++r) {
      timeline.fill_bytes(0);
      gpu_sample(result.data(), logits.data(), V, these, uniform.data(), nullptr, timeline.data());
      const std::vector<unsigned long long> t = timeline.to_host();
      for (int e = 1; e < kSampleTimelineEvents; ++e) {
        if (t[size_t(e)] != 0) phases[size_t(e)].push_back(double(t[size_t(e)] - t[0]) * 1e-3);
      }
    }
    auto at = [&](SampleTimelineEvent e) {
      const std::vector<double>& v = phases[size_t(e)];
      return v.empty() ? std::string() : fmt(median(v), 2);
    };
    table.add_row({label, fmt(launch.median_ms * 1e3, 2), at(SampleTimelineEvent::kLargestFound),
                   at(SampleTimelineEvent::kThresholdFound), at(SampleTimelineEvent::kGathered),
                   at(SampleTimelineEvent::kRanked), at(SampleTimelineEvent::kDrawn)});
  }
  table.print();
  std::fflush(stdout);
}

/// The persistent step's phases (decode_persistent.cuh), summed per kind over the layers,
/// from block 0's clock after every grid barrier in the last of 24 greedy steps: us for
/// the embedding, the six kinds of a layer, the lm_head and the whole step. For the
/// streamed step, also prints every block's time in its share of each GEMV phase
/// (fastest, median, slowest) and block 0's shares spent waiting for and requesting slots.
std::vector<double> persistent_phase_us(const std::string& model_dir, CudaModelOptions o) {
  o.experiments.persistent_decode = true;
  o.experiments.persistent_phase_clock = true;
  CudaModel m(model_dir, o);
  m.prefill(random_prompt(16, m.config().vocab_size, 23));
  m.generate_greedy(5, 24);
  const std::vector<unsigned long long> clock = m.persistent_phase_clock();
  std::vector<double> us(9, 0.0);
  const int L = m.config().num_hidden_layers;
  us[0] = (clock[1] - clock[0]) * 1e-3;
  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < 6; ++k) us[1 + k] += (clock[2 + 6 * l + k] - clock[1 + 6 * l + k]) * 1e-3;
  }
  us[7] = (clock[6 * L + 2] - clock[6 * L + 1]) * 1e-3;
  us[8] = (clock[6 * L + 2] - clock[0]) * 1e-3;
  // The streamed step's blocks: each one's time in its share of each GEMV phase, per
  // layer and step, from the fastest block to the slowest (the one the grid waits for).
  const size_t sms = size_t(multiprocessor_count());
  for (int kind = 0; kind < 5; ++kind) {
    std::vector<std::pair<double, int>> blocks;
    for (size_t b = 0; b < sms; ++b) {
      const double ns = double(clock[6 * L + 18 + kind * sms + b]);
      if (ns > 0) blocks.push_back({ns * 1e-3 / (24.0 * (kind == 4 ? 1 : L)), int(b)});
    }
    if (blocks.size() != sms || sms < 3) continue;  // the register kernel does not count
    std::sort(blocks.begin(), blocks.end());
    std::printf("streamed step, GEMV phase %d, each block's share, us a %s: fastest %.2f (block %d), median %.2f, "
                "slowest %.2f %.2f %.2f (blocks %d %d %d)\n", kind, kind == 4 ? "step" : "layer", blocks[0].first,
                blocks[0].second, blocks[sms / 2].first, blocks[sms - 3].first, blocks[sms - 2].first,
                blocks[sms - 1].first, blocks[sms - 3].second, blocks[sms - 2].second, blocks[sms - 1].second);
  }
  for (int kind = 0; kind < 5; ++kind) {
    const unsigned long long* counts = clock.data() + 6 * L + 3 + 3 * kind;  // waited, requesting, phase
    if (counts[2] > 0) {
      std::printf("streamed step, GEMV phase %d (QKV, O, gate/up, down, lm_head): block 0's thread 0 waited for "
                  "weights %.1f%% and requested stages %.1f%% of %llu cycles (summed over 24 steps)\n",
                  kind, 100.0 * double(counts[0]) / double(counts[2]), 100.0 * double(counts[1]) / double(counts[2]),
                  counts[2]);
    }
  }
  return us;
}

const char* const kPersistentPhaseNames[9] = {
    "embedding",        "QKV + RoPE + append", "attention splits", "attention merge",     "O + residual",
    "gate/up + SwiGLU", "down + residual",     "final norm + lm_head", "whole step (block 0)"};

/// One decode step's logits after the same 16-token prompt, from the graph and from the
/// streamed persistent step: the largest difference (and the largest logit, for scale).
std::pair<double, double> streamed_logit_difference(const std::string& model_dir, const CudaModelOptions& options) {
  auto step_logits = [&](bool streamed) {
    CudaModelOptions o = options;
    o.experiments.persistent_decode = o.experiments.persistent_weight_stream = streamed;
    CudaModel m(model_dir, o);
    m.prefill(random_prompt(16, m.config().vocab_size, 21));
    return m.decode(5);
  };
  const std::vector<float> graph_logits = step_logits(false), streamed_logits = step_logits(true);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < graph_logits.size(); ++i) {
    diff = std::max(diff, double(std::fabs(graph_logits[i] - streamed_logits[i])));
    scale = std::max(scale, double(std::fabs(graph_logits[i])));
  }
  std::printf("streamed step vs graph, one decode step after 16 tokens: max |logit diff| %.4g (max |logit| %.4g)\n",
              diff, scale);
  return {diff, scale};
}

// One decode step's GEMVs on a timeline (CudaModelOptions::experiments.decode_timeline):
// for each GEMV of a layer, the first and last block's stamps of each GemvTimelineEvent (start,
// wait returned, input staged, first weights in, first row's dot summed, end), relative
// to the moment the previous layer's down projection ended (the layer's input is
// complete). Means over layers 1..L-1 and 5 steps, after a
// prompt_tokens-long prompt (--prompt-tokens, 16 by default) and 64 warm-up tokens: the
// steps read prompt_tokens + 65 to + 69 keys. Then the same for the attention between them
// (chapter 07's v6 or v5: start, wait returned, inputs arrived, states updated, warps merged,
// partial done, outputs stored, end).
// With attention_timed false (--timeline-gemvs-only) the attention records nothing and its
// table is left out.
void print_decode_timeline(CudaModel& model, bool attention_timed, int prompt_tokens) {
  const int L = model.config().num_hidden_layers;
  constexpr int kWarmUpTokens = 64, kSteps = 5;
  prompt_tokens = std::min(prompt_tokens, model.context_size() - kWarmUpTokens - kSteps - 1);
  if (prompt_tokens < 1) throw std::invalid_argument("--timeline: the context holds no prompt before its steps");
  model.reset();
  const std::vector<float> logits = model.prefill(random_prompt(prompt_tokens, model.config().vocab_size, 7));
  int32_t token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  token = model.generate_greedy(token, kWarmUpTokens).back();
  const char* names[4] = {"QKV + RoPE + append", "O + residual", "gate/up + SwiGLU", "down + residual"};
  constexpr int kValues = 2 * kGemvTimelineEvents;  // DecodeGemvParams::timeline
  constexpr int kFirstStaged = 2 * kTimelineStaged, kLastEnd = 2 * kTimelineEnd + 1;
  constexpr int kAttentionValues = 2 * decode::kAttentionTimelineEvents;
  double sums[4][kValues] = {}, attention_sums[kAttentionValues] = {}, period = 0, attention = 0;
  int samples = 0;
  // No O kernel (v6_fuses_o, or O blocks in the attention of these steps, first_keys on):
  // its row stays empty.
  const int first_keys = prompt_tokens + kWarmUpTokens + 1;
  const bool fused_o = model.v6_fuses_o() || model.attention_o_blocks_at(first_keys) > 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<unsigned long long> t = model.decode_timeline(token);
    auto at = [&](int layer, int kernel, int value) { return t[kValues * (4 * layer + kernel) + value]; };
    for (int l = 1; l < L; ++l) {
      const double origin = double(at(l - 1, 3, kLastEnd));  // the previous down's last block ends
      for (int k = 0; k < 4; ++k) {
        for (int v = 0; v < kValues; ++v) sums[k][v] += (double(at(l, k, v)) - origin) * 1e-3;
      }
      for (int v = 0; v < kAttentionValues; ++v) {
        const unsigned long long a = t[kValues * (4 * L + 1) + kAttentionValues * l + v];
        attention_sums[v] += (double(a) - origin) * 1e-3;
      }
      period += (double(at(l, 3, kLastEnd)) - origin) * 1e-3;
      // To O's first block past its wait, or with O inside the attention to gate/up's.
      attention += (double(at(l, fused_o ? 2 : 1, kFirstStaged)) - double(at(l, 0, kLastEnd))) * 1e-3;
      ++samples;
    }
  }
  BenchTable table("model_decode_timeline", {"GEMV (us after the previous layer's down ended)", "first block starts",
                                             "last block starts", "first wait returns", "last wait returns",
                                             "first past its wait, input staged", "last past its wait, input staged",
                                             "first with its first weights in too", "last with its first weights in too",
                                             "first with its first row's dot summed", "last with its first row's dot summed",
                                             "first block ends", "last block ends"});
  for (int k = 0; k < 4; ++k) {
    if (k == 1 && fused_o) continue;
    std::vector<std::string> row{names[k]};
    for (int v = 0; v < kValues; ++v) row.push_back(fmt(sums[k][v] / samples, 2));
    table.add_row(row);
  }
  table.print();
  BenchTable attention_table("model_decode_attention_timeline",
                             {"attention (us after the previous layer's down ended)", "first block", "last block"});
  const char* events[decode::kAttentionTimelineEvents] = {
      "starts", "its wait returns", "q and its first keys arrived (splits with keys)",
      "its keys are in the softmax states (splits with keys)", "its warps' states merged (splits with keys)",
      "its partial is done", "its outputs are stored", "ends"};
  for (int e = 0; e < decode::kAttentionTimelineEvents; ++e) {
    attention_table.add_row({events[e], fmt(attention_sums[2 * e] / samples, 2),
                             fmt(attention_sums[2 * e + 1] / samples, 2)});
  }
  if (attention_timed) attention_table.print();
  std::printf("a layer: %.2f us (mean over layers 1..%d, %d steps at %d-%d keys); QKV's last block ends -> %s first "
              "passes its wait (the attention and two kernel boundaries): %.2f us\n",
              period / samples, L - 1, kSteps, first_keys, first_keys + kSteps - 1,
              fused_o ? "gate/up's (O inside the attention)" : "O's", attention / samples);
}

/// "YYYY-MM-DD HH:MM UTC", the form the Python writers of the report's other parts use.
std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &parts);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    if (!cuda_device_available()) {
      std::printf("bench_model: no CUDA device\n");
      return 1;
    }
    const std::string device = describe_device();
    std::printf("bench_model: %s, model %s\n", device.c_str(), args.model.c_str());
    const double copy_gbs = measure_copy_bandwidth_gbs();
    CUDA_CHECK(cudaDeviceSynchronize());
    const size_t used_before = used_device_bytes();

    CudaModelOptions options;
    options.max_context = args.context;
    options.decode_attention = args.attention;
    options.attention_o_replicas = args.replicas;
    options.attention_splits = args.splits;
    options.short_attention_max_keys = args.short_max_keys;
    options.short_attention_splits = args.short_splits;
    options.long_attention_min_keys = args.long_min_keys;
    options.long_attention_splits = args.long_splits;
    options.v6_handover = args.v6_handover;
    options.experiments.v6_fuses_o = args.v6_with_o;
    options.experiments.attention_o_blocks = args.attention_o_blocks;
    options.experiments.persistent_decode = options.experiments.persistent_weight_stream = args.streamed;
    options.experiments.persistent_ring_stages = args.ring_slots;
    options.experiments.persistent_slot_bytes = args.slot_bytes;
    options.experiments.v6_fused_o_late_weights = args.v6_with_o_late;
    options.experiments.attention_allows_o_after_inputs = args.o_after_attention_inputs;
    options.attention_allows_o_after_inputs_in_long_graph = args.o_after_attention_inputs_long;
    options.experiments.decode_shared_carveout = args.carveout;
    options.experiments.o_holds_for_attention_inputs = args.hold_o;
    options.experiments.gate_up_hold_blocks = args.hold_gate_up;
    options.experiments.hold_until_attention_end = args.hold_until_end;
    options.experiments.gate_up_hold_first_block = args.hold_gate_up_from;
    options.gate_up_start_delay_ns = args.gate_up_delay;
    options.experiments.gate_up_loads_before_wait = args.gate_up_loads_before_wait;
    options.experiments.down_loads_before_wait = args.down_loads_before_wait;
    options.experiments.lm_head_loads_before_wait = args.lm_head_loads_before_wait;
    options.experiments.split_batch_rest = args.split_rest;
    options.gate_up_loads_before_wait_past_short_graph = args.gate_up_loads_before_wait_past_short;
    options.gate_up_split_rest_past_short_graph = args.split_rest_past_short;
    options.experiments.o_loads_before_wait = args.o_loads_before_wait;
    options.experiments.o_split_rest = args.o_split_rest;
    options.gate_up_split_blocks = args.gate_up_split_blocks;
    options.gate_up_split_blocks_in_long_graph = args.gate_up_split_blocks_long;
    options.down_start_delay_ns = args.down_delay;
    options.experiments.fused_mlp = args.fused_mlp;
    options.mma_three_blocks_per_sm = args.mma_three_per_sm;
    options.norm_weight_first = args.norm_weight_first;
    options.fold_qkv_norm = args.fold_qkv_norm;
    options.fold_gate_up_norm = args.fold_gate_up_norm;
    options.experiments.fused_mlp_values_before_wait = args.fused_mlp_before_wait;
    options.experiments.fused_mlp_block_warps = args.fused_mlp_block_warps;
    options.experiments.fused_mlp_blocks = args.fused_mlp_blocks;
    options.decode_graph_steps = args.decode_graph_steps;
    options.experiments.generate_copy_each_token = args.generate_copy_each_token;
    if (args.embed_each_step) options.argmax_writes_next_input = false;
    if (args.argmax_in_lm_head >= 0) options.argmax_in_lm_head = args.argmax_in_lm_head == 1;
    options.experiments.fused_mlp_start_delay_ns = args.fused_mlp_delay;
    options.experiments.decode_skip = args.decode_skip;
    options.experiments.qkv_start_delay_ns = args.qkv_delay;
    options.experiments.o_start_delay_ns = args.o_delay;
    options.experiments.lm_head_start_delay_ns = args.lm_head_delay;
    options.experiments.qkv_allows_attention_early = args.qkv_early;
    options.gemv_widen_input = args.widen_input;
    options.experiments.gemv_stage_input_bulk = args.bulk_staging;
    options.experiments.down_second_batch_in_shared = args.down_shared;
    options.experiments.gate_up_second_batch_in_shared = args.gate_up_shared;
    options.experiments.second_batch_after_staging = args.shared_after_staging;
    options.experiments.down_input_from_global = args.down_global_input;
    options.experiments.o_input_from_global = args.o_global_input;
    options.experiments.qkv_rope_inputs_after_wait = args.rope_after_wait;
    options.small_gemv_blocks_per_sm = args.small_blocks;
    options.large_gemv_blocks_per_sm = args.large_blocks;
    options.experiments.side_prefetch_gate_up_mb = args.side_prefetch_gate_up_mb;
    options.experiments.side_prefetch_down_mb = args.side_prefetch_down_mb;
    options.experiments.side_prefetch_form = args.side_prefetch_form;
    options.experiments.side_prefetch_blocks = args.side_prefetch_blocks;
    options.experiments.side_prefetch_fork = args.side_prefetch_fork;
    options.experiments.side_prefetch_stride_bytes = args.side_prefetch_stride;
    options.tensor_core_gemvs = args.tensor_cores;
    options.tensor_core_gemvs_in_long_graph = args.tensor_cores_long;
    options.experiments.l2_persist_mb = args.l2_persist_mb;
    options.experiments.l2_persist_target = args.l2_persist_target;
    options.prefill_attention_clusters = args.prefill_attention_clusters;
    options.prefill_last_layer_rows_only = !args.prefill_all_rows;
    options.prefill_graphs = !args.no_prefill_graphs;
    options.experiments.prefill_gemv_max_tokens = args.prefill_gemv_max_tokens;
    options.prefill_v6_max_tokens = args.prefill_v6_max_tokens;
    options.experiments.decode_timeline = args.timeline;
    options.experiments.decode_timeline_attention = args.timeline_attention;
    options.o_allows_gate_up_early = !args.gate_up_after_o;
    const double load_start = now_ms();
    auto model = std::make_unique<CudaModel>(args.model, options);
    const double load_s = (now_ms() - load_start) * 1e-3;
    const ModelConfig c = model->config();  // a copy: the model is freed before the variants
    const int L = c.num_hidden_layers, C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
    const int H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    std::printf("loaded in %.1f s: %s, context %d, PDL %s\n", load_s, describe(c).c_str(), model->context_size(),
                model->uses_pdl() ? "on" : "off");
    if (args.l2_persist_mb > 0.0) {
      std::printf("L2 set aside for persisting weights: %.2f MB asked, %.2f MB granted\n", args.l2_persist_mb,
                  model->l2_persist_bytes() * 1e-6);
    }
    size_t peak_used = used_device_bytes();
    if (args.decode_only) {  // scripts/timeline_decode_step.sh: just the decode graph, replayed
      const int prompt = std::min(args.prompt_tokens, model->context_size() - 1);
      const int tokens = std::min(args.decode_tokens, model->context_size() - prompt);
      std::printf("decode only: %d tokens after a %d-token prompt, %.0f tokens/s\n", tokens, prompt,
                  decode_tokens_per_s(*model, tokens, 1, false, prompt));
      if (args.streamed) {  // --streamed: its logits against the graph's, and where its time goes
        model.reset();
        streamed_logit_difference(args.model, options);
        const std::vector<double> us = persistent_phase_us(args.model, options);
        for (int i = 0; i < 9; ++i) std::printf("streamed phase %-22s %9.1f us\n", kPersistentPhaseNames[i], us[i]);
      }
      return 0;
    }

    if (args.sampling_only) {
      print_sampler_kernel_table(model->config().vocab_size);
      print_sampling_table(*model, args.decode_tokens);
      return 0;
    }
    if (args.timeline) {
      print_decode_timeline(*model, args.timeline_attention, args.prompt_tokens);
      return 0;
    }
    if (args.ttft_only) {  // a prefill A/B: two models, alternating rounds
      // The prefill attention (v6 or v5), or with --ttft-rows-ab the last layer's rows
      // (only those whose logits are asked for, or all).
      CudaModelOptions o = options;
      const char* name = options.prefill_attention_clusters ? "v6" : "v5";
      const char* other_name = options.prefill_attention_clusters ? "v5" : "v6";
      std::string v6_rows, v6_all;  // the v6 A/B's labels
      if (args.ttft_rows_ab) {
        o.prefill_last_layer_rows_only = !options.prefill_last_layer_rows_only;
        name = options.prefill_last_layer_rows_only ? "last layer, last row only" : "last layer, every row";
        other_name = options.prefill_last_layer_rows_only ? "last layer, every row" : "last layer, last row only";
      } else if (args.ttft_gemv_ab) {
        if (options.prefill_v6_max_tokens > 1) {
          throw std::invalid_argument("--ttft-gemv-ab needs --prefill-v6 0: v6 takes those rows before gemv_v2");
        }
        o.experiments.prefill_gemv_max_tokens =
            options.experiments.prefill_gemv_max_tokens > 1 ? 0 : kGemvV2MaxTokens;  // the other one
        name = options.experiments.prefill_gemv_max_tokens > 1 ? "gemv_v2 up to 16 rows" : "cuBLASLt";
        other_name = options.experiments.prefill_gemv_max_tokens > 1 ? "cuBLASLt" : "gemv_v2 up to 16 rows";
      } else if (args.ttft_v6_ab) {
        // The other one: cuBLASLt if v6 is on, else v6 up to 64 rows.
        o.prefill_v6_max_tokens = options.prefill_v6_max_tokens > 1 ? 0 : kMatmulV6MaxTokens;
        v6_rows = "v6 up to " + std::to_string(options.prefill_v6_max_tokens) + " rows";
        v6_all = "v6 up to " + std::to_string(kMatmulV6MaxTokens) + " rows";
        name = options.prefill_v6_max_tokens > 1 ? v6_rows.c_str() : "cuBLASLt";
        other_name = options.prefill_v6_max_tokens > 1 ? "cuBLASLt" : v6_all.c_str();
      } else if (args.ttft_graph_ab) {
        o.prefill_graphs = !options.prefill_graphs;
        name = options.prefill_graphs ? "graph" : "eager";
        other_name = options.prefill_graphs ? "eager" : "graph";
      } else {
        o.prefill_attention_clusters = !options.prefill_attention_clusters;
      }
      CudaModel other(args.model, o);
      BenchTable table(args.ttft_rows_ab    ? "model_prefill_last_layer_ab"
                       : args.ttft_graph_ab ? "model_prefill_graph_ab"
                       : args.ttft_gemv_ab  ? "model_prefill_gemv_ab"
                       : args.ttft_v6_ab    ? "model_prefill_v6_ab"
                                            : "model_prefill_attention",
                       {"round", "prompt tokens", std::string("TTFT ms, ") + name,
                                                   std::string("TTFT ms, ") + other_name, "ratio"});
      for (int round = 0; round < 2; ++round) {
        const std::vector<int> lengths = args.ttft_gemv_ab ? std::vector<int>{4, 8, 12, 16, 128}
                                         : args.ttft_v6_ab ? std::vector<int>{4, 8, 16, 32, 48, 64, 128}
                                                           : std::vector<int>{16, 128, 512, 2048};
        for (int n : lengths) {
          if (n > model->context_size()) continue;
          const double a = ttft_ms(*model, n), b = ttft_ms(other, n);
          table.add_row({std::to_string(round), std::to_string(n), fmt(a, 3), fmt(b, 3), fmt(b / a, 3) + "x"});
        }
      }
      table.print();
      return 0;
    }

    // --- TTFT ---
    nlohmann::json ttft = nlohmann::json::object();
    BenchTable prefill_table("model_prefill", {"prompt tokens", "TTFT ms", "tokens/s", "TFLOP/s (matmuls)"});
    for (int n : {16, 128, 512, 2048}) {
      if (n > model->context_size()) continue;
      const double ms = ttft_ms(*model, n);
      peak_used = std::max(peak_used, used_device_bytes());
      ttft[std::to_string(n)] = ms;
      // The matmuls' FLOPs: 2 per weight per token (minus the lm_head, one row), minus the
      // last layer's O and MLP on the rows it skips (prefill_last_layer_rows_only).
      const ModelConfig& mc = model->config();
      const double skipped_weights =
          options.prefill_last_layer_rows_only
              ? double(mc.num_attention_heads) * mc.head_dim * C + 3.0 * mc.intermediate_size * C
              : 0.0;
      const double flops = 2.0 * n * (double(model->decode_weight_bytes()) / 2 - double(V) * C) -
                           2.0 * (n - 1) * skipped_weights;
      prefill_table.add_row({std::to_string(n), fmt(ms, 3), fmt(n / (ms * 1e-3), 0), fmt(tflop_per_s(flops, ms), 1)});
    }

    // TTFT of `model` beside a second model with one prefill option flipped, while `model`
    // is loaded (it is freed before the decode variants below; the second model is gone
    // before the next peak-memory reading). A row: the option on, off, off / on. Returns
    // the times with the option off.
    auto ttft_option_table = [&](BenchTable& table, bool CudaModelOptions::*option) {
      nlohmann::json off_ms = nlohmann::json::object();
      CudaModelOptions o = options;
      o.*option = !(options.*option);
      CudaModel m(args.model, o);
      for (int n : {16, 128, 512, 2048}) {
        if (n > model->context_size()) continue;
        const double mine = ttft_ms(*model, n), other = ttft_ms(m, n);
        const double on = options.*option ? mine : other, off = options.*option ? other : mine;
        off_ms[std::to_string(n)] = off;
        table.add_row({std::to_string(n), fmt(on, 3), fmt(off, 3), fmt(off / on, 3) + "x"});
      }
      return off_ms;
    };
    // Prefill's last layer on every row instead of the last one (prefill_last_layer_rows_only).
    BenchTable last_layer_table("model_prefill_last_layer",
                                {"prompt tokens", "TTFT ms, last layer on the last row only",
                                 "TTFT ms, last layer on every row", "every row / last row"});
    const nlohmann::json ttft_every_row =
        ttft_option_table(last_layer_table, &CudaModelOptions::prefill_last_layer_rows_only);
    // Prefill graphs (prefill_graphs): the timed runs above replay one graph per prompt
    // length (the two warm-ups ran it eagerly, then captured it). Without them every run
    // launches its kernels from the host, as a shape's first run always does.
    BenchTable prefill_graph_table("model_prefill_graph",
                                   {"prompt tokens", "TTFT ms, graph replayed", "TTFT ms, launched from the host",
                                    "host / graph"});
    const nlohmann::json ttft_eager = ttft_option_table(prefill_graph_table, &CudaModelOptions::prefill_graphs);

    // --- one 512-token prefill, kernel by kernel (events between the kernel classes) ---
    std::vector<std::string> prefill_order;
    const int probed_prompt = std::min(512, model->context_size());
    std::map<std::string, double> prefill_class_ms = time_kernel_classes(
        model->stream(), 3, 40'000'000,  // ~20 ms of hold: the host queues the whole pass meanwhile
        [&] { model->reset(); },  // waits for the GPU: before the hold, not inside the timing
        [&](int, const Probe& probe) { model->prefill_probed(random_prompt(probed_prompt, V, 11), probe); },
        prefill_order);
    BenchTable prefill_step_table("model_prefill_step",
                                  {"kernel (x layers), " + std::to_string(probed_prompt) + " tokens", "us",
                                   "% of the pass"});
    nlohmann::json prefill_breakdown = nlohmann::json::array();
    double prefill_pass_us = 0;
    for (const std::string& name : prefill_order) prefill_pass_us += prefill_class_ms[name] * 1e3;
    for (const std::string& name : prefill_order) {
      const double us = prefill_class_ms[name] * 1e3;
      prefill_breakdown.push_back({{"kernel", name}, {"us", us}});
      prefill_step_table.add_row({name, fmt(us, 1), fmt(100 * us / prefill_pass_us, 1)});
    }

    // --- decode ---
    const int tokens = std::min(args.decode_tokens, model->context_size() - 16);
    const double tok_s = decode_tokens_per_s(*model, tokens, 5, false);
    const double sync_tok_s = decode_tokens_per_s(*model, tokens, 3, true);
    peak_used = std::max(peak_used, used_device_bytes());
    const double mean_keys = 16 + tokens / 2.0;
    const double kv_bytes_per_token = double(L) * 2 * Hkv * mean_keys * D * 2;
    const double bytes_per_token = double(model->decode_weight_bytes()) + kv_bytes_per_token;
    const double ms_per_token = 1000.0 / tok_s;
    const double decode_gbs = gb_per_s(bytes_per_token, ms_per_token);
    const double floor_ms = double(model->decode_weight_bytes()) / (copy_gbs * 1e9) * 1e3;

    // --- one step, kernel by kernel ---
    std::vector<std::string> order;
    model->reset();
    model->prefill(random_prompt(16, V, 9));
    std::map<std::string, double> class_ms = time_kernel_classes(
        model->stream(), 5, 20'000'000,  // ~10 ms of hold: the host queues the whole step meanwhile
        [] {}, [&](int run, const Probe& probe) { model->decode_probed(5 + run, probe); }, order);
    const double keys = 16 + 3;  // cache length during the probed steps (about)
    const int QKV = (H + 2 * Hkv) * D;
    std::map<std::string, double> class_bytes = {
        {"qkv_rope_append", double(L) * QKV * C * 2},
        {"o_proj", double(L) * C * H * D * 2},
        {"attention_o", double(L) * C * H * D * 2},
        {"gate_up_swiglu", double(L) * 2 * F * C * 2},
        {"down", double(L) * C * F * 2},
        {"lm_head", double(V) * C * 2},
        {"attention", double(L) * 2 * Hkv * keys * D * 2},
    };
    nlohmann::json breakdown = nlohmann::json::array();
    BenchTable step_table("model_decode_step", {"kernel (x layers)", "us", "GB/s", "% of copy BW"});
    double eager_step_us = 0;
    for (const std::string& name : order) {
      const double us = class_ms[name] * 1e3;
      eager_step_us += us;
      const double gbs = class_bytes.count(name) ? gb_per_s(class_bytes[name], class_ms[name]) : 0.0;
      breakdown.push_back({{"kernel", name}, {"us", us}, {"gbs", gbs}});
      step_table.add_row({name, fmt(us, 1), gbs > 0 ? fmt(gbs, 0) : "", gbs > 0 ? fmt(100 * gbs / copy_gbs, 1) : ""});
    }

    const double weights_gb = model->weight_bytes() / 1e9, kv_gb = model->kv_cache_bytes() / 1e9;
    const double scratch_gb = model->scratch_bytes() / 1e9;
    const double peak_gb = (peak_used - used_before) / 1e9;
    const int model_context = model->context_size();
    print_sampler_kernel_table(model->config().vocab_size);
    print_sampling_table(*model, args.decode_tokens);  // (printed now: it needs this model)
    model.reset();  // free it before the variants load

    // Decode tokens/s of a model loaded with the options changed by `tweak`.
    auto variant = [&](auto&& tweak) {
      CudaModelOptions o = options;
      tweak(o);
      CudaModel m(args.model, o);
      return decode_tokens_per_s(m, tokens, 3, false);
    };
    // --- what the graph and PDL are worth: the same decode without them ---
    const double no_pdl_tok_s = variant([](CudaModelOptions& o) { o.use_pdl = false; });
    double no_pdl_ttft_512 = 0;  // PDL also launches prefill's small kernels
    if (model_context >= 512) {
      CudaModelOptions o = options;
      o.use_pdl = false;
      CudaModel m(args.model, o);
      no_pdl_ttft_512 = ttft_ms(m, 512);
    }
    const double eager_tok_s = variant([](CudaModelOptions& o) { o.use_graph = false; });
    // Prefill attention: chapter 05's v5 (attention_forward) instead of v6.
    nlohmann::json ttft_other_attention = nlohmann::json::object();
    {
      CudaModelOptions o = options;
      o.prefill_attention_clusters = !options.prefill_attention_clusters;
      CudaModel m(args.model, o);
      for (int n : {512, 2048}) {
        if (n <= model_context) ttft_other_attention[std::to_string(n)] = ttft_ms(m, n);
      }
    }

    // --- how many GEMV blocks per SM: fewer leaves room for PDL to start the next kernel.
    // The caps bind the register kernel only; a capped QKV, O row runs QKV and O on it
    // (not on the tensor cores, whose grid is fixed: a block per 16 rows) ---
    BenchTable occupancy_table("model_decode_gemv_blocks_per_sm",
                               {"QKV, O blocks/SM", "gate/up, down, lm_head blocks/SM", "tokens/s", "ms/token"});
    nlohmann::json occupancy_sweep = nlohmann::json::array();
    for (auto [small, large] : {std::pair{0, 0}, std::pair{1, 0}, std::pair{2, 0}, std::pair{1, 2}, std::pair{2, 2},
                                std::pair{1, 1}}) {
      const int small_cap = small, large_cap = large;  // C++17 lambdas cannot capture structured bindings
      const double rate = variant([&](CudaModelOptions& o) {
        o.small_gemv_blocks_per_sm = small_cap;
        o.large_gemv_blocks_per_sm = large_cap;
        if (small_cap > 0) {
          o.tensor_core_gemvs &= ~unsigned(kTensorCoreQkv | kTensorCoreO);
          o.tensor_core_gemvs_in_long_graph &= ~unsigned(kTensorCoreQkv | kTensorCoreO);
        }
      });
      auto label = [](int cap) { return cap == 0 ? std::string("all that fit") : std::to_string(cap); };
      occupancy_table.add_row({small == 0 ? "the defaults" : label(small) + " (register kernel)", label(large),
                               fmt(rate, 0), fmt(1000.0 / rate, 3)});
      occupancy_sweep.push_back({{"small_blocks_per_sm", small}, {"large_blocks_per_sm", large}, {"tok_s", rate}});
    }

    // --- the evict-first hint on the GEMVs' weight loads; the attention's combine as its
    // own kernel or merged in the O projection; its splits per kv head and least keys per
    // split (the default is sized for 512 keys; this decode runs at 16-272 keys) ---
    struct OptionVariant {
      std::string label;
      bool o_early;
      bool evict_first;
      DecodeAttentionPath attention;
      int attention_splits;
      int min_keys;
      int replicas = 4;  ///< kClusterWithO only
      bool qkv_early = false;
      bool down_shared = DecodeExperiments{}.down_second_batch_in_shared;
      bool gate_up_shared = DecodeExperiments{}.gate_up_second_batch_in_shared;
      bool down_global_input = DecodeExperiments{}.down_input_from_global;
      bool o_global_input = DecodeExperiments{}.o_input_from_global;
      bool rope_after_wait = DecodeExperiments{}.qkv_rope_inputs_after_wait;
      int short_max_keys = CudaModelOptions{}.short_attention_max_keys;
      int long_min_keys = CudaModelOptions{}.long_attention_min_keys;
      V6Handover handover = CudaModelOptions{}.v6_handover;
      std::function<void(CudaModelOptions&)> adjust = nullptr;  ///< anything else, applied last
      double tok_s = 0;
    };
    using Path = DecodeAttentionPath;
    auto one_graph = [](OptionVariant v) {  // v6 without the short and long decode graphs
      v.short_max_keys = 0;
      v.long_min_keys = 0;
      return v;
    };
    auto no_long_graph = [](OptionVariant v) {
      v.long_min_keys = 0;
      return v;
    };
    auto handover = [](OptionVariant v, V6Handover form) {
      v.handover = form;
      return v;
    };
    const OptionVariant v6_defaults{"", true, true, Path::kClusterPerHead, 0, 0};
    auto defaults_but = [&](const char* label, std::function<void(CudaModelOptions&)> adjust) {
      OptionVariant v = v6_defaults;
      v.label = label;
      v.adjust = std::move(adjust);
      return v;
    };
    std::vector<OptionVariant> option_variants = {
        {"defaults (attention v6: clusters of 4 per query head up to 256 keys, 8 up to 1279, then 16; partials "
         "pushed with st.async onto block 0's mbarrier, in the long graph O scheduled once their inputs are in; "
         "then the O GEMV, which lets gate/up start early; QKV and O on the tensor cores, QKV's for three "
         "blocks an SM; past 256 keys gate/up's first batch split (up to 1279 keys in its first 264 blocks, "
         "from 1280 in all): 3 loads a row before the wait, the rest once they are in; QKV's and gate/up's "
         "norm weights folded into W_qkv and W_gate_up; the norm weight asked for before the weights; gate/up pauses 150 ns and down 500 ns "
         "at their start; evict-first; 4 steps a graph, the tokens kept on "
         "the GPU until the end, each step's argmax folded into the lm_head, whose last block writes the next "
         "step's input row)",
         true, true, Path::kClusterPerHead, 0, 0},
        defaults_but("a graph a step", [](CudaModelOptions& o) { o.decode_graph_steps = 1; }),
        defaults_but("each step embeds its token in a kernel of its own (the argmax does not write the next input)",
                     [](CudaModelOptions& o) { o.argmax_writes_next_input = false; }),
        defaults_but("the argmax in a kernel of its own after the lm_head (not folded into it)",
                     [](CudaModelOptions& o) { o.argmax_in_lm_head = false; }),
        defaults_but("a graph a step, each step's token copied back after it (no history on the GPU)",
                     [](CudaModelOptions& o) {
                       o.decode_graph_steps = 1;
                       o.experiments.generate_copy_each_token = true;
                     }),
        // Its best form measured (H200, 2026-12-02): clusters of 16 (W_o's rows over 192
        // blocks, 24 KB each), gate/up scheduled once the attention's inputs are in.
        defaults_but("the O projection and residual add inside v6's clusters (decode_attention_o_per_head), clusters "
                     "of 16, gate/up after the attention's inputs: no O kernel",
                     [](CudaModelOptions& o) {
                       o.experiments.v6_fuses_o = true;
                       o.attention_splits = 16;
                       o.experiments.attention_allows_o_after_inputs = true;
                     }),
        // The forty-second session's form: v6's 4 splits and 12 O blocks a head (8 + 8 in
        // the middle graph), the heads met in an fp32 accumulator that gate/up and down add.
        defaults_but("12 O blocks in v6's clusters beside the splits (decode_attention_o_blocks): no O kernel",
                     [](CudaModelOptions& o) { o.experiments.attention_o_blocks = 12; }),
        defaults_but("QKV and O on the register kernel (no GEMV on the tensor cores)",
                     [](CudaModelOptions& o) { o.tensor_core_gemvs = o.tensor_core_gemvs_in_long_graph = 0; }),
        defaults_but("long graph: QKV and O on the register kernel (the default until the forty-fifth session)",
                     [](CudaModelOptions& o) { o.tensor_core_gemvs_in_long_graph = 0; }),
        defaults_but("past 256 keys gate/up's first batch not split (all of it before the wait)",
                     [](CudaModelOptions& o) { o.gate_up_loads_before_wait_past_short_graph = 0; }),
        defaults_but("past 256 keys every gate/up block splits, in the main graph too (the forty-fifth session's)",
                     [](CudaModelOptions& o) { o.gate_up_split_blocks = 0; }),
        defaults_but("O's first batch split too: 3 steps a warp before the wait, the rest once they are in",
                     [](CudaModelOptions& o) { o.experiments.o_loads_before_wait = 3; }),
        defaults_but("neither (register QKV and O in the long graph, gate/up not split: the forty-fourth session's)",
                     [](CudaModelOptions& o) {
                       o.tensor_core_gemvs_in_long_graph = 0;
                       o.gate_up_loads_before_wait_past_short_graph = 0;
                     }),
        defaults_but("QKV, O and the lm_head on the tensor cores",
                     [](CudaModelOptions& o) { o.tensor_core_gemvs |= kTensorCoreLmHead; }),
        defaults_but("QKV's tensor-core GEMV for two blocks an SM (its whole-row instance, as O's)",
                     [](CudaModelOptions& o) { o.mma_three_blocks_per_sm &= ~unsigned(kTensorCoreQkv); }),
        defaults_but("O's tensor-core GEMV for three blocks an SM too",
                     [](CudaModelOptions& o) { o.mma_three_blocks_per_sm |= kTensorCoreO; }),
        defaults_but("QKV, gate/up and the lm_head ask for the norm weight after their weights",
                     [](CudaModelOptions& o) { o.norm_weight_first = 0; }),
        defaults_but(CudaModelOptions{}.fold_qkv_norm
                         ? "QKV's norm weight not folded into W_qkv (its normalizing pass before the dots)"
                         : "QKV's norm weight folded into W_qkv (the inverse RMS after the dots)",
                     [](CudaModelOptions& o) { o.fold_qkv_norm = !o.fold_qkv_norm; }),
        defaults_but(CudaModelOptions{}.fold_gate_up_norm
                         ? "gate/up's norm weight not folded into W_gate_up (its normalizing pass before the dots)"
                         : "gate/up's norm weight folded into W_gate_up (each warp's inverse RMS after the dots)",
                     [](CudaModelOptions& o) { o.fold_gate_up_norm = !o.fold_gate_up_norm; }),
        defaults_but("gate/up and down start without the pause",
                     [](CudaModelOptions& o) { o.gate_up_start_delay_ns = o.down_start_delay_ns = 0; }),
        defaults_but("down starts without the pause", [](CudaModelOptions& o) { o.down_start_delay_ns = 0; }),
        defaults_but(CudaModelOptions{}.gemv_widen_input ? "QKV, O, gate/up and lm_head widen x in every warp"
                                                          : "QKV, O, gate/up and lm_head stage x widened to fp32",
                     [](CudaModelOptions& o) { o.gemv_widen_input = !o.gemv_widen_input; }),
        defaults_but("gate/up holds for the attention's inputs signal instead of its pause",
                     [](CudaModelOptions& o) {
                       o.gate_up_start_delay_ns = 0;
                       o.experiments.gate_up_hold_blocks = 1 << 30;
                     }),
        defaults_but("long graph: O scheduled at the attention's start",
                     [](CudaModelOptions& o) { o.attention_allows_o_after_inputs_in_long_graph = false; }),
        one_graph({"one decode graph: attention v6 in clusters of 8 at every length", true, true,
                   Path::kClusterPerHead, 0, 0}),
        no_long_graph({"no third graph: attention v6 in clusters of 8 from 257 keys on", true, true,
                       Path::kClusterPerHead, 0, 0}),
        handover({"v6 pushes its partials with plain stores, then the cluster barrier", true, true,
                  Path::kClusterPerHead, 0, 0},
                 V6Handover::kPushBarrier),
        handover({"v6 pulls the partials (v5's hand-over: two cluster barriers)", true, true, Path::kClusterPerHead,
                  0, 0},
                 V6Handover::kPull),
        {"gate/up starts after O's wait", false, true, Path::kClusterPerHead, 0, 0},
        {"QKV lets the attention start early", true, true, Path::kClusterPerHead, 0, 0, 4, true},
        {"gate/up copies its second row pair into shared memory before its wait", true, true, Path::kClusterPerHead,
         0, 0, 4, false, false, true},
        {"down copies its second batch of weights into shared memory before its wait", true, true,
         Path::kClusterPerHead, 0, 0, 4, false, true, false},
        {"down reads its input in place (not staged by every block after its wait)", true, true,
         Path::kClusterPerHead, 0, 0, 4, false, false, false, true},
        {"O reads its input in place (not staged by every block)", true, true, Path::kClusterPerHead, 0, 0, 4,
         false, false, false, false, true},
        {"QKV loads RoPE's position and cos / sin after its wait", true, true, Path::kClusterPerHead, 0, 0, 4, false,
         false, false, true, false, true},
        {"attention v6, clusters of 16", true, true, Path::kClusterPerHead, 16, 0},
        {"no evict-first hint", true, false, Path::kClusterPerHead, 0, 0},
        {"attention v5: clusters of 8 per kv head", true, true, Path::kCluster, 0, 0},
        {"attention v5, clusters of 16", true, true, Path::kCluster, 16, 0},
        {"attention + O in one kernel (decode_attention_o): clusters of 8 x 4 replicas per kv head", true, true,
         Path::kClusterWithO, 8, 0, 4},
        {"attention + O in one kernel: clusters of 16, 1 replica", true, true, Path::kClusterWithO, 16, 0, 1},
        {"attention v3 split + combine kernels, splits for 512 keys", true, true, Path::kSplitCombine, 0, 0},
        {"v3 splits merged in the O GEMV, splits of >= 16 keys", true, true, Path::kMergeInO, 0, 0},
    };
    // Each variant also decodes 64 tokens after a 2048-token prompt: the attention's
    // split choices matter most with many keys.
    const int long_prompt = 2048, long_tokens = 64;
    const bool long_fits = model_context >= long_prompt + long_tokens;
    BenchTable options_table("model_decode_options",
                             {"decode options", "tokens/s", "ms/token", "vs defaults",
                              "tokens/s after " + std::to_string(long_prompt) + " tokens", "vs defaults"});
    nlohmann::json options_sweep = nlohmann::json::array();
    std::vector<double> long_rates;
    for (OptionVariant& v : option_variants) {
      CudaModelOptions o = options;
      o.o_allows_gate_up_early = v.o_early;
      o.gemv_evict_first = v.evict_first;
      o.decode_attention = v.attention;
      o.attention_splits = v.attention_splits;
      o.experiments.attention_min_keys_per_split = v.min_keys;
      o.attention_o_replicas = v.replicas;
      o.experiments.qkv_allows_attention_early = v.qkv_early;
      o.experiments.down_second_batch_in_shared = v.down_shared;
      o.experiments.gate_up_second_batch_in_shared = v.gate_up_shared;
      o.experiments.down_input_from_global = v.down_global_input;
      o.experiments.o_input_from_global = v.o_global_input;
      o.experiments.qkv_rope_inputs_after_wait = v.rope_after_wait;
      o.short_attention_max_keys = v.short_max_keys;
      o.long_attention_min_keys = v.long_min_keys;
      o.v6_handover = v.handover;
      if (v.adjust) v.adjust(o);
      CudaModel m(args.model, o);
      v.tok_s = decode_tokens_per_s(m, tokens, 3, false);
      const double long_rate = long_fits ? decode_tokens_per_s(m, long_tokens, 3, false, long_prompt) : 0.0;
      long_rates.push_back(long_rate);
      options_table.add_row({v.label, fmt(v.tok_s, 0), fmt(1000.0 / v.tok_s, 3),
                             fmt(v.tok_s / option_variants[0].tok_s, 2) + "x", long_fits ? fmt(long_rate, 0) : "",
                             long_fits ? fmt(long_rate / long_rates[0], 2) + "x" : ""});
      options_sweep.push_back({{"options", v.label}, {"tok_s", v.tok_s}, {"long_context_tok_s", long_rate}});
    }
    options_table.print();
    std::fflush(stdout);

    // --- what each kernel adds to a step in the graph: the decode with it left out of every
    // layer (CudaModelOptions::experiments.decode_skip; the logits are then meaningless) ---
    BenchTable marginal_table("model_decode_marginal",
                              {"left out of every layer", "tokens/s", "ms/token", "it costs, us a layer",
                               "its weights at copy bandwidth, us a layer"});
    nlohmann::json marginal = nlohmann::json::array();
    // On the defaults' path (v6, then the O GEMV), where the attention and O are
    // separate kernels that can be left out one at a time.
    const double full_ms = 1000.0 / option_variants[0].tok_s;
    const struct {
      const char* label;
      unsigned skip;
      double weight_bytes;
    } left_out[] = {
        {"QKV + RoPE + append", kSkipQkv, 2.0 * (H + 2 * Hkv) * D * C},
        {"attention", kSkipAttention, 0.0},
        {"O projection", kSkipOProjection, 2.0 * C * H * D},
        {"attention + O projection", kSkipAttention | kSkipOProjection, 2.0 * C * H * D},
        {"gate/up + SwiGLU", kSkipGateUp, 2.0 * 2 * F * C},
        {"down projection", kSkipDown, 2.0 * C * F},
    };
    for (const auto& k : left_out) {
      const unsigned skip = k.skip;
      const double rate = variant([&](CudaModelOptions& o) {
        o.experiments.decode_skip = skip;
        o.decode_attention = DecodeAttentionPath::kClusterPerHead;
      });
      const double cost_us = (full_ms - 1000.0 / rate) * 1e3 / L;
      const double bytes_us = k.weight_bytes / (copy_gbs * 1e9) * 1e6;
      marginal_table.add_row({k.label, fmt(rate, 0), fmt(1000.0 / rate, 3), fmt(cost_us, 2),
                              k.weight_bytes > 0 ? fmt(bytes_us, 2) : ""});
      marginal.push_back({{"left_out", k.label}, {"tok_s", rate}, {"us_per_layer", cost_us}});
    }
    marginal_table.print();
    std::fflush(stdout);

    BenchTable decode_table("model_decode", {"decode path", "tokens/s", "ms/token", "GB/s", "% of copy BW"});
    auto decode_row = [&](const std::string& label, double rate) {
      const double gbs = gb_per_s(bytes_per_token, 1000.0 / rate);
      decode_table.add_row({label, fmt(rate, 0), fmt(1000.0 / rate, 3), fmt(gbs, 0), fmt(100 * gbs / copy_gbs, 1)});
    };
    decode_row("graph + PDL, steps queued back to back", tok_s);
    decode_row("graph + PDL, host sync per token", sync_tok_s);
    decode_row("graph, no PDL", no_pdl_tok_s);
    decode_row("no graph (eager launches) + PDL", eager_tok_s);
    decode_table.add_row({"floor: weights / copy bandwidth", fmt(1000.0 / floor_ms, 0), fmt(floor_ms, 3),
                          fmt(copy_gbs, 0), "100.0"});

    std::printf("\ncopy bandwidth %.0f GB/s; weights %.3f GB (decode reads %.3f GB/token); KV cache %.3f GB; "
                "other %.3f GB; peak used %.3f GB (%.1f%% over weights + KV)\n",
                copy_gbs, weights_gb, double(bytes_per_token) / 1e9, kv_gb, scratch_gb, peak_gb,
                100.0 * (peak_gb / (weights_gb + kv_gb) - 1.0));
    prefill_table.print();
    if (no_pdl_ttft_512 > 0) {
      std::printf("TTFT(512) without PDL between prefill's small kernels: %.3f ms (with: %.3f ms)\n",
                  no_pdl_ttft_512, double(ttft["512"]));
    }
    for (auto& [n, ms] : ttft_other_attention.items()) {
      std::printf("TTFT(%s) with prefill attention %s: %.3f ms (with %s: %.3f ms)\n", n.c_str(),
                  options.prefill_attention_clusters ? "v5" : "v6", double(ms),
                  options.prefill_attention_clusters ? "v6" : "v5", double(ttft[n]));
    }
    last_layer_table.print();
    prefill_graph_table.print();
    prefill_step_table.print();
    std::printf("prefill pass (sum of the table) %.1f us\n", prefill_pass_us);
    decode_table.print();
    step_table.print();
    occupancy_table.print();
    std::printf("eager step (sum of the table) %.1f us vs the graph's %.1f us per token\n", eager_step_us,
                ms_per_token * 1e3);
    std::fflush(stdout);

    // The persistent step last: an experiment, and a fault in it must not cost the
    // tables above (they are printed already).
    // --- the persistent decode step (one kernel per token), 1 and 2 blocks per SM ---
    double persistent_tok_s[3] = {0, 0, 0};
    for (int blocks : {1, 2}) {
      try {
        persistent_tok_s[blocks] = variant([&](CudaModelOptions& o) {
          o.experiments.persistent_decode = true;
          o.experiments.persistent_blocks_per_sm = blocks;
        });
      } catch (const std::exception& e) {
        std::printf("persistent decode (%d blocks/SM): %s\n", blocks, e.what());
      }
    }

    // --- the streamed persistent step: one weight stream per warp across every phase,
    // with the largest rings of three slot sizes and with 2 slots a warp; and its logits
    // against the graph's on this checkpoint (Bielik's shapes: down's rows in chunks) ---
    struct StreamedVariant {
      const char* label;
      int ring_stages, slot_bytes;
      double tok_s = 0;
    };
    StreamedVariant streamed[] = {{"largest rings of 6 KB slots", 0, 0},
                                  {"2 slots of 6 KB a warp", 2, 0},
                                  {"largest rings of 3 KB slots", 0, 3 * 1024},
                                  {"largest rings of 12 KB slots", 0, 12 * 1024}};
    for (StreamedVariant& v : streamed) {
      try {
        v.tok_s = variant([&](CudaModelOptions& o) {
          o.experiments.persistent_decode = true;
          o.experiments.persistent_weight_stream = true;
          o.experiments.persistent_ring_stages = v.ring_stages;
          o.experiments.persistent_slot_bytes = v.slot_bytes;
        });
      } catch (const std::exception& e) {
        std::printf("streamed persistent decode (%s): %s\n", v.label, e.what());
      }
    }
    double streamed_logit_diff = -1, streamed_logit_scale = 0;
    if (streamed[0].tok_s > 0) {
      std::tie(streamed_logit_diff, streamed_logit_scale) = streamed_logit_difference(args.model, options);
    }

    // --- where the persistent steps spend a token: block 0's clock after every grid
    // barrier, summed per phase kind over the layers (the last of 24 greedy steps) ---
    std::vector<double> v1_phases, streamed_phases;
    try {
      CudaModelOptions o = options;
      o.experiments.persistent_blocks_per_sm = 1;
      v1_phases = persistent_phase_us(args.model, o);
      o = options;
      o.experiments.persistent_weight_stream = true;
      streamed_phases = persistent_phase_us(args.model, o);
    } catch (const std::exception& e) {
      std::printf("persistent phase clock: %s\n", e.what());
    }
    BenchTable phase_table("model_decode_persistent_phases",
                           {"phase (summed over the layers)", "register persistent, 1 block/SM (us)",
                            "streamed persistent (us)", "weights MB"});
    nlohmann::json phases_json = nlohmann::json::object();
    if (!v1_phases.empty() && !streamed_phases.empty()) {
      const double L = c.num_hidden_layers;  // c: the checkpoint's config
      const double qkv_mb = L * (c.num_attention_heads + 2.0 * c.num_key_value_heads) * c.head_dim * c.hidden_size * 2e-6;
      const double o_mb = L * double(c.num_attention_heads) * c.head_dim * c.hidden_size * 2e-6;
      const double mlp_mb = L * double(c.intermediate_size) * c.hidden_size * 2e-6;
      const double phase_mb[9] = {0, qkv_mb, 0, 0, o_mb, 2 * mlp_mb, mlp_mb,
                                  double(c.vocab_size) * c.hidden_size * 2e-6, 0};
      const char* const* names = kPersistentPhaseNames;
      for (int i = 0; i < 9; ++i) {
        phase_table.add_row({names[i], fmt(v1_phases[i], 1), fmt(streamed_phases[i], 1),
                             phase_mb[i] > 0 ? fmt(phase_mb[i], 0) : ""});
        phases_json[names[i]] = {{"register_us", v1_phases[i]}, {"streamed_us", streamed_phases[i]}};
      }
    }
    phase_table.print();

    BenchTable persistent_table("model_decode_persistent", {"decode path", "tokens/s", "ms/token", "vs the graph"});
    for (int blocks : {1, 2}) {
      if (persistent_tok_s[blocks] <= 0) continue;
      persistent_table.add_row({"persistent kernel, " + std::to_string(blocks) + " block(s)/SM of 256 threads",
                                fmt(persistent_tok_s[blocks], 0), fmt(1000.0 / persistent_tok_s[blocks], 3),
                                fmt(persistent_tok_s[blocks] / tok_s, 2) + "x"});
    }
    nlohmann::json streamed_json = nlohmann::json::object();
    for (const StreamedVariant& v : streamed) {
      streamed_json[v.label] = v.tok_s;
      if (v.tok_s <= 0) continue;
      persistent_table.add_row({std::string("streamed persistent kernel, ") + v.label, fmt(v.tok_s, 0),
                                fmt(1000.0 / v.tok_s, 3), fmt(v.tok_s / tok_s, 2) + "x"});
    }
    persistent_table.print();

    nlohmann::json out = {
        {"device", device},
        {"model", args.model},
        {"finished_utc", utc_now()},  // the report says when each of its parts was measured
        {"config", describe(c)},
        {"context", options.max_context > 0 ? options.max_context : c.max_position_embeddings},
        {"weights_gb", weights_gb},
        {"decode_bytes_per_token_gb", bytes_per_token / 1e9},
        {"kv_cache_gb", kv_gb},
        {"scratch_gb", scratch_gb},
        {"copy_gbs", copy_gbs},
        {"floor_ms", floor_ms},
        {"ttft_ms", ttft},
        {"ttft_512_no_pdl_ms", no_pdl_ttft_512},
        {"prefill_attention", options.prefill_attention_clusters ? "v6" : "v5"},
        {"ttft_other_prefill_attention_ms", ttft_other_attention},
        {"ttft_last_layer_every_row_ms", ttft_every_row},
        {"ttft_eager_ms", ttft_eager},
        {"decode_tokens", tokens},
        {"decode_tok_s", tok_s},
        {"decode_ms_per_token", ms_per_token},
        {"decode_gbs", decode_gbs},
        {"decode_pct_copy", 100.0 * decode_gbs / copy_gbs},
        {"decode_sync_per_token_tok_s", sync_tok_s},
        {"decode_no_pdl_tok_s", no_pdl_tok_s},
        {"decode_no_graph_tok_s", eager_tok_s},
        {"decode_gemv_blocks_per_sm_sweep", occupancy_sweep},
        {"decode_options_sweep", options_sweep},
        {"decode_marginal", marginal},
        {"decode_persistent_tok_s", {{"1", persistent_tok_s[1]}, {"2", persistent_tok_s[2]}}},
        {"decode_streamed_tok_s", streamed_json},
        {"streamed_vs_graph_max_logit_diff", streamed_logit_diff},
        {"decode_persistent_phases_us", phases_json},
        {"streamed_vs_graph_max_logit", streamed_logit_scale},
        {"eager_step_us", eager_step_us},
        {"peak_memory_gb", peak_gb},
        {"load_s", load_s},
        {"breakdown", breakdown},
        {"prefill_breakdown", prefill_breakdown},
        {"prefill_breakdown_tokens", probed_prompt},
    };
    const std::filesystem::path out_path(args.out);
    if (out_path.has_parent_path()) std::filesystem::create_directories(out_path.parent_path());
    std::ofstream(out_path) << out.dump(2) << "\n";
    std::printf("wrote %s\n", args.out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 1;
  }
}
