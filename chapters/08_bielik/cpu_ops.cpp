#include "cpu_ops.hpp"

#include "bf16.hpp"
#include "cpu_dot.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace bielik {
void matmul_bf16_cpu(ThreadPool& pool, float* out, const float* x, const uint16_t* w, const float* bias, int64_t T,
                     int64_t N, int64_t K) {
  if (T == 1) {
    pool.parallel_for(N, [&](int64_t row_begin, int64_t row_end) {
      for (int64_t n = row_begin; n < row_end; ++n) out[n] = dot_bf16(x, w + n * K, K) + (bias ? bias[n] : 0.0f);
    });
    return;
  }
  // Many tokens: widen each weight row once, then reuse it for all T tokens, so the
  // weights stream from memory once per chunk instead of once per token.
  auto one_row = [&](int64_t n, float* row) {  // row: K floats of scratch
    for (int64_t k = 0; k < K; ++k) row[k] = bf16_bits_to_float(w[n * K + k]);
    const float b = bias ? bias[n] : 0.0f;
    for (int64_t t = 0; t < T; ++t) out[t * N + n] = dot_f32(x + t * K, row, K) + b;
  };
  if (!cpu_simd_enabled()) {
    pool.parallel_for(N, [&](int64_t row_begin, int64_t row_end) {
      thread_local std::vector<float> row;
      row.resize(size_t(K));
      for (int64_t n = row_begin; n < row_end; ++n) one_row(n, row.data());
    });
    return;
  }
  // AVX2: rows in pairs (2p, 2p + 1) against four tokens at a time (cpu_dot.hpp's 2 x 4
  // block), so the dots stop waiting on loads. The threads split the pairs, not the rows:
  // which rows share a block then depends on N alone, and the results (the block sums
  // in another order than a single dot) do not depend on the thread count.
  pool.parallel_for((N + 1) / 2, [&](int64_t pair_begin, int64_t pair_end) {
    thread_local std::vector<float> rows;
    rows.resize(size_t(2 * K));
    for (int64_t pair = pair_begin; pair < pair_end; ++pair) {
      const int64_t n = 2 * pair;
      if (n + 1 == N) {  // an odd N's last row
        one_row(n, rows.data());
        continue;
      }
      for (int64_t k = 0; k < 2 * K; ++k) rows[k] = bf16_bits_to_float(w[n * K + k]);  // rows n and n + 1
      int64_t t = 0;
      for (; t + 4 <= T; t += 4) dot_2x4_f32_avx2(x + t * K, rows.data(), K, out + t * N + n, N);
      for (; t < T; ++t) {
        out[t * N + n] = dot_f32(x + t * K, rows.data(), K);
        out[t * N + n + 1] = dot_f32(x + t * K, rows.data() + K, K);
      }
      if (bias) {
        for (t = 0; t < T; ++t) {
          out[t * N + n] += bias[n];
          out[t * N + n + 1] += bias[n + 1];
        }
      }
    }
  });
}

void rmsnorm_rows_cpu(float* out, const float* x, const float* weight, int64_t T, int64_t C, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* row = x + t * C;
    double squares = 0;  // C values of O(1..100): a double sum costs nothing here
    for (int64_t c = 0; c < C; ++c) squares += double(row[c]) * row[c];
    const float scale = float(1.0 / std::sqrt(squares / double(C) + double(eps)));
    for (int64_t c = 0; c < C; ++c) out[t * C + c] = row[c] * scale * weight[c];
  }
}

void rope_rotate_half_cpu(float* x, const float* cos_sin, int64_t T, int64_t heads, int64_t D, int64_t P) {
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t) {
    const float* angle = cos_sin + (P + t) * half * 2;  // (D/2, 2) for this position
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float c = angle[2 * i], s = angle[2 * i + 1];
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void attention_cpu(ThreadPool& pool, float* out, const float* q, const float* k_cache, const float* v_cache, int64_t T,
                   int64_t P, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t group = H / Hkv;  // query heads per kv head
  const float scale = float(1.0 / std::sqrt(double(D)));
  // One work item per (token, query head); each writes its own D outputs.
  pool.parallel_for(T * H, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / H, h = item % H, kv = h / group;
      const int64_t keys = P + t + 1;  // causal: positions 0..P+t
      const float* q_row = q + (t * H + h) * D;
      scores.resize(size_t(keys));
      float max_score = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        scores[j] = dot_f32(q_row, k_cache + (j * Hkv + kv) * D, D) * scale;
        max_score = std::max(max_score, scores[j]);
      }
      float total = 0;
      for (int64_t j = 0; j < keys; ++j) {
        scores[j] = std::exp(scores[j] - max_score);  // softmax, shifted by the max so exp never overflows
        total += scores[j];
      }
      float* o = out + (t * H + h) * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j < keys; ++j) {
        const float p = scores[j] / total;
        const float* v_row = v_cache + (j * Hkv + kv) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += p * v_row[d];
      }
    }
  });
}

void swiglu_cpu(float* gate, const float* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];  // silu(g) = g * sigmoid(g)
  }
}

}  // namespace bielik
