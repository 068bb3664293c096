/// @file swiglu_scratch.cuh
/// @brief The (T, F) scratch buffers of v1 and the cuBLASLt form (g and u) and v2 (g),
/// owned by the process.
///
/// The unfused versions need intermediates the fused ones do not; keeping them here
/// lets every version share one launcher signature. A buffer grows when a call needs
/// more (after a device synchronization, since kernels still queued may be using the
/// old one), so: not inside CUDA-graph capture. A call holds mutex() while it enqueues
/// its kernels, but the mutex ends when the call returns, not when its kernels do: a
/// second call on another stream would then overwrite g and u while the first call's
/// kernels still read them. So each call also makes its stream wait for the last use
/// (wait_for_last_use, before its first kernel) and marks its own (record_last_use,
/// after its last kernel), both under the mutex: calls on any streams and host threads
/// run their scratch work one after the other on the GPU. Chapter 08's model calls none
/// of this: its prefill runs one GEMM over the concatenated gate/up weights and its own
/// SwiGLU kernel, its decode a fused GEMV.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <mutex>

#include "device_buffer.cuh"

namespace bielik {

class SwigluScratch {
 public:
  static SwigluScratch& instance();
  std::mutex& mutex() { return mutex_; }
  /// Buffer `which` (0 or 1) with room for at least `count` elements. Hold mutex().
  __nv_bfloat16* buffer(int which, size_t count);
  /// Makes `stream` wait on the GPU until every kernel enqueued before the last
  /// record_last_use (on whatever stream) is done. Hold mutex(); call before the first
  /// kernel that touches the buffers. (Inside a graph capture this fails: the event was
  /// recorded outside it.)
  void wait_for_last_use(cudaStream_t stream);
  /// Marks the end of this call's use: everything enqueued on `stream` so far. Hold
  /// mutex(); call after the last kernel that touches the buffers.
  void record_last_use(cudaStream_t stream);

  ~SwigluScratch() {
    if (last_use_) cudaEventDestroy(last_use_);  // no throw from a destructor (at exit)
  }

 private:
  SwigluScratch() = default;
  std::mutex mutex_;
  DeviceBuffer<__nv_bfloat16> buffers_[2];
  cudaEvent_t last_use_ = nullptr;  // created at the first wait
};

}  // namespace bielik
