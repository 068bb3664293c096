// The library reference for the gate/up half: cuBLASLt gate, cuBLASLt up (each with its
// bias epilogue), then the elementwise activation. It is v1 with chapter 03's cuBLASLt
// wrapper called directly, so that decode-sized T goes to cuBLASLt too instead of
// chapter 03's GEMV. bench_swiglu measures every version against it, and
// swiglu_gate_up_forward uses it wherever it is the fastest (T >= 5 on the H200).
#include "swiglu.cuh"
#include "swiglu_device.cuh"
#include "swiglu_scratch.cuh"

namespace bielik {

void swiglu_cublaslt_unfused(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                             const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C,
                             int F, cudaStream_t stream) {
  swiglu_check_shape("swiglu_cublaslt_unfused", T, C, F);
  swiglu_has_bias(bg, bu);
  if (T == 0) return;
  size_t count = size_t(T) * F;
  SwigluScratch& scratch = SwigluScratch::instance();
  std::lock_guard<std::mutex> lock(scratch.mutex());
  __nv_bfloat16* g = scratch.buffer(0, count);
  __nv_bfloat16* u = scratch.buffer(1, count);
  scratch.wait_for_last_use(stream);  // the previous call's kernels are done with g and u (v1's comment)
  matmul_cublaslt(g, x, Wg, bg, T, C, F, stream);
  matmul_cublaslt(u, x, Wu, bu, T, C, F, stream);
  swiglu_activation(h, g, u, count, stream);
  scratch.record_last_use(stream);
}

}  // namespace bielik
