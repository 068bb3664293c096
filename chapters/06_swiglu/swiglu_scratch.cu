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

void SwigluScratch::wait_for_last_use(cudaStream_t stream) {
  // Before the first record the event stands for no work, so the first wait is free.
  if (last_use_ == nullptr) CUDA_CHECK(cudaEventCreateWithFlags(&last_use_, cudaEventDisableTiming));
  CUDA_CHECK(cudaStreamWaitEvent(stream, last_use_, 0));
}

void SwigluScratch::record_last_use(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(last_use_, stream)); }

}  // namespace bielik
