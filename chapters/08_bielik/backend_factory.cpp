#include "backend_factory.hpp"

#include <stdexcept>

#include "model_config.hpp"
#include "model_cpu.hpp"

#ifdef BIELIK_HAVE_CUDA_BACKEND
#include "device_buffer.cuh"
#include "model_cuda.hpp"
#endif

namespace bielik {

std::string resolve_device(const std::string& requested) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda") {
    throw std::invalid_argument("unknown device '" + requested + "' (use cpu, cuda or auto)");
  }
  if (requested == "cpu") return "cpu";
#ifdef BIELIK_HAVE_CUDA_BACKEND
  // No driver, or a driver without a device, both read as "no device": cudaGetDeviceCount
  // fails or counts 0, and the statically linked runtime needs nothing else to say so. A
  // GPU whose driver is broken is an error even for "auto", not a quiet fall back to the
  // far slower CPU backend: the user learns why, and how to choose the CPU.
  bool have_device = false;
  try {
    have_device = cuda_device_available();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + "; use --device cpu to run on the CPU");
  }
  if (requested == "auto") return have_device ? "cuda" : "cpu";
  if (!have_device) {
    throw std::runtime_error("--device cuda: no CUDA device found (no GPU, or no NVIDIA driver); use --device cpu");
  }
  return "cuda";
#else
  if (requested == "cuda") {
    throw std::runtime_error("--device cuda: this build has no CUDA backend (it needs chapters 01-05 and 07 "
                             "in the build); use --device cpu");
  }
  return "cpu";
#endif
}

std::unique_ptr<Backend> open_backend(const std::string& model_dir, const BackendOptions& options,
                                      std::string* note) {
  std::string device = resolve_device(options.device);
#ifdef BIELIK_HAVE_CUDA_BACKEND
  if (device == "cuda" && options.device == "auto") {
    const std::string why = cuda_backend_unsupported_reason(load_model_config(model_dir + "/config.json"));
    if (!why.empty()) {
      device = "cpu";
      if (note) *note = "the CUDA backend cannot run this model (" + why + "); using the CPU backend";
    }
  }
#endif
  if (device == "cpu") return std::make_unique<CpuModel>(model_dir, CpuModelOptions{options.threads, options.context});
#ifdef BIELIK_HAVE_CUDA_BACKEND
  if (device == "cuda") return make_cuda_backend(model_dir, options.context);
#endif
  throw std::logic_error("no backend for device '" + device + "'");
}

}  // namespace bielik
