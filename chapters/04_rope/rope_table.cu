// The precomputed rotation table (used by v2 and v3), the positions helper, and the size
// check every version runs first.
//
// The table is built once per model load, so its cost does not matter and we spend it
// on precision: the angle pos * theta^(-2i/D) is computed in float64 and rounded to
// float only at the end. HF computes the same angle in float32 (inv_freq rounded to
// float, then a float product), which at pos = 8191 is off by up to ~5e-4 rad in the
// fastest-turning pair. The README measures what that costs; here we simply avoid it.
#include <climits>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "rope.cuh"

namespace bielik {

__global__ void rope_table_build_kernel(float* cos_table,  // (max_positions, D/2)
                                        float* sin_table,  // (max_positions, D/2)
                                        int max_positions, int D, double theta) {
  int half = D / 2;
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (index >= size_t(max_positions) * half) return;
  int pos = int(index / half), i = int(index % half);
  double inv_freq = pow(theta, -2.0 * i / D);
  double s, c;
  sincos(double(pos) * inv_freq, &s, &c);
  cos_table[index] = float(c);
  sin_table[index] = float(s);
}

RopeTable rope_table_build(int D, float theta, int max_positions, cudaStream_t stream) {
  if (D <= 0 || D % 2 != 0) throw std::invalid_argument("rope_table_build: D must be even, got " + std::to_string(D));
  if (!(theta > 0)) throw std::invalid_argument("rope_table_build: theta must be > 0");
  if (max_positions <= 0) throw std::invalid_argument("rope_table_build: max_positions must be > 0");
  RopeTable table;
  table.D = D;
  table.theta = theta;
  table.max_positions = max_positions;
  size_t count = size_t(max_positions) * (D / 2);
  table.cos = DeviceBuffer<float>(count);
  table.sin = DeviceBuffer<float>(count);
  int threads = 256;
  unsigned blocks = unsigned((count + threads - 1) / threads);
  rope_table_build_kernel<<<blocks, threads, 0, stream>>>(table.cos.data(), table.sin.data(), max_positions, D,
                                                          double(theta));
  CUDA_CHECK_LAUNCH();
  return table;
}

__global__ void rope_positions_from_offset_kernel(int32_t* positions,  // (T)
                                                  int T, int start) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T) positions[t] = start + t;
}

void rope_positions_from_offset(int32_t* positions, int T, int start, cudaStream_t stream) {
  if (T < 0 || start < 0 || (T > 0 && start > INT_MAX - (T - 1))) {
    throw std::invalid_argument("rope_positions_from_offset: needs T >= 0, start >= 0 and start + T - 1 <= " +
                                std::to_string(INT_MAX) + ", got T=" + std::to_string(T) +
                                " start=" + std::to_string(start));
  }
  if (T == 0) return;
  int threads = 256;
  rope_positions_from_offset_kernel<<<(T + threads - 1) / threads, threads, 0, stream>>>(positions, T, start);
  CUDA_CHECK_LAUNCH();
}

void rope_check_sizes(const char* launcher, int T, int H, int Hkv) {
  if (T < 0 || H < 0 || Hkv < 0) {
    throw std::invalid_argument(std::string(launcher) + ": needs T, H and Hkv >= 0, got T=" + std::to_string(T) +
                                " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv));
  }
}

}  // namespace bielik
