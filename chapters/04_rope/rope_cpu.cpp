// The reference: read it first. Angles in float64 (exact for our purposes), the
// rotation itself in fp32 like the GPU versions. Every GPU version is compared with
// this on fresh random inputs, and this is compared with the float64 golden files.
#include <cmath>
#include <stdexcept>
#include <string>

#include "rope.cuh"

namespace bielik {

namespace {

// Rotates one head vector x (D) in place by the angles of position `pos`.
void rotate_head(float* x, int D, int pos, float theta) {
  int half = D / 2;
  for (int i = 0; i < half; ++i) {
    double inv_freq = std::pow(double(theta), -2.0 * i / D);
    double angle = double(pos) * inv_freq;
    float c = float(std::cos(angle)), s = float(std::sin(angle));
    float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

void rope_cpu(float* q, float* k, const int32_t* positions, int T, int H, int Hkv, int D, float theta) {
  if (D <= 0 || D % 2 != 0) throw std::invalid_argument("rope_cpu: D must be even, got " + std::to_string(D));
  for (int t = 0; t < T; ++t) {
    int pos = positions[t];
    if (pos < 0) {
      throw std::invalid_argument("rope_cpu: negative position " + std::to_string(pos) + " at token " +
                                  std::to_string(t));
    }
    for (int h = 0; h < H; ++h) rotate_head(q + (size_t(t) * H + h) * D, D, pos, theta);
    for (int h = 0; h < Hkv; ++h) rotate_head(k + (size_t(t) * Hkv + h) * D, D, pos, theta);
  }
}

}  // namespace bielik
