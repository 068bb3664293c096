// The scratch buffers of the unfused versions (see swiglu_scratch.cuh).
#include "swiglu_scratch.cuh"

namespace bielik {

SwigluScratch& SwigluScratch::instance() {
  static SwigluScratch scratch;  // created at the first call, freed at exit
  return scratch;
}

__nv_bfloat16* SwigluScratch::buffer(int which, size_t count) {
  DeviceBuffer<__nv_bfloat16>& b = buffers_[which];
  if (b.size() < count) {
    CUDA_CHECK(cudaDeviceSynchronize());  // queued kernels may still read or write the old buffer
    b = DeviceBuffer<__nv_bfloat16>(count);
  }
  return b.data();
}

}  // namespace bielik
