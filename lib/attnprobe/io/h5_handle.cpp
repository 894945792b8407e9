#include "attnprobe/io/h5_handle.h"

namespace attnprobe {

void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string hdf5_error_detail() {
  std::string deepest;
  auto walker = [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
    auto* out = static_cast<std::string*>(data);
    // The stack is walked upward, from the innermost frame; keep the first (deepest) message.
    if (out->empty() && err->desc && err->desc[0]) *out = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walker, &deepest);
  H5Eclear2(H5E_DEFAULT);
  return deepest;
}

}  // namespace attnprobe
