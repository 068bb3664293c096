/// @file cluster_launch.cuh
/// @brief The host side of a launch in thread block clusters (sm_90), with programmatic
/// dependent launch as an option: one cudaLaunchConfig_t with its attributes, built in
/// one place. Chapter 05's v6 (clusters along y), chapter 07's v5 and chapter 08's
/// attention + O (along x) launch through it and ask cudaOccupancyMaxActiveClusters with
/// its config. Two host helpers go with it: cluster_fits (may one such cluster be
/// resident?) and allow_all_shared_memory (opt a kernel in to the largest shared memory
/// and the non-portable cluster size 16, once).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>

#include "pdl.cuh"  // device_supports_pdl, add_carveout_attribute

namespace bielik {

/// `grid` blocks of `block` threads in clusters of `cluster` blocks, `shared_bytes` of
/// dynamic shared memory, on `stream`; PDL when `pdl` is set and the GPU has it. Launch
/// with cudaLaunchKernelEx(&launch.config, kernel, args...). Not copyable: config points
/// at the attributes inside.
struct ClusterLaunch {
  cudaLaunchAttribute attributes[3] = {};
  cudaLaunchConfig_t config = {};

  ClusterLaunch(dim3 grid, dim3 block, dim3 cluster, size_t shared_bytes, cudaStream_t stream, bool pdl) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = attributes;
    config.numAttrs = 0;
    // A cluster of one block is an ordinary launch: no cluster attribute, so none of the
    // cluster scheduling (every kernel is implicitly in 1-block clusters on sm_90, so
    // cluster.sync() and map_shared_rank still work in the kernel).
    if (cluster.x * cluster.y * cluster.z > 1) {
      cudaLaunchAttribute& dims = attributes[config.numAttrs++];
      dims.id = cudaLaunchAttributeClusterDimension;
      dims.val.clusterDim.x = cluster.x;
      dims.val.clusterDim.y = cluster.y;
      dims.val.clusterDim.z = cluster.z;
    }
    if (pdl && device_supports_pdl()) {
      cudaLaunchAttribute& programmatic = attributes[config.numAttrs++];
      programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      programmatic.val.programmaticStreamSerializationAllowed = 1;
    }
    add_carveout_attribute(attributes, config.numAttrs);  // launch_shared_carveout()
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

/// Whether this GPU can hold at least one cluster of `launch`'s shape (block size,
/// cluster size, dynamic shared memory) of `kernel` at once. A cluster must be resident
/// as a whole, so a shape can be valid for every block and still never run: ask before
/// launching (cudaOccupancyMaxActiveClusters). A refused query counts as "no" and leaves
/// no sticky error behind.
template <typename... Params>
bool cluster_fits(void (*kernel)(Params...), const ClusterLaunch& launch) {
  int clusters = 0;
  const bool fits = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess && clusters >= 1;
  (void)cudaGetLastError();
  return fits;
}

/// Opts `kernel` in to all the dynamic shared memory the GPU offers a block (above the
/// 48 KB default) and to the non-portable cluster size 16, once per kernel, so that every
/// later launch, captured in a graph or not, may ask for any size up to that. Returns the
/// dynamic bytes a launch may ask for: the opt-in limit less the kernel's static shared
/// memory, or 0 when the GPU refused. Thread-safe.
template <typename... Params>
size_t allow_all_shared_memory(void (*kernel)(Params...)) {
  static std::mutex mutex;
  static std::map<const void*, size_t> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const void* key = reinterpret_cast<const void*>(kernel);
  auto found = known.find(key);
  if (found != known.end()) return found->second;
  size_t allowed = 0;
  int device = 0, optin = 0;
  cudaFuncAttributes attributes = {};
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && size_t(optin) > attributes.sharedSizeBytes) {
    allowed = size_t(optin) - attributes.sharedSizeBytes;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(allowed)) != cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      allowed = 0;
    }
  }
  (void)cudaGetLastError();  // a refused query leaves no sticky error behind
  known.emplace(key, allowed);
  return allowed;
}

}  // namespace bielik
