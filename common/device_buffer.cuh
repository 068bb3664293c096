/// @file device_buffer.cuh
/// @brief Owning RAII buffers for device memory.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_check.cuh"

namespace bielik {

/// A typed device allocation that frees itself. Movable, not copyable.
/// `count` is in elements of T, never bytes.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0) CUDA_CHECK(cudaMalloc(&data_, count_ * sizeof(T)));
  }
  /// Allocates and copies a host vector to the device.
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    copy_from_host(host);
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);  // no throw from a destructor
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), count_(other.count_) {
    other.data_ = nullptr;
    other.count_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      if (data_) cudaFree(data_);
      data_ = other.data_;
      count_ = other.count_;
      other.data_ = nullptr;
      other.count_ = 0;
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void copy_from_host(const std::vector<T>& host) {
    if (host.size() != count_) throw std::runtime_error("DeviceBuffer::copy_from_host: size mismatch");
    CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Fills every byte with `byte`. Tests poison outputs with 0xFF (a bf16/fp32 NaN
  /// pattern) so an element the kernel forgot to write fails the comparison.
  void fill_bytes(int byte) {
    if (count_ > 0) CUDA_CHECK(cudaMemset(data_, byte, bytes()));
  }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

/// True when at least one CUDA device is usable; false on a machine that has no GPU:
/// cudaGetDeviceCount says there is no device, or says the driver is insufficient where
/// no NVIDIA kernel driver is loaded at all (/proc/driver/nvidia absent: a machine with
/// the toolkit only, as CI, gets cudaErrorInsufficientDriver). Any other error means a
/// GPU machine whose GPU cannot be used (a broken or mismatched driver) and throws
/// std::runtime_error with CUDA's message, so tests fail there instead of skipping.
inline bool cuda_device_available() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count > 0;
  cudaGetLastError();  // clear the error so that it does not surface in a later check
  if (status == cudaErrorNoDevice) return false;
  struct stat driver;
  if (status == cudaErrorInsufficientDriver && stat("/proc/driver/nvidia", &driver) != 0) return false;
  throw std::runtime_error(std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(status) + ": " +
                           cudaGetErrorString(status) +
                           " (not a machine without a GPU: its NVIDIA driver or device is unusable)");
}

}  // namespace bielik
