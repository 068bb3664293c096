/// @file backend_factory.hpp
/// @brief Picks and opens the backend for `--device cpu|cuda|auto`.
///
/// The seam where the CUDA backend plugs in: when it lands, the chapter's CMake defines
/// BIELIK_HAVE_CUDA_BACKEND for this file and open_backend() constructs it; "auto" then
/// means "cuda when a CUDA device is present, else cpu". Until then only "cpu" exists
/// and "--device cuda" says so instead of silently running on the CPU.
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

/// Loads the model in `model_dir` on the resolved device.
std::unique_ptr<Backend> open_backend(const std::string& model_dir, const BackendOptions& options);

}  // namespace bielik
