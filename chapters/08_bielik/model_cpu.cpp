#include "model_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "cpu_ops.hpp"
#include "model_weights.hpp"
#include "safetensors.hpp"

namespace bielik {
namespace {

// TensorView::data may be unaligned (the safetensors header has any length), so the
// weights are copied, never reinterpret_cast; the copy is also what lets the
// checkpoint's mapping go away after loading. Hosts are little endian, like the file.
std::vector<uint16_t> copy_bf16(const TensorView* view) {
  std::vector<uint16_t> bits(view->numel());
  std::memcpy(bits.data(), view->data, bits.size() * sizeof(uint16_t));
  return bits;
}

// Norm weights and biases are small: widen them to fp32 once. nullptr -> empty.
std::vector<float> widen_bf16(const TensorView* view) {
  if (view == nullptr) return {};
  std::vector<float> values(view->numel());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t wide = uint32_t(uint16_t(view->data[2 * i] | (view->data[2 * i + 1] << 8))) << 16;
    std::memcpy(&values[i], &wide, sizeof(float));
  }
  return values;
}

const float* or_null(const std::vector<float>& bias) { return bias.empty() ? nullptr : bias.data(); }

int default_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

ModelConfig load_config_of(const std::string& model_dir) {
  if (!std::filesystem::is_directory(model_dir)) {
    throw std::runtime_error("model directory '" + model_dir + "' does not exist");
  }
  return load_model_config(model_dir + "/config.json");
}

}  // namespace

CpuModel::CpuModel(const std::string& model_dir, const CpuModelOptions& options)
    : config_(load_config_of(model_dir)),
      context_(context_length_of(config_, options.max_context)),
      pool_(options.threads > 0 ? options.threads : default_threads()) {
  const Checkpoint checkpoint = Checkpoint::open_dir(model_dir);
  const ModelWeights w = map_model_weights(checkpoint, config_);
  const int64_t C = config_.hidden_size, F = config_.intermediate_size, D = config_.head_dim;
  const int64_t HD = int64_t(config_.num_attention_heads) * D;
  const int64_t kv_row = int64_t(config_.num_key_value_heads) * D;

  embed_ = copy_bf16(w.embed);
  for (const LayerWeights& lw : w.layers) {
    Layer l;
    l.input_norm = widen_bf16(lw.input_norm);
    l.wq = copy_bf16(lw.wq), l.bq = widen_bf16(lw.bq);
    l.wk = copy_bf16(lw.wk), l.bk = widen_bf16(lw.bk);
    l.wv = copy_bf16(lw.wv), l.bv = widen_bf16(lw.bv);
    l.wo = copy_bf16(lw.wo), l.bo = widen_bf16(lw.bo);
    l.post_norm = widen_bf16(lw.post_norm);
    l.w_gate = copy_bf16(lw.w_gate), l.b_gate = widen_bf16(lw.b_gate);
    l.w_up = copy_bf16(lw.w_up), l.b_up = widen_bf16(lw.b_up);
    l.w_down = copy_bf16(lw.w_down), l.b_down = widen_bf16(lw.b_down);
    // Not zero-filled: only positions < position_ are ever read, and untouched pages of
    // a long context cost no memory until a conversation reaches them.
    l.k_cache.reset(new float[size_t(context_) * kv_row]);
    l.v_cache.reset(new float[size_t(context_) * kv_row]);
    layers_.push_back(std::move(l));
  }
  final_norm_ = widen_bf16(w.final_norm);
  if (!config_.tie_word_embeddings) lm_head_ = copy_bf16(w.lm_head);

  // RoPE angles in double: position * theta^(-2i/D) reaches thousands of radians, where
  // fp32 would lose the low digits of the angle before cos/sin ever see it.
  const int64_t half = D / 2;
  rope_.resize(size_t(context_) * half * 2);
  for (int64_t p = 0; p < context_; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * std::pow(double(config_.rope_theta), -2.0 * double(i) / double(D));
      rope_[(p * half + i) * 2] = float(std::cos(angle));
      rope_[(p * half + i) * 2 + 1] = float(std::sin(angle));
    }
  }

  const size_t T = kPrefillChunk;
  x_.resize(T * C), h_.resize(T * C), proj_.resize(T * C);
  q_.resize(T * HD), attn_.resize(T * HD);
  gate_.resize(T * F), up_.resize(T * F);
}

std::string CpuModel::name() const {
  const int threads = pool_.threads();
  return "cpu (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
}

void CpuModel::check_fits(size_t count) const {
  if (position_ + count > size_t(context_)) {
    std::string message = "prompt of " + std::to_string(count) + " tokens exceeds the context of " +
                          std::to_string(context_) + " tokens";
    if (position_ > 0) {
      message += " (" + std::to_string(position_) + " already used, " + std::to_string(context_ - position_) +
                 " left)";
    }
    throw std::length_error(message);
  }
}

std::vector<float> CpuModel::prefill(const std::vector<int32_t>& tokens, Logits which) {
  if (tokens.empty()) throw std::invalid_argument("prefill needs at least one token");
  check_fits(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      throw std::out_of_range("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
    }
  }
  const bool all = which == Logits::kAll;
  const size_t V = size_t(config_.vocab_size);
  std::vector<float> logits(all ? tokens.size() * V : V);
  for (size_t start = 0; start < tokens.size(); start += kPrefillChunk) {
    const int T = int(std::min<size_t>(kPrefillChunk, tokens.size() - start));
    forward_chunk(tokens.data() + start, T, all, all ? logits.data() + start * V : logits.data());
  }
  return logits;
}

std::vector<float> CpuModel::decode(int32_t token) { return prefill({token}, Logits::kLast); }

void CpuModel::forward_chunk(const int32_t* tokens, int T, bool all_logits, float* logits) {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, F = c.intermediate_size, D = c.head_dim, V = c.vocab_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t P = position_;
  const float eps = c.rms_norm_eps;

  // x = embed_tokens[tokens]  (T, C)
  for (int t = 0; t < T; ++t) {
    const uint16_t* row = embed_.data() + int64_t(tokens[t]) * C;
    for (int64_t i = 0; i < C; ++i) {
      uint32_t wide = uint32_t(row[i]) << 16;
      std::memcpy(&x_[t * C + i], &wide, sizeof(float));
    }
  }

  for (Layer& l : layers_) {
    // Attention block. K and V go straight into the cache rows P..P+T-1.
    float* k_new = l.k_cache.get() + P * Hkv * D;  // (T, Hkv, D)
    float* v_new = l.v_cache.get() + P * Hkv * D;  // (T, Hkv, D)
    rmsnorm_rows_cpu(h_.data(), x_.data(), l.input_norm.data(), T, C, eps);
    matmul_bf16_cpu(pool_, q_.data(), h_.data(), l.wq.data(), or_null(l.bq), T, H * D, C);
    matmul_bf16_cpu(pool_, k_new, h_.data(), l.wk.data(), or_null(l.bk), T, Hkv * D, C);
    matmul_bf16_cpu(pool_, v_new, h_.data(), l.wv.data(), or_null(l.bv), T, Hkv * D, C);
    rope_rotate_half_cpu(q_.data(), rope_.data(), T, H, D, P);
    rope_rotate_half_cpu(k_new, rope_.data(), T, Hkv, D, P);
    attention_cpu(pool_, attn_.data(), q_.data(), l.k_cache.get(), l.v_cache.get(), T, P, H, Hkv, D);
    matmul_bf16_cpu(pool_, proj_.data(), attn_.data(), l.wo.data(), or_null(l.bo), T, C, H * D);
    for (int64_t i = 0; i < T * C; ++i) x_[i] += proj_[i];

    // MLP block: SwiGLU with (optional) biases on all three projections.
    rmsnorm_rows_cpu(h_.data(), x_.data(), l.post_norm.data(), T, C, eps);
    matmul_bf16_cpu(pool_, gate_.data(), h_.data(), l.w_gate.data(), or_null(l.b_gate), T, F, C);
    matmul_bf16_cpu(pool_, up_.data(), h_.data(), l.w_up.data(), or_null(l.b_up), T, F, C);
    swiglu_cpu(gate_.data(), up_.data(), T * F);
    matmul_bf16_cpu(pool_, proj_.data(), gate_.data(), l.w_down.data(), or_null(l.b_down), T, C, F);
    for (int64_t i = 0; i < T * C; ++i) x_[i] += proj_[i];
  }
  position_ += T;

  // Only the rows whose logits are wanted go through the final norm and the head.
  const int first = all_logits ? 0 : T - 1;
  const int rows = T - first;
  rmsnorm_rows_cpu(h_.data(), x_.data() + first * C, final_norm_.data(), rows, C, eps);
  const uint16_t* head = config_.tie_word_embeddings ? embed_.data() : lm_head_.data();
  matmul_bf16_cpu(pool_, logits, h_.data(), head, nullptr, rows, V, C);
}

}  // namespace bielik
