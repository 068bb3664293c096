/// @file swiglu_scratch.cuh
/// @brief The (T, F) scratch buffers of v1 (g and u) and v2 (g), owned by the process.
///
/// The unfused versions need intermediates the fused ones do not; keeping them here
/// lets every version share one launcher signature. A buffer grows when a call needs
/// more (after a device synchronization, since kernels still queued may be using the
/// old one), so: not inside CUDA-graph capture, and one host thread at a time (hold
/// mutex() while the buffer is in use). The model calls the fused versions, which need
/// none of this.
#pragma once

#include <cuda_bf16.h>

#include <mutex>

#include "device_buffer.cuh"

namespace bielik {

class SwigluScratch {
 public:
  static SwigluScratch& instance();
  std::mutex& mutex() { return mutex_; }
  /// Buffer `which` (0 or 1) with room for at least `count` elements.
  __nv_bfloat16* buffer(int which, size_t count);

 private:
  SwigluScratch() = default;
  std::mutex mutex_;
  DeviceBuffer<__nv_bfloat16> buffers_[2];
};

}  // namespace bielik
