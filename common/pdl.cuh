/// @file pdl.cuh
/// @brief Programmatic dependent launch (PDL, Hopper and newer): the two device-side
/// instructions, the host-side capability test and a launch helper. Shared by the
/// decode kernels of chapters 07 and 08.
///
/// A kernel launched with the PDL attribute may be scheduled while the previous kernel
/// in its stream still runs. It must call pdl_wait() before it reads anything that
/// kernel wrote; work that reads only constant data (weights) can go before. A kernel
/// calls pdl_allow_dependents() once the next kernel may be scheduled. Without the
/// attribute, or before sm_90, both are no-ops and the launch is an ordinary one.
#pragma once

#include <cuda_runtime.h>

#include "cuda_check.cuh"

namespace bielik {

/// Waits until the grid this one depends on has finished and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next kernel (if launched with PDL) be scheduled now; it still waits for us.
__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// True when the current device is sm_90 or newer (PDL, the bulk-copy engine). Asked
/// once per process; false when there is no usable device.
inline bool device_is_sm90_or_newer() {
  static const bool answer = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    return major >= 9;
  }();
  return answer;
}

/// True when the current GPU can use programmatic dependent launch.
inline bool device_supports_pdl() { return device_is_sm90_or_newer(); }

/// Launches `kernel` through cudaLaunchKernelEx, with the PDL attribute when `pdl` is
/// set and the device has it.
template <typename... Params, typename... Args>
inline void launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = pdl && device_supports_pdl() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace bielik
