// v1: the unfused MLP activation, three launches, the way a framework runs it.
//
//   g = x Wg^T + bg      chapter 03's matmul_forward (its GEMV at T = 1, cuBLASLt with
//   u = x Wu^T + bu      its bias epilogue otherwise)
//   h = silu(g) * u      swiglu_activation, one elementwise kernel
//
// This is what PyTorch does for `down(act(gate(x)) * up(x))` (plus one more launch,
// since it computes act(g) and the product separately). Each GEMM on its own is as
// fast as cuBLASLt makes it; what v1 wastes is memory traffic: g and u, two (T, F) bf16
// tensors, are written and read back once, 4 * T * F * 2 bytes that the fused versions
// never move (147 MB at T = 2048, F = 8960, ~34 us at 4.3 TB/s), and x is read twice.
//
// g and u live in the process's scratch buffers (swiglu_scratch.cuh).
#include "swiglu.cuh"
#include "swiglu_device.cuh"
#include "swiglu_scratch.cuh"

namespace bielik {

void swiglu_v1_unfused(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
                       const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C, int F, cudaStream_t stream) {
  swiglu_check_shape("swiglu_v1_unfused", T, C, F);
  swiglu_has_bias(bg, bu);
  if (T == 0) return;
  size_t count = size_t(T) * F;
  SwigluScratch& scratch = SwigluScratch::instance();
  std::lock_guard<std::mutex> lock(scratch.mutex());
  __nv_bfloat16* g = scratch.buffer(0, count);
  __nv_bfloat16* u = scratch.buffer(1, count);
  // The lock only orders the enqueueing: the GPU must also finish the previous call's
  // kernels (maybe on another stream) before these overwrite g and u.
  scratch.wait_for_last_use(stream);
  matmul_forward(g, x, Wg, bg, T, C, F, stream);
  matmul_forward(u, x, Wu, bu, T, C, F, stream);
  swiglu_activation(h, g, u, count, stream);
  scratch.record_last_use(stream);
}

}  // namespace bielik
