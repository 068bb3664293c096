/// @file cuda_check.cuh
/// @brief The one error-check family of the project.
///
/// Every CUDA runtime call goes through CUDA_CHECK, every cuBLAS call through
/// CUBLAS_CHECK, and every kernel launch is followed by CUDA_CHECK_LAUNCH(). A failure
/// throws std::runtime_error naming the statement, the function, the file and the line,
/// so a test reports it instead of the process dying with a bare error code.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace bielik {

/// Builds the message and throws; kept out of line of the macros so they stay one line.
[[noreturn]] inline void throw_gpu_error(const char* library, const std::string& what,
                                         const char* statement, const char* function,
                                         const char* file, int line) {
  std::ostringstream message;
  message << library << " error: " << what << "\n  in: " << statement << "\n  at: " << function
          << " (" << file << ":" << line << ")";
  throw std::runtime_error(message.str());
}

inline void check_cuda(cudaError_t status, const char* statement, const char* function,
                       const char* file, int line) {
  if (status != cudaSuccess) {
    throw_gpu_error("CUDA", std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status),
                    statement, function, file, line);
  }
}

inline void check_cublas(cublasStatus_t status, const char* statement, const char* function,
                         const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw_gpu_error("cuBLAS", cublasGetStatusString(status), statement, function, file, line);
  }
}

}  // namespace bielik

/// Checks a CUDA runtime call.
#define CUDA_CHECK(call) ::bielik::check_cuda((call), #call, __func__, __FILE__, __LINE__)
/// Checks a cuBLAS / cuBLASLt call.
#define CUBLAS_CHECK(call) ::bielik::check_cublas((call), #call, __func__, __FILE__, __LINE__)
/// Checks the launch that just happened (bad configuration, missing kernel image...).
/// It does not wait for the kernel: errors inside the kernel surface at the next sync.
#define CUDA_CHECK_LAUNCH() \
  ::bielik::check_cuda(cudaGetLastError(), "kernel launch", __func__, __FILE__, __LINE__)
