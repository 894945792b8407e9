// Links the CUDA backend into the registry: `--device cuda` is usable when a GPU is visible. Each
// estimator's CUDA version registers itself from its own .cu file (registry.h).
#include "attnprobe/estimators/registry.h"
#include "attnprobe/gpu/device.h"

namespace attnprobe::gpu {
namespace {

[[maybe_unused]] const bool kProbe = register_device_probe(
    Device::kCuda, []() -> std::string { return device_count() > 0 ? "" : device_description(); });

}  // namespace
}  // namespace attnprobe::gpu
