// The reference: read it first. For every query row and head: scores against the
// visible keys, subtract the row max (so exp never overflows), exponentiate, normalize,
// and take the weighted sum of the value rows. fp32, the same order of operations as
// the formula, no tiling and no online softmax: the GPU versions are checked against it.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.cuh"

namespace bielik {

void attention_cpu(float* out, const float* q, const float* k, const float* v, int Tq, int Tkv, int H, int Hkv,
                   int D) {
  if (Tq > Tkv) throw std::invalid_argument("attention_cpu: Tq > Tkv");
  if (Hkv <= 0 || H % Hkv != 0) throw std::invalid_argument("attention_cpu: H must be a multiple of Hkv");
  const int group = H / Hkv;
  const int offset = Tkv - Tq;  // query i sits at position offset + i
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> p(Tkv);
  for (int i = 0; i < Tq; ++i) {
    const int visible = offset + i + 1;  // keys 0 .. offset + i
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      const float* q_row = q + (size_t(i) * H + h) * D;
      float max_score = -INFINITY;
      for (int j = 0; j < visible; ++j) {
        const float* k_row = k + (size_t(j) * Hkv + g) * D;
        float dot = 0;
        for (int d = 0; d < D; ++d) dot += q_row[d] * k_row[d];
        p[j] = dot * scale;
        max_score = std::fmax(max_score, p[j]);
      }
      float sum = 0;
      for (int j = 0; j < visible; ++j) {
        p[j] = std::exp(p[j] - max_score);
        sum += p[j];
      }
      float* out_row = out + (size_t(i) * H + h) * D;
      for (int d = 0; d < D; ++d) out_row[d] = 0;
      for (int j = 0; j < visible; ++j) {
        const float* v_row = v + (size_t(j) * Hkv + g) * D;
        const float weight = p[j] / sum;
        for (int d = 0; d < D; ++d) out_row[d] += weight * v_row[d];
      }
    }
  }
}

// The shape rules shared by every GPU launcher (here so they live in one place).
void attention_check_shapes(const char* who, int Tq, int Tkv, int H, int Hkv, int D) {
  std::string name(who);
  if (Tq < 0 || Tq > Tkv) {
    throw std::invalid_argument(name + ": need 0 <= Tq <= Tkv, got Tq=" + std::to_string(Tq) +
                                " Tkv=" + std::to_string(Tkv));
  }
  if (H <= 0 || Hkv <= 0 || H % Hkv != 0) {
    throw std::invalid_argument(name + ": H must be a positive multiple of Hkv, got H=" + std::to_string(H) +
                                " Hkv=" + std::to_string(Hkv));
  }
  if (D != 64 && D != 128) throw std::invalid_argument(name + ": D must be 64 or 128, got " + std::to_string(D));
}

}  // namespace bielik
