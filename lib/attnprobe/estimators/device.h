#pragma once
// Choosing where an estimator runs. `--device cpu` builds the estimator from its spec (registry.h);
// `--device cuda` asks the CUDA backend (lib/attnprobe/gpu), which registers its factory when it is
// linked in. Same spec, same canonical name, same keyed randomness on both.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attnprobe/estimators/registry.h"

namespace attnprobe {

enum class Device { kCpu, kCuda };

/// "cpu" or "cuda"; throws UsageError otherwise.
Device parse_device(const std::string& name);
const char* device_name(Device device);

/// The CUDA backend's factory: returns nullptr when the estimator has no CUDA version.
using CudaFactory = std::function<std::unique_ptr<Estimator>(const Spec&)>;
struct CudaBackend {
  CudaFactory make;
  std::function<std::vector<std::string>()> names;  ///< estimators with a CUDA version
  std::function<std::string()> device;              ///< "" when a GPU is usable, else why not
};
/// Called by the CUDA backend at static initialisation.
bool register_cuda_backend(CudaBackend backend);

/// The estimator for `spec` on `device`. Throws UsageError when the build has no CUDA backend,
/// InputError when no GPU is visible or the estimator has no CUDA version (naming those that do).
std::unique_ptr<Estimator> make_estimator(const Spec& spec, Device device);

}  // namespace attnprobe
