// The container factory (container.h): which of HDF5, safetensors and .npz a file is, told by its first
// bytes, never its name; and the layer groups of the containers that keep one flat map of arrays.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/io/container.h"
#include "attnprobe/io/h5_handle.h"

namespace attnprobe {

namespace {

// Magic bytes: the HDF5 signature (at 0, or after a user block, as HDF5 itself looks), a zip local
// header (.npz), or an 8-byte length followed by '{' (safetensors).
enum class Kind { kHdf5, kSafetensors, kMaybeSafetensors, kNpz, kUnknown };

Kind sniff(const std::string& path) {
  unsigned char head[9] = {};
  size_t got = 0;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    got = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
  }
  if (got >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return Kind::kNpz;
  if (got >= 4 && std::memcmp(head, "PK\x05\x06", 4) == 0) return Kind::kNpz;  // an empty zip
  if (got >= 8 && std::memcmp(head, "\x89HDF\r\n\x1a\n", 8) == 0) return Kind::kHdf5;
  if (got == 9 && head[8] == '{') return Kind::kSafetensors;
  if (got >= 8 && head[7] == 0 && head[6] == 0 && head[5] == 0)
    return Kind::kMaybeSafetensors;  // a plausible little-endian header length: let its checks explain
  return Kind::kUnknown;
}

}  // namespace

std::vector<std::string> DottedContainer::layer_groups() const {
  std::vector<std::string> groups;
  std::set<std::string> seen;  // a linear scan per name was quadratic in a header of many layers
  for (const std::string& name : array_names()) {
    const size_t dot = name.find('.');
    if (dot == std::string::npos || dot <= 6 || name.compare(0, 6, "layer_") != 0) continue;
    if (!std::all_of(name.begin() + 6, name.begin() + dot, [](char c) { return c >= '0' && c <= '9'; })) continue;
    const std::string prefix = name.substr(0, dot);
    if (seen.insert(prefix).second) groups.push_back(prefix);
  }
  return groups;
}

std::unique_ptr<Container> open_container(const std::string& path) {
  silence_hdf5_errors();
  switch (sniff(path)) {
    case Kind::kNpz:
      return open_npz_container(path);
    case Kind::kSafetensors:
      return open_safetensors_container(path);
    case Kind::kHdf5:
      return open_hdf5_container(path);
    case Kind::kMaybeSafetensors:  // HDF5 first: its signature may follow a user block of zeros
      return H5Fis_hdf5(path.c_str()) > 0 ? open_hdf5_container(path) : open_safetensors_container(path);
    case Kind::kUnknown:
      break;
  }
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());  // also finds the signature after a user block
  require_input(
      is_hdf5 != 0,
      "'{}' is not an HDF5 file (no HDF5 signature), nor safetensors (an 8-byte header length, then JSON), nor .npz "
      "(a zip): attnprobe reads these three dump containers. tools/dump_qkv.py writes one from a PyTorch model "
      "(--format hdf5|safetensors|npz), `attnprobe synth` a synthetic one.",
      path);
  return open_hdf5_container(path);
}

}  // namespace attnprobe
