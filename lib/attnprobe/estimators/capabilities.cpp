#include "attnprobe/estimators/capabilities.h"

#include <fmt/format.h>

#include "attnprobe/common/error.h"

namespace attnprobe {

Device parse_device(const std::string& name) {
  for (Device device : kAllDevices)
    if (name == device_name(device)) return device;
  throw UsageError(fmt::format("--device {}: use cpu or cuda", name));
}

const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

std::vector<std::string> Forms::names() const {
  std::vector<std::string> out;
  for (Mask mask : {Mask::kFull, Mask::kCausal, Mask::kWindow})
    if (has(mask)) out.push_back(mask_name(mask));
  return out;
}

const char* backward_name(Backward backward) {
  switch (backward) {
    case Backward::kOut:
      return "out";
    case Backward::kYoso:
      return "yoso";
    case Backward::kNone:
      break;
  }
  return "";
}

}  // namespace attnprobe
