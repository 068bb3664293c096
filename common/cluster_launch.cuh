/// @file cluster_launch.cuh
/// @brief The host side of a launch in thread block clusters (sm_90), with programmatic
/// dependent launch as an option: one cudaLaunchConfig_t with its attributes, built in
/// one place. Chapter 05's v6 (clusters along y), chapter 07's v5 and chapter 08's
/// attention + O (along x) launch through it and ask cudaOccupancyMaxActiveClusters with
/// its config.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace bielik
