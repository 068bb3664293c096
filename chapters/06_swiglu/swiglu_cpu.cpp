// The references: read them first. The gate/up half is two of chapter 03's linear
// layers (matmul_cpu) and one elementwise product; the MLP adds the down projection on
// h rounded to bf16, because that is what the GPU path stores. fp32 throughout, like
// the GPU versions; the golden files hold float64 answers, so these loops are
// themselves checked against them.
#include <cmath>
#include <vector>

#include "bf16.hpp"
#include "swiglu.cuh"

namespace bielik {

void swiglu_activation_cpu(float* h, const float* g, const float* u, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    // z / (1 + exp(-z)): for z < -88 exp overflows to inf and the quotient is -0, the
    // right limit; never NaN.
    h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void swiglu_gate_up_cpu(float* h, const float* x, const float* Wg, const float* bg, const float* Wu,
                        const float* bu, int T, int C, int F) {
  std::vector<float> u(size_t(T) * F);
  matmul_cpu(h, x, Wg, bg, T, C, F);  // g, in h's memory
  matmul_cpu(u.data(), x, Wu, bu, T, C, F);
  swiglu_activation_cpu(h, h, u.data(), u.size());
}

void mlp_cpu(float* y, const float* x, const float* Wg, const float* bg, const float* Wu, const float* bu,
             const float* Wd, const float* bd, int T, int C, int F) {
  std::vector<float> h(size_t(T) * F);
  swiglu_gate_up_cpu(h.data(), x, Wg, bg, Wu, bu, T, C, F);
  for (float& v : h) v = round_to_bf16(v);  // the model keeps h in bf16
  matmul_cpu(y, h.data(), Wd, bd, T, F, C);
}

}  // namespace bielik
