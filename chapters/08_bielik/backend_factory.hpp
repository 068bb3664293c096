/// @file backend_factory.hpp
/// @brief Picks and opens the backend for `--device cpu|cuda|auto`.
///
/// Compiled into the `bielik-chat` program itself, not into a library: it is the one
/// place that needs both backends, and the CUDA backend's library (bielik_ch08_cuda)
/// already links the CPU one (bielik_ch08), so a factory inside bielik_ch08 would make a
/// link cycle. When the CUDA backend is part of the build, the chapter's CMake defines
/// BIELIK_HAVE_CUDA_BACKEND for this file: "auto" then means "cuda when a CUDA device is
/// present, else cpu", and "cuda" without a device is an error. In a build without it
/// (a chapter filter that leaves chapters 01-07 out), only "cpu" exists and "--device
/// cuda" says so instead of silently running on the CPU.
#pragma once

#include <memory>
#include <string>

#include "backend.hpp"

namespace bielik {

struct BackendOptions {
  std::string device = "auto";  ///< "cpu", "cuda" or "auto"
  int threads = 0;              ///< CPU backend threads; 0: all hardware threads
  int context = 0;              ///< KV cache length in tokens; 0: max_position_embeddings
};

/// "auto" -> the device open_backend() would use; "cpu"/"cuda" unchanged. Throws
/// std::invalid_argument for anything else, std::runtime_error for "cuda" without the
/// CUDA backend or without a device.
std::string resolve_device(const std::string& requested);

/// Loads the model in `model_dir` on the resolved device. With "auto", a model the CUDA
/// backend cannot run (cuda_backend_unsupported_reason) goes to the CPU backend, and
/// `note` (when given) says why; an explicit "cuda" fails with that reason instead.
std::unique_ptr<Backend> open_backend(const std::string& model_dir, const BackendOptions& options,
                                      std::string* note = nullptr);

}  // namespace bielik
