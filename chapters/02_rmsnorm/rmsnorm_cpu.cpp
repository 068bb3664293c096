// The reference: read it first. Two passes per row: the mean of the squares, then the
// scaled copy. The GPU versions compute the same thing in fp32 and round once to bf16.
#include <cmath>
#include <stdexcept>
#include <string>

#include "bf16.hpp"
#include "rmsnorm.cuh"

namespace bielik {

namespace {

// y = x / sqrt(mean(x^2) + eps) * w for one row of C values.
void normalize_row(float* y, const float* x, const float* weight, int C, float eps) {
  float sum_squares = 0.0f;
  for (int c = 0; c < C; ++c) sum_squares += x[c] * x[c];
  float inverse_rms = 1.0f / std::sqrt(sum_squares / float(C) + eps);
  for (int c = 0; c < C; ++c) y[c] = x[c] * inverse_rms * weight[c];
}

}  // namespace

void rmsnorm_cpu(float* y, const float* x, const float* weight, int T, int C, float eps) {
  for (int t = 0; t < T; ++t) {
    normalize_row(y + size_t(t) * C, x + size_t(t) * C, weight, C, eps);
  }
}

// Here rather than in a .cu file: it is host code every GPU launcher shares.
void rmsnorm_check_sizes(const char* launcher, int T, int C) {
  if (T < 0 || C < 0) {
    throw std::invalid_argument(std::string(launcher) + ": needs T >= 0 and C >= 0, got T=" + std::to_string(T) +
                                " C=" + std::to_string(C));
  }
}

void fused_residual_rmsnorm_cpu(float* y, float* residual, const float* x, const float* weight, int T, int C,
                                float eps) {
  for (int t = 0; t < T; ++t) {
    float* residual_row = residual + size_t(t) * C;
    const float* x_row = x + size_t(t) * C;
    // The residual stream is bf16: the fp32 sum is rounded before anyone reads it.
    for (int c = 0; c < C; ++c) residual_row[c] = round_to_bf16(residual_row[c] + x_row[c]);
    normalize_row(y + size_t(t) * C, residual_row, weight, C, eps);
  }
}

}  // namespace bielik
