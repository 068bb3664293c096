// The references: read them first. The append is a copy into the head-major layout;
// decode attention is softmax(q K^T / sqrt(D)) V for one query row, written the plain
// way (find the max, exponentiate, sum, divide) with no online-softmax tricks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_attention.cuh"
#include "kv_cache.cuh"

namespace bielik {

void kv_cache_check_room(int length, int T_new, int max_context) {
  if (T_new < 0) throw std::invalid_argument("KV cache: negative token count " + std::to_string(T_new));
  if (long(length) + T_new > max_context) {
    throw std::length_error("KV cache full: " + std::to_string(length) + " + " + std::to_string(T_new) +
                            " tokens exceed max_context " + std::to_string(max_context));
  }
}

void kv_cache_append_cpu(float* k_cache, float* v_cache, const float* k_new, const float* v_new, int length,
                         int T_new, int Hkv, int D, int max_context) {
  kv_cache_check_room(length, T_new, max_context);
  for (int t = 0; t < T_new; ++t) {
    for (int g = 0; g < Hkv; ++g) {
      size_t source = (size_t(t) * Hkv + g) * D;                     // (T_new, Hkv, D)
      size_t destination = (size_t(g) * max_context + length + t) * D;  // (Hkv, max_context, D)
      for (int d = 0; d < D; ++d) {
        k_cache[destination + d] = k_new[source + d];
        v_cache[destination + d] = v_new[source + d];
      }
    }
  }
}

void decode_attention_cpu(float* out, const float* q, const float* k_cache, const float* v_cache, int kv_len,
                          int max_context, int H, int Hkv, int D) {
  if (kv_len < 1 || kv_len > max_context || Hkv <= 0 || H % Hkv != 0) {
    throw std::invalid_argument("decode_attention_cpu: need 1 <= kv_len <= max_context and H % Hkv == 0 (kv_len=" +
                                std::to_string(kv_len) + " max_context=" + std::to_string(max_context) +
                                " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) + ")");
  }
  const int G = H / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> scores(kv_len);
  for (int h = 0; h < H; ++h) {
    const float* q_row = q + size_t(h) * D;
    const float* keys = k_cache + size_t(h / G) * max_context * D;
    const float* values = v_cache + size_t(h / G) * max_context * D;
    float max_score = -INFINITY;
    for (int j = 0; j < kv_len; ++j) {
      float dot = 0;
      for (int d = 0; d < D; ++d) dot += q_row[d] * keys[size_t(j) * D + d];
      scores[j] = dot * scale;
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0;
    for (int j = 0; j < kv_len; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    float* out_row = out + size_t(h) * D;
    for (int d = 0; d < D; ++d) out_row[d] = 0;
    for (int j = 0; j < kv_len; ++j) {
      for (int d = 0; d < D; ++d) out_row[d] += scores[j] * values[size_t(j) * D + d];
    }
    for (int d = 0; d < D; ++d) out_row[d] /= sum;
  }
}

void decode_attention_check_shape(const void* q, const void* k_cache, const void* v_cache, int max_context, int H,
                                  int Hkv, int D) {
  auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  std::string problem;
  if (D != 64 && D != 128) problem = "D must be 64 or 128";
  else if (Hkv <= 0 || H <= 0 || H % Hkv != 0) problem = "H must be a positive multiple of Hkv";
  else if (H / Hkv > 8) problem = "at most 8 query heads per kv head";
  else if (max_context < 1) problem = "max_context must be positive";
  else if (misaligned(q) || misaligned(k_cache) || misaligned(v_cache)) problem = "q, k_cache, v_cache must be 16-byte aligned";
  if (!problem.empty()) {
    throw std::invalid_argument("decode attention: " + problem + " (H=" + std::to_string(H) + " Hkv=" +
                                std::to_string(Hkv) + " D=" + std::to_string(D) + " max_context=" +
                                std::to_string(max_context) + ")");
  }
}

void decode_attention_check_length(int kv_len, int max_context) {
  if (kv_len < 1 || kv_len > max_context) {
    throw std::invalid_argument("decode attention: kv_len " + std::to_string(kv_len) + " outside [1, " +
                                std::to_string(max_context) + "]");
  }
}

}  // namespace bielik
