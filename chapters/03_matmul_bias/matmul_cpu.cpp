// The reference: read it first. One output is one dot product of two contiguous rows,
// x[t, :] and W[n, :], plus the bias. fp32 accumulation like the GPU versions; the
// golden files hold float64 answers, so this loop is itself checked against them.
#include "matmul.cuh"

namespace bielik {

void matmul_cpu(float* y, const float* x, const float* W, const float* bias, int T, int C_in, int C_out) {
  for (int t = 0; t < T; ++t) {
    const float* x_row = x + static_cast<size_t>(t) * C_in;
    for (int n = 0; n < C_out; ++n) {
      const float* w_row = W + static_cast<size_t>(n) * C_in;
      float sum = 0.0f;
      for (int k = 0; k < C_in; ++k) sum += x_row[k] * w_row[k];
      y[static_cast<size_t>(t) * C_out + n] = bias ? sum + bias[n] : sum;
    }
  }
}

}  // namespace bielik
