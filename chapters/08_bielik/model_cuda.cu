// The CUDA backend (model_cuda.hpp): loading, prefill, the decode graph.
#include "model_cuda.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <utility>

#include "attention.cuh"
#include "bf16.hpp"
#include "cuda_check.cuh"
#include "decode_attention_o.cuh"
#include "decode_kernels.cuh"
#include "decode_mlp_fused.cuh"
#include "decode_side_prefetch.cuh"
#include "embedding.cuh"
#include "fold_norm_weight.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"  // multiprocessor_count
#include "model_weights.hpp"
#include "pdl.cuh"
#include "prefill_kernels.cuh"
#include "rmsnorm.cuh"
#include "safetensors.hpp"

namespace bielik {

namespace {

constexpr size_t kTimelineValues = 2 * kGemvTimelineEvents;  // DecodeGemvParams::timeline: min / max pairs
// The attention's (chapter 07 v6 or v5, decode_attention_v*_device_length_timed): a pair
// per decode::AttentionTimelineEvent.
constexpr size_t kAttentionTimelineValues = 2 * decode::kAttentionTimelineEvents;

// Logits::kAll rows per lm_head GEMM: bounds the (rows, V) bf16 scratch (16 MB for Bielik).
constexpr int kLogitRows = 256;
// Tensors start on 256-byte boundaries inside the one weight allocation: 16-byte vector
// loads need 16, and 256 keeps every tensor on its own cache lines.
constexpr size_t kAlignElements = 128;

ModelConfig load_checked_config(const std::string& model_dir) {
  if (!std::filesystem::is_directory(model_dir)) {
    throw std::runtime_error("model directory '" + model_dir + "' does not exist");
  }
  ModelConfig c = load_model_config(model_dir + "/config.json");
  const std::string why = cuda_backend_unsupported_reason(c);
  if (!why.empty()) {
    throw std::invalid_argument(model_dir + ": the CUDA backend cannot run this shape: " + why + " (" +
                                describe(c) + ")");
  }
  return c;
}

// Every check of the options, before the constructor allocates or copies anything (the
// KV cache is allocated right after, in the member initializers; the weights later): a
// bad option, or one this GPU cannot run, costs no load. Returns `options` unchanged.
const CudaModelOptions& checked_options(const CudaModelOptions& options, const ModelConfig& config,
                                        const std::string& model_dir) {
  if (options.experiments.attention_min_keys_per_split < 0) {
    throw std::invalid_argument(
        "experiments.attention_min_keys_per_split must be >= 0 (0: chapter 07's default), got " +
        std::to_string(options.experiments.attention_min_keys_per_split));
  }
  if (options.attention_o_replicas < 1) {
    throw std::invalid_argument("attention_o_replicas must be >= 1, got " +
                                std::to_string(options.attention_o_replicas));
  }
  if (options.attention_splits < 0) {
    throw std::invalid_argument("attention_splits must be >= 0 (0: automatic), got " +
                                std::to_string(options.attention_splits));
  }
  if (options.short_attention_max_keys < 0 || options.short_attention_splits < 0) {
    throw std::invalid_argument("short_attention_max_keys and short_attention_splits must be >= 0 (0: off), got " +
                                std::to_string(options.short_attention_max_keys) + " and " +
                                std::to_string(options.short_attention_splits));
  }
  if (options.long_attention_min_keys < 0 || options.long_attention_splits < 0) {
    throw std::invalid_argument("long_attention_min_keys and long_attention_splits must be >= 0 (0: off), got " +
                                std::to_string(options.long_attention_min_keys) + " and " +
                                std::to_string(options.long_attention_splits));
  }
  if (options.experiments.decode_shared_carveout < -1 || options.experiments.decode_shared_carveout > 100) {
    throw std::invalid_argument(
        "experiments.decode_shared_carveout must be a percent from 0 to 100, or -1 (none), got " +
        std::to_string(options.experiments.decode_shared_carveout));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, int>{"experiments.gate_up_hold_blocks", options.experiments.gate_up_hold_blocks},
        {"experiments.gate_up_hold_first_block", options.experiments.gate_up_hold_first_block},
        {"gate_up_start_delay_ns", options.gate_up_start_delay_ns},
        {"down_start_delay_ns", options.down_start_delay_ns},
        {"experiments.qkv_start_delay_ns", options.experiments.qkv_start_delay_ns},
        {"experiments.o_start_delay_ns", options.experiments.o_start_delay_ns},
        {"experiments.lm_head_start_delay_ns", options.experiments.lm_head_start_delay_ns},
        {"experiments.fused_mlp_start_delay_ns", options.experiments.fused_mlp_start_delay_ns},
        {"experiments.fused_mlp_blocks", options.experiments.fused_mlp_blocks},
        {"experiments.gate_up_loads_before_wait", options.experiments.gate_up_loads_before_wait},
        {"experiments.down_loads_before_wait", options.experiments.down_loads_before_wait},
        {"experiments.lm_head_loads_before_wait", options.experiments.lm_head_loads_before_wait},
        {"gate_up_loads_before_wait_past_short_graph", options.gate_up_loads_before_wait_past_short_graph},
        {"experiments.o_loads_before_wait", options.experiments.o_loads_before_wait},
        {"gate_up_split_blocks", options.gate_up_split_blocks},
        {"gate_up_split_blocks_in_long_graph", options.gate_up_split_blocks_in_long_graph},
        {"experiments.attention_o_blocks", options.experiments.attention_o_blocks}}) {
    if (value < 0) throw std::invalid_argument(std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
  if ((options.experiments.gate_up_loads_before_wait > 0 && options.experiments.gate_up_second_batch_in_shared) ||
      (options.experiments.down_loads_before_wait > 0 &&
       (options.experiments.down_second_batch_in_shared || options.experiments.down_input_from_global))) {
    throw std::invalid_argument(
        "experiments.gate_up_loads_before_wait / experiments.down_loads_before_wait do not combine with the second "
        "batch in shared memory or down's input read in place");
  }
  if (options.experiments.o_loads_before_wait > 0 && options.experiments.o_input_from_global) {
    throw std::invalid_argument(
        "experiments.o_loads_before_wait does not combine with experiments.o_input_from_global (O's input read "
        "in place)");
  }
  if (options.experiments.split_batch_rest != SplitBatchRest::kAfterStaging &&
      options.experiments.gate_up_loads_before_wait == 0 && options.experiments.down_loads_before_wait == 0 &&
      options.experiments.lm_head_loads_before_wait == 0) {
    throw std::invalid_argument(
        "experiments.split_batch_rest says when the rest of a split first batch goes out, and needs "
        "experiments.gate_up_loads_before_wait, experiments.down_loads_before_wait or "
        "experiments.lm_head_loads_before_wait");
  }
  if (options.experiments.fused_mlp_values_before_wait < 0 || options.experiments.fused_mlp_values_before_wait > 2) {
    throw std::invalid_argument("experiments.fused_mlp_values_before_wait must be 0, 1 or 2, got " +
                                std::to_string(options.experiments.fused_mlp_values_before_wait));
  }
  if (options.experiments.fused_mlp_block_warps != 4 && options.experiments.fused_mlp_block_warps != 8) {
    throw std::invalid_argument("experiments.fused_mlp_block_warps must be 4 or 8, got " +
                                std::to_string(options.experiments.fused_mlp_block_warps));
  }
  if (options.prefill_chunk < 1) {
    throw std::invalid_argument("prefill_chunk must be >= 1, got " + std::to_string(options.prefill_chunk));
  }
  if (options.decode_graph_steps < 1 || options.decode_graph_steps > 64) {
    throw std::invalid_argument("decode_graph_steps must be 1 to 64, got " + std::to_string(options.decode_graph_steps));
  }
  if (options.experiments.prefill_gemv_max_tokens < 0 ||
      options.experiments.prefill_gemv_max_tokens > kGemvV2MaxTokens) {
    throw std::invalid_argument("experiments.prefill_gemv_max_tokens must be 0 to " +
                                std::to_string(kGemvV2MaxTokens) + ", got " +
                                std::to_string(options.experiments.prefill_gemv_max_tokens));
  }
  if (options.prefill_v6_max_tokens < 0 || options.prefill_v6_max_tokens > kMatmulV6MaxTokens) {
    throw std::invalid_argument("prefill_v6_max_tokens must be 0 to " + std::to_string(kMatmulV6MaxTokens) +
                                ", got " + std::to_string(options.prefill_v6_max_tokens));
  }
  if (options.prefill_graph_cache < 1) {
    throw std::invalid_argument("prefill_graph_cache must be >= 1, got " + std::to_string(options.prefill_graph_cache));
  }
  if (!(options.experiments.side_prefetch_gate_up_mb >= 0.0) || !(options.experiments.side_prefetch_down_mb >= 0.0) ||
      options.experiments.side_prefetch_blocks < 1 ||
      (options.experiments.side_prefetch_fork != 0 && options.experiments.side_prefetch_fork != 1) ||
      (options.experiments.side_prefetch_stride_bytes != 32 && options.experiments.side_prefetch_stride_bytes != 64 &&
       options.experiments.side_prefetch_stride_bytes != 128)) {
    throw std::invalid_argument(
        "experiments.side_prefetch_gate_up_mb and experiments.side_prefetch_down_mb must be >= 0, "
        "experiments.side_prefetch_blocks >= 1, experiments.side_prefetch_fork 0 or 1 and "
        "experiments.side_prefetch_stride_bytes 32, 64 or 128; got " +
        std::to_string(options.experiments.side_prefetch_gate_up_mb) + ", " +
        std::to_string(options.experiments.side_prefetch_down_mb) + ", " +
        std::to_string(options.experiments.side_prefetch_blocks) + ", " +
        std::to_string(options.experiments.side_prefetch_fork) + ", " +
        std::to_string(options.experiments.side_prefetch_stride_bytes));
  }
  if (!(options.experiments.l2_persist_mb >= 0.0)) {
    throw std::invalid_argument("experiments.l2_persist_mb must be >= 0 (0: off), got " +
                                std::to_string(options.experiments.l2_persist_mb));
  }
  if (options.experiments.fused_mlp &&
      (options.experiments.persistent_decode || options.experiments.v6_fuses_o ||
       options.experiments.attention_o_blocks > 0 || options.decode_attention == DecodeAttentionPath::kClusterWithO ||
       options.experiments.side_prefetch_down_mb > 0.0 || options.experiments.side_prefetch_gate_up_mb > 0.0)) {
    throw std::invalid_argument(model_dir +
                                ": experiments.fused_mlp cannot be combined with experiments.persistent_decode, "
                                "experiments.v6_fuses_o, experiments.attention_o_blocks, the kClusterWithO attention "
                                "or the side prefetch");
  }
  // What the device must have for the options asked for.
  if (options.experiments.gemv_stage_input_bulk && !device_is_sm90_or_newer()) {
    throw std::invalid_argument(model_dir +
                                ": experiments.gemv_stage_input_bulk needs sm_90 or newer (the bulk-copy engine)");
  }
  if (options.experiments.persistent_decode) {
    const int D = config.head_dim, H = config.num_attention_heads, Hkv = config.num_key_value_heads;
    if (!decode_step_persistent_supported(D, H, Hkv)) {
      throw std::invalid_argument(model_dir + ": the persistent decode step cannot run here (no cooperative "
                                  "launch, or D / GQA group unsupported)");
    }
    if (options.experiments.persistent_weight_stream && !decode_step_streamed_supported(D, H, Hkv)) {
      throw std::invalid_argument(model_dir + ": the streamed persistent decode step needs sm_90 or newer");
    }
  }
  if (options.experiments.l2_persist_mb > 0.0) {
    int device = 0, max_persisting = 0, max_window = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&max_persisting, cudaDevAttrMaxPersistingL2CacheSize, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device));
    if (max_persisting <= 0 || max_window <= 0) {
      cudaDeviceProp properties{};
      CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
      throw std::invalid_argument("experiments.l2_persist_mb: this GPU (" + std::string(properties.name) +
                                  ") cannot set L2 aside for persisting accesses (sm_80 or newer, not MIG)");
    }
  }
  return options;
}

}  // namespace

std::string cuda_backend_unsupported_reason(const ModelConfig& c) {
  if (c.head_dim != 64 && c.head_dim != 128) {
    return "head_dim must be 64 or 128 (the attention kernels are compiled for those), got " +
           std::to_string(c.head_dim);
  }
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0 ||
      c.num_attention_heads / c.num_key_value_heads > 8) {
    return "needs H a multiple of Hkv with H / Hkv <= 8";
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return "hidden_size and intermediate_size must be multiples of 8 (16-byte rows)";
  }
  // The K of every decode GEMV: C for QKV, gate/up and the lm_head, H D for O, F for down.
  // (Refused here, before any weight is copied, and so by --device auto too.)
  const long long query_width = (long long)c.num_attention_heads * c.head_dim;
  if (c.hidden_size > kDecodeGemvMaxK || c.intermediate_size > kDecodeGemvMaxK || query_width > kDecodeGemvMaxK) {
    return "hidden_size, intermediate_size and num_attention_heads * head_dim must be at most " +
           std::to_string(kDecodeGemvMaxK) + " (the decode GEMV stages its input row in shared memory), got " +
           std::to_string(c.hidden_size) + ", " + std::to_string(c.intermediate_size) + " and " +
           std::to_string(query_width);
  }
  return "";
}

CudaModel::CudaModel(const std::string& model_dir, const CudaModelOptions& options)
    : config_(load_checked_config(model_dir)),
      options_(checked_options(options, config_, model_dir)),
      kv_(config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim,
          context_length_of(config_, options.max_context)) {
  C_ = config_.hidden_size;
  F_ = config_.intermediate_size;
  H_ = config_.num_attention_heads;
  Hkv_ = config_.num_key_value_heads;
  D_ = config_.head_dim;
  V_ = config_.vocab_size;
  QKV_ = (H_ + 2 * Hkv_) * D_;
  const int context = kv_.max_context();
  const int Tc = std::min(options_.prefill_chunk, context);
  use_pdl_ = options_.use_pdl && device_supports_pdl();

  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  device_name_ = properties.name;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

  try {
    if (options_.experiments.side_prefetch_gate_up_mb > 0.0 || options_.experiments.side_prefetch_down_mb > 0.0) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&side_join_, cudaEventDisableTiming));
    }
    // The fused decode MLP (options' experiments.fused_mlp): where the model's shape takes
    // it. Its down weights are kept transposed, (F, C), for the prefill's GEMM too.
    if (options_.experiments.fused_mlp) fused_mlp_ = C_ <= decode_mlp_fused_max_c() && config_.num_hidden_layers >= 2;
    load_weights(model_dir);
    if (options_.fold_qkv_norm || options_.fold_gate_up_norm) fold_norms_into_weights();
    if (fused_mlp_) transpose_down_weights();
    set_aside_l2();
    rope_ = rope_table_build(D_, config_.rope_theta, context, stream_);

    // The decode attention reads the length on the GPU, so its grid is fixed for every
    // length. For the v3 paths, splits sized for 512 keys (32 for Bielik): a full 8k
    // cache still spreads over 64 blocks of 256 keys, while at chat lengths the step does
    // not pay for hundreds of empty splits (a block launch each, and a load each in the
    // combine). Measured on the H200 (bench_model): 128 splits cost ~10 us a layer at 20
    // keys. The workspace holds v3's partials (v5 keeps them in shared memory).
    attention_workspace_ = std::make_unique<DecodeAttentionWorkspace>(H_, D_, 1024);
    attention_min_keys_ = options_.experiments.attention_min_keys_per_split > 0
                              ? options_.experiments.attention_min_keys_per_split
                              : kDecodeV3MinKeysPerSplit;
    // v5's and v6's splits are their cluster's blocks. Clusters of 8 (not chapter 07's 16),
    // measured for v5; v6 has a clusters-of-16 row in bench_model's options table. For v5,
    // on the H200 (bench_model, 22:58 and 23:04 UTC runs), 8 won at chat lengths (813 vs
    // 785, 816 vs 790 tokens/s at 16-272 keys) and lost after a 2048-token prompt (672 vs
    // 707).
    // The fused attention + O: the largest cluster up to the one asked for whose W_o rows
    // fit a block's shared memory.
    attention_path_ = options_.decode_attention;
    int fused_cluster = 0;
    if (attention_path_ == DecodeAttentionPath::kClusterWithO) {
      // Clusters of 8 unless asked otherwise: 4 replicas of clusters of 16 do not fit the
      // GPU's GPCs at once (bench_attention_o: 16.3 us against 8.0 for 8 x 4).
      const int requested = options_.attention_splits > 0 ? options_.attention_splits : 8;
      fused_cluster = decode_attention_o_cluster_size(C_, H_, Hkv_, D_, requested, options_.attention_o_replicas);
      if (fused_cluster == 0) attention_path_ = DecodeAttentionPath::kCluster;
    }
    attention_splits_ = attention_path_ == DecodeAttentionPath::kClusterWithO ? fused_cluster
                        : options_.attention_splits > 0 ? std::min(options_.attention_splits, 1024)
                        : attention_path_ == DecodeAttentionPath::kCluster
                            ? std::min(8, decode_attention_v5_default_splits(context, H_, Hkv_, D_, 1024))
                        : attention_path_ == DecodeAttentionPath::kClusterPerHead
                            ? std::min(8, decode_attention_v6_default_splits(context, H_, Hkv_, D_, 1024))
                            : decode_attention_v3_default_splits(std::min(context, 512), H_, Hkv_, D_, 1024);
    // v6 at chat lengths: a second graph with smaller clusters (options' comment).
    if (attention_path_ == DecodeAttentionPath::kClusterPerHead && options_.attention_splits == 0 &&
        options_.short_attention_max_keys > 0 && options_.short_attention_splits > 0 &&
        options_.short_attention_splits < attention_splits_ && !options_.experiments.persistent_decode) {
      short_attention_splits_ = options_.short_attention_splits;
      short_attention_max_keys_ = options_.short_attention_max_keys;
    }
    // ... and at long lengths a third graph with larger clusters, where the GPU runs them
    // and the cache can hold that many keys.
    if (attention_path_ == DecodeAttentionPath::kClusterPerHead && options_.attention_splits == 0 &&
        options_.long_attention_min_keys > 0 && options_.long_attention_min_keys <= context &&
        options_.long_attention_min_keys > short_attention_max_keys_ && !options_.experiments.persistent_decode) {
      const int largest = decode_attention_v6_default_splits(context, H_, Hkv_, D_, 1024);
      const int splits = std::min(options_.long_attention_splits, largest);
      if (splits > attention_splits_) {
        long_attention_splits_ = splits;
        long_attention_min_keys_ = options_.long_attention_min_keys;
      }
    }

    const size_t tc = size_t(Tc);
    p_tokens_ = DeviceBuffer<int32_t>(tc);
    p_x_ = DeviceBuffer<__nv_bfloat16>(tc * C_);
    p_h_ = DeviceBuffer<__nv_bfloat16>(tc * C_);
    p_proj_ = DeviceBuffer<__nv_bfloat16>(tc * C_);
    p_qkv_ = DeviceBuffer<__nv_bfloat16>(tc * QKV_);
    p_q_ = DeviceBuffer<__nv_bfloat16>(tc * H_ * D_);
    p_attn_ = DeviceBuffer<__nv_bfloat16>(tc * H_ * D_);
    p_k_ = DeviceBuffer<__nv_bfloat16>(tc * Hkv_ * D_);
    p_v_ = DeviceBuffer<__nv_bfloat16>(tc * Hkv_ * D_);
    p_gate_up_ = DeviceBuffer<__nv_bfloat16>(tc * 2 * F_);
    p_act_ = DeviceBuffer<__nv_bfloat16>(tc * F_);
    p_k_gathered_ = DeviceBuffer<__nv_bfloat16>(size_t(context) * Hkv_ * D_);
    p_v_gathered_ = DeviceBuffer<__nv_bfloat16>(size_t(context) * Hkv_ * D_);
    p_logits_ = DeviceBuffer<__nv_bfloat16>(size_t(std::min(kLogitRows, Tc)) * V_);
    d_token_ = DeviceBuffer<int32_t>(1);
    d_history_ = DeviceBuffer<int32_t>(size_t(context));
    if (options_.argmax_in_lm_head) {
      // The lm_head's grid never has more blocks than rows (one row a block at least).
      d_argmax_block_best_ = DeviceBuffer<int2>(size_t(V_));
      d_argmax_blocks_done_ = DeviceBuffer<unsigned>(1);
      d_argmax_blocks_done_.fill_bytes(0);
    }
    d_x_ = DeviceBuffer<__nv_bfloat16>(C_);
    d_qkv_ = DeviceBuffer<__nv_bfloat16>(QKV_);
    d_attn_ = DeviceBuffer<__nv_bfloat16>(size_t(H_) * D_);
    d_act_ = DeviceBuffer<__nv_bfloat16>(F_);
    // v6 with O fused: only where every graph's cluster size runs (W_o's rows fit).
    v6_fuses_o_ = options_.experiments.v6_fuses_o && attention_path_ == DecodeAttentionPath::kClusterPerHead &&
                  !options_.experiments.persistent_decode;
    for (int splits : {attention_splits_, short_attention_splits_, long_attention_splits_}) {
      if (v6_fuses_o_ && splits > 0) v6_fuses_o_ = decode_attention_o_per_head_runs(C_, H_, Hkv_, D_, splits);
    }
    // The O projection by O blocks in v6's clusters: where some graph's cluster size
    // leaves room for them (o_blocks_for below); a layer's accumulator is reset by the
    // next layer's kernel, so two layers or more.
    o_blocks_enabled_ = options_.experiments.attention_o_blocks > 0 &&
                        attention_path_ == DecodeAttentionPath::kClusterPerHead && !v6_fuses_o_ &&
                        !options_.experiments.persistent_decode && layers_.size() >= 2;
    if (o_blocks_enabled_) {
      // Each layer's accumulator starts at its O bias (the next layer's kernel resets it
      // to that again once its readers, gate/up and down, are done).
      d_o_accumulators_ = accumulators_at_bias(&Layer::b_o);
    }
    d_o_partials_ = DeviceBuffer<float>(size_t(v6_fuses_o_ ? H_ : Hkv_) * C_);
    d_o_arrivals_ = DeviceBuffer<unsigned>(kAttentionOMaxClusterSize);
    d_o_arrivals_.fill_bytes(0);  // every launch leaves them at 0 again
    d_attention_signals_ = DeviceBuffer<unsigned>(2 * layers_.size());
    d_attention_signals_.fill_bytes(0);  // count 0, tag 0: no step's (tags start at 1)
    if (options_.experiments.decode_timeline) {
      d_timeline_ = DeviceBuffer<unsigned long long>(kTimelineValues * (4 * layers_.size() + 1) +
                                                     kAttentionTimelineValues * layers_.size());
    }
    d_logits_ = DeviceBuffer<float>(V_);
    if (fused_mlp_) {
      // Each layer's accumulator starts at its down bias (every fused MLP resets the
      // previous layer's to it again once that layer's readers are done).
      d_mlp_accumulators_ = accumulators_at_bias(&Layer::b_down);
    }
    // Zeros, not whatever the allocator left: with options_.experiments.decode_skip a kernel may read
    // one of these without the kernel that writes it having run.
    d_qkv_.fill_bytes(0);
    d_history_.fill_bytes(0xff);  // -1: a token read from a position no step wrote is an error
    d_attn_.fill_bytes(0);
    d_act_.fill_bytes(0);
    d_o_partials_.fill_bytes(0);

    void* pinned = nullptr;
    CUDA_CHECK(cudaMallocHost(&pinned, size_t(V_) * sizeof(float)));
    h_logits_.reset(static_cast<float*>(pinned));
    CUDA_CHECK(cudaMallocHost(&pinned, size_t(context) * sizeof(int32_t)));
    h_tokens_.reset(static_cast<int32_t*>(pinned));
    CUDA_CHECK(cudaMallocHost(&pinned, sizeof(SampleExchange)));
    h_sample_.reset(new (pinned) SampleExchange());
    d_sample_uniform_ = DeviceBuffer<double>(1);
    d_sample_result_ = DeviceBuffer<SampleResult>(1);

    // One eager step first: every launcher's one-time host work (occupancy queries, the
    // attention split kernel's setup) happens outside the capture, and a kernel that
    // cannot launch fails here with its own message. Then forget it.
    CUDA_CHECK(cudaMemsetAsync(d_token_.data(), 0, sizeof(int32_t), stream_));
    embed_host_token();
    enqueue_decode_step(stream_, use_pdl_, nullptr, attention_splits_);
    if (short_attention_splits_ > 0) enqueue_decode_step(stream_, use_pdl_, nullptr, short_attention_splits_);
    if (long_attention_splits_ > 0) enqueue_decode_step(stream_, use_pdl_, nullptr, long_attention_splits_);
    kv_.reset(stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));

    if (options_.experiments.persistent_decode) {
      std::vector<PersistentLayer> host_layers;
      for (size_t l = 0; l < layers_.size(); ++l) {
        const Layer& L = layers_[l];
        host_layers.push_back({L.input_norm, L.w_qkv, L.b_qkv, L.w_o, L.b_o, L.post_norm, L.w_gate_up, L.b_gate_up,
                               L.w_down, L.b_down, kv_.k(int(l)), kv_.v(int(l))});
      }
      d_persistent_layers_ = DeviceBuffer<PersistentLayer>(host_layers);
      d_barrier_ = DeviceBuffer<unsigned>(2);
      d_barrier_.fill_bytes(0);
      PersistentStep& p = persistent_step_;
      p.layers = d_persistent_layers_.data();
      p.L = int(layers_.size());
      p.C = C_;
      p.F = F_;
      p.H = H_;
      p.Hkv = Hkv_;
      p.D = D_;
      p.V = V_;
      p.eps = config_.rms_norm_eps;
      p.embed = embed_;
      p.final_norm = final_norm_;
      p.lm_head = lm_head_;
      p.x = d_x_.data();
      p.q = d_qkv_.data();
      p.attn = d_attn_.data();
      p.act = d_act_.data();
      p.logits = d_logits_.data();
      p.token = d_token_.data();
      p.d_length = kv_.device_length();
      p.cos = rope_.cos.data();
      p.sin = rope_.sin.data();
      p.max_context = context;
      p.max_positions = rope_.max_positions;
      p.partial_acc = attention_workspace_->partial_acc.data();
      p.partial_ml = attention_workspace_->partial_ml.data();
      p.splits = attention_splits_;
      p.barrier = d_barrier_.data();
      if (options_.experiments.persistent_phase_clock) {
        d_phase_clock_ =
            DeviceBuffer<unsigned long long>(size_t(6) * layers_.size() + 18 + size_t(5) * multiprocessor_count());
        d_phase_clock_.fill_bytes(0);
        p.phase_clock = d_phase_clock_.data();
      }
      // Once, at load: a shape whose ring does not fit in shared memory fails here, not at
      // the first step, and no step repeats the host work.
      if (options_.experiments.persistent_weight_stream) {
        streamed_layout_ = decode_step_streamed_layout(p, options_.experiments.persistent_ring_stages,
                                                       options_.experiments.persistent_slot_bytes);
      }
    } else if (options_.use_graph) {
      try {
        capture_graphs(use_pdl_);
      } catch (const std::exception& error) {
        if (!use_pdl_) throw;
        // A driver that cannot capture programmatic launches: keep the graph, lose PDL.
        std::fprintf(stderr, "CudaModel: capturing the decode graph with PDL failed (%s); capturing without\n",
                     error.what());
        cudaGetLastError();
        use_pdl_ = false;
        destroy_graphs();
        capture_graphs(false);
      }
    }
    // Every device buffer this model owns besides the weights and the KV cache (what
    // scratch_bytes() reports; the buffers above that an option leaves empty count 0).
    for (size_t bytes :
         {p_tokens_.bytes(), p_x_.bytes(), p_h_.bytes(), p_proj_.bytes(), p_qkv_.bytes(), p_q_.bytes(),
          p_attn_.bytes(), p_k_.bytes(), p_v_.bytes(), p_gate_up_.bytes(), p_act_.bytes(), p_k_gathered_.bytes(),
          p_v_gathered_.bytes(), p_logits_.bytes(), d_token_.bytes(), d_history_.bytes(),
          d_argmax_block_best_.bytes(), d_argmax_blocks_done_.bytes(), d_x_.bytes(), d_qkv_.bytes(),
          d_attn_.bytes(), d_act_.bytes(), d_o_partials_.bytes(), d_o_arrivals_.bytes(), d_o_accumulators_.bytes(),
          d_attention_signals_.bytes(), d_timeline_.bytes(), d_logits_.bytes(), d_mlp_accumulators_.bytes(),
          d_sample_uniform_.bytes(), d_sample_result_.bytes(), attention_workspace_->partial_acc.bytes(),
          attention_workspace_->partial_ml.bytes(), attention_workspace_->split_counters.bytes(),
          rope_.cos.bytes(), rope_.sin.bytes(), d_persistent_layers_.bytes(), d_barrier_.bytes(),
          d_phase_clock_.bytes()}) {
      scratch_bytes_ += bytes;
    }
  } catch (...) {
    destroy_graphs();
    destroy_side_branch();
    restore_l2();
    cudaStreamDestroy(stream_);
    throw;
  }
}

void CudaModel::set_aside_l2() {
  if (!(options_.experiments.l2_persist_mb > 0.0)) return;
  int device = 0, max_persisting = 0, max_window = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_persisting, cudaDevAttrMaxPersistingL2CacheSize, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device));
  // (Both are positive: checked_options refused a GPU without a persisting L2.)
  // Clamped as a double first: "everything" (1e6 MB) must not overflow size_t.
  const size_t wanted = size_t(std::min(options_.experiments.l2_persist_mb * 1e6, double(max_persisting)));
  CUDA_CHECK(cudaDeviceGetLimit(&l2_previous_limit_, cudaLimitPersistingL2CacheSize));
  const cudaError_t status = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, wanted);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    throw std::invalid_argument("experiments.l2_persist_mb: the GPU refused a persisting L2 set-aside of " +
                                std::to_string(wanted) + " bytes: " + cudaGetErrorString(status));
  }
  // What the driver granted (it may round): the windows below share exactly that.
  CUDA_CHECK(cudaDeviceGetLimit(&l2_persist_bytes_, cudaLimitPersistingL2CacheSize));
  l2_max_window_bytes_ = size_t(max_window);
}

void CudaModel::restore_l2() {
  if (l2_persist_bytes_ == 0) return;
  // The lines this model marked go back to normal, and the set-aside to what it was
  // (errors ignored: this runs in the destructor).
  cudaCtxResetPersistingL2Cache();
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, l2_previous_limit_);
  l2_persist_bytes_ = 0;
}

cudaAccessPolicyWindow CudaModel::l2_persist_window(L2PersistTarget target, const Layer* layer) const {
  cudaAccessPolicyWindow window = {};
  if (l2_persist_bytes_ == 0 || target != options_.experiments.l2_persist_target) return window;
  constexpr size_t kValue = sizeof(__nv_bfloat16);
  // The lm_head holds the whole set-aside; a layer's matrix its 1 / L share of it.
  const size_t share = target == L2PersistTarget::kLmHead ? l2_persist_bytes_ : l2_persist_bytes_ / layers_.size();
  const char* begin = nullptr;  // the matrix
  size_t matrix_bytes = 0;
  double centre = 1.0;  // where in the matrix the window sits: 0 its start, 0.5 the middle, 1 its end
  switch (target) {
    case L2PersistTarget::kLmHead:
      begin = reinterpret_cast<const char*>(lm_head_);
      matrix_bytes = size_t(V_) * C_ * kValue;
      centre = 0.0;
      break;
    case L2PersistTarget::kQkv:
      begin = reinterpret_cast<const char*>(layer->w_qkv);
      matrix_bytes = size_t(QKV_) * C_ * kValue;
      break;
    case L2PersistTarget::kO:
      begin = reinterpret_cast<const char*>(layer->w_o);
      matrix_bytes = size_t(C_) * H_ * D_ * kValue;
      break;
    case L2PersistTarget::kGateUp:  // gate's last rows and up's first: the middle of (2F, C)
      begin = reinterpret_cast<const char*>(layer->w_gate_up);
      matrix_bytes = size_t(2) * F_ * C_ * kValue;
      centre = 0.5;
      break;
    case L2PersistTarget::kDown:
      begin = reinterpret_cast<const char*>(layer->w_down);
      matrix_bytes = size_t(C_) * F_ * kValue;
      break;
    case L2PersistTarget::kNone:  // no GEMV asks for it (the check above)
      return window;
  }
  const size_t bytes = std::min({share, matrix_bytes, l2_max_window_bytes_});
  if (bytes == 0) return window;
  // The window's start, from `centre`: inside the matrix whatever the size.
  const size_t offset = centre == 0.0   ? 0
                        : centre == 1.0 ? matrix_bytes - bytes
                                        : std::min(matrix_bytes - bytes, size_t(matrix_bytes * centre) - bytes / 2);
  window.base_ptr = const_cast<char*>(begin + offset);
  window.num_bytes = bytes;
  window.hitRatio = 1.0f;
  window.hitProp = cudaAccessPropertyPersisting;
  window.missProp = cudaAccessPropertyStreaming;
  return window;
}

size_t CudaModel::decode_graph_nodes() const {
  size_t nodes = 0;
  if (graph_) CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes));
  return nodes;
}

void CudaModel::destroy_side_branch() {
  if (side_fork_) cudaEventDestroy(side_fork_);
  if (side_join_) cudaEventDestroy(side_join_);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  side_fork_ = side_join_ = nullptr;
  side_stream_ = nullptr;
}

void CudaModel::capture_graphs(bool pdl) {
  capture_graph(pdl, attention_splits_, graph_, graph_exec_);
  if (short_attention_splits_ > 0) capture_graph(pdl, short_attention_splits_, short_graph_, short_graph_exec_);
  if (long_attention_splits_ > 0) capture_graph(pdl, long_attention_splits_, long_graph_, long_graph_exec_);
  const int steps = options_.decode_graph_steps;
  if (steps > 1) {
    capture_graph(pdl, attention_splits_, multi_step_graph_[0], multi_step_exec_[0], steps);
    if (short_attention_splits_ > 0) {
      capture_graph(pdl, short_attention_splits_, multi_step_graph_[1], multi_step_exec_[1], steps);
    }
    if (long_attention_splits_ > 0) {
      capture_graph(pdl, long_attention_splits_, multi_step_graph_[2], multi_step_exec_[2], steps);
    }
  }
}

void CudaModel::destroy_graphs() {
  for (cudaGraphExec_t* exec : {&graph_exec_, &short_graph_exec_, &long_graph_exec_, &multi_step_exec_[0],
                                 &multi_step_exec_[1], &multi_step_exec_[2]}) {
    if (*exec) cudaGraphExecDestroy(*exec);
    *exec = nullptr;
  }
  for (cudaGraph_t* graph : {&graph_, &short_graph_, &long_graph_, &multi_step_graph_[0], &multi_step_graph_[1],
                             &multi_step_graph_[2]}) {
    if (*graph) cudaGraphDestroy(*graph);
    *graph = nullptr;
  }
}

void CudaModel::capture_graph(bool pdl, int attention_splits, cudaGraph_t& graph, cudaGraphExec_t& exec,
                              int steps) {
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    // Each step reads the token and the length the step before it wrote on the GPU.
    for (int i = 0; i < steps; ++i) enqueue_decode_step(stream_, pdl, nullptr, attention_splits);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream_, &broken);
    if (broken) cudaGraphDestroy(broken);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  try {
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphUpload(exec, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    if (exec) cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
    throw;
  }
}

CudaModel::~CudaModel() {
  cudaStreamSynchronize(stream_);
  destroy_prefill_graphs();
  destroy_graphs();
  destroy_side_branch();
  restore_l2();
  cudaStreamDestroy(stream_);
}

void CudaModel::load_weights(const std::string& model_dir) {
  const Checkpoint checkpoint = Checkpoint::open_dir(model_dir);
  const ModelWeights w = map_model_weights(checkpoint, config_);

  // Pass 1: where each tensor goes. Concatenations (q|k|v, gate|up) are consecutive
  // placements: row-major (out, in) matrices stack along `out` by simply following
  // each other.
  struct Placement {
    const TensorView* view;
    size_t offset;  // elements
  };
  std::vector<Placement> placements;
  size_t total = 0;
  auto align = [](size_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; };
  // Places the views back to back (one logical tensor) and returns its offset.
  auto place = [&](std::initializer_list<const TensorView*> views) -> size_t {
    const size_t start = total = align(total);
    for (const TensorView* view : views) {
      placements.push_back({view, total});
      total += view->numel();
    }
    return start;
  };
  auto place_optional = [&](std::initializer_list<const TensorView*> views) -> long long {
    for (const TensorView* view : views) {
      if (view == nullptr) return -1;
    }
    return (long long)place(views);
  };

  struct Offsets {
    size_t input_norm, w_qkv, w_o, post_norm, w_gate_up, w_down;
    long long b_qkv, b_o, b_gate_up, b_down;
  };
  std::vector<Offsets> offsets;
  const size_t embed = place({w.embed});
  for (const LayerWeights& lw : w.layers) {
    Offsets o{};
    o.input_norm = place({lw.input_norm});
    o.w_qkv = place({lw.wq, lw.wk, lw.wv});
    o.b_qkv = place_optional({lw.bq, lw.bk, lw.bv});
    o.w_o = place({lw.wo});
    o.b_o = place_optional({lw.bo});
    o.post_norm = place({lw.post_norm});
    o.w_gate_up = place({lw.w_gate, lw.w_up});
    o.b_gate_up = place_optional({lw.b_gate, lw.b_up});
    o.w_down = place({lw.w_down});
    o.b_down = place_optional({lw.b_down});
    offsets.push_back(o);
  }
  const size_t final_norm = place({w.final_norm});
  const size_t lm_head = config_.tie_word_embeddings ? embed : place({w.lm_head});

  // Pass 2: one allocation, one copy per tensor. The mapped bytes may be unaligned
  // (safetensors.hpp), which cudaMemcpy does not mind; checkpoint files are little endian
  // like every GPU host.
  weights_ = DeviceBuffer<__nv_bfloat16>(align(total));
  for (const Placement& p : placements) {
    CUDA_CHECK(cudaMemcpy(weights_.data() + p.offset, p.view->data, p.view->byte_size, cudaMemcpyHostToDevice));
  }

  const __nv_bfloat16* base = weights_.data();
  auto at = [&](long long offset) { return offset < 0 ? nullptr : base + offset; };
  embed_ = base + embed;
  final_norm_ = base + final_norm;
  lm_head_ = base + lm_head;
  for (const Offsets& o : offsets) {
    layers_.push_back(Layer{base + o.input_norm, base + o.w_qkv, at(o.b_qkv), base + o.w_o, at(o.b_o),
                            base + o.post_norm, base + o.w_gate_up, at(o.b_gate_up), base + o.w_down,
                            at(o.b_down)});
  }
}

void CudaModel::fold_norms_into_weights() {
  const std::vector<uint16_t> ones(size_t(C_), uint16_t(0x3F80));  // bf16 1.0
  // Ours to rewrite: both live in weights_, the device copy of the checkpoint.
  auto fold = [&](const __nv_bfloat16* norm_weight, const __nv_bfloat16* matrix, int rows) {
    __nv_bfloat16* W = weights_.data() + (matrix - weights_.data());
    __nv_bfloat16* norm = weights_.data() + (norm_weight - weights_.data());
    fold_norm_weight_into_columns(W, norm, rows, C_, stream_);
    CUDA_CHECK(cudaMemcpyAsync(norm, ones.data(), ones.size() * sizeof(uint16_t), cudaMemcpyHostToDevice, stream_));
  };
  for (const Layer& L : layers_) {
    if (options_.fold_qkv_norm) fold(L.input_norm, L.w_qkv, QKV_);
    if (options_.fold_gate_up_norm) fold(L.post_norm, L.w_gate_up, 2 * F_);
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // `ones` leaves scope
}

DeviceBuffer<float> CudaModel::accumulators_at_bias(const __nv_bfloat16* Layer::*bias) const {
  std::vector<float> start(layers_.size() * C_, 0.0f);
  std::vector<uint16_t> bits(C_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const __nv_bfloat16* layer_bias = layers_[l].*bias;
    if (!layer_bias) continue;
    CUDA_CHECK(cudaMemcpy(bits.data(), layer_bias, C_ * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (int n = 0; n < C_; ++n) start[l * C_ + n] = bf16_bits_to_float(bits[n]);
  }
  return DeviceBuffer<float>(start);
}

void CudaModel::transpose_down_weights() {
  // One layer at a time through a scratch matrix: 27.5 MB more at the peak for Bielik.
  DeviceBuffer<__nv_bfloat16> scratch(size_t(C_) * F_);
  for (const Layer& L : layers_) {
    __nv_bfloat16* down = weights_.data() + (L.w_down - weights_.data());  // ours to rewrite
    transpose_bf16(scratch.data(), down, C_, F_, stream_);
    CUDA_CHECK(cudaMemcpyAsync(down, scratch.data(), scratch.bytes(), cudaMemcpyDeviceToDevice, stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

size_t CudaModel::decode_weight_bytes() const {
  const size_t embed_bytes = size_t(V_) * C_ * sizeof(__nv_bfloat16);
  // Tied: the table is read in full by the lm_head, so nothing is skipped.
  return config_.tie_word_embeddings ? weights_.bytes() : weights_.bytes() - embed_bytes;
}

std::string CudaModel::name() const { return "cuda (" + device_name_ + ")"; }


void CudaModel::check_fits(size_t count, const char* what) const {
  const size_t used = size_t(kv_.length());
  const size_t context = size_t(kv_.max_context());
  if (used + count > context) {
    std::string message = std::string(what) + " of " + std::to_string(count) + (count == 1 ? " token" : " tokens") +
                          " exceeds the context of " + std::to_string(context) + " tokens";
    if (used > 0) {
      message += " (" + std::to_string(used) + " already used, " + std::to_string(context - used) + " left)";
    }
    throw std::length_error(message);
  }
}

void CudaModel::check_token(int32_t token) const {
  if (token < 0 || token >= V_) {
    throw std::out_of_range("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                            std::to_string(V_) + ")");
  }
}

void CudaModel::reset() {
  kv_.reset(stream_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> CudaModel::prefill(const std::vector<int32_t>& tokens, Logits which) {
  if (tokens.empty()) throw std::invalid_argument("prefill needs at least one token");
  check_fits(tokens.size(), "prompt");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= V_) {
      throw std::out_of_range("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(V_) + ")");
    }
  }
  const bool all = which == Logits::kAll;
  const size_t V = size_t(V_);
  const size_t chunk = size_t(std::min(options_.prefill_chunk, kv_.max_context()));
  std::vector<float> logits(all ? tokens.size() * V : V);
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    const int T = int(std::min(chunk, tokens.size() - start));
    const bool last_chunk = start + size_t(T) == tokens.size();
    float* out = all ? logits.data() + start * V : (last_chunk ? logits.data() : nullptr);
    forward_chunk(tokens.data() + start, T, all, out);
  }
  return logits;
}

void CudaModel::prefill_probed(const std::vector<int32_t>& tokens,
                               const std::function<void(const char*)>& after_kernel) {
  if (tokens.empty() || tokens.size() > size_t(std::min(options_.prefill_chunk, kv_.max_context()))) {
    throw std::invalid_argument("prefill_probed: needs 1 to prefill_chunk tokens, got " +
                                std::to_string(tokens.size()));
  }
  check_fits(tokens.size(), "prompt");
  for (int32_t token : tokens) check_token(token);
  std::vector<float> logits(static_cast<size_t>(V_));
  forward_chunk(tokens.data(), int(tokens.size()), false, logits.data(), &after_kernel);
}

void CudaModel::forward_chunk(const int32_t* tokens, int T, bool all_logits, float* logits,
                              const std::function<void(const char*)>* after) {
  cudaStream_t s = stream_;
  // The ids go in before the graph or the launches that read them: a graph holds no host
  // pointer, so replaying one for new ids of the same shape is correct.
  CUDA_CHECK(cudaMemcpyAsync(p_tokens_.data(), tokens, size_t(T) * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  const bool want_logits = logits != nullptr;
  if (after == nullptr && !all_logits) {
    launch_chunk(T, want_logits);
  } else {
    enqueue_chunk(T, all_logits, want_logits, after);
  }
  kv_.commit_host(T);  // the device length advanced inside the chunk's work

  if (want_logits) {
    const size_t V = size_t(V_);
    if (all_logits) {
      std::vector<uint16_t> bits(size_t(kLogitRows) * V);
      for (int first = 0; first < T; first += kLogitRows) {
        const int rows = std::min(kLogitRows, T - first);
        matmul_forward(p_logits_.data(), p_h_.data() + size_t(first) * C_, lm_head_, nullptr, rows, C_, V_, s);
        CUDA_CHECK(cudaMemcpyAsync(bits.data(), p_logits_.data(), size_t(rows) * V * sizeof(uint16_t),
                                   cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        for (size_t i = 0; i < size_t(rows) * V; ++i) {
          const uint32_t wide = uint32_t(bits[i]) << 16;
          std::memcpy(&logits[size_t(first) * V + i], &wide, sizeof(float));
        }
      }
    } else {
      CUDA_CHECK(cudaMemcpyAsync(h_logits_.get(), d_logits_.data(), V * sizeof(float), cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      std::memcpy(logits, h_logits_.get(), V * sizeof(float));
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaModel::launch_chunk(int T, bool want_logits) {
  if (!options_.prefill_graphs || prefill_graphs_broken_) {
    enqueue_chunk(T, false, want_logits, nullptr);
    return;
  }
  const PrefillShape shape{T, kv_.length(), want_logits};
  const uint64_t now = ++prefill_graph_clock_;
  // Where a capture fails, prefill stays on eager launches from then on.
  auto give_up = [&](const char* what, const char* why) {
    std::fprintf(stderr, "CudaModel: %s a prefill graph failed (%s); prefill launches eagerly from now on\n", what,
                 why);
    cudaGetLastError();
    prefill_graphs_broken_ = true;
    enqueue_chunk(T, false, want_logits, nullptr);
  };
  auto found = prefill_graphs_.find(shape);
  if (found == prefill_graphs_.end()) {
    // First sight of the shape: launch eagerly and remember it (the oldest memory goes
    // once there are many: a long chat sees a new shape every turn).
    auto seen = prefill_shapes_seen_.find(shape);
    if (seen == prefill_shapes_seen_.end()) {
      if (prefill_shapes_seen_.size() >= 64) {
        prefill_shapes_seen_.erase(std::min_element(
            prefill_shapes_seen_.begin(), prefill_shapes_seen_.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; }));
      }
      prefill_shapes_seen_.emplace(shape, now);
      enqueue_chunk(T, false, want_logits, nullptr);
      return;
    }
    prefill_shapes_seen_.erase(seen);
    // Second sight: capture. Nothing runs while the stream captures; the graph runs below.
    PrefillGraph captured;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_chunk(T, false, want_logits, nullptr);
    } catch (const std::exception& error) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream_, &broken);
      if (broken) cudaGraphDestroy(broken);
      give_up("capturing", error.what());
      return;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &captured.graph));
    const cudaError_t instantiated = cudaGraphInstantiate(&captured.exec, captured.graph, 0);
    if (instantiated != cudaSuccess) {
      cudaGraphDestroy(captured.graph);
      give_up("instantiating", cudaGetErrorString(instantiated));
      return;
    }
    if (prefill_graphs_.size() >= size_t(options_.prefill_graph_cache)) {
      const auto oldest =
          std::min_element(prefill_graphs_.begin(), prefill_graphs_.end(),
                           [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
      // No launch of it is pending: every prefill ends with a stream sync.
      cudaGraphExecDestroy(oldest->second.exec);
      cudaGraphDestroy(oldest->second.graph);
      prefill_graphs_.erase(oldest);
    }
    found = prefill_graphs_.emplace(shape, captured).first;
  }
  found->second.last_used = now;
  CUDA_CHECK(cudaGraphLaunch(found->second.exec, stream_));
}

void CudaModel::project(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* b,
                        int rows, int C_in, int C_out, cudaStream_t s) const {
  if (rows >= 2 && rows <= options_.prefill_v6_max_tokens && matmul_v6_available() &&
      matmul_v6_supported(x, W, rows, C_in)) {
    matmul_v6_few_tokens(y, x, W, b, rows, C_in, C_out, s);
  } else if (rows >= 2 && rows <= options_.experiments.prefill_gemv_max_tokens && gemv_v2_supported(x, W, rows, C_in)) {
    gemv_v2_tensor_cores(y, x, W, b, rows, C_in, C_out, s);
  } else {
    matmul_forward(y, x, W, b, rows, C_in, C_out, s);
  }
}

void CudaModel::destroy_prefill_graphs() {
  for (auto& [shape, graph] : prefill_graphs_) {
    if (graph.exec) cudaGraphExecDestroy(graph.exec);
    if (graph.graph) cudaGraphDestroy(graph.graph);
  }
  prefill_graphs_.clear();
  prefill_shapes_seen_.clear();
}

void CudaModel::enqueue_chunk(int T, bool all_logits, bool want_logits,
                              const std::function<void(const char*)>* after) {
  auto done = [&](const char* name) {
    if (after) (*after)(name);
  };
  cudaStream_t s = stream_;
  const int P = kv_.length();
  const int context = kv_.max_context();
  const float eps = config_.rms_norm_eps;
  const int HD = H_ * D_;

  embedding_forward(p_x_.data(), embed_, p_tokens_.data(), T, C_, V_, nullptr, s);
  done("embedding");
  // The kernels between the GEMMs (norms, split + RoPE + append, attention, SwiGLU) are
  // launched with PDL when the model uses it: each may start while the kernel before it
  // drains, and waits on the GPU for its results.
  // The last layer's queries, O projection and MLP matter only for the rows whose logits
  // are asked for: with Logits::kLast, the last token (row T - 1), and in a chunk before
  // the last, none. Every row's keys and values still go into its cache.
  const bool rows_only = options_.prefill_last_layer_rows_only && !all_logits;
  const int last_layer_rows = want_logits ? 1 : 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const bool trimmed = rows_only && l + 1 == layers_.size();
    // h = rmsnorm(x); from layer 1 on, the previous layer's MLP output is added first.
    if (l == 0) {
      rmsnorm_forward(p_h_.data(), p_x_.data(), L.input_norm, T, C_, eps, s);
    } else {
      fused_residual_rmsnorm_forward(p_h_.data(), p_x_.data(), p_proj_.data(), L.input_norm, T, C_, eps, s, use_pdl_);
    }
    done("norm");
    project(p_qkv_.data(), p_h_.data(), L.w_qkv, L.b_qkv, T, C_, QKV_, s);
    done("qkv_gemm");
    // q, k, v apart (token-major), RoPE on q and k, k and v into the cache: one pass.
    const QkvRopeAppendOut split{p_q_.data(), p_k_.data(), p_v_.data(), kv_.k(int(l)), kv_.v(int(l)), context};
    qkv_rope_append(split, p_qkv_.data(), T, P, H_, Hkv_, rope_, s, use_pdl_);
    done("split_rope_append");
    if (trimmed && last_layer_rows == 0) break;  // the cache has this chunk; nothing reads the rest
    // Rows [first_row, T) go on (all of them, or the last one in the trimmed last layer):
    // the queries, attention output and MLP buffers then hold `rows` rows from row 0.
    const int rows = trimmed ? last_layer_rows : T;
    const int first_row = T - rows;
    const __nv_bfloat16* keys = p_k_.data();
    const __nv_bfloat16* values = p_v_.data();
    if (P > 0) {
      kv_cache_gather_token_major(p_k_gathered_.data(), p_v_gathered_.data(), kv_.k(int(l)), kv_.v(int(l)), P + T,
                                  Hkv_, D_, context, s);
      keys = p_k_gathered_.data();
      values = p_v_gathered_.data();
    }
    // The last `rows` queries: the attention puts them at positions P + first_row ...
    // (chapter 05: Tq queries are the last Tq of Tkv tokens).
    const __nv_bfloat16* queries = p_q_.data() + size_t(first_row) * HD;
    if (options_.prefill_attention_clusters && device_is_sm90_or_newer()) {  // (before sm_90, v6 is v3: use v5)
      attention_v6_cluster_split_keys_with(p_attn_.data(), queries, keys, values, rows, P + T, H_, Hkv_, D_, s,
                                           use_pdl_, 0);
    } else {
      attention_forward(p_attn_.data(), queries, keys, values, rows, P + T, H_, Hkv_, D_, s, use_pdl_);
    }
    done("attention");
    project(p_proj_.data(), p_attn_.data(), L.w_o, L.b_o, rows, HD, C_, s);
    done("o_gemm");
    // The residual stream's rows [first_row, T) (the others are not read again).
    __nv_bfloat16* residual = p_x_.data() + size_t(first_row) * C_;
    fused_residual_rmsnorm_forward(p_h_.data(), residual, p_proj_.data(), L.post_norm, rows, C_, eps, s, use_pdl_);
    done("norm");
    // Gate and up as ONE GEMM over the concatenated (2F, C) weights, then the activation.
    // (Chapter 06 measured its fused tensor-core SwiGLU at half of cuBLASLt's speed at
    // prefill sizes and routes T >= 5 to cuBLASLt + elementwise itself: this is that,
    // in one GEMM instead of two and without its on-demand scratch buffers.)
    project(p_gate_up_.data(), p_h_.data(), L.w_gate_up, L.b_gate_up, rows, C_, 2 * F_, s);
    done("gate_up_gemm");
    swiglu_rows(p_act_.data(), p_gate_up_.data(), rows, F_, s, use_pdl_);
    done("swiglu");
    if (fused_mlp_) {  // W_down kept transposed, (F, C), for the fused decode MLP
      matmul_cublaslt_w_in_out(p_proj_.data(), p_act_.data(), L.w_down, L.b_down, rows, F_, C_, s);
    } else {
      project(p_proj_.data(), p_act_.data(), L.w_down, L.b_down, rows, F_, C_, s);
    }
    done("down_gemm");
  }
  kv_cache_advance_device_length(kv_.device_length(), T, s);  // kv_.commit_host follows on the host

  if (want_logits) {
    // The last residual add, fused with the final norm (every row the last layer
    // computed: it is cheap). The last token's row of h is then row h_last.
    const int final_rows = rows_only ? last_layer_rows : T;
    const size_t h_last = size_t(final_rows - 1);
    fused_residual_rmsnorm_forward(p_h_.data(), p_x_.data() + size_t(T - final_rows) * C_, p_proj_.data(),
                                   final_norm_, final_rows, C_, eps, s);
    if (!all_logits) {
      // Only the last token's logits: the decode path's fp32 lm_head GEMV on one row.
      DecodeGemvParams head{};
      head.y = d_logits_.data();
      head.x = p_h_.data() + h_last * C_;
      head.W = lm_head_;
      head.N = V_;
      head.K = C_;
      decode_gemv(GemvInput::kPlain, GemvOutput::kF32, head, false, s);
      done("final_norm_lm_head");
    }
  }
}

int CudaModel::o_blocks_for(int splits) const {
  if (!o_blocks_enabled_ || splits < 1) return 0;
  const int o_blocks = std::min(options_.experiments.attention_o_blocks, kAttentionOMaxClusterSize - splits);
  return o_blocks > 0 && decode_attention_o_blocks_runs(C_, H_, Hkv_, D_, splits, o_blocks) ? o_blocks : 0;
}

CudaModel::FirstBatchSplit CudaModel::gate_up_split(bool short_graph, bool long_graph) const {
  // Past the short graph gate/up has a split of its own (beside the larger attention
  // clusters it wins), where the split can run: not beside the second batch in shared
  // memory. Either split holds in the first blocks only, where asked.
  const int blocks = long_graph ? options_.gate_up_split_blocks_in_long_graph : options_.gate_up_split_blocks;
  if (!short_graph && options_.gate_up_loads_before_wait_past_short_graph > 0 &&
      !options_.experiments.gate_up_second_batch_in_shared) {
    return {options_.gate_up_loads_before_wait_past_short_graph, options_.gate_up_split_rest_past_short_graph, blocks};
  }
  FirstBatchSplit split = split_with_rest_option(options_.experiments.gate_up_loads_before_wait);
  if (split.loads_before_wait > 0) split.blocks = blocks;
  return split;
}

CudaModel::FirstBatchSplit CudaModel::split_with_rest_option(int loads_before_wait) const {
  return {loads_before_wait,
          loads_before_wait > 0 ? options_.experiments.split_batch_rest : SplitBatchRest::kAfterStaging};
}

void CudaModel::enqueue_decode_step(cudaStream_t s, bool pdl, const std::function<void(const char*)>* after,
                                    int attention_splits) {
  auto done = [&](const char* name) {
    if (after) (*after)(name);
  };
  // Every launch below (and so every node of a captured graph) asks for the same split.
  ScopedLaunchCarveout carveout(options_.experiments.decode_shared_carveout);
  // The long graph's attention may hold O back until its inputs have arrived.
  const bool long_graph = long_attention_splits_ > 0 && attention_splits == long_attention_splits_;
  const bool short_graph = short_attention_splits_ > 0 && attention_splits == short_attention_splits_;
  const bool attention_o_after_inputs = options_.experiments.attention_allows_o_after_inputs ||
                                        (long_graph && options_.attention_allows_o_after_inputs_in_long_graph);
  const float eps = config_.rms_norm_eps;
  const int context = kv_.max_context();
  int* d_length = kv_.device_length();
  // O and gate/up may hold their first weight loads until v6's blocks have their inputs:
  // only v6 with a pushed hand-over signals.
  const bool attention_signals =
      attention_path_ == DecodeAttentionPath::kClusterPerHead && !v6_fuses_o_ &&
      (options_.v6_handover != V6Handover::kPull || options_.experiments.hold_until_attention_end) &&
      (options_.experiments.o_holds_for_attention_inputs || options_.experiments.gate_up_hold_blocks > 0);
  auto attention_signal = [&](size_t layer) { return d_attention_signals_.data() + 2 * layer; };
  auto hold_for_attention = [&](size_t layer, int blocks) {
    return attention_signals && blocks > 0 ? HoldForSignal{attention_signal(layer) + 1, d_length, blocks}
                                           : HoldForSignal{};
  };

  // The side branch (options_.side_prefetch_*): layer l's L2 prefetch forks from the
  // kernel last enqueued on s; the branch rejoins after the argmax. Not in the probed
  // step, whose per-kernel times it would blur.
  const bool side_branch = side_stream_ != nullptr && after == nullptr;
  auto fork_side_prefetch = [&](const Layer& layer) {
    CUDA_CHECK(cudaEventRecord(side_fork_, s));
    CUDA_CHECK(cudaStreamWaitEvent(side_stream_, side_fork_, 0));
    l2_prefetch(side_prefetch_plan(layer), options_.experiments.side_prefetch_blocks, side_stream_);
  };

  // With argmax_writes_next_input the row is in d_x_ already (the previous step's argmax,
  // or embed_host_token); a probed step embeds it anyway, to time the kernel.
  const bool next_input_by_argmax = options_.argmax_writes_next_input;
  if (!next_input_by_argmax || after != nullptr) {
    embedding_forward(d_x_.data(), embed_, d_token_.data(), 1, C_, V_, nullptr, s);
    done("embedding");
  }

  // Every GEMV of the step: the evict-first hint as configured, and the epilogue's
  // residual / position loaded before the PDL wait. The position was committed by the
  // previous step. The residual that O reads was written by the previous layer's down
  // projection, which had finished before QKV passed its wait and let the attention
  // start; the one down reads was written by O, finished before gate/up passed its wait
  // and let down start (with the fused attention + O, down's residual is the previous
  // layer's, and the O partials it adds were written two kernels back). The attention
  // kernels and O let their successors start at once, but those read neither before
  // their own wait. (qkv_allows_attention_early breaks the first promise: see O below.)
  auto set_first_batch_split = [](DecodeGemvParams& p, FirstBatchSplit split) {
    p.loads_before_wait = split.loads_before_wait;
    p.split_rest = split.rest;
    p.split_blocks = split.blocks;
  };
  auto step_gemv_settings = [&](DecodeGemvParams& p) {
    p.stream_evict_first = options_.gemv_evict_first;
    p.widen_input = options_.gemv_widen_input;
    p.stage_input_bulk = options_.experiments.gemv_stage_input_bulk;
    p.epilogue_inputs_settled = true;
  };
  // options_.tensor_core_gemvs (in the long graph tensor_core_gemvs_in_long_graph): the
  // kernel of a GEMV (the tensor-core one takes plain and normalized inputs only, and rows
  // of up to decode_gemv_mma_max_k() values: a model with longer ones keeps that GEMV on
  // the register kernel, as cuda_backend_unsupported_reason promised it can run).
  const unsigned tensor_core_gemvs =
      long_graph ? options_.tensor_core_gemvs_in_long_graph : options_.tensor_core_gemvs;
  auto gemv_kernel = [&](TensorCoreGemv which, GemvInput input, DecodeGemvParams* p = nullptr) {
    if (p) p->mma_three_blocks_per_sm = (options_.mma_three_blocks_per_sm & which) != 0;
    // (kRmsNorm inputs only: the fused MLP's kRmsNormAddPartials keeps the old order.)
    if (p) p->norm_weight_first = (options_.norm_weight_first & which) != 0 && input == GemvInput::kRmsNorm;
    const bool normal_input = input == GemvInput::kPlain || input == GemvInput::kRmsNorm ||
                              (input == GemvInput::kRmsNormAddPartials && which == kTensorCoreQkv);
    const int K = which == kTensorCoreO ? H_ * D_ : which == kTensorCoreDown ? F_ : C_;  // QKV, gate/up, lm_head: C
    const bool tensor_cores = (tensor_core_gemvs & which) && normal_input && K <= decode_gemv_mma_max_k();
    return tensor_cores ? DecodeGemvKernel::kTensorCores : DecodeGemvKernel::kAuto;
  };
  // options_.experiments.l2_persist_mb: the window of a GEMV of `target` (none for the others). A
  // GEMV under a window loads without its own evict-first hint, so that the window's
  // properties are the ones its loads get.
  auto l2_window = [&](DecodeGemvParams& p, L2PersistTarget target, const Layer* layer) {
    const cudaAccessPolicyWindow window = l2_persist_window(target, layer);
    if (window.num_bytes > 0) p.stream_evict_first = false;
    return window;
  };
  // decode_timeline: GEMV k of layer l records into slot 4 l + k (the lm_head: 4 L);
  // then the attention of layer l (the v6 and v5 cluster paths only) into attention slot l.
  // fused_mlp_: layer l's MLP accumulator (C floats).
  auto mlp_accumulator = [&](size_t layer) { return d_mlp_accumulators_.data() + layer * C_; };
  // options_.experiments.attention_o_blocks: layer l's O projection accumulator (C floats).
  auto o_accumulator = [&](size_t layer) { return d_o_accumulators_.data() + layer * C_; };
  auto timeline_slot = [&](size_t slot) {
    return options_.experiments.decode_timeline ? d_timeline_.data() + kTimelineValues * slot : nullptr;
  };
  auto attention_timeline_slot = [&](size_t layer) {
    return options_.experiments.decode_timeline && options_.experiments.decode_timeline_attention
               ? d_timeline_.data() + kTimelineValues * (4 * layers_.size() + 1) + kAttentionTimelineValues * layer
               : nullptr;
  };

  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    if (side_branch && options_.experiments.side_prefetch_fork == 0) fork_side_prefetch(L);
    // Norm + QKV + bias + RoPE + cache append, one kernel: q lands in d_qkv_, k and v in
    // the cache at *d_length.
    DecodeGemvParams qkv{d_qkv_.data(), d_x_.data(), L.input_norm, L.w_qkv, L.b_qkv, QKV_ / 2, C_, eps};
    qkv.rope = RopeAppendTarget{kv_.k(int(l)), kv_.v(int(l)), d_length, rope_.cos.data(), rope_.sin.data(),
                                H_, Hkv_, D_, context, rope_.max_positions};
    qkv.max_blocks_per_sm = options_.small_gemv_blocks_per_sm;
    step_gemv_settings(qkv);
    // Layer 0's QKV may follow the previous step's argmax with PDL (argmax_writes_next_input),
    // and that argmax commits the length RoPE's position is read from: after the wait, then.
    qkv.epilogue_inputs_settled = !options_.experiments.qkv_rope_inputs_after_wait && !(l == 0 && next_input_by_argmax);
    // The attention reads only what earlier steps committed before its wait.
    qkv.allow_dependents_early = options_.experiments.qkv_allows_attention_early;
    qkv.timeline = timeline_slot(4 * l);
    qkv.start_delay_ns = options_.experiments.qkv_start_delay_ns;
    // After a fused MLP the residual stream is x + the MLP's accumulator, added here (and
    // by O below) with the down projection's rounding (decode_mlp_fused.cuh).
    const ResidualPartials mlp_partials =
        fused_mlp_ && l > 0 ? ResidualPartials{mlp_accumulator(l - 1), 1} : ResidualPartials{};
    qkv.residual_partials = mlp_partials;
    const unsigned skip = options_.experiments.decode_skip;
    // With the norm weight folded into W_qkv (ones left in its place) the tensor-core
    // kernel applies the inverse RMS after the dots; other kernels and inputs ignore this
    // and normalize with the ones.
    qkv.norm_in_epilogue = options_.fold_qkv_norm;
    const GemvInput qkv_input = mlp_partials.partials  ? GemvInput::kRmsNormAddPartials
                                : skip & kSkipQkvNorm ? GemvInput::kPlain  // (measurement: no norm)
                                                       : GemvInput::kRmsNorm;
    if (!(skip & kSkipQkv)) {
      ScopedLaunchAccessPolicy window(l2_window(qkv, L2PersistTarget::kQkv, &L));
      decode_gemv(qkv_input, GemvOutput::kRopeAppend, qkv, pdl, s, gemv_kernel(kTensorCoreQkv, qkv_input, &qkv));
      done("qkv_rope_append");
    }
    if (side_branch && options_.experiments.side_prefetch_fork == 1) fork_side_prefetch(L);
    DecodeGemvParams o{d_x_.data(), d_attn_.data(), nullptr, L.w_o, L.b_o, C_, H_ * D_, eps};
    o.max_blocks_per_sm = options_.small_gemv_blocks_per_sm;
    // gate/up reads only constants before its wait (weights, biases, the norm weight):
    // it may start while the attention runs, and stream its weights meanwhile.
    o.allow_dependents_early = options_.o_allows_gate_up_early;
    o.timeline = timeline_slot(4 * l + 1);
    o.input_from_global = options_.experiments.o_input_from_global;
    o.start_delay_ns = options_.experiments.o_start_delay_ns;
    o.residual_partials = mlp_partials;  // written three kernels back: settled before O's wait
    if (options_.experiments.o_loads_before_wait > 0) {
      set_first_batch_split(o, {options_.experiments.o_loads_before_wait, options_.experiments.o_split_rest});
    }
    step_gemv_settings(o);
    const cudaAccessPolicyWindow o_policy = l2_window(o, L2PersistTarget::kO, &L);
    auto launch_o = [&](GemvInput input) {
      ScopedLaunchAccessPolicy window(o_policy);
      decode_gemv(input, GemvOutput::kResidualAdd, o, pdl, s, gemv_kernel(kTensorCoreO, input, &o));
    };
    // When QKV lets the attention start early, the attention (which lets O start at
    // once) may run before the previous layer's down projection has finished writing the
    // residual: O must read it after its wait.
    if (options_.experiments.qkv_allows_attention_early) o.epilogue_inputs_settled = false;
    // kClusterWithO: one kernel for both, its O projection left as partial sums that
    // gate/up adds into its input and down adds into the residual stream.
    const bool fused_o = attention_path_ == DecodeAttentionPath::kClusterWithO &&
                         !(skip & (kSkipAttention | kSkipOProjection));
    // options_.experiments.attention_o_blocks: O blocks in v6's clusters instead of the O GEMV, where
    // this graph's clusters leave room for them; gate/up and down then add the layer's
    // accumulator (count 1) as they add kClusterWithO's partials.
    const int o_blocks = skip & (kSkipAttention | kSkipOProjection) ? 0 : o_blocks_for(attention_splits);
    const ResidualPartials o_accumulated =
        o_blocks > 0 ? ResidualPartials{o_accumulator(l), 1} : ResidualPartials{};
    // What either fused attention + O kernel reads (the two forms below).
    AttentionOInputs attention_o_inputs;
    attention_o_inputs.q = d_qkv_.data();
    attention_o_inputs.k_cache = kv_.k(int(l));
    attention_o_inputs.v_cache = kv_.v(int(l));
    attention_o_inputs.d_length = d_length;
    attention_o_inputs.new_tokens = 1;
    attention_o_inputs.max_context = context;
    attention_o_inputs.w_o = L.w_o;
    attention_o_inputs.b_o = L.b_o;
    attention_o_inputs.C = C_;
    attention_o_inputs.H = H_;
    attention_o_inputs.Hkv = Hkv_;
    attention_o_inputs.D = D_;
    if (fused_o) {
      AttentionOParams attention_o;
      static_cast<AttentionOInputs&>(attention_o) = attention_o_inputs;
      attention_o.partials = d_o_partials_.data();
      decode_attention_o(attention_o, attention_splits, pdl, s, options_.attention_o_replicas);
      done("attention_o");
    } else if (skip & kSkipAttention) {
      // Measurement only (decode_skip): the attention left out (O, unless it is left out
      // too, reads the attention output an earlier step stored).
      if (!(skip & kSkipOProjection)) launch_o(GemvInput::kPlain);
    } else if (options_.decode_attention == DecodeAttentionPath::kMergeInO) {
      // The split kernel alone; the O projection merges its partials while it stages its
      // input, and adds its output into the residual stream.
      decode_attention_v3_splits_device_length(attention_workspace_.get(), d_qkv_.data(), kv_.k(int(l)),
                                               kv_.v(int(l)), d_length, 1, context, H_, Hkv_, D_, attention_splits,
                                               attention_min_keys_, s);
      done("attention");
      o.x = nullptr;
      o.merge = AttentionMergeSource{attention_workspace_->partial_acc.data(),
                                     attention_workspace_->partial_ml.data(),
                                     d_length,
                                     1,
                                     context,
                                     attention_splits,
                                     attention_min_keys_,
                                     H_,
                                     D_};
      if (!(skip & kSkipOProjection)) launch_o(GemvInput::kAttentionMerge);
    } else {
      if (attention_path_ == DecodeAttentionPath::kSplitCombine) {
        decode_attention_v3_pipelined_device_length(d_attn_.data(), d_qkv_.data(), kv_.k(int(l)), kv_.v(int(l)),
                                                    d_length, 1, context, H_, Hkv_, D_, attention_splits,
                                                    attention_workspace_.get(), s);
      } else if (o_blocks > 0) {
        // v6's splits and the O blocks in one cluster a head: no O kernel below.
        const size_t previous = (l + layers_.size() - 1) % layers_.size();
        AttentionOBlocksParams attention_o;
        static_cast<AttentionOInputs&>(attention_o) = attention_o_inputs;
        attention_o.accumulator = o_accumulator(l);
        attention_o.reset = o_accumulator(previous);
        attention_o.reset_value = layers_[previous].b_o;
        attention_o.allow_dependents_after_inputs = attention_o_after_inputs;
        attention_o.stream_evict_first = options_.gemv_evict_first;
        decode_attention_o_blocks(attention_o, attention_splits, o_blocks, pdl, s);
      } else if (attention_path_ == DecodeAttentionPath::kClusterPerHead && v6_fuses_o_) {
        // v6 with the O projection and the residual add inside: no O kernel below.
        AttentionOPerHeadParams attention_o;
        static_cast<AttentionOInputs&>(attention_o) = attention_o_inputs;
        attention_o.x = d_x_.data();
        attention_o.partials = d_o_partials_.data();
        attention_o.arrivals = d_o_arrivals_.data();
        // The residual was last written by the previous layer's down projection, which
        // had finished before QKV let this kernel start (unless QKV lets it start early).
        attention_o.residual_settled = !options_.experiments.qkv_allows_attention_early;
        attention_o.allow_dependents_after_inputs = attention_o_after_inputs;
        attention_o.w_o_after_attention = options_.experiments.v6_fused_o_late_weights;
        attention_o.timeline = attention_timeline_slot(l);
        decode_attention_o_per_head(attention_o, attention_splits, pdl, s);
      } else if (attention_path_ == DecodeAttentionPath::kClusterPerHead) {
        decode_attention_v6_per_head_device_length_timed(d_attn_.data(), d_qkv_.data(), kv_.k(int(l)),
                                                         kv_.v(int(l)), d_length, 1, context, H_, Hkv_, D_,
                                                         attention_splits, attention_workspace_.get(), s,
                                                         attention_timeline_slot(l), options_.v6_handover,
                                                         attention_o_after_inputs,
                                                         attention_signals ? attention_signal(l) : nullptr,
                                                         options_.experiments.hold_until_attention_end);
      } else {
        decode_attention_v5_cluster_device_length_timed(d_attn_.data(), d_qkv_.data(), kv_.k(int(l)), kv_.v(int(l)),
                                                        d_length, 1, context, H_, Hkv_, D_, attention_splits,
                                                        attention_workspace_.get(), s, attention_timeline_slot(l));
      }
      done("attention");
      if (options_.experiments.o_holds_for_attention_inputs) o.hold = hold_for_attention(l, INT_MAX);
      // (decode_skip: the attention without the O projection after it.)
      if (!v6_fuses_o_ && o_blocks == 0 && !(skip & kSkipOProjection)) launch_o(GemvInput::kPlain);
    }
    if (!fused_o && !v6_fuses_o_ && o_blocks == 0) done("o_proj");
    if (fused_mlp_) {
      // The whole MLP in one kernel; its down projection lands in this layer's
      // accumulator, and it resets the previous layer's, whose readers (this layer's QKV
      // and O; for layer 0 the last step's lm_head) have finished before its wait returns.
      if (!(skip & (kSkipGateUp | kSkipDown))) {
        const size_t previous = (l + layers_.size() - 1) % layers_.size();
        FusedMlpParams mlp;
        mlp.x = d_x_.data();
        mlp.norm_weight = L.post_norm;
        mlp.w_gate_up = L.w_gate_up;
        mlp.b_gate_up = L.b_gate_up;
        mlp.w_down_t = L.w_down;
        mlp.accumulator = mlp_accumulator(l);
        mlp.reset = mlp_accumulator(previous);
        mlp.reset_value = layers_[previous].b_down;
        mlp.C = C_;
        mlp.F = F_;
        mlp.eps = eps;
        mlp.stream_evict_first = options_.gemv_evict_first;
        mlp.units_before_wait = options_.experiments.fused_mlp_values_before_wait;
        mlp.block_warps = options_.experiments.fused_mlp_block_warps;
        mlp.start_delay_ns = options_.experiments.fused_mlp_start_delay_ns;
        mlp.blocks = options_.experiments.fused_mlp_blocks;
        decode_mlp_fused(mlp, pdl, s);
      }
      done("mlp_fused");
      continue;
    }
    DecodeGemvParams gate_up{d_act_.data(), d_x_.data(), L.post_norm, L.w_gate_up, L.b_gate_up, F_, C_, eps};
    gate_up.max_blocks_per_sm = options_.large_gemv_blocks_per_sm;
    gate_up.second_batch_in_shared = options_.experiments.gate_up_second_batch_in_shared;
    gate_up.second_batch_after_staging = options_.experiments.second_batch_after_staging;
    gate_up.timeline = timeline_slot(4 * l + 2);
    gate_up.hold = hold_for_attention(l, options_.experiments.gate_up_hold_blocks);
    gate_up.hold.first_block = options_.experiments.gate_up_hold_first_block;
    gate_up.start_delay_ns = options_.gate_up_start_delay_ns;
    set_first_batch_split(gate_up, gate_up_split(short_graph, long_graph));
    step_gemv_settings(gate_up);
    if (fused_o) gate_up.residual_partials = ResidualPartials{d_o_partials_.data(), Hkv_};
    // (decode_skip's kSkipOAccumulatorInGateUp: measurement only, the values are wrong.)
    const bool gate_up_adds_o = o_blocks > 0 && !(skip & kSkipOAccumulatorInGateUp);
    if (gate_up_adds_o) gate_up.residual_partials = o_accumulated;
    // As QKV's above; on the register kernel each warp sums x's squares itself.
    gate_up.norm_in_epilogue = options_.fold_gate_up_norm;
    const GemvInput gate_up_input =
        fused_o || gate_up_adds_o ? GemvInput::kRmsNormAddPartials : GemvInput::kRmsNorm;
    if (!(skip & kSkipGateUp)) {
      ScopedLaunchAccessPolicy window(l2_window(gate_up, L2PersistTarget::kGateUp, &L));
      decode_gemv(gate_up_input, GemvOutput::kSwiGLU, gate_up, pdl, s, gemv_kernel(kTensorCoreGateUp, gate_up_input, &gate_up));
    }
    done("gate_up_swiglu");
    DecodeGemvParams down{d_x_.data(), d_act_.data(), nullptr, L.w_down, L.b_down, C_, F_, eps};
    down.max_blocks_per_sm = options_.large_gemv_blocks_per_sm;
    down.second_batch_in_shared = options_.experiments.down_second_batch_in_shared;
    down.second_batch_after_staging = options_.experiments.second_batch_after_staging;
    down.input_from_global = options_.experiments.down_input_from_global;
    down.timeline = timeline_slot(4 * l + 3);
    down.start_delay_ns = options_.down_start_delay_ns;
    set_first_batch_split(down, split_with_rest_option(options_.experiments.down_loads_before_wait));
    step_gemv_settings(down);
    // Its row of h = the residual + the O projection: the partials were written two
    // kernels back, so they are settled before down's wait, as the residual is.
    if (fused_o) down.residual_partials = ResidualPartials{d_o_partials_.data(), Hkv_};
    if (o_blocks > 0) down.residual_partials = o_accumulated;
    if (!(skip & kSkipDown)) {
      ScopedLaunchAccessPolicy window(l2_window(down, L2PersistTarget::kDown, &L));
      // The tensor-core kernel does not add residual partials: down stays on the
      // register kernel beside the fused attention + O.
      const DecodeGemvKernel down_kernel = fused_o ? DecodeGemvKernel::kAuto
                                                   : gemv_kernel(kTensorCoreDown, GemvInput::kPlain);
      decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, down, pdl, s, down_kernel);
    }
    done("down");
  }
  DecodeGemvParams head{d_logits_.data(), d_x_.data(), final_norm_, lm_head_, nullptr, V_, C_, eps};
  head.max_blocks_per_sm = options_.large_gemv_blocks_per_sm;
  head.timeline = timeline_slot(4 * layers_.size());
  head.start_delay_ns = options_.experiments.lm_head_start_delay_ns;
  set_first_batch_split(head, split_with_rest_option(options_.experiments.lm_head_loads_before_wait));
  step_gemv_settings(head);
  if (fused_mlp_) head.residual_partials = ResidualPartials{mlp_accumulator(layers_.size() - 1), 1};
  const GemvInput head_input = fused_mlp_ ? GemvInput::kRmsNormAddPartials : GemvInput::kRmsNorm;
  // The argmax overwrites the input token (the next step's input when generating) and
  // commits the step on the GPU: the device KV length += 1. Folded into the lm_head's last
  // block (options_.argmax_in_lm_head) where the lm_head runs on the register kernel, else
  // in a kernel of its own after it.
  const NextInputRow next_input = next_input_by_argmax ? NextInputRow{embed_, d_x_.data(), C_} : NextInputRow{};
  const DecodeGemvKernel head_kernel = gemv_kernel(kTensorCoreLmHead, head_input, &head);
  const bool argmax_folded = options_.argmax_in_lm_head && head_kernel != DecodeGemvKernel::kTensorCores;
  if (argmax_folded) {
    head.argmax.token = d_token_.data();
    head.argmax.d_length = d_length;
    head.argmax.history = d_history_.data();
    head.argmax.history_size = context;
    head.argmax.next = next_input;
    head.argmax.block_best = d_argmax_block_best_.data();
    head.argmax.blocks_done = d_argmax_blocks_done_.data();
    head.argmax.capacity = V_;
  }
  {
    ScopedLaunchAccessPolicy window(l2_window(head, L2PersistTarget::kLmHead, nullptr));
    decode_gemv(head_input, GemvOutput::kF32, head, pdl, s, head_kernel);
  }
  done("lm_head");
  if (!argmax_folded) {
    decode_argmax(d_token_.data(), d_logits_.data(), V_, d_length, pdl, s, d_history_.data(), context, next_input);
    done("argmax");
  }
  if (side_branch) {
    CUDA_CHECK(cudaEventRecord(side_join_, side_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(s, side_join_, 0));
  }
}

L2PrefetchPlan CudaModel::side_prefetch_plan(const Layer& layer) const {
  // Whole rows from the end of each matrix: the rows the GEMVs' last blocks read.
  auto tail_rows = [](double mb, int rows, int row_values) {
    const double row_bytes = double(row_values) * sizeof(__nv_bfloat16);
    // Clamped as a double: a size of "everything" (1e6 MB) would overflow an int.
    return int(std::min(double(rows), std::floor(mb * 1e6 / row_bytes)));
  };
  L2PrefetchPlan plan;
  plan.form = options_.experiments.side_prefetch_form;
  plan.stride_bytes = options_.experiments.side_prefetch_stride_bytes;
  auto add = [&](const __nv_bfloat16* begin, int rows, int row_values) {
    if (rows > 0) plan.range[plan.count++] = {begin, size_t(rows) * row_values * sizeof(__nv_bfloat16)};
  };
  const int gate_up_rows = tail_rows(options_.experiments.side_prefetch_gate_up_mb / 2, F_, C_);  // each half
  add(layer.w_gate_up + size_t(F_ - gate_up_rows) * C_, gate_up_rows, C_);
  add(layer.w_gate_up + size_t(2 * F_ - gate_up_rows) * C_, gate_up_rows, C_);
  const int down_rows = tail_rows(options_.experiments.side_prefetch_down_mb, C_, F_);
  add(layer.w_down + size_t(C_ - down_rows) * F_, down_rows, F_);
  return plan;
}

void CudaModel::embed_host_token() {
  if (!options_.argmax_writes_next_input) return;
  embedding_forward(d_x_.data(), embed_, d_token_.data(), 1, C_, V_, nullptr, stream_);
}

void CudaModel::run_decode_step(int kv_len) {
  if (options_.experiments.persistent_decode && options_.experiments.persistent_weight_stream) {
    decode_step_streamed(persistent_step_, streamed_layout_, stream_);
  } else if (options_.experiments.persistent_decode) {
    decode_step_persistent(persistent_step_, options_.experiments.persistent_blocks_per_sm, stream_);
  } else if (graph_exec_) {
    // The short and long graphs exist whenever their splits are set (capture_graphs).
    CUDA_CHECK(cudaGraphLaunch(graph_exec_at(kv_len), stream_));
  } else {
    enqueue_decode_step(stream_, use_pdl_, nullptr, attention_splits_at(kv_len));
  }
}

std::vector<float> CudaModel::decode(int32_t token) {
  check_token(token);
  check_fits(1, "decode step");
  h_tokens_.get()[0] = token;
  CUDA_CHECK(cudaMemcpyAsync(d_token_.data(), h_tokens_.get(), sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  embed_host_token();
  run_decode_step(position() + 1);
  CUDA_CHECK(cudaMemcpyAsync(h_logits_.get(), d_logits_.data(), size_t(V_) * sizeof(float), cudaMemcpyDeviceToHost,
                             stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  kv_.commit_host(1);
  return std::vector<float>(h_logits_.get(), h_logits_.get() + V_);
}

int32_t CudaModel::decode_sample(int32_t token, Sampler& sampler) {
  if (!gpu_sampler_supports(sampler.options(), V_)) return Backend::decode_sample(token, sampler);
  check_token(token);
  check_fits(1, "decode step");
  // The draw is made here, before the step, as Sampler::sample makes it before it reads
  // the logits: the same seed gives the same draws on both paths.
  SampleExchange* exchange = h_sample_.get();
  exchange->uniform = sampler.greedy() ? 0.0 : sampler.draw_uniform();
  h_tokens_.get()[0] = token;
  CUDA_CHECK(cudaMemcpyAsync(d_token_.data(), h_tokens_.get(), sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(d_sample_uniform_.data(), &exchange->uniform, sizeof(double), cudaMemcpyHostToDevice,
                             stream_));
  embed_host_token();
  run_decode_step(position() + 1);
  gpu_sample(d_sample_result_.data(), d_logits_.data(), V_, sampler.options(), d_sample_uniform_.data(), stream_);
  CUDA_CHECK(cudaMemcpyAsync(&exchange->result, d_sample_result_.data(), sizeof(SampleResult), cudaMemcpyDeviceToHost,
                             stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  kv_.commit_host(1);  // the step ran, as decode() + a throwing sample() would have it
  if (sample_needs_host(exchange->result)) {
    // Top-p over a nucleus of more than kGpuSamplerMaxTopK tokens (a flat distribution):
    // the logits are still on the device; the host draws from them with the same u.
    CUDA_CHECK(cudaMemcpyAsync(h_logits_.get(), d_logits_.data(), size_t(V_) * sizeof(float), cudaMemcpyDeviceToHost,
                               stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return sampler.sample_with_uniform(h_logits_.get(), V_, exchange->uniform);
  }
  return checked_token(exchange->result);
}

int32_t CudaModel::decode_greedy(int32_t token) {
  std::vector<int32_t> next = generate_greedy(token, 1);
  return next[0];
}

std::vector<int32_t> CudaModel::generate_greedy(int32_t token, int count) {
  check_token(token);
  if (count < 0) throw std::invalid_argument("generate_greedy: count must be >= 0");
  check_fits(size_t(count), "generation");
  if (count == 0) return {};
  int32_t* host = h_tokens_.get();
  host[0] = token;
  CUDA_CHECK(cudaMemcpyAsync(d_token_.data(), host, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  embed_host_token();
  // Every step's input is the previous step's argmax, already on the GPU, and the argmax
  // also keeps it in d_history_ at its position: the steps are queued back to back, and
  // one copy brings the whole generation back at the end. The persistent steps do not
  // keep the history: their tokens come back one 4-byte copy after each step (stream
  // order: copy i happens before step i+1 overwrites d_token_), as every step's did
  // before the history (generate_copy_each_token measures that).
  const bool copy_each = options_.experiments.persistent_decode || options_.experiments.generate_copy_each_token;
  const int start = position();
  const int steps = options_.decode_graph_steps;
  for (int i = 0; i < count;) {
    const int kv_len = start + i + 1;
    const int kind = graph_kind_at(kv_len);
    if (!copy_each && steps > 1 && count - i >= steps && multi_step_exec_[kind] &&
        graph_kind_at(kv_len + steps - 1) == kind) {  // the kinds are intervals of kv_len
      CUDA_CHECK(cudaGraphLaunch(multi_step_exec_[kind], stream_));
      i += steps;
      continue;
    }
    run_decode_step(kv_len);
    if (copy_each) {
      CUDA_CHECK(cudaMemcpyAsync(host + i, d_token_.data(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    }
    ++i;
  }
  if (!copy_each) {
    CUDA_CHECK(cudaMemcpyAsync(host, d_history_.data() + start, size_t(count) * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  kv_.commit_host(count);
  std::vector<int32_t> tokens(host, host + count);
  for (int32_t t : tokens) {
    if (t < 0) throw std::runtime_error("decode produced NaN logits (argmax undefined)");
  }
  return tokens;
}

std::vector<unsigned long long> CudaModel::decode_timeline(int32_t token) {
  if (!options_.experiments.decode_timeline) return {};
  // Min slots start at the largest value, max slots at 0 (DecodeGemvParams::timeline).
  std::vector<unsigned long long> reset(d_timeline_.size());
  for (size_t i = 0; i < reset.size(); ++i) reset[i] = i % 2 == 0 ? ~0ull : 0ull;
  CUDA_CHECK(cudaMemcpyAsync(d_timeline_.data(), reset.data(), d_timeline_.bytes(), cudaMemcpyHostToDevice, stream_));
  decode_greedy(token);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return d_timeline_.to_host();
}

std::vector<unsigned long long> CudaModel::persistent_phase_clock() {
  if (!persistent_step_.phase_clock) return {};
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return d_phase_clock_.to_host();
}

void CudaModel::decode_probed(int32_t token, const std::function<void(const char*)>& after_kernel) {
  check_token(token);
  check_fits(1, "decode step");
  h_tokens_.get()[0] = token;
  CUDA_CHECK(cudaMemcpyAsync(d_token_.data(), h_tokens_.get(), sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  enqueue_decode_step(stream_, false, &after_kernel, attention_splits_at(position() + 1));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  kv_.commit_host(1);
}

std::unique_ptr<Backend> make_cuda_backend(const std::string& model_dir, int max_context) {
  CudaModelOptions options;
  options.max_context = max_context;
  return std::make_unique<CudaModel>(model_dir, options);
}

}  // namespace bielik
