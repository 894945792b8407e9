#include "attnprobe/estimators/device.h"

#include <fmt/format.h>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

namespace {
std::optional<CudaBackend>& cuda_backend() {
  static std::optional<CudaBackend> backend;
  return backend;
}
}  // namespace

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  throw UsageError(fmt::format("--device {}: use cpu or cuda", name));
}

const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

bool register_cuda_backend(CudaBackend backend) {
  cuda_backend() = std::move(backend);
  return true;
}

std::unique_ptr<Estimator> make_estimator(const Spec& spec, Device device) {
  if (device == Device::kCpu) return spec.make();
  const auto& backend = cuda_backend();
  if (!backend)
    throw UsageError(
        "--device cuda: this build has no CUDA backend; configure with -DATTNPROBE_CUDA=ON (or AUTO) "
        "where nvcc is installed, or use --device cpu");
  if (const std::string why = backend->device(); !why.empty())
    throw InputError(fmt::format("--device cuda: {}. Use --device cpu, or run where a GPU is visible.", why));
  std::unique_ptr<Estimator> estimator = backend->make(spec);
  if (!estimator)
    throw InputError(fmt::format("estimator '{}' has no CUDA version (CUDA versions: {}); run it with --device cpu",
                                 spec.name(), join(backend->names(), ", ")));
  return estimator;
}

}  // namespace attnprobe
