#include "backend_factory.hpp"

#include <stdexcept>

#include "model_cpu.hpp"

namespace bielik {

std::string resolve_device(const std::string& requested) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda") {
    throw std::invalid_argument("unknown device '" + requested + "' (use cpu, cuda or auto)");
  }
#ifdef BIELIK_HAVE_CUDA_BACKEND
  // TODO(cuda backend): "auto" -> "cuda" when cuda_device_available(); "cuda" without
  // a device -> runtime_error("no CUDA device found").
#endif
  if (requested == "cuda") {
    throw std::runtime_error("the CUDA backend is not part of this build yet (it arrives later in chapter 08); "
                             "use --device cpu");
  }
  return "cpu";
}

std::unique_ptr<Backend> open_backend(const std::string& model_dir, const BackendOptions& options) {
  const std::string device = resolve_device(options.device);
  if (device == "cpu") return std::make_unique<CpuModel>(model_dir, CpuModelOptions{options.threads, options.context});
  // The CUDA backend is constructed here once it exists.
  throw std::logic_error("no backend for device '" + device + "'");
}

}  // namespace bielik
