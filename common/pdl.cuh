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

/// The shared-memory carveout that launch_kernel and ClusterLaunch ask for on this
/// thread: the percent (0-100) of an SM's unified L1 / shared memory to configure as
/// shared memory, or -1 for no request (the driver picks per kernel, from its needs).
/// Why a caller may want one value for a whole chain of kernels: an SM holds blocks of
/// two kernels side by side only while both fit its current split, and the split can
/// change only on an idle SM. Chapter 08's decode step measures it
/// (CudaModelOptions::experiments.decode_shared_carveout). Set it with ScopedLaunchCarveout.
inline int& launch_shared_carveout() {
  static thread_local int percent = -1;
  return percent;
}

/// Sets one of this thread's launch settings (the function that returns it: Setting)
/// for the launches of one scope, and restores it after.
template <typename Value, Value& (*Setting)()>
class ScopedLaunchSetting {
 public:
  explicit ScopedLaunchSetting(const Value& value) : previous_(Setting()) { Setting() = value; }
  ~ScopedLaunchSetting() { Setting() = previous_; }
  ScopedLaunchSetting(const ScopedLaunchSetting&) = delete;
  ScopedLaunchSetting& operator=(const ScopedLaunchSetting&) = delete;

 private:
  Value previous_;
};

/// Sets launch_shared_carveout() for the launches of one scope, and restores it after.
using ScopedLaunchCarveout = ScopedLaunchSetting<int, launch_shared_carveout>;

/// Appends the carveout attribute to `attributes` (numAttrs of them used) when
/// launch_shared_carveout() asks for one.
inline void add_carveout_attribute(cudaLaunchAttribute* attributes, unsigned& num_attrs) {
  const int percent = launch_shared_carveout();
  if (percent < 0) return;
  cudaLaunchAttribute& carveout = attributes[num_attrs++];
  carveout.id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  carveout.val.sharedMemCarveout = unsigned(percent);
}

/// The L2 access-policy window that launch_kernel attaches to the launches of this
/// thread (num_bytes 0: none). Accesses of the launched kernel inside the window get the
/// window's hit / miss properties, e.g. cudaAccessPropertyPersisting: L2 then keeps those
/// lines in its set-aside part (cudaLimitPersistingL2CacheSize) instead of evicting them
/// for streaming data. How a load's own cache hint (ld ... .L2::cache_hint) combines with
/// the window is not documented; the kernels put under a window here load without one.
/// Captured into a CUDA graph's kernel node like any launch attribute. Chapter 08's
/// decode step measures it (CudaModelOptions::experiments.l2_persist_mb). Set it with
/// ScopedLaunchAccessPolicy.
inline cudaAccessPolicyWindow& launch_access_policy_window() {
  static thread_local cudaAccessPolicyWindow window = {};
  return window;
}

/// Sets launch_access_policy_window() for the launches of one scope, and restores it after.
using ScopedLaunchAccessPolicy = ScopedLaunchSetting<cudaAccessPolicyWindow, launch_access_policy_window>;

/// Appends the access-policy window attribute when launch_access_policy_window() has one.
inline void add_access_policy_attribute(cudaLaunchAttribute* attributes, unsigned& num_attrs) {
  const cudaAccessPolicyWindow& window = launch_access_policy_window();
  if (window.num_bytes == 0) return;
  cudaLaunchAttribute& policy = attributes[num_attrs++];
  policy.id = cudaLaunchAttributeAccessPolicyWindow;
  policy.val.accessPolicyWindow = window;
}

/// Launches `kernel` through cudaLaunchKernelEx, with the PDL attribute when `pdl` is
/// set and the device has it, the carveout launch_shared_carveout() asks for and the
/// window launch_access_policy_window() holds.
template <typename... Params, typename... Args>
inline void launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[3] = {};
  config.attrs = attributes;
  config.numAttrs = 0;
  if (pdl && device_supports_pdl()) {
    cudaLaunchAttribute& programmatic = attributes[config.numAttrs++];
    programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    programmatic.val.programmaticStreamSerializationAllowed = 1;
  }
  add_carveout_attribute(attributes, config.numAttrs);
  add_access_policy_attribute(attributes, config.numAttrs);
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace bielik
